"""float8 matmuls for training: ``fp8_dot`` and ``matmul``, where layers multiply by a weight
(a mixture of experts' routed experts: ``_fp8_experts``).

Each operand is scaled from its absolute maximum into the float8 range and cast (e4m3 for inputs
and weights, e5m2 for the gradient coming back); the product is written in one of the two forms
XLA's GEMM rewriter turns into cuBLASLt float8 GEMMs on Hopper GPUs (``TENSOR_FORM``):

- ``"operands"`` (the default, tensor scaling): each float8 operand converted to the compute
  dtype and multiplied by its scale, a value of the compute dtype, before a plain ``dot``. The
  rewriter takes the scales as the GEMM's operand scales and the GEMM writes the compute dtype.
  This is the form flax's float8 ops write. A float16 computation cannot hold the scales (those
  of gradients and small weights are below its smallest number): it takes the ``"output"`` form.
- ``"output"``: a ``dot`` of the float8 operands with a float32 result
  (``preferred_element_type``), multiplied by the product of the scales. The rewriter folds the
  scales in too, but the GEMM writes float32, which a second pass reads to cast: for the 1b model
  about 6 G elements a step, ~50 GB of extra memory traffic, which is the size of the float8 step's
  measured loss against bfloat16 (0.92x on an H100, this form). ``row`` scaling always uses it:
  one scale per row of the matmul (an activation per token, a weight per output channel; for the
  gradients per row of their own matmuls) multiplies the float32 result.

``benchmarks/accelerator.py --fp8-form`` times either. On other backends XLA computes the same
program by upcasting, which is how CPUs emulate it. A ``custom_vjp`` runs the backward matmuls the
same way with the gradient in e5m2, so parameters and their gradients never see float8.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from .._array import NamedArray
from .._mesh import explicit_axes
from .._ops.contract import dot
from .._partitioning._held import held_placed
from .._partitioning._shard import auto_sharded
from ._common import param
from ._precision import current_precision
from ._quantized import QuantizedArray, quantize, scaling_dtype

__all__ = ["E4M3", "E5M2", "fp8_dot", "matmul"]

E4M3, E5M2 = jnp.dtype(jnp.float8_e4m3fn), jnp.dtype(jnp.float8_e5m2)
F32 = jnp.dtype(jnp.float32)
#: How a tensor-scaled float8 matmul is written for XLA: "operands" or "output" (module docstring).
TENSOR_FORM = "operands"


def _scaled(
    qa: NamedArray, sa: NamedArray, qb: NamedArray, sb: NamedArray, axis: tuple[str, ...],
    out_dtype: Any, out_axes: Sequence[str],
) -> NamedArray:  # fmt: skip
    """``a . b`` over ``axis`` from their float8 values and scales, scaled back, in ``out_dtype``."""
    if sa.ndim == 0 and sb.ndim == 0 and _operands_form(False, out_dtype):
        da, db = (q.astype(out_dtype) * s.astype(out_dtype) for q, s in ((qa, sa), (qb, sb)))
        return dot(da, db, axis=axis, out_axes=out_axes)
    y = dot(qa, qb, axis=axis, preferred_element_type=F32, out_axes=out_axes)
    return (y * (sa * sb)).astype(out_dtype)


def _operands_form(row: bool, dtype: Any) -> bool:
    """Whether a product in ``dtype`` takes the "operands" form: tensor scaling, with scales that
    ``dtype`` holds (not float16's: ``scaling_dtype``); else the "output" form, float32 scales."""
    return not row and TENSOR_FORM == "operands" and scaling_dtype(dtype) == jnp.dtype(dtype)


def _quantized(a: NamedArray, axis: tuple[str, ...], row: bool, fmt: Any, dtype: Any) -> Any:
    """``a`` in ``fmt`` and its scales: one, or with ``row`` one per slice along the axes of ``a``
    outside ``axis`` (the matmul's contraction). The "operands" form scales in ``dtype`` (the
    product's), and XLA takes that scale as the GEMM's: it is a ``dtype`` value, so that the GEMM
    scales by exactly what the operand was quantized with."""
    keep = [n for n in a.axis_names if n not in axis] if row else ()
    return quantize(a, keep, fmt, dtype if _operands_form(row, dtype) else None)


def _gathered(w: NamedArray, axis: tuple[str, ...], row: bool, dtype: Any) -> Any:
    """The weight quantized to e4m3 where the parameter mapping holds it, then placed by the
    compute mapping: an FSDP gather moves float8 (torchao's float8 all-gather), not the compute
    or parameter dtype. Quantized from the parameter itself, not from a compute-dtype copy."""
    qw, sw = _quantized(w, axis, row, E4M3, dtype)
    return auto_sharded(held_placed(qw)), auto_sharded(held_placed(sw))


def _explicit_sharding(w: NamedArray) -> Any:
    """The weight's sharding on an Explicit mesh (where its gradient must match it), else None."""
    sharding = jax.typeof(w.array).sharding
    mesh = getattr(sharding, "mesh", None)
    return sharding if mesh is not None and explicit_axes(mesh) else None


def fp8_dot(
    x: NamedArray, w: NamedArray, axis: tuple[str, ...], row: bool, compute: Any = None
) -> NamedArray:
    """``dot(x, w, axis=axis)`` in float8 (e4m3 forward, e5m2 gradient), ``row`` or tensor
    scaling, the weight read as a layer reads a parameter: quantized where it is held, then
    placed by the mapping in force. The result is in ``x``'s dtype promoted with ``compute`` (the
    dtype the weight is computed in; default its own), with ``x``'s other axes first; the
    weight's gradient comes back in its own dtype and, on an Explicit mesh, its own sharding."""
    held = (jnp.dtype(w.dtype), _explicit_sharding(w))
    return _fp8_dot(x, w, axis, row, jnp.dtype(compute or w.dtype), held)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5))
def _fp8_dot(
    x: NamedArray, w: NamedArray, axis: tuple[str, ...], row: bool, compute: Any, held: Any
) -> NamedArray:
    return _forward(x, w, axis, row, compute)[0]


def _forward(x: NamedArray, w: NamedArray, axis: tuple[str, ...], row: bool, compute: Any) -> Any:
    out_axes = [n for n in x.axis_names if n not in axis] + [
        n for n in w.axis_names if n not in axis
    ]
    dtype = jnp.promote_types(x.dtype, compute)
    qw, sw = _gathered(w, axis, row, dtype)
    qx, sx = _quantized(x, axis, row, E4M3, dtype)
    y = _scaled(qx, sx, qw, sw, axis, dtype, out_axes)
    return y, qw, sw


def _fwd(x: NamedArray, w: NamedArray, axis: Any, row: bool, compute: Any, held: Any) -> Any:
    y, qw, sw = _forward(x, w, axis, row, compute)
    # Tensor scaling multiplies the backward's dx by the same float8 weight; row scaling needs
    # other scales (one per row of dx's matmul), quantized again from the weight.
    return y, (x, w if row else None, qw, sw)


def _bwd(axis: Any, row: bool, compute: Any, held: Any, res: Any, g: NamedArray) -> Any:
    x, w, qw, sw = res
    out = tuple(n for n in qw.axis_names if n not in axis)  # the layer's output axes
    tokens = tuple(n for n in x.axis_names if n not in axis)
    if row:
        qw, sw = _gathered(w, out, row, x.dtype)
    dx = _scaled(*_quantized(g, out, row, E5M2, x.dtype), qw, sw, out, x.dtype, x.axis_names)
    dw = _scaled(
        *_quantized(x, tokens, row, E4M3, compute), *_quantized(g, tokens, row, E5M2, compute),
        tokens, compute, qw.axis_names,
    )  # fmt: skip
    # Back where the weight is held, as a parameter's gradient comes back through param's
    # placement, then in its own dtype (the reduction over the batch moves the product's dtype:
    # the compute dtype in the "operands" form, float32 in the "output" form).
    dtype, sharding = held
    dw = auto_sharded(dw)
    if sharding is not None:
        dw = NamedArray(jax.sharding.reshard(dw.array, sharding), dw.axes)
    return dx, dw.astype(dtype)


_fp8_dot.defvjp(_fwd, _bwd)


def matmul(x: NamedArray, w: Any, axis: tuple[str, ...]) -> NamedArray:
    """A layer's product of its input and a weight over ``axis``, the weight read here: in float8
    when the policy in force picks the layer by the names of the weight's axes (quantized before
    an FSDP gather); a :class:`QuantizedArray` as its narrow values, scaled after the ``dot``;
    else :func:`param`'s weight (compute dtype, placed) and a plain ``dot``."""
    policy = current_precision()
    # Every layer asks the policy, a quantized one too (already narrow: the answer is not used),
    # so that the block checks its rules against every layer that ran.
    float8 = isinstance(w, (NamedArray, QuantizedArray)) and policy.float8(w.axis_names)
    if isinstance(w, NamedArray) and float8:
        return fp8_dot(x, w, tuple(axis), policy.scaling == "row", policy.compute)
    if isinstance(w, QuantizedArray) and not set(w.scale.axis_names) & set(axis):
        # Narrow weights (inference): the dot reads the narrow values, only converted (the operand
        # a mixed-dtype GEMM fuses), and the per-channel scales, on output axes, multiply its
        # result instead of the whole weight; in float32 where the compute dtype cannot hold
        # them (float16), with the dot's result in float32 too (float8's 448s overflow float16).
        dtype = policy.compute or w.dtype
        out = jnp.promote_types(x.dtype, dtype)
        wide = scaling_dtype(out)
        values, scale = w.placed()
        y = dot(x, values.astype(dtype), axis=axis, preferred_element_type=wide)
        return (y * scale.astype(wide)).astype(out)
    return dot(x, param(w), axis=axis)
