"""The zig-zag layout of a sequence split over context shards, and moving between layouts.

Split in order over ``c`` shards, shard ``i`` holds chunk ``i`` of ``c`` equal chunks. Under a
causal mask the last shard then sees every key and the first only its own, so a causal ring waits
for the last shard. The zig-zag layout cuts the sequence into ``2c`` chunks and gives shard ``i``
chunks ``i`` and ``2c - 1 - i``: an early and a late chunk each, the same causal work on every
shard. It is a permutation of one axis; this module moves arrays into and out of it:

* ``exchange``: inside ``shard_map``, a block split in order becomes the shard's zig-zag block
  (or back). Each shard sends its first half to one shard and its second half to another: two
  ``ppermute``\\ s of half a block each, whatever ``c``.
* ``to_sequence`` / ``from_sequence``: on one device, an axis gathered from zig-zag blocks (chunk
  ``i`` and ``2c - 1 - i`` of each shard, shard after shard) put in order, and back (no exchange:
  a reshape and a reversal).
* ``pieces``: the runs of consecutive positions a shard's block is made of, with where each
  starts in the sequence (one run in order, two in zig-zag).
* ``zigzag``: the same permutation on NamedArrays, by axis name and the mapping in force (what a
  model calls once on its inputs, and once backwards on its outputs).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from .._array import NamedArray, is_named_array
from .._axis import Axis
from .._errors import AxisNotFoundError, AxisSizeError, format_axes, format_names
from .._logical._context import current_rules
from .._mesh import context_mesh
from .._partitioning._collectives import permute_blocks
from .._partitioning._shard_map import shard_map
from .._spec import entry_axes
from ._common import mesh_entries, spec_by_name

__all__ = [
    "LAYOUTS",
    "Piece",
    "context_shards",
    "exchange",
    "from_sequence",
    "lay_out",
    "pieces",
    "to_sequence",
    "zigzag",
]

#: The layouts of a split sequence besides its order: ``None`` (in order) or these.
LAYOUTS = ("zigzag",)


def _owner(chunk: int, shards: int) -> int:
    """The shard that holds ``chunk`` (of ``2 * shards``) in the zig-zag layout."""
    return chunk if chunk < shards else 2 * shards - 1 - chunk


def exchange(x: jax.Array, axis: Any, shards: int, dim: int, *, inverse: bool = False) -> jax.Array:
    """This shard's block of ``dim`` in the zig-zag layout, from its block in order (inside
    ``shard_map`` over mesh axes ``axis``, ``shards`` of them); ``inverse``: back.

    In order shard ``i`` holds chunks ``2i`` and ``2i + 1``: the even chunks go to their zig-zag
    shards by one permutation, the odd ones by another. A zig-zag shard ``j`` holds chunk ``j``
    first, so its even chunk comes first when ``j`` is even.
    """
    if shards == 1:
        return x
    even = [(i, _owner(2 * i, shards)) for i in range(shards)]
    odd = [(i, _owner(2 * i + 1, shards)) for i in range(shards)]
    first, second = jnp.split(x, 2, axis=dim)
    even_first = jax.lax.axis_index(axis) % 2 == 0
    if not inverse:
        a = permute_blocks(first, axis, even)
        b = permute_blocks(second, axis, odd)
        return jnp.where(even_first, jnp.concatenate([a, b], dim), jnp.concatenate([b, a], dim))
    evens = jnp.where(even_first, first, second)
    odds = jnp.where(even_first, second, first)
    a = permute_blocks(evens, axis, [(j, i) for i, j in even])
    b = permute_blocks(odds, axis, [(j, i) for i, j in odd])
    return jnp.concatenate([a, b], dim)


def to_sequence(x: jax.Array, shards: int, dim: int) -> jax.Array:
    """An axis gathered from zig-zag blocks (shard after shard), in order."""
    shape = x.shape
    n = shape[dim] // (2 * shards)
    y = x.reshape(shape[:dim] + (shards, 2, n) + shape[dim + 1 :])
    early = jnp.take(y, 0, axis=dim + 1)  # chunks 0 .. c-1
    late = jnp.flip(jnp.take(y, 1, axis=dim + 1), axis=dim)  # chunks c .. 2c-1
    return jnp.concatenate([early, late], axis=dim).reshape(shape)


def from_sequence(x: jax.Array, shards: int, dim: int) -> jax.Array:
    """The inverse of ``to_sequence``: an axis in order as zig-zag blocks, shard after shard."""
    shape = x.shape
    n = shape[dim] // (2 * shards)
    y = x.reshape(shape[:dim] + (2, shards, n) + shape[dim + 1 :])
    early = jnp.take(y, 0, axis=dim)
    late = jnp.flip(jnp.take(y, 1, axis=dim), axis=dim)
    return jnp.stack([early, late], axis=dim + 1).reshape(shape)


@dataclasses.dataclass(frozen=True)
class Piece:
    """A run of ``size`` consecutive positions at ``lo`` in a shard's block, ``start`` in the
    sequence (an int, or traced when the shard is)."""

    lo: int
    size: int
    start: Any


def pieces(zig: bool, block: int, shards: int, shard: Any) -> tuple[Piece, ...]:
    """The runs of shard ``shard``'s block of ``block`` positions: one in order, two in zig-zag."""
    if not zig:
        return (Piece(0, block, shard * block),)
    h = block // 2
    return Piece(0, h, shard * h), Piece(h, h, (2 * shards - 1 - shard) * h)


def context_shards(x: NamedArray, axis: str, *, beside: Sequence[Axis] = ()) -> tuple[Any, int]:
    """The mesh axes (a ``PartitionSpec`` entry) that split ``x``'s ``axis`` by the mapping in
    force (else by its sharding on an Explicit mesh), and how many shards they make.

    ``beside``: axes that the array attention splits has besides ``x``'s (the query's heads and
    head size, where ``x`` is the token ids). Under a mapping they are resolved with ``x``'s, as
    attention resolves its query: an axis ahead in the rules may take the mesh axis ``axis``'s
    rule names, and then attention does not see ``axis`` split so.
    """
    extra = tuple(a for a in beside if not x.has_axis(a.name))
    if extra and current_rules() is not None:  # the query's axes, resolved as attention does
        axes = x.axes + extra
        x = NamedArray(jax.ShapeDtypeStruct(tuple(a.size for a in axes), x.dtype), axes)
    entries = mesh_entries(x)
    entry = None if entries is None else entries[0].get(axis)
    if entry is None:
        return None, 1
    sizes = dict(context_mesh().shape)  # type: ignore[union-attr]
    return entry, math.prod(sizes[a] for a in entry_axes(entry))


def zigzag(
    tree: Any,
    axis: str = "position",
    *,
    inverse: bool = False,
    like: NamedArray | None = None,
    like_axis: str | None = None,
) -> Any:
    """Every NamedArray of ``tree`` with ``axis`` laid out zig-zag over the shards that split it.

    Where the mapping in force splits ``axis`` over ``c`` shards (context parallelism), the
    sequence is cut into ``2c`` chunks and shard ``i`` gets chunks ``i`` and ``2c - 1 - i``: under a
    causal mask every shard then does the same work. ``inverse=True`` puts the axis back in order.
    An array whose ``axis`` is not split (no mapping, or one shard) is returned as is, as is
    anything without ``axis``. It moves half of each shard's block to another shard (two
    ``ppermute`` s per array).

    A layout is only read right over the shards it was made for: attention
    (``context_layout="zigzag"``) reads it over the shards that split its *query*'s positions.
    Keys and values follow the queries, so ``key_position`` needs no rule of its own, and then
    has no split of its own: lay them out by the query's, ``zigzag((k, v), "key_position",
    like=q, like_axis="position")``.

    ``namedaxes.models.Transformer`` lays out its inputs once and its outputs back once (by the
    split its attention's queries will have), and tells attention (``context_layout="zigzag"``)
    that the positions in between are laid out so: see :func:`dot_product_attention`.

    Args:
        tree: A pytree of NamedArrays (other leaves pass through).
        axis: The sequence axis.
        inverse: Back from the zig-zag layout to the order.
        like: A NamedArray whose split of ``like_axis`` lays out every array of ``tree`` (arrays
            that go together, such as queries and their keys, or token ids and their positions
            and mask, must be permuted alike even where some of them are not split so). By
            default each array's own split of ``axis`` decides.
        like_axis: The axis of ``like`` whose split to take; default ``axis``.

    Returns:
        ``tree`` with the permuted arrays.

    Raises:
        AxisNotFoundError: if ``like`` lacks ``like_axis``.
        AxisSizeError: if a split ``axis`` does not cut into ``2c`` equal chunks.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import namedaxes as na
        >>> mesh = jax.make_mesh((2,), ("context",))
        >>> x = na.named(jnp.arange(8), "position")
        >>> with jax.set_mesh(mesh), na.axis_mapping({"position": "context"}):
        ...     z = na.nn.zigzag(x)
        ...     back = na.nn.zigzag(z, inverse=True)
        ...     k = x.rename({"position": "key_position"})  # no rule: keys follow queries
        ...     zk = na.nn.zigzag(k, "key_position", like=x, like_axis="position")
        >>> z.array, back.array
        (Array([0, 1, 6, 7, 2, 3, 4, 5], dtype=int32), Array([0, 1, 2, 3, 4, 5, 6, 7], dtype=int32))
        >>> zk.array
        Array([0, 1, 6, 7, 2, 3, 4, 5], dtype=int32)
    """
    split = None
    if like is not None:
        from_axis = axis if like_axis is None else like_axis
        if not like.has_axis(from_axis):
            raise AxisNotFoundError(
                f"zigzag: like NamedArray({format_axes(like.axes)}) has no axis {from_axis!r} "
                f"whose split would lay out {axis!r}. Available axes: "
                f"{format_names(like.axis_names)}. Name the axis to take the split from, e.g. "
                f"like_axis='position' to lay out keys by the queries' split."
            )
        split = context_shards(like, from_axis)
    return lay_out(tree, axis, split, inverse=inverse)


def lay_out(tree: Any, axis: str, split: tuple[Any, int] | None, *, inverse: bool = False) -> Any:
    """``zigzag`` over ``split`` (mesh axes and their shard count, from ``context_shards``), or
    each array's own split of ``axis`` when ``None``."""

    def one(x: Any) -> Any:
        if not isinstance(x, NamedArray) or not x.has_axis(axis):
            return x
        entry, shards = context_shards(x, axis) if split is None else split
        if shards == 1:
            return x
        size = x.axis_size(axis)
        if size % (2 * shards):
            raise AxisSizeError(
                f"zigzag: NamedArray({format_axes(x.axes)}) has {axis!r} split over "
                f"{shards} shards (mesh axes {format_names(entry_axes(entry))}), and its {size} "
                f"positions do not cut into {2 * shards} equal chunks. Pad the sequence to a "
                f"multiple of {2 * shards}."
            )
        found = mesh_entries(x)
        entries = {**(found[0] if found is not None else {}), axis: entry}
        used = set(entry_axes(entry))  # a mesh axis `entry` takes leaves the array's other axes
        entries = {
            n: e if n == axis or not used & set(entry_axes(e)) else None for n, e in entries.items()
        }
        spec = spec_by_name(x, entries)
        dim = x.axis_names.index(axis)

        def local(a: NamedArray) -> NamedArray:
            return NamedArray(exchange(a.array, entry, shards, dim, inverse=inverse), a.axes)

        return shard_map(local, in_specs=(spec,), out_specs=spec, check_vma=False)(x)

    return jax.tree.map(one, tree, is_leaf=is_named_array)
