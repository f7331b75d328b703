"""Meshes: a mesh-like's validated axis sizes, the context mesh, and "the mesh, or a clear error".

Every module that takes a mesh (placement, specs, rules, analysis, multi-process helpers) goes
through these three functions, so a mesh is checked the same way and a missing or wrong mesh gets
the same message everywhere. Outside ``jax.jit`` the mesh set with ``jax.set_mesh`` is concrete
(``jax.sharding.get_mesh()``); while tracing only the abstract one is available
(``jax.sharding.get_abstract_mesh()``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypeAlias, overload

import jax
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding

from ._errors import (
    MeshError,
    MeshTypeError,
    NoMeshError,
    format_mesh,
)

__all__ = [
    "AnyMesh",
    "MeshLike",
    "MeshShape",
    "context_mesh",
    "explicit_axes",
    "mesh_axis_sizes",
    "mesh_of_leaves",
    "mesh_shape",
    "require_mesh",
]

AnyMesh: TypeAlias = Mesh | AbstractMesh
#: A mesh, concrete or abstract, or just its ``{axis_name: size}``.
MeshLike: TypeAlias = Mesh | AbstractMesh | Mapping[str, int]
#: A mesh's axes as ``((name, size), ...)``: the hashable form ``resolve`` caches on.
MeshShape: TypeAlias = tuple[tuple[str, int], ...]

_EXAMPLE = "e.g. {'data': 2, 'model': 4} or jax.make_mesh((2, 4), ('data', 'model'))"


def mesh_shape(mesh: MeshLike) -> MeshShape:
    """The ``((name, size), ...)`` of a ``Mesh``, ``AbstractMesh`` or ``{name: size}`` mapping.

    Raises:
        MeshTypeError: if ``mesh`` is none of these, or a mapping holds a non-str name or a
            non-int size.
        MeshError: if the mesh has no devices (an axis of size < 1; for a mapping, also no axes).

    Example:
        >>> mesh_shape({"data": 2, "model": 4})
        (('data', 2), ('model', 4))
    """
    if isinstance(mesh, (Mesh, AbstractMesh)):
        if mesh.size:  # 0 when an axis has size 0, and for the empty AbstractMesh
            return mesh.shape_tuple
        raise _no_devices(mesh.shape_tuple)
    if not isinstance(mesh, Mapping):
        kinds = "jax.sharding.Mesh, AbstractMesh or {axis_name: size} mapping"
        raise MeshTypeError(_not_a_mesh(mesh, "Expected", kinds) + f" Use {_EXAMPLE}.")
    for name, size in mesh.items():
        if not isinstance(name, str) or isinstance(size, bool) or not isinstance(size, int):
            raise MeshTypeError(
                f"A mesh given as a mapping needs str axis names and positive int sizes, got "
                f"{name!r}: {size!r} in {dict(mesh)!r}. Use {_EXAMPLE}."
            )
    shape = tuple(mesh.items())
    if not shape or any(s < 1 for _, s in shape):
        raise _no_devices(shape)
    return shape


def _no_devices(shape: MeshShape) -> MeshError:
    if not shape:
        return MeshError(
            f"The mesh {format_mesh(shape)} has no devices: it has no axes. Give it at least one "
            f"axis, {_EXAMPLE}."
        )
    name, size = next((n, s) for n, s in shape if s < 1)
    return MeshError(
        f"The mesh {format_mesh(shape)} has no devices: mesh axes need positive int sizes, got "
        f"{name!r}: {size!r}. Give every mesh axis a size of at least 1, {_EXAMPLE}."
    )


def same_placement(a: MeshLike, b: MeshLike) -> bool:
    """Whether a spec places the same way on ``a`` and ``b``: the same axes and sizes and, when
    both are concrete ``Mesh``es, the same devices in the same places (axis types do not matter).

    Example:
        >>> same_placement({"data": 2}, {"data": 2}), same_placement({"data": 2}, {"data": 4})
        (True, False)
    """
    if a is b:
        return True
    if mesh_shape(a) != mesh_shape(b):
        return False
    if isinstance(a, Mesh) and isinstance(b, Mesh):
        return device_ids(a) == device_ids(b)
    return True


def device_ids(mesh: Mesh) -> list[int]:
    """The ids of ``mesh``'s devices in mesh order (flattened)."""
    return [d.id for d in mesh.devices.flat]


def mesh_axis_sizes(mesh: MeshLike) -> dict[str, int]:
    """The ``{axis: size}`` of a mesh-like, in mesh order (checked as ``mesh_shape`` checks it).

    Example:
        >>> mesh_axis_sizes({"data": 2, "model": 4})
        {'data': 2, 'model': 4}
    """
    return dict(mesh_shape(mesh))


def context_mesh() -> AnyMesh | None:
    """The mesh set with ``jax.set_mesh`` (abstract while tracing), or ``None``.

    Example:
        >>> import jax
        >>> context_mesh() is None
        True
    """
    try:
        mesh: AnyMesh = jax.sharding.get_mesh()
    except ValueError:  # get_mesh refuses inside jit: only the abstract mesh exists there
        mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        mesh = jax.sharding.get_abstract_mesh()  # e.g. under jax.sharding.use_abstract_mesh
    return None if mesh.empty else mesh


@overload
def require_mesh(
    mesh: Any,
    *,
    caller: str,
    mappings: bool = False,
    concrete: Literal[True],
    has_mesh_arg: bool = True,
) -> Mesh: ...


@overload
def require_mesh(
    mesh: Any,
    *,
    caller: str,
    mappings: Literal[False] = False,
    concrete: bool = False,
    has_mesh_arg: bool = True,
) -> AnyMesh: ...


@overload
def require_mesh(
    mesh: Any,
    *,
    caller: str,
    mappings: Literal[True],
    concrete: bool = False,
    has_mesh_arg: bool = True,
) -> MeshLike: ...


def require_mesh(
    mesh: Any,
    *,
    caller: str,
    mappings: bool = False,
    concrete: bool = False,
    has_mesh_arg: bool = True,
) -> MeshLike:
    """``mesh`` if given (checked), else the context mesh; a clear error if there is neither.

    Args:
        mesh: The caller's ``mesh`` argument (``None``: use the context mesh).
        caller: The public call, for messages (``"shard"``).
        mappings: Whether a ``{axis: size}`` mapping is enough (planning specs, not placing).
        concrete: Whether only a concrete ``Mesh`` will do (building arrays from host data).
        has_mesh_arg: Whether the caller takes ``mesh=`` (to suggest it).

    Raises:
        MeshTypeError: if ``mesh`` is not a kind of mesh the caller accepts.
        MeshError: if the mesh has no devices (see ``mesh_shape``).
        NoMeshError: if ``mesh`` is ``None`` and no mesh is set (or only an abstract one, where
            a concrete one is needed).

    Example:
        >>> require_mesh({"data": 2}, caller="pspec_for", mappings=True)
        {'data': 2}
    """
    if isinstance(mesh, Mesh) or (isinstance(mesh, AbstractMesh) and not concrete):
        if mesh.size:  # mesh_shape's check, inlined: shard comes here on every call
            return mesh
        raise _no_devices(mesh.shape_tuple)
    if mesh is not None:
        if not (mappings and not concrete and isinstance(mesh, Mapping)):
            raise MeshTypeError(_wrong_mesh(mesh, caller, _kinds(mappings, concrete)))
        mesh_shape(mesh)  # validates
        return mesh
    found = context_mesh()
    if found is None:
        kinds = _kinds(mappings, concrete)
        hint = f"Pass mesh=... (a {kinds}), or wrap" if has_mesh_arg else "Wrap"
        raise NoMeshError(
            f"{caller} needs a device mesh, but none was given and none is set. {hint} the code in "
            "`with jax.set_mesh(mesh):` (e.g. mesh = jax.make_mesh((2, 4), ('data', 'model')))."
        )
    if concrete and not isinstance(found, Mesh):
        raise NoMeshError(
            f"{caller} needs a concrete jax.sharding.Mesh, but only the abstract mesh "
            f"{format_mesh(found)} is known here (inside jax.jit, or under use_abstract_mesh). "
            "Call it outside jit, or pass mesh=..."
        )
    return found


def _kinds(mappings: bool, concrete: bool) -> str:
    if concrete:
        return "concrete jax.sharding.Mesh"
    if mappings:
        return "jax.sharding.Mesh, AbstractMesh or {axis: size} mapping"
    return "jax.sharding.Mesh or AbstractMesh"


def _not_a_mesh(mesh: Any, lead: str, kinds: str) -> str:
    return f"{lead} a {kinds}, got {mesh!r} ({type(mesh).__name__})."


def _wrong_mesh(mesh: Any, caller: str, kinds: str) -> str:
    message = _not_a_mesh(mesh, f"{caller} needs", kinds)
    if isinstance(mesh, Mapping):
        return message + (
            " A {axis: size} dict can plan specs but cannot place arrays; pass "
            "mesh=jax.make_mesh(...)."
        )
    if isinstance(mesh, AbstractMesh):
        return message + " An AbstractMesh has no devices to hold data; pass jax.make_mesh(...)."
    return message + " Pass e.g. mesh=jax.make_mesh((2, 4), ('data', 'model'))."


def explicit_axes(mesh: AnyMesh) -> frozenset[str]:
    """Names of the mesh's ``AxisType.Explicit`` axes (placed with ``reshard`` under jit)."""
    return frozenset(n for n, t in zip(mesh.axis_names, mesh.axis_types) if t == AxisType.Explicit)


def mesh_of_leaves(leaves: list[Any]) -> Mesh | None:
    """The mesh of the first leaf placed with a ``NamedSharding`` (``None`` if none is)."""
    for leaf in leaves:
        if isinstance(leaf, jax.core.Tracer):
            continue
        sharding = getattr(leaf, "sharding", None)
        if isinstance(sharding, NamedSharding) and isinstance(sharding.mesh, Mesh):
            return sharding.mesh
    return None
