"""Helpers every op family shares: operand checks and Explicit-mesh sharding fix-ups."""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

from .._array import NamedArray
from .._errors import AxisError, NamedTypeError, ShardingError, format_axes
from .._logical._context import current_axis_mapping
from .._logical._resolve import resolve
from .._mesh import explicit_axes
from .._spec import entry_axes, entry_of

__all__ = [
    "agree_by_name",
    "agree_on_dim",
    "check_layout",
    "describe_operand",
    "expect_named",
    "explicit_sharding",
    "join_by_name",
    "mapping_in_force",
    "scalar_keywords",
    "unshard_dims",
]


def describe_operand(x: Any) -> str:
    """A short description of a non-NamedArray operand for error messages."""
    shape = getattr(x, "shape", None)
    if shape is not None:
        return f"{type(x).__name__} of shape {tuple(shape)}"
    return f"{x!r} ({type(x).__name__})"


def check_layout(x: NamedArray) -> NamedArray:
    """Return ``x`` if its array's shape matches its axes, else raise an ``AxisError``.

    Construction checks this, but trees rebuilt by JAX are not checked (see ``NamedArray``), so
    ``jax.vmap``/``lax.map`` over a NamedArray hand named ops an array with a dimension removed
    or added, and ``in_axes=1`` moves one. Named ops check here, on every input; placeholders with
    no shape (``None``, sentinels) pass.
    """
    shape = getattr(x.array, "shape", None)
    if shape is None or tuple(shape) == tuple(a.size for a in x.axes):
        return x
    if not all(isinstance(d, int) for d in shape):  # symbolic dimensions: nothing to compare
        return x
    raise AxisError(
        f"NamedArray axes ({format_axes(x.axes)}) do not match its array's shape {tuple(shape)}: "
        "was it mapped by jax.vmap or lax.scan/lax.map? Map NamedArrays with na.vmap / na.scan, "
        "which keep names."
    )


def expect_named(x: Any, caller: str, arg: str = "x") -> NamedArray:
    """Return ``x`` if it is a NamedArray (with an array of its axes' shape, see
    :func:`check_layout`), else raise a ``NamedTypeError`` that says how to name it."""
    if isinstance(x, NamedArray):
        return check_layout(x)
    raise NamedTypeError(
        f"{caller}() needs a NamedArray for `{arg}`, got {describe_operand(x)}. "
        "Name its axes first, e.g. named(array, ('batch', 'embed'))."
    )


def scalar_keywords(
    caller: str,
    kwargs: dict[str, Any],
    fix: str = "compute the result with named ops, which broadcast by name",
) -> dict[str, Any]:
    """``kwargs`` for JAX, which takes them unchanged (``negative_slope=``, ``atol=``,
    ``initial=``): a 0-d NamedArray is a scalar and is unwrapped; one with axes is refused, since
    JAX would fail on it in its own terms, or name an op inside it. ``fix`` is the named way to
    the result, offered after "pass a scalar"."""
    for key, value in kwargs.items():
        if isinstance(value, NamedArray) and value.axes:
            raise NamedTypeError(
                f"{caller}(): keyword {key}= got NamedArray({format_axes(value.axes)}); keywords "
                "are passed to JAX as they are, with no axis names to broadcast by. Pass a scalar "
                f"for {key}=, or {fix}."
            )
    return {k: v.array if isinstance(v, NamedArray) else v for k, v in kwargs.items()}


def explicit_sharding(array: Any) -> tuple[Any, list[Any]] | None:
    """``(mesh, spec entries)`` of an array sharded over Explicit mesh axes, else ``None``.

    Works on concrete arrays and on tracers (the mesh is then abstract). Auto mesh axes never show
    up in an array's type, so arrays on Auto meshes (or on no mesh) give ``None``.
    """
    try:
        sharding = jax.typeof(array).sharding
    except (TypeError, AttributeError):
        return None
    spec, mesh = getattr(sharding, "spec", None), getattr(sharding, "mesh", None)
    if spec is None or mesh is None:
        return None
    entries = list(spec) + [None] * (len(array.shape) - len(spec))
    if all(e is None for e in entries):
        return None
    return mesh, entries


def unshard_dims(array: Any, dims: Sequence[int]) -> Any:
    """``array`` with ``dims`` replicated when they are sharded over Explicit mesh axes.

    On Explicit meshes JAX refuses ops that would move data across a sharded dimension (an integer
    index, a slice or split whose size does not divide, unstacking, a scan over it) and asks for an
    output sharding. On Auto meshes XLA gathers that dimension anyway; replicating it first makes
    both modes compute the same thing. The other dimensions keep their sharding.
    """
    info = explicit_sharding(array)
    if info is None:
        return array
    mesh, entries = info
    if all(entries[d] is None for d in dims):
        return array
    spec = jax.sharding.PartitionSpec(*(None if i in dims else e for i, e in enumerate(entries)))
    return jax.sharding.reshard(array, jax.sharding.NamedSharding(mesh, spec))


# -- operands whose shardings disagree (Explicit meshes) -------------------------------------------


def mapping_in_force(fallback_mesh: Any = None) -> tuple[Any, Any] | None:
    """``(rules, mesh)`` of the mapping in force, or ``None`` when no mapping (or no mesh) is set.

    The mesh is the context's (``jax.sharding.get_abstract_mesh()``), else ``fallback_mesh`` (the
    mesh the operands live on).
    """
    rules = current_axis_mapping()
    if rules is None:
        return None
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        mesh = fallback_mesh
    if mesh is None or getattr(mesh, "empty", False):
        return None
    return rules, mesh


def _conflict(
    operands: Sequence[NamedArray],
    infos: Sequence[Any],
    labels: Sequence[str],
    keep: Collection[str] | None,
) -> str | None:
    """Why the operands' Explicit shardings cannot be combined by name, or ``None``.

    Two operands disagree when one axis name is sharded over different mesh axes in them (JAX:
    "incompatible shardings"), or when one mesh axis shards two different axes of the result (JAX:
    "illegally sharded result"). A sharded axis meeting an unsharded one is fine: JAX keeps the
    sharding. ``keep`` limits the second check to the result's axes (contractions sum the others).
    """
    by_name: dict[str, tuple[tuple[str, ...], int]] = {}
    owner: dict[str, tuple[str, int]] = {}
    for i, (x, info) in enumerate(zip(operands, infos)):
        if info is None:
            continue
        for a, entry in zip(x.axes, info[1]):
            mesh_axes = entry_axes(entry)
            if not mesh_axes:
                continue
            first, j = by_name.setdefault(a.name, (mesh_axes, i))
            if first != mesh_axes:
                return (
                    f"axis {a.name!r} is sharded over {first} in {labels[j]} but over {mesh_axes} "
                    f"in {labels[i]}"
                )
            if keep is not None and a.name not in keep:
                continue
            for m in mesh_axes:
                name, j = owner.setdefault(m, (a.name, i))
                if name != a.name:
                    return (
                        f"mesh axis {m!r} shards {name!r} in {labels[j]} and {a.name!r} in "
                        f"{labels[i]}, but one mesh axis can shard only one axis of the result"
                    )
    return None


def _describe(x: NamedArray, info: Any) -> str:
    entries = info[1] if info is not None else [None] * x.ndim
    parts = []
    for a, entry in zip(x.axes, entries):
        mesh_axes = entry_axes(entry)
        parts.append(f"{a.name}={a.size}" + (f"@{'+'.join(mesh_axes)}" if mesh_axes else ""))
    return f"NamedArray({', '.join(parts)})"


def agree_by_name(
    caller: str,
    operands: Sequence[Any],
    labels: Sequence[str] | None = None,
    keep: Collection[str] | None = None,
) -> list[Any]:
    """``operands`` with Explicit shardings that JAX can combine, resharded by name if needed.

    On Explicit meshes shardings are part of the types, and JAX refuses an op whose operands shard
    axes in ways that cannot both hold (a weight stored FSDP-sharded ``(embed@data)`` meeting an
    activation ``(batch@data, embed)``). Then every sharded operand is resharded to the mapping in
    force (``current_axis_mapping()`` resolved with ``resolve`` over all the operands' axes on the
    context mesh), so model code runs unchanged on Auto and Explicit meshes. Operands that agree,
    and everything on Auto meshes, pass through untouched. Non-NamedArray operands pass through.

    Args:
        caller: The op's name, for messages.
        operands: NamedArrays (other operands are returned unchanged).
        labels: How messages name each operand (default ``operand 1``, ...).
        keep: Axis names of the result; ``None`` for all (elementwise ops).

    Raises:
        ShardingError: if the shardings conflict and no mapping is in force (fail closed: the
            message shows each operand's shardings and says to set an ``axis_mapping``).
    """
    infos = [explicit_sharding(x.array) if isinstance(x, NamedArray) else None for x in operands]
    if all(info is None for info in infos):  # Auto meshes, no mesh, or nothing sharded
        return list(operands)
    labels = list(labels) if labels else [f"operand {i + 1}" for i in range(len(operands))]
    named_ops = [x for x in operands if isinstance(x, NamedArray)]
    named_infos = [info for x, info in zip(operands, infos) if isinstance(x, NamedArray)]
    named_labels = [w for x, w in zip(operands, labels) if isinstance(x, NamedArray)]
    why = _conflict(named_ops, named_infos, named_labels, keep)
    if why is None:
        return list(operands)
    mesh = next(info[0] for info in infos if info is not None)
    found = mapping_in_force(mesh)
    if found is None:
        shown = "; ".join(
            f"{w}: {_describe(x, info)}" for x, info, w in zip(named_ops, named_infos, named_labels)
        )
        raise ShardingError(
            f"{caller}(): the operands' shardings conflict on an Explicit mesh: {why} ({shown}). "
            "Put the mapping to compute with in force, e.g. `with na.axis_mapping({'batch': "
            "'data'}):`, and the operands are resharded by it; or reshard one operand yourself."
        )
    rules, mesh = found
    every: dict[str, Any] = {}
    for x in named_ops:
        for a in x.axes:
            every.setdefault(a.name, a)
    # Over the union of the operands' axes, so a mesh axis goes to one name for all operands. An
    # axis whose rule cannot apply here (its mesh axes taken by another operand's axis) is
    # replicated: this placement is internal to the op.
    spec = resolve(tuple(every.values()), rules, mesh, unsatisfied="replicate")
    explicit = explicit_axes(mesh)
    target = {
        name: tuple(m for m in entry_axes(entry) if m in explicit) or None
        for name, entry in zip(every, spec)
    }
    out = []
    for x, info in zip(operands, infos):
        if info is not None:
            want = PartitionSpec(*(entry_of(target[a.name]) for a in x.axes))
            if tuple(entry_axes(e) for e in info[1]) != tuple(entry_axes(e) for e in want):
                x = NamedArray(jax.sharding.reshard(x.array, NamedSharding(info[0], want)), x.axes)
        out.append(x)
    return out


def join_by_name(
    caller: str, operands: Sequence[NamedArray], along: str | None = None
) -> list[NamedArray]:
    """``operands`` (same axis names) with one Explicit sharding, for ops that join them.

    JAX concatenates and stacks only operands sharded alike. Shardings that conflict are settled
    by ``agree_by_name`` (the mapping in force, else a ``ShardingError``); then each axis takes the
    mesh axes that any operand shards it over, so an unsharded operand is split like the sharded
    ones (a local slice, no data moves between devices). The joined axis ``along`` keeps its
    mesh axes only when they divide every operand's size along it. Auto meshes: unchanged.
    """
    labels = [f"arrays[{k}]" for k in range(len(operands))]
    operands = agree_by_name(caller, operands, labels)
    infos = [explicit_sharding(x.array) for x in operands]
    found = next((info for info in infos if info is not None), None)
    if found is None:
        return list(operands)
    mesh = found[0]
    sizes = dict(mesh.shape)
    target: dict[str, tuple[str, ...]] = {}
    for x, info in zip(operands, infos):
        for a, entry in zip(x.axes, info[1] if info is not None else ()):
            if entry_axes(entry):
                target.setdefault(a.name, entry_axes(entry))
    if along is not None and along in target:
        k = math.prod(sizes[m] for m in target[along])
        if any(x.axis_size(along) % k for x in operands):
            del target[along]
    out = []
    for x, info in zip(operands, infos):
        have = tuple(entry_axes(e) for e in info[1]) if info is not None else ((),) * x.ndim
        want = tuple(target.get(a.name, ()) for a in x.axes)
        if have != want:
            spec = PartitionSpec(*(entry_of(w) for w in want))
            x = NamedArray(jax.sharding.reshard(x.array, NamedSharding(mesh, spec)), x.axes)
        out.append(x)
    return out


def agree_on_dim(
    caller: str, axis: Any, arrays: Sequence[Any], dims: Sequence[int], labels: Sequence[str]
) -> list[Any]:
    """``arrays`` with the dimension ``dims[k]`` of each (all the axis ``axis``) sharded alike.

    ``jax.vmap`` on Explicit meshes wants the mapped dimension sharded the same in every mapped
    argument, where elementwise ops accept a sharded axis meeting an unsharded one. When the
    arrays disagree, that dimension takes the mapping in force's Explicit mesh axes for ``axis``,
    else the one sharding the arrays use (a replicated array is split locally: no data moves).
    Another dimension of an array holding one of those mesh axes is replicated to free it. Arrays
    that agree, and arrays on Auto meshes, pass through untouched.

    Args:
        caller: The op's name, for messages.
        axis: The ``Axis`` the dimensions hold (its mapping is looked up by name).
        arrays: JAX or NumPy arrays.
        dims: The dimension of each array that holds ``axis``.
        labels: How messages name each array.

    Raises:
        ShardingError: if the arrays shard ``axis`` over different mesh axes and no mapping is in
            force (the message names each array's sharding and says to set an ``axis_mapping``).
    """
    infos = [explicit_sharding(a) for a in arrays]
    have = [entry_axes(info[1][d]) if info else () for info, d in zip(infos, dims)]
    if len(set(have)) <= 1:
        return list(arrays)
    mesh = next(info[0] for info in infos if info is not None)
    found = mapping_in_force(mesh)
    if found is not None:
        rules, context = found
        (entry,) = resolve((axis,), rules, context, unsatisfied="replicate")
        target = tuple(m for m in entry_axes(entry) if m in explicit_axes(context))
    else:
        sharded = sorted({h for h in have if h})
        if len(sharded) > 1:
            shown = "; ".join(f"{w}: {'+'.join(h) or 'unsharded'}" for w, h in zip(labels, have))
            raise ShardingError(
                f"{caller}(): axis {axis.name!r} is sharded over different mesh axes in different "
                f"arguments on an Explicit mesh ({shown}). Put the mapping to compute with in "
                f"force, e.g. `with na.axis_mapping({{{axis.name!r}: 'data'}}):`, and they are "
                "resharded by it; or reshard one argument yourself."
            )
        (target,) = sharded
    out = []
    for a, info, d, h in zip(arrays, infos, dims, have):
        if h != target:
            entries = info[1] if info is not None else [None] * len(a.shape)
            free = [tuple(m for m in entry_axes(e) if m not in target) for e in entries]
            free[d] = target
            spec = PartitionSpec(*(entry_of(f) for f in free))
            a = jax.sharding.reshard(a, NamedSharding(mesh, spec))
        out.append(a)
    return out
