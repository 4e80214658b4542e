"""The one error a Hugging Face checkpoint raises here."""

from __future__ import annotations

from jaxoff._errors import JaxoffError


class PretrainedError(JaxoffError, ValueError):
    """A Hugging Face checkpoint (or an export's target) cannot be used as it is: the
    message names the file and key, what is wrong, and what to do. Raised before anything
    is written."""
