"""namedaxes: named axes and logical-to-physical sharding for JAX.

Write models with named axes, say once how logical axes map to mesh axes, and let the library turn
names into ``PartitionSpec``s.
"""

__version__ = "0.1.0"

from ._array import NamedArray as NamedArray
from ._array import is_named_array as is_named_array
from ._array import named as named
from ._axis import Axis as Axis
from ._axis import AxisSelector as AxisSelector
from ._axis import AxisSpec as AxisSpec
from ._errors import AxisError as AxisError
from ._errors import AxisNotFoundError as AxisNotFoundError
from ._errors import AxisSizeError as AxisSizeError
from ._errors import DuplicateAxisError as DuplicateAxisError
from ._errors import MeshError as MeshError
from ._errors import NamedAxesError as NamedAxesError
from ._errors import NamedTypeError as NamedTypeError
from ._errors import ShardingError as ShardingError
from ._errors import SpecMismatchError as SpecMismatchError

# -- partitioning (issue 3): rules, resolve, mapping context, shard, named_jit ----------------
from ._errors import MappingTypeError as MappingTypeError
from ._partitioning import AxisRules as AxisRules
from ._partitioning import ResourceMapping as ResourceMapping
from ._partitioning import axis_mapping as axis_mapping
from ._partitioning import current_axis_mapping as current_axis_mapping
from ._partitioning import resolve as resolve
# -- end partitioning --

# -- named ops: shape, indexing, higher-order (issue 2) -------------------------------------
from ._ops.hof import fold as fold
from ._ops.hof import scan as scan
from ._ops.hof import vmap as vmap
from ._ops.indexing import slice_axis as slice
from ._ops.indexing import take as take
from ._ops.shape import broadcast_axis as broadcast_axis
from ._ops.shape import broadcast_to as broadcast_to
from ._ops.shape import concatenate as concatenate
from ._ops.shape import flatten_axes as flatten_axes
from ._ops.shape import rearrange as rearrange
from ._ops.shape import rename as rename
from ._ops.shape import split as split
from ._ops.shape import stack as stack
from ._ops.shape import unbind as unbind
from ._ops.shape import unflatten_axis as unflatten_axis
# -- end shape/indexing/hof --
