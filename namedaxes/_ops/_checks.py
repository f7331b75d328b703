"""Input checks that several op families share, so each rule (and its message) lives once.

Static indices (in range, integer), axis selections (names, not positions; not empty), reductions
that need a non-empty axis, boolean ``where=`` masks, dtype arguments and PRNG keys. Each check
raises a typed error from ``namedaxes._errors`` that names the op, the offender and one fix.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._array import NamedArray
from .._axis import Axis, check_unique, find_axis
from .._errors import (
    AxisError,
    AxisIndexError,
    NamedTypeError,
    format_axes,
    format_names,
)
from ._common import describe_operand
from .elementwise import canonical_dtype

__all__ = [
    "as_selectors",
    "check_key",
    "check_mask",
    "check_nonempty",
    "check_static_index",
    "dtype_arg",
    "reject_positional",
    "selected_positions",
    "static_index_array",
]


# -- static indices -------------------------------------------------------------------------------


def _range_error(ax: Axis, index: Any, axes: Sequence[Axis]) -> AxisIndexError:
    return AxisIndexError(
        f"Index {index} is out of range for axis {ax.name!r} of size {ax.size} in "
        f"NamedArray({format_axes(axes)}). Valid indices are {-ax.size}..{ax.size - 1}."
    )


def check_static_index(ax: Axis, index: int, axes: Sequence[Axis]) -> AxisIndexError | None:
    """The error for a static integer ``index`` outside axis ``ax`` (of an array with ``axes``), or
    ``None`` when it is in range (negative indices count from the end, as in NumPy).

    The error is returned, not raised, so that callers given an explicit JAX ``mode=`` (``"fill"``,
    ``"drop"``, ...) can let JAX handle the index instead.
    """
    if -ax.size <= index < ax.size:
        return None
    return _range_error(ax, index, axes)


def static_index_array(
    ax: Axis, value: Any, axes: Sequence[Axis]
) -> tuple[Any, AxisIndexError | None]:
    """A list, tuple or NumPy array of positions along ``ax`` as an ``int32`` array of
    non-negative indices, with the error for the first out-of-range entry (or ``None``).

    A list holding traced values is a dynamic index: it comes back as a JAX array, unchecked
    (out-of-range entries then follow JAX, like any traced index).

    Raises:
        NamedTypeError: if the entries are booleans (a mask is not a list of positions), floats,
            or not numbers at all.
    """
    try:
        array = np.asarray(value) if not isinstance(value, np.ndarray) else value
    except jax.errors.TracerArrayConversionError:
        array = jnp.asarray(value)
    if isinstance(value, (list, tuple)) and len(value) == 0:
        array = np.zeros((0,), np.int32)
    kind = array.dtype.kind
    if kind == "b":
        raise NamedTypeError(
            f"Index for axis {ax.name!r} is a boolean list/array {_short(value)}: boolean masks "
            "are not supported as positions (they would give a data-dependent size). Keep the "
            "shape and mask values with na.where(mask, x, 0), or turn the mask into positions "
            "first, e.g. np.nonzero(mask)[0]."
        )
    if kind not in "iu":
        what = "floats" if kind in "fc" else f"values of dtype {array.dtype}"
        raise NamedTypeError(
            f"Index for axis {ax.name!r} must be integer positions, got {what} {_short(value)}. "
            "Round or cast them to integers first (e.g. np.asarray(idx).astype(int))."
        )
    if not isinstance(array, np.ndarray):  # traced entries
        return array, None
    if array.size:
        low, high = int(array.min()), int(array.max())
        bad = high if high >= ax.size else low if low < -ax.size else None
        if bad is not None:  # kept out of range (not wrapped by the int32 cast) for JAX's mode=
            info = np.iinfo(np.int32)
            return np.clip(array, info.min, info.max).astype(np.int32), _range_error(ax, bad, axes)
        array = np.where(array < 0, array + ax.size, array)
    return array.astype(np.int32), None


def _short(value: Any) -> str:
    text = repr(value.tolist() if isinstance(value, np.ndarray) else value)
    return text if len(text) <= 60 else text[:57] + "..."


# -- axis selections ------------------------------------------------------------------------------


def is_static_int(a: Any) -> bool:
    """A Python or NumPy integer (not a bool, not a traced array)."""
    return isinstance(a, (int, np.integer)) and not isinstance(a, (bool, np.bool_))


def reject_positional(caller: str, axis: Any, axes: Sequence[Axis], where: str = "") -> None:
    """Refuse an axis given by position (``sum(x, 0)``): say axes are names, and suggest the
    names at those positions of ``axes`` (the array described by ``where``, default
    ``NamedArray(...)``).

    Raises:
        NamedTypeError: if ``axis`` is an int or a sequence holding one.
    """
    single = is_static_int(axis)
    items = (axis,) if single else tuple(axis) if isinstance(axis, (list, tuple)) else ()
    positions = [int(a) for a in items if is_static_int(a)]
    if not positions:
        return
    where = where or f"NamedArray({format_axes(axes)})"
    if all(-len(axes) <= i < len(axes) for i in positions):
        names = tuple(axes[int(a)].name if is_static_int(a) else a for a in items)
        fixed = names[0] if single else names
        said = ", ".join(f"{i} is {axes[i].name!r}" for i in positions)
        fix = f"In {where}, position {said}: pass axis={fixed!r}"
    else:
        fix = f"{where} has axes {format_names(a.name for a in axes)}"
    raise NamedTypeError(
        f"{caller}(): axes are chosen by name, not by position; got axis="
        f"{positions[0] if single else axis!r}. {fix}."
    )


def as_selectors(caller: str, axis: Any) -> tuple[Any, ...]:
    """``axis`` (one name or ``Axis``, or an iterable of them) as a tuple of selectors.

    Raises:
        NamedTypeError: if ``axis`` is neither.
    """
    if isinstance(axis, (str, Axis)):
        return (axis,)
    if isinstance(axis, Iterable) and not isinstance(axis, (bytes, Mapping)):
        return tuple(axis)
    raise NamedTypeError(
        f"{caller}(): axis must be an axis name, an Axis, a sequence of them or None, got "
        f"{axis!r} ({type(axis).__name__})."
    )


def selected_positions(
    caller: str, x: NamedArray, axis: Any, *, verb: str = "reduce"
) -> tuple[int, ...]:
    """Positions in ``x`` of the axes ``axis`` selects: one name or ``Axis``, a sequence of them,
    or ``None`` for every axis. Names must be unique and present.

    Raises:
        NamedTypeError: if an axis is given by position, or ``axis`` is not a selection at all.
        AxisError: if the selection is empty (``()``): an op over no axes returns ``x`` unchanged
            (or ones, for softmax), which is almost always a bug.
        AxisNotFoundError: if a name is not an axis of ``x``.
    """
    if axis is None:
        return tuple(range(x.ndim))
    reject_positional(caller, axis, x.axes)
    selectors = as_selectors(caller, axis)
    if not selectors:
        name = (x.axis_names[-1] if verb == "normalize" else x.axis_names[0]) if x.ndim else "batch"
        example = f"{caller}(x, {name!r})"
        also = " or axis=None for all of them" if verb == "reduce" else ""
        raise AxisError(
            f"{caller}(): axis={axis!r} selects no axes, so there is nothing to {verb} over. An empty "
            f"selection is refused because it is almost always a bug; name the axes to {verb} "
            f"over, e.g. {example}{also}."
        )
    check_unique(selectors)
    return tuple(find_axis(x.axes, a) for a in selectors)  # an Axis's size is checked too


def check_nonempty(caller: str, x: NamedArray, positions: Sequence[int], fix: str) -> None:
    """Refuse an op with no identity (``max``, ``argmax``, sampling) over a size-0 axis.

    Raises:
        AxisError: naming the empty axis and ``fix``.
    """
    empty = [x.axes[p] for p in positions if x.axes[p].size == 0]
    if empty:
        raise AxisError(
            f"{caller}() over axis {empty[0].name!r} of size 0 in NamedArray({format_axes(x.axes)}) "
            f"has no result: there is no element to pick. {fix}"
        )


# -- masks, dtypes, keys --------------------------------------------------------------------------


def check_mask(caller: str, mask: Any, what: str = "where=") -> None:
    """Refuse a ``where=`` mask that is not boolean (JAX would otherwise blame its own function).

    Raises:
        NamedTypeError: naming ``caller``, the mask's dtype and how to make a boolean one.
    """
    if mask is None or isinstance(mask, (bool, np.bool_)):
        return
    dtype = getattr(mask, "dtype", None)
    if dtype is not None and np.dtype(dtype) == np.bool_:
        return
    got = (
        f"NamedArray({format_axes(mask.axes)}) of dtype {np.dtype(dtype)}"
        if isinstance(mask, NamedArray)
        else describe_operand(mask) + ("" if dtype is None else f" of dtype {np.dtype(dtype)}")
    )
    raise NamedTypeError(
        f"{caller}(): {what} must be a boolean mask, got {got}. Make one with a comparison "
        f"(e.g. {what}mask > 0) or cast it with .astype(bool)."
    )


_KINDS = {
    "float": (("floating",), "floating-point", "jnp.float32 or 'bfloat16'"),
    "inexact": (("floating", "complexfloating"), "floating-point or complex", "jnp.float32"),
    "integer": (("integer",), "integer", "jnp.int32"),
    # Numbers that can hold -1 (an unsigned or bool -1 would wrap or read as True).
    "signed": (
        ("signedinteger", "floating", "complexfloating"),
        "signed integer, floating-point or complex",
        "jnp.int32 or jnp.float32",
    ),
}


def dtype_arg(dtype: Any, caller: str, kind: str | None = None) -> Any:
    """``dtype`` checked to be a dtype (``None``, the default, passes) and, if ``kind`` is given,
    of that kind: ``"float"``, ``"inexact"`` (float or complex), ``"integer"`` or ``"signed"``
    (signed integer, float or complex: a type that holds -1).

    Raises:
        NamedTypeError: if ``dtype`` is not a dtype (a misspelt string), or is of the wrong kind;
            the message names the op and a dtype of the right kind.
    """
    dtype = canonical_dtype(dtype, caller=caller)
    if dtype is None or kind is None:
        return dtype
    kinds, label, example = _KINDS[kind]
    resolved = jnp.dtype(dtype)
    if any(jnp.issubdtype(resolved, getattr(jnp, k)) for k in kinds):
        return dtype
    raise NamedTypeError(
        f"{caller}(): dtype {resolved} is not a {label} dtype. Pass a {label} dtype such as "
        f"{example}, and cast the result afterwards with .astype() if you need {resolved}."
    )


@functools.lru_cache(maxsize=4)
def _raw_key_shape(impl: str) -> tuple[int, ...]:
    # The shape of a legacy uint32 key under the default PRNG implementation (traced, not run).
    del impl  # the cache key: the shape depends on it
    return tuple(jax.eval_shape(lambda: jax.random.PRNGKey(0)).shape)


def check_key(key: Any, caller: str) -> None:
    """Refuse a first argument that is not one PRNG key (``jax.random.key`` or a legacy
    ``jax.random.PRNGKey``).

    Raises:
        NamedTypeError: naming what was passed and how to make a key.
    """
    dtype, shape = getattr(key, "dtype", None), getattr(key, "shape", None)
    if dtype is not None and shape is not None:
        if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
            if tuple(shape) == ():
                return
            raise NamedTypeError(
                f"{caller}() takes one PRNG key, got a key array of shape {tuple(shape)}. Pass one key "
                "(e.g. keys[0]), or map over the keys with na.vmap / jax.vmap."
            )
        raw = _raw_key_shape(str(jax.config.jax_default_prng_impl))
        if np.dtype(dtype) == np.uint32 and tuple(shape) == raw:
            return
    raise NamedTypeError(
        f"{caller}() needs a PRNG key as its first argument, got {describe_operand(key)}"
        + ("" if dtype is None else f" of dtype {np.dtype(dtype)}")
        + ". Make one with jax.random.key(seed) and split it for more: "
        "key, sub = jax.random.split(key)."
    )


def scalar_int(caller: str, what: str, value: Any, per_entry: Callable[[NamedArray], str]) -> Any:
    """``value`` as one integer: a Python int, or a 0-d integer array (possibly traced).

    A 0-d NamedArray (what ``argmax`` and other full reductions return) is unwrapped, as
    ``x[...]`` and ``ds`` accept it.

    Args:
        caller: The op's name, for messages.
        what: What ``value`` is, for messages (e.g. ``"start for axis 'seq'"``).
        value: The argument to check.
        per_entry: How to ask for one value per batch entry instead, given the offending
            NamedArray with axes (for its message).

    Raises:
        NamedTypeError: if ``value`` has axes or dimensions, or is not an integer.
    """
    if is_static_int(value):
        return int(value)
    if isinstance(value, NamedArray):
        if value.ndim:
            raise NamedTypeError(
                f"{caller}(): {what} must be one integer, got NamedArray({format_axes(value.axes)}). "
                f"For one value per batch entry use {per_entry(value)}."
            )
        value = value.array
    shape = None if isinstance(value, type) else getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None or len(shape) != 0 or not jnp.issubdtype(dtype, jnp.integer):
        got = (
            f"{value!r} ({type(value).__name__})"
            if shape is None
            else f"an array of shape {tuple(shape)} and dtype {np.dtype(dtype)}"
        )
        raise NamedTypeError(
            f"{caller}(): {what} must be an int or a 0-d integer array, got {got}."
        )
    return value
