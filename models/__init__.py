"""The shipped model families, installed as ``jaxoff.models``: ``jaxoff.models.gpt`` (GPT-2
shapes) and ``jaxoff.models.llama`` (Llama shapes), both implementations of the model protocol
of :mod:`jaxoff.nn`."""
