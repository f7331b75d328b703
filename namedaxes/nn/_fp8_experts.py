"""float8 products of a mixture of experts' routed experts (``MoE`` under ``matmul="float8"``).

Every expert product of ``_moe_dispatch`` is bilinear in rows ``a (..., K)`` and the experts'
weights ``w (E, K, N)``, contracting the rows' last axis with the weights' middle one: the grouped
products (``ragged_dot``, ``grouped_matmul``), the dense dispatch's and the capacity dispatch's
batched ones alike. :func:`float8_product` runs one of them with the numbers of ``fp8_dot``
(``nn/_fp8.py``): rows and weights in e4m3, the gradient coming back in e5m2, each scaled from its
absolute maximum, per tensor or (``row``) per row of each product: forward, a scale per row of
``a`` and per expert and output column of ``w``; for the rows' gradient, per row of the incoming
gradient and per expert and input column of ``w``; for the weights' gradient, per column of ``a``
and of the incoming gradient.

The maxima are those of the whole arrays the layer would have on one device: this runs inside the
layer's ``shard_map``, so each is also taken (``pmax``) over the mesh axes that split what it
reduces, and a sharded layer computes with the scales of the unsharded one.

The float8 values are converted to the compute dtype and scaled before the product, because the
grouped kernels and ``ragged_dot`` take no float8 operands: these are float8's numbers, with none
of its speed on the grouped dispatches (on the dense and capacity dispatches, with tensor
scaling, the product has the form XLA's GEMM rewriter turns into float8 GEMMs; not measured). A
float8 Pallas grouped kernel was tried and left out: Pallas's Triton lowering gives a float8 dot
no ``max_num_imprecise_acc``, and without it Triton (3.9, sm_90) compiles it to ``mma.sync`` on
float16, slower than the bfloat16 ``wgmma`` the kernels run now.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from ._fp8 import E4M3, E5M2
from ._quantized import quantize_array, scaling_dtype

__all__ = ["Float8", "float8_product"]


@dataclasses.dataclass(frozen=True)
class Float8:
    """How one expert product runs in float8 (static).

    Attributes:
        row: Row scaling (else one scale per tensor).
        every: The mesh axes that split the layer's tokens, experts or hidden axes.
        split_k: Those that split the product's contraction ``K``.
        split_n: Those that split its output columns ``N``.
        dtypes: The dtypes of ``a`` and ``w`` (their gradients come back in them).
    """

    row: bool
    every: tuple[str, ...] = ()
    split_k: tuple[str, ...] = ()
    split_n: tuple[str, ...] = ()
    dtypes: tuple[Any, Any] = (None, None)


def _but(axes: tuple[str, ...], drop: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(a for a in axes if a not in drop)


def _narrow(x: jax.Array, reduce: tuple[int, ...], fmt: Any, across: tuple[str, ...]) -> Any:
    """``x`` in ``fmt`` and its scale (a value of ``x``'s :func:`scaling_dtype`, so that scaling
    by it in that dtype is exact), one per slice along ``reduce`` (all axes: one)."""
    return quantize_array(x, reduce, fmt, x.dtype, across)


def _wide(q: jax.Array, scale: jax.Array, dtype: Any) -> jax.Array:
    """``q`` scaled back, in ``dtype``: the product taken in :func:`scaling_dtype` (float32 for
    float16, which cannot hold small scales; the scaled values it can)."""
    wide = scaling_dtype(dtype)
    return (q.astype(wide) * scale.astype(wide)).astype(dtype)


def _all(x: jax.Array) -> tuple[int, ...]:
    return tuple(range(x.ndim))


def _leading(x: jax.Array) -> tuple[int, ...]:
    return tuple(range(x.ndim - 1))


def float8_product(
    fn: Callable[..., jax.Array], cfg: Float8, a: jax.Array, w: jax.Array, *extra: jax.Array
) -> jax.Array:
    """``fn(a, w, *extra)`` with float8 operands (e4m3; the gradient e5m2), in the dtype of
    ``a`` and ``w`` promoted; ``extra`` (e.g. the group sizes) is passed through, not
    differentiated.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> a, w = jnp.ones((3, 4)), jnp.full((2, 4, 5), 0.5)
        >>> y = float8_product(lambda a, w: jnp.einsum("th,ehi->tei", a, w), Float8(False), a, w)
        >>> y.shape, float(y[0, 0, 0])
        ((3, 2, 5), 2.0)
    """
    cfg = dataclasses.replace(cfg, dtypes=(jnp.dtype(a.dtype), jnp.dtype(w.dtype)))
    return _product(fn, cfg, a, w, extra)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _product(fn: Any, cfg: Float8, a: jax.Array, w: jax.Array, extra: tuple[Any, ...]) -> Any:
    return _fwd(fn, cfg, a, w, extra)[0]


def _fwd(fn: Any, cfg: Float8, a: jax.Array, w: jax.Array, extra: tuple[Any, ...]) -> Any:
    dtype = jnp.promote_types(a.dtype, w.dtype)
    a, w = a.astype(dtype), w.astype(dtype)
    if cfg.row:  # a per row, w per expert and output column: both reduce K
        qa, sa = _narrow(a, (a.ndim - 1,), E4M3, cfg.split_k)
        qw, sw = _narrow(w, (1,), E4M3, cfg.split_k)
    else:
        qa, sa = _narrow(a, _all(a), E4M3, cfg.every)
        qw, sw = _narrow(w, _all(w), E4M3, cfg.every)
    y = fn(_wide(qa, sa, dtype), _wide(qw, sw, dtype), *extra)
    # Tensor scaling multiplies the gradient by the same float8 operands; row scaling needs other
    # scales (the backward products' rows), quantized again from the operands.
    saved = (a, w) if cfg.row else (qa, sa, qw, sw)
    return y, (extra, saved)


def _bwd(fn: Any, cfg: Float8, res: Any, g: jax.Array) -> Any:
    extra, saved = res
    dtype = g.dtype
    if cfg.row:
        a, w = saved
        qw, sw = _narrow(w, (2,), E4M3, cfg.split_n)  # dx contracts N
        qa, sa = _narrow(a, _leading(a), E4M3, _but(cfg.every, cfg.split_k))  # dw: the rows
        g_rows = _narrow(g, (g.ndim - 1,), E5M2, cfg.split_n)
        g_cols = _narrow(g, _leading(g), E5M2, _but(cfg.every, cfg.split_n))
    else:
        qa, sa, qw, sw = saved
        g_rows = g_cols = _narrow(g, _all(g), E5M2, cfg.every)
    _, pull = jax.vjp(lambda a_, w_: fn(a_, w_, *extra), _wide(qa, sa, dtype), _wide(qw, sw, dtype))
    da, dw = pull(_wide(*g_rows, dtype))
    if cfg.row:  # the weights' gradient from the gradient's columns (the other half is unused)
        dw = pull(_wide(*g_cols, dtype))[1]
    a_dtype, w_dtype = cfg.dtypes
    return da.astype(a_dtype), dw.astype(w_dtype), tuple(None for _ in extra)


_product.defvjp(_fwd, _bwd)
