"""What every sharding rule and the memory analysis share: meshes, leaves, spec checks, the base class.

A rule sees a pytree whose leaves are ``NamedArray``s, plain arrays or ``ShapeDtypeStruct``s and
returns the same structure with a ``PartitionSpec`` per array leaf (``None`` elsewhere). This module
turns a tree into a flat list of ``Leaf`` records once, so the rules only think about shapes.
"""

from __future__ import annotations

import abc
import copy
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec

from .._array import NamedArray, is_named_array
from .._axis import Axis
from .._errors import (
    MeshError,
    NamedTypeError,
    ShardingError,
    SpecMismatchError,
    format_mesh,
    format_names,
    format_path,
)
from .._mesh import (
    AnyMesh,
    MeshLike,
    context_mesh,
    device_ids,
    mesh_axis_sizes,
    require_mesh,
    same_placement,
)
from .._partitioning._plan import TreePlan
from .._partitioning._shard import place_planned  # the engine's placement, shared
from .._partitioning._tree import FieldAxes, LeafInfo, leaf_axes, plain_spec, walk
from .._spec import entry_axes as entry_axes  # re-exported for the rules and analysis
from .._spec import spec_problems as spec_problems

__all__ = [
    "Leaf",
    "ShardingRule",
    "check_spec",
    "describe_mesh",
    "dtype_bits",
    "entry_axes",
    "flatten_leaves",
    "packed_bytes",
    "planned_spec",
    "rule_mesh",
    "rule_specs",
    "spec_problems",
]


# -- meshes ------------------------------------------------------------------------------------


def rule_mesh(mesh: MeshLike | None, *, caller: str) -> MeshLike:
    """The mesh a rule or the analysis plans on: ``mesh`` (a ``{axis: size}`` dict will do), else
    the context mesh.

    Raises:
        MeshError: if there is neither, or the mesh has no devices (``MeshTypeError`` if ``mesh``
            is not a mesh).
    """
    return require_mesh(mesh, caller=caller, mappings=True)


def describe_mesh(mesh: Any) -> str:
    """A mesh for a message: its axes and sizes, and a concrete mesh's device ids."""
    text = format_mesh(mesh)
    if isinstance(mesh, Mesh):
        ids = device_ids(mesh)
        shown = ", ".join(map(str, ids[:8])) + (", ..." if len(ids) > 8 else "")
        text += f" on devices [{shown}]"
    return text


def placement_mesh(rule: ShardingRule, mesh: Any, *, caller: str) -> AnyMesh:
    """The mesh ``rule``'s shardings are built on: ``mesh`` if given, else the rule's, else the
    context mesh.

    A rule whose mesh is only ``{axis: size}`` places on the context mesh when that has the same
    axes and sizes (a dict cannot hold devices).

    Raises:
        MeshError: if ``mesh`` (or the context mesh, for a dict) and the rule's own mesh place
            differently, naming both.
        MeshTypeError: if ``mesh`` is a dict, or the rule's mesh is a dict and none is set.
        NoMeshError: if there is no mesh at all.
    """
    own = rule.mesh
    name = type(rule).__name__
    if mesh is not None:
        target = require_mesh(mesh, caller=caller)
        if own is not None and not same_placement(own, target):
            raise MeshError(
                f"{name}.{caller} was given the mesh {describe_mesh(target)}, but the rule plans "
                f"on {describe_mesh(own)}. Pass the rule's own mesh (or none), or build the rule "
                "with mesh=None so that it plans on the mesh given."
            )
        return target
    if own is None or isinstance(own, (Mesh, AbstractMesh)):
        return require_mesh(own, caller=caller)
    found = context_mesh()
    if found is None:
        return require_mesh(own, caller=caller)  # a dict cannot place: MeshTypeError with the fix
    if not same_placement(own, found):
        raise MeshError(
            f"{name}.{caller}: the rule plans on {format_mesh(own)} (a {{axis: size}} dict), but "
            f"the context mesh is {describe_mesh(found)}. Give the rule that mesh, or pass "
            "mesh=... with the rule's axes and sizes."
        )
    return found


# -- leaves ------------------------------------------------------------------------------------


def shape_dtype(value: Any) -> tuple[tuple[int, ...] | None, np.dtype | None]:
    """``(shape, dtype)`` of an array leaf (a NamedArray's array), ``(None, None)`` for others.

    The one definition of what counts as an array leaf, for ``Leaf`` and the light flatten.
    """
    array = value.array if isinstance(value, NamedArray) else value
    shape = getattr(array, "shape", None)
    dtype = getattr(array, "dtype", None)
    if shape is None or dtype is None or isinstance(array, type):
        return None, None
    if type(shape) is not tuple:
        shape = tuple(map(int, shape))
    if not isinstance(dtype, np.dtype):
        dtype = np.dtype(dtype)
    return shape, dtype


@functools.lru_cache(maxsize=256)
def dtype_bits(dtype: Any) -> int:
    """Bits one element of ``dtype`` takes in device memory.

    NumPy (and ``ml_dtypes``) give sub-byte types such as ``int4`` and ``float4_e2m1fn`` an
    ``itemsize`` of 1, but XLA packs them (two ``int4`` per byte), so the width comes from their
    ``iinfo``/``finfo`` bits; every other type takes ``8 * itemsize``.
    """
    dtype = np.dtype(dtype)
    if dtype.itemsize != 1:
        return 8 * dtype.itemsize
    for info in (jax.numpy.iinfo, jax.numpy.finfo):
        try:
            bits = int(info(dtype).bits)
        except (ValueError, TypeError):  # not an integer (or not a float) type
            continue
        # XLA packs 8 // bits elements per byte; a width that does not divide a byte is unpacked.
        return bits if bits in (1, 2, 4) else 8
    return 8


def packed_bytes(count: int, bits: int) -> int:
    """Bytes ``count`` elements of ``bits`` bits each take: ``ceil(count * bits / 8)``, as XLA
    rounds a packed sub-byte buffer (or shard) up to whole bytes."""
    return -(-count * bits // 8)


def leaf_shape(value: Any) -> tuple[int, ...] | None:
    """``shape_dtype(value)[0]`` without normalizing the dtype: the hot loop of spec validation."""
    if type(value) is NamedArray:
        value = value.array
    shape = getattr(value, "shape", None)
    if shape is None or getattr(value, "dtype", None) is None or isinstance(value, type):
        return None
    return shape if type(shape) is tuple else tuple(map(int, shape))


class Leaf:
    """One leaf of a tree as the rules see it: path, shape, dtype, axes and current placement.

    Built from the partitioning engine's one tree walk, so a plain array declared with
    ``field(axis_names=...)`` has ``axes`` exactly as ``shard``/``pspec_for`` see them, and a plain
    array already placed keeps its spec (``placed``) as ``pspec_for`` keeps it. ``index`` is the
    leaf's position among ``jax.tree_util.tree_flatten``'s leaves (``None`` for a NamedArray
    without an array, which flattens to none): its place in the tree's plan.
    """

    __slots__ = ("keys", "value", "shape", "dtype", "axes", "placed", "index", "_path")

    def __init__(
        self, keys: tuple[Any, ...], value: Any, info: LeafInfo = None, index: int | None = None
    ):
        self.keys = keys
        self.value = value
        self.index = index
        self._path: str | None = None
        self.axes: tuple[Axis, ...] | None = None
        self.placed: PartitionSpec | None = None
        self.shape, self.dtype = shape_dtype(value)
        if self.shape is None:
            return
        if isinstance(value, NamedArray):
            self.axes = value.axes
        elif info is not None:
            self.axes = leaf_axes(info, value)
        else:
            self.placed = plain_spec(value)

    @property
    def is_array(self) -> bool:
        """Whether the leaf holds an array (or an abstract one); other leaves get ``None`` specs."""
        return self.shape is not None

    @property
    def path(self) -> str:
        """The leaf's pytree path as ``a/b/0/c`` (``<root>`` for a bare leaf)."""
        if self._path is None:
            self._path = format_path(self.keys)
        return self._path

    @property
    def nbytes(self) -> int:
        """Bytes of the whole (unsharded) array."""
        if self.shape is None:
            return 0
        return packed_bytes(math.prod(self.shape), dtype_bits(self.dtype))


def flatten_leaves(tree: Any, *, keep_none: bool = False) -> tuple[list[Leaf], Any]:
    """Flatten ``tree`` with NamedArrays as leaves. Returns the leaves and the treedef.

    Names come from the engine's walk (``_tree.walk``: NamedArrays and ``field(axis_names=...)``
    arrays). With ``keep_none`` a ``None`` in the tree is a leaf too (so a spec tree can put
    ``None`` there).
    """
    if keep_none:
        is_leaf: Callable[[Any], bool] = lambda x: x is None or is_named_array(x)  # noqa: E731
    else:
        is_leaf = is_named_array
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)
    infos = walk(tree, jax.tree_util.tree_structure(tree)).infos
    # Align the walk (one entry per leaf of tree_flatten: none for a None, or for a NamedArray
    # with no array) with ours.
    out = []
    index = 0
    for keys, value in flat:
        if value is None or (isinstance(value, NamedArray) and value.array is None):
            out.append(Leaf(tuple(keys), value))
            continue
        info = infos[index]
        out.append(Leaf(tuple(keys), value, info if isinstance(info, FieldAxes) else None, index))
        index += 1
    return out, treedef


def planned_spec(planned: TreePlan, leaf: Leaf) -> PartitionSpec:
    """The plan's spec for an array ``leaf`` of the planned tree, as the rules and the analysis
    use it: names resolved (an error names the leaf's path); a plain array where it is placed,
    else replicated.

    Raises:
        ShardingError: ``At leaf 'path': `` and what ``resolve`` says.
    """
    spec = planned.spec(leaf.index) if leaf.index is not None else None
    return spec if spec is not None else replicated(len(leaf.shape or ()))


# -- specs -------------------------------------------------------------------------------------


def check_spec(leaf: Leaf, spec: PartitionSpec, sizes: Mapping[str, int], *, caller: str) -> None:
    """Raise ``ShardingError`` if ``spec`` (produced by ``caller``) is invalid for ``leaf``."""
    problems = spec_problems(leaf.shape or (), spec, sizes)
    if problems:
        raise ShardingError(
            f"{caller} gives leaf {leaf.path!r} (shape {leaf.shape}) an invalid spec: "
            + "; ".join(problems)
            + "."
        )


def shards_anything(spec: PartitionSpec | None, sizes: Mapping[str, int]) -> bool:
    """Whether ``spec`` splits some dimension over more than one device."""
    if spec is None:
        return False
    return any(
        math.prod(sizes.get(n, 1) for n in entry_axes(e) if isinstance(n, str)) > 1 for e in spec
    )


# -- placement ---------------------------------------------------------------------------------


def place_tree(tree: Any, shardings: Any, *, caller: str) -> Any:
    """Place each array leaf of ``tree`` on its ``NamedSharding`` (NamedArrays keep their axes).

    ``shardings`` has the structure rules return (a NamedArray is one leaf). Placement itself is the
    partitioning engine's: one batched ``device_put`` outside ``jit``; ``reshard`` for Explicit and
    ``with_sharding_constraint`` for Auto mesh axes inside; ``ShapeDtypeStruct``s get the sharding.

    Raises:
        ShardingError: if a sharding is on an ``AbstractMesh`` outside ``jit`` (no devices to put
            data on), as ``shard`` says it.
    """
    leaves, treedef = flatten_leaves(tree)
    targets = [
        t if lf.is_array else None for lf, t in zip(leaves, treedef.flatten_up_to(shardings))
    ]
    arrays = [lf.value.array if isinstance(lf.value, NamedArray) else lf.value for lf in leaves]
    mesh = next((t.mesh for t in targets if t is not None), None)  # to_shardings: one mesh
    placed, _ = place_planned(
        arrays,
        targets,
        mesh,
        caller=caller,
        plan_instead="the rule's to_shardings(tree, mesh=abstract_mesh) or apply(tree)",
    )
    out = [
        NamedArray._tree_unflatten(lf.value.axes, (new,))
        if isinstance(lf.value, NamedArray)
        else new
        for lf, new in zip(leaves, placed)
    ]
    return treedef.unflatten(out)


# -- the base class ----------------------------------------------------------------------------


class ShardingRule(abc.ABC):
    """A strategy that gives every array leaf of a pytree a ``PartitionSpec``.

    Subclasses implement :meth:`apply`. Leaves may be ``NamedArray``s, plain arrays,
    ``ShapeDtypeStruct``s, or NamedArrays holding ``ShapeDtypeStruct``s; the result has the same
    structure with a ``PartitionSpec`` where each array leaf (a NamedArray counts as one leaf) was
    and ``None`` where a non-array leaf was. When mapping over the tree, pass
    ``is_leaf=is_named_array`` so that a NamedArray gets one spec.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from jax.sharding import PartitionSpec as P
        >>> from namedaxes import is_named_array, named
        >>> from namedaxes.rules import ShardingRule
        >>> class ShardFirstDim(ShardingRule):
        ...     def apply(self, tree):
        ...         return jax.tree.map(lambda x: P("data"), tree, is_leaf=is_named_array)
        >>> ShardFirstDim().apply({"w": jnp.zeros(8), "x": named(jnp.zeros((8, 2)), ("a", "b"))})
        {'w': P('data',), 'x': P('data',)}
    """

    #: The mesh the rule plans for (``None``: the context mesh at call time).
    mesh: MeshLike | None = None

    @abc.abstractmethod
    def apply(self, tree: Any) -> Any:
        """Return a tree of ``PartitionSpec`` (``None`` for non-array leaves) shaped like ``tree``."""

    def _on_mesh(self, mesh: MeshLike) -> ShardingRule:
        """This rule planning on ``mesh``: itself when it has a mesh of its own, else a shallow
        copy whose mesh is ``mesh`` (the rule's ``apply`` reads ``self.mesh``)."""
        if self.mesh is not None:
            return self
        clone = copy.copy(self)
        try:
            clone.mesh = mesh
        except AttributeError:  # a subclass whose mesh is a read-only property plans as it is
            return self
        return clone

    def to_shardings(self, tree: Any, mesh: Mesh | AbstractMesh | None = None) -> Any:
        """Like :meth:`apply`, but with a ``NamedSharding`` per array leaf.

        Args:
            tree: The pytree to plan.
            mesh: The mesh of the shardings; defaults to the rule's mesh, then the context mesh. A
                rule without a mesh of its own plans on it.

        Returns:
            A tree of ``NamedSharding`` (``None`` for non-array leaves); usable as ``in_shardings``
            of ``jax.jit`` or as the target of ``jax.device_put``.

        Raises:
            MeshError: if ``mesh`` and the rule's own mesh differ (axes, sizes or devices), or
                there is no mesh (``NoMeshError``).
            NamedTypeError: if :meth:`apply` gives an array leaf something other than a
                ``PartitionSpec`` or ``None``, naming the leaf.
            ShardingError: if :meth:`apply` gives an array leaf a spec that does not fit its
                shape or the mesh (rank, unknown or repeated mesh axis, indivisible dimension),
                naming the rule, the leaf's path and shape.

        Example:
            >>> import jax, jax.numpy as jnp
            >>> from namedaxes.rules import AutoShardingRule
            >>> mesh = jax.make_mesh((8,), ("data",))
            >>> AutoShardingRule(mesh).to_shardings({"w": jnp.zeros(16)})["w"].spec
            P('data',)
            >>> AutoShardingRule().to_shardings({"w": jnp.zeros(16)}, mesh)["w"].spec
            P('data',)
        """
        target = placement_mesh(self, mesh, caller="to_shardings")
        # Given a mesh, rules without one plan on it. Otherwise a rule with a mesh plans as it is
        # (a composite then checks its mesh-less sub-rules against the context mesh).
        planner = self._on_mesh(target) if mesh is not None or self.mesh is None else self
        values, treedef, specs = rule_specs(planner, tree)
        check_rule_specs(planner, tree, values, specs, mesh_axis_sizes(target))
        return treedef.unflatten(
            [
                None if spec is None or shape_dtype(v)[0] is None else NamedSharding(target, spec)
                for v, spec in zip(values, specs)
            ]
        )

    def shard(self, tree: Any, mesh: Mesh | AbstractMesh | None = None) -> Any:
        """Place every array leaf of ``tree`` with the spec this rule gives it.

        Outside ``jit`` arrays are moved with one batched ``jax.device_put`` (arrays already placed
        as asked are left alone); inside ``jit`` they are constrained (``reshard`` for Explicit
        mesh axes, which JAX wants under ``jax.set_mesh``; ``with_sharding_constraint`` for Auto
        ones). ``ShapeDtypeStruct`` leaves come back carrying the sharding. NamedArrays keep their
        axes. The mesh is chosen as :meth:`to_shardings` chooses it.

        Raises:
            ShardingError: if the mesh is an ``AbstractMesh`` outside ``jit``.

        Example:
            >>> import jax, jax.numpy as jnp
            >>> from namedaxes.rules import AutoShardingRule
            >>> mesh = jax.make_mesh((8,), ("data",))
            >>> AutoShardingRule(mesh).shard({"w": jnp.zeros(16)})["w"].sharding.spec
            P('data',)
        """
        return place_tree(
            tree, self.to_shardings(tree, mesh), caller=f"{type(self).__name__}.shard"
        )


def rule_specs(rule: ShardingRule, tree: Any) -> tuple[list[Any], Any, list[Any]]:
    """``rule.apply(tree)`` checked: the tree's leaf values, its treedef and one spec per leaf.

    Every array leaf must get a ``PartitionSpec`` or ``None`` (a NamedArray is one leaf), so a rule
    that mapped into a NamedArray, or returned anything else, is named with the leaf's path
    instead of failing later inside JAX or being skipped by a composite.

    Raises:
        SpecMismatchError: if the result's structure is not the tree's.
        NamedTypeError: naming the first array leaf whose spec is something else.
    """
    values, treedef = jax.tree_util.tree_flatten(tree, is_leaf=is_named_array)
    name = type(rule).__name__
    out = rule.apply(tree)
    try:
        specs = treedef.flatten_up_to(out)
    except (ValueError, TypeError) as e:
        raise SpecMismatchError(
            f"{name}.apply returned a tree whose structure is not the input's: "
            f"{str(e).rstrip('.')}. Return one "
            "PartitionSpec per array leaf (a NamedArray is one leaf: map with "
            "is_leaf=na.is_named_array) and None for other leaves."
        ) from e
    for i, (value, spec) in enumerate(zip(values, specs)):
        if spec is None or isinstance(spec, PartitionSpec) or shape_dtype(value)[0] is None:
            continue
        keys = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_named_array)[0][i][0]
        hint = (
            " It mapped into the NamedArray: a NamedArray is one leaf, so pass "
            "is_leaf=na.is_named_array, e.g. jax.tree.map(fn, tree, is_leaf=na.is_named_array)."
            if isinstance(spec, NamedArray)
            else " Return a PartitionSpec (or None for replicated) per array leaf."
        )
        raise NamedTypeError(
            f"{name}.apply gave leaf {format_path(keys)!r} {spec!r} ({type(spec).__name__}), not a "
            f"PartitionSpec or None.{hint}"
        )
    return values, treedef, specs


def check_rule_specs(
    rule: ShardingRule, tree: Any, values: list[Any], specs: list[Any], sizes: Mapping[str, int]
) -> None:
    """Check the specs ``rule`` gave the array leaves of ``tree`` (``rule_specs``) against their
    shapes and the mesh, before JAX sees them: a custom rule's mistake is named here, the same on
    ``Auto`` and ``Explicit`` meshes, instead of surfacing as JAX's own error (or assertion).

    Raises:
        ShardingError: naming the rule, the first bad leaf's path and shape, what is wrong, and a fix.
    """
    checked: dict[tuple[tuple[int, ...], PartitionSpec], bool] = {}  # few distinct pairs
    for i, (value, spec) in enumerate(zip(values, specs)):
        shape = leaf_shape(value)
        if spec is None or shape is None:
            continue
        ok = checked.get((shape, spec))
        if ok is None:
            ok = checked[(shape, spec)] = not spec_problems(shape, spec, sizes)
        if not ok:
            keys = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_named_array)[0][i][0]
            leaf = Leaf(tuple(keys), value)
            check_spec(
                leaf, spec, sizes, caller=f"{type(rule).__name__}.apply on {format_mesh(sizes)}"
            )


def map_array_leaves(tree: Any, fn: Callable[[Leaf], PartitionSpec]) -> Any:
    """Call ``fn`` on every array leaf; ``None`` for the rest. Same structure as ``tree``."""
    leaves, treedef = flatten_leaves(tree)
    return treedef.unflatten([fn(lf) if lf.is_array else None for lf in leaves])


def replicated(rank: int) -> PartitionSpec:
    """The fully replicated spec with one ``None`` entry per dimension."""
    return PartitionSpec(*([None] * rank))


def format_bytes(n: float) -> str:
    """Human-readable bytes: ``1.50 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"  # pragma: no cover


def axis_names_arg(axis_names: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """A shape-driven rule's ``axis_names`` argument as a tuple (one bare name allowed)."""
    if axis_names is None:
        return None
    return (axis_names,) if isinstance(axis_names, str) else tuple(axis_names)


def rule_mesh_axes(
    mesh: MeshLike | None, axis_names: str | Sequence[str] | None, *, caller: str
) -> tuple[dict[str, int], tuple[str, ...]]:
    """A shape-driven rule's mesh sizes (``rule_mesh``) and the mesh axes it may use, in the
    order it tries them; size-1 axes dropped.

    ``axis_names`` keeps its given order; by default the largest axes come first (ties in mesh
    order), which is deterministic whatever ``PYTHONHASHSEED`` is.
    """
    sizes = mesh_axis_sizes(rule_mesh(mesh, caller=caller))
    given = axis_names_arg(axis_names)
    if given is None:
        names = sorted(sizes, key=lambda n: -sizes[n])  # stable: ties keep mesh order
    else:
        names = list(given)
        unknown = [n for n in names if n not in sizes]
        if unknown:
            raise ShardingError(
                f"{caller} was given axis_names {format_names(unknown)}, which the mesh "
                f"{format_mesh(sizes)} lacks. Available mesh "
                f"axes: {format_names(sizes)}."
            )
        if len(set(names)) != len(names):
            raise ShardingError(
                f"{caller} was given axis_names {format_names(names)}, which repeat a mesh axis. "
                "List each mesh axis once."
            )
    return sizes, tuple(n for n in names if sizes[n] > 1)
