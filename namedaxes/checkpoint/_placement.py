"""Where restored arrays go: one sharding per leaf, from the mapping and mesh in force.

NamedArrays are placed by the plan of the tree being restored (``resolve`` for each) under the
mapping given, else the one in force, on the mesh given, else the one set with ``jax.set_mesh``. Without a
mapping they keep ``like``'s sharding if it has one, else are replicated on the mesh; with no mesh
either, they land whole on this process's first local device. Plain arrays keep ``like``'s sharding
if it has one, else are replicated (on the mesh, or on the first local device).

A ``like`` built by ``jax.eval_shape`` under ``jax.set_mesh`` of an Explicit mesh carries shardings
on an ``AbstractMesh`` (no devices): those are read onto the concrete mesh in force (or given) that
has the same axes.
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
from .._errors import MeshError, MeshTypeError, NamedAxesError, format_mesh
from .._logical._context import current_axis_mapping
from .._logical._rules import as_rules
from .._partitioning._plan import plan_tree

__all__ = ["Placement", "placement"]


@dataclass(frozen=True)
class Placement:
    """The rules (or ``None``) and concrete mesh (or ``None``) a restore places arrays with."""

    rules: Any
    mesh: Mesh | None

    def _default(self) -> Sharding:
        if self.mesh is not None:
            return NamedSharding(self.mesh, PartitionSpec())
        return SingleDeviceSharding(jax.local_devices()[0])

    def named(self, arrays: Sequence[NamedArray], keys: Sequence[str]) -> list[Sharding]:
        """The shardings of the NamedArray leaves ``arrays`` (named ``keys`` in messages), with
        their axes in the order they are to be returned: the plan of the list under the rules on
        the mesh; without rules, each like array's sharding (an array of ``ShapeDtypeStruct``s
        carries none), else replicated."""
        if not arrays:
            return []
        if self.rules is None or self.mesh is None:  # placement() refused rules alone
            return [self.plain(x.array, k) for x, k in zip(arrays, keys)]
        try:
            planned = plan_tree(list(arrays), as_rules(self.rules), self.mesh, caller="restore")
        except NamedAxesError as e:
            raise type(e)(f"Cannot place leaf {keys[0]!r}: {e}") from None
        out: list[Sharding] = []
        for i, key in enumerate(keys):
            try:
                spec = planned.spec(i)
            except NamedAxesError as e:
                raise type(e)(f"Cannot place leaf {key!r}: {e}") from None
            out.append(NamedSharding(self.mesh, spec))  # type: ignore[arg-type]
        return out

    def plain(self, like: Any, key: str) -> Sharding:
        """The sharding of a plain array: the like leaf's, else replicated."""
        sharding = like_sharding(like, key, self.mesh)
        return sharding if sharding is not None else self._default()


def _context_mesh() -> Mesh | None:
    mesh = jax.sharding.get_mesh()
    return None if mesh.empty else mesh


def placement(mapping: Any, mesh: Any, *, needs_rules: bool, caller: str = "restore") -> Placement:
    """The placement in force: ``mapping`` else the context mapping; ``mesh`` else the context mesh.

    Args:
        mapping: Rules given by the caller, or ``None`` for the ones in force.
        mesh: A concrete ``jax.sharding.Mesh``, or ``None`` for the one set with ``jax.set_mesh``.
        needs_rules: Whether any NamedArray will be placed (only then is a mapping without a mesh
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
    if mesh is None:
        mesh = _context_mesh()
    rules = mapping if mapping is not None else current_axis_mapping()
    if rules is not None and mesh is None and needs_rules:
        raise MeshError(
            f"{caller} has a mapping ({rules!r}) to place NamedArrays with but no mesh. Pass "
            f"mesh=..., or wrap the call in `with jax.set_mesh(mesh):`."
        )
    return Placement(rules, mesh)


def like_sharding(x: Any, key: str, mesh: Mesh | None = None) -> Sharding | None:
    """The sharding a ``like`` leaf carries (a concrete array's, or a ``ShapeDtypeStruct``'s).

    A sharding on an ``AbstractMesh`` (what ``jax.eval_shape`` gives under ``jax.set_mesh`` of an
    Explicit mesh) is moved to ``mesh``, else the concrete mesh set with ``jax.set_mesh``, when it
    has the same axes.

    Raises:
        MeshError: for a sharding on an abstract mesh that no concrete mesh in force matches.
    """
    s = getattr(x, "sharding", None)
    if not isinstance(s, Sharding):
        return None
    if isinstance(s, NamedSharding) and isinstance(s.mesh, AbstractMesh):
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
