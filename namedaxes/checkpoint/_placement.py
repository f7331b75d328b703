"""Where restored arrays go: one sharding per leaf, from the mapping and mesh in force.

Named leaves (NamedArrays, and plain arrays of equinox modules declared with
``field(axis_names=...)``) are found by the library's one tree walk and placed by the one plan
(``resolve`` for each) under the mapping given, else the one in force, on the mesh given, else the
one set with ``jax.set_mesh``. Without a mapping they keep ``like``'s sharding if it has one, else
are replicated on the mesh; with no mesh either, they land whole on this process's first local
device. Plain arrays keep ``like``'s sharding if it has one, else are replicated (on the mesh, or
on the first local device).

A ``like`` sharding on another mesh than the one given as ``mesh=`` is read onto that mesh, with
the same spec, and one on other devices (a plain ``jnp`` array's single device) is replicated on
it: an explicit mesh says where the restored tree lives, so a restore never returns a tree spread
over two device sets it was not asked for. A ``like`` built by ``jax.eval_shape`` under
``jax.set_mesh`` of an Explicit mesh carries shardings on an ``AbstractMesh`` (no devices): those
are read onto the concrete mesh given or in force that has the same axes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
from jax.sharding import (
    AbstractMesh,
    Mesh,
    NamedSharding,
    PartitionSpec,
    Sharding,
    SingleDeviceSharding,
)

from .._array import NamedArray
from .._axis import Axis
from .._errors import MeshError, MeshTypeError, NamedAxesError, format_mesh, with_prefix
from .._logical._context import current_axis_mapping
from .._logical._rules import as_rules
from .._mesh import mesh_axis_sizes
from .._partitioning._plan import plan_tree
from .._partitioning._tree import leaf_axes, walk
from .._spec import spec_problems

__all__ = ["Placement", "any_named", "placement"]


def any_named(tree: Any) -> bool:
    """Whether a leaf of ``tree`` has names (a NamedArray or a ``field(axis_names=...)`` array)."""
    return walk(tree, jax.tree_util.tree_structure(tree)).any_named


@dataclass(frozen=True)
class Placement:
    """The rules (or ``None``) and concrete mesh (or ``None``) a restore places arrays with;
    ``mesh_given``: the mesh was passed as ``mesh=`` (it then wins over ``like``'s shardings)."""

    rules: Any
    mesh: Mesh | None
    mesh_given: bool = False

    def _default(self) -> Sharding:
        if self.mesh is not None:
            return NamedSharding(self.mesh, PartitionSpec())
        return SingleDeviceSharding(jax.local_devices()[0])

    def shardings(self, tree: Any, keys: Sequence[str]) -> list[Sharding]:
        """One sharding per leaf of ``tree`` (``tree_flatten`` order; ``keys[i]`` is leaf ``i``'s
        dotted key). Named leaves are planned together under the rules on the mesh, as a tree
        keyed by dotted key, so the plan's messages name the leaf it refuses by that key and a
        mapping-level error names none; without rules they are placed like plain leaves.

        Raises:
            ShardingError / MeshError: from the plan (a mesh axis the mesh lacks, an axis that
                cannot be placed).
            AxisError: for a ``field(axis_names=...)`` array whose rank differs from its names.
        """
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        infos = walk(tree, treedef).infos
        axes: list[tuple[Axis, ...] | None] = []
        for info, leaf, key in zip(infos, leaves, keys, strict=True):
            try:
                axes.append(leaf_axes(info, leaf))
            except NamedAxesError as e:
                raise with_prefix(e, f"Leaf {key!r}: ") from None
        specs: dict[str, PartitionSpec | None] = {}
        if self.rules is not None:
            named = {k: NamedArray(x, a) for x, k, a in zip(leaves, keys, axes) if a is not None}
            flat, named_def = jax.tree_util.tree_flatten_with_path(named)
            planned = plan_tree(
                named,
                as_rules(self.rules),
                self.mesh,
                caller="restore",
                flat=([x for _, x in flat], named_def),
            )
            if planned.any_named:
                specs = {path[0].key: planned.spec(j) for j, (path, _) in enumerate(flat)}
        return [
            self.plain(leaf, key)
            if specs.get(key) is None
            else NamedSharding(self.mesh, specs[key])  # type: ignore[arg-type]
            for leaf, key in zip(leaves, keys)
        ]

    def plain(self, like: Any, key: str) -> Sharding:
        """The sharding of a leaf not placed by the rules: the like leaf's, else replicated."""
        sharding = like_sharding(like, key, self.mesh, move=self.mesh_given)
        return sharding if sharding is not None else self._default()


def _context_mesh() -> Mesh | None:
    mesh = jax.sharding.get_mesh()
    return None if mesh.empty else mesh


def placement(mapping: Any, mesh: Any, *, needs_rules: bool, caller: str = "restore") -> Placement:
    """The placement in force: ``mapping`` else the context mapping; ``mesh`` else the context mesh.

    Args:
        mapping: Rules given by the caller, or ``None`` for the ones in force.
        mesh: A concrete ``jax.sharding.Mesh``, or ``None`` for the one set with ``jax.set_mesh``.
        needs_rules: Whether any named leaf will be placed (only then is a mapping without a mesh
            an error).

    Raises:
        MeshTypeError: if ``mesh`` is not a concrete ``Mesh`` (an ``AbstractMesh`` has no devices
            to read onto).
        MeshError: if a mapping is in force but no mesh is.
    """
    if mesh is not None and not isinstance(mesh, Mesh):
        raise MeshTypeError(
            f"{caller} needs a concrete jax.sharding.Mesh to read arrays onto, got "
            f"{type(mesh).__name__} {mesh!r}. Pass mesh=jax.make_mesh(...)."
        )
    given = mesh is not None
    if mesh is None:
        mesh = _context_mesh()
    rules = mapping if mapping is not None else current_axis_mapping()
    if rules is not None and mesh is None and needs_rules:
        raise MeshError(
            f"{caller} has a mapping ({rules!r}) to place NamedArrays with but no mesh. Pass "
            f"mesh=..., or wrap the call in `with jax.set_mesh(mesh):`."
        )
    return Placement(rules, mesh, given)


def like_sharding(
    x: Any, key: str, mesh: Mesh | None = None, *, move: bool = False
) -> Sharding | None:
    """The sharding a ``like`` leaf carries (a concrete array's, or a ``ShapeDtypeStruct``'s); an
    uncommitted array (made by ``jnp`` without ``device_put``) carries none.

    With ``move`` (``mesh`` was passed explicitly), a ``NamedSharding`` on any other mesh is read
    onto ``mesh`` with the same spec, and another sharding on devices other than ``mesh``'s (a
    ``SingleDeviceSharding``) becomes replicated on ``mesh``. Otherwise a sharding on an
    ``AbstractMesh`` (what ``jax.eval_shape`` gives under ``jax.set_mesh`` of an Explicit mesh) is
    moved to ``mesh``, else the concrete mesh set with ``jax.set_mesh``, when it has the same axes.

    Raises:
        MeshError: for a spec that does not fit ``mesh`` (a mesh axis it lacks, a size it does not
            divide), or a sharding on an abstract mesh that no concrete mesh in force matches.
    """
    s = getattr(x, "sharding", None)
    if not isinstance(s, Sharding):
        return None
    if isinstance(x, jax.Array) and not x.committed and not isinstance(s, NamedSharding):
        # A plain ``jnp.zeros(...)`` was never placed (JAX moves it freely); restoring it committed
        # to its one device would split the tree over two device sets under a mesh in force.
        return None
    if move and mesh is not None and not isinstance(s, NamedSharding):
        # No spec to carry over: replicated on the mesh given, memory kind kept.
        if s.device_set == set(mesh.devices.flat):
            return s
        return NamedSharding(mesh, PartitionSpec(), memory_kind=s.memory_kind)
    if not isinstance(s, NamedSharding):
        return s
    if move and mesh is not None and s.mesh != mesh:
        problems = spec_problems(tuple(x.shape), s.spec, mesh_axis_sizes(mesh))
        if problems:
            raise MeshError(
                f"like leaf {key!r} is sharded {s.spec} on {format_mesh(dict(s.mesh.shape))}, and "
                f"restore reads it onto the mesh= given, {format_mesh(dict(mesh.shape))}, with "
                f"that spec, but {'; '.join(problems)}. Build like on the mesh to read onto (or "
                "leave out mesh= to keep like's placement)."
            )
        return NamedSharding(mesh, s.spec, memory_kind=s.memory_kind)
    if isinstance(s.mesh, AbstractMesh):
        concrete = mesh if mesh is not None else _context_mesh()
        if concrete is None or concrete.abstract_mesh != s.mesh:
            where = (
                "no concrete mesh is set"
                if concrete is None
                else f"the mesh in force is {format_mesh(dict(concrete.shape))}"
            )
            raise MeshError(
                f"like leaf {key!r} is sharded {s.spec} on an abstract mesh "
                f"{format_mesh(dict(s.mesh.shape))} (jax.eval_shape under jax.set_mesh gives "
                f"those), which has no devices to read onto, and {where}. Call this inside `with "
                "jax.set_mesh(mesh):` with the mesh like was built under (or build like under the "
                "mesh to read onto)."
            )
        return NamedSharding(concrete, s.spec, memory_kind=s.memory_kind)
    return s


def permuted(sharding: Sharding, order: Sequence[int], ndim: int) -> Sharding:
    """The sharding of the array whose dimension ``order[i]`` is dimension ``i`` of ``sharding``'s.

    Used to read an array in its stored axis order straight into the layout that becomes
    ``sharding`` once transposed to ``like``'s order. Non-``NamedSharding``s do not depend on the
    order of dimensions and are returned as they are.
    """
    if not isinstance(sharding, NamedSharding):
        return sharding
    spec = tuple(sharding.spec) + (None,) * (ndim - len(sharding.spec))
    stored = [None] * ndim
    for i, j in enumerate(order):
        stored[j] = spec[i]
    return NamedSharding(sharding.mesh, PartitionSpec(*stored), memory_kind=sharding.memory_kind)
