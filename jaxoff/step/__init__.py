"""Training steps: the step function and its state, and :class:`Step`, what the trainer asks
of every way to train.

`make_train_step` builds the plain step (loss, gradients, optimizer update), `init_state` /
`abstract_state` its `TrainState`, `compile_step` / `export_step` compile or export it as
``jaxoff train`` does. The trainer runs a :class:`Step`: `PlainStep` (that step, on one
device or an FSDP mesh), ``jaxoff.distributed.ShardedPagedStep`` (FSDP with a paged
optimizer, one store per process) or Fuyou's (``jaxoff.strategies``), all built on what this
package offers (`OptaxStepBase`, `accumulate`, ...); ``jaxoff.strategies.build_step`` picks
one from a ``TrainConfig``.
"""

from ._accum import accumulate as accumulate
from ._accum import grad_fn_of as grad_fn_of
from ._init import Initializer as Initializer
from ._init import RandomInit as RandomInit
from ._plain import OptaxStepBase as OptaxStepBase
from ._plain import PlainStep as PlainStep
from ._plain import abstract_state as abstract_state
from ._plain import check_placement_export as check_placement_export
from ._plain import compile_step as compile_step
from ._plain import cross_entropy as cross_entropy
from ._plain import export_step as export_step
from ._plain import init_state as init_state
from ._plain import jit_train_step as jit_train_step
from ._plain import loss_of_params as loss_of_params
from ._plain import make_loss_fn as make_loss_fn
from ._plain import make_train_step as make_train_step
from ._plain import optimizer as optimizer
from ._plain import tokens as tokens
from ._protocol import CheckpointReader as CheckpointReader
from ._protocol import CheckpointWriter as CheckpointWriter
from ._protocol import FallBack as FallBack
from ._protocol import Step as Step
from ._state import TrainState as TrainState

__all__ = [
    "CheckpointReader",
    "CheckpointWriter",
    "FallBack",
    "Initializer",
    "OptaxStepBase",
    "PlainStep",
    "RandomInit",
    "Step",
    "TrainState",
    "abstract_state",
    "accumulate",
    "check_placement_export",
    "compile_step",
    "cross_entropy",
    "export_step",
    "grad_fn_of",
    "init_state",
    "jit_train_step",
    "loss_of_params",
    "make_loss_fn",
    "make_train_step",
]
