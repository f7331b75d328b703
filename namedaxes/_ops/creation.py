"""Creating NamedArrays from axes: ``zeros``, ``ones``, ``full`` (and ``*_like``), ``arange``,
``linspace``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

from .._array import NamedArray
from .._axis import Axis, AxisSpec, to_axes
from .._errors import AxisError, NamedTypeError, format_axes
from .elementwise import broadcast_into, canonical_dtype

__all__ = ["arange", "full", "full_like", "linspace", "ones", "ones_like", "zeros", "zeros_like"]


def _shape(axes: tuple[Axis, ...]) -> tuple[int, ...]:
    return tuple(a.size for a in axes)


def _like(x: Any, caller: str) -> NamedArray:
    if not isinstance(x, NamedArray):
        raise NamedTypeError(
            f"{caller}() needs a NamedArray to copy axes from, got {type(x).__name__}. "
            f"For a plain array use {caller.replace('_like', '')}(axes) with axes as a "
            "{name: size} dict."
        )
    return x


def single_axis(axis: Any, caller: str) -> Axis:
    """An ``Axis`` from an ``Axis`` or a one-entry ``{name: size}`` dict."""
    if isinstance(axis, Axis):
        return axis
    if isinstance(axis, Mapping):
        if len(axis) != 1:
            raise AxisError(
                f"{caller}() makes a 1-axis array, so its axis must be one Axis or a one-entry "
                f"{{name: size}} dict; got {len(axis)} entries ({format_axes(axis)})."
            )
        return to_axes(axis)[0]
    raise NamedTypeError(
        f"{caller}() needs an Axis or a one-entry {{name: size}} dict, got {axis!r} "
        f"({type(axis).__name__}). Give the size too, e.g. {{'position': 16}}."
    )


def zeros(axes: AxisSpec, dtype: Any = None) -> NamedArray:
    """An array of zeros with the given axes.

    Args:
        axes: A ``{name: size}`` dict, a sequence of ``Axis``, or one ``Axis``.
        dtype: Element type; JAX's default float type when ``None``.

    Returns:
        A NamedArray with exactly ``axes``.

    Raises:
        NamedTypeError: if ``axes`` has no sizes (bare names) or ``dtype`` is not a dtype.
        DuplicateAxisError: if a name appears twice.

    Example:
        >>> import namedaxes as na
        >>> na.zeros({"batch": 2, "embed": 3})
        NamedArray(float32, batch=2, embed=3)
    """
    ax = to_axes(axes)
    return NamedArray(jnp.zeros(_shape(ax), canonical_dtype(dtype, caller="zeros")), ax)


def ones(axes: AxisSpec, dtype: Any = None) -> NamedArray:
    """An array of ones with the given axes.

    Args:
        axes: A ``{name: size}`` dict, a sequence of ``Axis``, or one ``Axis``.
        dtype: Element type; JAX's default float type when ``None``.

    Returns:
        A NamedArray with exactly ``axes``.

    Raises:
        NamedTypeError: if ``axes`` has no sizes (bare names) or ``dtype`` is not a dtype.
        DuplicateAxisError: if a name appears twice.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> na.ones([na.Axis("batch", 2)], dtype=jnp.int32)
        NamedArray(int32, batch=2)
    """
    ax = to_axes(axes)
    return NamedArray(jnp.ones(_shape(ax), canonical_dtype(dtype, caller="ones")), ax)


def full(axes: AxisSpec, fill_value: Any, dtype: Any = None) -> NamedArray:
    """An array with the given axes filled with ``fill_value``.

    Args:
        axes: A ``{name: size}`` dict, a sequence of ``Axis``, or one ``Axis``.
        fill_value: A scalar, a 0-d array, or a NamedArray whose axes are among ``axes`` (it is
            broadcast by name, so ``full({"batch": 4, "embed": 3}, bias)`` repeats an ``embed``
            bias over ``batch``).
        dtype: Element type; taken from ``fill_value`` when ``None``.

    Returns:
        A NamedArray with exactly ``axes``.

    Raises:
        NamedTypeError: if ``axes`` has no sizes, ``dtype`` is not a dtype, or ``fill_value`` is a
            plain array with dimensions.
        AxisError: if a NamedArray ``fill_value`` has an axis that ``axes`` lacks.

    Example:
        >>> import namedaxes as na
        >>> na.full({"batch": 2}, 7).array
        Array([7, 7], dtype=int32, weak_type=True)
    """
    ax = to_axes(axes)
    fill = broadcast_into(fill_value, ax, caller="full", what="fill_value")
    return NamedArray(jnp.full(_shape(ax), fill, canonical_dtype(dtype, caller="full")), ax)


def zeros_like(x: NamedArray, dtype: Any = None) -> NamedArray:
    """Zeros with ``x``'s axes (and dtype unless ``dtype`` is given).

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> na.zeros_like(na.named(jnp.ones((2, 3)), ("batch", "embed")), dtype=bool)
        NamedArray(bool, batch=2, embed=3)
    """
    x = _like(x, "zeros_like")
    return NamedArray(jnp.zeros_like(x.array, canonical_dtype(dtype, caller="zeros_like")), x.axes)


def ones_like(x: NamedArray, dtype: Any = None) -> NamedArray:
    """Ones with ``x``'s axes (and dtype unless ``dtype`` is given).

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> na.ones_like(na.named(jnp.zeros((2, 3)), ("batch", "embed")))
        NamedArray(float32, batch=2, embed=3)
    """
    x = _like(x, "ones_like")
    return NamedArray(jnp.ones_like(x.array, canonical_dtype(dtype, caller="ones_like")), x.axes)


def full_like(x: NamedArray, fill_value: Any, dtype: Any = None) -> NamedArray:
    """``fill_value`` with ``x``'s axes and sharding (and dtype unless ``dtype`` is given).

    ``fill_value`` may be a NamedArray over some of ``x``'s axes; it is broadcast by name.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> na.full_like(na.named(jnp.zeros(2), "batch"), 5.0).array
        Array([5., 5.], dtype=float32)
    """
    x = _like(x, "full_like")
    fill = broadcast_into(fill_value, x.axes, caller="full_like", what="fill_value")
    dtype = canonical_dtype(dtype, caller="full_like") or x.dtype
    if isinstance(fill_value, NamedArray):
        # jnp.full_like drops x's sharding for an array fill; adding to zeros_like keeps it.
        return NamedArray(jnp.zeros_like(x.array, dtype) + fill.astype(dtype), x.axes)
    return NamedArray(jnp.full_like(x.array, fill, dtype), x.axes)


def arange(
    axis: Axis | Mapping[str, int], start: Any = 0, step: Any = 1, dtype: Any = None
) -> NamedArray:
    """``start, start + step, ...``: one value per position of ``axis``.

    The axis's size fixes the length (unlike ``jnp.arange``, there is no ``stop``), so the result
    always fits the axis.

    Args:
        axis: An ``Axis`` or a one-entry ``{name: size}`` dict.
        start: The first value.
        step: The spacing between values.
        dtype: Element type; integer for integer ``start``/``step``, float otherwise.

    Returns:
        A 1-axis NamedArray.

    Raises:
        AxisError: if the dict has more than one entry.
        NamedTypeError: if ``axis`` has no size (a bare name) or ``dtype`` is not a dtype.

    Example:
        >>> import namedaxes as na
        >>> na.arange({"position": 4}, start=10, step=2).array
        Array([10, 12, 14, 16], dtype=int32)
    """
    ax = single_axis(axis, "arange")
    dtype = canonical_dtype(dtype, caller="arange")
    # Computed as start + step * i so the length is exactly the axis size, even for float steps;
    # in start and step's own type (int32 for Python ints, float32 for floats), then cast.
    index = jnp.arange(ax.size, dtype=jnp.result_type(start, step))
    values = index * step + start
    return NamedArray(values if dtype is None else values.astype(dtype), (ax,))


def linspace(
    axis: Axis | Mapping[str, int],
    start: Any,
    stop: Any,
    *,
    endpoint: bool = True,
    dtype: Any = None,
) -> NamedArray:
    """Evenly spaced values from ``start`` to ``stop``, one per position of ``axis``.

    Args:
        axis: An ``Axis`` or a one-entry ``{name: size}`` dict.
        start: The first value.
        stop: The last value (excluded when ``endpoint=False``).
        endpoint: Whether ``stop`` is included.
        dtype: Element type; JAX's default float type when ``None``.

    Returns:
        A 1-axis NamedArray.

    Raises:
        AxisError: if the dict has more than one entry.
        NamedTypeError: if ``axis`` has no size (a bare name) or ``dtype`` is not a dtype.

    Example:
        >>> import namedaxes as na
        >>> na.linspace({"t": 5}, 0.0, 1.0).array
        Array([0.  , 0.25, 0.5 , 0.75, 1.  ], dtype=float32)
    """
    ax = single_axis(axis, "linspace")
    dtype = canonical_dtype(dtype, caller="linspace")
    return NamedArray(jnp.linspace(start, stop, ax.size, endpoint=endpoint, dtype=dtype), (ax,))
