"""Helpers every op family shares: operand checks and Explicit-mesh sharding fix-ups."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax

from .._array import NamedArray
from .._errors import NamedTypeError

__all__ = ["describe_operand", "expect_named", "explicit_sharding", "unshard_dims"]


def describe_operand(x: Any) -> str:
    """A short description of a non-NamedArray operand for error messages."""
    shape = getattr(x, "shape", None)
    if shape is not None:
        return f"{type(x).__name__} of shape {tuple(shape)}"
    return f"{x!r} ({type(x).__name__})"


def expect_named(x: Any, op: str, arg: str = "x") -> NamedArray:
    """Return ``x`` if it is a NamedArray, else raise a ``NamedTypeError`` that says how to name it."""
    if isinstance(x, NamedArray):
        return x
    raise NamedTypeError(
        f"{op}() needs a NamedArray for `{arg}`, got {describe_operand(x)}. "
        "Name its axes first, e.g. named(array, ('batch', 'embed'))."
    )


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
