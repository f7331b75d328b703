"""The one plan: a spec for every leaf of a tree, from the tree walk, the rules and the mesh.

``pspec_for``, ``infer_resource_partitions``, ``LogicalAxisRule``, ``memory_report`` and the planner
are this plan plus a way to show or count it; ``shard`` and ``named_jit`` are this plan plus
placement (they cache the same per-leaf decisions as ``NamedSharding`` targets).

The plan also says which mapping entries matched no axis of the tree (a ``{"heads": "model"}`` entry
for a model whose attention has ``kv_heads`` and ``q_per_kv`` axes leaves every weight replicated
without a word): ``unmatched_entries`` decides it and ``describe_unmatched`` words it for ``plan``,
``memory_report`` and ``visualize_sharding``; ``check_matched`` is the ``strict=True`` check of
``shard``, ``named_jit`` and ``fsdp``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

import jax
from jax.sharding import PartitionSpec

from .._errors import UnmatchedMappingError, format_names
from .._logical._resolve import check_rules_mesh_axes, resolve
from .._logical._rules import AxisRules, MeshAxes
from .._mesh import MeshLike, context_mesh, require_mesh
from ._tree import FieldAxes, Plan, leaf_axes, leaf_plan, plain_spec

__all__ = [
    "TreeSpecs",
    "check_matched",
    "describe_unmatched",
    "plan_tree",
    "tree_axis_names",
    "unmatched_entries",
]


class TreeSpecs(NamedTuple):
    """A planned tree: its leaves and treedef (as ``tree_flatten`` gives them), the walk's plan,
    one spec per leaf (``None``: a plain leaf with no placement), and the mapping entries that
    matched no axis of the tree."""

    leaves: list[Any]
    treedef: Any
    plan: Plan
    specs: list[PartitionSpec | None]
    mesh: MeshLike | None
    unmatched: tuple[tuple[str, MeshAxes], ...] = ()


def plan_tree(tree: Any, rules: AxisRules, mesh: MeshLike | None, *, what: str) -> TreeSpecs:
    """Plan every leaf of ``tree``: named leaves through ``resolve``, plain ones by ``plain_spec``.

    A mesh is required as soon as a leaf has names. When the tree has no names but a mesh is known,
    the rules are still checked against it, so a mesh-axis typo never passes silently.

    Raises:
        ShardingError / MeshError: no mesh where one is needed, a mesh axis the mesh lacks, or an
            axis ``resolve`` cannot place.

    Example:
        >>> import jax.numpy as jnp
        >>> from namedaxes import named, AxisRules
        >>> planned = plan_tree({"x": named(jnp.zeros((4, 2)), ("batch", "embed")), "n": 3},
        ...                     AxisRules({"batch": "data"}), {"data": 2}, what="example")
        >>> planned.specs
        [P(), P('data', None)]
        >>> plan_tree({"x": named(jnp.zeros(4), "batch")}, AxisRules({"batch": "data", "heads":
        ...     "model"}), {"data": 2, "model": 2}, what="example").unmatched
        (('heads', 'model'),)
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    plan = leaf_plan(tree, treedef)
    target: MeshLike | None = None
    if plan.any_named:
        target = require_mesh(mesh, what=what, mappings=True)
    else:
        known = mesh if mesh is not None else context_mesh()
        if known is not None:
            target = require_mesh(known, what=what, mappings=True)
            check_rules_mesh_axes(rules, target)
    specs: list[PartitionSpec | None] = []
    names: set[str] = set()
    for info, leaf in zip(plan.infos, leaves):
        if info is None:
            specs.append(plain_spec(leaf))
            continue
        axes = leaf_axes(info, leaf) if isinstance(info, FieldAxes) else info
        specs.append(None if axes is None else resolve(axes, rules, target))  # type: ignore[arg-type]
        names.update(a.name for a in axes or ())
    return TreeSpecs(leaves, treedef, plan, specs, target, unmatched_entries(rules, names))


# -- mapping entries that match nothing ---------------------------------------------------------


def tree_axis_names(tree: Any) -> set[str]:
    """The axis names of every named leaf of ``tree`` (NamedArrays and ``field(axis_names=...)``
    arrays), as the tree walk sees them.

    Example:
        >>> import jax.numpy as jnp
        >>> from namedaxes import named
        >>> sorted(tree_axis_names({"x": named(jnp.zeros((2, 3)), ("batch", "embed")), "n": 1}))
        ['batch', 'embed']
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    plan = leaf_plan(tree, treedef)
    names: set[str] = set()
    if not plan.any_named:
        return names
    for info, leaf in zip(plan.infos, leaves):
        axes = leaf_axes(info, leaf) if isinstance(info, FieldAxes) else info
        names.update(a.name for a in axes or ())
    return names


def unmatched_entries(rules: AxisRules, names: Iterable[str]) -> tuple[tuple[str, MeshAxes], ...]:
    """The ``(logical_name, mesh_axes)`` entries of ``rules``, in rule order, whose name is not in
    ``names`` (the axis names of a tree): entries that place nothing.

    Example:
        >>> unmatched_entries(AxisRules({"batch": "data", "heads": "model"}), {"batch", "embed"})
        (('heads', 'model'),)
    """
    present = set(names)
    return tuple((n, t) for n, t in rules.pairs if n not in present)


def _entry_text(name: str, target: MeshAxes) -> str:
    return f"{name!r} -> {target!r}"


def describe_unmatched(unmatched: Iterable[tuple[str, MeshAxes]]) -> str:
    """One line listing mapping entries that match no axis (empty when there are none).

    Example:
        >>> describe_unmatched([("heads", "model"), ("kv", None)])
        "mapping entries that match no axis: 'heads' -> 'model', 'kv' -> None"
    """
    entries = [_entry_text(n, t) for n, t in unmatched]
    return f"mapping entries that match no axis: {', '.join(entries)}" if entries else ""


def check_matched(
    rules: AxisRules, names: Iterable[str], what: str, tree: str = "the tree"
) -> None:
    """The ``strict=True`` check: raise if an entry of ``rules`` matches none of ``names``.

    Raises:
        UnmatchedMappingError: naming the entries and the axes ``tree`` has.

    Example:
        >>> check_matched(AxisRules({"heads": "model"}), {"kv_heads", "q_per_kv"}, "shard")
        Traceback (most recent call last):
        ...
        namedaxes._errors.UnmatchedMappingError: shard(strict=True): the mapping entry 'heads' -> 'model' matches no axis of the tree, whose axes are 'kv_heads', 'q_per_kv'. Map axes the tree has (or drop the entry), or pass strict=False to place the tree anyway.
    """
    present = set(names)
    unmatched = unmatched_entries(rules, present)
    if not unmatched:
        return
    entries = ", ".join(_entry_text(n, t) for n, t in unmatched)
    noun = "entry" if len(unmatched) == 1 else "entries"
    verb = "matches" if len(unmatched) == 1 else "match"
    raise UnmatchedMappingError(
        f"{what}(strict=True): the mapping {noun} {entries} {verb} no axis of {tree}, whose axes "
        f"are {format_names(sorted(present))}. Map axes the tree has (or drop the "
        f"{noun}), or pass strict=False to place the tree anyway."
    )
