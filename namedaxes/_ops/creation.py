"""Creating NamedArrays from axes: ``zeros``, ``ones``, ``full`` (and ``*_like``), ``arange``,
``linspace``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

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


# How to get what a non-scalar parameter of arange / linspace would mean: broadcast by name.
_PER_AXIS_HINT = {
    "arange": "na.arange(axis) * step + start",
    "linspace": "start + (stop - start) * na.linspace(axis, 0.0, 1.0)",
}


def _scalar(value: Any, caller: str, what: str) -> Any:
    """``value`` checked to be one number: a Python or NumPy scalar, or a 0-d array (traced ones
    included) or NamedArray of a numeric or bool dtype. ``arange`` and ``linspace`` make one 1-axis
    array, so their ``start``/``step``/``stop`` cannot bring axes of their own."""
    if isinstance(value, NamedArray) and not value.axes:
        value = value.array
    if isinstance(value, (bool, int, float, complex)):
        return value
    shape = None if isinstance(value, type) else getattr(value, "shape", None)
    got = None
    if isinstance(value, NamedArray):
        got = f"NamedArray({format_axes(value.axes)})"
    elif shape is not None and len(shape) > 0:
        got = f"a plain array of shape {tuple(shape)}"
    if got is not None:
        raise NamedTypeError(
            f"{caller}() makes one 1-axis array, so {what} must be one number; got {got}. To vary "
            f"{what} along other axes, broadcast by name: {_PER_AXIS_HINT[caller]}."
        )
    if shape is None or not _numeric(getattr(value, "dtype", None)):
        raise NamedTypeError(
            f"{caller}() needs a number for {what}, got {value!r} ({type(value).__name__}). "
            f"Pass an int or a float, e.g. {what}=0."
        )
    return value


def _numeric(dtype: Any) -> bool:
    return dtype is not None and bool(
        jnp.issubdtype(dtype, jnp.number) or jnp.issubdtype(dtype, jnp.bool_)
    )


def _fill(fill_value: Any, axes: tuple[Axis, ...], caller: str, dtype: Any = None) -> Any:
    """``fill_value`` laid out to broadcast into ``axes`` (``None`` is refused: it means "no value"
    to ``broadcast_into``, which also serves optional masks). A Python int that ``dtype`` cannot
    hold is refused, as NumPy does, where ``jnp.full`` would wrap it (300 as int8 is 44)."""
    if fill_value is None:
        raise NamedTypeError(
            f"{caller}() needs a fill_value, got None. Pass a number, e.g. {caller}(..., 0.0), or "
            "a NamedArray over some of the axes."
        )
    # NumPy integers too (np.int64(300) wraps to 44 the same way); NumPy's own bools are no ints.
    value = fill_value.item() if isinstance(fill_value, np.integer) else fill_value
    if (
        isinstance(value, int)
        and not isinstance(value, bool)
        and dtype is not None
        and jnp.issubdtype(dtype, jnp.integer)
    ):
        info = jnp.iinfo(dtype)
        if not info.min <= value <= info.max:
            raise OverflowError(
                f"{caller}(): fill_value {value} does not fit {jnp.dtype(dtype).name} "
                f"({info.min}..{info.max}). Pass a value in that range or a wider dtype."
            )
    return broadcast_into(fill_value, axes, caller=caller, what="fill_value")


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
        NamedTypeError: if ``axes`` has no sizes, ``dtype`` is not a dtype, or ``fill_value`` is
            ``None`` or a plain array with dimensions.
        AxisError: if a NamedArray ``fill_value`` has an axis that ``axes`` lacks.
        OverflowError: if ``fill_value`` is a Python or NumPy int that the integer ``dtype``
            cannot hold.

    Example:
        >>> import namedaxes as na
        >>> na.full({"batch": 2}, 7).array
        Array([7, 7], dtype=int32, weak_type=True)
    """
    ax = to_axes(axes)
    dtype = canonical_dtype(dtype, caller="full")
    fill = _fill(fill_value, ax, "full", dtype)
    return NamedArray(jnp.full(_shape(ax), fill, dtype), ax)


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
    dtype = canonical_dtype(dtype, caller="full_like") or x.dtype
    fill = _fill(fill_value, x.axes, "full_like", dtype)
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
        dtype: Element type; integer for integer ``start``/``step``, float otherwise. The values
            are computed in at least ``int32`` (or ``float32``) and then cast.

    Returns:
        A 1-axis NamedArray.

    Raises:
        AxisError: if the dict has more than one entry.
        NamedTypeError: if ``axis`` has no size (a bare name), ``dtype`` is not a dtype,
            ``start`` or ``step`` is not one number (to vary them along other axes, broadcast by
            name: ``na.arange(axis) * step + start``), or the values do not fit an integer dtype
            (or ``bool``: 0 and 1 only).

    Example:
        >>> import namedaxes as na
        >>> na.arange({"position": 4}, start=10, step=2).array
        Array([10, 12, 14, 16], dtype=int32)
    """
    ax = single_axis(axis, "arange")
    start, step = _scalar(start, "arange", "start"), _scalar(step, "arange", "step")
    given = jnp.dtype(jnp.result_type(start, step))
    out = given if dtype is None else jnp.dtype(canonical_dtype(dtype, caller="arange"))
    # Computed as start + step * i so the length is exactly the axis size, even for float steps; in
    # at least int32 (an np.int8 step must not wrap at 128) or float32 (bfloat16), then cast.
    with jax.numpy_dtype_promotion("standard"):  # picks a work type; no user values mix here
        floor = jnp.int32 if _integral(given) and _integral(out) else jnp.float32
        work = jax.dtypes.canonicalize_dtype(jnp.promote_types(jnp.result_type(given, out), floor))
    _check_fits(start, step, ax.size, (work, out))
    values = jnp.arange(ax.size, dtype=work) * jnp.asarray(step, work) + jnp.asarray(start, work)
    return NamedArray(values.astype(out), (ax,))


def _integral(dtype: Any) -> bool:
    return bool(jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.bool_))


def _check_fits(start: Any, step: Any, size: int, dtypes: tuple[Any, ...]) -> None:
    """Refuse the values of ``arange`` that an integer or bool dtype cannot hold (casting would
    wrap them, or make every nonzero ``True``, silently), where ``start`` and ``step`` are known
    here (traced ones are not)."""
    known = (bool, int, float, np.generic, np.ndarray)
    if size == 0 or not isinstance(start, known) or not isinstance(step, known):
        return
    first, step = (
        v.item() if isinstance(v, (np.generic, np.ndarray)) else v for v in (start, step)
    )
    if isinstance(first, complex) or isinstance(step, complex):
        return
    last = first + step * (size - 1)
    lo, hi = min(first, last), max(first, last)
    for dtype in dtypes:
        if jnp.issubdtype(dtype, jnp.bool_):  # False and True, as 0 and 1 (NumPy's rule)
            bounds = (0, 1)
        elif jnp.issubdtype(dtype, jnp.integer):
            bounds = (int(jnp.iinfo(dtype).min), int(jnp.iinfo(dtype).max))
        else:
            continue
        if not bounds[0] <= lo <= hi <= bounds[1]:
            int32 = jnp.iinfo(jnp.int32)
            wider = "jnp.int32" if int32.min <= lo <= hi <= int32.max else "jnp.float32"
            raise NamedTypeError(
                f"arange(): the values run from {first} to {last}, which {jnp.dtype(dtype).name} "
                f"cannot hold ({bounds[0]}..{bounds[1]}). Pass a dtype that can, e.g. "
                f"dtype={wider}."
            )


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
        NamedTypeError: if ``axis`` has no size (a bare name), ``dtype`` is not a dtype, or
            ``start`` or ``stop`` is not one number.

    Example:
        >>> import namedaxes as na
        >>> na.linspace({"t": 5}, 0.0, 1.0).array
        Array([0.  , 0.25, 0.5 , 0.75, 1.  ], dtype=float32)
    """
    ax = single_axis(axis, "linspace")
    start, stop = _scalar(start, "linspace", "start"), _scalar(stop, "linspace", "stop")
    dtype = canonical_dtype(dtype, caller="linspace")
    return NamedArray(jnp.linspace(start, stop, ax.size, endpoint=endpoint, dtype=dtype), (ax,))
