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

from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

from .._array import NamedArray
from .._axis import Axis, AxisSelector, find_axis
from .._errors import (
    AxisSizeError,
    NamedTypeError,
    format_axes,
    format_names,
)
from ._align import align_to
from ._checks import is_static_int, scalar_int
from ._common import expect_named, explicit_sharding, unshard_dims
from ._selection import parse_key, plan_selection

__all__ = ["take", "slice_axis"]


def getitem(x: NamedArray, key: Any) -> NamedArray:
    """``x[key]``: index by name; see the module docstring of ``namedaxes._ops.indexing``.

    Example:
        >>> import jax.numpy as jnp
        >>> from namedaxes import named
        >>> x = named(jnp.zeros((2, 3, 4)), ("batch", "seq", "embed"))
        >>> x["seq", 0].axis_names, x[{"embed": slice(0, 2)}].shape
        (('batch', 'embed'), {'batch': 2, 'seq': 3, 'embed': 2})
    """
    x = expect_named(x, "getitem")
    return plan_selection(x, parse_key(x, key)).gather(x)


# -- .at[...] -------------------------------------------------------------------------------


class _AtRef:
    """``x.at[selection]``: functional updates of the selected region (returns new arrays)."""

    __slots__ = ("_x", "_plan")

    def __init__(self, x: NamedArray, key: Any):
        self._x = x
        self._plan = plan_selection(x, parse_key(x, key))

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
    if isinstance(indices, slice):
        raise NamedTypeError(
            f"take() needs integer indices for axis {x.axes[pos].name!r}, got {indices!r}. "
            f"Use x[{x.axes[pos].name!r}, start:stop] or namedaxes.slice_axis() for ranges."
        )
    return plan_selection(x, {pos: indices}).gather(x)


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
