"""Moving a NamedArray's dimensions into a target axis order: the primitive behind broadcasting."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from .._array import NamedArray
from .._axis import Axis, AxisSelector, find_axis
from .._errors import AxisError, format_axes, format_names

__all__ = ["align_to", "permutation_for"]


def permutation_for(x: NamedArray, names: Sequence[AxisSelector]) -> tuple[int, ...]:
    """Positions of ``names`` in ``x`` (each must exist), for ``jnp.transpose``."""
    return tuple(find_axis(x.axes, n) for n in names)


def align_to(x: NamedArray, target: Sequence[Axis]) -> jax.Array:
    """``x.array`` transposed to ``target``'s order, with size-1 dims for axes ``x`` lacks.

    The result broadcasts positionally against an array laid out as ``target``. Every axis of ``x``
    must appear in ``target`` with the same size.

    Raises:
        AxisError: if ``x`` has an axis that ``target`` lacks, or a size differs.

    Example:
        >>> import jax.numpy as jnp
        >>> from namedaxes import named, Axis
        >>> x = named(jnp.ones((3, 2)), ("b", "a"))
        >>> align_to(x, (Axis("a", 2), Axis("c", 5), Axis("b", 3))).shape
        (2, 1, 3)
    """
    target_names = [a.name for a in target]
    missing = [a for a in x.axes if a.name not in target_names]
    if missing:
        raise AxisError(
            f"Cannot align NamedArray({format_axes(x.axes)}) to ({format_axes(target)}): "
            f"axes {format_names(a.name for a in missing)} have no place in the target."
        )
    present = [a for a in target if x.has_axis(a.name)]
    perm = tuple(find_axis(x.axes, a) for a in present)  # also checks sizes
    array = x.array if perm == tuple(range(x.ndim)) else jnp.transpose(x.array, perm)
    if len(present) == len(target):
        return array
    shape = tuple(a.size if x.has_axis(a.name) else 1 for a in target)
    return jnp.reshape(array, shape)
