"""``shard_map`` by name, and collectives that take logical axis names inside it.

``shard_map(fn)`` runs ``fn`` once per device on that device's block of every argument. The blocks
come from the mapping in force: each NamedArray argument is split as ``resolve`` places its axes,
and ``fn`` sees NamedArrays whose axis sizes are the local (per-device) sizes. Inside ``fn``,
``psum(x, "batch")`` means "sum over the devices that hold different parts of ``batch``", i.e.
over the mesh axes ``batch`` is placed on; ``pmean``, ``pmax``, ``pmin``, ``all_gather``,
``psum_scatter``, ``ppermute``, ``axis_index`` and ``shard_count`` work the same way. This is the
layer for the collectives people write by hand (ring attention, expert dispatch).

How outputs are put back together (each output NamedArray axis, by name):

* an axis an argument also had, with that argument's local size, is assembled as in that
  argument (sharded over the same mesh axes);
* any other axis (new, all-gathered, resized) is taken as replicated: every device must hold the
  same values, which ``check_vma`` verifies. Pass ``out_specs=`` to say otherwise.

Plain (unnamed) array arguments enter replicated; Python scalars and other non-array leaves are
passed to ``fn`` unchanged (and are part of the cache key: each wrapper keeps one jitted
``jax.shard_map`` per argument signature, so repeated eager calls trace once). When several
arguments have the same logical axis, the first one's placement is what the collectives use.
"""

from __future__ import annotations

import contextvars
import functools
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, cast

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from .._array import NamedArray
from .._axis import Axis, AxisSelector, axis_name, axis_names, find_axis
from .._errors import (
    AxisError,
    AxisSizeError,
    NamedTypeError,
    NoMeshError,
    ShardingError,
    format_axes,
    format_mesh,
    format_names,
)
from .._logical._context import current_axis_mapping
from .._logical._resolve import resolve
from .._spec import entry_axes, entry_of

__all__ = [
    "all_gather",
    "axis_index",
    "pmax",
    "pmean",
    "pmin",
    "ppermute",
    "psum",
    "psum_scatter",
    "shard_count",
    "shard_map",
]

# Inside a shard_map body: logical axis name -> the mesh axes it is split over, and the mesh sizes.
_PLACEMENT: contextvars.ContextVar[tuple[dict[str, tuple[str, ...]], dict[str, int]] | None] = (
    contextvars.ContextVar("namedaxes_shard_map_placement", default=None)
)


def _is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic)) or hasattr(x, "aval")


def _local(x: NamedArray) -> NamedArray:
    """A NamedArray whose axes carry its (per-device) array's sizes."""
    shape = x.array.shape
    return NamedArray(x.array, tuple(Axis(a.name, int(d)) for a, d in zip(x.axes, shape)))


def _context_mesh(mesh: Any) -> Any:
    if mesh is not None:
        return mesh
    abstract = jax.sharding.get_abstract_mesh()
    if abstract.empty:
        raise NoMeshError(
            "shard_map() needs a mesh: pass mesh=, or call it under `with jax.set_mesh(mesh):`."
        )
    return abstract


def shard_map(
    fn: Callable[..., Any] | None = None,
    *,
    mapping: Any = None,
    mesh: Any = None,
    in_specs: Any = None,
    out_specs: Any = None,
    check_vma: bool = True,
) -> Any:
    """Run ``fn`` per device on the blocks of its arguments, with specs derived from axis names.

    Use as ``shard_map(fn, ...)`` or as a decorator (``@shard_map`` / ``@shard_map(mapping=...)``).
    Built on ``jax.shard_map`` with every mesh axis manual; works eagerly and under ``jax.jit``, on
    Auto and Explicit meshes. See the module docstring for how inputs are split and outputs
    assembled.

    Args:
        fn: The per-device function. It receives NamedArrays with local axis sizes and may return
            any pytree of NamedArrays, arrays and scalars.
        mapping: The rules placing logical axes on mesh axes; defaults to the mapping in force
            (``axis_mapping``).
        mesh: A ``Mesh`` or ``AbstractMesh``; defaults to the one set with ``jax.set_mesh``.
        in_specs: Optional: ``PartitionSpec``s for the arguments (a prefix of ``args``), instead of
            the ones derived from the mapping.
        out_specs: Optional: ``PartitionSpec``s for the outputs (a prefix of the result).
        check_vma: Passed to ``jax.shard_map``: check that outputs declared replicated are.

    Returns:
        The wrapped function; it returns NamedArrays with global sizes.

    Raises:
        ShardingError: if there is no mapping (and no ``in_specs``), or ``resolve`` fails.
        NoMeshError: if there is no mesh.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import namedaxes as na
        >>> mesh = jax.make_mesh((1,), ("data",))
        >>> x = na.named(jnp.arange(4.0), "batch")
        >>> def total(x):
        ...     return na.psum(x.sum("batch"), "batch")  # local sum, then across shards
        >>> with jax.set_mesh(mesh), na.axis_mapping({"batch": "data"}):
        ...     na.shard_map(total)(x).item()
        6.0
    """
    if fn is None:
        return functools.partial(
            shard_map,
            mapping=mapping,
            mesh=mesh,
            in_specs=in_specs,
            out_specs=out_specs,
            check_vma=check_vma,
        )
    if not callable(fn):
        raise NamedTypeError(f"shard_map() needs a function, got {fn!r} ({type(fn).__name__}).")

    # One jitted shard_map per argument signature: repeated (eager) calls skip both traces.
    cache: OrderedDict[Any, Callable[..., Any]] = OrderedDict()

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        return _call(fn, args, kwargs, mapping, mesh, in_specs, out_specs, check_vma, cache)

    return wrapped


def _call(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    mapping: Any,
    mesh: Any,
    in_specs: Any,
    out_specs: Any,
    check_vma: bool,
    cache: OrderedDict[Any, Callable[..., Any]],
) -> Any:
    m = _context_mesh(mesh)
    sizes = dict(m.shape)
    rules = mapping if mapping is not None else current_axis_mapping()
    if rules is None and in_specs is None:
        raise ShardingError(
            "shard_map() needs a mapping to split its NamedArray arguments: pass mapping=, call it "
            "inside `with axis_mapping({...}):`, or give in_specs=."
        )
    is_named = lambda v: isinstance(v, NamedArray)  # noqa: E731
    leaves, treedef = jax.tree_util.tree_flatten((args, kwargs), is_leaf=is_named)
    dynamic = [i for i, v in enumerate(leaves) if isinstance(v, NamedArray) or _is_array(v)]
    static = {i: v for i, v in enumerate(leaves) if i not in set(dynamic)}
    dyn_leaves = [leaves[i] for i in dynamic]

    # Input specs and, from the NamedArray ones, where each logical name lives.
    if in_specs is None:
        specs = [
            resolve(v.axes, cast(Any, rules), m) if isinstance(v, NamedArray) else PartitionSpec()
            for v in dyn_leaves
        ]
    else:
        specs = _user_in_specs(in_specs, args, kwargs, dynamic)
    placement: dict[str, tuple[str, ...]] = {}
    seen: dict[str, tuple[int, int, Any]] = {}  # name -> (global size, local size, entry)
    for v, spec in zip(dyn_leaves, specs):
        if isinstance(v, NamedArray):
            for a, entry in zip(v.axes, tuple(spec) + (None,) * v.ndim):
                mesh_axes = entry_axes(entry)
                placement.setdefault(a.name, mesh_axes)
                n = math.prod(sizes[e] for e in mesh_axes)
                seen.setdefault(a.name, (a.size, a.size // n, entry))

    call_args = [_placed(v, spec, m, mesh) for v, spec in zip(dyn_leaves, specs)]
    key = _signature(treedef, static, call_args, specs, m, out_specs, check_vma)
    mapped = cache.get(key) if key is not None else None
    if mapped is None:
        mapped = _build(fn, treedef, len(leaves), dynamic, static, specs, placement, seen, sizes,
                        call_args, mesh, out_specs, check_vma)  # fmt: skip
        if key is not None:
            cache[key] = mapped
            if len(cache) > 32:
                cache.popitem(last=False)
    else:
        cache.move_to_end(key)
    try:
        out = mapped(call_args)
    except ValueError as e:
        if "out_specs" not in str(e) or "replicat" not in str(e):
            raise
        raise ShardingError(
            "shard_map(): an output is assembled as replicated over some mesh axes, but its value "
            "may differ between those devices. Outputs keep an argument's placement only for axes "
            "with that argument's local size; reduce across devices first (na.psum / na.pmean / "
            "na.all_gather) or pass out_specs=. JAX says: " + str(e).split("\n\n")[-1]
        ) from e
    return jax.tree_util.tree_map(
        lambda v: _global(v) if isinstance(v, NamedArray) else v,
        out,
        is_leaf=lambda v: isinstance(v, NamedArray),
    )


def _signature(
    treedef: Any, static: dict[int, Any], call_args: list[Any], specs: list[Any], m: Any,
    out_specs: Any, check_vma: bool,
) -> Any:  # fmt: skip
    """A hashable key for one call's structure, or ``None`` when something is unhashable."""
    try:
        avals = tuple(
            (v.axes, jax.typeof(v.array)) if isinstance(v, NamedArray) else (None, jax.typeof(v))
            for v in call_args
        )
        statics = tuple((i, type(v), v) for i, v in static.items())  # 1 and 1.0 differ here
        key = (treedef, statics, avals, tuple(specs), m, out_specs, check_vma)
        hash(key)
    except TypeError:
        return None
    return key


def _build(
    fn: Callable[..., Any], treedef: Any, n_leaves: int, dynamic: list[int],
    static: dict[int, Any], specs: list[Any], placement: dict[str, tuple[str, ...]],
    seen: dict[str, tuple[int, int, Any]], sizes: dict[str, int], call_args: list[Any], mesh: Any,
    out_specs: Any, check_vma: bool,
) -> Callable[..., Any]:  # fmt: skip
    """The jitted ``jax.shard_map`` of ``fn`` for one call signature."""

    def body(dyn: list[Any]) -> Any:
        full: list[Any] = [None] * n_leaves
        for i, v in zip(dynamic, dyn):
            full[i] = _local(v) if isinstance(v, NamedArray) else v
        for i, v in static.items():
            full[i] = v
        a, kw = jax.tree_util.tree_unflatten(treedef, full)
        token = _PLACEMENT.set((placement, sizes))
        try:
            return fn(*a, **kw)
        finally:
            _PLACEMENT.reset(token)

    jax_in_specs = (specs,)
    if out_specs is None:
        # A first trace, with every output replicated and unchecked, finds the outputs' axes.
        probe = jax.shard_map(
            body, mesh=mesh, in_specs=jax_in_specs, out_specs=PartitionSpec(), check_vma=False
        )
        local_out = jax.eval_shape(probe, call_args)
        out_specs = _output_specs(local_out, seen, sizes)
    mapped = jax.shard_map(
        body, mesh=mesh, in_specs=jax_in_specs, out_specs=out_specs, check_vma=check_vma
    )
    return jax.jit(mapped)


def _placed(v: Any, spec: Any, m: Any, mesh: Any) -> Any:
    """``v`` resharded to ``spec`` where its type's sharding (Explicit mesh axes) differs.

    On Explicit meshes ``jax.shard_map`` requires the arguments to already carry ``in_specs``;
    on Auto meshes it moves data itself.
    """
    if not any(t == AxisType.Explicit for t in getattr(m, "axis_types", ())):
        return v
    array = v.array if isinstance(v, NamedArray) else v
    spec = spec if isinstance(spec, PartitionSpec) else PartitionSpec()
    try:
        current = jax.typeof(array).sharding.spec
    except (AttributeError, TypeError):
        current = None
    ndim = len(array.shape)
    if current is not None and tuple(current) + (None,) * (ndim - len(current)) == tuple(spec) + (
        None,
    ) * (ndim - len(spec)):
        return v
    target = spec if mesh is None else NamedSharding(mesh, spec)
    array = jax.sharding.reshard(array, target)
    return NamedArray(array, v.axes) if isinstance(v, NamedArray) else array


def _user_in_specs(specs: Any, args: Any, kwargs: Any, dynamic: list[int]) -> list[Any]:
    """User ``in_specs`` (a prefix of ``args``) as one spec per dynamic leaf."""
    if kwargs:
        raise NamedTypeError("shard_map(in_specs=...) takes positional arguments only.")
    if isinstance(specs, PartitionSpec):
        specs = (specs,) * len(args)
    specs = tuple(specs) if isinstance(specs, list) else specs
    is_named = lambda v: isinstance(v, NamedArray)  # noqa: E731
    per_leaf = jax.tree_util.tree_map(
        lambda spec, sub: [spec] * len(jax.tree_util.tree_leaves(sub, is_leaf=is_named)),
        specs,
        args,
        is_leaf=lambda v: isinstance(v, PartitionSpec) or v is None,
    )
    flat = [
        spec
        for group in jax.tree_util.tree_leaves(per_leaf, is_leaf=lambda v: isinstance(v, list))
        for spec in group
    ]
    return [flat[i] for i in dynamic]


def _output_specs(
    local_out: Any, seen: dict[str, tuple[int, int, Any]], sizes: dict[str, int]
) -> Any:
    """One spec per output leaf: an axis with an input's local size is sharded as in that input."""

    def spec_for(v: Any) -> PartitionSpec:
        if not isinstance(v, NamedArray):
            return PartitionSpec()
        used: set[str] = set()
        entries: list[Any] = []
        for a in v.axes:
            info = seen.get(a.name)
            entry = info[2] if info is not None and info[1] == a.size else None
            mesh_axes = set(entry_axes(entry))
            if mesh_axes & used:
                raise ShardingError(
                    f"shard_map(): output NamedArray({format_axes(v.axes)}) would put mesh axes "
                    f"{format_names(sorted(mesh_axes & used))} on two of its axes. Pass out_specs=."
                )
            used |= mesh_axes
            entries.append(entry)
        return PartitionSpec(*entries)

    return jax.tree_util.tree_map(spec_for, local_out, is_leaf=lambda v: isinstance(v, NamedArray))


def _global(x: NamedArray) -> NamedArray:
    return NamedArray(x.array, tuple(Axis(a.name, int(d)) for a, d in zip(x.axes, x.array.shape)))


# -- collectives by logical name ------------------------------------------------------------------


def _mesh_axes(axis: AxisSelector | Sequence[AxisSelector], caller: str) -> tuple[str, ...]:
    """The mesh axes the logical ``axis`` (or axes) are split over in the enclosing shard_map."""
    ctx = _PLACEMENT.get()
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
    sizes = _PLACEMENT.get()[1]  # type: ignore[index]
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
        return NamedArray(jax.lax.ppermute(x.array, name, pairs), x.axes)
    return jax.tree_util.tree_map(lambda v: jax.lax.ppermute(v, name, pairs), x)
