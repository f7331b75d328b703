"""Scaled narrow formats: ``quantize``, an array in int8 or float8 and its scales from the absolute
maximum."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp

from .._array import NamedArray
from .._ops.elementwise import abs as named_abs
from .._ops.elementwise import clip, maximum
from .._ops.elementwise import round as named_round

__all__ = ["quantize"]

F32 = jnp.dtype(jnp.float32)


def quantize(x: NamedArray, keep: Sequence[str], dtype: Any) -> tuple[NamedArray, NamedArray]:
    """``(x / scale in dtype, scale)``: the scale (float32) has the axes ``keep`` (none: one for
    the tensor) and maps each slice's absolute maximum to the format's largest value (127 for
    int8, rounded to the nearest integer; 448 for float8 e4m3)."""
    integer = jnp.issubdtype(dtype, jnp.integer)
    top = float(jnp.iinfo(dtype).max if integer else jnp.finfo(dtype).max)
    reduce = tuple(n for n in x.axis_names if n not in keep)
    amax = named_abs(x).max(reduce if len(reduce) < x.ndim else None).astype(F32)
    # A normal float32 however small amax is (an all-zero slice: any scale works, a subnormal one
    # may be flushed to zero).
    scale = maximum(amax / top, float(jnp.finfo(F32).tiny))
    scaled = x.astype(F32) / scale
    # Rounding in the division can step past `top`, which e4m3fn would turn into NaN.
    scaled = clip(named_round(scaled) if integer else scaled, -top, top)
    return scaled.astype(dtype), scale
