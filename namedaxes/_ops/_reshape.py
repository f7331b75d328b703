"""One reshape for every op that splits or merges axes, with its output sharding decided by name.

On ``Explicit`` meshes shardings are part of an array's type, and JAX only infers the sharding of
a reshape in simple cases; otherwise it stops with ``ShardingTypeError: This reshape is not
supported``. ``reshape_to`` decides the output sharding itself and passes it to JAX, so
``unflatten_axis``, ``flatten_axes``, ``ravel`` and ``rearrange`` patterns work on both mesh kinds:

* an axis kept as it is (same name and size) keeps its mesh axes;
* an axis split into new axes gives its mesh axes, in order, to the outermost new axes whose sizes
  they divide (the new axis that is outermost takes the first mesh axes): the data then stays
  where it is;
* axes merged into one give it the mesh axes of the outermost merged axis; sharded inner axes
  are gathered first (only the outermost can stay split in a row-major merge);
* size-1 axes are ignored (they hold no data to move);
* in an empty array (an axis of size 0) nothing moves: kept axes keep their mesh axes and the
  new ones are replicated.

When a split cannot keep its mesh axes (``embed=8`` sharded 4 ways split into ``heads=2,
head_dim=4``), there is no placement that avoids moving data, and which new axis should carry the
sharding is the user's call: the mapping in force (``axis_mapping``) decides the new axes, and
with none in force a ``ShardingError`` names the axis and suggests a mapping. On ``Auto`` meshes
and unsharded arrays this is a plain ``jnp.reshape``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from .._array import NamedArray
from .._axis import Axis, AxisSelector, AxisSpec, axis_name, check_unique, find_axis, to_axes
from .._errors import (
    AxisError,
    AxisSizeError,
    DuplicateAxisError,
    ShardingError,
    format_axes,
    format_names,
)
from .._logical._resolve import resolve
from .._mesh import explicit_axes
from .._spec import entry_axes, entry_of
from ._common import expect_named, explicit_sharding, mapping_in_force

__all__ = ["check_new_names", "flatten_axes_as", "reorder", "reshape_to", "unflatten_axis_as"]


def reshape_to(x: NamedArray, out: Sequence[Axis], caller: str) -> NamedArray:
    """``x`` reshaped (row-major, no transpose) to the axes ``out``, sharded by name.

    ``out`` must follow from ``x.axes`` by keeping, splitting and merging consecutive axes (what
    ``flatten_axes``/``unflatten_axis`` do after moving the merged axes together).

    Raises:
        ShardingError: on an Explicit mesh, when a split axis' mesh axes cannot stay on the new
            axes and no mapping is in force to place them.
    """
    out = tuple(out)
    shape = tuple(a.size for a in out)
    info = explicit_sharding(x.array)
    if info is None:  # Auto mesh, no mesh, or nothing sharded: JAX needs no help
        return NamedArray(jnp.reshape(x.array, shape), out)
    mesh, entries = info
    if math.prod(shape) == 0:
        # No data to move: kept axes keep their mesh axes, the others are replicated. (The runs
        # below pair axes by size, which a size-0 axis cannot do.)
        kept = dict(zip(x.axes, entries))
        spec = PartitionSpec(*(kept.get(a) for a in out))
    else:
        spec = _out_spec(caller, x, entries, out, mesh)
    array = jnp.reshape(x.array, shape, out_sharding=NamedSharding(mesh, spec))
    return NamedArray(array, out)


def _runs(src: Sequence[Axis], dst: Sequence[Axis]) -> list[tuple[list[int], list[int]]]:
    """Pair ``src`` and ``dst`` positions into runs of equal total size, in order.

    A run with one position on each side and equal axes is a kept axis. Size-1 axes that are not
    kept form runs of their own with nothing on the other side.
    """
    runs: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(src) or j < len(dst):
        if i < len(src) and j < len(dst) and src[i] == dst[j]:
            runs.append(([i], [j]))
            i, j = i + 1, j + 1
        elif j < len(dst) and dst[j].size == 1:
            runs.append(([], [j]))
            j += 1
        elif i < len(src) and src[i].size == 1:
            runs.append(([i], []))
            i += 1
        else:
            ins, outs = [i], [j]
            have, want = src[i].size, dst[j].size
            while have != want:
                if have < want:
                    i += 1
                    ins.append(i)
                    have *= src[i].size
                else:
                    j += 1
                    outs.append(j)
                    want *= dst[j].size
            runs.append((ins, outs))
            i, j = i + 1, j + 1
    return runs


def _lay_out(
    mesh_axes: tuple[str, ...], sizes: Sequence[int], mesh_sizes: Mapping[str, int]
) -> list[tuple[str, ...]] | tuple[int, str]:
    """``mesh_axes`` given in order to the outermost of ``sizes`` they divide, or, when they cannot
    all be placed so (the data would have to move), ``(position, mesh axis)`` of the first that
    does not fit."""
    todo = list(mesh_axes)
    out: list[tuple[str, ...]] = []
    for pos, n in enumerate(sizes):
        mine: list[str] = []
        while todo and n > 1:
            k = mesh_sizes[todo[0]]
            if n % k:
                return pos, todo[0]
            n //= k
            mine.append(todo.pop(0))
        out.append(tuple(mine))
    return (len(sizes) - 1, todo[0]) if todo else out


def _out_spec(
    caller: str, x: NamedArray, entries: Sequence[Any], out: tuple[Axis, ...], mesh: Any
) -> PartitionSpec:
    mesh_sizes = dict(mesh.shape)
    decided: list[tuple[str, ...] | None] = [()] * len(out)
    undecided: list[tuple[list[int], list[int]]] = []
    for ins, outs in _runs(x.axes, out):
        if not outs:
            continue
        # A merge keeps the mesh axes of its outermost axis; the inner ones are gathered.
        carried = entry_axes(entries[ins[0]]) if ins else ()
        laid = _lay_out(carried, [out[k].size for k in outs], mesh_sizes)
        if isinstance(laid, tuple):
            undecided.append((ins, outs))
            for k in outs:
                decided[k] = None
        else:
            for k, axes in zip(outs, laid):
                decided[k] = axes
    if undecided:
        _place_undecided(caller, x, entries, out, mesh, decided, undecided)
    return PartitionSpec(*(entry_of(axes) for axes in decided))


def _place_undecided(
    caller: str,
    x: NamedArray,
    entries: Sequence[Any],
    out: tuple[Axis, ...],
    mesh: Any,
    decided: list[tuple[str, ...] | None],
    undecided: list[tuple[list[int], list[int]]],
) -> None:
    """Fill ``decided`` for the runs that cannot keep their mesh axes, from the mapping in force."""
    found = mapping_in_force(mesh)
    if found is None:
        raise _split_error(caller, x, entries, out, mesh, undecided[0])
    rules, context = found
    # Internal to the op (its result is still placed by the caller's mapping): an axis whose rule
    # cannot apply here is replicated instead of raising.
    spec = resolve(out, rules, context, unsatisfied="replicate")
    explicit = explicit_axes(mesh)
    used = {m for axes in decided if axes for m in axes}
    for _, outs in undecided:
        for k in outs:
            axes = tuple(m for m in entry_axes(spec[k]) if m in explicit and m not in used)
            used.update(axes)
            decided[k] = axes


def _split_error(
    caller: str,
    x: NamedArray,
    entries: Sequence[Any],
    out: tuple[Axis, ...],
    mesh: Any,
    run: tuple[list[int], list[int]],
) -> ShardingError:
    ins, outs = run
    mesh_axes = entry_axes(entries[ins[0]])
    sizes = dict(mesh.shape)
    new = [out[j] for j in outs]
    failed = _lay_out(mesh_axes, [a.size for a in new], sizes)
    pos, m = failed if isinstance(failed, tuple) else (0, mesh_axes[0])
    shown = " x ".join(f"{a}={sizes[a]}" for a in mesh_axes)
    what = (
        f"axis {x.axes[ins[0]].name!r} (size {x.axes[ins[0]].size})"
        if len(ins) == 1
        else f"axes ({format_axes([x.axes[i] for i in ins])})"
    )
    k = math.prod(sizes[a] for a in mesh_axes)
    fits = [a for a in new if a.size % k == 0]
    target = entry_of(mesh_axes)
    example = {fits[0].name: target} if fits else {new[0].name: None}
    return ShardingError(
        f"{caller}: {what} is sharded over {shown} on an Explicit mesh, and its new axes "
        f"({format_axes(new)}) cannot keep that sharding without moving data: mesh axes go, in "
        f"order, to the outermost new axes whose sizes they divide, and {m}={sizes[m]} does not "
        f"divide what is left of {new[pos].name}={new[pos].size}. Say where the new axes go: put "
        f"a mapping in force, e.g. `with na.axis_mapping({example!r}):`, and the result is "
        "placed by it."
    )


# -- the axis moves built on it (shape ops and rearrange patterns) -------------------------------


def check_new_names(
    x: NamedArray, new: Sequence[Axis], replaced: Sequence[str], caller: str
) -> None:
    """Raise if a new axis name collides with an axis of ``x`` that is not being replaced."""
    clash = [a.name for a in new if a.name not in replaced and x.has_axis(a.name)]
    if clash:
        raise DuplicateAxisError(
            f"{caller}(): new axis name(s) {format_names(clash)} already exist in "
            f"NamedArray({format_axes(x.axes)}). Pick names the array does not use, "
            "or rename() the existing axes first."
        )


def reorder(x: NamedArray, axes: Any) -> NamedArray:
    """``rearrange(x, axes)`` for an axis order (a tuple of names, ``...`` for the rest)."""
    if isinstance(axes, (str, Axis)):
        axes = (axes,)
    items = list(axes)
    n_ellipsis = sum(1 for a in items if a is Ellipsis)
    if n_ellipsis > 1:
        raise DuplicateAxisError(
            f"rearrange(): '...' appears {n_ellipsis} times in {tuple(items)!r}; use it at most once."
        )
    listed = [a for a in items if a is not Ellipsis]
    check_unique(listed)  # type: ignore[arg-type]
    positions = [find_axis(x.axes, a) for a in listed]  # type: ignore[arg-type]
    if n_ellipsis:
        rest = [i for i in range(x.ndim) if i not in positions]
        at = items.index(Ellipsis)
        perm = positions[:at] + rest + positions[at:]
    else:
        missing = [a.name for i, a in enumerate(x.axes) if i not in positions]
        if missing:
            raise AxisError(
                f"rearrange(): axes {format_names(missing)} of NamedArray({format_axes(x.axes)}) "
                f"are not in the new order ({format_names(axis_name(a) for a in listed)}). "  # type: ignore[arg-type]
                "List every axis, or add ... to keep the others in their current order."
            )
        perm = positions
    if perm == list(range(x.ndim)):
        return x
    return NamedArray(jnp.transpose(x.array, perm), [x.axes[i] for i in perm])


def flatten_axes_as(
    x: NamedArray, axes: Sequence[AxisSelector], new_axis: AxisSelector, caller: str
) -> NamedArray:
    """``flatten_axes``; ``caller`` names the call in sharding errors (a pattern, for ``rearrange``)."""
    x = expect_named(x, "flatten_axes")
    if isinstance(axes, (str, Axis)):
        axes = (axes,)
    if not axes:
        raise AxisError("flatten_axes() needs at least one axis to merge, got ().")
    check_unique(axes)
    positions = [find_axis(x.axes, a) for a in axes]
    merged = [x.axes[i] for i in positions]
    size = math.prod(a.size for a in merged)
    name = axis_name(new_axis)
    if isinstance(new_axis, Axis) and new_axis.size != size:
        raise AxisSizeError(
            f"flatten_axes(): merging ({format_axes(merged)}) gives size {size}, but new axis "
            f"{name!r} was given size {new_axis.size}. Pass the name {name!r} to take the product."
        )
    out_axis = Axis(name, size)
    check_new_names(x, [out_axis], [a.name for a in merged], "flatten_axes")
    first = min(positions)
    kept_before = [i for i in range(first) if i not in positions]
    kept_after = [i for i in range(first, x.ndim) if i not in positions]
    perm = kept_before + positions + kept_after
    out = [x.axes[i] for i in kept_before] + [out_axis] + [x.axes[i] for i in kept_after]
    if perm != list(range(x.ndim)):
        x = NamedArray(jnp.transpose(x.array, perm), tuple(x.axes[i] for i in perm))
    return reshape_to(x, out, caller)


def unflatten_axis_as(
    x: NamedArray, axis: AxisSelector, new_axes: AxisSpec, caller: str
) -> NamedArray:
    """``unflatten_axis``; ``caller`` names the call in sharding errors (a pattern, for ``rearrange``)."""
    x = expect_named(x, "unflatten_axis")
    i = find_axis(x.axes, axis)
    old = x.axes[i]
    new = to_axes(new_axes, what="unflatten_axis() new_axes")
    size = math.prod(a.size for a in new)
    if size != old.size:
        raise AxisSizeError(
            f"unflatten_axis(): axis {old.name!r} has size {old.size}, but the new axes "
            f"({format_axes(new)}) multiply to {size}. Choose sizes whose product is {old.size}."
        )
    check_new_names(x, new, [old.name], "unflatten_axis")
    return reshape_to(x, x.axes[:i] + new + x.axes[i + 1 :], caller)
