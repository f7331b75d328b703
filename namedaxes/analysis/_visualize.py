"""Seeing placement: a table of where every leaf of a tree lives, and the device grid of one array.

Both read placement the way the rest of the library does: an array that already has a
``NamedSharding`` (inside ``jit``: in its type, on ``Explicit`` mesh axes) is shown where it is;
any other leaf is shown where the tree's plan would put it (``resolve`` for named leaves,
replicated for unnamed ones), so the same call works on concrete trees, abstract trees
(``eqx.filter_eval_shape``) and ``{axis: size}`` meshes.

Output is a ``rich`` table when rich is installed and the stream is a terminal, else plain text.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

import jax
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from .._array import NamedArray
from .._errors import AxisError, NamedTypeError, format_axes, format_mesh, format_names
from .._logical._context import current_rules, rules_in_force
from .._mesh import MeshLike, mesh_axis_sizes
from .._partitioning._plan import TreePlan, describe_unmatched, plan_tree, unmatched_entries
from ..rules._base import (
    Leaf,
    dtype_bits,
    entry_axes,
    flatten_leaves,
    format_bytes,
    packed_bytes,
    planned_spec,
    replicated,
    rule_mesh,
)

__all__ = ["visualize_array", "visualize_sharding"]


# -- where a leaf lives ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Placement:
    spec: PartitionSpec
    sizes: dict[str, int]  # {mesh axis: size}, in mesh order
    mesh: Any  # a concrete Mesh (device ids known), else None
    placed: bool  # True: read from the array's sharding; False: the engine's plan


def _array_of(value: Any) -> Any:
    return value.array if isinstance(value, NamedArray) else value


def _placed(array: Any) -> _Placement | None:
    """The placement an array (or a ``ShapeDtypeStruct`` with a sharding) already has.

    Inside ``jit`` a tracer has no ``.sharding``; its type carries the real spec on ``Explicit``
    mesh axes, so that is read. On a mesh with only ``Auto`` axes the type says nothing (the
    compiler decides), and the leaf is shown where the plan puts it.
    """
    if isinstance(array, jax.core.Tracer):
        sharding = getattr(jax.typeof(array), "sharding", None)
        if not isinstance(sharding, NamedSharding) or AxisType.Explicit not in getattr(
            sharding.mesh, "axis_types", ()
        ):
            return None
    else:
        sharding = getattr(array, "sharding", None)
    if isinstance(sharding, NamedSharding):
        mesh = sharding.mesh
        concrete = mesh if isinstance(mesh, jax.sharding.Mesh) else None
        return _Placement(sharding.spec, dict(mesh.shape), concrete, True)
    return None


class _Planner:
    """Places each leaf for the table: where it is when it has a ``NamedSharding``, else where the
    tree's plan puts it. The mapping, the mesh and the plan are looked up only when a leaf needs
    them (a tree of placed arrays needs none)."""

    def __init__(self, tree: Any, mapping: Any, mesh: MeshLike | None, caller: str):
        self._tree, self._mapping, self._mesh_arg, self._caller = tree, mapping, mesh, caller
        self._plan: TreePlan | None = None
        self._mesh: Any = None

    def mesh(self) -> Any:
        if self._mesh is None:
            self._mesh = rule_mesh(self._mesh_arg, caller=self._caller)
        return self._mesh

    def __call__(self, leaf: Leaf) -> _Placement:
        placed = _placed(_array_of(leaf.value))
        if placed is not None:
            return placed
        mesh = self.mesh()
        if leaf.axes is None:
            spec = replicated(len(leaf.shape or ()))
        else:
            if self._plan is None:
                rules = rules_in_force(self._mapping, self._caller)
                self._plan = plan_tree(self._tree, rules, mesh, caller=self._caller)
            spec = planned_spec(self._plan, leaf)
        concrete = mesh if isinstance(mesh, jax.sharding.Mesh) else None
        return _Placement(spec, mesh_axis_sizes(mesh), concrete, False)

    def unmatched(self, names: set[str]) -> str:
        """The line listing mapping entries that match none of ``names`` (empty when none, or
        when no mapping was given or is in force)."""
        if self._plan is not None:
            rules = self._plan.rules
        elif self._mapping is not None:
            rules = rules_in_force(self._mapping, self._caller)
        else:
            rules = current_rules()
        return "" if rules is None else describe_unmatched(unmatched_entries(rules, names), names)


def _factors(spec: PartitionSpec, rank: int) -> list[tuple[str, ...]]:
    """The mesh axes of each of ``rank`` dimensions (missing trailing entries: none)."""
    entries = [entry_axes(e) for e in spec] + [()] * (rank - len(spec))
    return entries[:rank]


def _replication(entries: list[tuple[str, ...]], sizes: Mapping[str, int]) -> str:
    used = {a for e in entries for a in e}
    idle = [a for a, n in sizes.items() if a not in used and n > 1]
    if not any(sizes[a] > 1 for e in entries for a in e):
        return "yes"
    return f"over {', '.join(idle)}" if idle else "no"


# -- visualize_sharding ------------------------------------------------------------------------

_COLUMNS = ("path", "axes", "dtype", "spec", "per device", "bytes/device", "replicated")


def _sharding_rows(
    tree: Any, mapping: Any, mesh: MeshLike | None
) -> tuple[list[tuple[str, ...]], int, set[str], str]:
    """The table's rows, the busiest device's total bytes, the meshes seen, and the line listing
    mapping entries that matched no axis (empty if none)."""
    leaves, _ = flatten_leaves(tree)
    planner = _Planner(tree, mapping, mesh, "visualize_sharding")
    rows: list[tuple[str, ...]] = []
    total = 0
    meshes: set[str] = set()
    names: set[str] = set()
    for leaf in leaves:
        if not leaf.is_array:
            continue
        names.update(a.name for a in leaf.axes or ())
        p = planner(leaf)
        shape: tuple[int, ...] = leaf.shape  # type: ignore[assignment]
        entries = _factors(p.spec, len(shape))
        local = tuple(-(-n // math.prod(p.sizes[a] for a in e)) for n, e in zip(shape, entries))
        nbytes = packed_bytes(math.prod(local), dtype_bits(leaf.dtype))
        total += nbytes
        meshes.add(format_mesh(p.sizes))
        axes = format_axes(leaf.axes) if leaf.axes is not None else str(shape)
        spec = str(p.spec) + ("" if p.placed else " (planned)")
        replicated = _replication(entries, p.sizes)
        row = (leaf.path, axes, str(leaf.dtype), spec, str(local), format_bytes(nbytes), replicated)
        rows.append(row)
    return rows, total, meshes, planner.unmatched(names)


def _use_rich(file: TextIO) -> bool:
    try:
        import rich  # noqa: F401
    except ImportError:  # rich is optional (the `viz` extra)
        return False
    isatty = getattr(file, "isatty", None)
    return bool(isatty and isatty())


def _print_rich(renderable: Any, file: TextIO) -> None:
    from rich.console import Console

    Console(file=file).print(renderable)


def visualize_sharding(
    tree: Any, mapping: Any = None, mesh: MeshLike | None = None, *, file: TextIO | None = None
) -> None:
    """Print a table of where every array leaf of ``tree`` lives: one row per leaf.

    Each row shows the leaf's path, its axes with sizes (its shape when it has no names), dtype,
    ``PartitionSpec``, per-device (block) shape and bytes, and whether it is replicated (``yes``:
    every device holds all of it; ``over model``: copies along those mesh axes; ``no``). A leaf
    whose array already has a ``NamedSharding`` is shown where it is (inside ``jit``, a traced
    leaf where its type says on ``Explicit`` mesh axes); any other leaf where the engine's plan
    (``pspec_for``) would put it, marked ``(planned)``. The last line totals the
    bytes of the busiest device.

    Args:
        tree: A pytree of NamedArrays and arrays, concrete or abstract (``ShapeDtypeStruct``).
        mapping: ``AxisRules``, ``{logical_name: mesh_axes}`` or a list of pairs for the leaves not
            yet placed; ``None`` uses the ``axis_mapping`` in force (needed only if such a leaf is
            named).
        mesh: A ``Mesh``, ``AbstractMesh`` or ``{axis: size}`` dict for leaves not yet placed
            (``None``: the context mesh).
        file: Where to print (default ``sys.stdout``). A rich table when rich is installed and
            ``file`` is a terminal, plain text otherwise.

    Raises:
        ShardingError: if a named leaf is not placed and no mapping is given or in force, or
            ``resolve`` refuses the mapping.
        MeshError: if a leaf is not placed and there is no mesh.

    Example:
        >>> import jax
        >>> import namedaxes as na
        >>> params = {"w": na.named(jax.ShapeDtypeStruct((64, 256), "float32"), ("embed", "mlp"))}
        >>> na.analysis.visualize_sharding(params, {"mlp": "model"}, {"data": 2, "model": 4})
        path  axes               dtype    spec                        per device  bytes/device  replicated
        w     embed=64, mlp=256  float32  P(None, 'model') (planned)  (64, 64)    16.00 KiB     over data
        busiest device: 16.00 KiB on Mesh(data=2, model=4)
    """
    file = sys.stdout if file is None else file
    rows, total, meshes, unmatched = _sharding_rows(tree, mapping, mesh)
    footer = f"busiest device: {format_bytes(total)} on {', '.join(sorted(meshes)) or 'no mesh'}"
    if unmatched:
        footer += "\n" + unmatched
    if _use_rich(file):
        from rich.table import Table

        table = Table(*_COLUMNS, caption=footer)
        for row in rows:
            table.add_row(*row, style="dim" if row[-1] == "yes" else "")
        _print_rich(table, file)
        return
    file.write(_plain_table(_COLUMNS, rows) + "\n" + footer + "\n")


def _plain_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows]]
    return "\n".join(lines)


# -- visualize_array ---------------------------------------------------------------------------


def _blocks(shape: tuple[int, ...], p: _Placement) -> list[tuple[str, tuple[tuple[int, int], ...]]]:
    """(device label, per-dimension [start, stop)) for every device of the mesh, by label.

    Labels are device ids on a concrete mesh and positions in mesh order on an abstract one. The
    blocks are JAX's layout (the first mesh axis of an entry is the major one; ``c = ceil(n/k)``
    per shard, the last shards shorter or empty when ``k`` does not divide ``n``), computed here
    rather than asked of ``devices_indices_map``, which refuses uneven shardings that JAX's own
    constrained intermediates (and a ``ShapeDtypeStruct`` carrying one) may have.
    """
    out: list[tuple[str, tuple[tuple[int, int], ...]]] = []
    entries = _factors(p.spec, len(shape))
    names = list(p.sizes)
    devices = list(p.mesh.devices.flat) if p.mesh is not None else None
    for flat in range(math.prod(p.sizes.values())):
        coord: dict[str, int] = {}
        rest = flat
        for a in reversed(names):
            coord[a], rest = rest % p.sizes[a], rest // p.sizes[a]
        bounds: list[tuple[int, int]] = []
        for n, entry in zip(shape, entries):
            k, i = 1, 0
            for a in entry:
                i, k = i * p.sizes[a] + coord[a], k * p.sizes[a]
            step = -(-n // k)
            bounds.append((min(i * step, n), min((i + 1) * step, n)))
        label = str(devices[flat].id) if devices is not None else str(flat)
        out.append((label, tuple(bounds)))
    return sorted(out, key=lambda b: int(b[0]))  # cells list their devices by id


def _grid_axes(x: NamedArray, axes: Any) -> list[int]:
    names = x.axis_names
    if axes is None:
        if len(names) > 2:
            raise AxisError(
                f"visualize_array draws 1 or 2 axes; NamedArray({format_axes(x.axes)}) has "
                f"{len(names)}. "
                f"Choose them, e.g. axes=({names[0]!r}, {names[1]!r})."
            )
        return list(range(len(names)))
    chosen = (axes,) if isinstance(axes, str) else tuple(axes)
    if not 1 <= len(chosen) <= 2 or len(set(chosen)) != len(chosen):
        raise AxisError(f"visualize_array: axes must be 1 or 2 distinct axis names, got {axes!r}.")
    for a in chosen:
        if a not in names:
            raise AxisError(
                f"visualize_array: axis {a!r} not found in NamedArray({format_axes(x.axes)}). "
                f"Available axes: {format_names(names)}."
            )
    return [names.index(a) for a in chosen]


def visualize_array(
    x: NamedArray,
    mapping: Any = None,
    mesh: MeshLike | None = None,
    *,
    axes: str | Sequence[str] | None = None,
    file: TextIO | None = None,
) -> None:
    """Draw the device grid of one NamedArray, with its axis names on the grid's sides.

    The named counterpart of ``jax.debug.visualize_array_sharding``: rows are blocks of the first
    drawn axis, columns blocks of the second (one row for a 1-axis drawing, one cell holding every
    device for a 0-d array); each cell lists the devices holding that block (device ids on a
    concrete mesh, positions in mesh order on an abstract one). A placed array is drawn where it
    is (inside ``jit``, where its type says on ``Explicit`` mesh axes); an unplaced or abstract
    one, or a traced one on ``Auto`` axes, where the engine's plan would put it.

    Args:
        x: A NamedArray (concrete, or holding a ``ShapeDtypeStruct``).
        mapping: Rules for an ``x`` not yet placed (``None``: the ``axis_mapping`` in force).
        mesh: Mesh for an ``x`` not yet placed (``None``: the context mesh).
        axes: The 1 or 2 axis names to draw (rows, then columns). Required when ``x`` has more
            than 2 axes; the blocks of the other axes then share a cell.
        file: Where to print (default ``sys.stdout``); rich when rich is installed and ``file``
            is a terminal, plain text otherwise.

    Raises:
        NamedTypeError: if ``x`` is not a NamedArray.
        AxisError: if ``axes`` is missing for more than 2 axes, or names an axis ``x`` lacks.
        ShardingError: if ``x`` is not placed and no mapping is given or in force.

    Example:
        >>> import jax
        >>> import namedaxes as na
        >>> x = na.named(jax.ShapeDtypeStruct((8, 16), "float32"), ("batch", "mlp"))
        >>> na.analysis.visualize_array(x, {"batch": "data", "mlp": "model"}, {"data": 2, "model": 2})
        NamedArray(float32, batch=8, mlp=16)  P('data', 'model') (planned) on Mesh(data=2, model=2)
        batch \\ mlp | 0:8 | 8:16
        ------------+-----+-----
        0:4         | 0   | 1
        4:8         | 2   | 3
    """
    if not isinstance(x, NamedArray):
        raise NamedTypeError(
            f"visualize_array takes a NamedArray, got {type(x).__name__}. "
            "Wrap it first: na.named(array, ('batch', 'embed')), or use "
            "jax.debug.visualize_array_sharding."
        )
    file = sys.stdout if file is None else file
    dims = _grid_axes(x, axes)
    leaf = flatten_leaves(x)[0][0]
    p = _Planner(x, mapping, mesh, "visualize_array")(leaf)
    shape = tuple(a.size for a in x.axes)
    cells: dict[tuple[tuple[int, int], ...], list[str]] = {}
    for label, bounds in _blocks(shape, p):
        key = tuple(bounds[d] for d in dims)
        if label not in cells.setdefault(key, []):
            cells[key].append(label)
    names = [x.axis_names[d] for d in dims]

    def span(b: tuple[int, int]) -> str:
        return f"{b[0]}:{b[1]}"

    if len(dims) == 2:  # rows: blocks of the first axis; columns: blocks of the second
        rows, cols = sorted({k[0] for k in cells}), sorted({k[1] for k in cells})
        header = [f"{names[0]} \\ {names[1]}"] + [span(c) for c in cols]
        body = [[span(r)] + [",".join(cells.get((r, c), [])) for c in cols] for r in rows]
    elif dims:  # one row, as jax draws a 1-D array
        cols = sorted(k[0] for k in cells)
        header = [names[0]] + [span(c) for c in cols]
        body = [["devices"] + [",".join(cells[(c,)]) for c in cols]]
    else:  # a 0-d array: one block, which every device holds
        header = ["(no axes)", "value"]
        body = [["devices", ",".join(cells[()])]]
    planned = "" if p.placed else " (planned)"
    described = ", ".join([str(x.dtype), format_axes(x.axes)] if x.axes else [str(x.dtype)])
    title = f"NamedArray({described})  {p.spec}{planned} on {format_mesh(p.sizes)}"
    if _use_rich(file):
        from rich.table import Table

        table = Table(*header, title=title, show_lines=True)
        for line in body:
            table.add_row(*line)
        _print_rich(table, file)
        return
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]

    def fmt(line: Sequence[str]) -> str:
        return " | ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip()

    rule = "-+-".join("-" * w for w in widths)
    file.write("\n".join([title, fmt(header), rule, *[fmt(line) for line in body]]) + "\n")
