"""Model factories of absurd size for the bad-invocation tests: ``jaxoff train`` must refuse
them from their shapes, before it allocates or writes anything."""

import dataclasses

from jaxoff.models import load_model


def layers():
    """``tiny`` with 10**12 layers."""
    return dataclasses.replace(load_model("tiny"), num_layers=10**12)


def width():
    """``tiny`` with d_model 2**20."""
    return dataclasses.replace(load_model("tiny"), d_model=2**20, d_ff=2**22)
