"""``MeshPartitionHelper``: mesh-axis groups ("methods") suggested from shapes and mesh-axis roles,
and specs built from them.

Like the other shape-driven rules it iterates mesh axes and dimensions in a fixed order, never over
a ``set`` (a named leaf's dimensions in axis-name order), and every spec it builds uses each mesh
axis at most once and divides what it shards.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping, Sequence
from typing import Any

from jax.sharding import NamedSharding, PartitionSpec

from .._errors import NamedTypeError, ShardingError, format_mesh, format_names
from .._mesh import MeshLike, mesh_axis_sizes, require_mesh
from .._spec import entry_of
from ._auto import _check_min_size
from ._base import ShardingRule, place_tree, replicated, rule_mesh, spec_problems
from ._flat import flatten_values, map_shapes, shape_dtype

__all__ = ["MeshPartitionHelper"]


def _check_shape(shape: Any, caller: str) -> tuple[int, ...]:
    """``shape`` as a tuple of non-negative ints; a typed error for anything else (no truncation)."""
    if type(shape) is tuple and all(type(d) is int and d >= 0 for d in shape):
        return shape  # the common case, from an array's .shape
    if isinstance(shape, (str, bytes)) or not (
        hasattr(shape, "__len__") and hasattr(shape, "__iter__")
    ):
        raise NamedTypeError(
            f"{caller}: shape must be a sequence of ints, got {shape!r} ({type(shape).__name__}). "
            "Pass an array's .shape, e.g. (1024, 4096)."
        )
    for d in shape:
        if isinstance(d, bool) or not hasattr(d, "__index__"):
            raise NamedTypeError(
                f"{caller}: shape {tuple(shape)!r} has dimension {d!r} ({type(d).__name__}); "
                "dimension sizes must be ints. Pass an array's .shape."
            )
        if d < 0:
            raise ShardingError(
                f"{caller}: shape {tuple(shape)!r} has negative dimension size {d}; sizes must be "
                ">= 0. Pass an array's .shape."
            )
    return tuple(operator.index(d) for d in shape)


def _method_groups(methods: Any, sizes: Mapping[str, int]) -> list[tuple[str, ...]]:
    """``create_partition_spec``'s methods as tuples of mesh axes, checked.

    A bare string is one mesh axis name wherever names are expected: ``"data"`` as ``methods`` is
    the one method ``("data",)``, and as a method it is ``("data",)``.
    """
    owner = "create_partition_spec"
    if isinstance(methods, str):
        methods = (methods,)
    if not isinstance(methods, Sequence):
        raise NamedTypeError(
            f"{owner}: methods must be a sequence of mesh-axis groups, got {methods!r} "
            f"({type(methods).__name__}). Use e.g. [('fsdp',), ('tp',)]."
        )
    groups = []
    for m in methods:
        if isinstance(m, str):
            g: tuple[Any, ...] = (m,)
        elif isinstance(m, Sequence):
            g = tuple(m)
        else:
            g = (m,)
        bad = [a for a in g if not isinstance(a, str)]
        if bad or not g:
            raise NamedTypeError(
                f"{owner}: method {m!r} must be a mesh axis name or a non-empty tuple of them, "
                f"e.g. ('fsdp', 'sp'). Available mesh axes: {format_names(sizes)}."
            )
        repeated = [a for a in dict.fromkeys(g) if g.count(a) > 1]
        if repeated:
            raise ShardingError(
                f"{owner}: method {g} names mesh axis {format_names(repeated)} more than once; a "
                "mesh axis can split a dimension only once. List it once, e.g. "
                f"{tuple(dict.fromkeys(g))}."
            )
        groups.append(g)
    unknown = [a for g in groups for a in g if a not in sizes]
    if unknown:
        raise ShardingError(
            f"{owner} was given methods naming mesh axis "
            f"{format_names(dict.fromkeys(unknown))}, which the mesh "
            f"{format_mesh(sizes)} lacks. Available mesh "
            f"axes: {format_names(sizes)}."
        )
    return groups


# Conventional mesh-axis roles, best first, for MeshPartitionHelper's suggestions: weight sharding
# (fsdp) saves the most parameter memory, then tensor, sequence, data and expert parallelism.
_ROLE_ORDER = ("fsdp", "tp", "sp", "dp", "ep")


class MeshPartitionHelper(ShardingRule):
    """Suggest and apply specs from array shapes and the mesh's axes.

    For each distinct shape, :meth:`analyze_pytree` suggests groups of mesh axes ("methods"), best
    first; :meth:`create_partition_spec` turns the methods into a spec. A method is a tuple of mesh
    axes that together split one dimension. Suggestions only contain mesh axes of size > 1 that
    divide some dimension of the shape. The order is: ``('fsdp', 'sp')`` together when the mesh has
    both and a dimension is divisible by their product; then single axes by conventional role
    (``fsdp``, ``tp``, ``sp``, ``dp``, ``ep``), then other axes largest first (ties in mesh order).

    Args:
        mesh: A ``Mesh``, ``AbstractMesh`` or ``{axis: size}`` dict (``None``: context mesh).
        min_shard_size: Arrays with fewer elements stay replicated (used by :meth:`apply`).

    Example:
        >>> import jax
        >>> from namedaxes.rules import MeshPartitionHelper
        >>> helper = MeshPartitionHelper({"fsdp": 4, "tp": 2})
        >>> helper.analyze_pytree({"w": jax.ShapeDtypeStruct((1024, 4096), "float32")})
        {(1024, 4096): [('fsdp',), ('tp',)]}
        >>> helper.create_partition_spec((1024, 4096), [("fsdp",), ("tp",)])
        P('tp', 'fsdp')
    """

    def __init__(self, mesh: MeshLike | None = None, min_shard_size: int = 1024) -> None:
        self.mesh = mesh
        # The sizes of an explicit mesh, cached with that mesh: a reassigned mesh is measured anew.
        self._sizes: tuple[MeshLike, dict[str, int]] | None = None
        checked = _check_min_size(min_shard_size, "MeshPartitionHelper")
        self.min_shard_size = 0 if checked is None else checked

    def __repr__(self) -> str:
        return f"MeshPartitionHelper({self.mesh!r}, min_shard_size={self.min_shard_size!r})"

    @property
    def axis_sizes(self) -> dict[str, int]:
        """``{mesh_axis: size}`` of the helper's mesh (or the context mesh)."""
        return dict(self._axis_sizes())

    def _axis_sizes(self) -> dict[str, int]:
        if self.mesh is None:
            return mesh_axis_sizes(rule_mesh(None, caller="MeshPartitionHelper"))
        if self._sizes is None or self._sizes[0] is not self.mesh:
            self._sizes = (self.mesh, mesh_axis_sizes(self.mesh))
        return self._sizes[1]

    def suggest_methods(self, shape: Sequence[int]) -> list[tuple[str, ...]]:
        """Mesh-axis groups that could shard an array of ``shape``, best first.

        Example:
            >>> from namedaxes.rules import MeshPartitionHelper
            >>> MeshPartitionHelper({"data": 2, "model": 4}).suggest_methods((6, 8))
            [('model',), ('data',)]
        """
        sizes = self._axis_sizes()
        shape = _check_shape(shape, "suggest_methods")

        def divides_some(k: int) -> bool:
            return any(d > 0 and d % k == 0 for d in shape)

        methods: list[tuple[str, ...]] = []
        if (
            sizes.get("fsdp", 1) > 1
            and sizes.get("sp", 1) > 1
            and divides_some(sizes["fsdp"] * sizes["sp"])
        ):
            methods.append(("fsdp", "sp"))
        roles = [n for n in _ROLE_ORDER if n in sizes]
        others = sorted((n for n in sizes if n not in _ROLE_ORDER), key=lambda n: -sizes[n])
        for name in roles + others:
            if sizes[name] > 1 and divides_some(sizes[name]):
                methods.append((name,))
        return methods

    def analyze_pytree(self, tree: Any) -> dict[tuple[int, ...], list[tuple[str, ...]]]:
        """``{shape: suggested methods}`` for every distinct array shape in ``tree``.

        Shapes appear in the order of their first leaf. NamedArrays count by their array's shape.

        Example:
            >>> import jax.numpy as jnp
            >>> from namedaxes.rules import MeshPartitionHelper
            >>> MeshPartitionHelper({"data": 8}).analyze_pytree([jnp.zeros(16), jnp.zeros(3)])
            {(16,): [('data',)], (3,): []}
        """
        out: dict[tuple[int, ...], list[tuple[str, ...]]] = {}
        for value in flatten_values(tree)[0]:
            shape = shape_dtype(value)[0]
            if shape is not None and shape not in out:
                out[shape] = self.suggest_methods(shape)
        return out

    def create_partition_spec(
        self,
        shape: Sequence[int],
        methods: Sequence[tuple[str, ...] | str],
        min_shard_size: int = 1024,
    ) -> PartitionSpec:
        """A valid spec for ``shape`` that applies ``methods`` in order.

        Each method goes to the largest not-yet-sharded dimension divisible by the product of its
        mesh axes (ties: the first such dimension); methods reusing a mesh axis an earlier method
        took, or dividing no free dimension, are skipped (so a list of suggestions can overlap).
        Arrays with fewer than ``min_shard_size`` elements stay replicated. The spec has one
        entry per dimension. A method is a tuple of mesh axes or one name; a bare string as
        ``methods`` is one method of one axis.

        Raises:
            ShardingError: if a method names a mesh axis the mesh lacks or names one twice, or a
                dimension size is negative.
            NamedTypeError: if a dimension size is not an int (``8.5`` is not truncated) or a
                method is not a name or a tuple of names.

        Example:
            >>> from namedaxes.rules import MeshPartitionHelper
            >>> MeshPartitionHelper({"data": 2, "model": 4}).create_partition_spec(
            ...     (4096, 1024), [("model",), ("data",)])
            P('model', 'data')
        """
        sizes = self._axis_sizes()
        shape = _check_shape(shape, "create_partition_spec")
        groups = _method_groups(methods, sizes)
        n = math.prod(shape)
        if n == 0 or n < _check_min_size(min_shard_size, "create_partition_spec"):  # type: ignore[operator]
            return replicated(len(shape))
        used: set[str] = set()  # membership only; never iterated
        entries: list[Any] = [None] * len(shape)
        for g in groups:
            k = math.prod(sizes[a] for a in g)
            if k == 1 or len(set(g)) != len(g) or any(a in used for a in g):
                continue
            free = [d for d in range(len(shape)) if entries[d] is None and shape[d] % k == 0]
            if not free:
                continue
            d = min(free, key=lambda d: (-shape[d], d))
            entries[d] = entry_of(g)
            used.update(g)
        return PartitionSpec(*entries)

    def apply(self, tree: Any) -> Any:
        """A spec per array leaf: its suggested methods through :meth:`create_partition_spec`.

        A NamedArray's (or ``field(axis_names=...)`` array's) shape is taken in axis-name order,
        so a tie between equal dimensions goes to the first axis name rather than the first
        position: the same named axes get the same mesh axes whatever their order. Arrays without
        names keep position ties.
        """

        def spec_for(shape: tuple[int, ...]) -> PartitionSpec:
            methods = self.suggest_methods(shape)
            return self.create_partition_spec(shape, methods, self.min_shard_size)

        return map_shapes(tree, spec_for)

    def shard_array(self, array: Any, spec: PartitionSpec | None) -> Any:
        """Place one array (or NamedArray) with ``spec`` on the helper's mesh.

        ``spec`` is checked against the array's shape and the mesh first, so a mistake is named
        here (the same on ``Auto`` and ``Explicit`` meshes) rather than by JAX. ``None`` is
        replicated.

        Raises:
            NamedTypeError: if ``spec`` is not a ``PartitionSpec`` (or ``None``), or ``array`` is
                not one array or NamedArray (place a pytree with :meth:`shard`).
            ShardingError: if ``spec`` does not fit: more entries than dimensions, a mesh axis
                the mesh lacks or named twice, or a dimension its mesh axes do not divide.

        Example:
            >>> import jax, jax.numpy as jnp
            >>> from jax.sharding import PartitionSpec as P
            >>> from namedaxes.rules import MeshPartitionHelper
            >>> mesh = jax.make_mesh((8,), ("data",))
            >>> MeshPartitionHelper(mesh).shard_array(jnp.zeros(16), P("data")).sharding.spec
            P('data',)
        """
        if spec is None:
            spec = PartitionSpec()
        if not isinstance(spec, PartitionSpec):
            if isinstance(spec, str):
                fix = f"PartitionSpec({spec!r})"
            elif isinstance(spec, (tuple, list)):
                fix = f"PartitionSpec(*{spec!r})"
            else:
                fix = "PartitionSpec('data', None)"
            raise NamedTypeError(
                f"shard_array: spec must be a PartitionSpec (or None), got {spec!r} "
                f"({type(spec).__name__}). Build one, e.g. {fix}."
            )
        shape = shape_dtype(array)[0]
        if shape is None:
            raise NamedTypeError(
                f"shard_array places one array or NamedArray, got {type(array).__name__}. For a "
                "pytree, use helper.shard(tree) (specs from the helper) or jax.device_put."
            )
        mesh = require_mesh(self.mesh, caller="shard_array")
        sizes = mesh_axis_sizes(mesh)
        problems = spec_problems(shape, spec, sizes)
        if problems:
            raise ShardingError(
                f"shard_array: spec {spec} does not fit the array of shape {shape} on "
                f"{format_mesh(sizes)}: " + "; ".join(problems) + "."
            )
        return place_tree(array, NamedSharding(mesh, spec), caller="shard_array")

    def auto_shard_pytree(self, tree: Any, min_shard_size: int = 1024) -> Any:
        """Place every array leaf of ``tree`` with the spec :meth:`apply` gives it.

        Example:
            >>> import jax, jax.numpy as jnp
            >>> from namedaxes.rules import MeshPartitionHelper
            >>> mesh = jax.make_mesh((2, 4), ("data", "model"))
            >>> out = MeshPartitionHelper(mesh).auto_shard_pytree({"w": jnp.zeros((64, 64))})
            >>> out["w"].sharding.spec
            P('model', 'data')
        """
        return MeshPartitionHelper(self.mesh, min_shard_size).shard(tree)
