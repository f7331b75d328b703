"""``NamedArray``: one array plus the names of its axes, as a JAX pytree."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import GetAttrKey

from ._axis import Axis, AxisSelector, axis_name, check_unique, find_axis, index_of
from ._errors import AxisError, NamedTypeError, format_axes, format_names

__all__ = ["NamedArray", "is_named_array", "named"]

_ARRAY_KEY = GetAttrKey("array")


def _shape_of(array: Any) -> tuple[int, ...] | None:
    """The shape of an array-like leaf, or ``None`` for leaves that are not arrays.

    JAX and equinox put placeholders in pytree leaves (``None`` after ``eqx.partition``, ``object()``
    sentinels, ``ShapeDtypeStruct`` under ``eval_shape``); only real shapes are checked.
    """
    shape = getattr(array, "shape", None)
    if shape is None or isinstance(array, type):
        return None
    try:
        return tuple(int(d) for d in shape)
    except TypeError:  # symbolic dimensions: nothing to compare against
        return None


class NamedArray:
    """A JAX array whose axes have names.

    A ``NamedArray`` is a pytree with a single leaf (the array) and static axes, so it passes
    through ``jax.jit``, ``jax.grad``, ``jax.eval_shape``, ``eqx.filter_jit`` and friends. Axis
    names are unique and the axes' sizes equal the array's shape; both are checked on every
    construction. Trees rebuilt by JAX itself (``tree_unflatten``) are not checked, because JAX and
    equinox legitimately put non-arrays (``None``, sentinels, batched tracers) in the leaf.

    Args:
        array: A ``jax.Array`` (or anything array-like with a ``shape``, such as a
            ``jax.ShapeDtypeStruct``).
        axes: One ``Axis`` or name per dimension. Bare names take their size from the array.

    Raises:
        AxisError: if the number of axes differs from ``array.ndim`` or a size disagrees.
        DuplicateAxisError: if an axis name appears twice.

    Example:
        >>> import jax.numpy as jnp
        >>> x = NamedArray(jnp.zeros((8, 64)), ("batch", "embed"))
        >>> x
        NamedArray(float32, batch=8, embed=64)
        >>> x.shape
        {'batch': 8, 'embed': 64}
    """

    __slots__ = ("array", "axes")
    __array_priority__ = 100  # so `np_array + named` defers to our __radd__

    array: Any
    axes: tuple[Axis, ...]

    def __init__(self, array: Any, axes: Sequence[AxisSelector] | AxisSelector):
        if isinstance(array, NamedArray):
            raise NamedTypeError(
                f"Cannot wrap a NamedArray in a NamedArray ({array!r}). "
                "Use rename() to change its axis names."
            )
        if isinstance(axes, (str, Axis)):
            axes = (axes,)
        elif not isinstance(axes, (tuple, list)):
            raise NamedTypeError(
                f"axes must be a tuple of names or Axis objects, got {axes!r} ({type(axes).__name__})."
            )
        shape = _shape_of(array)
        if shape is not None and len(shape) != len(axes):
            raise AxisError(
                f"Got {len(axes)} axis name(s) ({format_names(axis_name(a) for a in axes)}) for an "
                f"array of shape {shape} with {len(shape)} dimension(s). "
                "Give exactly one name per dimension."
            )
        resolved = []
        for i, a in enumerate(axes):
            if isinstance(a, Axis):
                if shape is not None and a.size != shape[i]:
                    raise AxisError(
                        f"Axis {a.name!r} was given size {a.size}, but dimension {i} of the array "
                        f"has size {shape[i]} (array shape {shape}). Fix the Axis size or the array."
                    )
                resolved.append(a)
            elif isinstance(a, str):
                if shape is None:
                    raise NamedTypeError(
                        f"Axis {a!r} was given by name, but the array {array!r} has no shape to take "
                        "its size from. Pass Axis objects instead."
                    )
                resolved.append(Axis(a, shape[i]))
            else:
                raise NamedTypeError(
                    f"Axis {i} must be a name (str) or an Axis, got {a!r} ({type(a).__name__})."
                )
        check_unique(resolved)
        self.array = array
        self.axes = tuple(resolved)

    # -- pytree -----------------------------------------------------------------------------

    def _tree_flatten_with_keys(self):
        return ((_ARRAY_KEY, self.array),), self.axes

    def _tree_flatten(self):
        return (self.array,), self.axes

    @classmethod
    def _tree_unflatten(cls, axes, children):
        # No validation: JAX rebuilds trees with placeholders and batched tracers in the leaf.
        obj = object.__new__(cls)
        obj.array = children[0]
        obj.axes = axes
        return obj

    # -- properties -------------------------------------------------------------------------

    @property
    def axis_names(self) -> tuple[str, ...]:
        """The axis names, in order."""
        return tuple(a.name for a in self.axes)

    @property
    def shape(self) -> dict[str, int]:
        """``{name: size}`` in axis order."""
        return {a.name: a.size for a in self.axes}

    @property
    def dtype(self) -> np.dtype:
        """The element type of the array."""
        return self.array.dtype

    @property
    def ndim(self) -> int:
        """The number of axes."""
        return len(self.axes)

    @property
    def size(self) -> int:
        """The number of elements."""
        return math.prod(a.size for a in self.axes)

    @property
    def nbytes(self) -> int:
        """Bytes of the whole (unsharded) array."""
        return self.size * np.dtype(self.dtype).itemsize

    @property
    def sharding(self) -> Any:
        """The array's ``jax.sharding.Sharding`` (``None`` where the leaf has none)."""
        return getattr(self.array, "sharding", None)

    def axis_size(self, axis: AxisSelector) -> int:
        """The size of the named axis.

        Raises:
            AxisNotFoundError: listing the available axes.
        """
        return self.axes[find_axis(self.axes, axis)].size

    def resolve_axis(self, axis: AxisSelector) -> Axis:
        """The ``Axis`` (with its size) for a name.

        Example:
            >>> import jax.numpy as jnp
            >>> named(jnp.zeros((2, 3)), ("a", "b")).resolve_axis("b")
            Axis(name='b', size=3)
        """
        return self.axes[find_axis(self.axes, axis)]

    def axis_index(self, axis: AxisSelector) -> int:
        """The position of the named axis in ``array``'s dimensions."""
        return find_axis(self.axes, axis)

    def has_axis(self, axis: AxisSelector) -> bool:
        """Whether the array has an axis of that name."""
        return index_of(self.axes, axis) is not None

    def item(self) -> Any:
        """The Python scalar of a single-element array."""
        return self.array.item()

    def scalar(self) -> jax.Array:
        """The 0-d array of an array with no axes.

        Raises:
            AxisError: if the array has axes.
        """
        if self.axes:
            raise AxisError(
                f"scalar() needs an array with no axes, got NamedArray({format_axes(self.axes)}). "
                "Reduce or index the remaining axes first."
            )
        return self.array

    # -- protocol -------------------------------------------------------------------------

    def __repr__(self) -> str:
        dtype = getattr(self.array, "dtype", None)
        head = str(np.dtype(dtype)) if dtype is not None else type(self.array).__name__
        body = format_axes(self.axes)
        return f"NamedArray({head}{', ' if body else ''}{body})"

    def __len__(self) -> int:
        raise NamedTypeError(
            "len() of a NamedArray is ambiguous; use x.axis_size('name') or x.shape."
        )

    def __iter__(self):
        raise NamedTypeError(
            "Iterating a NamedArray is ambiguous; use unbind(x, 'axis') to split along an axis."
        )

    def __bool__(self) -> bool:
        return bool(self.array)

    def __matmul__(self, other: Any):
        raise NamedTypeError(
            "The @ operator is ambiguous for named arrays; use namedaxes.dot(a, b, axis='name') "
            "to say which axis to contract."
        )

    __rmatmul__ = __matmul__

    # Arrays are unhashable; keep NamedArray so (we define __eq__ elementwise in _ops).
    __hash__ = None  # type: ignore[assignment]


jax.tree_util.register_pytree_with_keys(
    NamedArray,
    NamedArray._tree_flatten_with_keys,
    NamedArray._tree_unflatten,
    NamedArray._tree_flatten,
)


def is_named_array(x: Any) -> bool:
    """Whether ``x`` is a ``NamedArray`` (usable as ``is_leaf`` in tree maps)."""
    return isinstance(x, NamedArray)


def named(array: Any, axes: Sequence[AxisSelector] | AxisSelector) -> NamedArray:
    """Attach axis names to an array.

    Args:
        array: Any array-like; non-JAX arrays (lists, NumPy) are converted with ``jnp.asarray``.
        axes: One name or ``Axis`` per dimension; names take their sizes from the array.

    Returns:
        A ``NamedArray``.

    Raises:
        AxisError: if the number of axes differs from the array's rank, or a size disagrees.

    Example:
        >>> import jax.numpy as jnp
        >>> named(jnp.ones((2, 3)), ("batch", "embed"))
        NamedArray(float32, batch=2, embed=3)
    """
    if not isinstance(array, (jax.Array, jax.ShapeDtypeStruct)) and not hasattr(array, "aval"):
        array = jnp.asarray(array)
    return NamedArray(array, axes)
