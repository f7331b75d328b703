"""Specs without placing anything: ``pspec_for``, ``infer_resource_partitions`` and per-axis queries."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

from .._array import NamedArray
from .._axis import Axis, AxisSelector, axis_name
from .._errors import NamedTypeError, ShardingError
from .._logical._context import rules_in_force
from .._logical._resolve import check_rules_mesh_axes, resolve
from .._logical._rules import MeshAxes, RulesLike
from .._mesh import AnyMesh, MeshLike, context_mesh, mesh_axis_sizes, require_mesh
from .._spec import entry_axes
from ._plan import plan_tree

__all__ = [
    "infer_resource_partitions",
    "physical_axis_name",
    "physical_axis_size",
    "pspec_for",
    "round_axis_for_partitioning",
    "sharding_for_axis",
]


def _named_array_granularity(tree: Any, specs: list[Any]) -> Any:
    """Rebuild ``tree`` with each NamedArray (and each plain leaf) replaced by its spec: a valid
    ``jit`` in/out_shardings prefix."""
    it = iter(specs)
    outer_leaves, outer_def = jax.tree_util.tree_flatten(
        tree, is_leaf=lambda n: isinstance(n, NamedArray)
    )
    out = []
    for node in outer_leaves:
        if isinstance(node, NamedArray):
            out.append(next(it) if node.array is not None else None)
        else:
            out.append(next(it))
    return jax.tree_util.tree_unflatten(outer_def, out)


def pspec_for(tree: Any, mapping: RulesLike | None = None, *, mesh: MeshLike | None = None) -> Any:
    """A ``PartitionSpec`` for every NamedArray in ``tree`` (same structure, NamedArrays replaced).

    Works on concrete arrays, tracers and ``jax.ShapeDtypeStruct`` leaves (from ``eval_shape``).
    Scalars (Python numbers, 0-d arrays) get ``P()``; other plain arrays their current spec when
    they have a ``NamedSharding``, else ``None``. ``field(axis_names=...)`` arrays are named.

    The mesh is needed to check divisibility: ``mesh=`` (a ``Mesh``, ``AbstractMesh``, or a
    ``{axis: size}`` mapping), else the one set with ``jax.set_mesh``; without either, a tree that
    holds named arrays raises a ``ShardingError``.

    Args:
        tree: Any pytree.
        mapping: ``{logical_name: mesh_axes}`` or ``AxisRules``; defaults to the context mapping.
        mesh: The mesh to plan for.

    Raises:
        ShardingError: with no mapping, or no mesh when one is needed, or when ``resolve`` fails.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from namedaxes import named
        >>> tree = {"x": named(jnp.zeros((8, 3)), ("batch", "embed")), "step": 0}
        >>> pspec_for(tree, {"batch": "data"}, mesh={"data": 4})
        {'step': P(), 'x': P('data', None)}
    """
    planned = plan_tree(tree, rules_in_force(mapping, "pspec_for"), mesh, caller="pspec_for")
    return _named_array_granularity(tree, planned.specs)


def infer_resource_partitions(
    tree: Any, mapping: RulesLike | None = None, mesh: AnyMesh | None = None
) -> Any:
    """Like ``pspec_for`` but with ``NamedSharding``s (on ``mesh`` or the context mesh).

    Plain arrays keep their current sharding (``None`` if they have none); scalars are replicated.

    Raises:
        ShardingError: with no mapping or no mesh, or when ``resolve`` fails.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from namedaxes import named
        >>> mesh = jax.make_mesh((1,), ("data",))
        >>> s = infer_resource_partitions(named(jnp.zeros(2), "batch"), {"batch": "data"}, mesh)
        >>> s.spec
        P('data',)
    """
    rules = rules_in_force(mapping, "infer_resource_partitions")
    m = require_mesh(mesh, caller="infer_resource_partitions")
    planned = plan_tree(tree, rules, m, caller="infer_resource_partitions")
    shardings = []
    for i, (info, leaf) in enumerate(zip(planned.walk.infos, planned.leaves)):
        spec = planned.spec(i)
        if info is None and spec != PartitionSpec():
            # An unnamed array keeps its sharding (it may be on another mesh or one device).
            shardings.append(getattr(leaf, "sharding", None))
        else:
            shardings.append(None if spec is None else NamedSharding(m, spec))
    return _named_array_granularity(tree, shardings)


# -- single axes --------------------------------------------------------------------------------


def _single_axis_spec(
    axis: AxisSelector, mapping: RulesLike | None, mesh: MeshLike | None, caller: str
) -> MeshAxes:
    """What ``resolve`` gives a one-axis array of ``axis`` (its one entry).

    The rules decide without sizes when the name has one rule (or its first is ``None``): that
    answer needs no mesh. A bare name is then resolved with the size its rule's mesh axes divide,
    on the known mesh (given or set), else on a mesh of size-1 axes; an ``Axis`` with its size on
    the known mesh (divisibility checked). With fallback rules, the size and the mesh decide.
    """
    rules = rules_in_force(mapping, caller)
    name = axis_name(axis)
    candidates = rules.candidates(name)
    known = mesh if mesh is not None else context_mesh()
    if known is not None:  # a typo in the mapping never passes, whichever name is asked about
        check_rules_mesh_axes(rules, known)
    if not candidates or candidates[0] is None:
        return None  # unmapped or fixed as replicated: no size needed to know that
    if len(candidates) > 1 and not isinstance(axis, Axis):
        raise ShardingError(
            f"{caller} needs an Axis with its size for {name!r}: it has {len(candidates)} rules "
            "and the size decides which applies. Pass Axis("
            f"{name!r}, size)."
        )
    if known is None and len(candidates) == 1:
        sizes: MeshLike = {m: 1 for m in rules.mesh_axes}  # the rule decides; no mesh to check
    else:
        sizes = mesh_axis_sizes(require_mesh(mesh, caller=caller, mappings=True))
    if not isinstance(axis, Axis):  # the size its rule's mesh axes divide
        axis = Axis(name, math.prod(sizes.get(m, 1) for m in candidates[0]))  # type: ignore[union-attr]
    return resolve((axis,), rules, sizes)[0]


def physical_axis_name(
    axis: AxisSelector, mapping: RulesLike | None = None, mesh: MeshLike | None = None
) -> MeshAxes:
    """The mesh axes ``axis`` is placed on: what ``resolve`` gives a one-axis array of it.

    When the rules decide without sizes, no mesh is needed: unmapped or ``None``-mapped names, and
    names with a single rule (its mesh axes), given as a name or as an ``Axis``. When a mesh is
    given or set, the answer is checked on it (for an ``Axis``, divisibility too). A name with
    fallback rules needs an ``Axis`` with its size and a mesh, as divisibility decides between
    them.

    Raises:
        ShardingError: with no mapping in force, a bare name that has fallback rules, or when
            ``resolve`` fails (unknown mesh axis, no rule applies).
        NoMeshError: for fallback rules and no mesh.

    Example:
        >>> from namedaxes import Axis, AxisRules
        >>> rules = AxisRules([("embed", "model"), ("embed", "data")])
        >>> physical_axis_name(Axis("embed", 6), rules, {"data": 2, "model": 4})
        'data'
        >>> physical_axis_name("embed", {"batch": "data"}) is None
        True
        >>> physical_axis_name(Axis("batch", 8), {"batch": "data"})  # no mesh needed
        'data'
    """
    return _single_axis_spec(axis, mapping, mesh, "physical_axis_name")


def physical_axis_size(
    axis: AxisSelector, mapping: RulesLike | None = None, mesh: MeshLike | None = None
) -> int:
    """How many ways ``axis`` is split: the product of the mesh axes ``resolve`` gives it.

    Returns 1 ("not split") for an unmapped or ``None``-mapped axis, without needing a mesh.

    Raises:
        ShardingError: as :func:`physical_axis_name`.

    Example:
        >>> from namedaxes import Axis, AxisRules
        >>> rules = AxisRules([("embed", "model"), ("embed", "data")])
        >>> physical_axis_size(Axis("embed", 6), rules, {"data": 2, "model": 4})
        2
        >>> physical_axis_size("embed", {"batch": "data"})
        1
    """
    entry = _single_axis_spec(axis, mapping, mesh, "physical_axis_size")
    if entry is None:
        return 1
    sizes = mesh_axis_sizes(require_mesh(mesh, caller="physical_axis_size", mappings=True))
    return math.prod(sizes[n] for n in entry_axes(entry))


def sharding_for_axis(
    axis: Axis | Sequence[Axis], mapping: RulesLike | None = None, mesh: AnyMesh | None = None
) -> NamedSharding:
    """The ``NamedSharding`` of an array whose axes are ``axis`` (one ``Axis`` or several).

    Example:
        >>> import jax
        >>> from namedaxes import Axis
        >>> mesh = jax.make_mesh((1,), ("data",))
        >>> sharding_for_axis(Axis("batch", 4), {"batch": "data"}, mesh).spec
        P('data',)
    """
    if isinstance(axis, Axis):
        axes: tuple[Axis, ...] = (axis,)
    elif isinstance(axis, (tuple, list)) and all(isinstance(a, Axis) for a in axis):
        axes = tuple(axis)
    else:
        raise NamedTypeError(
            f"sharding_for_axis needs an Axis or a sequence of Axis objects (with sizes), got "
            f"{axis!r} ({type(axis).__name__}). Use e.g. Axis('batch', 8)."
        )
    rules = rules_in_force(mapping, "sharding_for_axis")
    m = require_mesh(mesh, caller="sharding_for_axis")
    return NamedSharding(m, resolve(axes, rules, m))


def round_axis_for_partitioning(
    axis: Axis, mapping: RulesLike | None = None, mesh: MeshLike | None = None
) -> Axis:
    """``axis`` padded to the smallest size ``resolve`` shards on the mesh axes of ``axis``'s
    first rule that has mesh axes (pad to this, and that rule applies).

    ``physical_axis_size`` of the result then equals that rule's split (unless a mesh axis is
    taken by another axis of the same array, which only ``resolve`` on the whole array knows). An
    unmapped name, or one whose first rule is ``None`` (replicated), comes back unchanged.

    Example:
        >>> from namedaxes import Axis
        >>> round_axis_for_partitioning(Axis("vocab", 50257), {"vocab": "model"}, {"model": 8})
        Axis(name='vocab', size=50264)
    """
    if not isinstance(axis, Axis):
        raise ShardingError(
            f"round_axis_for_partitioning needs an Axis with a size, got {axis!r}. "
            "Use e.g. Axis('vocab', 50257)."
        )
    rules = rules_in_force(mapping, "round_axis_for_partitioning")
    targets = [t for t in rules.candidates(axis.name) if t is not None]
    first = rules.candidates(axis.name)[:1]
    if not targets or first == (None,):
        known = mesh if mesh is not None else context_mesh()
        if known is not None:  # a typo in the mapping never passes, whichever axis is asked about
            check_rules_mesh_axes(rules, known)
        return axis  # replicated: any size is placeable
    sizes = mesh_axis_sizes(require_mesh(mesh, caller="round_axis_for_partitioning", mappings=True))
    check_rules_mesh_axes(rules, sizes)
    n = math.prod(sizes[m] for m in targets[0])
    padded = axis.resize(-(-axis.size // n) * n)
    resolve((padded,), rules, sizes)  # the padded size must be placeable: same decision path
    return padded
