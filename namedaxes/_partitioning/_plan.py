"""The one plan: for a tree, a mapping and a mesh, each leaf's axes, spec and placement.

Every entry point that turns names into placements reads a tree through :func:`plan_tree`:

* ``pspec_for`` and ``infer_resource_partitions``: the specs;
* ``shard`` and ``auto_sharded``: the targets (a ``NamedSharding`` per named leaf);
* ``named_jit`` and ``fsdp``: the targets of their inputs and outputs, planned when a program is
  compiled (the cached call reuses them);
* ``LogicalAxisRule``, ``memory_report``, ``analysis.plan`` and ``visualize_sharding``: the specs
  with each leaf's path (``rules._base.planned_leaves``);
* checkpoint restore: the specs of the named leaves it reads.

The plan is built on the tree walk (``_tree.walk``) and asks ``resolve`` for every named leaf; what
depends only on the structure (the walk, NamedArray leaves' specs and targets, the mapping entries
that match no axis) is cached per (treedef, rules, mesh), so a tree seen before costs a flatten and
a lookup. Specs are resolved on first use, leaf by leaf, so a caller that needs some leaves only
(``visualize_sharding`` shows placed arrays where they are) resolves only those, and can name the
leaf when ``resolve`` refuses it. The mesh-axis check of the mapping (a mesh axis the mesh lacks is
an error even for a tree with no names) happens here, once per structure.

The plan also says which mapping entries matched no axis of the tree (a ``{"heads": "model"}`` entry
for a model whose attention has ``kv_heads`` and ``q_per_kv`` axes leaves every weight replicated
without a word): ``describe_unmatched`` words them for ``plan``, ``memory_report`` and
``visualize_sharding``; ``check_matched`` is the ``strict=True`` check of ``shard``, ``named_jit``
and ``fsdp``.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Iterable
from typing import Any

import jax
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec

from .._axis import Axis
from .._caches import register
from .._errors import (
    MeshError,
    ShardingError,
    UnmatchedMappingError,
    did_you_mean,
    format_names,
    format_path,
    with_prefix,
)
from .._logical._resolve import check_rules_mesh_axes, resolve
from .._logical._rules import AxisRules, MeshAxes
from .._mesh import MeshLike, context_mesh, mesh_shape, require_mesh
from .._spec import entry_axes
from ._lru import lru_put, lru_touch
from ._tree import FieldAxes, LeafInfo, Walk, leaf_axes, plain_spec, walk

__all__ = [
    "TreePlan",
    "check_matched",
    "describe_unmatched",
    "plan_tree",
    "tree_axis_names",
    "unmatched_entries",
]

_UNSET: Any = object()


class _Structure:
    """What a plan keeps per (treedef, rules, mesh): the walk, the axis names, the unmatched
    mapping entries, and per NamedArray leaf its spec and target once resolved."""

    __slots__ = ("walk", "names", "unmatched", "specs", "targets")

    def __init__(self, tree_walk: Walk, rules: AxisRules) -> None:
        self.walk = tree_walk
        self.names = _names(tree_walk.infos)
        self.unmatched = unmatched_entries(rules, self.names)
        self.specs: list[Any] = [_UNSET] * len(tree_walk.infos)
        self.targets: tuple[NamedSharding | FieldAxes | None, ...] | None = None


_STRUCTURES: collections.OrderedDict[Any, _Structure] = collections.OrderedDict()
_MAX_STRUCTURES = 1024
register(_STRUCTURES.clear)


@functools.lru_cache(maxsize=4096)
def _named_sharding(mesh: Mesh | AbstractMesh, spec: PartitionSpec) -> NamedSharding:
    return NamedSharding(mesh, spec)


register(_named_sharding.cache_clear)


class TreePlan:
    """A planned tree (see :func:`plan_tree`).

    Attributes:
        leaves: The leaves, as ``jax.tree_util.tree_flatten(tree)`` gives them.
        treedef: Their treedef.
        rules: The rules the tree was planned with.
        mesh: The mesh it was planned on (``None`` when nothing is named and no mesh is known).
        walk: The tree walk: per leaf, a NamedArray's axes, a field's names, or ``None``.
    """

    __slots__ = ("leaves", "treedef", "rules", "mesh", "_structure")

    def __init__(
        self,
        leaves: list[Any],
        treedef: Any,
        rules: AxisRules,
        mesh: MeshLike | None,
        structure: _Structure,
    ) -> None:
        self.leaves, self.treedef, self.rules, self.mesh = leaves, treedef, rules, mesh
        self._structure = structure

    @property
    def walk(self) -> Walk:
        return self._structure.walk

    @property
    def any_named(self) -> bool:
        """Whether some leaf has names (a NamedArray, or a ``field(axis_names=...)`` array)."""
        return self._structure.walk.any_named

    @property
    def names(self) -> frozenset[str]:
        """The axis names of the tree's named leaves."""
        return self._structure.names

    @property
    def unmatched(self) -> tuple[tuple[str, MeshAxes], ...]:
        """The mapping entries, in rule order, whose name no leaf has."""
        return self._structure.unmatched

    def axes(self, i: int) -> tuple[Axis, ...] | None:
        """The axes of leaf ``i`` (``None`` for a leaf without names)."""
        return leaf_axes(self._structure.walk.infos[i], self.leaves[i])

    def spec(self, i: int) -> PartitionSpec | None:
        """The spec of leaf ``i``: ``resolve`` of its axes for a named leaf; for a plain one the
        spec it is placed with (``plain_spec``, kept when the mesh has its mesh axes), else
        ``None`` (no placement).

        Raises:
            ShardingError: from ``resolve``, for a named leaf it cannot place.
        """
        structure = self._structure
        info = structure.walk.infos[i]
        if info is None:
            return self._plain(self.leaves[i])
        try:
            if isinstance(info, FieldAxes):
                axes = leaf_axes(info, self.leaves[i])
                if axes is None:  # a placeholder (1.0) in a declared field: as an unnamed leaf
                    return self._plain(self.leaves[i])
                return resolve(axes, self.rules, self.mesh)  # type: ignore[arg-type]
            spec = structure.specs[i]
            if spec is _UNSET:
                spec = structure.specs[i] = resolve(info, self.rules, self.mesh)  # type: ignore[arg-type]
        except ShardingError as e:  # in a large tree the path is how to find the leaf
            raise with_prefix(e, f"At leaf {self.path(i)!r}: ") from e
        return spec

    def path(self, i: int) -> str:
        """Leaf ``i``'s pytree path as ``layers/0/weight`` (``<root>`` for a bare leaf)."""
        flat, _ = jax.tree_util.tree_flatten_with_path(self.treedef.unflatten(self.leaves))
        keys = flat[i][0]
        if isinstance(self._structure.walk.infos[i], tuple):  # a NamedArray's own array key
            keys = keys[:-1]
        return format_path(keys)

    @property
    def specs(self) -> list[PartitionSpec | None]:
        """Every leaf's spec (see :meth:`spec`)."""
        return [self.spec(i) for i in range(len(self.leaves))]

    def target(self, i: int) -> NamedSharding | None:
        """Where to place leaf ``i`` (see :attr:`targets`), resolving only that leaf."""
        info = self._structure.walk.infos[i]
        if info is None or (isinstance(info, FieldAxes) and self.axes(i) is None):
            return None  # no names (or a placeholder in a declared field): left where it is
        spec = self.spec(i)
        return None if spec is None else _named_sharding(self._placing_mesh(), spec)

    def _placing_mesh(self) -> Mesh | AbstractMesh:
        """The mesh the targets are on; a plan on an ``{axis: size}`` mapping places nothing.

        Raises:
            MeshError: for a plan made on a mapping (or on no mesh).
        """
        mesh = self.mesh
        if not isinstance(mesh, (Mesh, AbstractMesh)):
            raise MeshError(
                f"This tree was planned on {mesh!r}, which can size shards but not place them. "
                "Plan it on a Mesh (jax.make_mesh) or an AbstractMesh to get shardings."
            )
        return mesh

    @property
    def targets(self) -> list[NamedSharding | None]:
        """Where to place each leaf: a ``NamedSharding`` on the plan's mesh for a named leaf,
        ``None`` (leave it where it is) for the others."""
        structure = self._structure
        cached = structure.targets
        if cached is None:
            mesh = self._placing_mesh()
            cached = structure.targets = tuple(
                info
                if isinstance(info, FieldAxes)
                else None
                if info is None
                else _named_sharding(mesh, self.spec(i))  # type: ignore[arg-type]
                for i, info in enumerate(structure.walk.infos)
            )
        if not structure.walk.any_field:
            return list(cached)  # type: ignore[arg-type]
        # A field's sizes come from its leaf's shape: its target is made per call.
        return [self.target(i) if isinstance(t, FieldAxes) else t for i, t in enumerate(cached)]

    def _plain(self, leaf: Any) -> PartitionSpec | None:
        spec = plain_spec(leaf)
        if spec is None or self.mesh is None or not len(spec):
            return spec
        names = {n for n, _ in mesh_shape(self.mesh)}
        if all(m in names for e in spec for m in entry_axes(e)):
            return spec
        return None  # placed on another mesh's axes: nothing to say about this one


def plan_tree(
    tree: Any,
    rules: AxisRules,
    mesh: MeshLike | None,
    *,
    caller: str,
    flat: tuple[list[Any], Any] | None = None,
) -> TreePlan:
    """The one plan of ``tree`` under ``rules`` on ``mesh``.

    A mesh is required as soon as a leaf has names (``mesh``, else the one set with
    ``jax.set_mesh``). When a mesh is known, the rules are checked against it even if the tree has
    no names, so a mesh-axis typo never passes silently.

    Args:
        tree: Any pytree.
        rules: The rules (``rules_in_force`` gives them from a mapping or the context).
        mesh: A ``Mesh``, ``AbstractMesh`` or ``{axis: size}`` mapping, or ``None``.
        caller: The public call planning, for messages (``"shard"``).
        flat: ``(leaves, treedef)`` when the caller has flattened the tree already.

    Raises:
        ShardingError / MeshError: no mesh where one is needed, or a mesh axis the mesh lacks.

    Example:
        >>> import jax.numpy as jnp
        >>> from namedaxes import named, AxisRules
        >>> planned = plan_tree({"x": named(jnp.zeros((4, 2)), ("batch", "embed")), "n": 3},
        ...                     AxisRules({"batch": "data"}), {"data": 2}, caller="example")
        >>> planned.specs
        [P(), P('data', None)]
        >>> plan_tree({"x": named(jnp.zeros(4), "batch")}, AxisRules({"batch": "data", "heads":
        ...     "model"}), {"data": 2, "model": 2}, caller="example").unmatched
        (('heads', 'model'),)
    """
    leaves, treedef = flat if flat is not None else jax.tree_util.tree_flatten(tree)
    tree_walk = walk(tree, treedef)
    target: MeshLike | None
    if tree_walk.any_named:
        target = require_mesh(mesh, caller=caller, mappings=True)
    else:
        known = mesh if mesh is not None else context_mesh()
        target = None if known is None else require_mesh(known, caller=caller, mappings=True)
    mesh_key = target if target is None or isinstance(target, (Mesh, AbstractMesh)) else None
    if target is not None and mesh_key is None:
        mesh_key = mesh_shape(target)
    key = (treedef, rules, mesh_key)
    try:
        structure = _STRUCTURES.get(key)
    except TypeError:  # unhashable static data in the structure: plan without caching
        key, structure = None, None
    if structure is None:
        if target is not None:  # the mapping's mesh axes must exist, whatever the leaves are
            check_rules_mesh_axes(rules, target)
        structure = _Structure(tree_walk, rules)
        if key is not None:
            lru_put(_STRUCTURES, key, structure, _MAX_STRUCTURES)
    else:
        lru_touch(_STRUCTURES, key)
    return TreePlan(leaves, treedef, rules, target, structure)


# -- mapping entries that match nothing ---------------------------------------------------------


def _names(infos: Iterable[LeafInfo]) -> frozenset[str]:
    names: set[str] = set()
    for info in infos:
        if isinstance(info, FieldAxes):
            names.update(info.names)
        elif info is not None:
            names.update(a.name for a in info)
    return frozenset(names)


def tree_axis_names(tree: Any) -> frozenset[str]:
    """The axis names of every named leaf of ``tree`` (NamedArrays and ``field(axis_names=...)``
    arrays), as the tree walk sees them.

    Example:
        >>> import jax.numpy as jnp
        >>> from namedaxes import named
        >>> sorted(tree_axis_names({"x": named(jnp.zeros((2, 3)), ("batch", "embed")), "n": 1}))
        ['batch', 'embed']
    """
    return _names(walk(tree, jax.tree_util.tree_structure(tree)).infos)


def unmatched_entries(rules: AxisRules, names: Iterable[str]) -> tuple[tuple[str, MeshAxes], ...]:
    """The ``(logical_name, mesh_axes)`` entries of ``rules``, in rule order, whose name is not in
    ``names`` (the axis names of a tree): entries that place nothing.

    Example:
        >>> unmatched_entries(AxisRules({"batch": "data", "heads": "model"}), {"batch", "embed"})
        (('heads', 'model'),)
    """
    present = set(names)
    return tuple((n, t) for n, t in rules.pairs if n not in present)


def _entry_text(name: str, target: MeshAxes, names: Iterable[str]) -> str:
    """One unmatched entry, with the axis of ``names`` it is likely a typo of."""
    return f"{name!r} -> {target!r}{did_you_mean(name, names)}"


def describe_unmatched(unmatched: Iterable[tuple[str, MeshAxes]], names: Iterable[str]) -> str:
    """One line listing mapping entries that match no axis of ``names`` (empty when there are
    none), each with the closest axis name when one is close.

    Example:
        >>> describe_unmatched([("heads", "model"), ("kv", None)], {"embed", "kv_heads"})
        "mapping entries that match no axis: 'heads' -> 'model' (did you mean 'kv_heads'?), 'kv' -> None"
    """
    names = tuple(names)
    entries = [_entry_text(n, t, names) for n, t in unmatched]
    return f"mapping entries that match no axis: {', '.join(entries)}" if entries else ""


def check_matched(
    rules: AxisRules, names: Iterable[str], caller: str, tree: str = "the tree"
) -> None:
    """The ``strict=True`` check: raise if an entry of ``rules`` matches none of ``names``.

    Raises:
        UnmatchedMappingError: naming the entries and the axes ``tree`` has.

    Example:
        >>> check_matched(AxisRules({"heads": "model"}), {"kv_heads", "q_per_kv"}, "shard")
        Traceback (most recent call last):
        ...
        namedaxes._errors.UnmatchedMappingError: shard(strict=True): the mapping entry 'heads' -> 'model' (did you mean 'kv_heads'?) matches no axis of the tree, whose axes are 'kv_heads', 'q_per_kv'. Map axes the tree has (or drop the entry), or pass strict=False to place the tree anyway.
    """
    present = set(names)
    unmatched = unmatched_entries(rules, present)
    if not unmatched:
        return
    entries = ", ".join(_entry_text(n, t, present) for n, t in unmatched)
    noun = "entry" if len(unmatched) == 1 else "entries"
    verb = "matches" if len(unmatched) == 1 else "match"
    raise UnmatchedMappingError(
        f"{caller}(strict=True): the mapping {noun} {entries} {verb} no axis of {tree}, whose axes "
        f"are {format_names(sorted(present))}. Map axes the tree has (or drop the "
        f"{noun}), or pass strict=False to place the tree anyway."
    )
