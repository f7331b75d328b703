"""float8 matmuls for training: ``fp8_dot`` and ``matmul``, the one place layers multiply by a weight.

Each operand is scaled from its absolute maximum into the float8 range, cast (e4m3 for inputs and
weights, e5m2 for the gradient coming back), multiplied with a float32 result
(``preferred_element_type``) and scaled back. This is the form XLA turns into cuBLASLt float8
GEMMs on Hopper GPUs (a ``dot`` of float8 operands whose float32 result is multiplied by the
product of the scalar scales, which it folds into the GEMM); on other backends XLA computes the
same program by upcasting, which is how CPUs emulate it. With ``row`` scaling each operand has one
scale per row of the matmul (an activation per token, a weight per output channel; for the
gradients per row of their own matmuls), the scales multiplying the float32 result. A
``custom_vjp`` runs the backward matmuls the same way with the gradient in e5m2; the inputs are
kept in the compute dtype for it, so parameters and their gradients never see float8.

``TENSOR_FORM`` says how tensor scaling is written: ``"output"`` as above, or ``"operands"``: each
float8 operand converted to the compute dtype and multiplied by its scalar scale before a plain
``dot`` (the dequantize-then-matmul form XLA's GEMM rewriter also matches, taking the scales as the
GEMM's operand scales and writing the compute dtype directly). ``benchmarks/accelerator.py
--fp8-form`` times both.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from .._array import NamedArray
from .._ops.contract import dot
from ._precision import current_precision
from ._quantized import quantize

__all__ = ["E4M3", "E5M2", "fp8_dot", "matmul"]

E4M3, E5M2 = jnp.dtype(jnp.float8_e4m3fn), jnp.dtype(jnp.float8_e5m2)
F32 = jnp.dtype(jnp.float32)
#: How a tensor-scaled float8 matmul is written for XLA: "output" or "operands" (module docstring).
TENSOR_FORM = "output"


def _scaled_dot(
    a: NamedArray, b: NamedArray, axis: tuple[str, ...], dtypes: tuple[Any, Any], row: bool,
    out_dtype: Any, out_axes: Sequence[str],
) -> NamedArray:  # fmt: skip
    """``a . b`` over ``axis`` from float8 copies of both, scaled back, in ``out_dtype``."""
    qa, sa = quantize(a, [n for n in a.axis_names if n not in axis] if row else (), dtypes[0])
    qb, sb = quantize(b, [n for n in b.axis_names if n not in axis] if row else (), dtypes[1])
    if not row and TENSOR_FORM == "operands":
        da, db = (q.astype(out_dtype) * s.astype(out_dtype) for q, s in ((qa, sa), (qb, sb)))
        return dot(da, db, axis=axis, out_axes=out_axes)
    y = dot(qa, qb, axis=axis, preferred_element_type=F32, out_axes=out_axes)
    return (y * (sa * sb)).astype(out_dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def fp8_dot(x: NamedArray, w: NamedArray, axis: tuple[str, ...], row: bool) -> NamedArray:
    """``dot(x, w, axis=axis)`` in float8 (e4m3 forward, e5m2 gradient), ``row`` or tensor
    scaling; the result in ``x``'s and ``w``'s promoted dtype, with ``x``'s other axes first."""
    return _forward(x, w, axis, row)


def _forward(x: NamedArray, w: NamedArray, axis: tuple[str, ...], row: bool) -> NamedArray:
    out_axes = [n for n in x.axis_names if n not in axis] + [
        n for n in w.axis_names if n not in axis
    ]
    dtype = jnp.promote_types(x.dtype, w.dtype)
    return _scaled_dot(x, w, axis, (E4M3, E4M3), row, dtype, out_axes)


def _fwd(x: NamedArray, w: NamedArray, axis: tuple[str, ...], row: bool) -> Any:
    return _forward(x, w, axis, row), (x, w)


def _bwd(axis: tuple[str, ...], row: bool, res: Any, g: NamedArray) -> Any:
    x, w = res
    out = tuple(n for n in w.axis_names if n not in axis)  # the layer's output axes
    tokens = tuple(n for n in x.axis_names if n not in axis)
    dx = _scaled_dot(g, w, out, (E5M2, E4M3), row, x.dtype, x.axis_names)
    dw = _scaled_dot(x, g, tokens, (E4M3, E5M2), row, w.dtype, w.axis_names)
    return dx, dw


fp8_dot.defvjp(_fwd, _bwd)


def matmul(x: NamedArray, w: NamedArray, axis: tuple[str, ...]) -> NamedArray:
    """A layer's product of its input and a weight over ``axis``: in float8 when the policy in
    force picks the layer by the names of the weight's axes, else a plain ``dot``."""
    policy = current_precision()
    if policy.float8(w.axis_names):
        return fp8_dot(x, w, tuple(axis), policy.scaling == "row")
    return dot(x, w, axis=axis)
