"""Partitioning: logical-to-mesh rules, their resolution, the mapping context, placement and jit."""

from .._mesh import MeshLike as MeshLike
from .._mesh import context_mesh as context_mesh
from ._context import axis_mapping as axis_mapping
from ._context import current_axis_mapping as current_axis_mapping
from ._field import field as field
from ._jit import fsdp as fsdp
from ._jit import named_jit as named_jit
from ._resolve import resolve as resolve
from ._rules import AxisRules as AxisRules
from ._rules import MeshAxes as MeshAxes
from ._rules import ResourceMapping as ResourceMapping
from ._rules import UnsatisfiedPolicy as UnsatisfiedPolicy
from ._shard import auto_sharded as auto_sharded
from ._shard import shard as shard
from ._specs import infer_resource_partitions as infer_resource_partitions
from ._specs import physical_axis_name as physical_axis_name
from ._specs import physical_axis_size as physical_axis_size
from ._specs import pspec_for as pspec_for
from ._specs import round_axis_for_partitioning as round_axis_for_partitioning
from ._specs import sharding_for_axis as sharding_for_axis
