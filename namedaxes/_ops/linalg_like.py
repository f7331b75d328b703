"""Matrix-shaped ops over two named axes: ``tril``, ``triu``, ``diagonal`` and ``trace``.

The two axes are named, so any pair of axes of any array can play "rows" and "columns"; the other
axes are batch axes and keep their place (and sharding).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._array import NamedArray
from .._axis import Axis, AxisSelector, axis_name, find_axis
from .._errors import AxisError, DuplicateAxisError, NamedTypeError, format_axes, format_names
from ._common import expect_named
from .reductions import sum as _sum

__all__ = ["diagonal", "trace", "tril", "triu"]


def _pair(x: NamedArray, axes: Any, caller: str) -> tuple[int, int]:
    """Positions of the (row, column) axes, which must be two different axes of ``x``."""
    if isinstance(axes, (str, Axis)) or not isinstance(axes, (tuple, list)) or len(axes) != 2:
        raise AxisError(
            f"{caller}() works over two named axes (rows, columns), got {axes!r}; e.g. "
            f"{caller}(x, ('query', 'key'))."
        )
    if axis_name(axes[0]) == axis_name(axes[1]):
        raise DuplicateAxisError(
            f"{caller}() needs two different axes, got {axis_name(axes[0])!r} twice."
        )
    return find_axis(x.axes, axes[0]), find_axis(x.axes, axes[1])


def _check_k(k: Any, caller: str, param: str = "k") -> int:
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool):
        raise NamedTypeError(
            f"{caller}(): {param}= (the diagonal offset) must be a static int, got {k!r}."
        )
    return int(k)


def _triangle(x: Any, axes: Any, k: Any, caller: str, keep_lower: bool) -> NamedArray:
    x = expect_named(x, caller)
    r, c = _pair(x, axes, caller)
    k = _check_k(k, caller)
    # A mask over just the two axes (size 1 elsewhere): x keeps its layout and sharding.
    shape = [1] * x.ndim
    shape[r], shape[c] = x.axes[r].size, x.axes[c].size
    rows = jax.lax.broadcasted_iota(jnp.int32, shape, r)
    cols = jax.lax.broadcasted_iota(jnp.int32, shape, c)
    mask = cols - rows <= k if keep_lower else cols - rows >= k
    return NamedArray(jnp.where(mask, x.array, jnp.zeros((), x.dtype)), x.axes)


def tril(x: NamedArray, axes: tuple[AxisSelector, AxisSelector], k: int = 0) -> NamedArray:
    """Zero the entries above the ``k``-th diagonal of the (rows, columns) axes ``axes``.

    Entry ``(i, j)`` is kept when ``j - i <= k``. The other axes are batch axes.

    Args:
        x: A NamedArray.
        axes: ``(rows, columns)``: two different axes of ``x``.
        k: The diagonal offset (``0`` the main diagonal, ``> 0`` above it).

    Returns:
        A NamedArray with ``x``'s axes (and layout).

    Raises:
        AxisError: if ``axes`` is not a pair.
        AxisNotFoundError: if an axis is not in ``x``.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> x = na.named(jnp.ones((2, 2), dtype=jnp.int32), ("q", "k"))
        >>> na.tril(x, ("q", "k")).array
        Array([[1, 0],
               [1, 1]], dtype=int32)
    """
    return _triangle(x, axes, k, "tril", keep_lower=True)


def triu(x: NamedArray, axes: tuple[AxisSelector, AxisSelector], k: int = 0) -> NamedArray:
    """Zero the entries below the ``k``-th diagonal of ``axes``: ``(i, j)`` kept if ``j - i >= k``.

    Arguments as for :func:`tril`.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> x = na.named(jnp.ones((2, 2), dtype=jnp.int32), ("q", "k"))
        >>> na.triu(x, ("k", "q")).array  # columns first: the transpose's upper triangle
        Array([[1, 0],
               [1, 1]], dtype=int32)
    """
    return _triangle(x, axes, k, "triu", keep_lower=False)


def diagonal(
    x: NamedArray,
    axes: tuple[AxisSelector, AxisSelector],
    new_axis: AxisSelector | None = None,
    offset: int = 0,
) -> NamedArray:
    """The entries ``(i, i + offset)`` of the (rows, columns) axes, as one new axis.

    Args:
        x: A NamedArray.
        axes: ``(rows, columns)``: two different axes of ``x``.
        new_axis: The name of the diagonal axis; defaults to the rows axis' name.
        offset: Which diagonal (``> 0`` above the main one, ``< 0`` below).

    Returns:
        A NamedArray where the two axes are replaced by ``new_axis``, at the position of
        whichever of them comes first in ``x`` (a layout: ``x``'s other axes keep their order).

    Raises:
        AxisError: if ``axes`` is not a pair.
        AxisNotFoundError: if an axis is not in ``x``.
        DuplicateAxisError: if ``new_axis`` names another axis of ``x``.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> x = na.named(jnp.arange(6).reshape(2, 3), ("q", "k"))
        >>> na.diagonal(x, ("q", "k"), offset=1).array
        Array([1, 5], dtype=int32)
    """
    x = expect_named(x, "diagonal")
    r, c = _pair(x, axes, "diagonal")
    offset = _check_k(offset, "diagonal", "offset")
    rows, cols = x.axes[r], x.axes[c]
    name = rows.name if new_axis is None else axis_name(new_axis)
    if name not in (rows.name, cols.name) and x.has_axis(name):
        raise DuplicateAxisError(
            f"diagonal(): new axis {name!r} is already an axis of "
            f"NamedArray({format_axes(x.axes)}); pick a name other than "
            f"{format_names(a.name for a in x.axes if a not in (rows, cols))}."
        )
    first_row, first_col = max(0, -offset), max(0, offset)
    n = max(0, min(rows.size - first_row, cols.size - first_col))
    diag = Axis(name, n)
    if isinstance(new_axis, Axis) and new_axis != diag:
        raise AxisError(f"diagonal(): the diagonal has {n} entries, but new_axis is {new_axis!r}.")
    i = np.arange(n, dtype=np.int32)
    # One gather by name: both axes indexed by the same new axis (see x[...]).
    index = {
        rows.name: NamedArray(jnp.asarray(i + first_row), (diag,)),
        cols.name: NamedArray(jnp.asarray(i + first_col), (diag,)),
    }
    return x[index]


def trace(x: NamedArray, axes: tuple[AxisSelector, AxisSelector], offset: int = 0) -> NamedArray:
    """Sum of the ``offset`` diagonal of the (rows, columns) axes; both axes are dropped.

    Arguments as for :func:`diagonal`.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> x = na.named(jnp.arange(8).reshape(2, 2, 2), ("batch", "q", "k"))
        >>> na.trace(x, ("q", "k")).array
        Array([ 3, 11], dtype=int32)
    """
    x = expect_named(x, "trace")
    r, _ = _pair(x, axes, "trace")
    _check_k(offset, "trace", "offset")
    return _sum(diagonal(x, axes, new_axis=None, offset=offset), x.axes[r].name)
