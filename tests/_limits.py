"""Bounds on child processes: they catch a hang, never a slow machine.

A child gets ``HANG_S`` seconds (15 minutes; ``JAXOFF_TEST_TIMEOUT_SCALE`` multiplies it), far
above what any child needs on a loaded 2-core machine: speed is measured in ``bench/``, not here.
"""

import os

HANG_S = 900 * float(os.environ.get("JAXOFF_TEST_TIMEOUT_SCALE", "1"))
