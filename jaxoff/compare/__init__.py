"""``jaxoff compare``: remat/offload policies side by side on the real training step."""

from ._config import CompareConfig as CompareConfig
from ._export import check_export as check_export
from ._measure import host_bytes as host_bytes
from ._measure import measure_policy as measure_policy
from ._measure import step_flops as step_flops
from ._run import compare as compare

__all__ = ["CompareConfig", "check_export", "compare", "host_bytes", "measure_policy", "step_flops"]
