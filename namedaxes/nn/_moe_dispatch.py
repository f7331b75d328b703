"""The per-device computation of :class:`~namedaxes.nn.MoE` on plain arrays.

Layout: tokens ``x (T, H)`` (every token axis flattened, the capacity groups contiguous), the
router ``(H, E)``, the experts' projections ``(E_local, H, I)`` and ``(E_local, I, H)``. The
steps: route (scores, top-k, capacity), then the expert MLPs, either

* ``"ragged"`` / ``"grouped"``: the ``T * k`` assignments sorted by expert and run as one grouped
  matmul per projection (``jax.lax.ragged_dot``, or ``namedaxes.kernels.grouped_matmul``);
* ``"dense"``: every (local) expert on every token, combined with the routing weights (zero for
  the experts a token did not choose); or
* ``"capacity"``: each group's kept assignments in ``(experts, capacity)`` slots (GShard's layout)
  and one batched matmul ``(E, slots, H) x (E, H, I)`` per projection.

Under expert parallelism (the experts split over the mesh axes ``ep``), ``"ragged"`` and
``"grouped"`` send each assignment to the device that holds its expert with an all-to-all and
bring the results back with a second one. On GPUs and TPUs that is ``jax.lax.ragged_all_to_all``: the counts per expert
go first, then exactly the rows, into the receiver's buffer grouped by expert. Elsewhere
(XLA:CPU has no ragged all-to-all) the blocks have a fixed size: without a capacity, the worst
case of all of a device's assignments going to one device (so nothing is dropped, at ``n`` times
the rows of an even split); with one, the most its capacity lets through from the sequences the
device holds (the receive buffer of the ragged exchange has that size too). Where the tokens
are the same on several of those devices, each takes its share of them first and the results are
all-gathered at the end. ``"dense"`` exchanges no tokens: each device runs its experts on the
tokens of its group and the partial results are summed (reduce-scattered where the tokens are
split). ``"capacity"`` sends each device's slot block of every other device's experts (the
slots are the fixed blocks) by all-to-all and back.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Callable
from typing import Any, NamedTuple, cast

import jax
import jax.numpy as jnp

from .._spec import entry_of
from ..kernels import grouped_matmul
from ..kernels._grouped_matmul import reads_narrow, scaled_grouped_matmul
from ._fp8_experts import Float8, float8_product
from ._quantized import scaling_dtype

__all__ = ["Narrow", "Placement", "Routing", "local_moe"]

F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class Routing:
    """The static options of one call."""

    experts: int
    top_k: int
    scoring: str  # "softmax" | "sigmoid"
    normalize: bool
    capacity: int | None  # assignments each expert takes per group; None: dropless
    group: int  # tokens per capacity group (consecutive in x)
    dispatch: str  # "ragged" | "grouped" | "dense" | "capacity"
    activation: Callable[[jax.Array], jax.Array]
    gated: bool
    float8: str | None = None  # the expert products in float8: "tensor" or "row" scaling


class Narrow(NamedTuple):
    """An expert weight stored narrow (``models.quantize``): ``values (E, K, N)`` (int8 or
    float8) and float32 ``scale (E, N)``, one per expert and output column."""

    values: jax.Array
    scale: jax.Array


# (gate or None, up, down): each an array or a Narrow one
Weights = tuple[Any, Any, Any]


def _dequantized(w: Any, dtype: Any) -> Any:
    """A weight as one array of ``dtype`` (a :class:`Narrow` one scaled, in float32 where
    ``dtype`` cannot hold the scales: float16 flushed small channels to zero)."""
    if not isinstance(w, Narrow):
        return w
    wide = scaling_dtype(dtype)
    return (w.values.astype(wide) * w.scale[:, None, :].astype(wide)).astype(dtype)


def narrow_experts_available(dtype: Any) -> bool:
    """Whether the grouped dispatch reads quantized experts' weights of ``dtype`` narrow
    (``scaled_grouped_matmul``): where its kernel takes them (``reads_narrow``; not on TPUs,
    where ``grouped_matmul`` is megablox), and on GPUs only when ``NAMEDAXES_NARROW_EXPERTS=1``
    is set. The kernel compiles for H100s and A100s with the ``triton`` package (checked on a
    CPU) but has not yet run on a GPU; until it has, GPUs dequantize the weights as before (the
    Mosaic GPU grouped matmul on Hopper). Off GPUs (Pallas interpret mode: the tests) it runs."""
    backend = jax.default_backend()
    if backend == "tpu" or not reads_narrow(dtype):
        return False
    return backend != "gpu" or os.environ.get("NAMEDAXES_NARROW_EXPERTS") == "1"


def _multiply(fn: Callable[..., jax.Array], x: jax.Array, w: Any, *extra: jax.Array) -> Any:
    """``fn(x, w, *extra)``: a :class:`Narrow` weight is read narrow by the grouped kernel where
    :func:`narrow_experts_available`, so a decoding step reads a byte per weight of the experts
    its tokens chose; otherwise it is scaled in the compute dtype where it is multiplied (XLA can
    fuse that into the other dispatches' matmuls)."""
    if isinstance(w, Narrow) and fn is grouped_matmul and narrow_experts_available(w.values.dtype):
        return scaled_grouped_matmul(x, w.values, *extra, w.scale)
    return fn(x, _dequantized(w, x.dtype), *extra)


@dataclasses.dataclass(frozen=True)
class Placement:
    """Which mesh axes split what, for the collectives (all empty on one device)."""

    ep: tuple[str, ...] = ()  # the experts
    rep: tuple[str, ...] = ()  # those of ``ep`` along which every device has the same tokens
    split: tuple[str, ...] = ()  # those of ``ep`` that split the tokens
    tokens: tuple[str, ...] = ()  # every mesh axis that splits the tokens
    tp: tuple[str, ...] = ()  # the experts' hidden axis
    sizes: tuple[tuple[str, int], ...] = ()

    def count(self, axes: tuple[str, ...]) -> int:
        sizes = dict(self.sizes)
        return math.prod(sizes[a] for a in axes)


def _psum(x: jax.Array, axes: tuple[str, ...]) -> jax.Array:
    return jax.lax.psum(x, entry_of(axes)) if axes else x


def route(x: jax.Array, router: jax.Array, mask: jax.Array, r: Routing) -> tuple[
    jax.Array, jax.Array, jax.Array, jax.Array | None, tuple[jax.Array, jax.Array, jax.Array]
]:  # fmt: skip
    """Top-k weights ``(T, k)`` (float32), expert ids ``(T, k)``, which assignments run ``(T, k)``,
    with a capacity each assignment's position among its expert's in its group ``(T, k)`` (else
    ``None``), and the load statistics (choices per expert, summed probabilities, tokens) of the
    tokens in ``mask``."""
    logits = jnp.dot(x, router).astype(F32)
    if r.scoring == "softmax":
        scores = jax.nn.softmax(logits, axis=-1)
        probs = scores
    else:
        scores = jax.nn.sigmoid(logits)
        probs = scores / jnp.sum(scores, axis=-1, keepdims=True)
    weights, ids = jax.lax.top_k(scores, r.top_k)
    if r.normalize:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    real = mask.astype(F32)
    chosen = jax.nn.one_hot(ids, r.experts, dtype=F32)  # (T, k, E)
    counts = jnp.einsum("tke,t->e", chosen, real)
    stats = (counts, jnp.einsum("te,t->e", probs, real), jnp.sum(real))
    keep = jnp.broadcast_to(mask[:, None], ids.shape)
    position = None
    if r.capacity is not None:
        # Position of each assignment among its expert's, in (token, choice) order per group.
        taken = (chosen * keep[..., None].astype(F32)).astype(jnp.int32)
        groups = taken.reshape(-1, r.group * r.top_k, r.experts)
        before = jnp.cumsum(groups, axis=1).reshape(taken.shape) - taken
        position = jnp.sum(before * taken, axis=-1)
        keep = keep & (position < r.capacity)
    return weights * keep.astype(F32), ids.astype(jnp.int32), keep, position, stats


def _ffn_ragged(
    rows: jax.Array, sizes: jax.Array, w: Weights, r: Routing, p: Placement
) -> jax.Array:
    """The expert MLPs on ``rows`` sorted by expert (``sizes[e]`` rows each; later rows give 0)."""
    matmul = grouped_matmul if r.dispatch == "grouped" else jax.lax.ragged_dot
    return _psum(_expert_mlp(rows, w, r, p, matmul, matmul, sizes), p.tp)


def _expert_mlp(
    x: jax.Array, w: Weights, r: Routing, p: Placement,
    into: Callable[..., jax.Array], out: Callable[..., jax.Array], *extra: jax.Array,
) -> jax.Array:  # fmt: skip
    """``down(act(gate(x)) * up(x))`` (or ``down(act(up(x)))``), each projection by ``into`` (up,
    gate) or ``out`` (down), called as ``into(rows, weights, *extra)``: the one expert MLP every
    dispatch runs, with its own products, in float8 when ``r.float8`` says so (the weights
    :class:`Narrow` or not: a quantized model then computes in float8 from its dequantized
    weights)."""
    if r.float8 is not None:
        w = tuple(_dequantized(a, x.dtype) for a in w)  # type: ignore[assignment]
        every = tuple(dict.fromkeys(p.tokens + p.ep + p.tp))
        cfg = Float8(r.float8 == "row", every)
        # up and gate contract the (whole) embedding, down the hidden axis that p.tp splits
        into = functools.partial(float8_product, into, dataclasses.replace(cfg, split_n=p.tp))
        out = functools.partial(float8_product, out, dataclasses.replace(cfg, split_k=p.tp))
    else:
        into = functools.partial(_multiply, into)
        out = functools.partial(_multiply, out)
    gate, up, down = w
    h = into(x, up, *extra)
    h = r.activation(into(x, gate, *extra)) * h if gate is not None else r.activation(h)
    return out(h, down, *extra)


def _ffn_dense(x: jax.Array, combine: jax.Array, w: Weights, r: Routing, p: Placement) -> jax.Array:
    """Every expert of ``w`` on every token, summed with the weights ``combine (T, E)``."""
    into = functools.partial(jnp.einsum, "th,ehi->tei")
    out = _expert_mlp(x, w, r, p, into, functools.partial(jnp.einsum, "tei,eih->teh"))
    return jnp.einsum("teh,te->th", out, combine.astype(out.dtype))


def _kept(rows: jax.Array, keep: jax.Array) -> jax.Array:
    """``rows`` with those not in ``keep`` zero. The products ignore them (their weight is zero,
    or the grouped products' sizes leave them out), but float8's scales would see them: zeroed,
    padding and dropped choices change no scale, as they never reach the capacity slots or the
    expert-parallel exchange (a sharded layer computes with the unsharded one's scales, and every
    dispatch with the same row scales)."""
    return jnp.where(keep[:, None], rows, jnp.zeros((), rows.dtype))


def _sizes(keys: jax.Array, n: int) -> jax.Array:
    """How many of ``keys`` equal each of ``0 .. n-1`` (a key ``n`` counts nowhere)."""
    return jnp.zeros((n + 1,), jnp.int32).at[keys].add(1)[:n]


def _dense(
    x: jax.Array, weights: jax.Array, ids: jax.Array, keep: jax.Array,
    w: Weights, r: Routing, p: Placement,
) -> jax.Array:  # fmt: skip
    t = x.shape[0]
    x = _kept(x, jnp.any(keep, axis=1))  # padding, and tokens whose every choice was dropped
    combine = jnp.zeros((t, r.experts), F32).at[jnp.arange(t)[:, None], ids].add(weights)
    if p.split:  # the group's tokens, from the devices that split them
        x = jax.lax.all_gather(x, entry_of(p.split), axis=0, tiled=True)
        combine = jax.lax.all_gather(combine, entry_of(p.split), axis=0, tiled=True)
    local = (w[1].values if isinstance(w[1], Narrow) else w[1]).shape[0]
    if p.ep:
        first = jax.lax.axis_index(entry_of(p.ep)) * local
        combine = jax.lax.dynamic_slice_in_dim(combine, first, local, axis=1)
    y = _psum(_ffn_dense(x, combine, w, r, p), p.tp + p.rep)
    if p.split:
        y = jax.lax.psum_scatter(y, entry_of(p.split), scatter_dimension=0, tiled=True)
    return y


def _ragged_local(
    x: jax.Array, weights: jax.Array, ids: jax.Array, keep: jax.Array,
    w: Weights, r: Routing, p: Placement,
) -> jax.Array:  # fmt: skip
    t, k = ids.shape
    key = jnp.where(keep, ids, r.experts).reshape(-1)
    order = jnp.argsort(key, stable=True)
    token = order // k
    rows = _kept(x[token], keep.reshape(-1)[order])
    out = _ffn_ragged(rows, _sizes(key, r.experts), w, r, p)
    contrib = out * weights.reshape(-1)[order][:, None].astype(out.dtype)
    return jnp.zeros_like(x).at[token].add(contrib)


def _block(tokens: int, local: int, r: Routing) -> int:
    """Rows of the block one device sends another: all of its ``tokens * top_k`` choices (they
    may all go to one device's experts), or, with a capacity, at most ``capacity`` per expert and
    sequence of the sequences these tokens overlap."""
    choices = tokens * r.top_k
    if r.capacity is None:
        return choices
    sequences = tokens // r.group if tokens % r.group == 0 else -(-tokens // r.group) + 1
    return min(choices, sequences * local * r.capacity)


def _share(arrays: tuple[jax.Array, ...], unit: int, p: Placement) -> tuple[jax.Array, ...]:
    """This device's share of rows that are the same on the devices of ``p.rep``: as many whole
    ``unit``s of rows on each (the last padded with zeros, ``False`` for masks)."""
    t, n = arrays[0].shape[0], p.count(p.rep)
    share = -(-t // (unit * n)) * unit
    first = jax.lax.axis_index(entry_of(p.rep)) * share
    widths = lambda a: [(0, share * n - t)] + [(0, 0)] * (a.ndim - 1)  # noqa: E731
    return tuple(
        jax.lax.dynamic_slice_in_dim(jnp.pad(a, widths(a)), first, share, axis=0) for a in arrays
    )


def _ragged_exchange(
    x: jax.Array, weights: jax.Array, ids: jax.Array, keep: jax.Array,
    w: Weights, r: Routing, p: Placement,
) -> jax.Array:  # fmt: skip
    t_all, k = ids.shape
    h = x.shape[1]
    if p.rep:  # the same tokens on these devices: each takes its share
        x, weights, ids, keep = _share((x, weights, ids, keep), 1, p)
    n = p.count(p.ep)
    local = r.experts // n
    a = _block(ids.shape[0], local, r)
    key = jnp.where(keep, ids, r.experts).reshape(-1)
    order = jnp.argsort(key, stable=True)
    key = key[order]
    token = order // k
    dest = key // local  # n for dropped assignments: written nowhere
    start = jnp.cumsum(_sizes(dest, n)) - _sizes(dest, n)
    slot = jnp.arange(ids.size) - start[jnp.minimum(dest, n - 1)]
    send = jnp.zeros((n, a, h), x.dtype).at[dest, slot].set(x[token], mode="drop")
    send_expert = (
        jnp.full((n, a), local, jnp.int32).at[dest, slot].set(key - dest * local, mode="drop")
    )
    ep = entry_of(p.ep)
    rows = jax.lax.all_to_all(send, ep, 0, 0, tiled=True).reshape(n * a, h)
    expert = jax.lax.all_to_all(send_expert, ep, 0, 0, tiled=True).reshape(n * a)
    by_expert = jnp.argsort(expert, stable=True)
    done = _ffn_ragged(rows[by_expert], _sizes(expert, local), w, r, p)
    done = jnp.zeros_like(rows).at[by_expert].set(done).reshape(n, a, h)
    back = jax.lax.all_to_all(done, ep, 0, 0, tiled=True)
    sent = dest < n
    out = back[jnp.minimum(dest, n - 1), slot] * sent[:, None].astype(x.dtype)
    contrib = out * weights.reshape(-1)[order][:, None].astype(out.dtype)
    y = jnp.zeros_like(x).at[token].add(contrib)
    if p.rep:
        y = jax.lax.all_gather(y, entry_of(p.rep), axis=0, tiled=True)[:t_all]
    return y


def ragged_all_to_all_available() -> bool:
    """Whether expert parallelism exchanges tokens by ``jax.lax.ragged_all_to_all``: only on GPUs
    and TPUs (XLA:CPU has no kernel for it), and only when ``NAMEDAXES_RAGGED_ALL_TO_ALL=1`` is
    set. It has run only on an emulation of the collective so far (the tests'); until it has run
    on several accelerators the fixed blocks stay the default there too."""
    if os.environ.get("NAMEDAXES_RAGGED_ALL_TO_ALL") != "1":
        return False
    return jax.default_backend() in ("gpu", "tpu")


# The collective the sized exchange calls: tests put an emulation here, as CPUs lack it.
_ragged_all_to_all = jax.lax.ragged_all_to_all


def _ragged_exchange_sized(
    x: jax.Array, weights: jax.Array, ids: jax.Array, keep: jax.Array,
    w: Weights, r: Routing, p: Placement,
) -> jax.Array:  # fmt: skip
    """The exchange of ``_ragged_exchange`` by ``jax.lax.ragged_all_to_all`` (GPUs, TPUs): the
    row counts go first (an all-gather of ``(E,)`` counts), then each device sends exactly its
    rows of each expert, written straight into the receiver's buffer grouped by expert (no sort
    there), and the results come back the same way. Only the receive buffer keeps the fixed
    worst-case size; nothing else is padded. Not run on CPUs (the tests run it on an emulation
    of the collective)."""
    t_all, k = ids.shape
    h = x.shape[1]
    if p.rep:  # the same tokens on these devices: each takes its share
        x, weights, ids, keep = _share((x, weights, ids, keep), 1, p)
    n, e = p.count(p.ep), r.experts
    local = e // n
    ep = entry_of(p.ep)
    key = jnp.where(keep, ids, e).reshape(-1)
    order = jnp.argsort(key, stable=True)
    token = order // k
    count = _sizes(key, e)  # this device's rows per expert, in expert order from row 0
    counts = jax.lax.all_gather(count, ep)  # (devices, E)
    starts = jnp.cumsum(counts, axis=1) - counts  # where each expert's rows start on the sender
    blocks = jnp.sum(counts, axis=0).reshape(n, local)  # rows per expert, by holding device
    first = (jnp.cumsum(blocks, axis=1) - blocks).reshape(e)  # an expert's rows in its holder
    at = first[None, :] + jnp.cumsum(counts, axis=0) - counts  # (devices, E): sender's rows there
    me = jax.lax.axis_index(ep)
    mine = lambda a: jax.lax.dynamic_slice_in_dim(a, me * local, local, axis=1)  # noqa: E731
    buffer = jnp.zeros((n * _block(ids.shape[0], local, r), h), x.dtype)
    rows = _ragged_all_to_all(
        x[token], buffer, starts[me], count, at[me], mine(counts).reshape(-1), axis_name=ep
    )
    done = _ffn_ragged(rows, mine(blocks.reshape(1, e))[0], w, r, p)
    out = _ragged_all_to_all(
        done, jnp.zeros((ids.size, h), x.dtype), mine(at).reshape(-1),
        mine(counts).reshape(-1), mine(starts).reshape(-1), count, axis_name=ep,
    )  # fmt: skip
    contrib = out * weights.reshape(-1)[order][:, None].astype(out.dtype)
    y = jnp.zeros_like(x).at[token].add(contrib)
    if p.rep:
        y = jax.lax.all_gather(y, entry_of(p.rep), axis=0, tiled=True)[:t_all]
    return y


def _ffn_batched(rows: jax.Array, w: Weights, r: Routing, p: Placement) -> jax.Array:
    """The expert MLPs on ``rows (E, R, H)``, expert ``e`` on ``rows[e]``: batched matmuls."""
    into = functools.partial(jnp.einsum, "erh,ehi->eri")
    out = _expert_mlp(rows, w, r, p, into, functools.partial(jnp.einsum, "eri,eih->erh"))
    return _psum(out, p.tp)


def _capacity(
    x: jax.Array, weights: jax.Array, ids: jax.Array, keep: jax.Array, position: jax.Array,
    w: Weights, r: Routing, p: Placement,
) -> jax.Array:  # fmt: skip
    """GShard's layout: each group's kept assignments in ``(experts, capacity)`` slots, at their
    ``position``, run as one ``(E, groups * capacity, H)`` batched product; under expert
    parallelism each device's slots of another's experts are the block all-to-all sends it."""
    t_all, h = x.shape
    if p.rep:  # the same tokens on these devices: each takes a share of whole groups
        x, weights, ids, keep, position = _share((x, weights, ids, keep, position), r.group, p)
    t, e, c = x.shape[0], r.experts, cast(int, r.capacity)
    groups = t // r.group
    empty = groups * e * c  # the slot of the dropped assignments: an extra zero row
    group = jnp.arange(t, dtype=jnp.int32)[:, None] // r.group
    slot = jnp.where(keep, (group * e + ids) * c + position, empty).reshape(-1)
    token = jnp.full((empty + 1,), t, jnp.int32).at[slot].set(jnp.arange(slot.size) // r.top_k)
    zero = jnp.zeros((1, h), x.dtype)
    rows = jnp.concatenate([x, zero])[token[:empty]].reshape(groups, e, c, h)
    rows = rows.transpose(1, 0, 2, 3)  # (E, groups, C, H)
    n = p.count(p.ep)
    if n > 1:  # block d of the experts to device d; each device gets every device's slots
        ep = entry_of(p.ep)
        rows = jax.lax.all_to_all(rows.reshape(n, e // n, groups, c, h), ep, 0, 0, tiled=True)
        rows = rows.transpose(1, 0, 2, 3, 4)  # (E / n, devices, groups, C, H)
    out = _ffn_batched(rows.reshape(rows.shape[0], -1, h), w, r, p).reshape(rows.shape)
    if n > 1:
        out = jax.lax.all_to_all(out.transpose(1, 0, 2, 3, 4), ep, 0, 0, tiled=True)
    out = out.reshape(e, groups, c, h).transpose(1, 0, 2, 3).reshape(empty, h)
    picked = jnp.concatenate([out, zero])[slot].reshape(t, r.top_k, h)
    y = jnp.einsum("tkh,tk->th", picked, weights.astype(picked.dtype))
    if p.rep:
        y = jax.lax.all_gather(y, entry_of(p.rep), axis=0, tiled=True)[:t_all]
    return y


def local_moe(
    x: jax.Array, mask: jax.Array, router: jax.Array,
    w: Weights, r: Routing, p: Placement,
) -> tuple[jax.Array, tuple[jax.Array, jax.Array, jax.Array]]:  # fmt: skip
    """The MoE output ``(T, H)`` of this device's tokens and the load statistics (summed over
    the devices that split the tokens)."""
    weights, ids, keep, position, stats = route(x, router, mask, r)
    stats = tuple(_psum(s, p.tokens) for s in stats)  # type: ignore[assignment]
    if r.dispatch == "dense":
        y = _dense(x, weights, ids, keep, w, r, p)
    elif r.dispatch == "capacity":
        y = _capacity(x, weights, ids, keep, cast(jax.Array, position), w, r, p)
    elif p.ep:
        exchange = _ragged_exchange_sized if ragged_all_to_all_available() else _ragged_exchange
        y = exchange(x, weights, ids, keep, w, r, p)
    else:
        y = _ragged_local(x, weights, ids, keep, w, r, p)
    return y, stats  # type: ignore[return-value]
