"""The layer axis of a stacked module's leaves: NamedArrays with the axis, and plain arrays with
the layer as their leading dimension (``vmap(map_plain=True)`` stacks them so, and ``fold`` maps
them over it). ``Stacked`` and the pipeline schedules take both apart by layer through
:func:`map_layers`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from .._array import NamedArray, is_named_array
from .._axis import Axis

__all__ = ["layer_dim", "map_layers", "plain_axes", "stacked_plain"]


def stacked_plain(x: Any) -> bool:
    """A plain array with dimensions: ``vmap(map_plain=True)`` stacks it on its leading dimension
    (and ``fold`` maps it over that one), so in a stacked module it has the layer first."""
    return isinstance(x, jax.Array | np.ndarray) and np.ndim(x) > 0


def plain_axes(shape: tuple[int, ...], name: str) -> tuple[Axis, ...]:
    """Axes for a plain array with the layer first: ``name``, then private names."""
    rest = (Axis(f"_{name}_dim{i}", int(d)) for i, d in enumerate(shape[1:], 1))
    return (Axis(name, int(shape[0])), *rest)


def map_layers(tree: Any, name: str, fn: Callable[[NamedArray], Any]) -> Any:
    """``tree`` with ``fn(leaf)`` in place of each leaf that has the layer axis ``name``.

    Those are the NamedArrays with that axis and the plain arrays with dimensions (layer first,
    see ``stacked_plain``): ``fn`` sees a plain one as a NamedArray with ``name`` first and its
    other dimensions privately named, and its result goes back plain.
    """

    def one(x: Any) -> Any:
        if isinstance(x, NamedArray):
            return fn(x) if x.has_axis(name) else x
        if not stacked_plain(x):
            return x
        out = fn(NamedArray(x, plain_axes(x.shape, name)))
        return out.array if isinstance(out, NamedArray) else out

    return jax.tree.map(one, tree, is_leaf=is_named_array)


def layer_dim(v: Any, name: str) -> int | None:
    if isinstance(v, NamedArray):
        return v.axis_names.index(name) if v.has_axis(name) else None
    return 0 if stacked_plain(v) else None  # (see map_layers)
