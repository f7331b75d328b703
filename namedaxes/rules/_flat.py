"""A light flatten for planners that decide from shapes alone: values and the treedef, nothing per leaf.

``flatten_leaves`` builds a ``Leaf`` record (key path, shape, dtype, names, placement) per leaf; on a
10,000-leaf tree those records and their key paths are tens of thousands of objects that live
through the call, and the garbage collector ends up costing more than the planning. Shape-driven
rules and the analysis' spec checks read each value's shape and dtype here, and build key paths
only when a message or a table needs them. The leaves are the same as ``flatten_leaves``'s (a
NamedArray is one leaf; with ``keep_none`` a ``None`` is one too), in the same order.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import PartitionSpec

from .._array import NamedArray, is_named_array
from .._axis import Axis
from .._caches import register
from .._partitioning._tree import leaf_axes, walk
from ._base import Leaf, shape_dtype

__all__ = [
    "by_name",
    "flatten_values",
    "in_order",
    "key_paths",
    "key_paths_later",
    "leaf_at",
    "map_shapes",
    "axes_order",
    "name_orders",
    "shape_dtype",
]


def _named_or_none(x: Any) -> bool:
    return x is None or isinstance(x, NamedArray)


def flatten_values(tree: Any, *, keep_none: bool = False) -> tuple[list[Any], Any]:
    """The leaf values of ``tree`` and its treedef, as ``flatten_leaves`` orders them."""
    return jax.tree_util.tree_flatten(tree, is_leaf=_named_or_none if keep_none else is_named_array)


def name_orders(tree: Any, values: list[Any]) -> list[tuple[int, ...] | None]:
    """Per leaf of ``flatten_values(tree)`` (``values``): its dimensions in the order of its axis
    names (``None``: position order, for leaves without names and for sorted names).

    The names are the engine's walk's (``_tree.walk``, as ``flatten_leaves`` reads them): a
    NamedArray's axes and a ``field(axis_names=...)`` array's declared names. Shape-driven rules
    plan on the shape in this order and put the spec back in the leaf's own order (``in_order``),
    so where two dimensions have equal sizes the tie goes by name: the same named axes get the
    same mesh axes whatever their positions.

    Raises:
        AxisError: if a ``field(axis_names=...)`` array's rank differs from its number of names.
    """
    found = walk(tree, jax.tree_util.tree_structure(tree))
    if not found.any_named:  # the common plain tree: no names anywhere, one cached lookup
        return [None] * len(values)
    out: list[tuple[int, ...] | None] = []
    index = 0  # the walk has an entry per tree_flatten leaf: none for None or an empty NamedArray
    for value in values:
        if value is None or (isinstance(value, NamedArray) and value.array is None):
            out.append(None)
            continue
        out.append(axes_order(leaf_axes(found.infos[index], value)))
        index += 1
    return out


def axes_order(axes: tuple[Axis, ...] | None) -> tuple[int, ...] | None:
    """``axes``' positions sorted by name (``None`` for no axes or axes already sorted)."""
    return None if axes is None else _order_of(tuple([a.name for a in axes]))


@functools.lru_cache(maxsize=4096)
def _order_of(names: tuple[str, ...]) -> tuple[int, ...] | None:
    order = tuple(sorted(range(len(names)), key=names.__getitem__))
    return None if order == tuple(range(len(names))) else order


register(_order_of.cache_clear)


def by_name(shape: tuple[int, ...], order: tuple[int, ...] | None) -> tuple[int, ...]:
    """``shape`` with its dimensions in ``order`` (``name_orders``; as it is for ``None``)."""
    return shape if order is None else tuple(shape[d] for d in order)


def in_order(spec: PartitionSpec, order: tuple[int, ...] | None) -> PartitionSpec:
    """A spec planned on ``by_name(shape, order)``, with its entries back in the leaf's order."""
    if order is None:
        return spec
    entries: list[Any] = [None] * len(order)
    for k, d in enumerate(order):
        entries[d] = spec[k] if k < len(spec) else None
    return PartitionSpec(*entries)


def map_shapes(tree: Any, fn: Callable[[tuple[int, ...]], PartitionSpec]) -> Any:
    """``fn(shape)`` for every array leaf of ``tree`` (called once per distinct shape), ``None``
    for the other leaves; the structure of ``tree`` (a NamedArray is one leaf).

    A named leaf's shape (a NamedArray, a ``field(axis_names=...)`` array) is given to ``fn`` in
    axis-name order and the spec put back in the leaf's order (``name_orders``), so equal sizes
    are told apart by name, not by position.
    """
    values, treedef = flatten_values(tree)
    orders = name_orders(tree, values)
    planned: dict[tuple[int, ...], PartitionSpec] = {}  # fn's spec per shape in name order
    done: dict[tuple[tuple[int, ...], tuple[int, ...] | None], PartitionSpec] = {}
    out: list[Any] = []
    for value, order in zip(values, orders):
        shape = shape_dtype(value)[0]
        if shape is None:
            out.append(None)
            continue
        spec = done.get((shape, order))
        if spec is None:
            ordered = by_name(shape, order)
            found = planned.get(ordered)
            if found is None:
                found = planned[ordered] = fn(ordered)
            spec = done[(shape, order)] = in_order(found, order)
        out.append(spec)
    return treedef.unflatten(out)


def key_paths(tree: Any, treedef: Any, *, keep_none: bool = False) -> list[tuple[Any, ...]]:
    """The key path of every leaf of ``treedef`` (the structure of ``tree``).

    Rebuilt from the structure alone (placeholders in place of the leaves, no ``is_leaf`` callback
    per node), which is several times cheaper than ``tree_flatten_with_path`` on the tree; a
    container whose unflatten refuses placeholders falls back to the tree itself.
    """
    n = treedef.num_leaves
    try:
        placeholders = treedef.unflatten(range(n))
        keys = [k for k, _ in jax.tree_util.tree_flatten_with_path(placeholders)[0]]
    except Exception:  # a custom node that checks its children when rebuilt
        keys = []
    if len(keys) != n:
        is_leaf = _named_or_none if keep_none else is_named_array
        keys = [k for k, _ in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)[0]]
    return keys


def key_paths_later(
    tree: Any, treedef: Any, *, keep_none: bool = False
) -> Callable[[], list[tuple[Any, ...]]]:
    """A function giving ``key_paths(tree, treedef)`` when first called, without holding ``tree``.

    For results that outlive the call (a table keyed by path): the structure is rebuilt now with
    placeholders (cheap) and walked for key paths only if the table is read; the user's arrays
    are not kept alive. A container that refuses placeholders gets its key paths computed now.
    """
    n = treedef.num_leaves
    try:
        placeholders = treedef.unflatten(range(n))
    except Exception:  # a custom node that checks its children when rebuilt
        keys = key_paths(tree, treedef, keep_none=keep_none)
        return lambda: keys
    cache: list[list[tuple[Any, ...]]] = []

    def later() -> list[tuple[Any, ...]]:
        if not cache:
            found = [k for k, _ in jax.tree_util.tree_flatten_with_path(placeholders)[0]]
            if len(found) != n:  # pragma: no cover - a node whose children change when rebuilt
                raise RuntimeError(
                    f"The tree's structure gave {len(found)} key paths for {n} leaves."
                )
            cache.append(found)
        return cache[0]

    return later


def leaf_at(tree: Any, treedef: Any, i: int, value: Any, *, keep_none: bool = False) -> Leaf:
    """The full ``Leaf`` record of leaf ``i``, for a message that names it."""
    return Leaf(tuple(key_paths(tree, treedef, keep_none=keep_none)[i]), value)
