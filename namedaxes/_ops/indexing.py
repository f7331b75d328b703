"""Indexing by name: ``x["batch", 3]``, ``x[{"seq": slice(0, 4)}]``, gathers with named index
arrays, ``x.at[...]`` updates, ``take`` and the dynamic ``slice``.

A selection maps axes to indices. Each index is

* an integer (Python int or a 0-d integer array, possibly traced): the axis disappears;
* a slice with static bounds (steps allowed): the axis keeps its name with the new size;
* an integer NamedArray: a gather by name. The indexed axis is replaced, at its position, by the
  index array's axes. An index axis that ``x`` also has (and that is not itself indexed) is a *batch*
  axis: it is matched pointwise, not crossed (``x[{"vocab": ids}]`` with ``ids(batch, seq)`` and
  ``x(batch, vocab)`` picks ``x[b, ids[b, s]]``); it stays where it is in ``x``;
  with one index array (and slices), the read is one batched gather, as ``jnp.take_along_axis``
  emits, so it partitions without extra collectives;
* a 1-d integer array or list without names: a gather that keeps the axis' name (new size = length).

Static indices (Python ints, lists and NumPy arrays) out of range raise ``AxisIndexError`` (an
``IndexError``) naming the axis, its size and the index; negative ones count from the end, as in
NumPy. Float and boolean lists are refused: positions are integers, and a mask is not a list of
positions. JAX arrays, traced or not, are dynamic: out-of-range entries follow JAX (clamped when
reading, dropped when updating), and so do static ones when ``x.at[...]`` is given an explicit
``mode=`` (``"fill"``, ``"drop"``, ``"clip"``, ...).

On Explicit meshes the result is sharded by name: every output axis keeps the mesh axes it had (in
``x`` for kept and batch axes, in the index array for gathered axes). An axis of ``x`` that is
integer-indexed, sliced or gathered by several index arrays is replicated first, which is what XLA
does on Auto meshes. The axis of a one-index gather (``take``, ``x[{axis: ids}]``, an embedding
lookup) stays split, as XLA partitions it on Auto meshes: each device gathers the entries it holds
and one all-reduce of the (index-shaped) result combines them; the operand is never gathered whole.
Updates (``x.at[...]``) keep the sharding of ``x``.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from .._array import NamedArray
from .._axis import Axis, AxisSelector, axis_name, broadcast_axes, find_axis
from .._errors import (
    AxisSizeError,
    DuplicateAxisError,
    NamedTypeError,
    format_axes,
    format_names,
)
from .._spec import entry_axes
from ._align import align_to
from ._checks import check_static_index, is_static_int, scalar_int, static_index_array
from ._common import expect_named, explicit_sharding, unshard_dims
from .dynamic import ds

__all__ = ["take", "slice_axis"]

_builtin_slice = slice


@dataclass(frozen=True)
class _Plan:
    """How a named selection becomes one positional JAX index.

    ``index`` has one entry per dimension of ``x``; ``layout`` is the axes of ``x.array[index]`` in
    the order JAX produces them (NumPy's advanced-indexing rules); ``out`` is the axes in the order
    namedaxes promises (``x``'s order, gathered axes replaced in place).
    """

    index: tuple[Any, ...]
    layout: tuple[Axis, ...]
    out: tuple[Axis, ...]
    # Where each layout axis comes from: a dimension of x, or (index NamedArray, its dimension).
    sources: tuple[int | tuple[NamedArray, int], ...]
    # Dimensions of x that cannot stay sharded (integer-indexed, sliced, or gathered by a NumPy-style
    # index; not the one gathered axis of ``along``, which XLA partitions where it lies).
    unshard: tuple[int, ...]
    # One index NamedArray and only slices besides: ``(dimension, index)``, read with one batched
    # gather (see ``_take_along``) instead of the NumPy-style index above.
    along: tuple[int, NamedArray] | None = None
    # The basic slice of each dimension of x for ``along``, before ``index`` turns batch axes into
    # positions: ``_take_along`` slices x by it, then matches batch axes pointwise.
    slices: tuple[slice, ...] = ()
    # A static index outside its axis: raised when the selection is used, unless the caller picked
    # JAX's out-of-bounds handling with an explicit ``mode=``.
    range_error: Exception | None = None

    def check_range(self, kwargs: dict[str, Any]) -> None:
        """Raise the static out-of-range error, unless ``kwargs`` choose a JAX ``mode``."""
        if self.range_error is not None and kwargs.get("mode") is None:
            raise self.range_error.with_traceback(None)

    def out_sharding(self, array: jax.Array) -> NamedSharding | None:
        """The sharding of ``array[index]`` by name, when anything is sharded over Explicit axes.

        Each output axis keeps the mesh axes it had: in ``x`` for kept and batch axes, in the index
        array for gathered ones; a mesh axis already used by an earlier output axis is dropped.
        """
        info = explicit_sharding(array)
        mesh = info[0] if info else None
        entries: list[Any] = []
        for src in self.sources:
            if isinstance(src, int):
                entries.append(info[1][src] if info else None)
            else:
                index_info = explicit_sharding(src[0].array)
                entries.append(index_info[1][src[1]] if index_info else None)
                if mesh is None and index_info is not None:
                    mesh = index_info[0]
        if mesh is None:
            return None
        used: set[str] = set()
        for k, e in enumerate(entries):
            names = set((e,) if isinstance(e, str) else (e or ()))
            if names & used:
                entries[k] = None
            used |= names
        return NamedSharding(mesh, PartitionSpec(*entries))

    def gather(self, x: NamedArray, **kwargs: Any) -> NamedArray:
        """``x[index]`` with names, sharded by name on Explicit meshes."""
        self.check_range(kwargs)
        array = unshard_dims(x.array, self.unshard)
        sharding = self.out_sharding(array)
        if self.along is not None and "out_sharding" not in kwargs:
            if sharding is not None:  # out_sharding() is in layout order; the gather gives `out`
                by_name = dict(zip((a.name for a in self.layout), sharding.spec))
                spec = PartitionSpec(*(by_name[a.name] for a in self.out))
                sharding = NamedSharding(sharding.mesh, spec)
            return _take_along(x, array, self, sharding, kwargs)
        if sharding is not None:
            kwargs.setdefault("out_sharding", sharding)
        return self.reorder(array.at[self.index].get(**kwargs))

    def reorder(self, array: jax.Array) -> NamedArray:
        """Wrap the result of ``x.array[index]`` with names, in ``out`` order."""
        names = [a.name for a in self.layout]
        perm = [names.index(a.name) for a in self.out]
        if perm != list(range(len(perm))):
            array = jnp.transpose(array, perm)
        return NamedArray(array, self.out)


def _parse_key(x: NamedArray, key: Any) -> dict[int, Any]:
    """``{dimension: index}`` from ``{"a": i}`` or ``("a", i, "b", j)``."""
    usage = "Index by name: x['batch', 3], x['batch', 3, 'seq', 0:4] or x[{'batch': 3}]."
    if isinstance(key, Mapping):
        pairs = list(key.items())
    elif (
        isinstance(key, tuple)
        and len(key) % 2 == 0
        and all(isinstance(k, (str, Axis)) for k in key[::2])
    ):
        pairs = list(zip(key[::2], key[1::2]))
    elif isinstance(key, (str, Axis)) or (
        isinstance(key, tuple) and key and isinstance(key[-1], (str, Axis))
    ):
        last = key[-1] if isinstance(key, tuple) else key
        raise NamedTypeError(
            f"Missing index for axis {axis_name(last)!r} in NamedArray({format_axes(x.axes)})[{key!r}]. "
            + usage
        )
    else:
        raise NamedTypeError(
            f"NamedArray({format_axes(x.axes)}) cannot be indexed by position ({key!r}): "
            "say which axis each index is for. " + usage
        )
    selection: dict[int, Any] = {}
    for sel, idx in pairs:
        if not isinstance(sel, (str, Axis)):
            raise NamedTypeError(
                f"Index keys must be axis names or Axis objects, got {sel!r}. " + usage
            )
        pos = find_axis(x.axes, sel)
        if pos in selection:
            raise DuplicateAxisError(
                f"Axis {x.axes[pos].name!r} is indexed twice in one selection; combine the indices."
            )
        selection[pos] = idx
    return selection


def _check_int_dtype(dtype: Any, ax: Axis, what: str) -> None:
    if not jnp.issubdtype(dtype, jnp.integer):
        hint = (
            " Boolean masks give data-dependent shapes and are not supported as positions; use "
            "where() to mask, or np.nonzero(mask)[0] for positions."
            if jnp.issubdtype(dtype, jnp.bool_)
            else ""
        )
        raise NamedTypeError(
            f"Index for axis {ax.name!r} must be integers, got {what} of dtype {np.dtype(dtype)}.{hint}"
        )


def _static_slice(v: slice, ax: Axis) -> tuple[slice, int]:
    try:
        bounds = [None if b is None else operator.index(b) for b in (v.start, v.stop, v.step)]
    except TypeError:
        raise NamedTypeError(
            f"Slice {v!r} for axis {ax.name!r} must have static integer bounds. For a traced start "
            f"use namedaxes.slice_axis(x, {ax.name!r}, start, length)."
        ) from None
    if bounds[2] == 0:
        raise AxisSizeError(f"Slice step for axis {ax.name!r} must not be zero.")
    s = _builtin_slice(*bounds)
    return s, len(range(*s.indices(ax.size)))


def _plan(x: NamedArray, selection: dict[int, Any]) -> _Plan:
    n = x.ndim
    entries: list[Any] = [_builtin_slice(None)] * n
    kept: list[Axis | None] = list(x.axes)  # axis after basic indexing; None once removed
    gathers: dict[int, NamedArray] = {}
    range_error = None  # the first static index outside its axis
    for pos, v in selection.items():
        ax = x.axes[pos]
        if isinstance(v, ds):  # a dynamic window is a gather of its positions
            v = v.indices(ax)
        if isinstance(v, _builtin_slice):
            entries[pos], size = _static_slice(v, ax)
            kept[pos] = Axis(ax.name, size)
            continue
        kept[pos] = None
        if is_static_int(v):
            i = int(v)
            error = check_static_index(ax, i, x.axes)
            range_error = range_error or error
            entries[pos] = i if error else i % ax.size
        elif isinstance(v, NamedArray):
            _check_int_dtype(v.dtype, ax, "a NamedArray")
            if v.ndim == 0:
                entries[pos] = v.array
            else:
                gathers[pos] = v
        else:
            if isinstance(v, (list, tuple, np.ndarray)):  # static: checked here, not clamped
                v, error = static_index_array(ax, v, x.axes)
                range_error = range_error or error
            shape = None if isinstance(v, type) else getattr(v, "shape", None)
            if shape is None or isinstance(v, (bool, np.bool_)):
                raise NamedTypeError(
                    f"Cannot index axis {ax.name!r} with {v!r} ({type(v).__name__}); use an int, a "
                    "slice, or an integer NamedArray."
                )
            _check_int_dtype(v.dtype, ax, f"an array of shape {tuple(shape)}")
            if len(shape) == 0:
                entries[pos] = v
            elif len(shape) == 1:
                gathers[pos] = NamedArray(v, (Axis(ax.name, int(shape[0])),))
            else:
                raise NamedTypeError(
                    f"Index for axis {ax.name!r} is a plain array of shape {tuple(shape)}; its "
                    "dimensions need names to say where they go. Wrap it first, e.g. "
                    f"named(idx, {tuple(f'axis{i}' for i in range(len(shape)))!r})."
                )
    unshard = tuple(
        i
        for i in range(n)
        if i in selection
        and not (isinstance(entries[i], _builtin_slice) and entries[i] == _builtin_slice(None))
    )
    if not gathers:
        layout = tuple(a for a in kept if a is not None)
        sources = tuple(i for i, a in enumerate(kept) if a is not None)
        return _Plan(tuple(entries), layout, layout, sources, unshard, range_error=range_error)

    slices = tuple(e if isinstance(e, _builtin_slice) else _builtin_slice(None) for e in entries)
    gathered: tuple[Axis, ...] = ()
    for v in gathers.values():
        gathered = broadcast_axes(gathered, v.axes)
    remaining = {a.name: i for i, a in enumerate(kept) if a is not None}
    new = tuple(b for b in gathered if b.name not in remaining)
    origin: dict[str, int | tuple[NamedArray, int]] = {
        b.name: remaining[b.name] for b in gathered if b.name in remaining
    }
    for v in gathers.values():
        for d, a in enumerate(v.axes):
            origin.setdefault(a.name, (v, d))
    for k, b in enumerate(gathered):
        if b.name not in remaining:
            continue
        i = remaining[b.name]
        if kept[i].size != b.size:  # type: ignore[union-attr]
            raise AxisSizeError(
                f"Index arrays share axis {b.name!r} (size {b.size}) with the indexed array, where it "
                f"has size {kept[i].size} (NamedArray({format_axes(x.axes)})). Shared axes are "  # type: ignore[union-attr]
                "matched pointwise, so their sizes must agree; rename the index axis to cross them."
            )
        # A batch axis: index it with its own positions so it is matched pointwise.
        positions = np.arange(*entries[i].indices(x.axes[i].size), dtype=np.int32)
        entries[i] = positions.reshape([b.size if j == k else 1 for j in range(len(gathered))])
    for pos, v in gathers.items():
        entries[pos] = align_to(v, gathered)

    # NumPy's rule: adjacent advanced indices put their dims in place, separated ones put them first.
    advanced = [i for i in range(n) if not isinstance(entries[i], _builtin_slice)]
    sliced = [i for i in range(n) if isinstance(entries[i], _builtin_slice)]
    if advanced == list(range(advanced[0], advanced[-1] + 1)):
        before = [kept[i] for i in sliced if i < advanced[0]]
        after = [kept[i] for i in sliced if i > advanced[0]]
        layout = tuple(before) + gathered + tuple(after)  # type: ignore[arg-type]
        sources = (
            tuple(i for i in sliced if i < advanced[0])
            + tuple(origin[b.name] for b in gathered)
            + tuple(i for i in sliced if i > advanced[0])
        )
    else:
        layout = gathered + tuple(kept[i] for i in sliced)  # type: ignore[misc]
        sources = tuple(origin[b.name] for b in gathered) + tuple(sliced)

    out: list[Axis] = []
    for i in range(n):
        if i in gathers:
            if i == min(gathers):
                out.extend(new)
        elif kept[i] is not None:
            out.append(kept[i])  # type: ignore[arg-type]
    along = None
    others = [v for i, v in selection.items() if i not in gathers]
    if len(gathers) == 1 and all(isinstance(v, _builtin_slice) for v in others):
        along = next(iter(gathers.items()))
        # The one-index gather reads its axis where it is: XLA partitions it (see _take_along).
        unshard = tuple(d for d in unshard if d != along[0])
    return _Plan(tuple(entries), layout, tuple(out), sources, unshard, along, slices, range_error)


_GATHER_KWARGS = (
    "mode",
    "fill_value",
    "indices_are_sorted",
    "unique_indices",
    "wrap_negative_indices",
)


def _take_along(
    x: NamedArray, array: jax.Array, plan: _Plan, sharding: Any, kwargs: dict[str, Any]
) -> NamedArray:
    """``x[{axis: index}]`` (plus slices) as one batched ``lax.gather``, like ``jnp.take_along_axis``.

    Index axes that ``x`` also has are gather *batching* dimensions (matched pointwise, as
    ``take_along_axis`` does), not extra index components built from ``arange``s: that NumPy-style
    gather needs collectives to partition where the batched one needs none. Neither operand is
    transposed: the index dimensions are ordered, and the operand's kept dimensions placed, so that
    the gather yields ``plan.out`` directly.
    """
    unknown = set(kwargs) - set(_GATHER_KWARGS)
    if unknown:
        raise NamedTypeError(
            f"Unexpected keyword argument(s) {format_names(sorted(unknown))} for a gather; "
            f"accepted: {format_names(_GATHER_KWARGS + ('out_sharding',))}."
        )
    pos, index = plan.along
    if any(s != _builtin_slice(None) for s in plan.slices):
        array = array[plan.slices]
    kept = [Axis(a.name, d) for a, d in zip(x.axes, array.shape)]
    gathered_size = kept[pos].size
    idx_axes = tuple(a for a in plan.out if index.has_axis(a.name))  # the result's order
    idx = align_to(index, idx_axes)
    if kwargs.pop("wrap_negative_indices", True) and jnp.issubdtype(idx.dtype, jnp.signedinteger):
        idx = jnp.where(idx < 0, idx + gathered_size, idx)  # x[-1] means the last entry, as in JAX
    names = [a.name for a in kept]
    batch = [d for d, a in enumerate(kept) if d != pos and index.has_axis(a.name)]
    idx_names = [a.name for a in idx_axes]
    dnums = jax.lax.GatherDimensionNumbers(
        offset_dims=tuple(i for i, a in enumerate(plan.out) if not index.has_axis(a.name)),
        collapsed_slice_dims=(pos,),
        start_index_map=(pos,),
        operand_batching_dims=tuple(batch),
        start_indices_batching_dims=tuple(idx_names.index(names[d]) for d in batch),
    )
    slice_sizes = tuple(1 if d == pos or d in batch else a.size for d, a in enumerate(kept))
    info = explicit_sharding(array)
    idx_info = explicit_sharding(idx)
    mine = dict(zip(names, info[1])) if info is not None else {}
    # A gathered dimension split over mesh axes stays split: each device gathers the entries it
    # holds (the others masked) and one all-reduce of the result sums them, as XLA partitions
    # the gather on Auto meshes, instead of gathering the whole operand first. Its mesh axes are
    # free in the result (the dimension is gone).
    split = bool(entry_axes(mine.pop(names[pos], None)))
    by_name = dict(mine)
    kept_by_index = False
    if idx_info is not None:
        # Index batch dimensions follow the operand. The index's other dimensions (an embedding
        # lookup's batch axes, which the table lacks) keep their own mesh axes when no kept
        # dimension of the operand uses them: the gather then needs no collective for them, and
        # JAX is told the result's sharding (it cannot infer it). Otherwise they are replicated.
        used = {m for e in mine.values() for m in entry_axes(e)}
        want = []
        for n, e in zip(idx_names, idx_info[1]):
            if n in names:
                want.append(mine.get(n))
            elif e is not None and not used.intersection(entry_axes(e)):
                want.append(e)
                used.update(entry_axes(e))
                kept_by_index = True
            else:
                want.append(None)
        if tuple(idx_info[1]) != tuple(want):
            idx = jax.sharding.reshard(idx, NamedSharding(idx_info[0], PartitionSpec(*want)))
        by_name.update(zip(idx_names, want))
    out_spec = None
    if split or kept_by_index:  # JAX cannot infer the result's sharding: say it, let XLA partition
        mesh = (idx_info or info)[0]  # type: ignore[index]
        out_spec = NamedSharding(mesh, PartitionSpec(*(by_name.get(a.name) for a in plan.out)))
    if out_spec is None:
        result = jax.lax.gather(array, idx[..., None], dnums, slice_sizes, **kwargs)
    else:
        result = jax.sharding.auto_axes(
            lambda a, i: jax.lax.gather(a, i[..., None], dnums, slice_sizes, **kwargs),
            out_sharding=out_spec,
        )(array, idx)
    if sharding is not None and explicit_sharding(result) != (sharding.mesh, list(sharding.spec)):
        result = jax.sharding.reshard(result, sharding)
    return NamedArray(result, plan.out)


def getitem(x: NamedArray, key: Any) -> NamedArray:
    """``x[key]``: index by name; see the module docstring of ``namedaxes._ops.indexing``.

    Example:
        >>> import jax.numpy as jnp
        >>> from namedaxes import named
        >>> x = named(jnp.zeros((2, 3, 4)), ("batch", "seq", "embed"))
        >>> x["seq", 0].axis_names, x[{"embed": slice(0, 2)}].shape
        (('batch', 'embed'), {'batch': 2, 'seq': 3, 'embed': 2})
    """
    return _plan(x, _parse_key(x, key)).gather(x)


# -- .at[...] -------------------------------------------------------------------------------


class _AtRef:
    """``x.at[selection]``: functional updates of the selected region (returns new arrays)."""

    __slots__ = ("_x", "_plan")

    def __init__(self, x: NamedArray, key: Any):
        self._x = x
        self._plan = _plan(x, _parse_key(x, key))

    def _values(self, values: Any, method: str) -> Any:
        region = self._plan.out
        if isinstance(values, NamedArray):
            by_name = {a.name: a for a in region}
            bad = [a for a in values.axes if by_name.get(a.name) != a]
            if bad:
                raise AxisSizeError(
                    f"x.at[...].{method}(): values NamedArray({format_axes(values.axes)}) has axes "
                    f"({format_axes(bad)}) that the selected region ({format_axes(region)}) does not "
                    f"have with those sizes. Values broadcast by name into the region; "
                    f"available axes: {format_names(a.name for a in region)}."
                )
            return align_to(values, self._plan.layout)
        shape = None if isinstance(values, type) else getattr(values, "shape", None)
        if shape is not None and len(shape) > 0:
            raise NamedTypeError(
                f"x.at[...].{method}() got a plain array of shape {tuple(shape)}; the selected region "
                f"has axes ({format_axes(region)}). Pass a scalar or a NamedArray, e.g. "
                f"named(v, {tuple(a.name for a in region)!r})."
            )
        return values

    def _update(self, method: str, values: Any, kwargs: dict[str, Any]) -> NamedArray:
        self._plan.check_range(kwargs)
        v = self._values(values, method)
        kwargs.setdefault("out_sharding", self._keep_sharding(v))
        if kwargs["out_sharding"] is None:
            del kwargs["out_sharding"]
        array = getattr(self._x.array.at[self._plan.index], method)(v, **kwargs)
        return NamedArray(array, self._x.axes)

    def _keep_sharding(self, values: Any) -> NamedSharding | None:
        """``x``'s sharding, when ``x``, an index array or ``values`` is on an Explicit mesh.

        JAX cannot infer the result's sharding of a scatter whose operands disagree (``x``
        replicated, a dynamic start sharded over ``batch``) and asks for one; the update keeps
        ``x``'s, replicated included.
        """
        arrays = [a for a in (self._x.array, values, *self._plan.index) if isinstance(a, jax.Array)]
        for info in map(explicit_sharding, arrays):
            if info is not None:
                own = explicit_sharding(self._x.array)
                spec = PartitionSpec(*own[1]) if own is not None else PartitionSpec()
                return NamedSharding(info[0], spec)
        return None

    def get(self, **kwargs: Any) -> NamedArray:
        """The selected region (like ``x[selection]``); ``kwargs`` go to JAX (e.g. ``mode="fill"``)."""
        return self._plan.gather(self._x, **kwargs)

    def set(self, values: Any, **kwargs: Any) -> NamedArray:
        """``x`` with the region replaced by ``values`` (a scalar or a NamedArray broadcast by name)."""
        return self._update("set", values, kwargs)

    def add(self, values: Any, **kwargs: Any) -> NamedArray:
        """``x`` with ``values`` added to the region."""
        return self._update("add", values, kwargs)

    def multiply(self, values: Any, **kwargs: Any) -> NamedArray:
        """``x`` with the region multiplied by ``values``."""
        return self._update("multiply", values, kwargs)

    def min(self, values: Any, **kwargs: Any) -> NamedArray:
        """``x`` with the region replaced by ``minimum(region, values)``."""
        return self._update("min", values, kwargs)

    def max(self, values: Any, **kwargs: Any) -> NamedArray:
        """``x`` with the region replaced by ``maximum(region, values)``."""
        return self._update("max", values, kwargs)

    def mul(self, values: Any, **kwargs: Any) -> NamedArray:
        """``x`` with the region multiplied by ``values`` (JAX's alias of ``multiply``)."""
        return self._update("multiply", values, kwargs)

    def divide(self, values: Any, **kwargs: Any) -> NamedArray:
        """``x`` with the region divided by ``values``."""
        return self._update("divide", values, kwargs)

    def power(self, values: Any, **kwargs: Any) -> NamedArray:
        """``x`` with the region raised to the power ``values``."""
        return self._update("power", values, kwargs)


class AtIndexer:
    """``x.at``: functional updates by name: ``x.at[{"seq": 0}].set(v)``, ``.add``, ``.multiply``,
    ``.min``, ``.max``, ``.get``. ``v`` is a scalar or a NamedArray broadcast by name to the
    selected region. A static index outside its axis raises ``AxisIndexError`` when the update
    runs, unless an explicit ``mode=`` (e.g. ``"drop"``, ``"fill"``) asks JAX to handle it; traced
    indices follow JAX (out-of-range updates are dropped, reads clamped).

    Example:
        >>> import jax.numpy as jnp
        >>> from namedaxes import named
        >>> x = named(jnp.zeros((2, 3)), ("batch", "seq"))
        >>> x.at["seq", 0].set(1.0).array[:, 0]
        Array([1., 1.], dtype=float32)
    """

    __slots__ = ("_x",)

    def __init__(self, x: NamedArray):
        self._x = x

    def __getitem__(self, key: Any) -> _AtRef:
        return _AtRef(self._x, key)


# -- functions -------------------------------------------------------------------------------


def take(x: NamedArray, axis: AxisSelector, indices: Any) -> NamedArray:
    """Gather along ``axis`` by integer indices.

    Args:
        x: The array.
        axis: The axis to index.
        indices: An int (the axis disappears), a 1-d integer array or list (the axis keeps its name
            with size ``len(indices)``), or an integer NamedArray, whose axes replace ``axis`` in
            place (an index axis that ``x`` also has is matched pointwise; see ``x[...]``).

    Returns:
        The gathered NamedArray. Traced (and other JAX-array) indices out of range are clamped,
        as in JAX.

    Raises:
        AxisNotFoundError: if ``axis`` is not an axis of ``x``.
        AxisIndexError: if a static index (an int, a list or a NumPy array) is outside ``axis``.
        NamedTypeError: if ``indices`` is not integer (floats, booleans: a mask is not a list of
            positions), or is a plain array with more than one dimension.

    Example:
        >>> import jax.numpy as jnp
        >>> from namedaxes import named, take
        >>> emb = named(jnp.zeros((10, 4)), ("vocab", "embed"))
        >>> ids = named(jnp.array([[1, 2, 3]]), ("batch", "seq"))
        >>> take(emb, "vocab", ids).shape
        {'batch': 1, 'seq': 3, 'embed': 4}
    """
    x = expect_named(x, "take")
    pos = find_axis(x.axes, axis)
    if isinstance(indices, _builtin_slice):
        raise NamedTypeError(
            f"take() needs integer indices for axis {x.axes[pos].name!r}, got {indices!r}. "
            f"Use x[{x.axes[pos].name!r}, start:stop] or namedaxes.slice_axis() for ranges."
        )
    return _plan(x, {pos: indices}).gather(x)


def slice_axis(x: NamedArray, axis: AxisSelector, start: Any, length: int) -> NamedArray:
    """Take ``length`` consecutive entries of ``axis`` from ``start``, which may be traced.

    Built on ``jax.lax.dynamic_slice_in_dim``, so it works under
    ``jax.jit`` with a traced ``start``; the size of the result stays static. On Explicit meshes a
    sharded ``axis`` is replicated first (JAX cannot slice it dynamically in place).

    Args:
        x: The array.
        axis: The axis to slice.
        start: An integer, or a 0-d integer array or NamedArray (possibly traced, e.g. from
            ``argmax``). A traced start that runs past the end is clamped by JAX so that the slice
            stays in bounds. For one start per batch entry use ``x[{axis: ds(start, length)}]``.
        length: The static new size of ``axis``.

    Returns:
        A NamedArray whose ``axis`` has size ``length``.

    Raises:
        AxisNotFoundError: if ``axis`` is not an axis of ``x``.
        AxisSizeError: if ``length`` exceeds the axis, or a static ``start + length`` does.
        NamedTypeError: if ``length`` is not a static int, or ``start`` is not one integer (it
            has axes or dimensions, or is not an integer).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import namedaxes as na
        >>> x = na.named(jnp.arange(10), ("seq",))
        >>> jax.jit(lambda s: na.slice_axis(x, "seq", s, 3))(4).array
        Array([4, 5, 6], dtype=int32)
    """
    x = expect_named(x, "slice_axis")
    i = find_axis(x.axes, axis)
    ax = x.axes[i]
    if not is_static_int(length):
        raise NamedTypeError(
            f"slice_axis(): length must be a static int (the new size of {ax.name!r}), got "
            f"{length!r}. Only start may be traced."
        )
    length = int(length)
    if not 0 <= length <= ax.size:
        raise AxisSizeError(
            f"slice_axis(): length {length} does not fit axis {ax.name!r} of size {ax.size} in "
            f"NamedArray({format_axes(x.axes)}). Use a length between 0 and {ax.size}."
        )
    start = scalar_int(
        "slice_axis",
        f"start for axis {ax.name!r}",
        start,
        lambda _: f"x[{{{ax.name!r}: na.ds(start, {length})}}]",
    )
    if is_static_int(start) and not 0 <= start <= ax.size - length:
        raise AxisSizeError(
            f"slice_axis(): start {start} with length {length} runs outside axis {ax.name!r} of "
            f"size {ax.size} in NamedArray({format_axes(x.axes)}). Use a start between 0 and "
            f"{ax.size - length}."
        )
    array = jax.lax.dynamic_slice_in_dim(unshard_dims(x.array, [i]), start, length, axis=i)
    return NamedArray(array, x.axes[:i] + (Axis(ax.name, length),) + x.axes[i + 1 :])
