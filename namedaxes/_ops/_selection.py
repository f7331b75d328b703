"""How a named selection becomes one positional JAX index: parsing ``x[key]``, planning the
index (``_Plan``), and the batched gather a one-index selection reads with.

The public behaviour (what each kind of index does, how results are sharded) is described in
``namedaxes._ops.indexing``, which uses the plan for reads, ``x.at[...]`` updates, ``take`` and
``slice_axis``.
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
from .._axis import Axis, axis_name, broadcast_axes, find_axis
from .._errors import (
    AxisSizeError,
    DuplicateAxisError,
    NamedTypeError,
    format_axes,
    format_names,
)
from .._spec import entry_axes
from ._align import align_to
from ._checks import check_static_index, is_static_int, static_index_array
from ._common import explicit_sharding, unshard_dims
from .dynamic import ds

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


def parse_key(x: NamedArray, key: Any) -> dict[int, Any]:
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


def plan_selection(x: NamedArray, selection: dict[int, Any]) -> _Plan:
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
