"""``bench/equivalence.py distributed``: two processes against one and against optax in RAM
(``distributed.py``)."""
