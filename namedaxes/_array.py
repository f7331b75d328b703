"""``NamedArray``: one array plus the names of its axes, as a JAX pytree.

Its operators and methods (``x + y``, ``x.sum("embed")``, ``x["batch", 0]``, ``x.rename(...)``) are
declared here, so static type checkers see them, and delegate to the named ops in ``_ops``. The op
modules sit above this one (they import it), so this module never imports them: ``namedaxes._ops``
hands its op modules over with :func:`bind_ops` when it is imported (``import namedaxes`` imports
it), and a delegation then costs one global and one attribute read.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from types import EllipsisType
from typing import Any, NoReturn, Protocol, TypeAlias, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import GetAttrKey
from jax.typing import DTypeLike

from ._axis import Axis, AxisSelector, AxisSpec, axis_name, check_unique, find_axis, index_of
from ._errors import AxisError, AxisSizeError, NamedTypeError, format_axes, format_names
from ._typing import annotation_class

__all__ = ["AxisSelection", "NamedArray", "Scalar", "bind_ops", "is_named_array", "named"]

_ARRAY_KEY = GetAttrKey("array")

#: One axis, several, or ``None`` for all of them (what reductions take).
AxisSelection: TypeAlias = AxisSelector | Sequence[AxisSelector] | None
#: What an operator takes besides a NamedArray: a Python or NumPy scalar, or a 0-d array.
Scalar: TypeAlias = bool | int | float | complex | np.generic | np.ndarray | jax.Array

_SCALAR_TYPES = (bool, int, float, complex, np.generic)


class _Unbound:
    """Stands for an op module until ``bind_ops`` has run."""

    def __init__(self, module: str) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(
            f"NamedArray's methods need namedaxes._ops.{self._module}, which has not been imported "
            "yet. Import namedaxes (it imports the named ops) before using NamedArray."
        )


# The op modules behind the operators and methods, handed over by namedaxes._ops (bind_ops).
_elementwise: Any = _Unbound("elementwise")
_indexing: Any = _Unbound("indexing")
_reductions: Any = _Unbound("reductions")
_shape: Any = _Unbound("shape")


def bind_ops(*, elementwise: Any, indexing: Any, reductions: Any, shape: Any) -> None:
    """Give NamedArray's operators and methods the named op modules (``namedaxes._ops`` calls
    this once, when it is imported)."""
    global _elementwise, _indexing, _reductions, _shape
    _elementwise, _indexing, _reductions, _shape = elementwise, indexing, reductions, shape


class AtUpdates(Protocol):
    """What ``x.at[key]`` gives: functional updates of the selected region (implemented by the
    named indexing ops)."""

    def get(self, **kwargs: Any) -> NamedArray: ...
    def set(self, values: Any, **kwargs: Any) -> NamedArray: ...
    def add(self, values: Any, **kwargs: Any) -> NamedArray: ...
    def multiply(self, values: Any, **kwargs: Any) -> NamedArray: ...
    def mul(self, values: Any, **kwargs: Any) -> NamedArray: ...
    def divide(self, values: Any, **kwargs: Any) -> NamedArray: ...
    def power(self, values: Any, **kwargs: Any) -> NamedArray: ...
    def min(self, values: Any, **kwargs: Any) -> NamedArray: ...
    def max(self, values: Any, **kwargs: Any) -> NamedArray: ...


class AtIndexer(Protocol):
    """``x.at``: index it by name (``x.at["seq", 0]``) for :class:`AtUpdates`."""

    def __getitem__(self, key: Any) -> AtUpdates: ...


def _is_operand(x: Any) -> bool:
    """Whether an operator should handle ``x`` (otherwise Python tries the reflected operator)."""
    return isinstance(x, (NamedArray, *_SCALAR_TYPES)) or (
        not isinstance(x, type) and getattr(x, "shape", None) is not None
    )


def _compares(x: Any) -> bool:
    """Whether ``==``/``!=`` should handle ``x``: an operand, or a list or tuple (meant as an
    array, which the named op refuses with its fix). For anything else Python falls back to
    identity, so ``x == [1, 2, 3]`` would be a silent ``False`` (``x == None`` stays ``False``)."""
    return _is_operand(x) or isinstance(x, (list, tuple))


def _dtype_name(dtype: Any) -> str:
    try:
        return str(np.dtype(dtype).name)
    except TypeError:  # JAX's extended dtypes (typed PRNG keys) are not NumPy dtypes
        return str(dtype)


def _as_array(array: Any) -> Any:
    """``array`` as a JAX array. NumPy input is placed with ``jax.device_put``, which (unlike
    ``jnp.asarray``) does not compile a program per shape; the rest goes through ``jnp.asarray``."""
    if isinstance(array, (np.ndarray, np.generic)):
        return jax.device_put(array)
    return jnp.asarray(array)


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
    equinox legitimately put non-arrays (``None``, sentinels, batched tracers) in the leaf; named
    ops check their NamedArray inputs' shapes instead. So map NamedArrays with ``na.vmap`` /
    ``na.scan`` / ``na.fold``, never ``jax.vmap`` / ``lax.scan`` / ``lax.map`` (or a per-example
    ``jax.vmap(jax.grad(...))``): those change the array's dimensions but not its axes, and named
    ops then raise an ``AxisError``.

    Args:
        array: A ``jax.Array`` (or anything array-like with a ``shape``, such as a
            ``jax.ShapeDtypeStruct`` or a NumPy array, kept as given). Python lists and scalars
            are converted with ``jnp.asarray``.
        axes: One ``Axis`` or name per dimension. Bare names take their size from the array.

    Raises:
        AxisError: if the number of axes differs from ``array.ndim``.
        AxisSizeError: if an ``Axis``'s size differs from its dimension.
        DuplicateAxisError: if an axis name appears twice.
        NamedTypeError: if ``array`` is a NamedArray (use ``rename``) or a list of them (use
            ``stack`` or ``concatenate``).

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

    def __init__(self, array: Any, axes: Sequence[AxisSelector] | AxisSelector) -> None:
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
        if isinstance(array, (list, tuple)):
            _refuse_nested_named(array, axes)
        if isinstance(array, (list, tuple, bool, int, float, complex)):
            array = jnp.asarray(array)  # a list has no shape to check the axes against
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
                    raise AxisSizeError(
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
        object.__setattr__(self, "array", array)  # immutable afterwards (__setattr__)
        object.__setattr__(self, "axes", tuple(resolved))

    def __setattr__(self, name: str, value: Any) -> None:
        raise NamedTypeError(
            f"NamedArray is immutable: cannot set {name!r} (its names and array are checked "
            "together when it is made). Make a new one: x.rename(...) for names, "
            "named(new_array, x.axes) for values."
        )

    def __delattr__(self, name: str) -> None:
        raise NamedTypeError(f"NamedArray is immutable: cannot delete {name!r}.")

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # copy, deepcopy and pickle rebuild it as the pytree does (slots would be set one by one).
        return (type(self)._tree_unflatten, (self.axes, (self.array,)))

    # -- pytree -----------------------------------------------------------------------------

    def _tree_flatten_with_keys(self) -> tuple[tuple[tuple[GetAttrKey, Any]], tuple[Axis, ...]]:
        return ((_ARRAY_KEY, self.array),), self.axes

    def _tree_flatten(self) -> tuple[tuple[Any], tuple[Axis, ...]]:
        return (self.array,), self.axes

    @classmethod
    def _tree_unflatten(cls, axes: tuple[Axis, ...], children: Iterable[Any]) -> NamedArray:
        # No validation: JAX rebuilds trees with placeholders and batched tracers in the leaf.
        obj = object.__new__(cls)
        (array,) = children
        object.__setattr__(obj, "array", array)
        object.__setattr__(obj, "axes", axes)
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
    def dtype(self) -> Any:
        """The element type of the array (a NumPy dtype, or JAX's dtype of typed PRNG keys)."""
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
        dtype = self.dtype
        itemsize: int = getattr(dtype, "itemsize", None) or np.dtype(dtype).itemsize
        return self.size * itemsize

    @property
    def sharding(self) -> Any:
        """The array's ``jax.sharding.Sharding``, or ``None`` where the leaf has none.

        The leaf has none inside ``jax.jit`` (a tracer), even on Explicit meshes, and for
        placeholders (``None``, ``ShapeDtypeStruct`` without one). Inside ``jit`` read the
        sharding from the type instead: ``jax.typeof(x.array).sharding``.
        """
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
        """The Python scalar of a single-element array.

        Raises:
            AxisError: if the array has more than one element.
        """
        if self.size != 1:
            raise AxisError(
                f"item() needs a single-element array, got NamedArray({format_axes(self.axes)}) "
                f"with {self.size} elements. Index or reduce its axes first, e.g. x.max().item()."
            )
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
        array: jax.Array = self.array
        return array

    # -- protocol -------------------------------------------------------------------------

    def __repr__(self) -> str:
        dtype = getattr(self.array, "dtype", None)
        head = _dtype_name(dtype) if dtype is not None else type(self.array).__name__
        body = format_axes(self.axes)
        return f"NamedArray({head}{', ' if body else ''}{body})"

    def __len__(self) -> int:
        raise NamedTypeError(
            "len() of a NamedArray is ambiguous; use x.axis_size('name') or x.shape."
        )

    def __iter__(self) -> NoReturn:
        raise NamedTypeError(
            "Iterating a NamedArray is ambiguous; use unbind(x, 'axis') to split along an axis."
        )

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> NoReturn:
        # Without this NumPy wraps a NamedArray in a 0-d object array (np.asarray, np.stack, and
        # np.save, which then pickles it) and jnp.asarray fails inside NumPy. (No __jax_array__:
        # jax.Array's operators call it first, so `jnp.float32(1) + x` would stop deferring to us.)
        layout = self.axis_names
        other = (
            f", or x.rearrange({layout[::-1]!r}).array for another order" if self.ndim > 1 else ""
        )
        raise NamedTypeError(
            f"Cannot convert NamedArray({format_axes(self.axes)}) to an array implicitly: that "
            f"would drop its axis names. Use x.array (axes in the order {layout!r}){other}."
        )

    def _single(self, what: str, fix: str) -> Any:
        """The 0-d array of a single-element NamedArray, for Python's scalar conversions."""
        if self.size != 1:
            raise AxisError(
                f"The {what} of NamedArray({format_axes(self.axes)}) with {self.size} elements "
                f"is ambiguous. Reduce it first, e.g. {fix}."
            )
        return self.array.reshape(())  # NumPy deprecates converting arrays with dimensions

    def __bool__(self) -> bool:
        return bool(self._single("truth value", "bool(x.any()) or bool(x.all())"))

    def __float__(self) -> float:
        return float(self._single("float value", "float(x.sum()) or float(x.max())"))

    def __int__(self) -> int:
        return int(self._single("int value", "int(x.sum()) or int(x.argmax())"))

    def __complex__(self) -> complex:
        return complex(self._single("complex value", "complex(x.sum())"))

    def __index__(self) -> int:
        # Only integers are indices: Python's rule, which lets x[1.0] fail.
        if not jnp.issubdtype(self.dtype, jnp.integer):
            raise NamedTypeError(
                f"NamedArray({_dtype_name(self.dtype)}, {format_axes(self.axes)}) cannot be used "
                "as an index: only integer arrays can. Convert it first, e.g. x.astype(jnp.int32)."
            )
        return operator.index(self._single("index value", "x.argmax() or x['axis', 0]"))

    def __format__(self, format_spec: str) -> str:
        if not format_spec:  # f"{x}" keeps str()/repr()
            return str(self)
        return format(self._single(f"format {format_spec!r}", "f'{x.max():.2f}'"), format_spec)

    def __matmul__(self, other: Any) -> NoReturn:
        raise NamedTypeError(
            "The @ operator is ambiguous for named arrays; use namedaxes.dot(a, b, axis='name') "
            "to say which axis to contract."
        )

    __rmatmul__ = __matmul__

    # Arrays are unhashable; keep NamedArray so (``__eq__`` is elementwise).
    __hash__ = None  # type: ignore[assignment]

    @classmethod
    def __class_getitem__(cls, item: str | tuple[str, DTypeLike]) -> type[NamedArray]:
        """``NamedArray["batch embed"]`` (or ``["batch embed", dtype]``): an annotation class."""
        return cast("type[NamedArray]", annotation_class(cls, item))

    # -- operators: named elementwise ops, broadcasting by name ----------------------------

    def __add__(self, other: NamedArray | Scalar) -> NamedArray:
        """``self + other``: named ``add``."""
        return _elementwise.add(self, other) if _is_operand(other) else NotImplemented

    def __radd__(self, other: NamedArray | Scalar) -> NamedArray:
        """``other + self``: named ``add``."""
        return _elementwise.add(other, self) if _is_operand(other) else NotImplemented

    def __sub__(self, other: NamedArray | Scalar) -> NamedArray:
        """``self - other``: named ``subtract``."""
        return _elementwise.subtract(self, other) if _is_operand(other) else NotImplemented

    def __rsub__(self, other: NamedArray | Scalar) -> NamedArray:
        """``other - self``: named ``subtract``."""
        return _elementwise.subtract(other, self) if _is_operand(other) else NotImplemented

    def __mul__(self, other: NamedArray | Scalar) -> NamedArray:
        """``self * other``: named ``multiply``."""
        return _elementwise.multiply(self, other) if _is_operand(other) else NotImplemented

    def __rmul__(self, other: NamedArray | Scalar) -> NamedArray:
        """``other * self``: named ``multiply``."""
        return _elementwise.multiply(other, self) if _is_operand(other) else NotImplemented

    def __truediv__(self, other: NamedArray | Scalar) -> NamedArray:
        """``self / other``: named ``true_divide``."""
        return _elementwise.true_divide(self, other) if _is_operand(other) else NotImplemented

    def __rtruediv__(self, other: NamedArray | Scalar) -> NamedArray:
        """``other / self``: named ``true_divide``."""
        return _elementwise.true_divide(other, self) if _is_operand(other) else NotImplemented

    def __floordiv__(self, other: NamedArray | Scalar) -> NamedArray:
        """``self // other``: named ``floor_divide``."""
        return _elementwise.floor_divide(self, other) if _is_operand(other) else NotImplemented

    def __rfloordiv__(self, other: NamedArray | Scalar) -> NamedArray:
        """``other // self``: named ``floor_divide``."""
        return _elementwise.floor_divide(other, self) if _is_operand(other) else NotImplemented

    def __mod__(self, other: NamedArray | Scalar) -> NamedArray:
        """``self % other``: named ``mod``."""
        return _elementwise.mod(self, other) if _is_operand(other) else NotImplemented

    def __rmod__(self, other: NamedArray | Scalar) -> NamedArray:
        """``other % self``: named ``mod``."""
        return _elementwise.mod(other, self) if _is_operand(other) else NotImplemented

    def __pow__(self, other: NamedArray | Scalar) -> NamedArray:
        """``self ** other``: named ``power``."""
        return _elementwise.power(self, other) if _is_operand(other) else NotImplemented

    def __rpow__(self, other: NamedArray | Scalar) -> NamedArray:
        """``other ** self``: named ``power``."""
        return _elementwise.power(other, self) if _is_operand(other) else NotImplemented

    def __and__(self, other: NamedArray | Scalar) -> NamedArray:
        """``self & other``: named ``bitwise_and``."""
        return _elementwise.bitwise_and(self, other) if _is_operand(other) else NotImplemented

    def __rand__(self, other: NamedArray | Scalar) -> NamedArray:
        """``other & self``: named ``bitwise_and``."""
        return _elementwise.bitwise_and(other, self) if _is_operand(other) else NotImplemented

    def __or__(self, other: NamedArray | Scalar) -> NamedArray:
        """``self | other``: named ``bitwise_or``."""
        return _elementwise.bitwise_or(self, other) if _is_operand(other) else NotImplemented

    def __ror__(self, other: NamedArray | Scalar) -> NamedArray:
        """``other | self``: named ``bitwise_or``."""
        return _elementwise.bitwise_or(other, self) if _is_operand(other) else NotImplemented

    def __xor__(self, other: NamedArray | Scalar) -> NamedArray:
        """``self ^ other``: named ``bitwise_xor``."""
        return _elementwise.bitwise_xor(self, other) if _is_operand(other) else NotImplemented

    def __rxor__(self, other: NamedArray | Scalar) -> NamedArray:
        """``other ^ self``: named ``bitwise_xor``."""
        return _elementwise.bitwise_xor(other, self) if _is_operand(other) else NotImplemented

    def __lshift__(self, other: NamedArray | Scalar) -> NamedArray:
        """``self << other``: named ``left_shift``."""
        return _elementwise.left_shift(self, other) if _is_operand(other) else NotImplemented

    def __rlshift__(self, other: NamedArray | Scalar) -> NamedArray:
        """``other << self``: named ``left_shift``."""
        return _elementwise.left_shift(other, self) if _is_operand(other) else NotImplemented

    def __rshift__(self, other: NamedArray | Scalar) -> NamedArray:
        """``self >> other``: named ``right_shift``."""
        return _elementwise.right_shift(self, other) if _is_operand(other) else NotImplemented

    def __rrshift__(self, other: NamedArray | Scalar) -> NamedArray:
        """``other >> self``: named ``right_shift``."""
        return _elementwise.right_shift(other, self) if _is_operand(other) else NotImplemented

    # Python reflects comparisons itself (``1 < x`` calls ``x.__gt__(1)``), so they have no __r*__.
    def __eq__(self, other: object) -> NamedArray:  # type: ignore[override]
        """``self == other``: named ``equal`` (elementwise, not identity)."""
        return _elementwise.equal(self, other) if _compares(other) else NotImplemented

    def __ne__(self, other: object) -> NamedArray:  # type: ignore[override]
        """``self != other``: named ``not_equal`` (elementwise)."""
        return _elementwise.not_equal(self, other) if _compares(other) else NotImplemented

    def __lt__(self, other: NamedArray | Scalar) -> NamedArray:
        """``self < other``: named ``less``."""
        return _elementwise.less(self, other) if _is_operand(other) else NotImplemented

    def __le__(self, other: NamedArray | Scalar) -> NamedArray:
        """``self <= other``: named ``less_equal``."""
        return _elementwise.less_equal(self, other) if _is_operand(other) else NotImplemented

    def __gt__(self, other: NamedArray | Scalar) -> NamedArray:
        """``self > other``: named ``greater``."""
        return _elementwise.greater(self, other) if _is_operand(other) else NotImplemented

    def __ge__(self, other: NamedArray | Scalar) -> NamedArray:
        """``self >= other``: named ``greater_equal``."""
        return _elementwise.greater_equal(self, other) if _is_operand(other) else NotImplemented

    def __neg__(self) -> NamedArray:
        """``-self``: named ``negative``."""
        return _elementwise.negative(self)

    def __pos__(self) -> NamedArray:
        """``+self``: named ``positive``."""
        return _elementwise.positive(self)

    def __abs__(self) -> NamedArray:
        """``abs(self)``: named ``abs``."""
        return _elementwise.abs(self)

    def __invert__(self) -> NamedArray:
        """``~self``: named ``invert``."""
        return _elementwise.invert(self)

    def __round__(self, ndigits: int | None = None) -> NamedArray:
        """``round(self, ndigits)``: named ``jnp.round``."""
        return _elementwise.round(self, decimals=ndigits or 0)

    def astype(self, dtype: DTypeLike) -> NamedArray:
        """This array cast to ``dtype``, with the same axes (see ``namedaxes.astype``)."""
        return _elementwise.astype(self, dtype)

    # -- reductions (see namedaxes.sum etc.): the remaining axes keep their order -----------

    def sum(
        self, axis: AxisSelection = None, *, where: Any = None, dtype: DTypeLike | None = None
    ) -> NamedArray:
        """Sum over ``axis`` (one name, several, or ``None`` for all); see ``namedaxes.sum``."""
        return _reductions.sum(self, axis, where=where, dtype=dtype)

    def prod(
        self, axis: AxisSelection = None, *, where: Any = None, dtype: DTypeLike | None = None
    ) -> NamedArray:
        """Product over ``axis``; see ``namedaxes.prod``."""
        return _reductions.prod(self, axis, where=where, dtype=dtype)

    def mean(
        self, axis: AxisSelection = None, *, where: Any = None, dtype: DTypeLike | None = None
    ) -> NamedArray:
        """Mean over ``axis``; see ``namedaxes.mean``."""
        return _reductions.mean(self, axis, where=where, dtype=dtype)

    def max(
        self, axis: AxisSelection = None, *, where: Any = None, initial: Any = None
    ) -> NamedArray:
        """Maximum over ``axis``; see ``namedaxes.max``."""
        return _reductions.max(self, axis, where=where, initial=initial)

    def min(
        self, axis: AxisSelection = None, *, where: Any = None, initial: Any = None
    ) -> NamedArray:
        """Minimum over ``axis``; see ``namedaxes.min``."""
        return _reductions.min(self, axis, where=where, initial=initial)

    def var(
        self,
        axis: AxisSelection = None,
        *,
        where: Any = None,
        ddof: int = 0,
        dtype: DTypeLike | None = None,
    ) -> NamedArray:
        """Variance over ``axis``; see ``namedaxes.var``."""
        return _reductions.var(self, axis, where=where, ddof=ddof, dtype=dtype)

    def std(
        self,
        axis: AxisSelection = None,
        *,
        where: Any = None,
        ddof: int = 0,
        dtype: DTypeLike | None = None,
    ) -> NamedArray:
        """Standard deviation over ``axis``; see ``namedaxes.std``."""
        return _reductions.std(self, axis, where=where, ddof=ddof, dtype=dtype)

    def any(self, axis: AxisSelection = None, *, where: Any = None) -> NamedArray:
        """Whether any element over ``axis`` is true; see ``namedaxes.any``."""
        return _reductions.any(self, axis, where=where)

    def all(self, axis: AxisSelection = None, *, where: Any = None) -> NamedArray:
        """Whether every element over ``axis`` is true; see ``namedaxes.all``."""
        return _reductions.all(self, axis, where=where)

    def argmax(self, axis: AxisSelector | None = None) -> NamedArray:
        """Index of the largest element along one axis; see ``namedaxes.argmax``."""
        return _reductions.argmax(self, axis)

    def argmin(self, axis: AxisSelector | None = None) -> NamedArray:
        """Index of the smallest element along one axis; see ``namedaxes.argmin``."""
        return _reductions.argmin(self, axis)

    def cumsum(self, axis: AxisSelector, *, dtype: DTypeLike | None = None) -> NamedArray:
        """Running sum along one axis, keeping the axes; see ``namedaxes.cumsum``."""
        return _reductions.cumsum(self, axis, dtype=dtype)

    def cumprod(self, axis: AxisSelector, *, dtype: DTypeLike | None = None) -> NamedArray:
        """Running product along one axis, keeping the axes; see ``namedaxes.cumprod``."""
        return _reductions.cumprod(self, axis, dtype=dtype)

    # -- shape (see namedaxes.rename etc.) ---------------------------------------------------

    def rearrange(
        self, axes: Sequence[AxisSelector | EllipsisType] | str, **sizes: int
    ) -> NamedArray:
        """Axes in a new order, or split/merged by a pattern; see ``namedaxes.rearrange``."""
        return _shape.rearrange(self, axes, **sizes)

    def rename(self, mapping: Mapping[AxisSelector, str | Axis]) -> NamedArray:
        """The same array with some axes renamed (``{old: new}``); see ``namedaxes.rename``."""
        return _shape.rename(self, mapping)

    def flatten_axes(self, axes: Sequence[AxisSelector], new_axis: AxisSelector) -> NamedArray:
        """Merge ``axes`` into one ``new_axis``; see ``namedaxes.flatten_axes``."""
        return _shape.flatten_axes(self, axes, new_axis)

    def unflatten_axis(self, axis: AxisSelector, new_axes: AxisSpec) -> NamedArray:
        """Split ``axis`` into ``new_axes``; see ``namedaxes.unflatten_axis``."""
        return _shape.unflatten_axis(self, axis, new_axes)

    def unbind(self, axis: AxisSelector) -> list[NamedArray]:
        """One array per entry of ``axis``, without that axis; see ``namedaxes.unbind``."""
        return _shape.unbind(self, axis)

    def split(self, axis: AxisSelector, new_axes: Sequence[Axis | int]) -> list[NamedArray]:
        """Consecutive pieces of ``axis``; see ``namedaxes.split``."""
        return _shape.split(self, axis, new_axes)

    def broadcast_axis(self, axis: AxisSpec) -> NamedArray:
        """New axes in front, repeating the values; see ``namedaxes.broadcast_axis``."""
        return _shape.broadcast_axis(self, axis)

    # -- indexing by name (see namedaxes._ops.indexing) ------------------------------------

    def __getitem__(self, key: Any) -> NamedArray:
        """Index by name: ``x["batch", 0]``, ``x[{"seq": slice(0, 4)}]``, gathers with named indices."""
        return _indexing.getitem(self, key)

    @property
    def at(self) -> AtIndexer:
        """Functional updates by name: ``x.at[{"seq": 0}].set(v)``, ``.add``, ``.multiply``, ``.get``."""
        return _indexing.AtIndexer(self)

    def take(self, axis: AxisSelector, indices: Any) -> NamedArray:
        """Gather entries of ``axis`` at ``indices``; see ``namedaxes.take``."""
        return _indexing.take(self, axis, indices)


jax.tree_util.register_pytree_with_keys(
    NamedArray,
    NamedArray._tree_flatten_with_keys,
    NamedArray._tree_unflatten,
    NamedArray._tree_flatten,
)


def is_named_array(x: Any) -> bool:
    """Whether ``x`` is a ``NamedArray`` (usable as ``is_leaf`` in tree maps)."""
    return isinstance(x, NamedArray)


def _refuse_nested_named(array: list[Any] | tuple[Any, ...], axes: Sequence[Any]) -> None:
    """A typed error for a list (or tuple) holding NamedArrays, which ``jnp.asarray`` cannot read."""
    if any(isinstance(v, NamedArray) for v in jax.tree.leaves(array, is_leaf=is_named_array)):
        first = axes[0] if axes else "axis"
        new = first.name if isinstance(first, Axis) else first if isinstance(first, str) else "axis"
        raise NamedTypeError(
            f"Cannot build a NamedArray from a {type(array).__name__} of NamedArrays. Join them "
            f"by name instead: na.stack({new!r}, arrays) for a new axis, or "
            f"na.concatenate({new!r}, arrays) along an axis they have."
        )


def named(array: Any, axes: Sequence[AxisSelector] | AxisSelector) -> NamedArray:
    """Attach axis names to an array.

    Args:
        array: Any array-like. NumPy arrays are placed with ``jax.device_put``; lists and Python
            scalars are converted with ``jnp.asarray``.
        axes: One name or ``Axis`` per dimension; names take their sizes from the array.

    Returns:
        A ``NamedArray``.

    Raises:
        AxisError: if the number of axes differs from the array's rank, or a size disagrees.
        NamedTypeError: if ``array`` is a NamedArray (use ``rename``) or a list of them (use
            ``stack`` or ``concatenate``).

    Example:
        >>> import jax.numpy as jnp
        >>> named(jnp.ones((2, 3)), ("batch", "embed"))
        NamedArray(float32, batch=2, embed=3)
    """
    # Lists and NamedArrays are the constructor's (it refuses NamedArrays with a typed error).
    kept = (jax.Array, jax.ShapeDtypeStruct, NamedArray, list, tuple)
    if not isinstance(array, kept) and not hasattr(array, "aval"):
        array = _as_array(array)
    return NamedArray(array, axes)
