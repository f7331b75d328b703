"""Attention kernels on plain arrays in ``jax.nn.dot_product_attention``'s layout.

``dot_product_attention`` (the named function) flattens its inputs into one ``KernelCall``:
query ``(B, T, N, H)``, key and value ``(B, S, K, H)`` with ``K`` dividing ``N`` (query head ``h``
uses key/value head ``h // (N // K)``), and the structured options (causal, sliding window,
padding, query offset) kept as such. Each kernel turns that call into what its backend takes
natively, or raises ``Unavailable`` saying why it cannot:

* ``xla``: the same math as ``jax.nn.dot_product_attention(implementation="xla")`` in plain
  ``jnp`` (scores materialized); takes everything.
* ``cudnn``: ``jax.nn.dot_product_attention(implementation="cudnn")`` (cuDNN flash attention) on
  NVIDIA GPUs for bfloat16/float16. cuDNN's causal mask starts at the first key and its padding
  is right padding (key lengths), so a left-padded batch is rotated per row (real keys first),
  attended, and rotated back.
* ``splash``: TPU splash attention from ``jax.experimental.pallas.ops.tpu``, one kernel per batch
  row (``vmap``); padding becomes segment ids.
* ``pallas``: this library's Pallas flash attention (``namedaxes.kernels.flash_attention``:
  Triton on GPUs, interpret mode elsewhere), which also returns the log-sum-exp, so the context
  ring's blocks run it too; causal, sliding window, grouped-query heads and any query offset
  (traced too), but no padding or ``mask=``. Never the default: opt in until a GPU measurement
  against cuDNN says otherwise.

Nothing here knows about names or meshes; the caller runs a kernel per shard.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any

import jax
import jax.numpy as jnp

from ..kernels import flash_attention

__all__ = [
    "IMPLEMENTATIONS",
    "KernelCall",
    "Padding",
    "Unavailable",
    "padding_from_lengths",
    "padding_from_mask",
    "pallas_refusal",
    "preferred",
    "run",
    "scores",
]

IMPLEMENTATIONS = ("xla", "cudnn", "splash", "pallas")

# Tests set this to exercise the cuDNN and splash mappings on a CPU: "cudnn" then runs JAX's XLA
# implementation of exactly the call it would give cuDNN (same rotation, lengths, causal and
# window arguments, which JAX defines identically for both), and "splash" runs Pallas in interpret
# mode. Nothing else reads it.
_EMULATE = False

logger = logging.getLogger("namedaxes")


class Unavailable(Exception):  # noqa: N818 - internal signal, turned into AttentionKernelError
    """A kernel cannot take this call; the message says why."""


@dataclasses.dataclass(frozen=True)
class Padding:
    """Which keys are real, per batch row.

    ``mask`` ``(B, S)`` is exact. ``start`` is ``None`` when the real keys are known to start at
    position 0 (key lengths: right padding); otherwise ``(start, length)`` describe each row's run of
    real keys, which the kernels that need a run (cuDNN) use.
    """

    mask: jax.Array
    length: jax.Array
    start: jax.Array | None


@dataclasses.dataclass(frozen=True)
class KernelCall:
    """One attention call: ``(B, T, N, H)`` queries, ``(B, S, K, H)`` keys and values."""

    q: jax.Array
    k: jax.Array
    v: jax.Array
    scale: float
    causal: bool
    window: int | None  # keys i - window < j <= i (implies causal)
    offset: int | jax.Array  # query row t is key position t + offset
    padding: Padding | None
    mask: jax.Array | None  # boolean, (B | 1, N | 1, T, S)

    @property
    def static_offset(self) -> int | None:
        return self.offset if isinstance(self.offset, int) else None


def platform() -> str:
    """The platform the default backend runs on (``cpu``, ``gpu``, ``tpu``)."""
    return jax.default_backend()


def preferred() -> str:
    """The fastest kernel this platform has: splash on TPUs, cuDNN on GPUs, else XLA."""
    return {"tpu": "splash", "gpu": "cudnn"}.get(platform(), "xla")


def run(impl: str, call: KernelCall) -> jax.Array:
    """``impl``'s output ``(B, T, N, H)``; raises ``Unavailable`` when it cannot take ``call``."""
    if impl == "xla":
        return _xla(call)
    if impl == "cudnn":
        return _cudnn(call)
    if impl == "pallas":
        return _pallas(call)
    return _splash(call)


@functools.cache
def note_once(message: str) -> None:
    """Log ``message`` once per process (a fallback the user may want to know about)."""
    logger.warning(message)


# -- masks built from the structured options (used where a kernel cannot take them natively) -----


def structural_mask(call: KernelCall) -> jax.Array | None:
    """``(1, 1, T, S)`` boolean: causal / window at ``offset``; ``None`` when neither is asked."""
    if not call.causal:
        return None
    t, s = call.q.shape[1], call.k.shape[1]
    offset = jnp.asarray(call.offset, jnp.int32)
    query_at = jnp.arange(t, dtype=jnp.int32)[:, None] + offset
    key_at = jnp.arange(s, dtype=jnp.int32)[None, :]
    allowed = key_at <= query_at
    if call.window is not None:
        allowed = allowed & (key_at > query_at - call.window)
    return allowed[None, None]


def _and(a: jax.Array | None, b: jax.Array | None) -> jax.Array | None:
    if a is None:
        return b
    return a if b is None else a & b


def padding_from_mask(mask: jax.Array) -> Padding:
    """The ``Padding`` of a ``(B, S)`` boolean mask of real keys (one run of them per row)."""
    length = mask.sum(axis=1, dtype=jnp.int32)
    return Padding(mask, length, jnp.argmax(mask, axis=1).astype(jnp.int32))


def padding_of(mask: jax.Array | None, lengths: jax.Array | None, s: int) -> Padding | None:
    """The ``Padding`` of a key mask, else of key lengths (of ``s`` keys), else ``None``."""
    if mask is not None:
        return padding_from_mask(mask)
    return None if lengths is None else padding_from_lengths(lengths, s)


def padding_from_lengths(length: jax.Array, s: int) -> Padding:
    """The ``Padding`` of ``(B,)`` key lengths (the first ``length`` of ``s`` keys are real)."""
    length = length.astype(jnp.int32)
    return Padding(jnp.arange(s, dtype=jnp.int32)[None, :] < length[:, None], length, None)


def _padding_mask(call: KernelCall) -> jax.Array | None:
    return None if call.padding is None else call.padding.mask[:, None, None, :]


# -- xla ------------------------------------------------------------------------------------------


def scores(call: KernelCall) -> jax.Array:
    """The masked scores ``(B, K, N // K, T, S)`` in float32 (at least); masked ones are the
    dtype's lowest finite value, so a row that sees no key stays finite.

    Grouped-query heads are a reshape of the query, ``(B, T, K, N // K, H)``, never a repeat of
    the keys.
    """
    q, k = call.q, call.k
    b, t, n, h = q.shape
    kv = k.shape[2]
    g = n // kv
    acc = jnp.float64 if q.dtype == jnp.float64 else jnp.float32
    s = jnp.einsum(
        "btkgh,bskh->bkgts", q.reshape(b, t, kv, g, h), k, preferred_element_type=acc
    ) * jnp.asarray(call.scale, acc)
    mask = _and(call.mask, structural_mask(call))
    if call.padding is not None:
        mask = _and(mask, _padding_mask(call))
    if mask is not None:
        mb, mn, mt, ms = mask.shape
        grouped = mask.reshape((mb, kv, g, mt, ms) if mn == n else (mb, 1, 1, mt, ms))
        s = jnp.where(grouped, s, jnp.finfo(acc).min)
    return s


def _xla(call: KernelCall) -> jax.Array:
    """Scores in float32 (at least), masked, softmax, weights back in the value's dtype.

    (Not ``jax.nn.dot_product_attention(implementation="xla")``, whose backward pass does not
    lower under ``jax_numpy_dtype_promotion="strict"``; the math is the same.)
    """
    b, t, n, h = call.q.shape
    weights = jax.nn.softmax(scores(call), axis=-1).astype(call.v.dtype)
    out = jnp.einsum("bkgts,bskh->btkgh", weights, call.v)
    return out.reshape(b, t, n, h)


# -- cuDNN ----------------------------------------------------------------------------------------


def _rotate(x: jax.Array, shift: jax.Array) -> jax.Array:
    """Row ``r`` of each batch element becomes row ``(r + shift[b]) % n`` of ``x`` (axis 1)."""
    n = x.shape[1]
    index = (jnp.arange(n, dtype=jnp.int32)[None, :] + shift[:, None]) % n
    return jnp.take_along_axis(x, index.reshape(index.shape + (1,) * (x.ndim - 2)), axis=1)


def _cudnn(call: KernelCall) -> jax.Array:
    if not _EMULATE:
        if platform() != "gpu":
            raise Unavailable(f"cuDNN attention runs on NVIDIA GPUs; this backend is {platform()}")
        if call.q.dtype not in (jnp.bfloat16, jnp.float16):
            raise Unavailable(
                f"cuDNN flash attention takes bfloat16 or float16, got {call.q.dtype}; compute "
                "in bfloat16 (a precision policy, or cast the query, key and value)"
            )
    if call.causal and call.static_offset != 0:
        raise Unavailable(
            "cuDNN's causal mask puts query 0 at key 0, and these queries start at "
            + (
                "a key position known only when the program runs (a traced query_offset, or "
                "the queries of one context-parallel shard)"
                if call.static_offset is None
                else f"key {call.static_offset}"
            )
            + "; use implementation='xla' for queries at an offset (decoding with a cache, "
            "context parallelism)"
        )
    q, k, v, mask = call.q, call.k, call.v, call.mask
    lengths = shift = None
    if call.padding is not None:
        if call.padding.start is None:
            lengths = call.padding.length
        elif mask is not None:
            mask = _and(mask, _padding_mask(call))  # a general mask is a bias anyway
        else:
            # Left (or both-sided) padding: rotate each row so its real keys come first; causal
            # and window masks only compare positions within a row, which the rotation keeps.
            shift, lengths = call.padding.start.astype(jnp.int32), call.padding.length
            k, v = _rotate(k, shift), _rotate(v, shift)
            if call.causal:
                q = _rotate(q, shift)
    if mask is not None:  # cuDNN wants the bias over every query and key position
        b, n, t, s = mask.shape
        mask = jnp.broadcast_to(mask, (b, n, q.shape[1], k.shape[1]))
    try:
        with jax.numpy_dtype_promotion("standard"):
            out = jax.nn.dot_product_attention(
                q,
                k,
                v,
                mask=mask,
                scale=call.scale,
                is_causal=call.causal,
                key_value_seq_lengths=None if lengths is None else lengths.astype(jnp.int32),
                local_window_size=None if call.window is None else (call.window - 1, 0),
                implementation="xla" if _EMULATE else "cudnn",
            )
    except (ValueError, NotImplementedError, RuntimeError, TypeError) as e:
        raise Unavailable(f"JAX's cuDNN attention refused these inputs: {e}") from e
    if shift is not None and call.causal:
        out = _rotate(out, -shift)
    return out


# -- pallas (namedaxes.kernels.flash_attention) --------------------------------------------------


def pallas_refusal(dtype: Any, padded: bool, masked: bool) -> str | None:
    """Why the Pallas flash-attention kernel cannot take a call (``None``: it can)."""
    if masked or padded:
        return (
            "the Pallas flash-attention kernel takes causal, sliding-window and query offsets, not "
            + ("mask=" if masked else "padding (key_mask= or key_lengths=)")
            + "; use implementation='xla' (or None) for these inputs"
        )
    if jnp.dtype(dtype) not in (jnp.float32, jnp.bfloat16, jnp.float16):
        return (
            f"the Pallas flash-attention kernel takes float32, bfloat16 or float16, got "
            f"{jnp.dtype(dtype).name}; cast the query, key and value (or a precision policy)"
        )
    return None


def _pallas(call: KernelCall) -> jax.Array:
    why = pallas_refusal(call.q.dtype, call.padding is not None, call.mask is not None)
    if why:
        raise Unavailable(why)
    out, _ = flash_attention(
        call.q, call.k, call.v, scale=call.scale, causal=call.causal, offset=call.offset,
        window=call.window,
    )  # fmt: skip
    return out


# -- splash (TPU) ---------------------------------------------------------------------------------


def _splash_module() -> Any:
    try:
        from jax.experimental.pallas.ops.tpu import splash_attention
    except ImportError as e:  # pragma: no cover - present in every supported JAX
        raise Unavailable(f"jax.experimental.pallas.ops.tpu.splash_attention: {e}") from e
    return splash_attention


def _block(n: int) -> int | None:
    return next((b for b in (512, 256, 128) if n % b == 0), None)


def _segments(real: jax.Array, causal: bool, window: int | None, offset: int, t: int) -> Any:
    """Splash segment ids: keys are 1 (real) or 0 (padding); a query is 1 when it sees a real key.

    A query that sees no real key (left padding under a causal mask) gets segment 0, so it attends
    to the padding keys it sees instead of to nothing (splash needs every row to see some key).
    """
    sa = _splash_module()
    kv_ids = real.astype(jnp.int32)
    s = real.shape[1]
    if causal:
        seen_upto = jnp.cumsum(kv_ids, axis=1)  # real keys at positions <= j
        at = jnp.arange(t) + offset
        seen = jnp.take(seen_upto, jnp.clip(at, 0, s - 1), axis=1)
        if window is not None:
            before = jnp.take(seen_upto, jnp.clip(at - window, 0, s - 1), axis=1)
            seen = seen - jnp.where(at - window >= 0, before, 0)
    else:
        seen = jnp.broadcast_to(kv_ids.sum(axis=1, keepdims=True), (real.shape[0], t))
    return sa.SegmentIds(q=(seen > 0).astype(jnp.int32), kv=kv_ids)


def _splash(call: KernelCall) -> jax.Array:
    if not _EMULATE and platform() != "tpu":
        raise Unavailable(f"splash attention runs on TPUs; this backend is {platform()}")
    if call.mask is not None:
        raise Unavailable(
            "splash takes causal, sliding-window and padding options but not a general mask=; "
            "use implementation='xla' for arbitrary masks"
        )
    offset = call.static_offset
    if call.causal and offset is None:
        raise Unavailable(
            "splash needs a static query offset (a Python int), got one known only when the "
            "program runs (a traced query_offset, or the queries of one context-parallel shard)"
        )
    offset = offset or 0
    sa = _splash_module()
    b, t, n, h = call.q.shape
    s, kv = call.k.shape[1], call.k.shape[2]
    bq, bkv = _block(t), _block(s)
    if bq is None or bkv is None:
        raise Unavailable(
            f"splash needs query and key lengths that are multiples of 128, got {t} and {s}"
        )
    if call.window is not None:
        base = sa.LocalMask((t, s), (call.window - 1, 0), offset)
    elif call.causal:
        base = sa.CausalMask((t, s), offset)
    else:
        base = sa.FullMask((t, s))
    group = n // kv
    sizes = sa.BlockSizes(
        block_q=bq, block_kv=bkv, block_kv_compute=bkv,
        block_q_dkv=bq, block_kv_dkv=bkv, block_kv_dkv_compute=bkv,
        block_q_dq=bq, block_kv_dq=bkv,
    )  # fmt: skip
    make = sa.make_splash_mha if group == 1 else sa.make_splash_mqa
    heads = n if group == 1 else group
    try:
        kernel = make(
            sa.MultiHeadMask([base] * heads),
            block_sizes=sizes,
            head_shards=1,
            q_seq_shards=1,
            interpret=_EMULATE,
        )
    except (ValueError, NotImplementedError) as e:
        raise Unavailable(f"splash refused these shapes: {e}") from e
    q = (call.q * jnp.asarray(call.scale, call.q.dtype)).transpose(0, 2, 1, 3)  # (B, N, T, H)
    k, v = call.k.transpose(0, 2, 1, 3), call.v.transpose(0, 2, 1, 3)  # (B, K, S, H)
    segments = None
    if call.padding is not None:
        segments = _segments(call.padding.mask, call.causal, call.window, offset, t)
    if group == 1:
        per_row = lambda q, k, v, seg: kernel(q, k, v, segment_ids=seg)  # noqa: E731
    else:
        q = q.reshape(b, kv, group, t, h)

        def per_row(q: Any, k: Any, v: Any, seg: Any) -> Any:
            return jax.vmap(lambda q, k, v: kernel(q, k, v, segment_ids=seg))(q, k, v)

    try:
        with jax.numpy_dtype_promotion("standard"):
            out = jax.vmap(per_row)(q, k, v, segments)
    except (ValueError, NotImplementedError) as e:
        raise Unavailable(f"splash refused these inputs: {e}") from e
    return out.reshape(b, n, t, h).transpose(0, 2, 1, 3)
