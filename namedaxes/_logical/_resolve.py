"""``resolve``: the one place that decides which mesh axes each logical axis of an array gets.

Pure and deterministic: it needs only axis names and sizes, the rules and the mesh's axis sizes, so
it also plans for meshes that do not exist (``{"data": 64, "model": 4}``). Results are cached on the
normalized inputs.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

from jax.sharding import PartitionSpec

from .._axis import Axis, check_unique
from .._caches import register
from .._errors import (
    NamedTypeError,
    ShardingError,
    UnsatisfiedAxisError,
    format_axes,
    format_mesh,
    format_names,
)
from .._mesh import MeshLike, MeshShape, mesh_shape
from .._spec import entry_of
from ._rules import _POLICIES, AxisRules, RulesLike, UnsatisfiedPolicy, as_rules

__all__ = ["check_rules_mesh_axes", "resolve"]


def resolve(
    axes: Sequence[Axis],
    rules: RulesLike,
    mesh: MeshLike,
    *,
    unsatisfied: UnsatisfiedPolicy | None = None,
) -> PartitionSpec:
    """The ``PartitionSpec`` of an array with ``axes`` under ``rules`` on ``mesh``.

    Rules are processed in order, and rule order alone decides priority (as in flax's logical
    axis rules): a rule ``(name, mesh_axes)`` gives its mesh axes to this array's axis ``name`` if
    that axis has no placement yet, none of the mesh axes is used by this array, and their combined
    size divides the axis size. Later rules for a name are its fallbacks; a ``None`` rule fixes the
    axis as replicated (no later fallback applies). Axes without rules are replicated. When rules
    exist for a name but none applied, the policy decides: ``unsatisfied`` if given, else the
    rules' own policy (``AxisRules(..., unsatisfied=...)``), else ``"error"``. The result never
    depends on the order of ``axes``: permuting the axes permutes the spec. Entries are a mesh-axis
    name for one axis, a tuple for several, ``None`` for unsharded dimensions (one per axis).

    Args:
        axes: The array's axes (``Axis`` objects, with sizes).
        rules: ``AxisRules``, a ``{logical_name: mesh_axes}`` mapping, or a list of
            ``(logical_name, mesh_axes)`` pairs (``None``: no rules).
        mesh: A ``Mesh``, ``AbstractMesh`` or ``{mesh_axis: size}`` mapping.
        unsatisfied: ``"error"`` or ``"replicate"``; overrides the rules' policy.

    Returns:
        A ``jax.sharding.PartitionSpec`` with ``len(axes)`` entries.

    Raises:
        ShardingError: if the rules name a mesh axis the mesh lacks (the message lists the mesh's
            axes), or, under the ``"error"`` policy, when no rule applies to an axis (the message
            names the axis, its size, each candidate's mesh axes and sizes and why it was skipped).
        DuplicateAxisError: if two axes share a name.
        MeshError: if the mesh has no devices (``MeshTypeError`` if it is not a mesh at all).

    Example:
        >>> from namedaxes import Axis, AxisRules
        >>> resolve((Axis("batch", 8), Axis("embed", 6)), {"batch": "data", "embed": "model"},
        ...         {"data": 2, "model": 3})
        P('data', 'model')
        >>> rules = AxisRules([("embed", "model"), ("embed", "data")])
        >>> resolve((Axis("embed", 6),), rules, {"data": 2, "model": 4})
        P('data',)
    """
    if hasattr(axes, "axes") and hasattr(axes, "array"):  # a NamedArray: its axes were meant
        raise NamedTypeError(
            f"resolve takes a tuple of Axis objects, got the NamedArray {axes!r}. Pass its axes: "
            "resolve(x.axes, rules, mesh)."
        )
    rules_n = as_rules(rules)
    if unsatisfied is not None and unsatisfied not in _POLICIES:
        raise ShardingError(
            f"unsatisfied must be one of {format_names(_POLICIES)}, got {unsatisfied!r}."
        )
    policy = unsatisfied or rules_n.unsatisfied
    if isinstance(axes, (str, Axis)):  # one axis, not a sequence of them
        raise NamedTypeError(
            f"resolve needs a sequence of Axis objects, got {axes!r} ({type(axes).__name__}). "
            "Pass x.axes of a NamedArray, or a tuple such as (Axis('batch', 8),)."
        )
    axes_t = axes if isinstance(axes, tuple) else tuple(axes)
    try:
        return _resolve_cached(axes_t, rules_n, mesh_shape(mesh), policy)
    except TypeError:
        # Unhashable axes (not Axis objects): check them to raise a helpful error.
        for a in axes_t:
            if not isinstance(a, Axis):
                raise NamedTypeError(
                    f"resolve needs Axis objects (with sizes), got {a!r} ({type(a).__name__}) in "
                    f"{axes_t!r}. Pass x.axes of a NamedArray, or Axis('batch', 8)."
                ) from None
        raise


@functools.lru_cache(maxsize=8192)
def _resolve_cached(
    axes: tuple[Axis, ...], rules: AxisRules, mesh: MeshShape, policy: str
) -> PartitionSpec:
    for a in axes:
        if not isinstance(a, Axis):
            raise NamedTypeError(
                f"resolve needs Axis objects (with sizes), got {a!r} ({type(a).__name__}) in "
                f"{axes!r}. Pass x.axes of a NamedArray, or Axis('batch', 8)."
            )
    check_unique(axes)
    sizes = dict(mesh)
    _check_mesh_axes(rules, sizes, mesh)
    size_of = {a.name: a.size for a in axes}
    placed: dict[str, tuple[str, ...] | None] = {}  # logical name -> its mesh axes (None: fixed)
    used: dict[str, str] = {}  # mesh axis -> the logical axis of this array that took it
    # Rules in order, never the array's axes in order: the spec must not depend on axis order.
    for name, target in rules.ordered_pairs:
        if name not in size_of or name in placed:
            continue
        if target is None:
            placed[name] = None  # an explicit None rule: replicated, no later fallback applies
            continue
        if any(m in used for m in target):
            continue
        if size_of[name] % math.prod(sizes[m] for m in target) != 0:
            continue
        placed[name] = target
        for m in target:
            used[m] = name
    if policy == "error":
        # The first unsatisfied axis in rule order: which axis the error names must not depend
        # on the array's axis order either.
        for name in rules.names:
            if name in size_of and name not in placed:
                axis = Axis(name, size_of[name])
                raise _unsatisfied(axes, axis, rules, sizes, used)
    return PartitionSpec(*(entry_of(placed.get(a.name)) for a in axes))


def check_rules_mesh_axes(rules: RulesLike | None, mesh: MeshLike) -> None:
    """Raise if ``rules`` name a mesh axis that ``mesh`` lacks, whatever arrays they meet.

    ``resolve`` checks this for every array it sees; planners that may see no named array at all
    (a tree of plain leaves) call this so a typo in a mapping is never silently ignored.

    Raises:
        ShardingError: naming the missing mesh axes, the logical axes using them and the mesh's axes.

    Example:
        >>> check_rules_mesh_axes({"batch": "data"}, {"data": 2})
    """
    _check_mesh_axes_cached(as_rules(rules), mesh_shape(mesh))


@functools.lru_cache(maxsize=1024)
def _check_mesh_axes_cached(rules: AxisRules, shape: MeshShape) -> None:
    _check_mesh_axes(rules, dict(shape), shape)


def _check_mesh_axes(rules: AxisRules, sizes: dict[str, int], mesh: MeshShape) -> None:
    missing = [m for m in rules.mesh_axes if m not in sizes]
    if missing:
        users = [
            n for n in rules.names if any(set(t or ()) & set(missing) for t in rules.candidates(n))
        ]
        raise ShardingError(
            f"The axis mapping names mesh axis {format_names(missing)} (used by logical axis "
            f"{format_names(dict.fromkeys(users))}), but {format_mesh(mesh)} has axes "
            f"{format_names(sizes)}. Fix the mapping's mesh-axis name, or add the axis to the mesh "
            "(a size-1 axis is fine)."
        )


def _unsatisfied(
    axes: tuple[Axis, ...],
    axis: Axis,
    rules: AxisRules,
    sizes: dict[str, int],
    used: dict[str, str],
) -> UnsatisfiedAxisError:
    reasons = []
    for target in rules.candidates(axis.name):
        if target is None:  # unreachable: a None candidate always applies
            continue
        size = math.prod(sizes[m] for m in target)
        shown = " x ".join(f"{m}={sizes[m]}" for m in target)
        taken = [m for m in target if m in used]
        if taken:
            why = ", ".join(f"{m!r} already used by axis {used[m]!r}" for m in taken)
        else:
            why = f"{size} does not divide {axis.size}"
        reasons.append(f"({shown}): {why}")
    diagnosis = (
        f"Cannot shard axis {axis.name!r} (size {axis.size}) of an array with axes "
        f"({format_axes(axes)}) on {format_mesh(sizes)}: no rule applies. Candidates: "
        + "; ".join(reasons)
    )
    return UnsatisfiedAxisError(
        f"{diagnosis}. Pad the axis with round_axis_for_partitioning, add a fallback rule (e.g. "
        f"({axis.name!r}, None) to replicate), or use unsatisfied='replicate'.",
        axis=axis.name,
        diagnosis=diagnosis,
        candidates=tuple(c for c in rules.candidates(axis.name) if c is not None),
    )


register(_resolve_cached.cache_clear)
register(_check_mesh_axes_cached.cache_clear)
