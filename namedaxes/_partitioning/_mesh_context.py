"""Finding the mesh to place arrays on: the argument, else ``jax.set_mesh``'s, else an error.

Outside ``jax.jit`` the mesh set with ``jax.set_mesh`` is concrete (``jax.sharding.get_mesh()``);
while tracing only the abstract one is available (``jax.sharding.get_abstract_mesh()``).
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding

from .._errors import NamedTypeError, ShardingError

__all__ = ["context_mesh", "explicit_axes", "require_mesh"]

AnyMesh = Mesh | AbstractMesh


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


def require_mesh(mesh: Any, *, what: str, has_mesh_arg: bool = True) -> AnyMesh:
    """``mesh`` if given (checked), else the context mesh; raise a ``ShardingError`` if neither.

    Args:
        mesh: A ``Mesh``, ``AbstractMesh`` or ``None``.
        what: The caller's name for the message (``"shard"``).
        has_mesh_arg: Whether the caller takes ``mesh=`` (to suggest it).
    """
    if mesh is not None:
        if not isinstance(mesh, (Mesh, AbstractMesh)):
            raise NamedTypeError(
                f"{what}: mesh must be a jax.sharding.Mesh or AbstractMesh, got {mesh!r} "
                f"({type(mesh).__name__})."
            )
        return mesh
    found = context_mesh()
    if found is None:
        hint = "Pass mesh=..., or wrap" if has_mesh_arg else "Wrap"
        raise ShardingError(
            f"{what} needs a device mesh, but none was given and none is set. {hint} the code in "
            "`with jax.set_mesh(mesh):` (e.g. mesh = jax.make_mesh((2, 4), ('data', 'model')))."
        )
    return found


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
