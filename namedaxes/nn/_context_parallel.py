"""Context parallelism: attention whose query positions are split over mesh axes.

``dot_product_attention`` runs its kernel once per shard (``shard_map``). When the mapping splits
the query's ``position`` axis over mesh axes (``{"position": "context"}``), each shard keeps its
block of queries, and the keys and values enter split the same way along ``key_position``: the key
positions follow the query positions, so no rule for ``key_position`` is needed. (When the shard
count does not divide the key length, the keys enter whole.) The shards then exchange keys and
values by one of three strategies, here on plain arrays in the kernels' layout
(``_attention_kernels``) with mesh axes by name:

* ``all_gather``: every shard gathers all key and value blocks and makes one kernel call, its
  queries at their global positions (``query_offset + shard * block``). Any kernel that takes a
  query offset known only at run time runs it (XLA; cuDNN and splash only without ``causal``).
* ``ring`` (``_ring``): the blocks travel around the shards one at a time, merged by their
  log-sum-exp; a causal ring skips the blocks no query of a shard sees. XLA attention per block,
  or the Pallas flash-attention kernel with ``implementation="pallas"``.
* ``ulysses``: one all-to-all turns position-split queries, keys and values into head-split ones
  over the whole sequence, the kernel runs unmodified on them (cuDNN and splash too, causal
  included: the queries start at the first key), and one all-to-all turns the output back. The
  query heads must split into the shards; key/value heads that do not are repeated until they
  do (each shard gets those of its query heads).

Layout (``_context_layout``): a causal ring with the sequence in order is unbalanced (the shard
holding the last queries computes every block, the first only its own), so by default
(``context_balance="zigzag"``) the ring runs on the zig-zag layout, which gives every shard an early and
a late chunk and the same work. Inputs in order are moved into it and the output back (an
exchange of half of each block each way); inputs already in it (``context_layout="zigzag"``: a
model that lays out its activations once, ``namedaxes.nn.zigzag``) stay, and then every strategy
takes them (the all-gather and Ulysses put the gathered positions in order on each device).

The default strategy (``strategy_for``): ``ulysses`` where a fused kernel runs it (cuDNN on GPUs,
splash on TPUs) and the query heads split evenly over the shards, else ``ring``
from ``RING_FROM`` key positions per shard on (a block whose compute hides its exchange, where
gathering every key starts to cost real memory), else ``all_gather``. This rule is provisional:
it follows from what each strategy can run (a causal ring or all-gather never runs a fused
kernel), not yet from a measurement on several accelerators.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from .._errors import AttentionKernelError, format_names
from .._spec import entry_axes, entry_of
from . import _attention_kernels as kernels
from ._context_layout import exchange, from_sequence, pieces, to_sequence
from ._ring import Ring, ring

__all__ = [
    "BALANCES",
    "RING_FROM",
    "STRATEGIES",
    "Context",
    "attend",
    "context_for",
    "strategy_for",
]

STRATEGIES = ("all_gather", "ring", "ulysses")
#: How a causal ring balances its shards' work: ``None`` (off) or these.
BALANCES = ("zigzag",)

# The default strategy is the ring once each shard holds at least this many key positions.
RING_FROM = 4096


@dataclasses.dataclass(frozen=True)
class Context:
    """How a shard's queries and keys are split, and how keys and values are exchanged.

    Attributes:
        mesh_axes: The mesh axes the query positions are split over (in spec order).
        shards: The number of blocks (the product of their sizes).
        strategy: ``"all_gather"``, ``"ring"`` or ``"ulysses"``.
        keys_split: Whether keys and values enter split like the queries (else whole).
        laid_out: Whether the inputs' positions arrive in the zig-zag layout (else in order).
        balance: Whether this call moves inputs in order into the zig-zag layout (and the output
            back) to balance a causal ring.
    """

    mesh_axes: tuple[str, ...]
    shards: int
    strategy: str
    keys_split: bool
    laid_out: bool = False
    balance: bool = False

    @property
    def axis(self) -> Any:
        return entry_of(self.mesh_axes)

    @property
    def zigzag(self) -> bool:
        """Whether the kernels see the positions in the zig-zag layout."""
        return self.laid_out or self.balance


def strategy_for(
    requested: str | None, key_length: int, shards: int, *, heads: int = 0, fused: bool = False
) -> str:
    """The strategy asked for; else ``ulysses`` when a ``fused`` kernel runs it and the query
    ``heads`` (per shard of tensor parallelism) split into the ``shards``; else ``ring`` from
    ``RING_FROM`` key positions per shard on, ``all_gather`` below."""
    if requested is not None:
        return requested
    if fused and heads % shards == 0:
        return "ulysses"
    return "ring" if key_length // shards >= RING_FROM else "all_gather"


def context_for(
    impl: str, requested: str | None, balance: str | None, layout: str | None, causal: bool,
    entry: Any, shards: int, *, t: int, s: int, heads: int, total_heads: int,
    names: tuple[str, str, tuple[str, ...]],
) -> Context:  # fmt: skip
    """The context parallelism of ``t`` queries and ``s`` keys split into ``shards`` blocks over
    mesh axes ``entry``: the strategy (``requested``, else ``strategy_for``), whether the keys
    split too, and the layout (``heads``: the query heads per shard of tensor parallelism, of
    ``total_heads``; ``names``: position, key position and query heads axes)."""
    position, kpos, q_heads = names
    what = "dot_product_attention"
    keys_split = s % shards == 0
    chosen = strategy_for(requested, s, shards, heads=heads, fused=impl != "xla")
    where = (
        f"the query positions are split into {shards} blocks over mesh axes "
        f"{format_names(entry_axes(entry))}"
    )
    if chosen == "ring" and not keys_split:
        raise AttentionKernelError(
            f"{what}(context_strategy='ring'): {where}, but the {s} key positions ({kpos!r}) do "
            f"not split into {shards} equal blocks. Pass context_strategy='all_gather' (each "
            "shard then attends to every key)."
        )
    if chosen == "ulysses" and heads % shards:
        tp = f" (of {total_heads}, split by tensor parallelism)" if total_heads != heads else ""
        raise AttentionKernelError(
            f"{what}(context_strategy='ulysses'): {where}, and Ulysses splits the query heads "
            f"over them instead: the {heads} query heads{tp} ({format_names(q_heads)}) do not "
            f"split into {shards}. Pass context_strategy='ring' or 'all_gather', or split "
            f"{position!r} over mesh axes whose size divides {heads}."
        )
    zig_ok = keys_split and t % (2 * shards) == 0 and s % (2 * shards) == 0
    laid_out = layout is not None
    if laid_out and not zig_ok:
        raise AttentionKernelError(
            f"{what}(context_layout={layout!r}): {where}; the zig-zag layout cuts the {t} query "
            f"and {s} key positions into {2 * shards} equal chunks each, which they do not. "
            f"Pad the sequence to a multiple of {2 * shards}, or pass the positions in order "
            "(context_layout=None)."
        )
    balanced = False
    if chosen == "ring" and causal and balance is not None and not laid_out:
        balanced = zig_ok
        if not zig_ok:
            kernels.note_once(
                f"namedaxes: {what}'s causal ring runs unbalanced (the shard with the last "
                f"queries does the most work): {where}, and the zig-zag layout needs the {t} "
                f"query and {s} key positions in {2 * shards} equal chunks"
            )
    return Context(entry_axes(entry), shards, chosen, keys_split, laid_out, balanced)


def attend(
    impl: str, ctx: Context, q: jax.Array, k: jax.Array, v: jax.Array, *, scale: float,
    causal: bool, window: int | None, offset: int | jax.Array | None,
    key_mask: jax.Array | None, key_lengths: jax.Array | None, mask: jax.Array | None,
) -> jax.Array:  # fmt: skip
    """This shard's queries ``(B, Tl, N, H)`` attended to the keys of every shard.

    Args:
        q: The shard's queries.
        k, v: The shard's key/value block ``(B, Sl, K, H)`` (or every key when not split).
        offset: The key position of the first query of the *whole* query axis (``None``: the
            queries are the last positions of the key axis).
        key_mask: ``(B, Sl)`` real keys of the block (or of every key when not split).
        key_lengths: ``(B,)`` real keys per row (of the whole key axis).
        mask: ``(B | 1, N | 1, Tl | 1, S | 1)``: the shard's query rows over every key (in order).
    """
    t, c = q.shape[1], ctx.shards
    s = k.shape[1] * (c if ctx.keys_split else 1)
    first = s - t * c if offset is None else offset
    if ctx.balance:  # into the zig-zag layout; the output comes back below
        q, k, v = (exchange(x, ctx.axis, c, 1) for x in (q, k, v))
        if key_mask is not None:
            key_mask = exchange(key_mask, ctx.axis, c, 1)
        if mask is not None and mask.shape[2] != 1:
            mask = exchange(mask, ctx.axis, c, 2)
    if ctx.strategy == "ring":
        if impl not in ("xla", "pallas"):
            raise kernels.Unavailable(
                f"the ring merges its blocks by their log-sum-exp, which {impl} does not return "
                "with a gradient; pass context_strategy='ulysses' or 'all_gather', or use "
                "implementation='pallas' (or 'xla') for the ring"
            )
        padded = key_mask is not None or key_lengths is not None
        why = impl == "pallas" and kernels.pallas_refusal(q.dtype, padded, mask is not None)
        if why:
            raise kernels.Unavailable(why)
        cfg = Ring(ctx.axis, c, scale, causal, window, ctx.zigzag, impl)
        out = ring(cfg, q, k, v, first, key_mask, key_lengths, mask)
    elif ctx.strategy == "ulysses":
        options = dict(scale=scale, causal=causal, window=window, offset=first)
        out = _ulysses(impl, ctx, q, k, v, key_mask, key_lengths, mask, options)
    else:
        options = dict(scale=scale, causal=causal, window=window)
        out = _all_gather(impl, ctx, q, k, v, key_mask, key_lengths, mask, first, s, options)
    return exchange(out, ctx.axis, c, 1, inverse=True) if ctx.balance else out


def _gather(x: jax.Array, ctx: Context) -> jax.Array:
    """Every shard's block of ``x`` along axis 1, in order."""
    x = jax.lax.all_gather(x, ctx.axis, axis=1, tiled=True)
    return to_sequence(x, ctx.shards, 1) if ctx.zigzag else x


def _all_gather(
    impl: str, ctx: Context, q: jax.Array, k: jax.Array, v: jax.Array, key_mask: Any,
    key_lengths: Any, mask: Any, first: Any, s: int, options: dict[str, Any],
) -> jax.Array:  # fmt: skip
    """One kernel call per run of the shard's queries (one in order, two in zig-zag)."""
    if ctx.keys_split:
        k, v = _gather(k, ctx), _gather(v, ctx)
        key_mask = None if key_mask is None else _gather(key_mask, ctx)
    padding = kernels.padding_of(key_mask, key_lengths, s)
    shard = jax.lax.axis_index(ctx.axis)
    outs = []
    for p in pieces(ctx.zigzag, q.shape[1], ctx.shards, shard):
        rows = mask if mask is None or mask.shape[2] == 1 else mask[:, :, p.lo : p.lo + p.size]
        call = kernels.KernelCall(
            q=q[:, p.lo : p.lo + p.size], k=k, v=v, offset=first + p.start, padding=padding,
            mask=rows, **options,
        )  # fmt: skip
        outs.append(kernels.run(impl, call))
    return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=1)


def _ulysses(
    impl: str, ctx: Context, q: jax.Array, k: jax.Array, v: jax.Array, key_mask: Any,
    key_lengths: Any, mask: Any, options: dict[str, Any],
) -> jax.Array:  # fmt: skip
    """Heads split, positions whole: all-to-all in, the kernel, all-to-all out."""
    c, axis = ctx.shards, ctx.axis
    kv = k.shape[2]
    repeat = math.lcm(kv, c) // kv  # key/value heads repeated until they split into the shards
    if repeat > 1:
        k, v = jnp.repeat(k, repeat, axis=2), jnp.repeat(v, repeat, axis=2)

    def heads_in(x: jax.Array) -> jax.Array:  # (B, Tl, N, H) -> (B, T, N / c, H)
        x = jax.lax.all_to_all(x, axis, 2, 1, tiled=True)
        return to_sequence(x, c, 1) if ctx.zigzag else x

    shard = jax.lax.axis_index(axis)
    q = heads_in(q)
    if ctx.keys_split:
        k, v = heads_in(k), heads_in(v)
        key_mask = None if key_mask is None else _gather(key_mask, ctx)
    else:  # every key on every shard: keep this shard's heads
        per = k.shape[2] // c
        k, v = (jax.lax.dynamic_slice_in_dim(x, shard * per, per, axis=2) for x in (k, v))
    if mask is not None:  # (B | 1, N | 1, Tl | 1, S | 1): this shard's heads, every query row
        if mask.shape[1] != 1 and mask.shape[2] != 1:
            mask = jax.lax.all_to_all(mask, axis, 1, 2, tiled=True)
        elif mask.shape[1] != 1:
            per = mask.shape[1] // c
            mask = jax.lax.dynamic_slice_in_dim(mask, shard * per, per, axis=1)
        elif mask.shape[2] != 1:
            mask = jax.lax.all_gather(mask, axis, axis=2, tiled=True)
    s = k.shape[1]
    call = kernels.KernelCall(
        q=q, k=k, v=v, padding=kernels.padding_of(key_mask, key_lengths, s), mask=mask, **options
    )
    out = kernels.run(impl, call)
    if ctx.zigzag:
        out = from_sequence(out, c, 1)
    return jax.lax.all_to_all(out, axis, 1, 2, tiled=True)
