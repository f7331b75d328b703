"""Named operations, one family per module. Importing this package hands the op modules behind
NamedArray's operators and methods to ``namedaxes._array`` (which sits below the ops)."""

from .._array import bind_ops
from . import elementwise, indexing, reductions, shape

bind_ops(elementwise=elementwise, indexing=indexing, reductions=reductions, shape=shape)
