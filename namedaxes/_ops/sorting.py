"""Sorting by name: ``sort``, ``argsort``, ``top_k`` along one named axis, and ``searchsorted``.

Each op works along one axis and keeps the others where they are. On Explicit meshes the sorted
axis is replicated first (JAX refuses to sort across shards; XLA gathers it on Auto meshes); the
other axes keep their sharding.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from .._array import NamedArray
from .._axis import Axis, AxisSelector, axis_name, find_axis
from .._errors import AxisError, AxisSizeError, NamedTypeError, format_axes, format_names
from ._align import align_to
from ._checks import is_static_int
from ._common import expect_named, unshard_dims

__all__ = ["argsort", "searchsorted", "sort", "top_k"]


def _one_axis(x: NamedArray, axis: AxisSelector | None, caller: str) -> int:
    """The position of ``axis`` (which may be omitted for a 1-axis array)."""
    if axis is None:
        if x.ndim != 1:
            raise AxisError(
                f"{caller}() needs axis= for NamedArray({format_axes(x.axes)}); pass one of "
                f"{format_names(x.axis_names)}."
            )
        return 0
    if not isinstance(axis, (str, Axis)):
        raise NamedTypeError(f"{caller}() works along exactly one axis; got {axis!r}.")
    return find_axis(x.axes, axis)


def sort(
    x: NamedArray,
    axis: AxisSelector | None = None,
    *,
    descending: bool = False,
    stable: bool = True,
) -> NamedArray:
    """Sort ``x`` along one named axis; the result keeps ``x``'s axes.

    Args:
        x: A NamedArray.
        axis: The axis to sort along; may be omitted when ``x`` has one axis.
        descending: Sort from largest to smallest.
        stable: Keep equal elements in their order (``jnp.sort``'s ``stable``).

    Returns:
        A NamedArray with ``x``'s axes, sorted along ``axis``.

    Raises:
        AxisError: if ``axis`` is omitted and ``x`` has several axes.
        AxisNotFoundError: if ``x`` has no ``axis``.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> x = na.named(jnp.array([[3, 1, 2], [0, 5, 4]]), ("batch", "seq"))
        >>> na.sort(x, "seq").array
        Array([[1, 2, 3],
               [0, 4, 5]], dtype=int32)
    """
    x = expect_named(x, "sort")
    i = _one_axis(x, axis, "sort")
    array = jnp.sort(unshard_dims(x.array, (i,)), axis=i, stable=stable, descending=descending)
    return NamedArray(array, x.axes)


def argsort(
    x: NamedArray,
    axis: AxisSelector | None = None,
    *,
    descending: bool = False,
    stable: bool = True,
) -> NamedArray:
    """Indices that sort ``x`` along one named axis; the result keeps ``x``'s axes.

    Arguments as for :func:`sort`. The indices count positions along ``axis``.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> na.argsort(na.named(jnp.array([3.0, 1.0, 2.0]), "seq")).array
        Array([1, 2, 0], dtype=int32)
    """
    x = expect_named(x, "argsort")
    i = _one_axis(x, axis, "argsort")
    array = jnp.argsort(unshard_dims(x.array, (i,)), axis=i, stable=stable, descending=descending)
    return NamedArray(array, x.axes)


def top_k(x: NamedArray, axis: AxisSelector, k: int | Axis) -> tuple[NamedArray, NamedArray]:
    """The ``k`` largest entries along ``axis`` and their indices, largest first.

    Args:
        x: A NamedArray.
        axis: The axis to pick from.
        k: How many: an ``int`` (the result's axis keeps ``axis``'s name, with size ``k``) or an
            ``Axis`` (the result's axis takes that name and size).

    Returns:
        ``(values, indices)``: NamedArrays with ``axis`` replaced, in place, by the ``k`` axis.
        ``indices`` count positions along ``axis``.

    Raises:
        AxisNotFoundError: if ``x`` has no ``axis``.
        AxisSizeError: if ``k`` is negative or larger than the axis.
        DuplicateAxisError: if the ``k`` axis' name is another axis of ``x``.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> x = na.named(jnp.array([[1.0, 9.0, 5.0]]), ("batch", "vocab"))
        >>> values, idx = na.top_k(x, "vocab", na.Axis("best", 2))
        >>> values.axis_names, idx.array
        (('batch', 'best'), Array([[1, 2]], dtype=int32))
    """
    x = expect_named(x, "top_k")
    i = find_axis(x.axes, axis)
    ax = x.axes[i]
    new: Axis | None
    if isinstance(k, Axis):
        new = k
    elif is_static_int(k):
        new = Axis(ax.name, int(k)) if k >= 0 else None
    else:
        raise NamedTypeError(
            f"top_k(): k must be an int or an Axis, got {k!r} ({type(k).__name__})."
        )
    if new is None or new.size > ax.size:
        raise AxisSizeError(
            f"top_k(): k={k!r} does not fit axis {ax.name!r} of size {ax.size} in "
            f"NamedArray({format_axes(x.axes)}). Pick k between 0 and {ax.size}."
        )
    out = x.axes[:i] + (new,) + x.axes[i + 1 :]
    values, indices = jax.lax.top_k(unshard_dims(x.array, (i,)), new.size, axis=i)
    return NamedArray(values, out), NamedArray(indices, out)


def searchsorted(
    sorted_x: NamedArray,
    values: NamedArray | Any,
    axis: AxisSelector | None = None,
    *,
    side: str = "left",
) -> NamedArray:
    """Where ``values`` would be inserted into ``sorted_x`` (sorted along ``axis``) to keep order.

    ``sorted_x``'s other axes are batch axes: each batch entry of ``values`` is searched in its own
    row. ``values`` must have every batch axis (it may have more axes). On Explicit meshes both
    operands are replicated first: ``jnp.searchsorted``'s default method does not accept sharded
    operands there.

    Args:
        sorted_x: A NamedArray sorted ascending along ``axis``.
        values: A NamedArray (or a scalar) of values to place.
        axis: The sorted axis; may be omitted when ``sorted_x`` has one axis.
        side: ``"left"`` or ``"right"``, as in ``jnp.searchsorted``.

    Returns:
        An integer NamedArray with ``values``' axes: positions along ``axis``.

    Raises:
        AxisError: if ``values`` lacks a batch axis of ``sorted_x``, or has ``axis`` itself.
        AxisSizeError: if a shared axis has two sizes.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> edges = na.named(jnp.array([0.0, 1.0, 2.0]), "bin")
        >>> v = na.named(jnp.array([0.5, 1.5, -1.0]), "sample")
        >>> na.searchsorted(edges, v).array
        Array([1, 2, 0], dtype=int32)
    """
    sorted_x = expect_named(sorted_x, "searchsorted", "sorted_x")
    if side not in ("left", "right"):
        raise AxisError(f"searchsorted(): side must be 'left' or 'right', got {side!r}.")
    i = _one_axis(sorted_x, axis, "searchsorted")
    sorted_ax = sorted_x.axes[i]
    if not isinstance(values, NamedArray):
        if getattr(values, "ndim", 0) != 0:
            expect_named(values, "searchsorted", "values")
        values = NamedArray(jnp.asarray(values), ())
    if values.has_axis(sorted_ax.name):
        raise AxisError(
            f"searchsorted(): values NamedArray({format_axes(values.axes)}) has the sorted axis "
            f"{sorted_ax.name!r}; rename it in values (each value is searched along "
            f"{sorted_ax.name!r})."
        )
    batch = [a for a in sorted_x.axes if a.name != sorted_ax.name]
    missing = [a.name for a in batch if not values.has_axis(a.name)]
    if missing:
        raise AxisError(
            f"searchsorted(): values NamedArray({format_axes(values.axes)}) lacks the batch axes "
            f"{format_names(missing)} of sorted_x NamedArray({format_axes(sorted_x.axes)}). "
            "Broadcast values to them first, or reduce sorted_x to one axis."
        )
    for a in batch:
        if values.resolve_axis(a.name).size != a.size:
            raise AxisSizeError(
                f"searchsorted(): axis {a.name!r} has size {a.size} in sorted_x but size "
                f"{values.resolve_axis(a.name).size} in values."
            )
    # Lay both out as (batch..., rest...) and vmap jnp.searchsorted over the batch axes.
    rest = [a for a in values.axes if a.name not in {b.name for b in batch}]
    v = align_to(values, tuple(batch) + tuple(rest))
    s = align_to(sorted_x, tuple(batch) + (sorted_ax,))
    v = unshard_dims(v, tuple(range(v.ndim)))
    s = unshard_dims(s, tuple(range(s.ndim)))
    fn = lambda a, b: jnp.searchsorted(a, b, side=side)  # noqa: E731
    for _ in batch:
        fn = jax.vmap(fn)
    out = NamedArray(fn(s, v), tuple(batch) + tuple(rest))
    order = [axis_name(a) for a in values.axes]
    perm = [out.axis_names.index(n) for n in order]
    if perm == list(range(len(perm))):
        return out
    return NamedArray(jnp.transpose(out.array, perm), values.axes)
