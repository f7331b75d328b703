"""``shard_map`` by name (the collectives that take logical axis names inside it are in
``_collectives``).

``shard_map(fn)`` runs ``fn`` once per device on that device's block of every argument. The blocks
come from the one plan of the arguments under the mapping in force (``plan_tree``, as ``shard``
and ``pspec_for`` place them): each NamedArray, and each ``field(axis_names=...)`` array of an
equinox module, is split as ``resolve`` places its axes, and ``fn`` sees NamedArrays whose axis
sizes are the local (per-device) sizes (and field arrays of the local shapes). The mapping's mesh
axes are checked against the mesh even when no argument has names. Inside ``fn``,
``psum(x, "batch")`` means "sum over the devices that hold different parts of ``batch``", i.e.
over the mesh axes ``batch`` is placed on; ``pmean``, ``pmax``, ``pmin``, ``all_gather``,
``psum_scatter``, ``ppermute``, ``axis_index`` and ``shard_count`` work the same way. This is the
layer for the collectives people write by hand (ring attention, expert dispatch).

How outputs are put back together (each axis of an output NamedArray or field array, by name):

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

import functools
import math
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, cast

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from .._array import NamedArray
from .._axis import Axis
from .._errors import (
    NamedTypeError,
    NoMeshError,
    ShardingError,
    format_axes,
    format_names,
)
from .._logical._context import current_rules, rules_in_force
from .._spec import entry_axes
from ._collectives import SHARD_MAP_PLACEMENT
from ._plan import TreePlan, plan_tree
from ._tree import FieldAxes, leaf_axes, walk

__all__ = ["shard_map"]


def _is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic)) or hasattr(x, "aval")


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
        fn: The per-device function. It receives NamedArrays with local axis sizes (and modules
            whose ``field(axis_names=...)`` arrays are local blocks) and may return any pytree of
            NamedArrays, modules, arrays and scalars.
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
        ShardingError: if there is no mapping (and no ``in_specs``), the mapping names a mesh axis
            the mesh lacks, or ``resolve`` fails.
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
    leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
    if mapping is None and current_rules() is None:
        if in_specs is None:
            raise ShardingError(
                "shard_map() needs a mapping to split its NamedArray arguments: pass mapping=, "
                "call it inside `with axis_mapping({...}):`, or give in_specs=."
            )
        infos = walk((args, kwargs), treedef).infos
        plan = None
    else:  # the one plan: NamedArrays and field(axis_names=...) arrays, the mapping checked
        rules = rules_in_force(mapping, "shard_map")
        plan = plan_tree((args, kwargs), rules, m, caller="shard_map", flat=(leaves, treedef))
        infos = plan.walk.infos
    dynamic = [i for i, v in enumerate(leaves) if _is_array(v)]
    static = {i: v for i, v in enumerate(leaves) if not _is_array(v)}
    dyn_leaves = [leaves[i] for i in dynamic]
    dyn_axes = [leaf_axes(infos[i], leaves[i]) for i in dynamic]

    # Input specs (a leaf without names enters replicated) and where each logical name lives.
    if in_specs is not None:
        specs = _user_in_specs(in_specs, args, kwargs, dynamic)
    else:
        planned = cast(TreePlan, plan)
        specs = [
            PartitionSpec() if axes is None else planned.spec(i)
            for i, axes in zip(dynamic, dyn_axes)
        ]
    placement: dict[str, tuple[str, ...]] = {}
    seen: dict[str, tuple[int, int, Any]] = {}  # name -> (global size, local size, entry)
    for axes, spec in zip(dyn_axes, specs):
        for a, entry in zip(axes or (), tuple(spec) + (None,) * len(axes or ())):
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
    return jax.tree_util.tree_map(_resized, out, is_leaf=_is_named)


def _is_named(v: Any) -> bool:
    return isinstance(v, NamedArray)


def _resized(v: Any) -> Any:
    """A NamedArray whose axes carry its array's sizes (the local ones inside the body, the
    global ones outside); any other value as is."""
    if not isinstance(v, NamedArray) or v.array is None:  # None: an eqx.partition half
        return v
    return NamedArray(v.array, tuple(Axis(a.name, int(d)) for a, d in zip(v.axes, v.array.shape)))


def _signature(
    treedef: Any, static: dict[int, Any], call_args: list[Any], specs: list[Any], m: Any,
    out_specs: Any, check_vma: bool,
) -> Any:  # fmt: skip
    """A hashable key for one call's structure, or ``None`` when something is unhashable.

    NamedArray axes are part of ``treedef``; the arrays' types carry shapes and shardings."""
    try:
        avals = tuple(jax.typeof(v) for v in call_args)
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
            full[i] = v
        for i, v in static.items():
            full[i] = v
        # NamedArrays rebuilt from the treedef carry global sizes: give them their blocks'.
        a, kw = jax.tree_util.tree_map(
            _resized, jax.tree_util.tree_unflatten(treedef, full), is_leaf=_is_named
        )
        token = SHARD_MAP_PLACEMENT.set((placement, sizes))
        try:
            return fn(*a, **kw)
        finally:
            SHARD_MAP_PLACEMENT.reset(token)

    jax_in_specs = (specs,)
    if out_specs is None:
        # A first trace, with every output replicated and unchecked, finds the outputs' axes.
        probe = jax.shard_map(
            body, mesh=mesh, in_specs=jax_in_specs, out_specs=PartitionSpec(), check_vma=False
        )
        local_out = jax.eval_shape(probe, call_args)
        out_specs = _output_specs(local_out, seen)
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
    per_leaf = jax.tree_util.tree_map(
        lambda spec, sub: [spec] * len(jax.tree_util.tree_leaves(sub)),
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


def _output_specs(local_out: Any, seen: dict[str, tuple[int, int, Any]]) -> Any:
    """One spec per output leaf, by the tree walk: an axis of a named leaf (a NamedArray or a
    ``field(axis_names=...)`` array) with an input's local size is sharded as in that input."""
    leaves, treedef = jax.tree_util.tree_flatten(local_out)
    infos = walk(local_out, treedef).infos

    def spec_for(info: Any, leaf: Any) -> PartitionSpec:
        axes = leaf_axes(info, leaf)
        if axes is None:
            return PartitionSpec()
        used: set[str] = set()
        entries: list[Any] = []
        for a in axes:
            known = seen.get(a.name)
            entry = known[2] if known is not None and known[1] == a.size else None
            mesh_axes = set(entry_axes(entry))
            if mesh_axes & used:
                what = info.field if isinstance(info, FieldAxes) else "NamedArray"
                raise ShardingError(
                    f"shard_map(): output {what}({format_axes(axes)}) would put mesh axes "
                    f"{format_names(sorted(mesh_axes & used))} on two of its axes. Pass out_specs=."
                )
            used |= mesh_axes
            entries.append(entry)
        return PartitionSpec(*entries)

    specs = [spec_for(info, leaf) for info, leaf in zip(infos, leaves)]
    return jax.tree_util.tree_unflatten(treedef, specs)
