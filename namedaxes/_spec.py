"""``PartitionSpec`` entry arithmetic and one check (and one message) per spec invariant.

Every place that validates a spec written by a user or a rule (the rules, the analyzer, the
planner) builds its messages here, so each invariant is stated once:

* every entry is ``None``, a mesh-axis name or a tuple of names;
* a mesh axis shards at most one dimension (and appears once);
* every named mesh axis exists in the mesh;
* a spec has at most one entry per dimension of the array;
* a sharded dimension's size is divisible by the product of its mesh axes.

Pure: no JAX computation, only ``PartitionSpec`` values and ``{mesh_axis: size}`` mappings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from jax.sharding import PartitionSpec

from ._errors import format_mesh, format_names

__all__ = [
    "entry_axes",
    "entry_of",
    "rank_problem",
    "spec_alone_problems",
    "spec_problems",
]


def entry_axes(entry: Any) -> tuple[str, ...]:
    """The mesh axes of one ``PartitionSpec`` entry (``None``/unconstrained give ``()``).

    Example:
        >>> entry_axes(("data", "model")), entry_axes("data"), entry_axes(None)
        (('data', 'model'), ('data',), ())
    """
    if entry is None or entry is PartitionSpec.UNCONSTRAINED:
        return ()
    if isinstance(entry, str):
        return (entry,)
    if isinstance(entry, (tuple, list)):
        return tuple(entry)
    return (entry,)  # not a name: the entry check reports it


def entry_of(mesh_axes: Sequence[str] | None) -> str | tuple[str, ...] | None:
    """The ``PartitionSpec`` entry for ``mesh_axes`` (the inverse of ``entry_axes``): ``None`` for
    none, the name for one, a tuple for several.

    Example:
        >>> entry_of(("data", "model")), entry_of(("data",)), entry_of(())
        (('data', 'model'), 'data', None)
    """
    if not mesh_axes:
        return None
    return mesh_axes[0] if len(mesh_axes) == 1 else tuple(mesh_axes)


def _bad_entry(spec: PartitionSpec, entry: Any) -> str:
    return (
        f"spec {spec} has entry {entry!r}, which is not a mesh axis name (use None, a name, or a "
        "tuple of names)"
    )


def _repeated(spec: PartitionSpec, names: Sequence[str]) -> str:
    return (
        f"spec {spec} uses mesh axis {format_names(dict.fromkeys(names))} more than once; each "
        "mesh axis may shard at most one dimension of an array"
    )


def _unknown(spec: PartitionSpec, names: Sequence[str], sizes: Mapping[str, int]) -> str:
    return (
        f"spec {spec} names mesh axis {format_names(names)}, which is not in the mesh "
        f"{format_mesh(sizes)}. Available mesh axes: {format_names(sizes)}"
    )


def rank_problem(shape: Sequence[int], spec: PartitionSpec) -> str | None:
    """A spec longer than the array's rank, or ``None``.

    Example:
        >>> rank_problem((8,), PartitionSpec("data", None))
        "spec P('data', None) has 2 entries but the array has rank 1 (shape (8,)); give at most one entry per dimension"
    """
    if len(spec) <= len(shape):
        return None
    return (
        f"spec {spec} has {len(spec)} entries but the array has rank {len(shape)} (shape "
        f"{tuple(shape)}); give at most one entry per dimension"
    )


def spec_alone_problems(spec: PartitionSpec) -> list[str]:
    """What is wrong with ``spec`` whatever the mesh and array: malformed entries, a mesh axis
    used twice.

    Example:
        >>> spec_alone_problems(PartitionSpec("data", "data"))
        ["spec P('data', 'data') uses mesh axis 'data' more than once; each mesh axis may shard at most one dimension of an array"]
    """
    problems = []
    seen: list[str] = []
    for entry in spec:
        names = entry_axes(entry)
        if any(not isinstance(n, str) for n in names):
            problems.append(_bad_entry(spec, entry))
            continue
        seen.extend(names)
    repeated = [n for n in dict.fromkeys(seen) if seen.count(n) > 1]
    if repeated:
        problems.append(_repeated(spec, repeated))
    return problems


def spec_problems(
    shape: Sequence[int], spec: Any, sizes: Mapping[str, int], *, divisible: bool = True
) -> list[str]:
    """Everything wrong with ``spec`` for an array of ``shape`` on a mesh of ``sizes``.

    Messages do not name the leaf; callers prefix its path. Returns ``[]`` for a valid spec.

    Example:
        >>> spec_problems((6, 4), PartitionSpec("model"), {"data": 2, "model": 4})
        ["dimension 0 of shape (6, 4) has size 6, which is not divisible by 4 (model=4) in spec P('model',); pick mesh axes whose product divides it, or pad the dimension"]
    """
    if not isinstance(spec, PartitionSpec):
        return [
            f"expected a PartitionSpec (or None for a replicated array), got {spec!r} "
            f"({type(spec).__name__})"
        ]
    problems = []
    rank = rank_problem(shape, spec)
    if rank:
        problems.append(rank)
    seen: set[str] = set()
    for dim, entry in enumerate(spec):
        names = entry_axes(entry)
        if any(not isinstance(n, str) for n in names):
            problems.append(_bad_entry(spec, entry))
            continue
        unknown = [n for n in names if n not in sizes]
        if unknown:
            problems.append(_unknown(spec, unknown, sizes))
            continue
        dups = [n for n in names if n in seen or names.count(n) > 1]
        if dups:
            problems.append(_repeated(spec, dups))
        seen.update(names)
        if divisible and dim < len(shape) and names:
            k = math.prod(sizes[n] for n in names)
            if shape[dim] % k:
                factors = " x ".join(f"{n}={sizes[n]}" for n in names)
                problems.append(
                    f"dimension {dim} of shape {tuple(shape)} has size {shape[dim]}, which is not "
                    f"divisible by {k} ({factors}) in spec {spec}; pick mesh axes whose product "
                    "divides it, or pad the dimension"
                )
    return problems
