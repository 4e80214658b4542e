"""The forward-only loss of a ``page_params`` Fuyou model, for evaluation."""

from __future__ import annotations

from flax import nnx

from jaxoff.step import cross_entropy

from . import _params as fp
from ._bits import _block_fn
from ._layout import _abstract_params, _check_model, _layout, _updater


def make_fuyou_loss(graphdef: nnx.GraphDef, model_cfg, tx):
    """``loss_fn(params, opt_state, inputs, targets) -> loss`` of a ``page_params`` model:
    the forward pass of `make_fuyou_step` (each layer's parameters taken from the store,
    verified), without its backward pass or update; for evaluation.

    ``params`` is the state's (`fuyou_resident`), ``opt_state`` its `FuyouState`: the loss is
    that of the store version it describes. Jit it (nothing is donated).
    """
    _check_model(model_cfg)
    _updater(tx)
    abstract = _abstract_params(model_cfg)

    def loss_fn(params, opt_state, inputs, targets):
        lay = _layout(tx, abstract, True)
        plan = lay.plan
        leaves = plan.params_def.flatten_up_to(params)
        bidx = [i for i, b in enumerate(lay.blocks) if b]
        fp.check_placeholders(leaves, bidx)
        model = nnx.merge(graphdef, params)
        block = _block_fn(model.blocks)
        x0 = model.embed_tokens(inputs)
        # a step of the store's transaction that only reads: its commit makes no version
        rec = lay.txn.begin(opt_state.version)
        h, _, _ = fp.forward(rec, lay, block, x0)
        rec.commit()
        return cross_entropy(model.logits(h), targets)

    return loss_fn
