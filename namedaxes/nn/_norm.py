"""``LayerNorm`` and ``RmsNorm`` over named axes."""

from __future__ import annotations

import math
from typing import Any

import equinox as eqx
import jax.numpy as jnp

from .._array import NamedArray
from .._axis import Axis, AxisSpec
from .._errors import LayerError
from .._ops.creation import full, zeros
from .._ops.elementwise import rsqrt
from .._ops.reductions import mean
from ._common import (
    as_axes,
    check_dtype_float,
    expect_axes,
    expect_floating,
    output,
    place,
    real_number,
)
from ._precision import upcast

__all__ = ["LayerNorm", "RmsNorm"]


class _Norm(eqx.Module):
    """What both norms share: parameters over the normalized axes and the affine step after.

    Both compute in float32 at least (a bfloat16 input and bfloat16 parameters are upcast, as
    ``transformers`` does); the result has the input's dtype, or the policy's output dtype.
    """

    weight: NamedArray | None
    bias: NamedArray | None
    axis: tuple[Axis, ...] = eqx.field(static=True)
    eps: float = eqx.field(static=True)
    weight_offset: float = eqx.field(static=True)

    def __init__(
        self,
        axis: AxisSpec,
        eps: float,
        use_weight: bool,
        use_bias: bool,
        dtype: Any,
        weight_offset: float = 0.0,
    ) -> None:
        name = type(self).__name__
        value = real_number(eps)
        if value is None or not 0 <= value < math.inf:
            raise LayerError(
                f"{name} eps must be a finite number >= 0 (added under the square root), got "
                f"{eps!r}."
            )
        self.axis = as_axes(axis, f"{name} axis")
        self.eps = value
        self.weight_offset = float(weight_offset)
        dt = check_dtype_float(dtype, name)
        # The scale starts at 1: weight + weight_offset == 1. In JAX's default float when no dtype
        # is given, not weakly typed (a step's updated weight would not be, and jit would retrace).
        scale_dtype = dt if dt is not None else jnp.result_type(float)
        self.weight = full(self.axis, 1.0 - self.weight_offset, scale_dtype) if use_weight else None
        self.bias = zeros(self.axis, dt) if use_bias else None

    def _normalize(self, x: NamedArray, names: tuple[str, ...]) -> NamedArray:
        raise NotImplementedError

    def __call__(self, x: NamedArray) -> NamedArray:
        """The normalized ``x`` (same axes, same order).

        Raises:
            AxisNotFoundError: if ``x`` lacks a normalized axis.
            AxisSizeError: if a normalized axis has another size.
            NamedTypeError: if ``x`` is not floating (cast integers first).
        """
        name = type(self).__name__
        x = expect_floating(expect_axes(x, self.axis, name), name)
        y = self._normalize(upcast(x), tuple(a.name for a in self.axis))
        if self.weight is not None:
            w = upcast(place(self.weight))
            y = y * (w + self.weight_offset if self.weight_offset else w)
        if self.bias is not None:
            y = y + upcast(place(self.bias))
        return output(y.astype(x.dtype))


class LayerNorm(_Norm):
    """Normalize over ``axis``: subtract the mean, divide by ``sqrt(var + eps)``, scale and shift.

    ``y = (x - mean) / sqrt(var + eps) * weight + bias``, with ``mean`` and ``var`` over the axes of
    ``axis`` and ``weight`` (ones) / ``bias`` (zeros) over those axes. The output keeps ``x``'s axes
    in their order.

    Args:
        axis: The normalized axes (an ``Axis``, a sequence, or a ``{name: size}`` dict).
        eps: Added to the variance.
        use_weight: Learn a scale (``weight``); else ``weight`` is ``None``.
        use_bias: Learn a shift (``bias``); else ``bias`` is ``None``.
        dtype: The parameters' float dtype.

    Raises:
        LayerError: if ``eps`` is not a finite number >= 0.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> ln = na.nn.LayerNorm({"embed": 4})
        >>> y = ln(na.named(jnp.arange(8.0).reshape(2, 4), ("batch", "embed")))
        >>> float(y.mean("embed")["batch", 0].item()), y.axis_names
        (0.0, ('batch', 'embed'))
    """

    def __init__(
        self,
        axis: AxisSpec,
        *,
        eps: float = 1e-5,
        use_weight: bool = True,
        use_bias: bool = True,
        dtype: Any = None,
    ):
        super().__init__(axis, eps, use_weight, use_bias, dtype)

    def _normalize(self, x: NamedArray, names: tuple[str, ...]) -> NamedArray:
        centered = x - mean(x, names)
        return centered * rsqrt(mean(centered * centered, names) + self.eps)


class RmsNorm(_Norm):
    """Root-mean-square normalization over ``axis``: ``x / sqrt(mean(x**2) + eps) * weight``.

    No mean is subtracted. ``weight`` (ones) is over the normalized axes; an optional ``bias``
    (zeros) is added after. The output keeps ``x``'s axes in their order. With
    ``weight_offset=1.0`` the scale is ``1 + weight`` and ``weight`` starts at zeros (Gemma's
    norms).

    Args:
        axis: The normalized axes (an ``Axis``, a sequence, or a ``{name: size}`` dict).
        eps: Added to the mean square.
        use_weight: Learn a scale (``weight``); else ``weight`` is ``None``.
        use_bias: Learn a shift (``bias``); off by default.
        dtype: The parameters' float dtype.
        weight_offset: Added to ``weight`` to give the scale.

    Raises:
        LayerError: if ``eps`` is not a finite number >= 0.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> norm = na.nn.RmsNorm({"embed": 2}, eps=0.0)
        >>> y = norm(na.named(jnp.array([[3.0, 4.0]]), ("batch", "embed")))   # rms = sqrt(12.5)
        >>> [round(float(v), 4) for v in y.array[0]]
        [0.8485, 1.1314]
    """

    def __init__(
        self,
        axis: AxisSpec,
        *,
        eps: float = 1e-6,
        use_weight: bool = True,
        use_bias: bool = False,
        dtype: Any = None,
        weight_offset: float = 0.0,
    ):
        super().__init__(axis, eps, use_weight, use_bias, dtype, weight_offset)

    def _normalize(self, x: NamedArray, names: tuple[str, ...]) -> NamedArray:
        return x * rsqrt(mean(x * x, names) + self.eps)
