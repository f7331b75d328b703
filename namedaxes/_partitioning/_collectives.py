"""Collectives by logical axis name, inside ``shard_map``.

``psum(x, "batch")`` means "sum over the devices that hold different parts of ``batch``", i.e.
over the mesh axes ``batch`` is placed on in the enclosing ``shard_map`` (which records, per
logical name, those mesh axes in ``SHARD_MAP_PLACEMENT`` while its body runs). ``pmean``, ``pmax``,
``pmin``, ``all_gather``, ``psum_scatter``, ``ppermute``, ``axis_index``, ``shard_count`` and
``all_to_all`` (the exchange of expert parallelism) work the same way.
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax

from .._array import NamedArray
from .._axis import Axis, AxisSelector, axis_name, axis_names, find_axis
from .._errors import (
    AxisError,
    AxisSizeError,
    NamedTypeError,
    ShardingError,
    format_axes,
    format_mesh,
    format_names,
)
from .._spec import entry_of

__all__ = [
    "all_gather",
    "all_to_all",
    "axis_index",
    "pmax",
    "pmean",
    "pmin",
    "permute_blocks",
    "ppermute",
    "psum",
    "psum_scatter",
    "shard_count",
]

# Inside a shard_map body: logical axis name -> the mesh axes it is split over, and the mesh sizes.
SHARD_MAP_PLACEMENT: contextvars.ContextVar[
    tuple[dict[str, tuple[str, ...]], dict[str, int]] | None
] = contextvars.ContextVar("namedaxes_shard_map_placement", default=None)


def _mesh_axes(axis: AxisSelector | Sequence[AxisSelector], caller: str) -> tuple[str, ...]:
    """The mesh axes the logical ``axis`` (or axes) are split over in the enclosing shard_map."""
    ctx = SHARD_MAP_PLACEMENT.get()
    if ctx is None:
        raise ShardingError(
            f"{caller}() by logical axis name only works inside namedaxes.shard_map (it needs to know "
            "which mesh axes each name is split over). For mesh axes, use jax.lax directly."
        )
    placement, sizes = ctx
    out: list[str] = []
    for name in axis_names(axis):
        if name not in placement:
            raise AxisError(
                f"{caller}(): logical axis {name!r} is not an axis of any shard_map argument, so its "
                f"placement is unknown. Known axes: {format_names(placement)}. (Mesh "
                f"{format_mesh(sizes)} axes are used through jax.lax.)"
            )
        out.extend(m for m in placement[name] if m not in out)
    return tuple(out)


def _reduce(caller: str, prim: Callable[..., Any], x: Any, axis: Any) -> Any:
    mesh_axes = _mesh_axes(axis, caller)
    if not mesh_axes:  # one shard: reducing over it changes nothing
        return x
    if isinstance(x, NamedArray):
        return NamedArray(prim(x.array, mesh_axes), x.axes)
    return jax.tree_util.tree_map(lambda v: prim(v, mesh_axes), x)


def psum(x: Any, axis: AxisSelector | Sequence[AxisSelector]) -> Any:
    """Sum ``x`` over the devices holding different parts of the logical ``axis`` (or axes).

    Only inside :func:`shard_map`. This is a cross-device sum of equally shaped blocks: it does not
    remove an axis of ``x`` (sum it locally first: ``psum(x.sum("batch"), "batch")`` is the global
    sum over ``batch``). If ``axis`` is not split over any mesh axis there is one block, and ``x``
    is returned as is.

    Args:
        x: A NamedArray, or a pytree of arrays.
        axis: A logical axis name (or several) of the shard_map's arguments.

    Returns:
        ``x`` summed across those devices (same axes).

    Raises:
        ShardingError: outside ``shard_map``.
        AxisError: if no argument of the shard_map has ``axis``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import namedaxes as na
        >>> mesh = jax.make_mesh((1,), ("data",))
        >>> with jax.set_mesh(mesh), na.axis_mapping({"batch": "data"}):
        ...     f = na.shard_map(lambda x: na.psum(x.sum("batch"), "batch"))
        ...     f(na.named(jnp.ones(4), "batch")).item()
        4.0
    """
    return _reduce("psum", jax.lax.psum, x, axis)


def pmean(x: Any, axis: AxisSelector | Sequence[AxisSelector]) -> Any:
    """Mean of ``x`` over the devices holding parts of ``axis``; as :func:`psum`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import namedaxes as na
        >>> with jax.set_mesh(jax.make_mesh((1,), ("data",))), na.axis_mapping({"batch": "data"}):
        ...     f = na.shard_map(lambda x: na.pmean(x.mean("batch"), "batch"))
        ...     f(na.named(jnp.ones(4), "batch")).item()
        1.0
    """
    return _reduce("pmean", jax.lax.pmean, x, axis)


def pmax(x: Any, axis: AxisSelector | Sequence[AxisSelector]) -> Any:
    """Maximum of ``x`` over the devices holding parts of ``axis``; as :func:`psum`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import namedaxes as na
        >>> with jax.set_mesh(jax.make_mesh((1,), ("data",))), na.axis_mapping({"batch": "data"}):
        ...     f = na.shard_map(lambda x: na.pmax(x.max("batch"), "batch"))
        ...     f(na.named(jnp.ones(4), "batch")).item()
        1.0
    """
    return _reduce("pmax", jax.lax.pmax, x, axis)


def pmin(x: Any, axis: AxisSelector | Sequence[AxisSelector]) -> Any:
    """Minimum of ``x`` over the devices holding parts of ``axis``; as :func:`psum`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import namedaxes as na
        >>> with jax.set_mesh(jax.make_mesh((1,), ("data",))), na.axis_mapping({"batch": "data"}):
        ...     f = na.shard_map(lambda x: na.pmin(x.min("batch"), "batch"))
        ...     f(na.named(jnp.ones(4), "batch")).item()
        1.0
    """
    return _reduce("pmin", jax.lax.pmin, x, axis)


def _own_axis(x: Any, axis: AxisSelector, caller: str) -> int:
    if not isinstance(x, NamedArray):
        raise NamedTypeError(
            f"{caller}() needs a NamedArray that has axis {axis_name(axis)!r}, got {type(x).__name__}."
        )
    return find_axis(x.axes, axis_name(axis))


def all_gather(x: NamedArray, axis: AxisSelector) -> NamedArray:
    """Concatenate the blocks of ``x``'s ``axis`` from every device that holds a part of it.

    Only inside :func:`shard_map`. The local ``axis`` grows to its global size (every device then
    holds all of it); the other axes are untouched.

    Raises:
        ShardingError: outside ``shard_map``.
        AxisNotFoundError: if ``x`` has no ``axis``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import namedaxes as na
        >>> with jax.set_mesh(jax.make_mesh((1,), ("data",))), na.axis_mapping({"batch": "data"}):
        ...     na.shard_map(lambda x: na.all_gather(x, "batch"))(na.named(jnp.ones(4), "batch"))
        NamedArray(float32, batch=4)
    """
    i = _own_axis(x, axis, "all_gather")
    mesh_axes = _mesh_axes(axis, "all_gather")
    if not mesh_axes:
        return x
    # "invarying": every device then holds the same values, and the type says so (outputs
    # declared replicated pass check_vma).
    out = jax.lax.all_gather(x.array, mesh_axes, axis=i, tiled=True, to="invarying")
    return NamedArray(out, x.axes[:i] + (Axis(x.axes[i].name, out.shape[i]),) + x.axes[i + 1 :])


def psum_scatter(x: NamedArray, axis: AxisSelector) -> NamedArray:
    """Sum ``x`` across the devices holding parts of ``axis`` and keep this device's block of it.

    The inverse layout of :func:`all_gather` (a reduce-scatter): ``x``'s local ``axis``, which must
    be the full axis, shrinks to one block, summed over the devices.

    Raises:
        ShardingError: outside ``shard_map``.
        AxisSizeError: if the axis does not divide over the devices.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import namedaxes as na
        >>> with jax.set_mesh(jax.make_mesh((1,), ("data",))), na.axis_mapping({"batch": "data"}):
        ...     f = na.shard_map(lambda x: na.psum_scatter(na.all_gather(x, "batch"), "batch"))
        ...     f(na.named(jnp.ones(4), "batch")).array
        Array([1., 1., 1., 1.], dtype=float32)
    """
    i = _own_axis(x, axis, "psum_scatter")
    mesh_axes = _mesh_axes(axis, "psum_scatter")
    if not mesh_axes:
        return x
    _check_blocks(x, i, axis, "psum_scatter")
    out = jax.lax.psum_scatter(x.array, mesh_axes, scatter_dimension=i, tiled=True)
    return NamedArray(out, x.axes[:i] + (Axis(x.axes[i].name, out.shape[i]),) + x.axes[i + 1 :])


def _check_blocks(x: NamedArray, i: int, axis: AxisSelector, caller: str) -> None:
    """Refuse an axis ``i`` of ``x`` that does not split into one block per device of ``axis``."""
    n = shard_count(axis)
    if x.axes[i].size % n:
        raise AxisSizeError(
            f"{caller}(): axis {x.axes[i].name!r} of NamedArray({format_axes(x.axes)}) does not "
            f"split into {n} blocks (one per device of {axis_name(axis)!r}). Pad it to a multiple "
            f"of {n}."
        )


def shard_count(axis: AxisSelector | Sequence[AxisSelector]) -> int:
    """How many blocks the logical ``axis`` is split into (1 if it is not split). Inside shard_map.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import namedaxes as na
        >>> with jax.set_mesh(jax.make_mesh((1,), ("data",))), na.axis_mapping({"batch": "data"}):
        ...     f = na.shard_map(lambda x: x * na.shard_count("batch"))
        ...     f(na.named(jnp.ones(2), "batch")).array
        Array([1., 1.], dtype=float32)
    """
    mesh_axes = _mesh_axes(axis, "shard_count")
    sizes = SHARD_MAP_PLACEMENT.get()[1]  # type: ignore[index]
    return math.prod(sizes[m] for m in mesh_axes)


def axis_index(axis: AxisSelector | Sequence[AxisSelector]) -> Any:
    """This device's block number along the logical ``axis`` (0-d int array; 0 if not split).

    Blocks are numbered in the order the data is laid out: block ``i`` holds entries
    ``i * local_size`` to ``(i + 1) * local_size - 1`` of the axis.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import namedaxes as na
        >>> with jax.set_mesh(jax.make_mesh((1,), ("data",))), na.axis_mapping({"batch": "data"}):
        ...     f = lambda x: x + na.axis_index("batch").astype(x.dtype)
        ...     na.shard_map(f)(na.named(jnp.zeros(2), "batch")).array
        Array([0., 0.], dtype=float32)
    """
    mesh_axes = _mesh_axes(axis, "axis_index")
    if not mesh_axes:
        return jax.numpy.zeros((), jax.numpy.int32)
    return jax.lax.axis_index(entry_of(mesh_axes))


def ppermute(
    x: Any,
    axis: AxisSelector | Sequence[AxisSelector],
    perm: Sequence[tuple[int, int]] | None = None,
    *,
    shift: int | None = None,
) -> Any:
    """Send ``x`` between the blocks of the logical ``axis``: block ``src`` sends to block ``dst``.

    Give either ``perm`` (``(src, dst)`` pairs of block numbers, see :func:`axis_index`) or
    ``shift`` (every block sends to block ``(i + shift) % shard_count(axis)``: a ring step, as in
    ring attention). Blocks that receive nothing get zeros, as in ``jax.lax.ppermute``.

    Raises:
        ShardingError: outside ``shard_map``.
        NamedTypeError: unless exactly one of ``perm`` and ``shift`` is given.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import namedaxes as na
        >>> with jax.set_mesh(jax.make_mesh((1,), ("data",))), na.axis_mapping({"batch": "data"}):
        ...     f = na.shard_map(lambda x: na.ppermute(x, "batch", shift=1))
        ...     f(na.named(jnp.ones(2), "batch")).array
        Array([1., 1.], dtype=float32)
    """
    if (perm is None) == (shift is None):
        raise NamedTypeError("ppermute() takes exactly one of perm= (src, dst) pairs and shift=.")
    mesh_axes = _mesh_axes(axis, "ppermute")
    n = shard_count(axis)
    if shift is not None:
        perm = [(i, (i + shift) % n) for i in range(n)]
    pairs = [(int(s), int(d)) for s, d in perm]  # type: ignore[union-attr]
    bad = [p for p in pairs if not (0 <= p[0] < n and 0 <= p[1] < n)]
    if bad:
        raise AxisError(
            f"ppermute(): pairs {bad} are outside the {n} blocks of {axis_names(axis)}."
        )
    if not mesh_axes:
        return x
    name = entry_of(mesh_axes)
    if isinstance(x, NamedArray):
        return NamedArray(permute_blocks(x.array, name, pairs), x.axes)
    return jax.tree_util.tree_map(lambda v: permute_blocks(v, name, pairs), x)


def permute_blocks(x: Any, axes: str | tuple[str, ...], pairs: Sequence[tuple[int, int]]) -> Any:
    """``jax.lax.ppermute`` with blocks numbered as ``jax.lax.axis_index(axes)`` numbers them.

    For several mesh axes, ``axis_index`` (like a ``PartitionSpec`` entry, ``all_gather`` and
    ``all_to_all``) counts blocks with the first listed axis major, but ``ppermute`` reads its
    pairs in the mesh's axis order: an entry listed out of mesh order, ``("model", "data")`` on a
    ``("data", "model")`` mesh, sent blocks to the wrong devices. Every ring in the library goes
    through here.
    """
    if isinstance(axes, str):
        return jax.lax.ppermute(x, axes, pairs)
    mesh = jax.sharding.get_abstract_mesh()
    names = tuple(mesh.axis_names)
    in_mesh = tuple(sorted(axes, key=names.index))
    if in_mesh == tuple(axes):
        return jax.lax.ppermute(x, axes, pairs)
    sizes = dict(zip(names, mesh.axis_sizes))

    def renumbered(block: int) -> int:
        coords = {}
        for a in reversed(axes):  # the listed order: the last axis is the minor one
            block, coords[a] = divmod(block, sizes[a])
        out = 0
        for a in in_mesh:
            out = out * sizes[a] + coords[a]
        return out

    return jax.lax.ppermute(x, axes, [(renumbered(s), renumbered(d)) for s, d in pairs])


def all_to_all(
    x: NamedArray, axis: AxisSelector, *, split: AxisSelector, concat: AxisSelector
) -> NamedArray:
    """Exchange blocks of ``x`` between the devices that hold parts of the logical ``axis``.

    Only inside :func:`shard_map`. With ``n`` such devices, ``x``'s ``split`` axis is cut into
    ``n`` blocks; block ``i`` goes to the device with block number ``i`` of ``axis`` (see
    :func:`axis_index`), and each device concatenates the blocks it receives along ``concat``, in
    the senders' order. ``split`` shrinks ``n``-fold and ``concat`` grows ``n``-fold (both keep
    their size when they are the same axis: then block ``i`` of the result came from device
    ``i``). This is how expert parallelism sends tokens to the devices that hold their experts
    (``jax.lax.all_to_all``). With one device along ``axis``, ``x`` is returned as is.

    Args:
        x: A NamedArray with the ``split`` and ``concat`` axes.
        axis: The logical axis whose devices exchange blocks (e.g. ``"experts"``).
        split: The axis of ``x`` cut into one block per device.
        concat: The axis of ``x`` the received blocks are concatenated along.

    Returns:
        ``x`` with its ``split`` and ``concat`` axes resized.

    Raises:
        ShardingError: outside ``shard_map``.
        AxisNotFoundError: if ``x`` lacks ``split`` or ``concat``.
        AxisSizeError: if ``split`` does not divide into one block per device.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import namedaxes as na
        >>> mesh = jax.make_mesh((4,), ("model",))
        >>> w = na.named(jnp.zeros((4, 2)), ("experts", "embed"))  # experts on 4 devices
        >>> def exchange(w):
        ...     me = na.axis_index("experts").astype(jnp.float32)
        ...     x = na.named(jnp.full((4,), me), "dest")  # device `me` sends `me` to everyone
        ...     return na.all_to_all(x, "experts", split="dest", concat="dest")
        >>> with jax.set_mesh(mesh), na.axis_mapping({"experts": "model"}):
        ...     f = na.shard_map(exchange, out_specs=jax.sharding.PartitionSpec(), check_vma=False)
        ...     f(w).array  # block i came from device i, on every device
        Array([0., 1., 2., 3.], dtype=float32)
    """
    if not isinstance(x, NamedArray):
        raise NamedTypeError(f"all_to_all() needs a NamedArray, got {type(x).__name__}.")
    i = _own_axis(x, split, "all_to_all")
    j = _own_axis(x, concat, "all_to_all")
    mesh_axes = _mesh_axes(axis, "all_to_all")
    if not mesh_axes:
        return x
    _check_blocks(x, i, axis, "all_to_all")
    name = entry_of(mesh_axes)
    out = jax.lax.all_to_all(x.array, name, split_axis=i, concat_axis=j, tiled=True)
    axes = tuple(Axis(a.name, int(d)) for a, d in zip(x.axes, out.shape))
    return NamedArray(out, axes)
