"""Context parallelism: attention whose query positions are split over mesh axes.

``dot_product_attention`` runs its kernel once per shard (``shard_map``). When the mapping splits
the query's ``position`` axis over mesh axes (``{"position": "context"}``), each shard keeps its
block of queries, and the keys and values enter split the same way along ``key_position``: the key
positions follow the query positions, so no rule for ``key_position`` is needed. (When the shard
count does not divide the key length, the keys enter whole.) The shards then exchange keys and
values by one of two strategies, here on plain arrays in the kernels' layout
(``_attention_kernels``) with mesh axes by name:

* ``all_gather``: every shard gathers all key and value blocks and makes one kernel call, its
  queries at their global positions (``query_offset + shard * block``). Any kernel that takes a
  query offset known only at run time runs it (XLA; cuDNN and splash only without ``causal``).
* ``ring``: ``c`` steps (``c`` shards); in step ``r`` shard ``i`` attends its queries to the
  key/value block of shard ``(i - r) mod c`` and passes that block on (``ppermute`` to shard
  ``i + 1``), so no shard ever holds more than two blocks. The blocks' results are merged by their
  log-sum-exp (online softmax); under ``causal`` a block that is entirely in the future of every
  query of the shard (or outside every sliding window) is skipped. The backward pass is a second
  ring that carries each block's key/value gradients with it and hands them to their owner at the
  end, so the saved state is the shard's own queries, keys, values, output and log-sum-exp. Each
  block is one XLA attention call (``_attention_kernels.scores``): a ring needs every block's
  log-sum-exp and its gradient, which neither cuDNN (through ``jax.nn.dot_product_attention``) nor
  splash returns.

The default strategy depends on the key length per shard: ``ring`` from ``RING_FROM`` key
positions per shard on (a block whose compute hides its exchange, where gathering every key
starts to cost real memory), ``all_gather`` below. The shard holding the last queries computes
every block of a causal ring; skipping spares the others work but does not shorten the step (a
zig-zag layout of the sequence would balance it, at the price of a permuted ``position`` axis
outside attention, which this module does not do).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from .._spec import entry_of
from . import _attention_kernels as kernels

__all__ = ["RING_FROM", "STRATEGIES", "Context", "attend", "strategy_for"]

STRATEGIES = ("all_gather", "ring")

# The default strategy is the ring once each shard holds at least this many key positions.
RING_FROM = 4096


@dataclasses.dataclass(frozen=True)
class Context:
    """How a shard's queries and keys are split, and how keys and values are exchanged.

    Attributes:
        mesh_axes: The mesh axes the query positions are split over (in spec order).
        shards: The number of blocks (the product of their sizes).
        strategy: ``"all_gather"`` or ``"ring"``.
        keys_split: Whether keys and values enter split like the queries (else whole).
    """

    mesh_axes: tuple[str, ...]
    shards: int
    strategy: str
    keys_split: bool

    @property
    def axis(self) -> Any:
        return entry_of(self.mesh_axes)


def strategy_for(requested: str | None, key_length: int, shards: int) -> str:
    """The strategy asked for, else ``ring`` from ``RING_FROM`` key positions per shard on."""
    if requested is not None:
        return requested
    return "ring" if key_length // shards >= RING_FROM else "all_gather"


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
        mask: ``(B | 1, N | 1, Tl | 1, S | 1)``: the shard's query rows over every key.
    """
    t = q.shape[1]
    s = k.shape[1] * (ctx.shards if ctx.keys_split else 1)
    shard = jax.lax.axis_index(ctx.axis)
    first = s - t * ctx.shards if offset is None else offset
    start = first + shard * t  # the key position of this shard's first query
    if ctx.strategy == "ring":
        if impl != "xla":
            raise kernels.Unavailable(
                f"the ring merges its blocks by their log-sum-exp, which {impl} does not return "
                "with a gradient; pass context_strategy='all_gather', or use "
                "implementation='xla' for the ring"
            )
        cfg = _Ring(ctx.axis, ctx.shards, scale, causal, window)
        return _ring(cfg, q, k, v, start, key_mask, key_lengths, mask)
    if ctx.keys_split:
        k, v = _gather(k, ctx), _gather(v, ctx)
        key_mask = None if key_mask is None else _gather(key_mask, ctx)
    call = kernels.KernelCall(
        q=q, k=k, v=v, scale=scale, causal=causal, window=window, offset=start,
        padding=kernels.padding_of(key_mask, key_lengths, s), mask=mask,
    )  # fmt: skip
    return kernels.run(impl, call)


def _gather(x: jax.Array, ctx: Context) -> jax.Array:
    return jax.lax.all_gather(x, ctx.axis, axis=1, tiled=True)


# -- ring -----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Ring:
    axis: Any
    shards: int
    scale: float
    causal: bool
    window: int | None


def _pass_on(cfg: _Ring, *xs: Any) -> tuple[Any, ...]:
    """Each array to the next shard around the ring (``None`` stays ``None``)."""
    perm = [(d, (d + 1) % cfg.shards) for d in range(cfg.shards)]
    return tuple(None if x is None else jax.lax.ppermute(x, cfg.axis, perm) for x in xs)


def _block_call(
    cfg: _Ring, q: jax.Array, k: jax.Array, v: jax.Array, start: Any, key_mask: Any,
    key_lengths: Any, mask: Any, block: Any,
) -> kernels.KernelCall:  # fmt: skip
    """The call of the shard's queries on key block ``block`` (traced), in block coordinates."""
    sb = k.shape[1]
    first = block * sb  # the key position of the block's first key
    padding = None
    if key_mask is not None:
        padding = kernels.Padding(key_mask, key_mask.sum(axis=1, dtype=jnp.int32), None)
    elif key_lengths is not None:
        real = first + jnp.arange(sb, dtype=jnp.int32)[None, :] < key_lengths[:, None]
        padding = kernels.Padding(real, real.sum(axis=1, dtype=jnp.int32), None)
    if mask is not None and mask.shape[3] != 1:
        mask = jax.lax.dynamic_slice_in_dim(mask, first, sb, axis=3)
    return kernels.KernelCall(
        q=q, k=k, v=v, scale=cfg.scale, causal=cfg.causal, window=cfg.window,
        offset=start - first, padding=padding, mask=mask,
    )  # fmt: skip


def _visible(call: kernels.KernelCall) -> jax.Array | None:
    """Whether some query sees some key of the block (``None``: always, no causal mask)."""
    if not call.causal:
        return None
    t, sb = call.q.shape[1], call.k.shape[1]
    seen = call.offset + t - 1 >= 0  # the last query is at or after the block's first key
    if call.window is not None:  # the first query's window reaches the block's last key
        seen = seen & (sb - 1 > call.offset - call.window)
    return seen


def _when(seen: jax.Array | None, compute: Any, keep: Any) -> Any:
    return compute() if seen is None else jax.lax.cond(seen, compute, keep)


def _block_forward(call: kernels.KernelCall) -> tuple[jax.Array, jax.Array]:
    """``(out (B, Tl, K, G, H), lse (B, K, G, Tl))`` of one block, in float32 (at least)."""
    s = kernels.scores(call)
    top = s.max(axis=-1)
    p = jnp.exp(s - top[..., None])
    total = p.sum(axis=-1)
    o = jnp.einsum(
        "bkgts,bskh->btkgh", p.astype(call.v.dtype), call.v, preferred_element_type=s.dtype
    )
    return o / _rows(total)[..., None], top + jnp.log(total)


def _rows(x: jax.Array) -> jax.Array:
    """``(B, K, G, T)`` statistics in the output's row layout ``(B, T, K, G)``."""
    return jnp.moveaxis(x, 3, 1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _ring(
    cfg: _Ring, q: jax.Array, k: jax.Array, v: jax.Array, start: Any, key_mask: Any,
    key_lengths: Any, mask: Any,
) -> jax.Array:  # fmt: skip
    out, _ = _ring_forward(cfg, q, k, v, start, key_mask, key_lengths, mask)
    return out


def _ring_forward(
    cfg: _Ring, q: jax.Array, k: jax.Array, v: jax.Array, start: Any, key_mask: Any,
    key_lengths: Any, mask: Any,
) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """The output ``(B, Tl, N, H)`` (value dtype) and the log-sum-exp ``(B, K, G, Tl)``."""
    b, t, n, h = q.shape
    kv = k.shape[2]
    acc = jnp.float64 if q.dtype == jnp.float64 else jnp.float32
    shard = jax.lax.axis_index(cfg.axis)

    def attend(r: Any, o: Any, lse: Any, kb: Any, vb: Any, mb: Any) -> tuple[Any, Any]:
        call = _block_call(cfg, q, kb, vb, start, mb, key_lengths, mask, (shard - r) % cfg.shards)

        def merge() -> tuple[jax.Array, jax.Array]:
            ob, lb = _block_forward(call)
            new = jnp.logaddexp(lse, lb)
            w_old, w_new = jnp.exp(lse - new), jnp.exp(lb - new)
            return o * _rows(w_old)[..., None] + ob * _rows(w_new)[..., None], new

        return _when(_visible(call), merge, lambda: (o, lse))

    def step(r: Any, carry: Any) -> Any:  # receive the next block, attend to it
        o, lse, kb, vb, mb = carry
        kb, vb, mb = _pass_on(cfg, kb, vb, mb)
        return (*attend(r, o, lse, kb, vb, mb), kb, vb, mb)

    o = jnp.zeros((b, t, kv, n // kv, h), acc)
    lse = jnp.full((b, kv, n // kv, t), jnp.finfo(acc).min, acc)
    o, lse = attend(0, o, lse, k, v, key_mask)  # the shard's own block first
    o, lse, *_ = jax.lax.fori_loop(1, cfg.shards, step, (o, lse, k, v, key_mask))
    return o.reshape(b, t, n, h).astype(v.dtype), lse


def _ring_fwd(
    cfg: _Ring, q: jax.Array, k: jax.Array, v: jax.Array, start: Any, key_mask: Any,
    key_lengths: Any, mask: Any,
) -> tuple[jax.Array, tuple[Any, ...]]:  # fmt: skip
    out, lse = _ring_forward(cfg, q, k, v, start, key_mask, key_lengths, mask)
    return out, (q, k, v, start, key_mask, key_lengths, mask, out, lse)


def _ring_bwd(cfg: _Ring, res: tuple[Any, ...], d_out: jax.Array) -> tuple[Any, ...]:
    q, k, v, start, key_mask, key_lengths, mask, out, lse = res
    b, t, n, h = q.shape
    kv = k.shape[2]
    g = n // kv
    acc = lse.dtype
    shard = jax.lax.axis_index(cfg.axis)
    do = d_out.astype(acc).reshape(b, t, kv, g, h)
    qg = q.astype(acc).reshape(b, t, kv, g, h)
    delta = jnp.moveaxis(jnp.sum(do * out.astype(acc).reshape(b, t, kv, g, h), axis=-1), 1, 3)

    def grads(r: Any, dq: Any, kb: Any, vb: Any, mb: Any, dk: Any, dv: Any) -> Any:
        """Add block ``shard - r``'s gradients: to the queries', and to the block's own."""
        call = _block_call(cfg, q, kb, vb, start, mb, key_lengths, mask, (shard - r) % cfg.shards)

        def add() -> tuple[jax.Array, jax.Array, jax.Array]:
            p = jnp.exp(kernels.scores(call) - lse[..., None])  # (B, K, G, Tl, Sb)
            dv_b = jnp.einsum("bkgts,btkgh->bskh", p, do)
            dp = jnp.einsum("btkgh,bskh->bkgts", do, vb.astype(acc))
            ds = p * (dp - delta[..., None]) * jnp.asarray(cfg.scale, acc)
            dq_b = jnp.einsum("bkgts,bskh->btkgh", ds, kb.astype(acc))
            dk_b = jnp.einsum("bkgts,btkgh->bskh", ds, qg)
            return dq + dq_b, dk + dk_b, dv + dv_b

        return _when(_visible(call), add, lambda: (dq, dk, dv))

    def step(r: Any, carry: Any) -> Any:  # attend, then pass the block and its gradients on
        dq, kb, vb, mb, dk, dv = carry
        dq, dk, dv = grads(r, dq, kb, vb, mb, dk, dv)
        kb, vb, mb, dk, dv = _pass_on(cfg, kb, vb, mb, dk, dv)
        return dq, kb, vb, mb, dk, dv

    dk, dv = jnp.zeros(k.shape, acc), jnp.zeros(v.shape, acc)
    carry = jax.lax.fori_loop(0, cfg.shards - 1, step, (jnp.zeros_like(qg), k, v, key_mask, dk, dv))
    dq, dk, dv = grads(cfg.shards - 1, *carry)
    dk, dv = _pass_on(cfg, dk, dv)  # the last block's gradients go home to the next shard
    d_q = dq.reshape(b, t, n, h).astype(q.dtype)
    return d_q, dk.astype(k.dtype), dv.astype(v.dtype), None, None, None, None


_ring.defvjp(_ring_fwd, _ring_bwd)
