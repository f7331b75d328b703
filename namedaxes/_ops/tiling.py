"""Copying and moving data along named axes: ``repeat``, ``tile``, ``roll``, ``pad`` and ``ravel``.

Each op names the axes it touches and leaves the others alone. On Explicit meshes a touched axis
is replicated first where JAX cannot keep it sharded (its new size need not divide the mesh axes);
the other axes keep their sharding.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from .._array import NamedArray
from .._axis import Axis, AxisSelector, axis_name, check_unique, find_axis
from .._errors import AxisError, AxisSizeError, NamedTypeError, format_axes
from ._checks import as_selectors, is_static_int, reject_positional, scalar_int
from ._common import expect_named, explicit_sharding, unshard_dims
from .shape import flatten_axes

__all__ = ["pad", "ravel", "repeat", "roll", "tile"]


def _per_axis(x: NamedArray, spec: Any, caller: str, what: str) -> dict[int, Any]:
    """``{position: value}`` from a ``{axis: value}`` mapping (names checked, each once)."""
    if not isinstance(spec, Mapping):
        raise NamedTypeError(
            f"{caller}() takes {what} as a {{axis: value}} dict, got {spec!r} ({type(spec).__name__}); "
            f"e.g. {caller}(x, {{{x.axis_names[0] if x.axes else 'seq'!r}: 2}})."
        )
    check_unique(list(spec))
    return {find_axis(x.axes, a): v for a, v in spec.items()}


def _sharding_of(array: Any) -> NamedSharding | None:
    info = explicit_sharding(array)
    return None if info is None else NamedSharding(info[0], PartitionSpec(*info[1]))


def repeat(
    x: NamedArray,
    axis: AxisSelector,
    repeats: int | NamedArray,
    *,
    total_repeat_length: int | None = None,
) -> NamedArray:
    """Repeat each entry along ``axis``; the axis keeps its name and grows.

    Args:
        x: A NamedArray.
        axis: The axis whose entries are repeated.
        repeats: An ``int`` (every entry that many times), or an integer NamedArray over ``axis``
            alone (entry ``i`` repeated ``repeats[i]`` times). Then ``total_repeat_length`` must
            give the static new size (as in ``jnp.repeat`` under ``jit``).
        total_repeat_length: The new size of ``axis`` (needed for per-entry repeats). As in
            ``jnp.repeat``, for either form of ``repeats``: a longer result is cut to this size,
            and a shorter one is padded by repeating its last entry.

    Returns:
        A NamedArray with ``x``'s axes; ``axis`` has the new size.

    Raises:
        AxisNotFoundError: if ``x`` has no ``axis``.
        AxisSizeError: if ``repeats`` is negative (per-entry counts: when known outside ``jit``;
            under ``jit`` a negative count repeats its entry 0 times), or ``total_repeat_length``
            is not a static int >= 0.
        NamedTypeError: if ``repeats`` is not an int or an integer NamedArray.
        AxisError: if per-entry ``repeats`` are not over ``axis`` alone or lack
            ``total_repeat_length``.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> x = na.named(jnp.array([[1, 2]]), ("batch", "seq"))
        >>> na.repeat(x, "seq", 2).array
        Array([[1, 1, 2, 2]], dtype=int32)
    """
    x = expect_named(x, "repeat")
    i = find_axis(x.axes, axis)
    ax = x.axes[i]
    if total_repeat_length is not None and (
        not is_static_int(total_repeat_length) or total_repeat_length < 0
    ):
        raise AxisSizeError(
            "repeat(): total_repeat_length must be a static int >= 0 (the new size of "
            f"{ax.name!r}), got {total_repeat_length!r}."
        )
    if isinstance(repeats, (int, np.integer)) and not isinstance(repeats, (bool, np.bool_)):
        if repeats < 0:
            raise AxisSizeError(f"repeat(): repeats must be >= 0, got {repeats}.")
        # As jnp.repeat: total_repeat_length cuts the result, or pads it with the last entry.
        reps = int(repeats)
        size = ax.size * reps if total_repeat_length is None else int(total_repeat_length)
    elif isinstance(repeats, NamedArray):
        if repeats.axes != (ax,):
            raise AxisError(
                "repeat(): per-entry repeats must be a NamedArray over "
                f"({format_axes((ax,))}) alone, got NamedArray({format_axes(repeats.axes)})."
            )
        if total_repeat_length is None:
            raise AxisError(
                "repeat(): per-entry repeats need total_repeat_length= (the static new size of "
                f"{ax.name!r})."
            )
        if not jnp.issubdtype(repeats.dtype, jnp.integer):
            raise NamedTypeError(
                f"repeat(): per-entry repeats must be integers, got dtype {repeats.dtype}. Cast "
                "them, e.g. repeats.astype('int32')."
            )
        # Checked where the counts are known; under jit a negative count repeats 0 times (left to
        # jnp.repeat, it would shift the other entries).
        if not isinstance(repeats.array, jax.core.Tracer) and np.any(np.asarray(repeats.array) < 0):
            raise AxisSizeError(
                f"repeat(): per-entry repeats must be >= 0, got {np.asarray(repeats.array)}."
            )
        size, reps = int(total_repeat_length), jnp.maximum(repeats.array, 0)  # type: ignore[arg-type]
    else:
        raise NamedTypeError(
            f"repeat(): repeats must be an int or an integer NamedArray over {ax.name!r}, got "
            f"{repeats!r}."
        )
    array = unshard_dims(x.array, (i,))
    out = jnp.repeat(
        array, reps, axis=i, total_repeat_length=size, out_sharding=_sharding_of(array)
    )
    return NamedArray(out, x.axes[:i] + (Axis(ax.name, size),) + x.axes[i + 1 :])


def tile(x: NamedArray, reps: Mapping[AxisSelector, int]) -> NamedArray:
    """Repeat the whole array along named axes: axis ``a`` becomes ``reps[a]`` copies of itself.

    Args:
        x: A NamedArray.
        reps: ``{axis: count}`` for axes of ``x``; axes not listed are not tiled. To add a new
            axis, use ``broadcast_axis``.

    Returns:
        A NamedArray with ``x``'s axes, each listed one ``count`` times longer.

    Raises:
        AxisNotFoundError: if a listed axis is not in ``x``.
        AxisSizeError: if a count is negative or not an int.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> x = na.named(jnp.array([[1, 2]]), ("batch", "seq"))
        >>> na.tile(x, {"seq": 2}).array
        Array([[1, 2, 1, 2]], dtype=int32)
    """
    x = expect_named(x, "tile")
    per = _per_axis(x, reps, "tile", "reps")
    counts = [1] * x.ndim
    for i, r in per.items():
        if not is_static_int(r) or r < 0:
            raise AxisSizeError(
                f"tile(): the count for axis {x.axes[i].name!r} must be an int >= 0, got {r!r}."
            )
        counts[i] = int(r)
    array = unshard_dims(x.array, tuple(i for i, r in per.items() if r != 1))
    axes = tuple(Axis(a.name, a.size * c) for a, c in zip(x.axes, counts))
    return NamedArray(jnp.tile(array, counts), axes)


def roll(
    x: NamedArray,
    shift: int | Any | Mapping[AxisSelector, Any],
    axis: AxisSelector | Sequence[AxisSelector] | None = None,
) -> NamedArray:
    """Shift entries along named axes with wrap-around (``jnp.roll`` by name).

    Args:
        x: A NamedArray.
        shift: An int, or a 0-d integer array or NamedArray (possibly traced), with ``axis``; a
            sequence of them with a sequence of axes; or a ``{axis: shift}`` dict with no ``axis``.
        axis: The axis or axes to roll along (required unless ``shift`` is a dict). Rolling
            without an axis (over the flattened array) depends on axis order, so it is refused.

    Returns:
        A NamedArray with ``x``'s axes.

    Raises:
        AxisError: if no axis is given, or shifts and axes differ in number.
        AxisNotFoundError: if an axis is not in ``x``.
        NamedTypeError: if an axis is given by position, or a shift is not one integer (it has
            axes or dimensions, or is a float).

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> x = na.named(jnp.array([1, 2, 3]), "seq")
        >>> na.roll(x, 1, "seq").array
        Array([3, 1, 2], dtype=int32)
        >>> na.roll(x, {"seq": -1}).array
        Array([2, 3, 1], dtype=int32)
    """
    x = expect_named(x, "roll")
    if isinstance(shift, Mapping):
        if axis is not None:
            raise AxisError("roll(): give the axes either in the shift dict or as axis=, not both.")
        per = _per_axis(x, shift, "roll", "shift")
    else:
        if axis is None:
            raise AxisError(
                "roll() needs the axis to roll along: roll(x, 1, 'seq') or roll(x, {'seq': 1}). "
                "Rolling the flattened array would depend on axis order."
            )
        reject_positional("roll", axis, x.axes)
        axes = as_selectors("roll", axis)
        shifts = tuple(shift) if isinstance(shift, (tuple, list)) else (shift,) * len(axes)
        if len(shifts) != len(axes):
            raise AxisError(
                f"roll(): {len(shifts)} shift(s) for {len(axes)} axis(es); give one per axis."
            )
        check_unique(axes)
        per = {find_axis(x.axes, a): s for a, s in zip(axes, shifts)}
    if not per:
        return x
    per = {
        d: scalar_int("roll", f"shift for axis {x.axes[d].name!r}", s, _vmapped(x.axes[d]))
        for d, s in per.items()
    }
    dims = tuple(per)
    array = jnp.roll(unshard_dims(x.array, dims), tuple(per.values()), axis=dims)
    return NamedArray(array, x.axes)


def _vmapped(axis: Axis) -> Any:
    """The hint for per-entry shifts along ``axis``: map ``roll`` over the shifts' axes."""

    def hint(shift: NamedArray) -> str:
        over = shift.axis_names[0] if shift.ndim == 1 else shift.axis_names
        return f"na.vmap(lambda r, s: na.roll(r, s, {axis.name!r}), {over!r})(x, shift)"

    return hint


_PAD_MODES = (
    "constant",
    "edge",
    "linear_ramp",
    "maximum",
    "mean",
    "median",
    "minimum",
    "reflect",
    "symmetric",
    "wrap",
    "empty",
)
# The ``jnp.pad`` arguments that give a value per padded side, and what a side left out gets.
_PAD_VALUES = {"constant_values": 0, "end_values": 0, "stat_length": None}


def _pad_pair(v: Any) -> tuple[Any, Any] | None:
    """``(before, after)`` from a scalar or a pair, else ``None``."""
    if isinstance(v, NamedArray):
        return None
    if isinstance(v, (tuple, list)):
        return (v[0], v[1]) if len(v) == 2 and all(np.ndim(e) == 0 for e in v) else None
    return (v, v) if np.ndim(v) == 0 else None


def _pad_values(
    x: NamedArray, padded: Sequence[int], key: str, value: Any
) -> dict[int, tuple[Any, Any]]:
    """``value`` (a scalar, a pair, or ``{axis: scalar or pair}``) as a pair per padded axis.

    By name, so the result does not depend on ``x``'s axis order; a sequence per position would.
    """
    hint = (
        f"Give {key}= as a scalar, a (before, after) pair for every padded axis, or a dict by "
        f"axis name, e.g. {key}={{{x.axes[padded[0]].name if padded else 'seq'!r}: (0, 1)}}."
    )
    if isinstance(value, Mapping):
        per = _per_axis(x, value, "pad", key)
        stray = [x.axes[d].name for d in per if d not in padded]
        if stray:
            raise AxisError(
                f"pad(): {key}= names axes {stray} that pad_width does not pad. Leave them out."
            )
    else:
        per = dict.fromkeys(padded, value)
    pairs = {}
    for d in padded:
        default = x.axes[d].size if key == "stat_length" else _PAD_VALUES[key]
        v = per.get(d, default)
        pair = _pad_pair(v)
        if pair is None:
            raise NamedTypeError(
                f"pad(): {key}= for axis {x.axes[d].name!r} must be a scalar or a (before, after) "
                f"pair, got {v!r}. {hint}"
            )
        pairs[d] = pair
    return pairs


def pad(
    x: NamedArray,
    pad_width: Mapping[AxisSelector, int | tuple[int, int]],
    mode: str = "constant",
    **kwargs: Any,
) -> NamedArray:
    """Pad named axes (``jnp.pad`` by name); axes not listed are not padded.

    ``constant_values=``, ``stat_length=`` and ``end_values=`` take a scalar, a ``(before,
    after)`` pair used for every padded axis, or a ``{axis: scalar or pair}`` dict (padded axes
    it leaves out get ``jnp.pad``'s default: 0, or the whole axis for ``stat_length``). Every mode
    works on sharded arrays: the padded axes are replicated, the others keep their sharding. Axes
    are padded one after another in ``pad_width``'s order, so the last one fills the corners
    whatever ``x``'s layout.

    Args:
        x: A NamedArray.
        pad_width: ``{axis: (before, after)}`` or ``{axis: n}`` (``n`` on both sides).
        mode: A ``jnp.pad`` mode: ``"constant"``, ``"edge"``, ``"linear_ramp"``, ``"maximum"``,
            ``"mean"``, ``"median"``, ``"minimum"``, ``"reflect"``, ``"symmetric"``, ``"wrap"``
            or ``"empty"``.
        **kwargs: Passed to ``jnp.pad`` (``constant_values=``, ``stat_length=``,
            ``end_values=``, as above; ``reflect_type=``).

    Returns:
        A NamedArray with ``x``'s axes; each padded axis grows by ``before + after``.

    Raises:
        AxisNotFoundError: if an axis is not in ``x``.
        AxisSizeError: if a width is negative or not an int.
        AxisError: if ``mode`` is not a ``jnp.pad`` mode, or a per-axis value names an axis that
            is not padded.
        NamedTypeError: if a per-side value is not a scalar, a pair, or a dict of them.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> x = na.named(jnp.array([[1, 2]]), ("batch", "seq"))
        >>> na.pad(x, {"seq": (1, 0)}, constant_values=9).array
        Array([[9, 1, 2]], dtype=int32)
    """
    x = expect_named(x, "pad")
    if mode not in _PAD_MODES:
        raise AxisError(
            f"pad(): unknown mode {mode!r}; use one of {', '.join(map(repr, _PAD_MODES))}."
        )
    per = _per_axis(x, pad_width, "pad", "pad_width")
    widths = [(0, 0)] * x.ndim
    for i, w in per.items():
        pair = (w, w) if is_static_int(w) else tuple(w) if isinstance(w, (tuple, list)) else None
        if pair is None or len(pair) != 2 or not all(is_static_int(p) and p >= 0 for p in pair):
            raise AxisSizeError(
                f"pad(): the width for axis {x.axes[i].name!r} must be an int >= 0 or a "
                f"(before, after) pair of them, got {w!r}."
            )
        widths[i] = (int(pair[0]), int(pair[1]))
    padded = sorted(per)
    if not padded:
        return x
    values = {
        key: _pad_values(x, padded, key, kwargs.pop(key)) for key in _PAD_VALUES if key in kwargs
    }
    axes = tuple(Axis(a.name, a.size + b + c) for a, (b, c) in zip(x.axes, widths))

    def pad_padded(a: Any) -> Any:  # sees the padded axes only, in x's order
        # One axis at a time in pad_width's order (as jnp.pad does in position order): the last
        # axis padded fills the corners, so they do not depend on x's layout.
        for d in per:
            width = [widths[d] if e == d else (0, 0) for e in padded]
            each = {key: pairs[d] for key, pairs in values.items()}
            a = jnp.pad(a, width, mode=mode, **each, **kwargs)
        return a

    # The other axes are mapped over: each is a batch axis to jnp.pad, so it keeps its sharding
    # (modes such as "edge" or "mean" cannot pad an Explicit array sharded on an unpadded axis).
    rest = [d for d in range(x.ndim) if d not in per]
    f = pad_padded
    for k, d in reversed(list(enumerate(rest))):  # outermost first: inner ones see fewer dims
        f = jax.vmap(f, in_axes=d - k, out_axes=d - k)
    # JAX's linear_ramp loses a mapped dimension's Explicit sharding (its linspace), so that mode
    # maps over replicated axes and reshards the result back.
    info = explicit_sharding(x.array) if mode == "linear_ramp" else None
    out = f(unshard_dims(x.array, range(x.ndim) if info else padded))
    if info is not None:
        spec = PartitionSpec(*(None if d in per else e for d, e in enumerate(info[1])))
        out = jax.sharding.reshard(out, NamedSharding(info[0], spec))
    return NamedArray(out, axes)


def ravel(
    x: NamedArray, new_axis: AxisSelector, order: Sequence[AxisSelector] | None = None
) -> NamedArray:
    """Flatten every axis of ``x`` into one named axis.

    The flattened order is row-major over ``order`` (the last axis varies fastest); it defaults to
    ``x``'s current axis order, so pass ``order`` when the result must not depend on layout.

    Args:
        x: A NamedArray.
        new_axis: The name of the single axis (or an ``Axis`` whose size must be ``x.size``).
        order: Every axis of ``x``, in the order to flatten them.

    Returns:
        A 1-axis NamedArray.

    Raises:
        AxisError: if ``order`` does not list every axis of ``x`` exactly once.
        AxisSizeError: if ``new_axis``, or an ``Axis`` in ``order``, has the wrong size.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> x = na.named(jnp.array([[1, 2], [3, 4]]), ("batch", "seq"))
        >>> na.ravel(x, "flat", order=("seq", "batch")).array
        Array([1, 3, 2, 4], dtype=int32)
    """
    x = expect_named(x, "ravel")
    listed = tuple(x.axes if order is None else order)
    names = tuple(axis_name(a) for a in listed)
    if sorted(names) != sorted(x.axis_names) or len(set(names)) != len(names):
        raise AxisError(
            f"ravel(): order {names!r} must list every axis of NamedArray({format_axes(x.axes)}) "
            "exactly once."
        )
    if not x.axes:  # a scalar becomes one entry
        out = Axis(axis_name(new_axis), 1)
        if isinstance(new_axis, Axis) and new_axis != out:
            raise AxisSizeError(
                f"ravel(): a NamedArray with no axes has one element, but new axis "
                f"{new_axis.name!r} was given size {new_axis.size}."
            )
        return NamedArray(jnp.reshape(x.array, (1,)), (out,))
    return flatten_axes(x, listed, new_axis)  # an Axis in order is checked against x's size
