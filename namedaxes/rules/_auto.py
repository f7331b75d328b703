"""Rules that choose specs from shapes alone: ``AutoShardingRule`` and
``MemoryConstrainedShardingRule`` (``MeshPartitionHelper`` is in ``_helper``).

All of them iterate mesh axes and dimensions in a fixed order (sizes, then position), never over a
``set``, so the chosen specs do not depend on ``PYTHONHASHSEED``. A NamedArray is planned with its
dimensions in axis-name order (``_flat.name_orders``), as is a ``field(axis_names=...)`` array, so
equal sizes are told apart by name and the same named axes get the same mesh axes whatever their
positions. Each spec is built so that every
mesh axis appears at most once and every sharded dimension is divisible by its mesh axes.
"""

from __future__ import annotations

import heapq
import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from jax.sharding import PartitionSpec

from .._errors import (
    NamedTypeError,
    ShardingError,
    ShardingWarning,
    format_mesh,
)
from .._mesh import MeshLike
from .._spec import entry_of
from ._base import (
    Leaf,
    ShardingRule,
    axis_names_arg,
    dtype_bits,
    flatten_leaves,
    format_bytes,
    map_array_leaves,
    packed_bytes,
    replicated,
    rule_mesh_axes,
)
from ._flat import (
    axes_order,
    by_name,
    flatten_values,
    in_order,
    key_paths,
    map_shapes,
    name_orders,
    shape_dtype,
)

__all__ = [
    "AutoShardingRule",
    "MemoryBudgetWarning",
    "MemoryConstrainedShardingRule",
]


class MemoryBudgetWarning(ShardingWarning):
    """A leaf cannot be sharded to fit ``max_memory_per_device`` (``on_unfit="warn"``)."""


def _check_min_size(value: Any, caller: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ShardingError(
            f"{caller}: min_shard_size must be a non-negative int (number of elements) or None, got "
            f"{value!r}."
        )
    return value


class AutoShardingRule(ShardingRule):
    """Shard the largest dimensions of each array over the largest mesh axes that divide them.

    Dimensions are visited by size, largest first (smallest first with ``reverse``; ties by axis
    name for a NamedArray or a ``field(axis_names=...)`` array, by position for an array without
    names). Each takes the first mesh axis, not yet used by that array, whose size divides it.
    Mesh axes are tried in the order of ``axis_names`` (default: largest first, ties in mesh order);
    size-1 axes are skipped. Arrays with fewer than ``min_shard_size`` elements, and empty arrays,
    stay replicated. Specs have one entry per dimension.

    Args:
        mesh: A ``Mesh``, ``AbstractMesh`` or ``{axis: size}`` dict; ``None`` uses the context mesh
            (``jax.set_mesh``) when the rule is applied.
        axis_names: The mesh axes to use, in the order to try them.
        min_shard_size: Arrays with fewer elements stay replicated (``None``: shard everything).
        reverse: Visit the smallest dimensions first.

    Raises:
        ShardingError: (on ``apply``) if ``axis_names`` names a mesh axis the mesh lacks.

    Example:
        >>> import jax
        >>> from namedaxes.rules import AutoShardingRule
        >>> rule = AutoShardingRule({"data": 2, "model": 4})
        >>> rule.apply({"w": jax.ShapeDtypeStruct((6, 8), "float32")})
        {'w': P('data', 'model')}
    """

    def __init__(
        self,
        mesh: MeshLike | None = None,
        axis_names: Sequence[str] | None = None,
        min_shard_size: int | None = None,
        reverse: bool = False,
    ) -> None:
        self.mesh = mesh
        self.axis_names = axis_names_arg(axis_names)
        self.min_shard_size = _check_min_size(min_shard_size, "AutoShardingRule")
        self.reverse = bool(reverse)

    def __repr__(self) -> str:
        return (
            f"AutoShardingRule(mesh={self.mesh!r}, axis_names={self.axis_names!r}, "
            f"min_shard_size={self.min_shard_size!r}, reverse={self.reverse!r})"
        )

    def apply(self, tree: Any) -> Any:
        """Return a spec per array leaf of ``tree`` (see the class docstring for the algorithm)."""
        sizes, axes = rule_mesh_axes(self.mesh, self.axis_names, caller="AutoShardingRule")
        return map_shapes(tree, lambda shape: self._spec(shape, axes, sizes))

    def _spec(
        self, shape: tuple[int, ...], axes: tuple[str, ...], sizes: Mapping[str, int]
    ) -> PartitionSpec:
        n = math.prod(shape)
        if n == 0 or (self.min_shard_size is not None and n < self.min_shard_size):
            return replicated(len(shape))
        sign = 1 if self.reverse else -1
        order = sorted(range(len(shape)), key=lambda d: (sign * shape[d], d))
        free = list(axes)
        entries: list[Any] = [None] * len(shape)
        for d in order:
            for a in free:
                if shape[d] % sizes[a] == 0:
                    entries[d] = a
                    free.remove(a)
                    break
        return PartitionSpec(*entries)


def _entries(assign: list[list[str]]) -> PartitionSpec:
    return PartitionSpec(*[entry_of(a) for a in assign])


class MemoryConstrainedShardingRule(ShardingRule):
    """Shard arrays just enough to fit a per-device memory budget, per leaf or for the whole device.

    With ``scope="leaf"`` (the default) the budget applies to **each array's shard on its own**, not
    to the device: many arrays that each fit stay replicated, and their sum can be far over the
    budget (on the Llama-3-70B training state of ``benchmarks/plan.py`` over ``data=32, model=8``, a
    16 GiB per-leaf budget leaves 91.6 GiB per device). Use ``scope="device"`` to budget the sum of
    every array's shard on one device.

    Per leaf: an array that fits ``max_memory_per_device`` unsharded stays replicated. Otherwise
    mesh axes are taken largest first (ties in mesh order, size-1 axes skipped); each goes to the
    dimension with the largest remaining per-device extent that it divides (ties by axis name for a
    NamedArray or a ``field(axis_names=...)`` array, by position for an array without names;
    several mesh axes may share a dimension, giving tuple entries), until the array fits. If that greedy pass does not fit, every
    valid spec is searched for the one with the fewest bytes per device. When even that does not
    fit, ``on_unfit`` decides: ``"error"`` raises, ``"warn"`` emits a ``MemoryBudgetWarning`` and
    uses the best spec.

    Whole device: every array starts replicated; while the sum of per-device bytes is over the
    budget, the kind of array (same shape and bits per element) holding the most bytes per device takes its
    next mesh axis (largest first, onto its largest remaining dimension that the axis divides), so
    the biggest contributors are sharded first and small arrays stay replicated when they can.
    Arrays of the same kind always get the same spec (for named arrays, the same mesh axes on the
    same axis names: a kind is counted with its axes in name order). If every array is sharded as far as it can be
    and the sum is still over, ``on_unfit`` decides as above.

    Args:
        max_memory_per_device: The budget in bytes (a finite number >= 0): for each array's
            per-device shard (``scope="leaf"``) or for the sum on one device (``"device"``).
        mesh: A ``Mesh``, ``AbstractMesh`` or ``{axis: size}`` dict (``None``: context mesh).
        axis_names: The mesh axes to use, in the order to try them (default: largest first).
        on_unfit: ``"error"`` (default) or ``"warn"``.
        scope: ``"leaf"`` (default) or ``"device"``.

    Raises:
        ShardingError: if the budget is negative or not finite, or ``on_unfit``/``scope`` unknown;
            on ``apply``, if the budget cannot be met (under ``"error"``), naming the leaf (or the
            device total), its bytes and the best achievable.

    Example:
        >>> import jax
        >>> from namedaxes.rules import MemoryConstrainedShardingRule
        >>> rule = MemoryConstrainedShardingRule(1024, {"data": 2, "model": 4})
        >>> rule.apply({"small": jax.ShapeDtypeStruct((16,), "float32"),
        ...             "big": jax.ShapeDtypeStruct((64, 16), "float32")})
        {'big': P('model', None), 'small': P(None,)}
        >>> whole = MemoryConstrainedShardingRule(1024, {"data": 2, "model": 4}, scope="device")
        >>> whole.apply({"a": jax.ShapeDtypeStruct((64, 16), "float32"),
        ...              "b": jax.ShapeDtypeStruct((64, 16), "float32")})
        {'a': P(('model', 'data'), None), 'b': P(('model', 'data'), None)}
    """

    def __init__(
        self,
        max_memory_per_device: int,
        mesh: MeshLike | None = None,
        axis_names: Sequence[str] | None = None,
        on_unfit: Literal["error", "warn"] = "error",
        *,
        scope: Literal["leaf", "device"] = "leaf",
    ) -> None:
        budget = max_memory_per_device
        if isinstance(budget, bool) or not isinstance(budget, (int, float)):
            raise NamedTypeError(
                f"max_memory_per_device must be a number of bytes, got {budget!r} "
                f"({type(budget).__name__})."
            )
        if not math.isfinite(budget):
            raise ShardingError(
                f"max_memory_per_device must be a finite number of bytes, got {budget}. Give the "
                "per-device budget in bytes, e.g. 16 * 2**30 for 16 GiB."
            )
        if budget < 0:
            raise ShardingError(
                f"max_memory_per_device must be >= 0 bytes, got {budget}. Give the per-device "
                "budget in bytes, e.g. 16 * 2**30 for 16 GiB."
            )
        if on_unfit not in ("error", "warn"):
            raise ShardingError(f"on_unfit must be 'error' or 'warn', got {on_unfit!r}.")
        if scope not in ("leaf", "device"):
            raise ShardingError(
                f"scope must be 'leaf' (budget each array) or 'device' (budget the sum on one "
                f"device), got {scope!r}."
            )
        self.scope = scope
        self.max_memory_per_device = budget
        self.mesh = mesh
        self.axis_names = axis_names_arg(axis_names)
        self.on_unfit = on_unfit

    def __repr__(self) -> str:
        return (
            f"MemoryConstrainedShardingRule({self.max_memory_per_device!r}, mesh={self.mesh!r}, "
            f"axis_names={self.axis_names!r}, on_unfit={self.on_unfit!r}, scope={self.scope!r})"
        )

    def apply(self, tree: Any) -> Any:
        """Return a spec per array leaf that fits the budget (see the class docstring)."""
        owner = "MemoryConstrainedShardingRule"
        sizes, axes = rule_mesh_axes(self.mesh, self.axis_names, caller=owner)
        if self.scope == "device":
            return self._apply_device(tree, axes, sizes)
        # (spec, bytes per device) per (shape, bits per element), the shape in name order; and
        # per (shape, bits, name order), the spec in the leaf's own order.
        cache: dict[tuple[tuple[int, ...], int], tuple[PartitionSpec, int]] = {}
        placed: dict[tuple[tuple[int, ...], int, tuple[int, ...] | None], Any] = {}
        # Values only (no Leaf record per leaf); key paths and a record only for unfit leaves.
        values, treedef = flatten_values(tree)
        orders = name_orders(tree, values)  # a named leaf is planned in axis-name order
        keys: list[tuple[Any, ...]] | None = None
        out: list[PartitionSpec | None] = []
        unfit: list[str] = []
        for j, (value, order) in enumerate(zip(values, orders)):
            shape, dtype = shape_dtype(value)
            if shape is None:
                out.append(None)
                continue
            leaf_key = (shape, dtype_bits(dtype), order)
            hit = placed.get(leaf_key)
            if hit is None:
                key = (by_name(shape, order), leaf_key[1])
                found = cache.get(key)
                if found is None:
                    found = cache[key] = self._spec(key[0], key[1], axes, sizes)
                hit = placed[leaf_key] = (in_order(found[0], order), found[1])
            spec, per_device = hit
            if per_device > self.max_memory_per_device:
                if keys is None:
                    keys = key_paths(tree, treedef)
                message = self._unfit_message(Leaf(tuple(keys[j]), value), spec, per_device, sizes)
                if self.on_unfit == "error":
                    raise ShardingError(message)
                unfit.append(message)
            out.append(spec)
        for message in unfit:
            warnings.warn(message, MemoryBudgetWarning, stacklevel=2)
        return treedef.unflatten(out)

    def _spec(
        self, shape: tuple[int, ...], bits: int, axes: tuple[str, ...], sizes: Mapping[str, int]
    ) -> tuple[PartitionSpec, int]:
        budget = self.max_memory_per_device
        whole = packed_bytes(math.prod(shape), bits)
        if whole <= budget:
            return replicated(len(shape)), whole
        extents = list(shape)
        assign: list[list[str]] = [[] for _ in shape]
        for a in axes:
            dims = [d for d in range(len(shape)) if extents[d] % sizes[a] == 0 and extents[d] > 0]
            if not dims:
                continue
            d = min(dims, key=lambda d: (-extents[d], d))
            extents[d] //= sizes[a]
            assign[d].append(a)
            if packed_bytes(math.prod(extents), bits) <= budget:
                return _entries(assign), packed_bytes(math.prod(extents), bits)
        greedy = packed_bytes(math.prod(extents), bits)
        best, best_bytes = _best_spec(shape, bits, axes, sizes)
        # Keep the greedy layout (largest dims over largest axes) unless the search beats it.
        return (best, best_bytes) if best_bytes < greedy else (_entries(assign), greedy)

    def _apply_device(self, tree: Any, axes: tuple[str, ...], sizes: Mapping[str, int]) -> Any:
        """The whole-device mode: shard the largest contributors until the sum fits."""
        leaves, _ = flatten_leaves(tree)
        # A kind is (shape, bits per element), a named leaf's shape taken in axis-name order.
        kinds: dict[
            tuple[tuple[int, ...], int], list[Any]
        ] = {}  # -> [count, extents, assign, next]
        for lf in leaves:
            if lf.shape is not None and lf.dtype is not None:
                key = (by_name(lf.shape, axes_order(lf.axes)), dtype_bits(lf.dtype))
                if key in kinds:
                    kinds[key][0] += 1
                else:
                    kinds[key] = [1, list(key[0]), [[] for _ in key[0]], 0]

        def held(
            key: tuple[tuple[int, ...], int],
        ) -> int:  # bytes per device of all leaves of a kind
            count, extents, _, _ = kinds[key]
            return count * packed_bytes(math.prod(extents), key[1])

        total = sum(held(k) for k in kinds)
        heap = [(-held(k), i, k) for i, k in enumerate(kinds)]
        heapq.heapify(heap)
        while total > self.max_memory_per_device and heap:
            _, i, key = heapq.heappop(heap)
            extents, assign, nxt = kinds[key][1], kinds[key][2], kinds[key][3]
            while nxt < len(axes):  # the next mesh axis that divides some remaining extent
                a = axes[nxt]
                nxt += 1
                dims = [
                    d for d in range(len(extents)) if extents[d] > 0 and extents[d] % sizes[a] == 0
                ]
                if dims:
                    before = held(key)
                    d = min(dims, key=lambda d: (-extents[d], d))
                    extents[d] //= sizes[a]
                    assign[d].append(a)
                    total += held(key) - before
                    heapq.heappush(heap, (-held(key), i, key))
                    break
            kinds[key][3] = nxt  # past the last axis: this kind cannot shard further
        if total > self.max_memory_per_device:
            biggest = sorted(kinds, key=lambda k: -held(k))[:3]
            shown = ", ".join(f"{k[0]} x{kinds[k][0]} -> {format_bytes(held(k))}" for k in biggest)
            message = (
                f"MemoryConstrainedShardingRule(scope='device'): with every array sharded as far "
                f"as the mesh {format_mesh(sizes)} allows, one device still holds {total} bytes "
                f"({format_bytes(total)}), over the budget of {self.max_memory_per_device} bytes. "
                f"Largest kinds (shape x count -> per device): {shown}. Use a larger mesh, a mesh "
                "whose axes divide the shapes, a larger budget, or on_unfit='warn'."
            )
            if self.on_unfit == "error":
                raise ShardingError(message)
            warnings.warn(message, MemoryBudgetWarning, stacklevel=3)
        specs = {k: _entries(v[2]) for k, v in kinds.items()}

        def spec_of(lf: Leaf) -> PartitionSpec:  # map_array_leaves: array leaves only
            order = axes_order(lf.axes)
            shape, bits = lf.shape or (), dtype_bits(lf.dtype)
            return in_order(specs[(by_name(shape, order), bits)], order)

        return map_array_leaves(tree, spec_of)

    def _unfit_message(
        self, leaf: Leaf, spec: PartitionSpec, per_device: int, sizes: Mapping[str, int]
    ) -> str:
        mesh = format_mesh(sizes)
        return (
            f"MemoryConstrainedShardingRule: leaf {leaf.path!r} (shape {leaf.shape}, {leaf.dtype}) "
            f"holds {leaf.nbytes} bytes ({format_bytes(leaf.nbytes)}); the best valid spec on "
            f"{mesh}, {spec}, still leaves {per_device} bytes ({format_bytes(per_device)}) per "
            f"device, over the budget of {self.max_memory_per_device} bytes. Raise "
            "max_memory_per_device, use a mesh whose axes divide the shape, or pass "
            "on_unfit='warn' to accept the best spec."
        )


def _best_spec(
    shape: tuple[int, ...], bits: int, axes: tuple[str, ...], sizes: Mapping[str, int]
) -> tuple[PartitionSpec, int]:
    """The valid spec with the fewest bytes per device (exhaustive; only used when greedy fails).

    Bytes per device are ``packed_bytes(size / product of used axis sizes, bits)`` for a valid
    spec, so this maximizes
    that product. The first best found (axes in order, dimensions by position; a named leaf's shape
    comes in axis-name order) wins: deterministic.
    """
    best_product = 0
    best: list[list[str]] = []
    remaining = [math.prod(sizes[a] for a in axes[i:]) for i in range(len(axes) + 1)]
    assign: list[list[str]] = [[] for _ in shape]
    extents = list(shape)

    def search(i: int, product: int) -> None:
        nonlocal best_product, best
        if product * remaining[i] <= best_product:
            return
        if i == len(axes):
            best_product, best = product, [list(a) for a in assign]
            return
        a = axes[i]
        k = sizes[a]
        for d in range(len(shape)):
            if extents[d] > 0 and extents[d] % k == 0:
                extents[d] //= k
                assign[d].append(a)
                search(i + 1, product * k)
                assign[d].pop()
                extents[d] *= k
        search(i + 1, product)

    search(0, 1)
    per_device = packed_bytes(math.prod(shape) // max(best_product, 1), bits)
    return _entries(best or [[] for _ in shape]), per_device
