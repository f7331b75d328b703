"""Ring attention: the context shards pass key/value blocks around and merge by log-sum-exp.

``c`` steps (``c`` shards); in step ``r`` shard ``i`` attends its queries to the key/value block
of shard ``(i - r) mod c`` and passes that block on (``ppermute`` to shard ``i + 1``), so no shard
ever holds more than two blocks. The blocks' results are merged by their log-sum-exp (online
softmax). A shard's queries and a block's keys are one run of consecutive positions each in
order, or two in the zig-zag layout (``_context_layout.pieces``); every pair of a query run and a
key run is one kernel call at its own offset, skipped under ``causal`` when no query of the run
sees a key of the other (in the future of every query, or outside every sliding window). In the
zig-zag layout every shard computes the same number of pairs (``work`` counts them with the same
test). The backward pass is a second ring that carries each block's key/value gradients with it
and hands them to their owner at the end, so the saved state is the shard's own queries, keys,
values, output and log-sum-exp. Each call is XLA attention (``_attention_kernels.scores``) by default, or
with ``impl="pallas"`` the Pallas flash-attention kernel (``namedaxes.kernels``, Triton on GPUs),
which returns the block's log-sum-exp and computes its gradients from the ring's; neither cuDNN
(through ``jax.nn.dot_product_attention``) nor splash returns the log-sum-exp.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from .._partitioning._collectives import permute_blocks
from ..kernels import _flash_attention as flash
from . import _attention_kernels as kernels
from ._context_layout import Piece, pieces

__all__ = ["Ring", "ring", "work"]

F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class Ring:
    """The ring's static settings: mesh axes, shard count, the attention options, the layout."""

    axis: Any
    shards: int
    scale: float
    causal: bool
    window: int | None
    zigzag: bool
    impl: str = "xla"  # each call's kernel: "xla" or "pallas"


def _pass_on(cfg: Ring, *xs: Any) -> tuple[Any, ...]:
    """Each array to the next shard around the ring (``None`` stays ``None``)."""
    perm = [(d, (d + 1) % cfg.shards) for d in range(cfg.shards)]
    return tuple(None if x is None else permute_blocks(x, cfg.axis, perm) for x in xs)


def _sees(causal: bool, window: int | None, offset: Any, t: int, s: int) -> Any:
    """Whether some of ``t`` queries at ``offset`` (key position of the first) sees some of ``s``
    keys from 0 (``None``: always, no causal mask). Python ints give a bool, traced ones a
    traced bool: the ring skips and ``work`` counts by this one test."""
    if not causal:
        return None
    seen = offset + t - 1 >= 0  # the last query is at or after the first key
    if window is not None:  # the first query's window reaches the last key
        seen = seen & (s - 1 > offset - window)
    return seen


def _pairs(cfg: Ring, t: int, sb: int, shard: Any, block: Any) -> list[tuple[int, Piece, Piece]]:
    """``(query run index, query run, key run)`` of shard ``shard``'s queries on block ``block``."""
    qs = pieces(cfg.zigzag, t, cfg.shards, shard)
    ks = pieces(cfg.zigzag, sb, cfg.shards, block)
    return [(a, qp, kp) for a, qp in enumerate(qs) for kp in ks]


def work(cfg: Ring, t: int, sb: int, first: int = 0) -> list[int]:
    """Per shard, the query x key positions of the calls the ring makes (not skipped), forward;
    ``t`` and ``sb`` are the queries and keys per shard, ``first`` the key position of the first
    query. The ring decides what to skip by the same test (``_sees``)."""
    done = []
    for shard in range(cfg.shards):
        total = 0
        for r in range(cfg.shards):
            for _, qp, kp in _pairs(cfg, t, sb, shard, (shard - r) % cfg.shards):
                seen = _sees(cfg.causal, cfg.window, first + qp.start - kp.start, qp.size, kp.size)
                total += qp.size * kp.size if seen is None or seen else 0
        done.append(total)
    return done


def _block_call(
    cfg: Ring, q: jax.Array, k: jax.Array, v: jax.Array, first: Any, qp: Piece, kp: Piece,
    key_mask: Any, key_lengths: Any, mask: Any,
) -> kernels.KernelCall:  # fmt: skip
    """The call of query run ``qp`` on key run ``kp`` of the block ``k``, ``v`` (its key mask)."""
    ks, vs = k[:, kp.lo : kp.lo + kp.size], v[:, kp.lo : kp.lo + kp.size]
    padding = None
    if key_mask is not None:
        real = key_mask[:, kp.lo : kp.lo + kp.size]
        padding = kernels.Padding(real, real.sum(axis=1, dtype=jnp.int32), None)
    elif key_lengths is not None:
        real = kp.start + jnp.arange(kp.size, dtype=jnp.int32)[None, :] < key_lengths[:, None]
        padding = kernels.Padding(real, real.sum(axis=1, dtype=jnp.int32), None)
    if mask is not None:
        if mask.shape[2] != 1:  # the run's query rows
            mask = mask[:, :, qp.lo : qp.lo + qp.size]
        if mask.shape[3] != 1:  # the run's keys, in sequence order
            mask = jax.lax.dynamic_slice_in_dim(mask, kp.start, kp.size, axis=3)
    return kernels.KernelCall(
        q=q[:, qp.lo : qp.lo + qp.size], k=ks, v=vs, scale=cfg.scale, causal=cfg.causal,
        window=cfg.window, offset=first + qp.start - kp.start, padding=padding, mask=mask,
    )  # fmt: skip


def _visible(call: kernels.KernelCall) -> Any:
    return _sees(call.causal, call.window, call.offset, call.q.shape[1], call.k.shape[1])


def _when(seen: Any, compute: Any, keep: Any) -> Any:
    return compute() if seen is None else jax.lax.cond(seen, compute, keep)


def _flash_options(call: kernels.KernelCall) -> flash.Options:
    return flash.options(
        call.q, call.k, call.v, scale=call.scale, causal=call.causal, window=call.window
    )


def _block_forward(call: kernels.KernelCall, impl: str = "xla") -> tuple[jax.Array, jax.Array]:
    """``(out (B, T, K, G, H), lse (B, K, G, T))`` of one call, in float32 (at least)."""
    if impl == "pallas":
        b, t, n, h = call.q.shape
        kv = call.k.shape[2]
        out, lse = flash.forward(_flash_options(call), call.q, call.k, call.v, call.offset, F32)
        return out.reshape(b, t, kv, n // kv, h), lse.reshape(b, kv, n // kv, t)
    s = kernels.scores(call)
    top = s.max(axis=-1)
    p = jnp.exp(s - top[..., None])
    total = p.sum(axis=-1)
    o = jnp.einsum(
        "bkgts,bskh->btkgh", p.astype(call.v.dtype), call.v, preferred_element_type=s.dtype
    )
    return o / _rows(total)[..., None], top + jnp.log(total)


def _block_backward(
    call: kernels.KernelCall, impl: str, do: jax.Array, lse: jax.Array, delta: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(dq (B, T, K, G, H), dk, dv (B, S, K, H))`` of one call in float32 (at least), given
    the output's gradient ``do`` ``(B, T, K, G, H)`` and the whole ring's log-sum-exp and
    ``delta = rowsum(do * out)`` (``(B, K, G, T)``): ``p = exp(s - lse)``,
    ``ds = p * (dp - delta) * scale``."""
    if impl == "pallas":
        b, t, kv, g, h = do.shape
        d = flash.backward(
            _flash_options(call), call.q, call.k, call.v, call.offset,
            do.reshape(b, t, kv * g, h), lse.reshape(b, kv * g, t), delta.reshape(b, kv * g, t),
        )  # fmt: skip
        return d[0].reshape(do.shape), d[1], d[2]
    acc = lse.dtype
    b, t, n, h = call.q.shape
    kv = call.k.shape[2]
    p = jnp.exp(kernels.scores(call) - lse[..., None])  # (B, K, G, T, S)
    dv = jnp.einsum("bkgts,btkgh->bskh", p, do)
    dp = jnp.einsum("btkgh,bskh->bkgts", do, call.v.astype(acc))
    ds = p * (dp - delta[..., None]) * jnp.asarray(call.scale, acc)
    dq = jnp.einsum("bkgts,bskh->btkgh", ds, call.k.astype(acc))
    qg = call.q.astype(acc).reshape(b, t, kv, n // kv, h)
    return dq, jnp.einsum("bkgts,btkgh->bskh", ds, qg), dv


def _rows(x: jax.Array) -> jax.Array:
    """``(B, K, G, T)`` statistics in the output's row layout ``(B, T, K, G)``."""
    return jnp.moveaxis(x, 3, 1)


def ring(
    cfg: Ring, q: jax.Array, k: jax.Array, v: jax.Array, first: Any, key_mask: Any,
    key_lengths: Any, mask: Any,
) -> jax.Array:  # fmt: skip
    """This shard's queries ``(B, Tl, N, H)`` attended to every shard's block ``(B, Sl, K, H)``
    (``first``: the key position of the first query of the whole query axis)."""
    return _ring(cfg, q, k, v, first, key_mask, key_lengths, mask)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _ring(
    cfg: Ring, q: jax.Array, k: jax.Array, v: jax.Array, first: Any, key_mask: Any,
    key_lengths: Any, mask: Any,
) -> jax.Array:  # fmt: skip
    out, _ = _ring_forward(cfg, q, k, v, first, key_mask, key_lengths, mask)
    return out


def _ring_forward(
    cfg: Ring, q: jax.Array, k: jax.Array, v: jax.Array, first: Any, key_mask: Any,
    key_lengths: Any, mask: Any,
) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """The output ``(B, Tl, N, H)`` (value dtype) and the log-sum-exp ``(B, K, G, Tl)``."""
    b, t, n, h = q.shape
    kv = k.shape[2]
    acc = jnp.float64 if q.dtype == jnp.float64 else jnp.float32
    shard = jax.lax.axis_index(cfg.axis)
    runs = pieces(cfg.zigzag, t, cfg.shards, shard)

    def attend(r: Any, state: tuple[Any, ...], kb: Any, vb: Any, mb: Any) -> tuple[Any, ...]:
        state = list(state)
        for a, qp, kp in _pairs(cfg, t, kb.shape[1], shard, (shard - r) % cfg.shards):
            call = _block_call(cfg, q, kb, vb, first, qp, kp, mb, key_lengths, mask)

            def merge(call: Any = call, o: Any = state[a][0], lse: Any = state[a][1]) -> Any:
                ob, lb = _block_forward(call, cfg.impl)
                new = jnp.logaddexp(lse, lb)
                w_old, w_new = jnp.exp(lse - new), jnp.exp(lb - new)
                return o * _rows(w_old)[..., None] + ob * _rows(w_new)[..., None], new

            state[a] = _when(_visible(call), merge, lambda s=state[a]: s)
        return tuple(state)

    def step(r: Any, carry: Any) -> Any:  # receive the next block, attend to it
        state, kb, vb, mb = carry
        kb, vb, mb = _pass_on(cfg, kb, vb, mb)
        return attend(r, state, kb, vb, mb), kb, vb, mb

    state = tuple(
        (
            jnp.zeros((b, p.size, kv, n // kv, h), acc),
            jnp.full((b, kv, n // kv, p.size), jnp.finfo(acc).min, acc),
        )
        for p in runs
    )
    state = attend(0, state, k, v, key_mask)  # the shard's own block first
    state, *_ = jax.lax.fori_loop(1, cfg.shards, step, (state, k, v, key_mask))
    o = jnp.concatenate([o for o, _ in state], axis=1)
    lse = jnp.concatenate([lse for _, lse in state], axis=3)
    return o.reshape(b, t, n, h).astype(v.dtype), lse


def _ring_fwd(
    cfg: Ring, q: jax.Array, k: jax.Array, v: jax.Array, first: Any, key_mask: Any,
    key_lengths: Any, mask: Any,
) -> tuple[jax.Array, tuple[Any, ...]]:  # fmt: skip
    out, lse = _ring_forward(cfg, q, k, v, first, key_mask, key_lengths, mask)
    return out, (q, k, v, first, key_mask, key_lengths, mask, out, lse)


def _ring_bwd(cfg: Ring, res: tuple[Any, ...], d_out: jax.Array) -> tuple[Any, ...]:
    q, k, v, first, key_mask, key_lengths, mask, out, lse = res
    b, t, n, h = q.shape
    kv = k.shape[2]
    g = n // kv
    acc = lse.dtype
    shard = jax.lax.axis_index(cfg.axis)
    do = d_out.astype(acc).reshape(b, t, kv, g, h)
    delta = jnp.moveaxis(jnp.sum(do * out.astype(acc).reshape(b, t, kv, g, h), axis=-1), 1, 3)

    def grads(r: Any, dq: Any, kb: Any, vb: Any, mb: Any, dk: Any, dv: Any) -> Any:
        """Add block ``shard - r``'s gradients: to the queries', and to the block's own."""
        for _, qp, kp in _pairs(cfg, t, kb.shape[1], shard, (shard - r) % cfg.shards):
            call = _block_call(cfg, q, kb, vb, first, qp, kp, mb, key_lengths, mask)
            qs, ks = slice(qp.lo, qp.lo + qp.size), slice(kp.lo, kp.lo + kp.size)

            def add(call: Any = call, qs: Any = qs, ks: Any = ks, dq: Any = dq, dk: Any = dk,
                    dv: Any = dv) -> Any:  # fmt: skip
                dq_b, dk_b, dv_b = _block_backward(
                    call, cfg.impl, do[:, qs], lse[..., qs], delta[..., qs]
                )
                return (dq.at[:, qs].add(dq_b), dk.at[:, ks].add(dk_b), dv.at[:, ks].add(dv_b))

            dq, dk, dv = _when(_visible(call), add, lambda dq=dq, dk=dk, dv=dv: (dq, dk, dv))
        return dq, dk, dv

    def step(r: Any, carry: Any) -> Any:  # attend, then pass the block and its gradients on
        dq, kb, vb, mb, dk, dv = carry
        dq, dk, dv = grads(r, dq, kb, vb, mb, dk, dv)
        kb, vb, mb, dk, dv = _pass_on(cfg, kb, vb, mb, dk, dv)
        return dq, kb, vb, mb, dk, dv

    dk, dv = jnp.zeros(k.shape, acc), jnp.zeros(v.shape, acc)
    dq = jnp.zeros((b, t, kv, g, h), acc)
    carry = jax.lax.fori_loop(0, cfg.shards - 1, step, (dq, k, v, key_mask, dk, dv))
    dq, dk, dv = grads(cfg.shards - 1, *carry)
    dk, dv = _pass_on(cfg, dk, dv)  # the last block's gradients go home to the next shard
    d_q = dq.reshape(b, t, n, h).astype(q.dtype)
    return d_q, dk.astype(k.dtype), dv.astype(v.dtype), None, None, None, None


_ring.defvjp(_ring_fwd, _ring_bwd)
