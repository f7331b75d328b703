"""Data-dependent ops with a static size: the ``unique`` family, ``bincount``, ``nonzero`` and the
one-argument ``where``; plus the whole-array comparisons ``allclose`` and ``array_equal``.

Under ``jit`` a result's size must be known when tracing, so each data-dependent op takes the
result's axis as an ``Axis`` (name and size) and pads with ``fill_value`` (or truncates) to it.
Positions into ``x`` come back as a ``{axis_name: NamedArray}`` dict, one entry per axis of ``x``,
which is itself a valid index: ``x[na.nonzero(x, size=Axis("hit", 4))]`` gathers the hits. On
Explicit meshes the inputs are replicated first (these ops look at every element at once).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._array import NamedArray
from .._axis import Axis, AxisSelector, find_axis
from .._errors import AxisError, DuplicateAxisError, NamedTypeError, format_axes
from ._align import align_to
from ._common import agree_by_name, expect_named, unshard_dims
from .creation import single_axis
from .elementwise import lift_call, where3

__all__ = [
    "allclose",
    "array_equal",
    "bincount",
    "nonzero",
    "unique",
    "unique_all",
    "unique_counts",
    "unique_inverse",
    "unique_values",
    "where",
]


def _replicated(x: NamedArray) -> Any:
    return unshard_dims(x.array, tuple(range(x.ndim)))


def _new_axis(x: NamedArray, size: Any, caller: str, *, replaced: str | None = None) -> Axis:
    """The result's axis from ``size`` (an ``Axis`` or one-entry dict); its name must be new."""
    if isinstance(size, int) and not isinstance(size, bool):
        raise NamedTypeError(
            f"{caller}() needs size= as an Axis (the result's axis name and length), got {size!r}; "
            f"e.g. size=Axis('{caller}', {size})."
        )
    ax = single_axis(size, caller)
    if ax.name != replaced and x.has_axis(ax.name):
        raise DuplicateAxisError(
            f"{caller}(): result axis {ax.name!r} is already an axis of "
            f"NamedArray({format_axes(x.axes)}); pick a new name."
        )
    return ax


def _positions(x: NamedArray, flat: Any, new: Axis) -> dict[str, NamedArray]:
    """Flat indices into ``x`` (row-major in its axis order) as one index per axis, by name."""
    per_dim = jnp.unravel_index(flat, tuple(a.size for a in x.axes))
    return {a.name: NamedArray(i, (new,)) for a, i in zip(x.axes, per_dim)}


def nonzero(
    x: NamedArray, *, size: Axis | dict[str, int], fill_value: Any = None
) -> dict[str, NamedArray]:
    """Positions of the non-zero (true) elements of ``x``, as a ``{axis: indices}`` dict.

    Args:
        x: A NamedArray.
        size: The result axis, as an ``Axis`` or ``{name: length}``: at most that many positions
            are returned; missing ones are ``fill_value``.
        fill_value: Index used for padding (``0`` by default, as in ``jnp.nonzero``).

    Returns:
        ``{name: NamedArray}`` with one integer NamedArray over ``size`` per axis of ``x``,
        listing positions in row-major order of ``x``'s axes. It is a valid index for ``x[...]``.

    Raises:
        NamedTypeError: if ``size`` is not an ``Axis`` or one-entry dict.
        DuplicateAxisError: if ``size``'s name is an axis of ``x``.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> x = na.named(jnp.array([[0, 3], [4, 0]]), ("row", "col"))
        >>> hits = na.nonzero(x, size=na.Axis("hit", 2))
        >>> hits["row"].array, hits["col"].array, x[hits].array
        (Array([0, 1], dtype=int32), Array([1, 0], dtype=int32), Array([3, 4], dtype=int32))
    """
    x = expect_named(x, "nonzero")
    new = _new_axis(x, size, "nonzero")
    found = jnp.nonzero(_replicated(x), size=new.size, fill_value=fill_value)
    return {a.name: NamedArray(i, (new,)) for a, i in zip(x.axes, found)}


def where(
    condition: Any, x: Any = None, y: Any = None, *, size: Any = None, fill_value: Any = None
) -> Any:
    """``where(condition, x, y)`` picks elementwise (by name); ``where(condition, size=...)`` is
    :func:`nonzero`.

    Args:
        condition: A boolean NamedArray (or scalar).
        x: Values where ``condition`` holds (NamedArray or scalar); omit with ``y`` for the
            one-argument form.
        y: Values elsewhere.
        size: One-argument form only: the result axis, as for :func:`nonzero`.
        fill_value: One-argument form only: the padding index.

    Returns:
        A NamedArray broadcast by name (three arguments), or a ``{axis: indices}`` dict (one).

    Raises:
        NamedTypeError: if only one of ``x`` and ``y`` is given, or ``size`` is missing in the
            one-argument form.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> c = na.named(jnp.array([True, False, True]), "seq")
        >>> na.where(c, 1, 0).array
        Array([1, 0, 1], dtype=int32, weak_type=True)
        >>> na.where(c, size={"hit": 2})["seq"].array
        Array([0, 2], dtype=int32)
    """
    if x is None and y is None:
        if size is None:
            raise NamedTypeError(
                "where() takes 3 operand(s) (condition, x, y), got 1. The one-argument form needs "
                "size= (the result's Axis: the number of true elements is data-dependent), e.g. "
                "where(c, size=Axis('hit', 8))."
            )
        return nonzero(condition, size=size, fill_value=fill_value)
    if x is None or y is None:
        raise NamedTypeError(
            "where() takes 3 operand(s) (condition, x, y), got 2; or (condition, size=...)."
        )
    if size is not None or fill_value is not None:
        raise NamedTypeError("where(condition, x, y) takes no size= or fill_value=.")
    return where3(condition, x, y)


@functools.partial(jax.jit, static_argnums=(2, 3, 4, 5, 6))
def _jnp_unique(
    array: Any,
    fill_value: Any,
    index: bool,
    inverse: bool,
    counts: bool,
    axis: int | None,
    size: int,
) -> Any:
    # One compiled call: eagerly, jnp.unique would dispatch dozens of small ops.
    return jnp.unique(
        array,
        return_index=index,
        return_inverse=inverse,
        return_counts=counts,
        axis=axis,
        size=size,
        fill_value=fill_value,
    )


def _unique(
    caller: str,
    x: Any,
    size: Any,
    axis: AxisSelector | None,
    fill_value: Any,
    index: bool,
    inverse: bool,
    counts: bool,
) -> Any:
    x = expect_named(x, caller)
    if axis is None:
        new = _new_axis(x, size, caller)
        out = _jnp_unique(_replicated(x), fill_value, index, inverse, counts, None, new.size)
        parts = list(out) if isinstance(out, tuple) else [out]
        result: list[Any] = [NamedArray(parts.pop(0), (new,))]
        if index:
            result.append(_positions(x, parts.pop(0), new))
        if inverse:
            result.append(NamedArray(jnp.reshape(parts.pop(0), x.array.shape), x.axes))
        if counts:
            result.append(NamedArray(parts.pop(0), (new,)))
        return result[0] if len(result) == 1 else tuple(result)
    # Unique slices along one axis: that axis is replaced, in place, by the result axis. Slices
    # are sorted lexicographically, flattened row-major: over the other axes in sorted-name order,
    # not in x's layout, so which slices are kept, their order, inverse and counts are the same
    # for every layout of x.
    i = find_axis(x.axes, axis)
    old = x.axes[i]
    new = _new_axis(x, size, caller, replaced=old.name)
    others = tuple(sorted(x.axes[:i] + x.axes[i + 1 :], key=lambda a: a.name))
    canonical = align_to(NamedArray(_replicated(x), x.axes), (old,) + others)
    out = _jnp_unique(canonical, fill_value, index, inverse, counts, 0, new.size)
    parts = list(out) if isinstance(out, tuple) else [out]
    values = NamedArray(parts.pop(0), (new,) + others)
    in_place = x.axes[:i] + (new,) + x.axes[i + 1 :]
    result = [NamedArray(align_to(values, in_place), in_place)]
    if index:
        result.append(NamedArray(parts.pop(0), (new,)))
    if inverse:
        result.append(NamedArray(jnp.reshape(parts.pop(0), (old.size,)), (old,)))
    if counts:
        result.append(NamedArray(parts.pop(0), (new,)))
    return result[0] if len(result) == 1 else tuple(result)


def unique(
    x: NamedArray,
    size: Axis | dict[str, int],
    *,
    axis: AxisSelector | None = None,
    return_index: bool = False,
    return_inverse: bool = False,
    return_counts: bool = False,
    fill_value: Any = None,
) -> Any:
    """The sorted unique elements of ``x`` (or unique slices along ``axis``), padded to ``size``.

    Args:
        x: A NamedArray.
        size: The result axis as an ``Axis`` or ``{name: length}``. With fewer unique values the
            rest is ``fill_value`` (the smallest value by default, as in ``jnp.unique``); with
            more, the largest are dropped.
        axis: ``None`` for unique elements over all axes; or one axis, whose unique slices are
            returned (that axis is replaced, in place, by ``size``). Slices are sorted
            lexicographically, each flattened over the other axes in sorted-name order (not in
            ``x``'s layout), so the result does not depend on the order of ``x``'s axes.
        return_index: Also return where each unique value first occurs: a ``{axis: indices}``
            dict (with ``axis=None``; "first" is in row-major order of ``x``'s axes), or indices
            along ``axis``.
        return_inverse: Also return, for each element of ``x`` (each slice along ``axis``), the
            position of its value in the result (a NamedArray with ``x``'s axes, or over ``axis``).
        return_counts: Also return how often each unique value occurs (over ``size``).
        fill_value: The padding value.

    Returns:
        The unique values, followed by the requested extras in the order above.

    Raises:
        NamedTypeError: if ``size`` is not an ``Axis`` or one-entry dict.
        DuplicateAxisError: if ``size``'s name is another axis of ``x``.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> x = na.named(jnp.array([[3, 1], [3, 2]]), ("batch", "seq"))
        >>> values, counts = na.unique(x, na.Axis("value", 4), return_counts=True, fill_value=0)
        >>> values.array, counts.array
        (Array([1, 2, 3, 0], dtype=int32), Array([1, 1, 2, 0], dtype=int32))
    """
    return _unique("unique", x, size, axis, fill_value, return_index, return_inverse, return_counts)


def unique_values(
    x: NamedArray, size: Axis | dict[str, int], *, fill_value: Any = None
) -> NamedArray:
    """The sorted unique elements of ``x`` over ``size`` (``unique(x, size)``).

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> na.unique_values(na.named(jnp.array([2, 1, 2]), "seq"), {"value": 2}).array
        Array([1, 2], dtype=int32)
    """
    return _unique("unique_values", x, size, None, fill_value, False, False, False)


def unique_counts(
    x: NamedArray, size: Axis | dict[str, int], *, fill_value: Any = None
) -> tuple[NamedArray, NamedArray]:
    """``(values, counts)`` of the unique elements of ``x``, both over ``size``.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> v, c = na.unique_counts(na.named(jnp.array([2, 1, 2]), "seq"), {"value": 2})
        >>> c.array
        Array([1, 2], dtype=int32)
    """
    return _unique("unique_counts", x, size, None, fill_value, False, False, True)


def unique_inverse(
    x: NamedArray, size: Axis | dict[str, int], *, fill_value: Any = None
) -> tuple[NamedArray, NamedArray]:
    """``(values, inverse)``: the unique elements over ``size`` and, with ``x``'s axes, where each
    element's value sits in ``values`` (``values[inverse]`` rebuilds ``x``).

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> v, inv = na.unique_inverse(na.named(jnp.array([2, 1, 2]), "seq"), {"value": 2})
        >>> inv.array
        Array([1, 0, 1], dtype=int32)
    """
    return _unique("unique_inverse", x, size, None, fill_value, False, True, False)


def unique_all(
    x: NamedArray, size: Axis | dict[str, int], *, fill_value: Any = None
) -> tuple[NamedArray, dict[str, NamedArray], NamedArray, NamedArray]:
    """``(values, indices, inverse, counts)``: everything :func:`unique` can return.

    ``indices`` is a ``{axis: positions}`` dict (first occurrences in row-major order of ``x``'s
    axes), usable as ``x[indices]``.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> x = na.named(jnp.array([2, 1, 2]), "seq")
        >>> values, first, inverse, counts = na.unique_all(x, {"value": 2})
        >>> first["seq"].array
        Array([1, 0], dtype=int32)
    """
    return _unique("unique_all", x, size, None, fill_value, True, True, True)


def bincount(
    x: NamedArray, length: Axis | dict[str, int], *, weights: NamedArray | None = None
) -> NamedArray:
    """Count each integer value of ``x`` (over all its axes) into bins ``0..length-1``.

    Values outside the bins, negative ones included, are not counted (``jnp.bincount`` would
    count negative values in bin 0).

    Args:
        x: An integer NamedArray (e.g. class labels, with ``-1`` for "ignore").
        length: The bins' axis, as an ``Axis`` or ``{name: length}``.
        weights: Optional NamedArray with exactly ``x``'s axes (in any order): each element adds
            its weight instead of 1.

    Returns:
        A NamedArray over ``length``.

    Raises:
        NamedTypeError: if ``x`` is not integer or ``length`` is not an ``Axis``.
        AxisError: if ``weights`` has other axes than ``x``.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> x = na.named(jnp.array([[0, 1], [1, 3]]), ("batch", "seq"))
        >>> na.bincount(x, na.Axis("bin", 4)).array
        Array([1, 2, 0, 1], dtype=int32)
    """
    x = expect_named(x, "bincount")
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise NamedTypeError(f"bincount() needs integer values, got dtype {x.dtype}.")
    new = _new_axis(x, length, "bincount")
    w = None
    if weights is not None:
        weights = expect_named(weights, "bincount", "weights")
        if sorted(weights.axis_names) != sorted(x.axis_names):
            raise AxisError(
                f"bincount(): weights NamedArray({format_axes(weights.axes)}) must have exactly "
                f"the axes of x NamedArray({format_axes(x.axes)})."
            )
        w = jnp.ravel(unshard_dims(align_to(weights, x.axes), tuple(range(x.ndim))))
    flat = jnp.ravel(_replicated(x))
    if jnp.issubdtype(flat.dtype, jnp.signedinteger):
        # jnp.bincount clips negative values into bin 0 but drops values >= length: move the
        # negative ones past the last bin (in a dtype that can hold the length) to drop them too.
        flat = flat.astype(np.promote_types(flat.dtype, np.int32))
        flat = jnp.where(flat < 0, new.size, flat)
    counts = jnp.bincount(flat, weights=w, length=new.size)
    return NamedArray(counts, (new,))


def allclose(
    a: Any, b: Any, *, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False
) -> NamedArray:
    """Whether every element of ``a`` is close to ``b``'s, broadcasting by name (``jnp.allclose``).

    Args:
        a: A NamedArray or scalar.
        b: A NamedArray or scalar.
        rtol: Relative tolerance.
        atol: Absolute tolerance.
        equal_nan: Whether NaNs compare equal.

    Returns:
        A boolean NamedArray with no axes (``bool(...)`` or ``.item()`` gives the answer).

    Raises:
        AxisSizeError: if a shared axis has two sizes.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> a = na.named(jnp.array([[1.0, 2.0]]), ("batch", "seq"))
        >>> b = na.named(jnp.array([[1.0], [2.0]]), ("seq", "batch"))  # same data, other layout
        >>> bool(na.allclose(a, b))
        True
    """
    close = lift_call(
        "allclose", jnp.isclose, (a, b), ("a", "b"), rtol=rtol, atol=atol, equal_nan=equal_nan
    )
    return NamedArray(jnp.all(close.array), ())


def array_equal(a: Any, b: Any, *, equal_nan: bool = False) -> NamedArray:
    """Whether ``a`` and ``b`` have the same axes (names and sizes, in any order) and values.

    Arrays with different axes are not equal (no broadcasting, as in ``jnp.array_equal``).

    Returns:
        A boolean NamedArray with no axes.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> a = na.named(jnp.array([[1, 2]]), ("batch", "seq"))
        >>> bool(na.array_equal(a, na.named(jnp.array([[1], [2]]), ("seq", "batch"))))
        True
        >>> bool(na.array_equal(a, na.named(jnp.array([1, 2]), "seq")))
        False
    """
    a = expect_named(a, "array_equal", "a")
    b = expect_named(b, "array_equal", "b")
    if sorted(a.axes, key=lambda t: t.name) != sorted(b.axes, key=lambda t: t.name):
        return NamedArray(jnp.asarray(False), ())
    # Compared elementwise: on Explicit meshes conflicting shardings are reconciled as for `==`.
    a, b = agree_by_name("array_equal", [a, b], ["a", "b"])
    return NamedArray(jnp.array_equal(a.array, align_to(b, a.axes), equal_nan=equal_nan), ())
