"""Checks the pattern rules share: the optional mesh, specs on their own, specs against a mesh.

``ShapeBasedShardingRule`` and ``PathRegexRule`` return specs the user wrote. They need no mesh to
do that, so a mesh is optional: without one (given or set with ``jax.set_mesh``) a spec is checked
for what needs no mesh (well-formed entries, no mesh axis twice, not longer than the array's
rank); with one, every pattern's spec is also checked against the mesh's axes, whether or not a
leaf matches it, so a typo never waits for the day a leaf matches.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jax.sharding import AbstractMesh, Mesh, PartitionSpec

from .._errors import MeshError, ShardingError, format_mesh, format_names, with_prefix
from .._logical._resolve import check_rules_mesh_axes
from .._mesh import MeshLike, context_mesh, mesh_axis_sizes, same_placement
from .._spec import entry_axes, rank_problem, spec_alone_problems
from ._base import describe_mesh, rule_mesh

__all__ = [
    "check_pattern_specs",
    "check_same_mesh",
    "optional_mesh",
    "rank_problem",
    "spec_alone_problems",
]


def optional_mesh(
    mesh: MeshLike | None, *, caller: str
) -> tuple[MeshLike | None, dict[str, int] | None]:
    """The rule's mesh (else the context mesh) and its sizes, or ``(None, None)`` if neither."""
    if mesh is None:
        mesh = context_mesh()
        if mesh is None:
            return None, None
    mesh = rule_mesh(mesh, caller=caller)
    return mesh, mesh_axis_sizes(mesh)


def check_pattern_specs(
    caller: str, labelled: Sequence[tuple[str, Any]], mesh: MeshLike, sizes: Mapping[str, int]
) -> None:
    """Raise if any pattern's spec names a mesh axis the mesh lacks, matched by a leaf or not.

    ``labelled`` holds ``(label, spec)`` pairs; a spec is a ``PartitionSpec``, ``None``, or (for
    ``PathRegexRule``) an axis mapping, whose mesh axes are checked as ``resolve`` checks them.
    """
    for label, spec in labelled:
        if isinstance(spec, PartitionSpec):
            missing = [n for e in spec for n in entry_axes(e) if n not in sizes]
            if missing:
                raise ShardingError(
                    f"{caller} {label} has spec {spec}, which names mesh axis "
                    f"{format_names(dict.fromkeys(missing))}, but {format_mesh(sizes)} has axes "
                    f"{format_names(sizes)} (every pattern is checked, whether a leaf matches it "
                    "or not). Fix the spec's mesh-axis name, or add the axis to the mesh."
                )
        elif spec is not None:
            try:
                check_rules_mesh_axes(spec, mesh)
            except ShardingError as e:
                raise with_prefix(e, f"{caller} {label}: ") from e


def check_same_mesh(caller: str, rules: Sequence[Any]) -> MeshLike | None:
    """The one mesh that ``rules`` (each with a ``mesh`` attribute, ``None``: context) plan on.

    Meshes agree when they have the same axes and sizes (a ``{axis: size}`` dict, an
    ``AbstractMesh`` and a ``Mesh`` of that shape plan the same specs); two concrete meshes must
    also hold the same devices in the same places. Of agreeing meshes the most concrete is
    returned (a ``Mesh``, else an ``AbstractMesh``, else the dict; the first of a kind), so the
    shardings are built on devices whenever one rule knows them.

    Raises:
        MeshError: naming the two rules and their meshes when they differ.
    """
    first: tuple[int, Any] | None = None
    best: Any = None
    for i, rule in enumerate(rules):
        mesh = rule.mesh
        if mesh is None:
            continue
        if first is None:
            first = (i, mesh)
        j, other = first
        if not same_placement(mesh, other):
            raise MeshError(
                f"{caller} combines rules planned on different meshes: rule {j} "
                f"({type(rules[j]).__name__}) uses {describe_mesh(other)} and rule {i} "
                f"({type(rule).__name__}) uses {describe_mesh(mesh)}. Give every rule the same "
                "mesh, or leave mesh=None on all of them to use the context mesh."
            )
        if best is None or _concreteness(mesh) > _concreteness(best):
            best = mesh
    return best


def _concreteness(mesh: Any) -> int:
    return 2 if isinstance(mesh, Mesh) else 1 if isinstance(mesh, AbstractMesh) else 0
