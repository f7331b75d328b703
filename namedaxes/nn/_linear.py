"""``Linear``: a dense layer from named input axes to named output axes."""

from __future__ import annotations

import math
from typing import Any

import equinox as eqx
import jax

from .._array import NamedArray
from .._axis import Axis, AxisSpec
from .._errors import DuplicateAxisError, LayerError, format_names
from .._ops.creation import zeros
from ..random import normal
from ._common import (
    as_axes,
    check_dtype_float,
    compute,
    expect_axes,
    expect_free,
    fan_in,
    output,
    param,
    real_number,
)
from ._fp8 import matmul

__all__ = ["Linear"]


class Linear(eqx.Module):
    """A dense layer: contracts the input axes ``In`` and creates the output axes ``Out``.

    Parameters: ``weight`` with axes ``In + Out``, drawn from a normal distribution with standard
    deviation ``init_scale / sqrt(prod(In sizes))``, and ``bias`` with axes ``Out`` (zeros), or
    ``None``. Every other axis of the input (``batch``, ``position``, ...) is kept; the output has
    the input's remaining axes in their order, then ``Out``.

    Under an ``axis_mapping`` with a mesh (inside ``named_jit``/``fsdp``), the weight and the output
    are placed by that mapping, so a weight stored FSDP-sharded is gathered here. Under a precision
    policy the input and the parameters are cast to its compute dtype and the result to its output
    dtype; a policy with ``matmul="float8"`` runs the product in float8 when its rules pick the
    layer by the names of ``In`` and ``Out`` (see :class:`Precision`).

    Args:
        In: The input axes (an ``Axis``, a sequence of them, or a ``{name: size}`` dict).
        Out: The output axes; no name may also be an input axis.
        key: PRNG key for the weight.
        use_bias: Whether to add a bias over ``Out``.
        init_scale: Multiplies the weight's standard deviation.
        dtype: The parameters' float dtype (the policy's ``param`` or JAX's default when ``None``).

    Raises:
        DuplicateAxisError: if ``In`` and ``Out`` share a name.
        NamedTypeError: if an axis spec or the dtype is invalid (float8, or float64 with
            ``jax_enable_x64`` off, included: as :class:`Precision` refuses them).
        LayerError: if an input axis has size 0, or ``init_scale`` is not a finite number >= 0.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import namedaxes as na
        >>> lin = na.nn.Linear({"embed": 4}, {"heads": 2, "head_dim": 3}, key=jax.random.key(0))
        >>> lin.weight
        NamedArray(float32, embed=4, heads=2, head_dim=3)
        >>> lin(na.ones({"batch": 5, "embed": 4}))
        NamedArray(float32, batch=5, heads=2, head_dim=3)
    """

    weight: NamedArray
    bias: NamedArray | None
    In: tuple[Axis, ...] = eqx.field(static=True)
    Out: tuple[Axis, ...] = eqx.field(static=True)

    def __init__(
        self,
        In: AxisSpec,
        Out: AxisSpec,
        *,
        key: jax.Array,
        use_bias: bool = True,
        init_scale: float = 1.0,
        dtype: Any = None,
    ):
        ins, outs = as_axes(In, "Linear In"), as_axes(Out, "Linear Out")
        shared = [a.name for a in ins if a.name in {b.name for b in outs}]
        if shared:
            raise DuplicateAxisError(
                f"Linear: axis {format_names(shared)} is both an input and an output axis. Give "
                "the output another name (e.g. 'embed' -> 'embed_out') and rename after the layer."
            )
        empty = [a for a in ins if a.size == 0]
        if empty:  # nothing to contract, and no fan-in to scale the weight by
            raise LayerError(
                f"Linear: input axis {format_names([a.name for a in empty])} has size 0, so the "
                "layer would contract nothing. Give every input axis a size >= 1."
            )
        scale = real_number(init_scale)
        if scale is None or not (math.isfinite(scale) and scale >= 0):
            raise LayerError(
                f"Linear init_scale must be a finite number >= 0 (it multiplies the weight's "
                f"standard deviation), got {init_scale!r}."
            )
        dt = check_dtype_float(dtype, "Linear")
        self.In, self.Out = ins, outs
        self.weight = normal(key, ins + outs, dt) * (scale / fan_in(ins) ** 0.5)
        self.bias = zeros(outs, dt) if use_bias else None

    def __call__(self, x: NamedArray) -> NamedArray:
        """``x`` with the ``In`` axes contracted away and the ``Out`` axes appended.

        Raises:
            AxisNotFoundError: if ``x`` lacks an input axis.
            AxisSizeError: if an input axis has another size.
            DuplicateAxisError: if ``x`` already has an output axis.
        """
        x = expect_axes(x, self.In, "Linear")
        expect_free(x, (a.name for a in self.Out), "Linear", "is an output axis of the layer")
        y = matmul(compute(x), self.weight, tuple(a.name for a in self.In))
        if self.bias is not None:
            y = y + param(self.bias)
        return output(y)
