"""Splitting a pipelined stack's operands into microbatches and back.

Row ``b`` of the batch goes to microbatch ``b mod m``: the batch's mesh placement stays on its
outer part, so every microbatch is spread evenly over the mesh axes the batch is split over. The
microbatch axis has a private name (``MICRO``) while inside the pipeline, so operands may have an
axis named ``microbatch`` of their own; which leaves were split is tracked (a list of flags in
``jax.tree.leaves`` order), never read back from an axis name.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from .._array import NamedArray, is_named_array
from .._axis import Axis
from .._errors import AxisSizeError, DuplicateAxisError, format_axes
from .._mesh import context_mesh, explicit_axes
from .._ops.shape import flatten_axes, rearrange, unflatten_axis
from .._spec import entry_axes
from ._common import mesh_entries

# The microbatch axis the stack's batch is split into: a private name inside the pipeline, so
# that inputs, arguments and ys may have an axis named "microbatch" of their own.
MICRO = "_pipeline_microbatch"
# What ``Stacked.scan``'s ys without the batch axis call it when they come out.
MICROBATCH = "microbatch"


def axis_placement(v: NamedArray) -> dict[str, tuple[str, ...]]:
    """The mesh axes of each of ``v``'s axes (by name): by the mapping in force, and on an
    Explicit mesh also by ``v``'s type (an array placed before it entered the mapping keeps that
    layout until something reshards it)."""
    found = mesh_entries(v)
    out = {n: entry_axes(found[0].get(n)) if found is not None else () for n in v.axis_names}
    mesh = context_mesh()
    explicit = explicit_axes(mesh) if mesh is not None else frozenset()
    if explicit:
        spec = tuple(jax.typeof(v.array).sharding.spec) + (None,) * v.ndim
        for n, e in zip(v.axis_names, spec):
            out[n] += tuple(a for a in entry_axes(e) if a in explicit and a not in out[n])
    return out


def split_microbatches(x: Any, m: int, name: str, what: str) -> tuple[Any, list[bool]]:
    """Each NamedArray leaf with the batch axis ``name`` as ``(microbatch, ...)``; row ``b`` of the
    batch goes to microbatch ``b mod m`` (the batch's mesh placement stays on its outer part, so each
    microbatch's rows must divide into the batch's shards). Also returns which leaves (as
    ``jax.tree.leaves(..., is_leaf=is_named_array)`` lists them) were split: ``pick_microbatch``
    and ``take_microbatches`` go by that, never by an axis name."""

    def one(v: Any) -> Any:
        if not isinstance(v, NamedArray) or not v.has_axis(name):
            return v
        size = v.axis_size(name)
        if size % m:
            raise AxisSizeError(
                f"The pipeline splits {what}'s {name!r} axis (size {size}) into {m} microbatches, "
                f"which do not divide it. Pass microbatches= a divisor of {size}."
            )
        placed = axis_placement(v)[name]
        shards = math.prod(context_mesh().shape[a] for a in placed)
        if (size // m) % shards:
            raise AxisSizeError(
                f"The pipeline splits {what}'s {name!r} axis (size {size}) into {m} microbatches "
                f"of size {size // m}, but {name!r} is split over mesh axes {tuple(placed)!r} "
                f"({shards} shards), so each microbatch needs a multiple of {shards} rows. Pass "
                f"microbatches={max(size // shards, 1)} (the most that keep every shard busy) or "
                f"a divisor of it, or a larger batch."
            )
        v = unflatten_axis(v, name, (Axis(name, size // m), Axis(MICRO, m)))
        return rearrange(v, (MICRO, *(a for a in v.axis_names if a != MICRO)))

    split = [
        isinstance(v, NamedArray) and v.has_axis(name)
        for v in jax.tree.leaves(x, is_leaf=is_named_array)
    ]
    return jax.tree.map(one, x, is_leaf=is_named_array), split


def merge_microbatches(x: Any, batch_axis: str) -> Any:
    """The inverse of ``split_microbatches`` on the outputs; a ``ys`` leaf without the batch axis
    keeps the microbatch axis, named ``microbatch``."""

    def one(v: Any) -> Any:
        if not isinstance(v, NamedArray) or not v.has_axis(MICRO):
            return v
        names = [a for a in v.axis_names if a != MICRO]
        if batch_axis not in names:
            if MICROBATCH in names:
                stacked = format_axes(a for a in v.axes if a.name != MICRO)
                raise DuplicateAxisError(
                    f"Stacked.scan pipelined gives each y without the {batch_axis!r} axis a "
                    f"{MICROBATCH!r} axis (one entry per microbatch), but the layers returned a "
                    f"y that already has one (stacked: NamedArray({stacked})). Rename that axis "
                    f"of the y, or give the y the {batch_axis!r} axis."
                )
            return v.rename({MICRO: MICROBATCH})
        i = names.index(batch_axis)
        v = rearrange(v, (*names[: i + 1], MICRO, *names[i + 1 :]))
        return flatten_axes(v, (batch_axis, MICRO), batch_axis)

    return jax.tree.map(one, x, is_leaf=is_named_array)


def pick_microbatch(x: Any, j: Any, split: list[bool]) -> Any:
    """Microbatch ``j`` (traced) of every split leaf (``split``, from ``split_microbatches``);
    other leaves as they are."""
    leaves, treedef = jax.tree.flatten(x, is_leaf=is_named_array)
    out = [
        NamedArray(jax.lax.dynamic_index_in_dim(v.array, j, 0, keepdims=False), v.axes[1:])
        if s
        else v
        for v, s in zip(leaves, split, strict=True)
    ]
    return jax.tree.unflatten(treedef, out)


def take_microbatches(x: Any, index: list[int]) -> Any:
    """The arrays of ``x``'s leaves (all split into microbatches: the stack's input) at the
    (static) microbatch ``index`` list (a leading tick dimension; a scan input)."""
    idx = jnp.asarray(index, jnp.int32)
    return [jnp.take(v.array, idx, axis=0) for v in jax.tree.leaves(x, is_leaf=is_named_array)]
