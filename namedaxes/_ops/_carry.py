"""The carry of ``scan`` and ``fold``: matched to ``init`` by name, and placed on Explicit meshes.

``lax.scan`` needs the carry's type to be the same before and after each step. By name, a carry
returned with its axes in another order is the same carry, so it is transposed back; on Explicit
meshes a sharding is part of the type, so ``init`` is placed where the step puts the carry.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from .._array import NamedArray, is_named_array
from .._errors import NamedTypeError, ShardingError, format_axes, format_path
from .._mesh import explicit_axes
from ._align import align_to
from ._common import explicit_sharding

__all__ = ["CarryMoved", "check_carry_placement", "explicit_in_play", "match_carry", "place_carry"]


def _leaf_kind(leaf: Any) -> str:
    return (
        f"NamedArray({format_axes(leaf.axes)})" if isinstance(leaf, NamedArray) else "a plain leaf"
    )


def match_carry(init: Any, carry: Any, caller: str, name: str) -> Any:
    """``carry`` (what ``fn`` returned) in ``init``'s layout, or a clear error when it differs.

    A NamedArray leaf with ``init``'s axes in another order (as ``dot`` may return them) is
    transposed back: by name it is the same carry. A leaf whose dtype differs (other than JAX's
    promotion of a weakly typed ``init``) is refused here, naming the leaf, before ``lax.scan``
    refuses it in its own terms.

    Raises:
        NamedTypeError: if the structure, an axis name or size, or a dtype differs from ``init``.
    """
    fix = "Rearrange, rename or cast the carry inside fn to match."
    paths_in, tree_in = jax.tree_util.tree_flatten_with_path(init, is_leaf=is_named_array)
    leaves_out, tree_out = jax.tree_util.tree_flatten(carry, is_leaf=is_named_array)
    if tree_in != tree_out:
        raise NamedTypeError(
            f"{caller}() over axis {name!r}: fn must return a carry with the same structure and axes "
            f"as init. init has structure {tree_in}, fn returned {tree_out}. {fix}"
        )
    matched = []
    for (path, a), b in zip(paths_in, leaves_out):
        named_a, named_b = isinstance(a, NamedArray), isinstance(b, NamedArray)
        if named_a and named_b and a.axes != b.axes and set(a.axes) == set(b.axes):
            b = NamedArray(align_to(b, a.axes), a.axes)  # same axes, another order
        elif named_a != named_b or (named_a and a.axes != b.axes):
            raise NamedTypeError(
                f"{caller}() over axis {name!r}: fn must return a carry with the same structure and "
                f"axes as init. At {format_path(path)}: init is {_leaf_kind(a)}, fn returned "
                f"{_leaf_kind(b)}. {fix}"
            )
        in_type = jax.typeof(a.array if named_a else a)
        out_dtype = getattr(b, "dtype", None)
        if out_dtype is not None and not in_type.weak_type and out_dtype != in_type.dtype:
            raise NamedTypeError(
                f"{caller}() over axis {name!r}: the carry's dtype must stay the same. At "
                f"{format_path(path)}: init is {in_type.dtype}, fn returned {out_dtype}. Cast it "
                f"inside fn, e.g. .astype({str(in_type.dtype)!r}), or start from an init of that dtype."
            )
        matched.append(b)
    return jax.tree_util.tree_unflatten(tree_in, matched)


def _explicit_spec(leaf: Any) -> tuple[Any, ...]:
    """The Explicit spec entries of an array leaf (a tracer's type), one per dimension."""
    try:
        sharding = jax.typeof(leaf).sharding
    except (TypeError, AttributeError):  # not an array: nothing placed
        return ()
    spec = tuple(getattr(sharding, "spec", ()) or ())
    return spec + (None,) * (len(np.shape(leaf)) - len(spec))


def explicit_in_play(tree: Any) -> bool:
    """Whether the mesh in context, or any array in ``tree``, has Explicit mesh axes."""
    if explicit_axes(jax.sharding.get_abstract_mesh()):
        return True
    leaves = jax.tree_util.tree_leaves(tree)
    return any(isinstance(a, jax.Array) and explicit_sharding(a) is not None for a in leaves)


class CarryMoved(Exception):
    """Raised while tracing a first attempt whose step returns the carry placed elsewhere: it
    carries the shardings the step gives each leaf, to place ``init`` there and trace again."""

    def __init__(self, shardings: list[Any]):
        super().__init__("the step moves the carry")
        self.shardings = shardings


def place_carry(init: Any, shardings: list[Any]) -> Any:
    """``init`` with each leaf that a step moved resharded to where the step put it
    (``CarryMoved``: a sharding per leaf, ``None`` for leaves left where they were).

    On Explicit meshes a sharding is part of the carry's type, and ``lax.scan`` needs one type
    across steps; a body that places the carry elsewhere (a replicated ``zeros`` plus a sharded
    slice of ``xs``) would otherwise fail on Explicit meshes and work on Auto ones.
    """
    leaves, treedef = jax.tree_util.tree_flatten(init)
    placed = [
        leaf if want is None else jax.sharding.reshard(leaf, want)
        for leaf, want in zip(leaves, shardings)
    ]
    return treedef.unflatten(placed)


def check_carry_placement(
    carry: Any, new_carry: Any, caller: str, name: str, *, first: bool
) -> None:
    """On a ``first`` attempt, raise ``CarryMoved`` if a step returns the carry placed other than
    it came in (so the scan is traced again from a placed ``init``: one trace when nothing moves,
    also for nested scans); after that, a ``ShardingError``: the body has no sharding to settle on.
    """
    before = [_explicit_spec(a) for a in jax.tree_util.tree_leaves(carry)]
    returned = jax.tree_util.tree_leaves(new_carry)
    after = [_explicit_spec(b) for b in returned]
    if before == after:
        return
    if first:
        moved = [x != y for x, y in zip(before, after)]
        raise CarryMoved([jax.typeof(b).sharding if m else None for m, b in zip(moved, returned)])
    paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(carry, is_leaf=is_named_array)[0]]
    for path, was, now in zip(paths, before, after):
        if was == now:
            continue
        raise ShardingError(
            f"{caller}() over axis {name!r}: fn keeps moving the carry between mesh axes, so "
            f"it has no one sharding that every step keeps. {format_path(('carry', *path))}: "
            f"a step takes it as {P(*was)} and returns it as {P(*now)}. Place it once: reshard "
            f"the carry at the end of fn to the sharding it should keep, e.g. "
            f"jax.sharding.reshard(c, {P(*was)}), and start from an init placed so "
            "(na.shard(init))."
        )
