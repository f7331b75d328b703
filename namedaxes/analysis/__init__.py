"""Memory and sharding analysis: validate specs, count bytes per device, ask XLA, monitor calls.

* ``ShardingAnalyzer``: spec validation and an exact per-device byte count, on concrete or abstract
  trees and on real, abstract or ``{axis: size}`` meshes.
* ``memory_report``: the same count driven by named axes (through ``resolve``), broken down by
  logical axis, largest leaves and what stays replicated.
* ``compiled_memory``: XLA's own per-device figures for a jitted function, without running it.
* ``create_monitored_function``: time a function and check/estimate its first argument's layout.
* ``plan`` / ``plan_search``: a planner's view (parameter count, exact state per device, XLA's
  compiled figures on a real, simulated or TPU-topology mesh, a budget verdict) and a search over
  logical-to-mesh mappings; ``pipeline_search`` over pipeline stage and microbatch counts, and
  ``bubble_fraction``, a pipeline schedule's idle time.
"""

from ._memory import LeafUsage as LeafUsage
from ._memory import ShardingAnalyzer as ShardingAnalyzer
from ._pipeline_plan import bubble_fraction as bubble_fraction
from ._pipeline_search import pipeline_search as pipeline_search
from ._plan import Plan as Plan
from ._plan import plan as plan
from ._plan_search import PlanSearch as PlanSearch
from ._plan_search import plan_search as plan_search
from ._report import MemoryReport as MemoryReport
from ._report import SpecValidationWarning as SpecValidationWarning
from ._report import compiled_memory as compiled_memory
from ._report import create_monitored_function as create_monitored_function
from ._report import memory_report as memory_report
from ._visualize import visualize_array as visualize_array
from ._visualize import visualize_sharding as visualize_sharding

__all__ = [
    "LeafUsage",
    "MemoryReport",
    "Plan",
    "PlanSearch",
    "ShardingAnalyzer",
    "SpecValidationWarning",
    "bubble_fraction",
    "compiled_memory",
    "create_monitored_function",
    "memory_report",
    "pipeline_search",
    "plan",
    "plan_search",
    "visualize_array",
    "visualize_sharding",
]
