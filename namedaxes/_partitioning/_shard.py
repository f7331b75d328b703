"""Placing pytrees by name: ``shard`` and ``auto_sharded``, inside and outside ``jax.jit``.

Outside jit, leaves are moved with one batched ``jax.device_put`` (skipped for leaves already placed
as asked). While tracing, ``jax.sharding.reshard`` handles the mesh's ``Explicit`` axes and
``with_sharding_constraint`` its ``Auto`` axes; a mesh that mixes both gets both (within one
dimension the explicit mesh axes are then the major ones).
"""

from __future__ import annotations

import functools
from typing import Any, TypeVar

import jax
import numpy as np
from jax.sharding import AbstractMesh, AxisType, NamedSharding, PartitionSpec

from .._caches import register
from .._errors import ShardingError
from .._logical._context import current_rules, rules_in_force
from .._logical._rules import AxisRules, RulesLike
from .._mesh import AnyMesh, context_mesh, require_mesh
from .._spec import entry_axes, entry_of
from ._plan import check_matched, plan_tree

__all__ = ["auto_sharded", "constrain", "place_leaves", "shard"]

T = TypeVar("T")
_Tracer = jax.core.Tracer


# -- inside jit ---------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def _split(spec: PartitionSpec, mesh: AnyMesh) -> tuple[NamedSharding | None, NamedSharding | None]:
    """``(reshard target for Explicit axes, constraint for Auto axes)``; ``None`` when unneeded."""
    types = dict(zip(mesh.axis_names, mesh.axis_types))
    has_explicit = any(t == AxisType.Explicit for t in types.values())
    has_auto = any(t == AxisType.Auto for t in types.values())
    explicit, auto = [], []
    for entry in spec:
        names = entry_axes(entry)
        e = tuple(n for n in names if types.get(n) == AxisType.Explicit)
        a = tuple(n for n in names if types.get(n) == AxisType.Auto)
        explicit.append(entry_of(e))
        auto.append(entry_of(a))
    return (
        NamedSharding(mesh, PartitionSpec(*explicit)) if has_explicit else None,
        NamedSharding(mesh, PartitionSpec(*auto)) if has_auto else None,
    )


register(_split.cache_clear)


def constrain(x: Any, spec: PartitionSpec, mesh: AnyMesh) -> Any:
    """Shard a traced array as ``spec`` says: ``reshard`` for Explicit axes, a constraint for Auto.

    The Auto constraint on an ``AbstractMesh`` (all that ``jax.grad``, ``jax.jvp`` or a traced
    body know of the mesh) is applied inside ``jax.jit`` when the value underneath is concrete:
    JAX evaluates a constraint on a concrete value at once, and then takes the abstract mesh only
    from an input already on a ``NamedSharding``; inside ``jax.jit`` it needs no devices."""
    explicit, auto = _split(spec, mesh)
    if explicit is not None:
        x = jax.sharding.reshard(x, explicit)
    if auto is not None:
        if isinstance(mesh, AbstractMesh) and _concrete_underneath(x):
            x = _constraint_in_jit(x, auto)
        else:
            x = jax.lax.with_sharding_constraint(x, auto)
    return x


def _concrete_underneath(x: Any) -> bool:
    """Whether ``x`` holds a concrete value: an array, or a ``jax.grad``/``jax.jvp`` tracer
    outside ``jax.jit`` (whose primal is one)."""
    return not isinstance(x, _Tracer) or x.to_concrete_value() is not None


@functools.partial(jax.jit, static_argnums=1)
def _constraint_in_jit(x: Any, sharding: NamedSharding) -> Any:
    return jax.lax.with_sharding_constraint(x, sharding)


# -- placement ----------------------------------------------------------------------------------


def _already_placed(leaf: jax.Array, target: NamedSharding) -> bool:
    current = leaf.sharding
    if current == target:
        return True
    # Same mesh, equivalent layout (e.g. P('data') vs P('data', None)): no need to move. A merely
    # equivalent placement on another mesh (or a single-device one) is moved, so the result is
    # typed with the requested mesh.
    return (
        isinstance(current, NamedSharding)
        and current.mesh == target.mesh
        and current.is_equivalent_to(target, leaf.ndim)
    )


def place_leaves(leaves: list[Any], targets: list[NamedSharding | None]) -> tuple[list[Any], bool]:
    """Place each leaf that has a target; returns ``(new_leaves, whether anything changed)``."""
    new = list(leaves)
    changed = False
    put_idx: list[int] = []
    for i, (leaf, target) in enumerate(zip(leaves, targets)):
        if target is None:
            continue
        if isinstance(leaf, _Tracer) or (
            # a concrete leaf with an abstract target: only reached inside a trace (see
            # place_planned), where a constraint places it
            isinstance(target.mesh, AbstractMesh) and _is_concrete(leaf)
        ):
            new[i] = constrain(leaf, target.spec, target.mesh)
            changed = True
        elif isinstance(leaf, jax.Array):
            if not _already_placed(leaf, target):
                put_idx.append(i)
        elif isinstance(leaf, (np.ndarray, np.generic)):
            put_idx.append(i)
        elif isinstance(leaf, jax.ShapeDtypeStruct):
            new[i] = jax.ShapeDtypeStruct(
                leaf.shape, leaf.dtype, sharding=target, weak_type=leaf.weak_type
            )
            changed = True
    if put_idx:
        placed = jax.device_put([leaves[i] for i in put_idx], [targets[i] for i in put_idx])
        for i, arr in zip(put_idx, placed):
            new[i] = arr
        changed = True
    return new, changed


def _shard_with(x: T, rules: AxisRules, mesh: Any, caller: str, strict: bool = False) -> T:
    planned = plan_tree(x, rules, mesh, caller=caller)
    if strict and planned.unmatched:  # the plan knows, per structure; the check words the error
        check_matched(rules, planned.names, caller)
    if not planned.any_named:
        return x  # nothing to place (the plan has checked the mapping against a known mesh)
    mesh = require_mesh(planned.mesh, caller=caller)  # a Mesh or AbstractMesh, not sizes alone
    new, changed = place_planned(
        planned.leaves,
        planned.targets,
        mesh,
        caller=caller,
        plan_instead="pspec_for(tree, mapping, mesh=abstract_mesh)",
    )
    return jax.tree_util.tree_unflatten(planned.treedef, new) if changed else x


def place_planned(
    leaves: list[Any], targets: list[Any], mesh: Any, *, caller: str, plan_instead: str
) -> tuple[list[Any], bool]:
    """``place_leaves``, and the one rule for targets on an ``AbstractMesh``: fine for traced
    leaves; for concrete ones inside a traced function (constants an eager ``scan`` body closes
    over, under a concrete mesh) a constraint; outside any trace an error, as there are no devices
    to put data on (``plan_instead`` says how to plan without them). ``mesh`` is the one mesh
    of the targets (one check per call, not one per leaf: ``shard`` is on the hot path).

    Raises:
        ShardingError: for an ``AbstractMesh`` target of a concrete leaf outside any trace.
    """
    if isinstance(mesh, AbstractMesh) and _any_concrete(leaves, targets) and not _inside_a_trace():
        raise ShardingError(
            f"{caller} was given an AbstractMesh outside jit, but placing arrays needs devices. "
            "Pass the concrete jax.sharding.Mesh (or call it inside jax.jit, where the abstract "
            f"mesh is enough); to plan without devices use {plan_instead}."
        )
    return place_leaves(leaves, targets)


def _inside_a_trace() -> bool:
    """Whether a function is being traced: ``jax.sharding.get_mesh`` refuses there (only the
    abstract mesh exists), also around concrete arrays a traced function closes over."""
    try:
        jax.sharding.get_mesh()
    except ValueError:
        return True
    return False


def _any_concrete(leaves: list[Any], targets: list[Any]) -> bool:
    """Whether a leaf with a target holds data (an array, not a tracer or a ``ShapeDtypeStruct``):
    judged leaf by leaf, so one abstract leaf in a tree does not let its concrete ones through."""
    return any(t is not None and _is_concrete(leaf) for leaf, t in zip(leaves, targets))


def _is_concrete(leaf: Any) -> bool:
    return isinstance(leaf, (jax.Array, np.ndarray, np.generic)) and not isinstance(leaf, _Tracer)


def shard(
    x: T, mapping: RulesLike | None = None, mesh: AnyMesh | None = None, *, strict: bool = False
) -> T:
    """Place every NamedArray of a pytree on the mesh as ``resolve`` says; works inside and outside jit.

    Outside ``jax.jit`` leaves move with ``jax.device_put`` (nothing is copied for leaves already
    placed so; if nothing moves, ``x`` itself is returned). While tracing, the mesh's ``Explicit``
    axes are applied with ``jax.sharding.reshard`` and its ``Auto`` axes with
    ``jax.lax.with_sharding_constraint``. Plain-array fields of ``eqx.Module``s declared with
    ``field(axis_names=...)`` are placed by name too; other plain arrays and non-array leaves are
    returned as they are.

    Args:
        x: Any pytree.
        mapping: ``{logical_name: mesh_axes}`` or ``AxisRules``; defaults to the ``axis_mapping`` in
            force.
        mesh: The mesh; defaults to the one set with ``jax.set_mesh`` (the abstract mesh inside
            jit).
        strict: Raise ``UnmatchedMappingError`` for a mapping entry that names no axis of ``x``
            (a typo, or ``{"heads": ...}`` for weights whose axes are ``kv_heads``, ``q_per_kv``).

    Returns:
        ``x`` with its named arrays placed.

    Raises:
        ShardingError: with no mapping given or in force, with no mesh (when there is something to
            place), or when ``resolve`` fails (unknown mesh axis, indivisible size, ...).
        UnmatchedMappingError: with ``strict=True``, naming the entries and the axes ``x`` has.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from namedaxes import named
        >>> mesh = jax.make_mesh((len(jax.devices()),), ("data",))
        >>> x = shard(named(jnp.zeros((len(jax.devices()) * 2, 3)), ("batch", "embed")),
        ...           {"batch": "data"}, mesh)
        >>> x.array.sharding.spec
        P('data', None)
    """
    return _shard_with(x, rules_in_force(mapping, "shard"), mesh, "shard", strict)


def auto_sharded(x: T, mesh: AnyMesh | None = None) -> T:
    """``shard`` with the mapping in force; a silent no-op with no mapping or no mesh.

    For library code that may run with or without a mapping or mesh.

    Example:
        >>> import jax.numpy as jnp
        >>> from namedaxes import named
        >>> x = named(jnp.zeros((4,)), ("batch",))
        >>> auto_sharded(x) is x  # no mapping in force: nothing to do
        True
    """
    rules = current_rules()
    if rules is None:
        return x
    if mesh is None:
        mesh = context_mesh()
        if mesh is None:
            return x
    return _shard_with(x, rules, mesh, "auto_sharded")
