"""Joining NamedArrays by name: ``concatenate`` along an existing axis, ``stack`` along a new one."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from .._array import NamedArray
from .._axis import Axis, AxisSelector, axis_name, find_axis, index_of
from .._errors import AxisSizeError, DuplicateAxisError, NamedTypeError, format_axes, format_names
from ._common import describe_operand, expect_named, join_by_name

__all__ = ["concatenate", "stack"]


def _aligned_operands(
    arrays: Sequence[NamedArray], caller: str, skip: str | None
) -> tuple[tuple[Axis, ...], list[jax.Array]]:
    """Check that ``arrays`` agree on their axes (other than ``skip``) as sets; transpose each to the
    first array's order. Returns the first array's axes and the transposed arrays."""
    if isinstance(arrays, NamedArray) or not isinstance(arrays, Sequence) or not arrays:
        raise NamedTypeError(
            f"{caller}() takes a non-empty list of NamedArrays, got {describe_operand(arrays)}."
        )
    arrays = [expect_named(a, caller, f"arrays[{k}]") for k, a in enumerate(arrays)]
    first = arrays[0]

    def others(a: NamedArray) -> dict[str, int]:
        return {ax.name: ax.size for ax in a.axes if ax.name != skip}

    ref = others(first)
    for k, a in enumerate(arrays):
        if others(a) != ref:
            mine = others(a)
            diff = sorted(set(ref) ^ set(mine)) + sorted(
                n for n in ref if n in mine and ref[n] != mine[n]
            )
            along = f" along {skip!r}" if skip is not None else ""
            raise AxisSizeError(
                f"{caller}(){along}: arrays[{k}] has axes ({format_axes(a.axes)}) but arrays[0] has "
                f"({format_axes(first.axes)}); the other axes must match by name and size "
                f"(they differ in {format_names(diff)}). Rename, slice or broadcast the arrays first."
            )
    # On Explicit meshes JAX joins only operands sharded alike: make them so, by name.
    arrays = join_by_name(caller, arrays, along=skip)
    out = []
    for a in arrays:
        order = [index_of(a.axes, ax) for ax in first.axes]
        out.append(a.array if order == list(range(a.ndim)) else jnp.transpose(a.array, order))
    return first.axes, out


def concatenate(axis: AxisSelector, arrays: Sequence[NamedArray]) -> NamedArray:
    """Join arrays end to end along an axis they all have.

    The arrays must have the same other axes (by name and size) but may order them differently;
    each is transposed to the first array's order, and the result keeps that order.

    Args:
        axis: The name of the axis to join along, which every array has (sizes may differ). If an
            ``Axis`` is given, its size must equal the sum of the arrays' sizes.
        arrays: A non-empty sequence of NamedArrays.

    Returns:
        A NamedArray whose ``axis`` has the summed size.

    Raises:
        AxisNotFoundError: if an array lacks ``axis``.
        AxisSizeError: if the other axes differ, or a given ``Axis`` has the wrong size.

    Example:
        >>> import jax.numpy as jnp
        >>> from namedaxes import named, concatenate
        >>> a = named(jnp.zeros((2, 3)), ("batch", "seq"))
        >>> b = named(jnp.zeros((5, 2)), ("seq", "batch"))
        >>> concatenate("seq", [a, b]).shape
        {'batch': 2, 'seq': 8}
    """
    name = axis_name(axis)
    for k, a in enumerate(arrays if isinstance(arrays, Sequence) else ()):
        if isinstance(a, NamedArray):
            find_axis(
                a.axes, name, where=f"concatenate() arrays[{k}] NamedArray({format_axes(a.axes)})"
            )
    axes, raw = _aligned_operands(arrays, "concatenate", skip=name)
    i = find_axis(axes, name)
    total = sum(r.shape[i] for r in raw)
    if isinstance(axis, Axis) and axis.size != total:
        sizes = " + ".join(str(r.shape[i]) for r in raw)
        raise AxisSizeError(
            f"concatenate(): the arrays' {name!r} sizes add up to {sizes} = {total}, but "
            f"Axis({name!r}, {axis.size}) was asked for. Pass the name {name!r} to take the sum."
        )
    out = axes[:i] + (Axis(name, total),) + axes[i + 1 :]
    return NamedArray(jnp.concatenate(raw, axis=i), out)


def stack(axis: AxisSelector, arrays: Sequence[NamedArray]) -> NamedArray:
    """Stack arrays along a new leading axis.

    Args:
        axis: The new axis: a name (its size is ``len(arrays)``) or an ``Axis`` of that size.
        arrays: A non-empty sequence of NamedArrays with the same axes (any order; each is
            transposed to the first array's order).

    Returns:
        A NamedArray with ``axis`` first, then the first array's axes.

    Raises:
        DuplicateAxisError: if the arrays already have an axis of that name.
        AxisSizeError: if the arrays' axes differ, or ``axis`` has a size other than ``len(arrays)``.

    Example:
        >>> import jax.numpy as jnp
        >>> from namedaxes import named, stack
        >>> xs = [named(jnp.zeros(4), ("embed",)) for _ in range(3)]
        >>> stack("layer", xs).shape
        {'layer': 3, 'embed': 4}
    """
    name = axis_name(axis)
    axes, raw = _aligned_operands(arrays, "stack", skip=None)
    if index_of(axes, name) is not None:
        raise DuplicateAxisError(
            f"stack(): the arrays already have an axis {name!r} (NamedArray({format_axes(axes)})). "
            "Stack along a new name, or use concatenate() to join along the existing axis."
        )
    if isinstance(axis, Axis) and axis.size != len(raw):
        raise AxisSizeError(
            f"stack(): Axis({name!r}, {axis.size}) was asked for, but {len(raw)} arrays were given. "
            f"Pass the name {name!r} to take the number of arrays."
        )
    return NamedArray(jnp.stack(raw, axis=0), (Axis(name, len(raw)),) + axes)
