"""``ShardingAnalyzer``: check a tree of specs against a tree of arrays and count bytes per device.

The byte count is exact per device and vectorised with NumPy. A dimension of size ``n`` split ``k``
ways gives shard ``i`` the block ``min(c, max(0, n - i*c))`` with ``c = ceil(n / k)`` (XLA's padded
layout), and a device's shard index along a dimension comes from its coordinates on that dimension's
mesh axes (the first mesh axis of a tuple entry is the most significant). Evenly divided leaves take
a fast path: every device holds ``size / k`` elements. Bytes are ``ceil(elements * bits / 8)`` per
shard (``dtype_bits``): XLA packs sub-byte types such as ``int4`` and rounds each buffer up to a byte.
"""

from __future__ import annotations

import array
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from .._errors import ShardingError, SpecMismatchError, format_mesh, format_path
from .._mesh import MeshLike, mesh_axis_sizes
from ..rules._base import (
    Leaf,
    dtype_bits,
    entry_axes,
    flatten_leaves,
    leaf_shape,
    packed_bytes,
    rule_mesh,
    spec_problems,
)
from ..rules._flat import flatten_values, key_paths, key_paths_later, shape_dtype

__all__ = [
    "LeafUsage",
    "ShardingAnalyzer",
    "pair_specs",
    "per_device_bytes",
    "unique_device_bytes",
    "usage_of",
]

# Bound the (leaves x dims x devices) index block of the uneven path to ~32 MB of int64.
_BLOCK_ELEMENTS = 4_000_000


def _is_spec_leaf(x: Any) -> bool:
    return x is None or isinstance(x, (PartitionSpec, NamedSharding))


class _Flat:
    """A tree's leaf values (NamedArrays and ``None`` are leaves), its treedef, and the spec tree
    read against that structure; key paths are built only if asked for."""

    __slots__ = ("tree", "treedef", "values", "specs", "_keys")

    def __init__(self, tree: Any, specs: Any, sizes: dict[str, int] | None = None) -> None:
        self.tree = tree
        self.values, self.treedef = flatten_values(tree, keep_none=True)
        try:
            flat = self.treedef.flatten_up_to(specs)
        except (ValueError, TypeError):
            flat = None
        self._keys: list[tuple[Any, ...]] | None = None
        if flat is None or len(flat) != len(self.values):
            raise SpecMismatchError(_mismatch_message(self.keys, specs))
        for i, spec in enumerate(flat):
            if isinstance(spec, NamedSharding):
                if sizes is not None and mesh_axis_sizes(spec.mesh) != sizes:
                    raise ShardingError(
                        f"At leaf {self.path(i)!r}: the NamedSharding {spec.spec} is on "
                        f"{format_mesh(mesh_axis_sizes(spec.mesh))}, but the analysis is of "
                        f"{format_mesh(sizes)}; its bytes per device would be counted on the "
                        "wrong mesh. Pass the spec (sharding.spec) to count it on this mesh, or "
                        "analyse on the sharding's mesh."
                    )
                flat[i] = spec.spec
        self.specs = flat

    @property
    def keys(self) -> list[tuple[Any, ...]]:
        if self._keys is None:
            self._keys = key_paths(self.tree, self.treedef, keep_none=True)
        return self._keys

    def path(self, i: int) -> str:
        return format_path(self.keys[i])


def pair_specs(tree: Any, specs: Any) -> list[tuple[Leaf, Any]]:
    """Pair each leaf of ``tree`` (NamedArrays are leaves) with its entry in ``specs``.

    ``NamedSharding`` entries are reduced to their spec. ``None`` in ``tree`` is a leaf, so a spec
    tree made by a rule (which puts ``None`` there) matches.

    Raises:
        SpecMismatchError: naming the first path where the two trees differ.
    """
    leaves, _ = flatten_leaves(tree, keep_none=True)
    return list(zip(leaves, _Flat(tree, specs).specs))


def _mismatch_message(keys: list[tuple[Any, ...]], specs: Any) -> str:
    flat_specs, _ = jax.tree_util.tree_flatten_with_path(specs, is_leaf=_is_spec_leaf)
    spec_keys = [tuple(k) for k, _ in flat_specs]
    data_paths = [format_path(k) for k in keys]
    spec_paths = [format_path(k) for k in spec_keys]
    spec_set, data_set = set(spec_paths), set(data_paths)  # membership only
    missing = [p for p in data_paths if p not in spec_set]
    extra = [p for p in spec_paths if p not in data_set]
    differing = [i for i, (k, sk) in enumerate(zip(keys, spec_keys)) if tuple(k) != sk]
    if missing:
        what = f"the first mismatch is leaf {missing[0]!r}, which has no spec"
        if extra:
            what += f" (the specs have {extra[0]!r} instead)"
    elif extra:
        what = f"the first mismatch is {extra[0]!r} in the specs, which is not a leaf of the tree"
    elif differing:
        i = differing[0]
        what = (
            f"the first mismatch is leaf {data_paths[i]!r}, where the spec tree has a different "
            f"container or key type ({spec_paths[i]!r})"
        )
    else:
        what = (
            "the paths agree but the containers differ (e.g. a tuple where the tree has a list, "
            "or a module with other static fields)"
        )
    return (
        f"The partition specs do not match the tree: {what} ({len(data_paths)} leaves vs "
        f"{len(spec_paths)} specs). Build the specs from the same tree, e.g. rule.apply(tree), "
        "with one PartitionSpec per array (a NamedArray is one leaf) and None elsewhere."
    )


def _device_coords(sizes: Mapping[str, int]) -> np.ndarray:
    """``(devices, mesh_axes)`` coordinates in ``mesh.devices.flat`` (row-major) order."""
    grids = np.indices(tuple(sizes.values())).reshape(len(sizes), -1)
    return grids.T.astype(np.int64)


def per_device_bytes(
    records: Sequence[tuple[tuple[int, ...], int, tuple[tuple[str, ...], ...]]],
    sizes: Mapping[str, int],
) -> tuple[np.ndarray, np.ndarray]:
    """Bytes each device holds of each distinct record, summed and per record.

    Args:
        records: ``(shape, bits, entries)`` per leaf (``bits`` per element, ``dtype_bits``); ``entries`` has one tuple of mesh axes per
            dimension (``()`` for unsharded ones), and may be shorter than the shape.
        sizes: ``{mesh_axis: size}`` in mesh order.

    Returns:
        ``(total, busiest)``: bytes per device summed over records (shape ``(devices,)``), and each
        record's bytes on its busiest device (shape ``(len(records),)``).
    """
    # Deduplicate: real models repeat the same (shape, dtype, spec) many times.
    index: dict[Any, int] = {}
    which = [index.setdefault(rec, len(index)) for rec in records]
    counts = [0] * len(index)
    for r in which:
        counts[r] += 1
    total, busiest = unique_device_bytes(list(index), counts, sizes)
    return total, busiest[which] if which else np.zeros(0, dtype=np.int64)


def unique_device_bytes(
    records: Sequence[tuple[tuple[int, ...], int, tuple[tuple[str, ...], ...]]],
    counts: Sequence[int],
    sizes: Mapping[str, int],
) -> tuple[np.ndarray, np.ndarray]:
    """``per_device_bytes`` for distinct records, record ``i`` held by ``counts[i]`` leaves."""
    n_dev = math.prod(sizes.values())
    total = np.zeros(n_dev, dtype=np.int64)
    busiest = np.zeros(len(records), dtype=np.int64)
    even = 0
    uneven = []
    for i, (rec, count) in enumerate(zip(records, counts)):
        shape, bits, entries = rec
        ks = [math.prod(sizes[a] for a in e) for e in entries]
        if all(shape[d] % k == 0 for d, k in enumerate(ks)):
            nbytes = packed_bytes(math.prod(shape) // math.prod(ks), bits)
            even += nbytes * count
            busiest[i] = nbytes
        else:
            uneven.append((rec, [i], count))
    total += even
    if uneven:
        _uneven_bytes(uneven, sizes, total, busiest)
    return total, busiest


def _uneven_bytes(
    uneven: list[tuple[Any, list[int], int]],
    sizes: Mapping[str, int],
    total: np.ndarray,
    busiest: np.ndarray,
) -> None:
    """The exact per-device path for leaves with a dimension not divisible by its mesh axes."""
    names = list(sizes)
    pos = {n: i for i, n in enumerate(names)}
    coords = _device_coords(sizes)  # (D, A)
    n_dev = coords.shape[0]
    rank = max(len(rec[0]) for rec, _, _ in uneven) or 1
    block = max(1, _BLOCK_ELEMENTS // (rank * n_dev))
    for start in range(0, len(uneven), block):
        chunk = uneven[start : start + block]
        u = len(chunk)
        n = np.ones((u, rank), dtype=np.int64)
        k = np.ones((u, rank), dtype=np.int64)
        strides = np.zeros((u, rank, len(names)), dtype=np.int64)
        bits = np.empty(u, dtype=np.int64)
        count = np.empty(u, dtype=np.int64)
        for j, ((shape, width, entries), _, times) in enumerate(chunk):
            bits[j] = width
            count[j] = times
            n[j, : len(shape)] = shape
            for d, entry in enumerate(entries):
                stride = 1
                for a in reversed(entry):  # the first mesh axis of an entry is the most significant
                    strides[j, d, pos[a]] = stride
                    stride *= sizes[a]
                k[j, d] = stride
        c = -(-n // k)  # ceil(n / k): the padded block size
        shard_index = np.einsum("uda,xa->udx", strides, coords)  # (u, rank, D)
        extent = np.clip(n[..., None] - shard_index * c[..., None], 0, c[..., None])
        nbytes = -(-extent.prod(axis=1) * bits[:, None] // 8)  # (u, D): packed_bytes per shard
        total += (nbytes * count[:, None]).sum(axis=0)
        peak = nbytes.max(axis=1)
        for j, (_, idxs, _) in enumerate(chunk):
            busiest[idxs] = peak[j]


class ShardingAnalyzer:
    """Validate partition specs against a tree and estimate the bytes each device will hold.

    Works on concrete arrays and on abstract trees (``jax.eval_shape`` /
    ``eqx.filter_eval_shape``), and on meshes that need not exist: an ``AbstractMesh`` or a
    ``{axis: size}`` dict plans a 256-device layout on one CPU.

    Args:
        mesh: A ``Mesh``, ``AbstractMesh`` or ``{axis: size}`` dict; ``None`` uses the context mesh
            (``jax.set_mesh``) at each call.

    Example:
        >>> import jax
        >>> from jax.sharding import PartitionSpec as P
        >>> from namedaxes.analysis import ShardingAnalyzer
        >>> analyzer = ShardingAnalyzer({"data": 2, "model": 4})
        >>> params = {"w": jax.ShapeDtypeStruct((1024, 512), "float32")}
        >>> analyzer.estimate_memory_usage(params, {"w": P("data", "model")})["size_per_device"]
        262144
    """

    def __init__(self, mesh: MeshLike | None = None) -> None:
        if mesh is not None:
            mesh_axis_sizes(mesh)  # fail early on a bad mesh
        self._mesh = mesh

    @property
    def mesh(self) -> MeshLike:
        """The analyzer's mesh, or the context mesh when it was created without one."""
        return rule_mesh(self._mesh, caller="ShardingAnalyzer")

    def __repr__(self) -> str:
        return f"ShardingAnalyzer(mesh={self._mesh!r})"

    def validate_partition_specs(self, tree: Any, specs: Any) -> list[str]:
        """Everything wrong with ``specs`` for ``tree`` on the mesh, one message per problem.

        Reports specs longer than the array's rank, unknown mesh axes, mesh axes used twice in one
        spec, dimensions not divisible by their mesh axes, specs that are not ``PartitionSpec``s,
        and specs given for non-array leaves. Each message starts with the leaf's path. An array
        whose spec is ``None`` counts as replicated.

        Raises:
            SpecMismatchError: if the spec tree's structure differs from the tree's (the message
                names the first differing path).

        Example:
            >>> import jax.numpy as jnp
            >>> from jax.sharding import PartitionSpec as P
            >>> from namedaxes.analysis import ShardingAnalyzer
            >>> ShardingAnalyzer({"data": 2}).validate_partition_specs(
            ...     {"w": jnp.zeros((3, 4))}, {"w": P("data")})  # doctest: +ELLIPSIS
            ["w: dimension 0 of shape (3, 4) has size 3, which is not divisible by 2 ..."]
        """
        sizes = mesh_axis_sizes(self.mesh)
        flat = _Flat(tree, specs, sizes)
        issues: list[str] = []
        checked: dict[Any, list[str]] = {}  # (shape, spec) -> problems: a few hundred distinct
        for i, (value, spec) in enumerate(zip(flat.values, flat.specs)):
            if spec is None:
                continue
            shape = leaf_shape(value)
            if shape is None:
                issues.append(
                    f"{flat.path(i)}: has spec {spec} but is not an array "
                    f"({type(value).__name__}); give it None"
                )
                continue
            try:
                found = checked[shape, spec]
            except KeyError:
                found = checked[shape, spec] = spec_problems(shape, spec, sizes)
            except TypeError:  # an unhashable non-spec
                found = spec_problems(shape, spec, sizes)
            if found:
                path = flat.path(i)
                issues.extend(f"{path}: {p}" for p in found)
        return issues

    def estimate_memory_usage(self, tree: Any, specs: Any) -> dict[str, Any]:
        """Bytes per device for ``tree`` laid out with ``specs``.

        Replicated arrays count in full on every device; a dimension not divisible by its mesh
        axes is split as XLA pads it (the busiest device holds ``ceil(n / k)``). Non-array leaves
        are skipped; an array whose spec is ``None`` is replicated.

        Returns:
            A dict with ``total_size`` (bytes of the unsharded tree), ``size_per_device`` (the most
            bytes any device holds), ``per_device`` (bytes per device in ``mesh.devices.flat``
            order; row-major mesh coordinates for abstract meshes), ``replicated_bytes`` (bytes of
            leaves no spec entry splits), ``num_devices``, and ``leaves``: a read-only
            :class:`LeafUsage` mapping each array leaf's key path (as
            ``jax.tree_util.tree_flatten_with_path`` gives it) to ``{"spec", "total_bytes",
            "bytes_per_device"}``, the last being the busiest device's bytes. A rendered path
            such as ``"layers/0/w"`` also works as a key when exactly one leaf renders to it.

        Raises:
            SpecMismatchError: if the spec tree does not match the tree.
            ShardingError: if a spec is longer than its array's rank, names unknown mesh axes,
                repeats a mesh axis, or is not a ``PartitionSpec`` (all problems are listed).

        Example:
            >>> import jax.numpy as jnp
            >>> from jax.sharding import PartitionSpec as P
            >>> from namedaxes.analysis import ShardingAnalyzer
            >>> usage = ShardingAnalyzer({"data": 8}).estimate_memory_usage(
            ...     {"w": jnp.zeros((16, 4)), "b": jnp.zeros(4)}, {"w": P("data"), "b": P()})
            >>> usage["size_per_device"], usage["replicated_bytes"]
            (48, 16)
            >>> usage["leaves"]["w"]["bytes_per_device"]
            32
        """
        sizes = mesh_axis_sizes(self.mesh)
        flat = _Flat(tree, specs, sizes)
        tally = _tally(flat.values, flat.specs, shape_dtype, sizes, flat.path)
        return tally.usage(sizes, key_paths_later(tree, flat.treedef, keep_none=True))


_REPLICATED = PartitionSpec()


def usage_of(pairs: Sequence[tuple[Leaf, Any]], sizes: Mapping[str, int]) -> dict[str, Any]:
    """``estimate_memory_usage`` for already-paired ``(leaf, spec)``s (non-array leaves skipped)."""
    leaves = [lf for lf, _ in pairs]
    specs = [spec for _, spec in pairs]
    tally = _tally(leaves, specs, _leaf_shape_dtype, sizes, lambda i: leaves[i].path)
    keys = [lf.keys for lf, _ in pairs]
    return tally.usage(sizes, lambda: keys)


class _Tally:
    """Array leaves counted per distinct ``(shape, dtype, spec)`` record, one int per leaf."""

    __slots__ = ("records", "specs", "counts", "which", "positions")

    def __init__(self) -> None:
        self.records: list[tuple[tuple[int, ...], int, tuple[tuple[str, ...], ...]]] = []
        self.specs: list[PartitionSpec] = []
        self.counts: list[int] = []
        # Per array leaf, as machine ints (no Python object per leaf): its record, and its
        # position among all leaves (to find its key path).
        self.which = array.array("q")
        self.positions = array.array("q")

    def usage(
        self, sizes: Mapping[str, int], keys: Callable[[], list[tuple[Any, ...]]]
    ) -> dict[str, Any]:
        """``estimate_memory_usage``'s dict; ``keys()`` gives every leaf's key path (called only
        when the per-leaf table is read)."""
        total, busiest = unique_device_bytes(self.records, self.counts, sizes)
        nbytes = [packed_bytes(math.prod(shape), bits) for shape, bits, _ in self.records]
        replicated = [
            all(math.prod(sizes[a] for a in e) == 1 for e in entries)
            for _, _, entries in self.records
        ]
        counts = self.counts
        per_device = total.tolist()
        return {
            "total_size": sum(n * c for n, c in zip(nbytes, counts)),
            "size_per_device": max(per_device) if per_device else 0,
            "per_device": per_device,
            "replicated_bytes": sum(n * c for n, c, rep in zip(nbytes, counts, replicated) if rep),
            "num_devices": len(per_device),
            "leaves": LeafUsage(
                keys, self.positions, self.which, self.specs, nbytes, busiest.tolist()
            ),
        }


def _leaf_shape_dtype(leaf: Leaf) -> tuple[Any, Any]:
    return leaf.shape, leaf.dtype


def _tally(
    values: Sequence[Any],
    specs: Sequence[Any],
    read: Callable[[Any], tuple[Any, Any]],
    sizes: Mapping[str, int],
    path_of: Callable[[int], str],
) -> _Tally:
    """Count leaves by ``(shape, dtype, spec)``; ``read(value)`` gives ``(shape, dtype)``, with
    ``shape`` ``None`` for a non-array leaf (skipped).

    Each leaf adds two machine ints; specs are checked once per distinct ``(shape, spec)``.
    ``path_of(i)`` names leaf ``i`` in messages.

    Raises:
        ShardingError: listing every invalid spec with its leaf's path.
    """
    out = _Tally()
    index: dict[Any, int] = {}  # (shape, dtype, spec) -> record number
    checked: dict[Any, list[str]] = {}  # (shape, spec) -> problems
    records, counts, which, positions = out.records, out.counts, out.which, out.positions
    problems: list[str] = []
    for pos, (value, spec) in enumerate(zip(values, specs)):
        shape, dtype = read(value)
        if shape is None:
            continue
        if spec is None:
            spec = _REPLICATED
        try:
            r = index.get((shape, dtype, spec))
        except TypeError:  # an unhashable non-spec: spec_problems reports it
            r = None
        if r is None:
            try:
                found = checked[shape, spec]
            except KeyError:
                found = checked[shape, spec] = spec_problems(shape, spec, sizes, divisible=False)
            except TypeError:
                found = spec_problems(shape, spec, sizes, divisible=False)
            if found:
                path = path_of(pos)
                problems.extend(f"{path}: {p}" for p in found)
                continue
            r = index[shape, dtype, spec] = len(records)
            records.append((shape, dtype_bits(dtype), tuple(entry_axes(e) for e in spec)))
            out.specs.append(spec)
            counts.append(0)
        counts[r] += 1
        which.append(r)
        positions.append(pos)
    if problems:
        shown = "; ".join(problems[:10]) + (
            f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
        )
        raise ShardingError(
            f"Cannot estimate memory: {len(problems)} invalid spec(s): {shown}. Fix the specs "
            "(ShardingAnalyzer.validate_partition_specs lists every problem)."
        )
    return out


class LeafUsage(Mapping):
    """Per-leaf figures of ``estimate_memory_usage``: ``{key path: {"spec", "total_bytes",
    "bytes_per_device"}}``, read-only.

    Keys are the array leaves' key paths (tuples of ``DictKey``/``SequenceKey``/``GetAttrKey``, as
    ``jax.tree_util.tree_flatten_with_path`` gives them), in tree order, so no two leaves share
    one: ``{"a/b": x, "a": {"b": y}}`` has two entries. For convenience a rendered path
    (``"a/b/0"``, as in messages) is accepted as a key when exactly one leaf renders to it; when
    several do, the ``KeyError`` lists their key paths. Entries are built when read, which keeps
    large trees cheap.

    Example:
        >>> import jax.numpy as jnp
        >>> from jax.sharding import PartitionSpec as P
        >>> from namedaxes.analysis import ShardingAnalyzer
        >>> usage = ShardingAnalyzer({"data": 8}).estimate_memory_usage(
        ...     {"a/b": jnp.zeros(8), "a": {"b": jnp.zeros(16)}}, {"a/b": P(), "a": {"b": P("data")}})
        >>> [(jax.tree_util.keystr(k), v["bytes_per_device"]) for k, v in usage["leaves"].items()]
        [("['a']['b']", 8), ("['a/b']", 32)]
    """

    __slots__ = (
        "_all_keys",
        "_positions",
        "_keys",
        "_which",
        "_specs",
        "_nbytes",
        "_busiest",
        "_index",
        "_by_path",
    )

    def __init__(
        self,
        all_keys: Callable[[], list[tuple[Any, ...]]],
        positions: Sequence[int],
        which: Sequence[int],
        specs: list[PartitionSpec],
        nbytes: list[int],
        busiest: list[int],
    ) -> None:
        self._all_keys = all_keys  # every leaf's key path, computed when first needed
        self._positions = positions
        self._keys: list[tuple[Any, ...]] | None = None
        self._which = which
        self._specs = specs
        self._nbytes = nbytes
        self._busiest = busiest
        self._index: dict[tuple[Any, ...], int] | None = None
        self._by_path: dict[str, list[int]] | None = None

    @property
    def _key_list(self) -> list[tuple[Any, ...]]:
        if self._keys is None:
            every = self._all_keys()
            self._keys = [every[i] for i in self._positions]
        return self._keys

    def _position(self, key: Any) -> int:
        keys = self._key_list
        if isinstance(key, str):
            if self._by_path is None:
                self._by_path = {}
                for i, k in enumerate(keys):
                    self._by_path.setdefault(format_path(k), []).append(i)
            found = self._by_path.get(key, [])
            if len(found) == 1:
                return found[0]
            if found:
                shown = ", ".join(jax.tree_util.keystr(keys[i]) for i in found)
                raise KeyError(
                    f"Path {key!r} names {len(found)} leaves ({shown}); index by key path, e.g. "
                    f"usage['leaves'][{keys[found[0]]!r}]."
                )
            raise KeyError(key)
        if self._index is None:
            self._index = {k: i for i, k in enumerate(keys)}
        try:
            return self._index[key]
        except (KeyError, TypeError):
            raise KeyError(key) from None

    def __getitem__(self, key: Any) -> dict[str, Any]:
        r = self._which[self._position(key)]
        return {
            "spec": self._specs[r],
            "total_bytes": self._nbytes[r],
            "bytes_per_device": self._busiest[r],
        }

    def __contains__(self, key: Any) -> bool:
        try:
            self._position(key)
        except KeyError:
            return False
        return True

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self._key_list)

    def __len__(self) -> int:
        return len(self._which)

    def __repr__(self) -> str:
        return f"LeafUsage({dict(self.items())!r})"
