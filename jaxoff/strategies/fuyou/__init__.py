"""Fuyou: the NVMe-paged optimizer update runs inside the backward layer scan, pipelined.

Liao et al. 2024, "Adding NVMe SSDs to Enable and Accelerate 100B Model Fine-tuning on a
Single GPU". Plain paged training runs the whole backward pass, then pages every layer's
optimizer state through the update. Here the backward pass is a hand-written reverse scan over
the stacked blocks whose body computes layer ``j``'s gradients (the block's VJP, the block
recomputed from its saved input as under ``nothing_saveable``) and pages layer ``j + 1``'s
fp32 master and moments through the update (its gradients come from the previous body): the
chunk arithmetic of ``jaxoff.paged`` through its public chunk-update API
(`jaxoff.optim.chunks.chunk_updater`, so every element is bitwise what the sequential paged
update computes), in the same paging transaction (`jaxoff.optim.chunks.PageTransaction`: one
``page_begin``, the takes and puts, one ``page_commit``). Layer 0 is updated after the scan,
then the embeddings, final norm and head.

The backward scan is software-pipelined: its step for layer ``j`` differentiates layer ``j``
and pages layer ``j + 1``'s update (gradients carried from the previous step), with no data
path between the two in either direction (``tests/test_fuyou.py`` checks this on the traced
program), so the update's takes, arithmetic and puts may run while layer ``j``'s matmuls do.
The pager reads ahead in the step plan's order (layer ``j``'s state while layer ``j + 1`` is
updated: the whole layer when it fits ``fuyou_init``'s ``read_ahead_bytes``, default 128 MiB
or 1/32 of RAM), so a take finds its chunk read; a take still waiting for the disk hands
XLA's thread back. The store commit runs on the pager's thread, behind the next step's start.
A layer's gradients are carried to its update flat: in their own shapes XLA:CPU stored the
2-D ones column-major and transposed them back twice a layer. How close the step comes to its
bound max(compute-only, pure I/O) is measured by ``bench/fuyou.py`` and
``bench/fuyou_capacity.py`` (figures in ``docs/benchmarks.md``). The paper runs the update on
the host CPU while the GPU computes. Not done here: Fuyou's activation swapping to SSD,
pipelined GPU-CPU-SSD, and its automatic choice of how much to swap; activations stay on the
device (each block's input, the block recomputed in backward).

Store layout: each paged tensor of a stacked block leaf is stored as one entry per layer
(``<entry>@<layer>``): the step plan names layer ``j``'s entries by the layer scan's static
trip values. Crash consistency is the store's: every write goes to the inactive slot and the
pager commits the step as the next version once its writes are durable.

The package: `_layout` (the store layout and the transaction), `_step` (the step: forward,
the backward scan's body and the tail update, over one `_step.StepContext`), `_loss` (the
loss of a ``page_params`` model), `_checkpoint` (init, save, restore), `_bits` (layers of the
stacked leaves as bits), `_params` (the paged block parameters), `_train` (`FuyouStep`, the
step as ``jaxoff train`` runs it) and `_options` (`FuyouOptions`, its options in a run).

Global operations that need every gradient first (``clip_by_global_norm``, ...) are refused.

Example:
    >>> import optax, tempfile, jax, jax.numpy as jnp
    >>> from flax import nnx
    >>> from jaxoff.models.gpt import CONFIGS
    >>> from jaxoff.optim import paged
    >>> from jaxoff.step import TrainState
    >>> cfg = CONFIGS["tiny"]
    >>> graphdef, params = nnx.split(cfg.build(nnx.Rngs(0)), nnx.Param)
    >>> tx = paged(optax.adamw(1e-3), tempfile.mkdtemp() + "/s", chunk_bytes=1 << 16)
    >>> state = TrainState(jnp.zeros((), jnp.int32), params, fuyou_init(cfg, tx, params))
    >>> step = jax.jit(make_fuyou_step(graphdef, cfg, tx), donate_argnums=0)
    >>> tokens = jnp.zeros((2, 16), jnp.int32)
    >>> state, metrics = step(state, tokens, tokens)
    >>> int(state.opt_state.version)
    2
    >>> tx.close()
"""

from ._bits import blocks_from_bits as blocks_from_bits
from ._bits import blocks_to_bits as blocks_to_bits
from ._checkpoint import fuyou_init as fuyou_init
from ._checkpoint import fuyou_master_bits as fuyou_master_bits
from ._checkpoint import fuyou_params as fuyou_params
from ._checkpoint import fuyou_resident as fuyou_resident
from ._checkpoint import fuyou_restore as fuyou_restore
from ._checkpoint import fuyou_save as fuyou_save
from ._layout import READ_AHEAD_BYTES as READ_AHEAD_BYTES
from ._layout import FuyouState as FuyouState
from ._layout import check_model as check_model
from ._layout import default_read_ahead_bytes as default_read_ahead_bytes
from ._layout import fuyou_table as fuyou_table
from ._loss import make_fuyou_loss as make_fuyou_loss
from ._options import FuyouOptions as FuyouOptions
from ._options import RunShape as RunShape
from ._step import make_fuyou_step as make_fuyou_step
from ._train import MASTERS as MASTERS
from ._train import FuyouStep as FuyouStep
from ._train import bits_apply as bits_apply

__all__ = [
    "READ_AHEAD_BYTES",
    "FuyouOptions",
    "FuyouState",
    "FuyouStep",
    "MASTERS",
    "RunShape",
    "blocks_from_bits",
    "bits_apply",
    "blocks_to_bits",
    "check_model",
    "default_read_ahead_bytes",
    "fuyou_init",
    "fuyou_master_bits",
    "fuyou_params",
    "fuyou_resident",
    "fuyou_restore",
    "fuyou_save",
    "fuyou_table",
    "make_fuyou_loss",
    "make_fuyou_step",
]
