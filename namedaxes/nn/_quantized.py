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
from .._axis import Axis
from .._errors import NamedTypeError, QuantizationError
from .._partitioning._shard import auto_sharded

__all__ = ["FORMATS", "QuantizedArray", "quantize", "quantize_array"]

F32 = jnp.dtype(jnp.float32)
#: The storage formats of :meth:`QuantizedArray.of` by name.
FORMATS = {
    "int8": jnp.dtype(jnp.int8),
    "float8": jnp.dtype(jnp.float8_e4m3fn),
    "fp8": jnp.dtype(jnp.float8_e4m3fn),
}


def quantize(
    x: NamedArray, keep: Sequence[str], dtype: Any, scale_dtype: Any = None
) -> tuple[NamedArray, NamedArray]:
    """``(x / scale in dtype, scale)``: the scale (float32) has the axes ``keep`` (none: one for
    the tensor) and maps each slice's absolute maximum to the format's largest value (127 for
    int8, rounded to the nearest integer; 448 for float8 e4m3). With ``scale_dtype`` the scale is
    a value of that dtype (rounded to it first), so that scaling in that dtype scales by it."""
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
        scale = scale.astype(scale_dtype).astype(F32)
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
    are placed by the mapping in force (so an FSDP gather moves the narrow bytes) and multiplied
    in the policy's compute dtype (else :attr:`dtype`, the weight's own), so the matmul runs as
    before, on the dequantized weight. Both arrays are named like the weight (the scales have
    its axes but the contracted ones), so a mapping places them like every other parameter.

    Attributes:
        values: The weight's axes, in ``int8`` or ``float8_e4m3fn``.
        scale: Float32, the weight's axes but those the layer contracts.
        dtype: The dtype it dequantizes to without a policy (the weight's).

    Example:
        >>> import jax
        >>> import namedaxes as na
        >>> w = na.random.normal(jax.random.key(0), {"embed": 4, "mlp": 3})
        >>> q = na.nn.QuantizedArray.of(w, "int8", contracted=("embed",))
        >>> q.values, q.scale
        (NamedArray(int8, embed=4, mlp=3), NamedArray(float32, mlp=3))
        >>> bool((abs(q.dequantize() - w) <= q.scale / 2 + 1e-6).all())
        True
    """

    values: NamedArray
    scale: NamedArray
    dtype: Any = eqx.field(static=True)

    @classmethod
    def of(cls, weight: NamedArray, format: str, *, contracted: Sequence[str]) -> QuantizedArray:  # noqa: A002
        """``weight`` in ``format`` (``"int8"``, ``"float8"``), one scale per slice over the
        ``contracted`` axes (per output channel), each array placed like the weight (its
        ``NamedSharding``'s entries, by name).

        Raises:
            QuantizationError: for an unknown format.
            NamedTypeError: for a weight that is not a floating NamedArray, or a contracted axis
                the weight lacks.
        """
        if format not in FORMATS:
            raise QuantizationError(
                f"Unknown quantized format {format!r}. Known: {', '.join(map(repr, FORMATS))}."
            )
        if not isinstance(weight, NamedArray) or not jnp.issubdtype(weight.dtype, jnp.floating):
            raise NamedTypeError(
                f"QuantizedArray.of needs a floating NamedArray weight, got {weight!r}."
            )
        missing = [n for n in contracted if not weight.has_axis(n)]
        if missing:
            raise NamedTypeError(
                f"QuantizedArray.of: the weight NamedArray{weight.axes} has no axis {missing[0]!r} "
                "to contract."
            )
        keep = tuple(n for n in weight.axis_names if n not in contracted)
        values, scale = _quantize_jit(weight, keep, FORMATS[format])
        sharding = getattr(weight.array, "sharding", None)
        if isinstance(sharding, NamedSharding) and not isinstance(weight.array, jax.core.Tracer):
            entries = dict(zip(weight.axis_names, tuple(sharding.spec) + (None,) * weight.ndim))
            spec = PartitionSpec(*(entries[n] for n in scale.axis_names))
            values = NamedArray(jax.device_put(values.array, sharding), values.axes)
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
        placed by the mapping in force first."""
        dtype = self.dtype if dtype is None else dtype
        values, scale = self.placed()
        return auto_sharded(values.astype(dtype) * scale.astype(dtype))

    def placed(self) -> tuple[NamedArray, NamedArray]:
        """``(values, scale)``, each placed by the mapping in force (the narrow values are what an
        FSDP gather moves)."""
        return auto_sharded(self.values), auto_sharded(self.scale)
