"""Flash attention that returns the log-sum-exp: for the blocks of ring attention, and alone.

Layout as in ``jax.nn.dot_product_attention``: queries ``(B, T, N, H)``, keys and values
``(B, S, K, H)`` with ``K`` dividing ``N`` (query head ``n`` uses key/value head ``n // (N // K)``).
Under ``causal`` query ``t`` sits at key position ``t + offset`` (``offset`` may be negative, or
past the keys, and known only at run time) and sees keys ``j <= t + offset``; a ``window`` ``w``
keeps keys ``t + offset - w < j`` too. A query that sees no key gives 0 and a log-sum-exp of
float32's lowest finite value (not ``-inf``: a merge by ``logaddexp`` stays finite).

Three Pallas kernels, lowered by Triton on GPUs (in interpret mode elsewhere: slow, for tests):
the forward pass (per query tile, an online softmax over the key tiles the tile sees), and the
backward pass given the log-sum-exp and ``delta = rowsum(d_out * out)`` of the *whole* softmax
(which may span more keys than these: a ring's other blocks), as two kernels, one per key tile
(the key and value gradients, over the query tiles and the query heads of its key/value head)
and one per query tile (the query gradient). Tiles no query of them sees are never visited.
Every product accumulates in float32. The plain-JAX reference is beside them.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from .._errors import KernelError
from ._tiles import pad_to, tile_size

__all__ = ["flash_attention", "flash_attention_reference"]

F32 = jnp.float32
LOWEST = float(jnp.finfo(F32).min)  # the log-sum-exp of a query that sees no key
# (queries, keys) per tile on GPUs: powers of 2, as Triton needs. Untuned: the GPU session's
# benchmark (benchmarks/ring_block.py) decides.
GPU_BLOCKS = (64, 64)
_TRITON = plgpu.CompilerParams(num_warps=4, num_stages=2)
_HIGHEST = jax.lax.Precision.HIGHEST  # float32 operands as IEEE products on GPUs (not TF32)
_NT = (((1,), (1,)), ((), ()))  # a @ b.T
_TN = (((0,), (0,)), ((), ()))  # a.T @ b
_NN = (((1,), (0,)), ((), ()))  # a @ b


@dataclasses.dataclass(frozen=True)
class Options:
    """The static settings of one call: the softmax ``scale``, ``causal``, ``window``, the real
    query and key counts ``t`` and ``s`` (before padding to whole tiles), the tiles, the query
    heads per key/value head, and interpret mode."""

    scale: float
    causal: bool
    window: int | None
    t: int
    s: int
    bq: int
    bk: int
    groups: int
    interpret: bool


def options(
    q: jax.Array, k: jax.Array, v: jax.Array, *, scale: float, causal: bool, window: int | None,
    blocks: tuple[int, int] | None = None, interpret: bool | None = None,
) -> Options:  # fmt: skip
    """Checks the operands and settles the static settings (tiles: ``blocks``, else
    ``GPU_BLOCKS``, each clipped to a small length; interpret mode off GPUs by default)."""
    _check(q, k, v)
    window, blocks = _window(window), _blocks(blocks)
    t, s = q.shape[1], k.shape[1]
    bq, bk = blocks or GPU_BLOCKS
    interpret = jax.default_backend() != "gpu" if interpret is None else bool(interpret)
    return Options(
        float(scale), bool(causal or window is not None), window, t, s, tile_size(t, bq),
        tile_size(s, bk), q.shape[2] // k.shape[2], interpret,
    )  # fmt: skip


def _int(x: Any) -> int | None:
    """``x`` as an int when it is an integer (Python's, NumPy's or a concrete array's of shape
    ``()``; not a bool), else ``None``."""
    if isinstance(x, bool) or getattr(x, "dtype", None) == np.bool_:
        return None
    try:
        return operator.index(x)
    except TypeError:
        return None


def _check(q: Any, k: Any, v: Any) -> None:
    """Checks the operands' ranks, shapes and dtypes."""
    shapes = f"q {q.shape} {q.dtype}, k {k.shape} {k.dtype}, v {v.shape} {v.dtype}"
    problem = None
    if q.ndim != 4 or k.ndim != 4 or k.shape != v.shape:
        problem = "needs q (B, T, N, H) and k, v of one shape (B, S, K, H)"
    elif q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        problem = "needs one batch size and one head size H for q, k and v"
    elif k.shape[2] == 0 or q.shape[2] % k.shape[2]:
        problem = "needs at least one key/value head, and key/value heads K dividing query heads N"
    elif len({q.dtype, k.dtype, v.dtype}) > 1 or q.dtype not in (F32, jnp.bfloat16, jnp.float16):
        problem = "needs q, k and v of one dtype: float32, bfloat16 or float16"
    if problem:
        raise KernelError(f"flash_attention {problem}; got {shapes}.")


def _window(window: Any) -> int | None:
    """``window`` as an int: ``None``, or a positive integer (Python's or NumPy's)."""
    size = _int(window)
    if window is not None and (size is None or size < 1):
        raise KernelError(
            f"flash_attention needs a positive int window, got {window!r}; pass the number of "
            "keys each query sees, or None for no window."
        )
    return size


def _blocks(blocks: Any) -> tuple[int, int] | None:
    """``blocks`` as two ints: ``None``, or two powers of 2 of at least 16."""
    if blocks is None:
        return None
    tiles = [_int(b) for b in blocks] if isinstance(blocks, tuple) else []
    sizes = [b for b in tiles if b is not None and b >= 16 and b & (b - 1) == 0]
    if len(sizes) != 2 or len(tiles) != 2:
        raise KernelError(
            f"flash_attention needs blocks of two powers of 2 of at least 16, got {blocks!r}; "
            f"pass (queries, keys) per tile, e.g. {GPU_BLOCKS}."
        )
    return sizes[0], sizes[1]


def _offset(offset: Any) -> jax.Array:
    """``offset`` as an int32 scalar: an int, or an integer array of shape ``()`` (traced too)."""
    if isinstance(offset, jax.Array | np.ndarray):
        ok = offset.shape == () and jnp.issubdtype(offset.dtype, jnp.integer)
    else:
        value = _int(offset)
        ok = value is not None and -(2**31) <= value < 2**31
    if not ok:
        raise KernelError(
            f"flash_attention needs an integer offset (an int in int32's range, or an integer "
            f"array of shape (), traced is fine), got {offset!r}; pass the key position of "
            "query 0."
        )
    return _i32(offset)


def _head(x: jax.Array) -> jax.Array:
    """The head size padded to a power of 2 of at least 16 (zeros change no product)."""
    return pad_to(x, x.ndim - 1, max(16, pl.next_power_of_2(x.shape[-1])))


def _i32(x: Any) -> jax.Array:
    return jnp.asarray(x, jnp.int32)


def _clip(x: Any, hi: int) -> jax.Array:
    return jnp.minimum(jnp.maximum(_i32(x), 0), hi)


# Which tiles a tile sees: one test for the loops' bounds, the masks decide per element.
def _key_tiles(o: Options, i: Any, offset: Any) -> tuple[jax.Array, jax.Array]:
    """The key tiles ``[lo, hi)`` that query tile ``i`` sees."""
    tiles = pl.cdiv(o.s, o.bk)
    if not o.causal:
        return _i32(0), _i32(tiles)
    first = i * o.bq + offset  # key position of the tile's first query
    hi = (_clip(first + o.bq, o.s) + o.bk - 1) // o.bk
    lo = _i32(0) if o.window is None else _clip(first - o.window + 1, o.s) // o.bk
    return lo, hi


def _query_tiles(o: Options, j: Any, offset: Any) -> tuple[jax.Array, jax.Array]:
    """The query tiles ``[lo, hi)`` that see key tile ``j``."""
    tiles = pl.cdiv(o.t, o.bq)
    if not o.causal:
        return _i32(0), _i32(tiles)
    lo = _clip(j * o.bk - offset, o.t) // o.bq
    if o.window is None:
        return lo, _i32(tiles)
    return lo, (_clip(j * o.bk + o.bk - 1 - offset + o.window, o.t) + o.bq - 1) // o.bq


def _allowed(o: Options, i: Any, j: Any, offset: Any) -> jax.Array:
    """``(bq, bk)``: which queries of tile ``i`` see which keys of tile ``j`` (real ones only)."""
    row = i * o.bq + jax.lax.broadcasted_iota(jnp.int32, (o.bq, o.bk), 0)
    col = j * o.bk + jax.lax.broadcasted_iota(jnp.int32, (o.bq, o.bk), 1)
    ok = (row < o.t) & (col < o.s)
    if o.causal:
        at = row + offset
        ok = ok & (col <= at)
        if o.window is not None:
            ok = ok & (col > at - o.window)
    return ok


def _dot(a: jax.Array, b: jax.Array, dims: Any) -> jax.Array:
    return jax.lax.dot_general(a, b, dims, precision=_HIGHEST, preferred_element_type=F32)


def _loop(lo: jax.Array, hi: jax.Array, body: Any, init: Any) -> Any:
    # Both bounds strongly int32: Triton's scf.for needs one type for its bounds.
    return jax.lax.fori_loop(
        lo.astype(jnp.int32), jnp.maximum(lo, hi).astype(jnp.int32), body, init
    )


def _rows(o: Options, i: Any) -> Any:
    return pl.ds(pl.multiple_of(i * o.bq, o.bq), o.bq)


def _cols(o: Options, j: Any) -> Any:
    return pl.ds(pl.multiple_of(j * o.bk, o.bk), o.bk)


# -- kernels ---------------------------------------------------------------------------------------


def _forward_kernel(
    off_ref: Any, q_ref: Any, k_ref: Any, v_ref: Any, o_ref: Any, lse_ref: Any, *, o: Options
) -> None:
    b, n, i = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    kv, offset = n // o.groups, off_ref[0]
    q = q_ref[b, _rows(o, i), n, :]
    h = q.shape[-1]

    def step(j: jax.Array, carry: Any) -> Any:
        top, total, acc = carry
        k, v = k_ref[b, _cols(o, j), kv, :], v_ref[b, _cols(o, j), kv, :]
        ok = _allowed(o, i, j, offset)
        s = jnp.where(ok, _dot(q, k, _NT) * o.scale, LOWEST)
        new = jnp.maximum(top, s.max(axis=1))
        p = jnp.where(ok, jnp.exp(s - new[:, None]), 0.0)
        keep = jnp.exp(top - new)
        acc = acc * keep[:, None] + _dot(p.astype(v.dtype), v, _NN)
        return new, total * keep + p.sum(axis=1), acc

    lo, hi = _key_tiles(o, i, offset)
    init = (jnp.full((o.bq,), LOWEST, F32), jnp.zeros((o.bq,), F32), jnp.zeros((o.bq, h), F32))
    top, total, acc = _loop(lo, hi, step, init)
    seen = total > 0
    total = jnp.where(seen, total, 1.0)
    o_ref[b, _rows(o, i), n, :] = jnp.where(seen[:, None], acc / total[:, None], 0.0).astype(
        o_ref.dtype
    )
    lse_ref[b, n, _rows(o, i)] = jnp.where(seen, top + jnp.log(total), LOWEST)


def _probabilities(o: Options, q: Any, k: Any, lse: Any, i: Any, j: Any, offset: Any) -> Any:
    """``p = exp(s - lse)`` of the tile pair, 0 where a query does not see a key."""
    s = _dot(q, k, _NT) * o.scale
    ok = _allowed(o, i, j, offset)
    return jnp.where(ok, jnp.exp(jnp.where(ok, s, 0.0) - lse[:, None]), 0.0)


def _dkdv_kernel(
    off_ref: Any, q_ref: Any, k_ref: Any, v_ref: Any, do_ref: Any, lse_ref: Any,
    delta_ref: Any, dk_ref: Any, dv_ref: Any, *, o: Options,
) -> None:  # fmt: skip
    b, kv, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    offset = off_ref[0]
    k, v = k_ref[b, _cols(o, j), kv, :], v_ref[b, _cols(o, j), kv, :]
    lo, hi = _query_tiles(o, j, offset)

    def head(g: jax.Array, carry: Any) -> Any:
        n = kv * o.groups + g

        def step(i: jax.Array, carry: Any) -> Any:
            dk, dv = carry
            q, do = q_ref[b, _rows(o, i), n, :], do_ref[b, _rows(o, i), n, :]
            p = _probabilities(o, q, k, lse_ref[b, n, _rows(o, i)], i, j, offset)
            dv = dv + _dot(p.astype(do.dtype), do, _TN)
            dp = _dot(do, v, _NT)
            ds = p * (dp - delta_ref[b, n, _rows(o, i)][:, None]) * o.scale
            return dk + _dot(ds.astype(q.dtype), q, _TN), dv

        return _loop(lo, hi, step, carry)

    zeros = jnp.zeros(k.shape, F32)
    dk, dv = _loop(_i32(0), _i32(o.groups), head, (zeros, zeros))
    dk_ref[b, _cols(o, j), kv, :] = dk
    dv_ref[b, _cols(o, j), kv, :] = dv


def _dq_kernel(
    off_ref: Any, q_ref: Any, k_ref: Any, v_ref: Any, do_ref: Any, lse_ref: Any,
    delta_ref: Any, dq_ref: Any, *, o: Options,
) -> None:  # fmt: skip
    b, n, i = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    kv, offset = n // o.groups, off_ref[0]
    q, do = q_ref[b, _rows(o, i), n, :], do_ref[b, _rows(o, i), n, :]
    lse, delta = lse_ref[b, n, _rows(o, i)], delta_ref[b, n, _rows(o, i)]

    def step(j: jax.Array, dq: jax.Array) -> jax.Array:
        k, v = k_ref[b, _cols(o, j), kv, :], v_ref[b, _cols(o, j), kv, :]
        p = _probabilities(o, q, k, lse, i, j, offset)
        ds = p * (_dot(do, v, _NT) - delta[:, None]) * o.scale
        return dq + _dot(ds.astype(k.dtype), k, _NN)

    lo, hi = _key_tiles(o, i, offset)
    dq_ref[b, _rows(o, i), n, :] = _loop(lo, hi, step, jnp.zeros(q.shape, F32))


# -- the calls -------------------------------------------------------------------------------------


def _operands(o: Options, q: jax.Array, k: jax.Array, v: jax.Array) -> tuple[jax.Array, ...]:
    """``q``, ``k``, ``v`` padded to whole tiles and a power-of-2 head size."""
    return _head(pad_to(q, 1, o.bq)), _head(pad_to(k, 1, o.bk)), _head(pad_to(v, 1, o.bk))


def _call(kernel: Any, o: Options, grid: tuple[int, ...], out_shape: Any, *args: Any) -> Any:
    return pl.pallas_call(
        functools.partial(kernel, o=o), out_shape=out_shape, grid=grid,
        compiler_params=_TRITON, interpret=o.interpret,
    )(*args)  # fmt: skip


def forward(
    o: Options, q: jax.Array, k: jax.Array, v: jax.Array, offset: Any, out_dtype: Any = None
) -> tuple[jax.Array, jax.Array]:
    """The output ``(B, T, N, H)`` (in ``out_dtype``, default the value's) and the log-sum-exp
    ``(B, N, T)`` in float32 of one call."""
    b, t, n, h = q.shape
    if not b * t * n * k.shape[1]:  # nothing to attend: no query sees a key (0 and LOWEST)
        return jnp.zeros(q.shape, out_dtype or v.dtype), jnp.full((b, n, t), LOWEST, F32)
    qp, kp, vp = _operands(o, q, k, v)
    tp = qp.shape[1]
    out, lse = _call(
        _forward_kernel, o, (b, n, tp // o.bq),
        (jax.ShapeDtypeStruct(qp.shape, out_dtype or v.dtype),
         jax.ShapeDtypeStruct((b, n, tp), F32)),
        _i32(offset).reshape(1), qp, kp, vp,
    )  # fmt: skip
    return out[:, :t, :, :h], lse[:, :, :t]


def backward(
    o: Options, q: jax.Array, k: jax.Array, v: jax.Array, offset: Any, d_out: jax.Array,
    lse: jax.Array, delta: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:  # fmt: skip
    """``(dq, dk, dv)`` in float32 of one call, given the whole softmax's log-sum-exp and
    ``delta = rowsum(d_out * out)`` (``(B, N, T)`` each): ``p = exp(s - lse)``, ``dv = p.T @
    d_out``, ``ds = p * (d_out @ v.T - delta) * scale``, ``dq = ds @ k``, ``dk = ds.T @ q``."""
    b, t, n, h = q.shape
    s, kv = k.shape[1], k.shape[2]
    if not b * t * n * s:  # no query sees a key: no gradient
        return jnp.zeros(q.shape, F32), jnp.zeros(k.shape, F32), jnp.zeros(v.shape, F32)
    qp, kp, vp = _operands(o, q, k, v)
    dop = _head(pad_to(d_out.astype(q.dtype), 1, o.bq))
    lse, delta = (pad_to(x.astype(F32), 2, o.bq) for x in (lse, delta))
    args = (_i32(offset).reshape(1), qp, kp, vp, dop, lse, delta)
    kv_shape = jax.ShapeDtypeStruct(kp.shape, F32)
    dk, dv = _call(_dkdv_kernel, o, (b, kv, kp.shape[1] // o.bk), (kv_shape, kv_shape), *args)
    dq = _call(
        _dq_kernel, o, (b, n, qp.shape[1] // o.bq), jax.ShapeDtypeStruct(qp.shape, F32), *args
    )
    return dq[:, :t, :, :h], dk[:, :s, :, :h], dv[:, :s, :, :h]


# -- the differentiable function -------------------------------------------------------------------


def flash_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    scale: float | None = None,
    causal: bool = False,
    offset: int | jax.Array = 0,
    window: int | None = None,
    blocks: tuple[int, int] | None = None,
    interpret: bool | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Attention and its log-sum-exp by a Pallas flash-attention kernel, forward and backward.

    ``out[b, t, n] = sum_j p[j] v[b, j, n // G]`` with ``p = softmax(q[b, t, n] . k[b, j, n // G]
    * scale)`` over the keys ``j`` the query sees (``G = N // K`` query heads per key/value head),
    and ``lse[b, n, t] = log(sum_j exp(scores))``. Differentiable in ``q``, ``k`` and ``v``
    through both outputs; products accumulate in float32.

    Args:
        q: ``(B, T, N, H)`` queries.
        k: ``(B, S, K, H)`` keys (``K`` dividing ``N``), the query's dtype.
        v: ``(B, S, K, H)`` values, the query's dtype (float32, bfloat16 or float16).
        scale: Multiplies the scores; default ``H ** -0.5``.
        causal: Query ``t`` sees keys ``j <= t + offset``.
        offset: The key position of query 0 (an int, or an integer array of shape ``()``,
            traced is fine; may be negative or past the keys). Only ``causal`` and ``window``
            read it.
        window: Keys ``t + offset - window < j <= t + offset`` (a positive int; implies
            ``causal``).
        blocks: A tuple ``(queries, keys)`` per tile, powers of 2 of at least 16 (clipped to
            short lengths); default ``GPU_BLOCKS``.
        interpret: Pallas interpret mode; default: off GPUs (slow, for tests).

    Returns:
        ``out`` ``(B, T, N, H)`` in the query's dtype (0 for a query that sees no key, as with
        no keys at all, ``S = 0``) and ``lse`` ``(B, N, T)`` in float32 (float32's lowest finite
        value for such a query), as the reference.

    Raises:
        KernelError: for operands of the wrong rank, shapes or dtypes, a window that is not a
            positive int, an offset that is not an integer scalar, or blocks that are not two
            powers of 2 of at least 16.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from namedaxes.kernels import flash_attention, flash_attention_reference
        >>> q = jax.random.normal(jax.random.key(0), (1, 16, 2, 16))
        >>> kv = jax.random.normal(jax.random.key(1), (1, 16, 1, 16))
        >>> out, lse = flash_attention(q, kv, kv, causal=True)  # interpret mode on a CPU
        >>> want, want_lse = flash_attention_reference(q, kv, kv, causal=True)
        >>> bool(jnp.allclose(out, want, atol=1e-5)), bool(jnp.allclose(lse, want_lse))
        (True, True)
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    o = options(q, k, v, scale=scale, causal=causal, window=window, blocks=blocks,
                interpret=interpret)  # fmt: skip
    return _flash(o, q, k, v, _offset(offset))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(o: Options, q: jax.Array, k: jax.Array, v: jax.Array, offset: jax.Array) -> Any:
    return forward(o, q, k, v, offset)


def _flash_fwd(o: Options, q: Any, k: Any, v: Any, offset: Any) -> Any:
    out, lse = forward(o, q, k, v, offset)
    return (out, lse), (q, k, v, offset, out, lse)


def _flash_bwd(o: Options, res: Any, grads: Any) -> Any:
    q, k, v, offset, out, lse = res
    d_out, d_lse = grads
    # d lse / d scores = p, so the log-sum-exp's cotangent joins delta: ds = p (dp - delta + d_lse)
    delta = jnp.einsum("btnh,btnh->bnt", d_out.astype(F32), out.astype(F32)) - d_lse
    dq, dk, dv = backward(o, q, k, v, offset, d_out, lse, delta)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


_flash.defvjp(_flash_fwd, _flash_bwd)


def flash_attention_reference(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    scale: float | None = None,
    causal: bool = False,
    offset: int | jax.Array = 0,
    window: int | None = None,
) -> tuple[jax.Array, jax.Array]:
    """The plain-JAX reference of :func:`flash_attention` (scores materialized, float32).

    Args:
        q: ``(B, T, N, H)`` queries.
        k: ``(B, S, K, H)`` keys.
        v: ``(B, S, K, H)`` values.
        scale: Multiplies the scores; default ``H ** -0.5``.
        causal: Query ``t`` sees keys ``j <= t + offset``.
        offset: The key position of query 0 (an int or an integer array of shape ``()``).
        window: Keys ``t + offset - window < j <= t + offset`` (a positive int; implies
            ``causal``).

    Returns:
        ``(out (B, T, N, H) in the query's dtype, lse (B, N, T) float32)``, as
        :func:`flash_attention`.

    Example:
        >>> import jax.numpy as jnp
        >>> from namedaxes.kernels import flash_attention_reference
        >>> out, lse = flash_attention_reference(jnp.ones((1, 2, 1, 4)), jnp.ones((1, 3, 1, 4)),
        ...                                      jnp.ones((1, 3, 1, 4)), causal=True, offset=-1)
        >>> out[0, :, 0, 0], lse[0, 0]  # query 0 sees no key; query 1 sees key 0 (score 2)
        (Array([0., 1.], dtype=float32), Array([-3.4028235e+38,  2.0000000e+00], dtype=float32))
    """
    b, t, n, h = q.shape
    s, kv = k.shape[1], k.shape[2]
    scale = h**-0.5 if scale is None else scale
    window, offset = _window(window), _offset(offset)  # as the kernel's checks
    qg = q.astype(F32).reshape(b, t, kv, n // kv, h)
    scores = jnp.einsum("btkgh,bskh->bkgts", qg, k.astype(F32), precision=_HIGHEST) * scale
    ok = jnp.ones((t, s), bool)
    if causal or window is not None:
        at = jnp.arange(t, dtype=jnp.int32)[:, None] + offset
        key = jnp.arange(s, dtype=jnp.int32)[None, :]
        ok = key <= at
        if window is not None:
            ok = ok & (key > at - window)
    scores = jnp.where(ok, scores, -jnp.inf)
    seen = ok.any(axis=1)
    lse = jnp.where(seen, jax.nn.logsumexp(jnp.where(seen[:, None], scores, 0.0), axis=-1), LOWEST)
    p = jnp.where(ok, jnp.exp(scores - lse[..., None]), 0.0)
    out = jnp.einsum("bkgts,bskh->btkgh", p, v.astype(F32), precision=_HIGHEST)
    return out.reshape(b, t, n, h).astype(q.dtype), lse.reshape(b, n, t)
