"""Scaled narrow formats: ``quantize`` (an array and its scales from the absolute maximum) and
``QuantizedArray``, a weight stored in int8 or float8 that layers dequantize where they read it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from .._array import NamedArray
from .._axis import Axis, AxisSelector, axis_names
from .._errors import NamedTypeError, QuantizationError, did_you_mean, format_names
from .._logical._context import current_rules
from .._partitioning._shard import auto_sharded
from ._precision import float_dtype

__all__ = ["FORMATS", "QuantizedArray", "quantize", "quantize_array", "scaling_dtype"]

F32 = jnp.dtype(jnp.float32)
#: The storage formats of :meth:`QuantizedArray.of` by name.
FORMATS = {
    "int8": jnp.dtype(jnp.int8),
    "float8": jnp.dtype(jnp.float8_e4m3fn),
    "fp8": jnp.dtype(jnp.float8_e4m3fn),
}


def scaling_dtype(dtype: Any) -> jnp.dtype:
    """The dtype scales are held and applied in for a computation in ``dtype``: ``dtype`` itself
    where it has float32's exponent range (bfloat16, float32, float64), else float32. A float16
    cannot hold them: the scale of a tensor whose largest value is below ~4e-3 (a gradient, small
    weights) is below float16's smallest number, 6e-8, and would round to zero.

    Example:
        >>> import jax.numpy as jnp
        >>> scaling_dtype(jnp.bfloat16), scaling_dtype(jnp.float16)
        (dtype(bfloat16), dtype('float32'))
    """
    dtype = jnp.dtype(dtype)
    return dtype if jnp.finfo(dtype).minexp <= jnp.finfo(F32).minexp else F32


def quantize(
    x: NamedArray, keep: Sequence[str], dtype: Any, scale_dtype: Any = None
) -> tuple[NamedArray, NamedArray]:
    """``(x / scale in dtype, scale)``: the scale (float32) has the axes ``keep`` (none: one for
    the tensor) and maps each slice's absolute maximum to the format's largest value (127 for
    int8, rounded to the nearest integer; 448 for float8 e4m3). With ``scale_dtype`` the scale is
    a value of ``scaling_dtype(scale_dtype)`` (rounded to it first), so that scaling in that dtype
    scales by it; a float16 ``scale_dtype`` keeps float32 scales, which float16 cannot hold."""
    reduce = tuple(i for i, n in enumerate(x.axis_names) if n not in keep)
    values, scale = quantize_array(x.array, reduce, dtype, scale_dtype)
    kept = tuple(a for i, a in enumerate(x.axes) if i not in reduce)
    return NamedArray(values, x.axes), NamedArray(jnp.squeeze(scale, reduce), kept)


def quantize_array(
    x: jax.Array, reduce: tuple[int, ...], dtype: Any, scale_dtype: Any = None,
    across: tuple[str, ...] = (),
) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """:func:`quantize` on a plain array: the scale is one per slice along the positions
    ``reduce`` (kept as size-1 axes, so that it broadcasts against ``x``), its absolute maximum
    also taken over the mesh axes ``across`` (inside ``shard_map``: the slice is split over
    them)."""
    integer = jnp.issubdtype(dtype, jnp.integer)
    top = float(jnp.iinfo(dtype).max if integer else jnp.finfo(dtype).max)
    amax = jnp.max(jnp.abs(x), axis=reduce, keepdims=True).astype(F32)
    if across:
        amax = jax.lax.pmax(amax, across)
    # A normal float32 however small amax is (an all-zero slice: any scale works, a subnormal one
    # may be flushed to zero).
    scale = jnp.maximum(amax / top, float(jnp.finfo(F32).tiny))
    if scale_dtype is not None:  # the largest value may land a rounding past `top`: clipped
        scale = scale.astype(scaling_dtype(scale_dtype)).astype(F32)
    scaled = x.astype(F32) / scale
    # Rounding in the division can step past `top`, which e4m3fn would turn into NaN.
    scaled = jnp.clip(jnp.round(scaled) if integer else scaled, -top, top)
    return scaled.astype(dtype), scale


# One program per weight instead of one per operation (a model's weights are quantized eagerly).
_quantize_jit = jax.jit(quantize, static_argnums=(1, 2))


class QuantizedArray(eqx.Module):
    """A weight stored in a narrow format (int8 or float8 e4m3) with float32 scales over its
    output channels: ``values * scale`` is the weight. ``models.quantize`` makes them.

    Layers read it where they read any parameter (``nn``'s ``param``): the values and the scales
    are placed by the mapping in force (so an FSDP gather moves the narrow bytes); a matmul
    converts the values to the policy's compute dtype (else :attr:`dtype`, the weight's own) and
    multiplies its result by the scales, in float32 where the compute dtype cannot hold them
    (float16: :func:`scaling_dtype`). Both arrays are named like the weight (the scales have its
    axes but the contracted ones), so a mapping places them like every other parameter.

    Attributes:
        values: The weight's axes, in ``int8`` or ``float8_e4m3fn``.
        scale: Float32, the weight's axes but those the layer contracts.
        dtype: The dtype it dequantizes to without a policy (the weight's).

    Example:
        >>> import jax
        >>> import namedaxes as na
        >>> w = na.random.normal(jax.random.key(0), {"embed": 4, "mlp": 3})
        >>> q = na.nn.QuantizedArray.of(w, "int8", contracted="embed")
        >>> q.values, q.scale
        (NamedArray(int8, embed=4, mlp=3), NamedArray(float32, mlp=3))
        >>> bool((abs(q.dequantize() - w) <= q.scale / 2 + 1e-6).all())
        True
    """

    values: NamedArray
    scale: NamedArray
    dtype: Any = eqx.field(static=True)

    @classmethod
    def of(
        cls,
        weight: NamedArray,
        format: str,  # noqa: A002 - the word
        *,
        contracted: AxisSelector | Sequence[AxisSelector],
    ) -> QuantizedArray:
        """``weight`` in ``format`` (``"int8"``, ``"float8"``), one scale per slice over the
        ``contracted`` axes (an axis name or ``Axis``, or several; per output channel). A
        weight placed on a mesh keeps its sharding in the values; the scales are placed as
        ``resolve`` places them by the mapping in force (as :func:`~namedaxes.shard` would), or
        with no mapping in force by the weight's entries of their axes.

        Raises:
            QuantizationError: for a format that is not one of the names of :data:`FORMATS`.
            NamedTypeError: for a weight that is not a floating NamedArray, no contracted axis,
                or a contracted axis the weight lacks.
            AxisSizeError: for a contracted ``Axis`` of another size than the weight's.
        """
        if not isinstance(format, str) or format not in FORMATS:
            raise QuantizationError(
                f"QuantizedArray.of: unknown format {format!r}. Pass one of "
                f"{', '.join(map(repr, FORMATS))}."
            )
        if not isinstance(weight, NamedArray) or not jnp.issubdtype(weight.dtype, jnp.floating):
            raise NamedTypeError(
                f"QuantizedArray.of needs a floating NamedArray weight, got {weight!r}."
            )
        given = (contracted,) if isinstance(contracted, (str, Axis)) else tuple(contracted)
        names = axis_names(given)  # names or Axis objects
        if not names:  # a scale per element: nothing quantized, and twice the bytes
            raise NamedTypeError(
                f"QuantizedArray.of: contracted={contracted!r} names no axis, which would give one "
                "scale per element. Pass the axes the layer contracts, of "
                f"{format_names(weight.axis_names)}."
            )
        missing = [n for n in names if not weight.has_axis(n)]
        if missing:
            raise NamedTypeError(
                f"QuantizedArray.of: the weight {weight!r} has no axis {missing[0]!r}"
                f"{did_you_mean(missing[0], weight.axis_names)} to contract. Pass contracted= "
                f"the axes the layer contracts, of {format_names(weight.axis_names)}."
            )
        for a in given:
            if isinstance(a, Axis):
                weight.resolve_axis(a)  # AxisSizeError for an Axis of another size
        keep = tuple(n for n in weight.axis_names if n not in names)
        values, scale = _quantize_jit(weight, keep, FORMATS[format])
        sharding = getattr(weight.array, "sharding", None)
        if isinstance(sharding, NamedSharding) and not isinstance(weight.array, jax.core.Tracer):
            values = NamedArray(jax.device_put(values.array, sharding), values.axes)
            if current_rules() is not None:  # where layers (and shard) place it: no move there
                scale = auto_sharded(scale, sharding.mesh)
            else:
                entries = dict(zip(weight.axis_names, tuple(sharding.spec) + (None,) * weight.ndim))
                spec = PartitionSpec(*(entries[n] for n in scale.axis_names))
                scale = NamedArray(
                    jax.device_put(scale.array, NamedSharding(sharding.mesh, spec)), scale.axes
                )
        return cls(values, scale, weight.dtype)

    @property
    def axes(self) -> tuple[Axis, ...]:
        """The weight's axes."""
        return self.values.axes

    @property
    def axis_names(self) -> tuple[str, ...]:
        """The names of the weight's axes."""
        return self.values.axis_names

    def dequantize(self, dtype: Any = None) -> NamedArray:
        """The weight, ``values * scale`` in ``dtype`` (default :attr:`dtype`), the two arrays
        placed by the mapping in force first. The product is taken in :func:`scaling_dtype`
        (float32 for a float16 ``dtype``, whose range cannot hold small scales), then cast.

        Raises:
            NamedTypeError: for a ``dtype`` that is not a floating dtype.
        """
        what = "QuantizedArray.dequantize"
        dtype = self.dtype if dtype is None else float_dtype(dtype, f"{what}: ", f"{what} needs")
        wide = scaling_dtype(dtype)
        values, scale = self.placed()
        return auto_sharded((values.astype(wide) * scale.astype(wide)).astype(dtype))

    def placed(self) -> tuple[NamedArray, NamedArray]:
        """``(values, scale)``, each placed by the mapping in force (the narrow values are what an
        FSDP gather moves)."""
        return auto_sharded(self.values), auto_sharded(self.scale)
