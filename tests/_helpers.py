"""Assertion helpers shared by the test files (imported as ``from _helpers import ...``)."""

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

import namedaxes as na


def _array(x):
    return x.array if isinstance(x, na.NamedArray) else x


def spec_of(x):
    """A placed array's spec without trailing Nones (Auto-mode jit outputs drop them)."""
    entries = list(_array(x).sharding.spec)
    while entries and entries[-1] is None:
        entries.pop()
    return P(*entries)


def shard_shapes(x):
    """The distinct shapes of the shards this process holds, sorted."""
    return sorted({s.data.shape for s in _array(x).addressable_shards})


def same(named_array, expected, axes):
    """``named_array`` has exactly ``axes`` (in order) and the values of ``expected``."""
    assert named_array.axis_names == tuple(axes)
    np.testing.assert_array_equal(np.asarray(named_array.array), np.asarray(expected))


def sds(*shape, dtype="float32"):
    """An abstract array (``jax.ShapeDtypeStruct``) of ``shape``."""
    return jax.ShapeDtypeStruct(shape, dtype)
