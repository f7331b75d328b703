"""Checks and helpers every layer shares: input axes, output names, parameter placement and the
precision policy (parameters and inputs in its compute dtype, results in its output dtype)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, PartitionSpec

from .._array import NamedArray
from .._axis import Axis, AxisSpec, index_of, to_axes
from .._errors import (
    AxisIndexError,
    AxisNotFoundError,
    AxisSizeError,
    DuplicateAxisError,
    NamedTypeError,
    format_axes,
    format_names,
)
from .._logical._context import current_rules
from .._logical._resolve import resolve
from .._mesh import context_mesh
from .._ops._align import align_to, result_axes
from .._partitioning._held import held_placed
from .._partitioning._shard import auto_sharded
from ._precision import check_policy_dtype, current_precision, float_dtype, param_dtype
from ._quantized import QuantizedArray

__all__ = [
    "as_axes",
    "check_ids",
    "compute",
    "expect_axes",
    "expect_floating",
    "expect_free",
    "fan_in",
    "output",
    "param",
    "place",
    "real_number",
]


def as_axes(spec: AxisSpec, what: str) -> tuple[Axis, ...]:
    """``to_axes`` that refuses an empty spec (a layer over no axes is a mistake)."""
    axes = to_axes(spec, what=what)
    if not axes:
        raise NamedTypeError(f"{what} needs at least one Axis, got {spec!r}.")
    return axes


def expect_axes(x: Any, axes: Sequence[Axis], layer: str, arg: str = "x") -> NamedArray:
    """``x`` as a NamedArray that has every axis of ``axes`` with the same size."""
    if not isinstance(x, NamedArray):
        shape = getattr(x, "shape", None)
        got = f"a plain array of shape {tuple(shape)}" if shape is not None else repr(x)
        raise NamedTypeError(
            f"{layer} needs a NamedArray for `{arg}`, got {got}. Name its axes first, e.g. "
            f"named(array, ('batch', {', '.join(repr(a.name) for a in axes)}))."
        )
    for a in axes:
        i = index_of(x.axes, a.name)
        if i is None:
            raise AxisNotFoundError(
                f"{layer} works over axis {a.name!r}, but `{arg}` is "
                f"NamedArray({format_axes(x.axes)}). Available axes: "
                f"{format_names(x.axis_names)}. Rename the input's axis to {a.name!r}."
            )
        if x.axes[i].size != a.size:
            raise AxisSizeError(
                f"{layer} expects axis {a.name!r} of size {a.size}, but `{arg}` has size "
                f"{x.axes[i].size} (NamedArray({format_axes(x.axes)})). Build the layer with the "
                "input's size."
            )
    return x


def expect_floating(x: NamedArray, layer: str, arg: str = "x") -> NamedArray:
    """``x`` when its dtype is floating. Normalizing or rotating an integer array would give the
    result in that integer dtype, fractions cut off; integer logits are no scores."""
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise NamedTypeError(
            f"{layer} needs a floating `{arg}`, got {x!r}. Cast it first, e.g. "
            f"{arg}.astype(jnp.float32)."
        )
    return x


def expect_free(x: NamedArray, names: Iterable[str], layer: str, why: str) -> None:
    """Raise when ``x`` already has one of ``names`` (it would be matched, not created)."""
    taken = [n for n in names if x.has_axis(n)]
    if taken:
        raise DuplicateAxisError(
            f"{layer}: the input NamedArray({format_axes(x.axes)}) already has axis "
            f"{format_names(taken)}, which {why}. Rename that axis of the input first."
        )


_SHOWN = 5  # out-of-range ids named in the error
_TOKEN_FIX = (
    "Use the tokenizer that matches the model, and replace padding or ignore ids (e.g. -100) by a "
    "real id such as the pad token."
)


def check_ids(
    ids: NamedArray,
    Vocab: Axis,
    caller: str,
    *,
    where: NamedArray | None = None,
    what: str = "token id(s)",
    outside: str = "the vocabulary",
    fix: str = _TOKEN_FIX,
) -> None:
    """Raise ``AxisIndexError`` when concrete ``ids`` hold an id outside ``[0, Vocab.size)``.

    Only ids where the boolean ``where`` (over some of the same or other axes) is true count; the
    error names the bad ids, ``Vocab``'s size, the first position (over the ids' and the mask's
    axes) and ``fix``. Traced ids or masks (inside ``jit``) are not known here: callers make those
    ids' results NaN instead. Ids spread over processes are left to that NaN as well (this process
    cannot see them all).
    """
    arrays = (ids.array,) if where is None else (ids.array, where.array)
    for array in arrays:
        if isinstance(array, jax.core.Tracer) or not getattr(array, "is_fully_addressable", True):
            return
    axes = ids.axes if where is None else result_axes((ids.axes, where.axes))
    host = np.asarray(align_to(ids, axes))
    bad = (host < 0) | (host >= Vocab.size)
    if where is not None:
        bad = bad & np.asarray(align_to(where, axes))
    if not bad.any():
        return
    values = np.unique(np.broadcast_to(host, bad.shape)[bad])
    shown = ", ".join(str(int(v)) for v in values[:_SHOWN])
    more = f" and {values.size - _SHOWN} more" if values.size > _SHOWN else ""
    first = np.unravel_index(int(np.flatnonzero(bad)[0]), bad.shape)
    at = ", ".join(f"{a.name}={int(i)}" for a, i in zip(axes, first))
    raise AxisIndexError(
        f"{caller}: {what} {shown}{more} outside {outside}: {Vocab.name!r} has {Vocab.size} "
        f"entries, so ids must be in [0, {Vocab.size}) (first at {at}). Negative ids do not "
        f"count from the end here. {fix}"
    )


def real_number(value: Any) -> float | None:
    """``value`` as a Python float when it is a real number: a Python or NumPy one, or a concrete
    0-d array of a real dtype (``jnp.float32(0.1)`` is one); ``None`` for anything else, bools and
    traced values included. Settings are static (layers', generate's): they are read once, here."""
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    dtype = getattr(value, "dtype", None)
    if (
        getattr(value, "shape", None) == ()
        and dtype is not None
        and (jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer))
        and not isinstance(value, jax.core.Tracer)
        and getattr(value, "is_fully_addressable", True)  # another host's value cannot be read
    ):
        return float(value)
    return None


def fan_in(axes: Sequence[Axis]) -> int:
    return math.prod(a.size for a in axes)


def place(x: Any) -> Any:
    """Place ``x`` by the compute mapping in force (no-op without a mapping or mesh).

    A parameter stored by another mapping (FSDP) is gathered here, explicitly, which is what
    Explicit meshes need and what XLA does anyway on Auto meshes; an output then carries the layout
    the mapping asks for.
    """
    return auto_sharded(x)


def param(w: Any) -> Any:
    """A parameter where a layer uses it: in the policy's compute dtype, placed by the mapping.

    Every layer reads its parameters through here. The cast comes first, where the parameter is
    held (``held_placed``), so an FSDP gather moves the compute dtype, and the gradient flows back
    through it in the parameter's own dtype. A :class:`QuantizedArray` is dequantized here (its
    narrow values gathered, then scaled), so every layer takes quantized weights as they are.
    """
    if isinstance(w, QuantizedArray):
        return w.dequantize(current_precision().compute)
    cast = current_precision().cast_to_compute(w)
    return auto_sharded(cast if cast is w else held_placed(cast))


def compute(x: Any) -> Any:
    """A layer's input in the policy's compute dtype (unchanged without a policy)."""
    return current_precision().cast_to_compute(x)


def output(y: Any) -> Any:
    """A layer's result in the policy's output dtype (else its compute dtype), placed."""
    return auto_sharded(current_precision().cast_to_output(y))


def check_dtype_float(dtype: Any, layer: str) -> Any:
    """The parameters' dtype: ``dtype``, else the policy's ``param``; ``None`` is JAX's default.

    Checked as :class:`Precision` checks its dtypes (one check): a float the layers can keep and
    compute in, so a float8 table or float64 with x64 off is refused here, not at the first call
    (or silently rounded).

    Raises:
        NamedTypeError: ``"{layer}: ... is not a dtype"``, ``"{layer}: parameters need a floating
            dtype ..."``, ``"{layer} dtype=float8_e4m3fn is not a dtype layers keep or compute
            in ..."`` or ``"{layer} dtype=float64 needs 64-bit floats ..."``.
    """
    dt = float_dtype(param_dtype(dtype), f"{layer}: ", f"{layer}: parameters need")
    if dt is not None:
        check_policy_dtype(f"{layer} dtype", dt)
    return dt


def mesh_entries(*xs: NamedArray) -> list[dict[str, Any]] | None:
    """``{axis name: mesh axes}`` of each array, for a layer that runs per shard (``shard_map``):
    by the mapping in force, else by the arrays' own shardings on an Explicit mesh. ``None`` when
    nothing is split: no mesh, one device, an Auto mesh without a mapping (XLA places the layer),
    or every entry ``None``."""
    mesh = context_mesh()
    if mesh is None or math.prod(mesh.shape.values()) == 1:
        return None
    rules = current_rules()
    if rules is not None:
        specs = [resolve(x.axes, rules, mesh) for x in xs]
    elif any(t == AxisType.Explicit for t in mesh.axis_types):
        specs = [jax.typeof(x.array).sharding.spec for x in xs]
    else:
        return None
    entries = [dict(zip(x.axis_names, tuple(sp) + (None,) * x.ndim)) for x, sp in zip(xs, specs)]
    if not any(e is not None for d in entries for e in d.values()):
        return None
    return entries


def spec_by_name(x: Any, entries: dict[str, Any]) -> PartitionSpec:
    """``x``'s ``PartitionSpec`` from ``{axis name: mesh axes}`` (an empty spec for anything that
    is not a NamedArray)."""
    if not isinstance(x, NamedArray):
        return PartitionSpec()
    return PartitionSpec(*(entries.get(n) for n in x.axis_names))
