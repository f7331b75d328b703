"""Where ``named_jit`` and ``fsdp`` put the named outputs of the traced function.

``named_jit`` places every named output by its output mapping. ``fsdp`` has two mappings, and the
rule for its outputs is structural, so users can predict it: an output subtree with the **tree
structure of the first argument** (the parameters: the updated model, its gradients, optax's
``mu``/``nu``; or of one element of the first argument when that is a tuple or list such as
``(model, optimizer_state)``) is placed by the parameter mapping; every other named output
(logits, per-token losses, metrics) by the compute mapping. The structure includes each
NamedArray's axis names and sizes (not their order), and only structures holding a NamedArray or
a ``field(axis_names=...)`` array count.

With ``strict=True`` both also check, once per trace, that every entry of their mappings matches an
axis (``check_strict``).
"""

from __future__ import annotations

from typing import Any

import jax

from .._array import NamedArray, is_named_array
from .._errors import ShardingError, format_names
from .._logical._rules import AxisRules
from .._mesh import AnyMesh
from ._plan import check_matched, plan_tree, tree_axis_names
from ._shard import constrain
from ._tree import walk

__all__ = [
    "check_strict",
    "constrain_outputs",
    "parameter_structures",
    "refuse_unplaceable_outputs",
]


def parameter_structures(first: Any) -> frozenset[Any]:
    """The structures of ``first`` (fsdp's first argument) that mark parameter outputs."""
    parts = [first] + (list(first) if isinstance(first, (tuple, list)) else [])
    found = set()
    for part in parts:
        leaves, treedef = jax.tree_util.tree_flatten(part)
        if walk(part, treedef).any_named:  # NamedArrays or field(axis_names=...) arrays
            found.add(_structure(part))
    return frozenset(found)


def _structure(node: Any) -> Any:
    """``node``'s tree structure with each NamedArray's axes as a set: a parameter returned with
    its axes in another order is still a parameter (names, not positions)."""
    units, treedef = jax.tree_util.tree_flatten(node, is_leaf=is_named_array)
    axes = tuple(frozenset(u.axes) if isinstance(u, NamedArray) else None for u in units)
    return treedef, axes


def _parameter_mask(out: Any, structures: frozenset[Any], n_leaves: int) -> list[bool]:
    """Per leaf of ``out`` (in flattening order): whether it lies in a parameter-shaped subtree."""
    if not structures:
        return [False] * n_leaves

    def is_parameters(node: Any) -> bool:
        try:
            return _structure(node) in structures
        except TypeError:  # unhashable static data: not a parameter structure
            return False

    mask: list[bool] = []
    for unit in jax.tree_util.tree_leaves(out, is_leaf=is_parameters):
        hit = is_parameters(unit)
        mask += [hit] * len(jax.tree_util.tree_leaves(unit))
    return mask


def constrain_outputs(
    out: Any,
    out_def: Any,
    out_leaves: list[Any],
    rules: AxisRules,
    mesh: AnyMesh,
    *,
    compute_rules: AxisRules | None = None,
    parameters: frozenset[Any] = frozenset(),
) -> tuple[list[Any], dict[int, Any]]:
    """Place the named output leaves (inside the trace); also their specs by position.

    With ``compute_rules`` (fsdp), leaves in subtrees whose structure is in ``parameters`` are
    placed by ``rules``, the others by ``compute_rules``.
    """
    caller = "named_jit" if compute_rules is None else "fsdp"
    planned = plan_tree(out, rules, mesh, caller=caller, flat=(out_leaves, out_def))
    if not planned.any_named:
        return out_leaves, {}
    mask = [True] * len(out_leaves)
    if compute_rules is not None:
        mask = _parameter_mask(out, parameters, len(out_leaves))
    if all(mask):
        targets = planned.targets
    else:  # each leaf resolved only by the mapping it is placed by
        computed = plan_tree(out, compute_rules, mesh, caller=caller, flat=(out_leaves, out_def))
        targets = [(planned if keep else computed).target(i) for i, keep in enumerate(mask)]
    new = list(out_leaves)
    specs = {}
    for i, (leaf, target) in enumerate(zip(out_leaves, targets)):
        if target is not None and isinstance(leaf, (jax.Array, jax.core.Tracer)):
            new[i] = constrain(leaf, target.spec, target.mesh)
            specs[i] = target.spec
    return new, specs


def refuse_unplaceable_outputs(out: Any, rules: AxisRules) -> None:
    """Raise when ``rules`` would shard a named output but there is no mesh to place it on."""
    named = [x for x in jax.tree_util.tree_leaves(out, is_leaf=is_named_array) if is_named_array(x)]
    sharded = sorted({a.name for x in named for a in x.axes if any(rules.candidates(a.name))})
    if sharded:
        raise ShardingError(
            f"named_jit was given axis resources that shard the output axes {format_names(sharded)}, "
            "but it needs a device mesh to place them and none is set or found on the arguments. "
            "Call it inside `with jax.set_mesh(mesh):`, or pass arguments already placed on a mesh."
        )


def check_strict(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    out: Any,
    mappings: tuple[AxisRules | None, ...],
    parameter_rules: AxisRules | None = None,
    parameters: Any = None,
) -> None:
    """``strict=True``: every entry of each of ``mappings`` must name an axis of the arguments or
    outputs; with ``parameter_rules`` (fsdp), every entry of those an axis of ``parameters``.

    Raises:
        UnmatchedMappingError: naming the entries and the axes there are.
    """
    caller = "fsdp" if parameter_rules is not None else "named_jit"
    if parameter_rules is not None:
        params = tree_axis_names(parameters)
        check_matched(parameter_rules, params, caller, "the parameters (the first argument)")
    names = tree_axis_names((args, kwargs)) | tree_axis_names(out)
    for rules in dict.fromkeys(m for m in mappings if m is not None):
        check_matched(rules, names, caller, "the arguments and outputs")
