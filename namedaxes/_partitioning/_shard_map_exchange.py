"""``all_to_all`` by logical axis name, inside ``shard_map``: the exchange of expert parallelism."""

from __future__ import annotations

import jax

from .._array import NamedArray
from .._axis import Axis, AxisSelector
from .._errors import NamedTypeError
from .._spec import entry_of
from ._shard_map import _check_blocks, _mesh_axes, _own_axis

__all__ = ["all_to_all"]


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
