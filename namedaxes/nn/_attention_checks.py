"""The input checks of ``dot_product_attention``: offsets, scale, masks, padding and sizes.

Each raises a typed error naming the input and the fix before any kernel or JAX sees the inputs.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from .._array import NamedArray
from .._axis import Axis
from .._errors import AxisNotFoundError, AxisSizeError, NamedTypeError, format_axes, format_names
from ._common import expect_axes, real_number

__all__ = ["check_mask", "check_padding", "check_sizes", "offset_value", "scale_value"]

_WHAT = "dot_product_attention"


def offset_value(query_offset: Any) -> int | jax.Array | None:
    if query_offset is None or isinstance(query_offset, int) and not isinstance(query_offset, bool):
        return query_offset
    arr = query_offset.array if isinstance(query_offset, NamedArray) else query_offset
    if getattr(arr, "ndim", None) == 0 and jnp.issubdtype(arr.dtype, jnp.integer):
        return jnp.asarray(arr, jnp.int32)
    raise NamedTypeError(
        f"{_WHAT}: query_offset must be an int or an integer scalar array, got {query_offset!r}."
    )


def scale_value(scale: Any, head: Axis) -> float:
    """``scale`` as the static float every kernel takes (default ``head size ** -0.5``)."""
    if scale is None:
        return head.size**-0.5
    value = real_number(scale)
    if value is not None:
        return value
    if isinstance(scale, jax.core.Tracer) and jnp.issubdtype(scale.dtype, jnp.number):
        raise NamedTypeError(
            f"{_WHAT}: scale must be a static number, got a traced value {scale!r}: the kernels "
            "take it as a constant. Pass a Python float (mark it static under jax.jit), or "
            "multiply the query by it and pass scale=1.0."
        )
    raise NamedTypeError(
        f"{_WHAT}: scale must be a real number (it multiplies the scores), got {scale!r}."
    )


def check_sizes(inputs: dict[str, NamedArray | None], value_head: str) -> None:
    """One name has one size across the inputs (the value's ``head_axis`` aside: the named path
    takes another head size there). Sizes are never stretched: a size-1 axis of a mask does not
    broadcast; leave the axis out instead."""
    seen: dict[str, tuple[str, NamedArray]] = {}
    for what, x in inputs.items():
        if x is None:
            continue
        for a in x.axes:
            if what == "value" and a.name == value_head:
                continue
            first = seen.setdefault(a.name, (what, x))
            if first[1].axis_size(a.name) != a.size:
                raise AxisSizeError(
                    f"{_WHAT}: axis {a.name!r} has size {first[1].axis_size(a.name)} in the "
                    f"{first[0]} NamedArray({format_axes(first[1].axes)}) but size {a.size} in "
                    f"the {what} NamedArray({format_axes(x.axes)}). One name must have one size: "
                    f"give the {what} size {first[1].axis_size(a.name)} along {a.name!r} (a mask "
                    "broadcasts over an axis it leaves out, never over size 1), or rename it."
                )


def check_mask(mask: Any, q: NamedArray, head: str, kpos: Axis) -> None:
    if not isinstance(mask, NamedArray) or mask.dtype != jnp.bool_:
        raise NamedTypeError(
            f"{_WHAT}: mask must be a boolean NamedArray, got {mask!r}. Build it with "
            "causal_mask(...) or a comparison such as tokens != pad_id."
        )
    scores = tuple(a for a in q.axes if a.name != head) + (kpos,)
    extra = [a.name for a in mask.axes if a.name not in {s.name for s in scores}]
    if extra:
        raise AxisNotFoundError(
            f"{_WHAT}: mask NamedArray({format_axes(mask.axes)}) has axis "
            f"{format_names(extra)} that the scores NamedArray({format_axes(scores)}) "
            "lack. Mask over query, key and shared axes only (rename the mask's axes to match)."
        )


def check_padding(
    key_mask: Any, key_lengths: Any, q: NamedArray, k: NamedArray, head: str, kpos: Axis, heads: str
) -> None:
    if key_mask is not None and key_lengths is not None:
        raise NamedTypeError(f"{_WHAT}: pass key_mask= or key_lengths=, not both.")
    shared = {n for n in q.axis_names if k.has_axis(n) and n not in (head, heads)}
    if key_mask is not None:
        if not isinstance(key_mask, NamedArray) or key_mask.dtype != jnp.bool_:
            raise NamedTypeError(
                f"{_WHAT}: key_mask must be a boolean NamedArray over (batch..., "
                f"{kpos.name}), True at real keys, got {key_mask!r}."
            )
        expect_axes(key_mask, (kpos,), _WHAT, "key_mask")
        allowed, x, what = shared | {kpos.name}, key_mask, "key_mask"
    elif key_lengths is not None:
        if not isinstance(key_lengths, NamedArray) or not jnp.issubdtype(
            key_lengths.dtype, jnp.integer
        ):
            raise NamedTypeError(
                f"{_WHAT}: key_lengths must be an integer NamedArray over batch axes (the number "
                f"of real keys at the start of each row), got {key_lengths!r}."
            )
        allowed, x, what = shared, key_lengths, "key_lengths"
    else:
        return
    extra = [n for n in x.axis_names if n not in allowed]
    if extra:
        may = sorted(shared) + ([kpos.name] if what == "key_mask" else [])
        raise AxisNotFoundError(
            f"{_WHAT}: {what} NamedArray({format_axes(x.axes)}) has axis {format_names(extra)}; "
            f"padding is per batch row, so it may only have {format_names(may)} (axes the query, "
            f"key and value share, besides {heads!r}). Drop or rename that axis."
        )
