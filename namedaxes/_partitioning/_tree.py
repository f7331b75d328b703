"""The one tree walk: which leaves of a pytree have named axes, and where they are.

Every entry point sees a tree through :func:`walk`: the one plan (``_plan.plan_tree``) is built on
it, and the rules that need no mapping (``rules._base.flatten_leaves``) read names from it. The
walk is aligned with ``jax.tree_util.tree_flatten(tree)``'s leaves and depends only on the
structure (a ``NamedArray``'s axes are part of its treedef; ``field(axis_names=...)`` metadata is
part of the module class), so it is computed once per treedef and cached. :func:`plain_spec` is the
one rule for what a leaf without names is placed as.
"""

from __future__ import annotations

import collections
from typing import Any, NamedTuple

import equinox as eqx
import jax
from jax.sharding import NamedSharding, PartitionSpec

from .._array import NamedArray
from .._axis import Axis
from .._caches import register
from .._errors import AxisError, format_names
from ._field import annotated_fields
from ._lru import lru_put, lru_touch

__all__ = ["FieldAxes", "LeafInfo", "Walk", "leaf_axes", "plain_spec", "walk"]


class FieldAxes(NamedTuple):
    """A plain-array leaf declared with ``field(axis_names=...)``; sizes come from its shape."""

    names: tuple[str, ...]
    field: str  # "Linear.weight", for messages


#: Per leaf: the axes of a NamedArray's array, a field's names, or None (no names).
LeafInfo = tuple[Axis, ...] | FieldAxes | None


def _is_annotated_module(node: Any) -> bool:
    return isinstance(node, eqx.Module) and bool(annotated_fields(type(node)))


def _is_stop(node: Any) -> bool:
    return isinstance(node, NamedArray) or _is_annotated_module(node)


def _visit(node: Any, out: list[LeafInfo]) -> None:
    if node is None:
        return
    if isinstance(node, NamedArray):
        if node.array is not None:  # a None array (after eqx.partition) flattens to no leaf
            out.append(node.axes)
        return
    if _is_annotated_module(node):
        names = annotated_fields(type(node))
        children, _ = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda n: n is not node)
        for path, child in children:
            key = getattr(path[0], "name", None) if path else None
            field = f"{type(node).__name__}.{key}"
            if key in names and isinstance(child, NamedArray):
                _check_declared(child, names[key], field)
                _visit(child, out)  # its own axes: the same names, maybe in another order
            elif key in names and child is not None:
                # Classified by structure only (the walk is cached per treedef): a declared field
                # that is one leaf has the names, whatever that leaf holds now (an array, or a
                # placeholder such as 1.0 that ``leaf_axes`` gives no axes).
                _check_one_leaf(child, names[key], field)
                out.append(FieldAxes(names[key], field))
            else:
                _visit(child, out)
        return
    parts = jax.tree_util.tree_leaves(node, is_leaf=lambda n: n is not node and _is_stop(n))
    if len(parts) == 1 and parts[0] is node:
        out.append(None)
        return
    for p in parts:
        if _is_stop(p):
            _visit(p, out)
        else:
            out.append(None)


def _check_declared(child: NamedArray, declared: tuple[str, ...], field: str) -> None:
    """A NamedArray in a ``field(axis_names=...)`` field must carry the declared names."""
    own = tuple(a.name for a in child.axes)
    if sorted(own) != sorted(declared):
        raise AxisError(
            f"Field {field} is declared with axis_names ({format_names(declared)}) but holds a "
            f"NamedArray with axes ({format_names(own)}). Make the declaration match the array's "
            "names, or drop axis_names= from the field (a NamedArray carries its own names)."
        )


def _check_one_leaf(child: Any, declared: tuple[str, ...], field: str) -> None:
    """A ``field(axis_names=...)`` field names the dimensions of one array: not of a container."""
    leaves = jax.tree_util.tree_leaves(child)
    if len(leaves) != 1 or leaves[0] is not child:
        raise AxisError(
            f"Field {field} is declared with axis_names ({format_names(declared)}) but holds a "
            f"{type(child).__name__} ({len(leaves)} leaves), and axis_names name the "
            "dimensions of one array. Declare the names on each array's own field, or hold "
            "NamedArrays in it (they carry their own names) and drop axis_names=."
        )


def _is_arraylike(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, type)


class Walk(NamedTuple):
    """Per leaf of a tree (in ``tree_flatten`` order) its names, and whether any leaf has some."""

    infos: tuple[LeafInfo, ...]
    any_named: bool
    any_field: bool


_WALKS: collections.OrderedDict[Any, Walk] = collections.OrderedDict()
_MAX_WALKS = 512
register(_WALKS.clear)


def walk(tree: Any, treedef: Any) -> Walk:
    """The (cached) walk of ``tree``, whose structure is ``treedef``."""
    try:
        found = _WALKS.get(treedef)
    except TypeError:  # an unhashable static field somewhere: no caching
        return _build(tree)
    if found is None:
        found = _build(tree)
        lru_put(_WALKS, treedef, found, _MAX_WALKS)
    else:
        lru_touch(_WALKS, treedef)
    return found


def _build(tree: Any) -> Walk:
    out: list[LeafInfo] = []
    _visit(tree, out)
    return Walk(
        tuple(out),
        any(i is not None for i in out),
        any(isinstance(i, FieldAxes) for i in out),
    )


def leaf_axes(info: LeafInfo, leaf: Any) -> tuple[Axis, ...] | None:
    """The axes of one leaf under its plan entry (field names get sizes from the leaf's shape).

    Raises:
        AxisError: if a ``field(axis_names=...)`` array's rank differs from the number of names.
    """
    if info is None or not isinstance(info, FieldAxes):
        return info
    if not _is_arraylike(leaf):  # a placeholder (a Python number, ...): nothing to place
        return None
    shape = leaf.shape
    if len(shape) != len(info.names):
        raise AxisError(
            f"Field {info.field} is declared with axis_names ({format_names(info.names)}) but holds "
            f"an array of shape {tuple(shape)}. Give one name per dimension in field(axis_names=...)."
        )
    return tuple(Axis(n, int(s)) for n, s in zip(info.names, shape))


def plain_spec(leaf: Any) -> PartitionSpec | None:
    """Where a leaf without names stays: ``P()`` for scalars, its current ``NamedSharding``'s spec
    when it has one (also in a tracer's type on Explicit axes), else ``None`` (no placement: the
    analysis counts it as replicated)."""
    if isinstance(leaf, (bool, int, float, complex)):
        return PartitionSpec()
    shape = getattr(leaf, "shape", None)
    if shape is None or isinstance(leaf, type):
        return None
    if len(shape) == 0:
        return PartitionSpec()
    sharding = getattr(leaf, "sharding", None)
    if sharding is None and isinstance(leaf, jax.core.Tracer):
        sharding = getattr(jax.typeof(leaf), "sharding", None)  # Explicit axes: in the type
    if isinstance(sharding, NamedSharding):
        return sharding.spec
    return None
