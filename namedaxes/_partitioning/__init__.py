"""Partitioning: logical-to-mesh rules, their resolution, the mapping context, placement and jit."""

from ._context import axis_mapping as axis_mapping
from ._context import current_axis_mapping as current_axis_mapping
from ._resolve import MeshLike as MeshLike
from ._resolve import resolve as resolve
from ._rules import AxisRules as AxisRules
from ._rules import MeshAxes as MeshAxes
from ._rules import ResourceMapping as ResourceMapping
from ._rules import UnsatisfiedPolicy as UnsatisfiedPolicy
