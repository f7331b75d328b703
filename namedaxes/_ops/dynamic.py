"""Dynamic slices by name: ``ds(start, size)`` for ``x[...]``/``x.at[...]`` and ``updated_slice``.

A start may be a Python int, a traced 0-d integer array, or an integer NamedArray over batch axes
(one start per batch entry, e.g. the write position of each sequence in a KV cache). Sizes are
static. As in ``jax.lax.dynamic_slice``, a start is clamped so that the window stays inside the
axis; a static start that does not fit is an error instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from .._array import NamedArray
from .._axis import Axis, AxisSelector, check_unique, find_axis, index_of
from .._errors import AxisError, AxisSizeError, NamedTypeError, format_axes, format_names
from ._align import align_to
from ._checks import is_static_int
from ._common import expect_named, explicit_sharding, unshard_dims

__all__ = ["ds", "updated_slice"]


def _check_start(start: Any, ax: Axis, size: int, caller: str) -> Any:
    """A valid start for a window of ``size`` along ``ax``: static ones checked, others typed."""
    if is_static_int(start):
        if not 0 <= int(start) <= ax.size - size:
            raise AxisSizeError(
                f"{caller}: start {int(start)} with size {size} runs outside axis {ax.name!r} of size "
                f"{ax.size}. Use a start between 0 and {ax.size - size}."
            )
        return int(start)
    if isinstance(start, NamedArray):
        if not jnp.issubdtype(start.dtype, jnp.integer):
            raise NamedTypeError(
                f"{caller}: start for axis {ax.name!r} must be integers, got {start.dtype}."
            )
        if start.has_axis(ax.name):
            raise AxisError(
                f"{caller}: start NamedArray({format_axes(start.axes)}) has the sliced axis "
                f"{ax.name!r}; per-entry starts may only vary over other (batch) axes."
            )
        return start
    shape = None if isinstance(start, type) else getattr(start, "shape", None)
    if shape is None or len(shape) != 0 or not jnp.issubdtype(start.dtype, jnp.integer):
        raise NamedTypeError(
            f"{caller}: start for axis {ax.name!r} must be an int, a 0-d integer array or an integer "
            f"NamedArray over batch axes, got {start!r}."
        )
    return start


@dataclass(frozen=True)
class ds:  # noqa: N801 - short lowercase name, like jax.lax's and Pallas' ds
    """A dynamic window ``[start, start + size)`` of one axis, for ``x[...]`` and ``x.at[...]``.

    ``x["seq", na.ds(start, 4)]`` keeps the ``seq`` axis with size 4. ``start`` may be traced, and
    may be an integer NamedArray over batch axes of ``x`` (one window per batch entry). A traced
    start is clamped so that the window fits (as ``jax.lax.dynamic_slice``); a static one that does
    not fit raises ``AxisSizeError``.

    Args:
        start: An int, a 0-d integer array, or an integer NamedArray over other axes of ``x``.
        size: The static window length (the new size of the axis).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import namedaxes as na
        >>> x = na.named(jnp.arange(10), "seq")
        >>> jax.jit(lambda s: x["seq", na.ds(s, 3)])(8).array  # clamped to start 7
        Array([7, 8, 9], dtype=int32)
        >>> x.at["seq", na.ds(2, 2)].set(0).array
        Array([0, 1, 0, 0, 4, 5, 6, 7, 8, 9], dtype=int32)
    """

    start: Any
    size: int

    def __post_init__(self) -> None:
        if not is_static_int(self.size) or self.size < 0:
            raise NamedTypeError(
                f"ds(start, size): size must be a static int >= 0, got {self.size!r}. Only the "
                "start may be traced."
            )

    def indices(self, ax: Axis) -> Any:
        """Integer positions of the window along ``ax``: a 1-d array, or a NamedArray over the
        start's axes plus ``Axis(ax.name, size)`` for per-entry starts."""
        if self.size > ax.size:
            raise AxisSizeError(
                f"ds(): size {self.size} does not fit axis {ax.name!r} of size {ax.size}."
            )
        start = _check_start(self.start, ax, self.size, "ds()")
        offsets = jnp.arange(self.size, dtype=jnp.int32)
        if is_static_int(start):
            return np.arange(start, start + self.size, dtype=np.int32)
        if isinstance(start, NamedArray):
            first = jnp.clip(start.array, 0, ax.size - self.size).astype(jnp.int32)
            window = jnp.expand_dims(first, -1) + offsets.reshape((1,) * first.ndim + (self.size,))
            return NamedArray(window, start.axes + (Axis(ax.name, self.size),))
        return jnp.clip(start, 0, ax.size - self.size).astype(jnp.int32) + offsets


def updated_slice(
    x: NamedArray, start: Mapping[AxisSelector, Any], update: NamedArray
) -> NamedArray:
    """``x`` with the window at ``start`` replaced by ``update`` (``dynamic_update_slice`` by name).

    Args:
        x: The array to update.
        start: ``{axis: start}`` for the axes where ``update`` is smaller than ``x``. Each start is
            an int, a 0-d integer array (possibly traced), or an integer NamedArray over other axes
            of ``x`` (a different start per batch entry). Axes not listed start at 0.
        update: A NamedArray whose axes are axes of ``x`` (any order; axes it lacks are broadcast).
            Its sizes give the window; unlisted axes must have ``x``'s size. Its dtype must be
            ``x``'s or one that promotes to it (``bfloat16`` into ``float32``).

    Returns:
        A NamedArray with ``x``'s axes, layout and (on Explicit meshes) sharding.

    Raises:
        AxisNotFoundError: if a start names an axis ``x`` lacks.
        AxisError: if ``update`` has an axis ``x`` lacks, or a per-entry start varies over a
            sliced axis or an axis ``x`` lacks.
        NamedTypeError: if ``update``'s dtype does not promote to ``x``'s (a float update into
            an int array): cast it with ``update.astype(x.dtype)``.
        AxisSizeError: if ``update`` is larger than ``x`` along an axis, smaller along an axis
            without a start, or a static start does not fit.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> cache = na.zeros({"batch": 2, "seq": 4}, dtype=jnp.int32)
        >>> new = na.named(jnp.array([[7], [8]]), ("batch", "seq"))
        >>> pos = na.named(jnp.array([1, 3]), "batch")  # one write position per sequence
        >>> na.updated_slice(cache, {"seq": pos}, new).array
        Array([[0, 7, 0, 0],
               [0, 0, 0, 8]], dtype=int32)
    """
    x = expect_named(x, "updated_slice")
    update = expect_named(update, "updated_slice", "update")
    if not isinstance(start, Mapping):
        raise NamedTypeError(
            f"updated_slice() takes starts as a {{axis: start}} dict, got {start!r}; e.g. "
            "updated_slice(x, {'seq': 3}, update)."
        )
    check_unique(list(start))
    _check_update_dtype(x, update)
    extra = [a.name for a in update.axes if not x.has_axis(a.name)]
    if extra:
        raise AxisError(
            f"updated_slice(): update NamedArray({format_axes(update.axes)}) has axes "
            f"{format_names(extra)} that x NamedArray({format_axes(x.axes)}) lacks."
        )
    starts: dict[int, Any] = {}
    window: list[Axis] = []
    for ax in x.axes:
        size = update.axis_size(ax.name) if update.has_axis(ax.name) else ax.size
        if size > ax.size:
            raise AxisSizeError(
                f"updated_slice(): update has {ax.name!r}={size}, larger than x's "
                f"{ax.name!r}={ax.size}."
            )
        window.append(Axis(ax.name, size))
    for sel, s in start.items():
        i = find_axis(x.axes, sel)
        starts[i] = _check_start(s, x.axes[i], window[i].size, "updated_slice()")
    for i, ax in enumerate(x.axes):
        if i not in starts and window[i].size != ax.size:
            raise AxisSizeError(
                f"updated_slice(): update has {ax.name!r}={window[i].size} but x has "
                f"{ax.name!r}={ax.size} and no start was given for it. Add {{{ax.name!r}: start}}."
            )
    batch: list[str] = []
    for i, s in starts.items():
        if isinstance(s, NamedArray):
            for a in s.axes:
                where = f"x NamedArray({format_axes(x.axes)}) (a start's batch axis)"
                j = find_axis(x.axes, a.name, where=where)
                if x.axes[j].size != a.size:
                    raise AxisSizeError(
                        f"updated_slice(): start for {x.axes[i].name!r} has {a.name!r}={a.size}, "
                        f"but x has {a.name!r}={x.axes[j].size}."
                    )
                if j in starts:
                    raise AxisError(
                        f"updated_slice(): the start for {x.axes[i].name!r} varies over "
                        f"{a.name!r}, which is itself sliced; per-entry starts may only vary over "
                        "unsliced axes."
                    )
                if a.name not in batch:
                    batch.append(a.name)
    upd = jnp.broadcast_to(align_to(update, tuple(window)), tuple(w.size for w in window))
    upd = upd.astype(x.dtype)  # a dtype that promotes to x's (checked above)
    # On Explicit meshes JAX wants the operand and the update sharded alike; the window's axes
    # cannot stay sharded (their sizes differ), so they are replicated and the result resharded.
    info = explicit_sharding(x.array)
    array = unshard_dims(x.array, tuple(starts))
    inner = explicit_sharding(array)
    if inner is not None:
        upd = jax.sharding.reshard(upd, NamedSharding(inner[0], PartitionSpec(*inner[1])))
    elif (sharded := explicit_sharding(upd)) is not None:  # into a replicated x: replicate both
        replicated = NamedSharding(sharded[0], PartitionSpec())
        array = jax.sharding.reshard(array, replicated)
        upd = jax.sharding.reshard(upd, replicated)
    starts = {i: _sharded_like(s, array, x.axes) for i, s in starts.items()}
    out = _update(array, upd, x.axes, starts, batch)
    if info is not None:
        out = jax.sharding.reshard(out, NamedSharding(info[0], PartitionSpec(*info[1])))
    return NamedArray(out, x.axes)


def _check_update_dtype(x: NamedArray, update: NamedArray) -> None:
    """Refuse an update whose dtype does not promote to ``x``'s (a float into an int array):
    ``lax.dynamic_update_slice`` and ``x.at[].set`` refuse it too, rather than cast it silently.

    A dtype that promotes (``bfloat16`` into ``float32``, ``int8`` into ``int32``, a weakly typed
    update of the same kind) is cast, as the promotion mode in force allows.
    """
    if update.dtype == x.dtype:
        return
    why = f"{update.dtype} does not promote to {x.dtype}"
    try:
        ok = jnp.result_type(update.array, x.dtype) == x.dtype
    except jax.dtypes.TypePromotionError:  # no implicit promotion at all in the mode in force
        ok, why = False, "jax_numpy_dtype_promotion='strict' promotes no dtype to another"
    if not ok:
        raise NamedTypeError(
            f"updated_slice(): update has dtype {update.dtype} and x has {x.dtype}; {why}, so "
            f"writing it would cast it silently. Cast it on purpose: "
            f"update.astype({str(x.dtype)!r})."
        )


def _sharded_like(start: Any, array: Any, axes: tuple[Axis, ...]) -> Any:
    """A per-entry ``start`` with each of its (batch) axes sharded as ``array`` (with ``axes``) is.

    ``jax.vmap`` on Explicit meshes maps only arguments that shard the mapped dimension alike, so
    the (small) starts follow the operand: a KV cache sharded over batch takes replicated positions.
    """
    if not isinstance(start, NamedArray):
        return start
    have, want = explicit_sharding(start.array), explicit_sharding(array)
    if have is None and want is None:
        return start
    mesh, entries = want if want is not None else (have[0], [None] * len(axes))
    spec = PartitionSpec(*(entries[index_of(axes, a.name)] for a in start.axes))
    if have is not None and PartitionSpec(*have[1]) == spec:
        return start
    return NamedArray(jax.sharding.reshard(start.array, NamedSharding(mesh, spec)), start.axes)


def _update(
    array: Any, upd: Any, axes: tuple[Axis, ...], starts: dict[int, Any], batch: list[str]
) -> Any:
    """``dynamic_update_slice``; per-entry starts vmap it over their batch axes, one at a time."""
    if not batch:
        index: list[Any] = [
            0 if i not in starts else (s.array if isinstance(s, NamedArray) else s)
            for i, s in ((i, starts.get(i)) for i in range(len(axes)))
        ]
        return jax.lax.dynamic_update_slice(array, upd, index)
    name = batch[0]
    d = next(i for i, a in enumerate(axes) if a.name == name)
    inner_axes = axes[:d] + axes[d + 1 :]
    inner_starts_axes: dict[int, Any] = {}
    start_leaves: list[Any] = []
    start_dims: list[Any] = []
    for i, s in starts.items():
        j = i if i < d else i - 1
        if isinstance(s, NamedArray) and s.has_axis(name):
            k = s.axis_index(name)
            start_leaves.append(s.array)
            start_dims.append(k)
            inner_starts_axes[j] = s.axes[:k] + s.axes[k + 1 :]
        else:
            start_leaves.append(s.array if isinstance(s, NamedArray) else s)
            start_dims.append(None)
            inner_starts_axes[j] = s.axes if isinstance(s, NamedArray) else None
    keys = [i if i < d else i - 1 for i in starts]

    def one(a: Any, u: Any, leaves: list[Any]) -> Any:
        inner = {
            k: (NamedArray(v, inner_starts_axes[k]) if inner_starts_axes[k] is not None else v)
            for k, v in zip(keys, leaves)
        }
        return _update(a, u, inner_axes, inner, batch[1:])

    return jax.vmap(one, in_axes=(d, d, start_dims), out_axes=d)(array, upd, start_leaves)
