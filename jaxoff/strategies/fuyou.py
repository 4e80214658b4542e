"""Fuyou's step as a library: the paged optimizer update inside the backward layer scan, and
optionally the block parameters paged too (ZeRO-Infinity's parameter offload).

The public names of ``jaxoff.strategies._fuyou`` (see its module docstring and
``docs/design/strategies.md``); ``examples/fuyou_nvme.py`` trains a model with both paged;
`fuyou_save` / `fuyou_restore` checkpoint the store's part of the state (``jaxoff train
--fuyou [--page-params]`` runs all of it).
"""

from ._fuyou import FuyouState as FuyouState
from ._fuyou import blocks_from_bits as blocks_from_bits
from ._fuyou import blocks_to_bits as blocks_to_bits
from ._fuyou import fuyou_init as fuyou_init
from ._fuyou import fuyou_params as fuyou_params
from ._fuyou import fuyou_resident as fuyou_resident
from ._fuyou import fuyou_restore as fuyou_restore
from ._fuyou import fuyou_save as fuyou_save
from ._fuyou import fuyou_table as fuyou_table
from ._fuyou import make_fuyou_loss as make_fuyou_loss
from ._fuyou import make_fuyou_step as make_fuyou_step

__all__ = [
    "FuyouState",
    "blocks_from_bits",
    "blocks_to_bits",
    "fuyou_init",
    "fuyou_params",
    "fuyou_resident",
    "fuyou_restore",
    "fuyou_save",
    "fuyou_table",
    "make_fuyou_loss",
    "make_fuyou_step",
]
