"""memory_report, compiled_memory and create_monitored_function: per-device figures for users."""

from __future__ import annotations

import dataclasses
import functools
import heapq
import math
import re
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import PartitionSpec

from .._errors import (
    DeviceOutOfMemoryError,
    MemoryAnalysisUnavailableError,
    NamedTypeError,
    ShardingError,
    ShardingWarning,
    SpecMismatchError,
    format_axes,
    format_mesh,
)
from .._logical._context import rules_in_force
from .._mesh import MeshLike, mesh_axis_sizes
from .._partitioning._plan import describe_unmatched, plan_tree
from ..rules._base import (
    Leaf,
    dtype_bits,
    entry_axes,
    flatten_leaves,
    format_bytes,
    packed_bytes,
    planned_spec,
    rule_mesh,
)
from ._memory import ShardingAnalyzer, usage_of


class SpecValidationWarning(ShardingWarning):
    """A monitored function's first argument does not fit its partition specs."""


# -- memory_report ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MemoryReport:
    """Per-device memory of a tree under a logical-axis mapping (see :func:`memory_report`).

    Attributes:
        mesh: ``{mesh_axis: size}``.
        total_bytes: Bytes of the whole, unsharded tree.
        bytes_per_device: Bytes on the busiest device.
        per_device: Bytes per device, in ``mesh.devices.flat`` order.
        replicated_bytes: Bytes of leaves that no mesh axis splits (held in full by every device).
        replicated_leaves: Paths of those leaves.
        axes: Per logical axis: the mesh axes it was given (``mesh_axes``), the number of leaves
            that have it (``leaves``), and ``saved_bytes``: how many bytes per device its sharding
            saves, summed over leaves (0 for an axis that stays replicated everywhere).
        largest: The largest leaves, each with ``path``, ``axes``, ``spec``, ``total_bytes`` and
            ``bytes_per_device``.
        unmatched: The ``(logical_name, mesh_axes)`` entries of the mapping that match no axis of
            the tree (they place nothing: a typo, or a name the model does not use).
    """

    mesh: dict[str, int]
    total_bytes: int
    bytes_per_device: int
    per_device: list[int]
    replicated_bytes: int
    replicated_leaves: list[str]
    axes: dict[str, dict[str, Any]]
    largest: list[dict[str, Any]]
    unmatched: tuple[tuple[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """A plain-dict copy (specs rendered as strings), e.g. for JSON logging."""
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        mesh = format_mesh(self.mesh)
        lines = [
            f"Memory report on {mesh}",
            f"  total (unsharded)   {self.total_bytes:>16,d} B  {format_bytes(self.total_bytes)}",
            f"  busiest device      {self.bytes_per_device:>16,d} B  {format_bytes(self.bytes_per_device)}",
            f"  replicated          {self.replicated_bytes:>16,d} B  "
            f"{format_bytes(self.replicated_bytes)} in {len(self.replicated_leaves)} leaves",
            "",
            f"  {'logical axis':<20} {'mesh axes':<24} {'leaves':>7} {'saved per device':>20}",
        ]
        for name, info in self.axes.items():
            mesh_axes = ", ".join(info["mesh_axes"]) or "-"
            lines.append(
                f"  {name:<20} {mesh_axes:<24} {info['leaves']:>7} {info['saved_bytes']:>18,d} B"
            )
        lines += ["", f"  {'largest leaves':<32} {'spec':<28} {'total':>12} {'per device':>12}"]
        for leaf in self.largest:
            lines.append(
                f"  {leaf['path']:<32} {leaf['spec']:<28} {format_bytes(leaf['total_bytes']):>12} "
                f"{format_bytes(leaf['bytes_per_device']):>12}"
            )
        if self.replicated_leaves:
            shown = ", ".join(self.replicated_leaves[:8])
            more = (
                f" (+{len(self.replicated_leaves) - 8} more)"
                if len(self.replicated_leaves) > 8
                else ""
            )
            lines += ["", f"  replicated leaves: {shown}{more}"]
        if self.unmatched:
            lines += ["", f"  {describe_unmatched(self.unmatched, self.axes)}"]
        return "\n".join(lines)

    def __rich__(self) -> Any:
        """Rich tables (``rich.print(report)`` in a terminal); ``str()`` stays plain text."""
        return _renderable(self)


def _renderable(report: MemoryReport) -> Any:
    """A ``rich`` group of tables for a ``MemoryReport`` (its plain text if rich is missing)."""
    try:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text
    except ImportError:  # rich is optional
        return str(report)
    title = Text(f"Memory report on {format_mesh(report.mesh)}", style="bold")
    summary = Table(show_header=False, box=None)
    summary.add_column(style="bold")
    summary.add_column()
    summary.add_row("total (unsharded)", format_bytes(report.total_bytes))
    summary.add_row("busiest device", format_bytes(report.bytes_per_device))
    replicated = (
        f"{format_bytes(report.replicated_bytes)} in {len(report.replicated_leaves)} leaves"
    )
    summary.add_row("replicated", replicated)
    axes = Table("logical axis", "mesh axes", "leaves", "saved per device")
    for name, info in report.axes.items():
        mesh_axes = ", ".join(info["mesh_axes"]) or "-"
        axes.add_row(name, mesh_axes, str(info["leaves"]), format_bytes(info["saved_bytes"]))
    largest = Table("largest leaves", "axes", "spec", "total", "per device")
    for leaf in report.largest:
        total, per_device = (
            format_bytes(leaf["total_bytes"]),
            format_bytes(leaf["bytes_per_device"]),
        )
        largest.add_row(leaf["path"], leaf["axes"], leaf["spec"], total, per_device)
    return Group(title, summary, axes, largest)


def _busiest_bytes(shape: tuple[int, ...], bits: int, ks: list[int]) -> int:
    # Device 0 holds the full ceil(n / k) block on every dimension: the busiest shard.
    return packed_bytes(math.prod(-(-n // k) for n, k in zip(shape, ks)), bits)


def check_count(
    value: Any,
    caller: str,
    *,
    name: str = "top",
    what: str = "how many of the largest leaves to list",
    minimum: int = 0,
    error: type[Exception] = ShardingError,
) -> int:
    """``value`` (the argument ``name``) as given, checked to be an int >= ``minimum``: the one
    check of ``top`` for ``memory_report``, ``plan`` and ``plan_search``.

    Raises:
        NamedTypeError: if ``value`` is not an int (a bool is not one).
        error: if ``value < minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise NamedTypeError(
            f"{caller}: {name} must be an int ({what}), got {value!r} ({type(value).__name__}). "
            f"Pass e.g. {name}=10."
        )
    if value < minimum:
        fix = f"Pass {name}=0 to list none." if minimum == 0 else f"Pass {name}={minimum} or more."
        raise error(f"{caller}: {name} must be >= {minimum} ({what}), got {value}. {fix}")
    return value


def memory_report(
    tree: Any, mapping_or_rules: Any = None, mesh: MeshLike | None = None, *, top: int = 10
) -> MemoryReport:
    """Per-device memory of ``tree`` when its NamedArrays are sharded by a logical-axis mapping.

    Specs come from the tree's plan (as ``pspec_for`` and ``LogicalAxisRule`` give them): named
    leaves (NamedArrays, ``field(axis_names=...)`` arrays) through ``resolve``, placed plain arrays
    where they are, other plain arrays replicated. Works on
    abstract trees (``eqx.filter_eval_shape``) and abstract meshes, so a model far larger than this
    machine can be planned here.

    Args:
        tree: A pytree of NamedArrays (concrete or holding ``ShapeDtypeStruct``s) and arrays.
        mapping_or_rules: ``AxisRules``, ``{logical_name: mesh_axes}`` or a list of pairs;
            ``None`` uses the ``axis_mapping`` in force (an error if there is none).
        mesh: A ``Mesh``, ``AbstractMesh`` or ``{axis: size}`` dict (``None``: context mesh).
        top: How many of the largest leaves to list (an int >= 0).

    Returns:
        A :class:`MemoryReport`; ``print`` it for a table, ``.to_dict()`` for a dict.

    Raises:
        ShardingError: with no mapping given or in force, if the mapping names mesh axes the mesh
            lacks, an axis cannot be sharded under the ``"error"`` policy, or ``top < 0``.
        NamedTypeError: if ``top`` is not an int.

    Example:
        >>> import jax
        >>> from namedaxes import named
        >>> from namedaxes.analysis import memory_report
        >>> params = {"w": named(jax.ShapeDtypeStruct((1024, 512), "float32"), ("embed", "mlp"))}
        >>> report = memory_report(params, {"mlp": "model"}, {"data": 2, "model": 4})
        >>> report.bytes_per_device, report.axes["mlp"]["saved_bytes"]
        (524288, 1572864)
    """
    check_count(top, "memory_report")
    mesh = rule_mesh(mesh, caller="memory_report")
    sizes = mesh_axis_sizes(mesh)
    rules = rules_in_force(mapping_or_rules, "memory_report")
    planned = plan_tree(tree, rules, mesh, caller="memory_report")
    leaves, _ = flatten_leaves(tree)
    pairs = [(lf, planned_spec(planned, lf)) for lf in leaves if lf.is_array]
    usage = usage_of(pairs, sizes)
    axes: dict[str, dict[str, Any]] = {}
    replicated_leaves = []
    # Per (axes or shape, dtype, spec): [(axis name, mesh axes, bytes saved)], replicated?
    breakdown: dict[Any, tuple[list[tuple[str, tuple[str, ...], int]], bool]] = {}
    for leaf, spec in pairs:
        key = (leaf.axes or leaf.shape, leaf.dtype, spec)
        if key not in breakdown:
            breakdown[key] = _breakdown(leaf, spec, sizes)
        per_axis, is_replicated = breakdown[key]
        if is_replicated:
            replicated_leaves.append(leaf.path)
        for name, mesh_axes, saved in per_axis:
            slot = axes.setdefault(name, {"mesh_axes": [], "leaves": 0, "saved_bytes": 0})
            slot["leaves"] += 1
            slot["saved_bytes"] += saved
            for a in mesh_axes:
                if a not in slot["mesh_axes"]:
                    slot["mesh_axes"].append(a)
    info = usage["leaves"]  # keyed by key path: rendered paths may collide ("a/b" vs a -> b)
    top_pairs = heapq.nsmallest(top, pairs, key=lambda p: (-p[0].nbytes, p[0].path))
    largest = [
        {
            "path": leaf.path,
            "axes": format_axes(leaf.axes) if leaf.axes is not None else str(leaf.shape),
            "spec": str(spec),
            "total_bytes": info[leaf.keys]["total_bytes"],
            "bytes_per_device": info[leaf.keys]["bytes_per_device"],
        }
        for leaf, spec in top_pairs
    ]
    return MemoryReport(
        mesh=dict(sizes),
        total_bytes=usage["total_size"],
        bytes_per_device=usage["size_per_device"],
        per_device=usage["per_device"],
        replicated_bytes=usage["replicated_bytes"],
        replicated_leaves=replicated_leaves,
        axes=axes,
        largest=largest,
        unmatched=planned.unmatched,
    )


def _breakdown(
    leaf: Leaf, spec: PartitionSpec, sizes: Mapping[str, int]
) -> tuple[list[tuple[str, tuple[str, ...], int]], bool]:
    """Per named axis of ``leaf``: its mesh axes and the busiest-device bytes its sharding saves."""
    shape: tuple[int, ...] = leaf.shape  # type: ignore[assignment]
    bits = dtype_bits(leaf.dtype)
    entries = [entry_axes(e) for e in spec] + [()] * (len(shape) - len(spec))
    ks = [math.prod(sizes[a] for a in e) for e in entries]
    with_all = _busiest_bytes(shape, bits, ks)
    per_axis = []
    for d, axis in enumerate(leaf.axes or ()):
        if ks[d] > 1:
            unsharded = ks[:d] + [1] + ks[d + 1 :]
            per_axis.append(
                (axis.name, entries[d], _busiest_bytes(shape, bits, unsharded) - with_all)
            )
        else:
            per_axis.append((axis.name, (), 0))
    return per_axis, all(k == 1 for k in ks)


# -- compiled_memory -------------------------------------------------------------------------


def _abstract(x: Any) -> Any:
    """A ``ShapeDtypeStruct`` for array leaves; other leaves as they are.

    A committed array keeps its sharding. An uncommitted one (a plain ``jnp`` array, not yet
    placed) gets none, as ``jax.jit`` treats it: free to move to the function's devices, not
    pinned to the one device it happens to sit on.
    """
    if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
        sharding = x.sharding if x.committed else None
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding, weak_type=x.weak_type)
    if isinstance(x, np.ndarray):
        return jax.ShapeDtypeStruct(x.shape, x.dtype)
    return x


def compiled_memory(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, int]:
    """XLA's per-device memory figures for ``fn(*args, **kwargs)``, compiled but not run.

    ``fn`` is a ``named_jit``/``jax.jit`` function (anything with ``.lower``) or a plain function
    (jitted here with ``keep_unused=True``, so arguments the function ignores still count, as they
    would in a training step that receives them). Concrete array arguments are replaced by
    ``ShapeDtypeStruct``s with their shardings (none for an uncommitted array, which ``jax.jit``
    would move to the function's devices), so nothing is executed; pass ``ShapeDtypeStruct``s
    with ``sharding=`` to plan.

    Returns:
        ``{"argument_bytes", "output_bytes", "temp_bytes", "alias_bytes", "generated_code_bytes"}``
        from ``compiled.memory_analysis()``, and ``"total_bytes"`` = argument + output + temp -
        alias (XLA's usual peak estimate). All are per device.

    Raises:
        NamedTypeError: if ``fn`` is neither callable nor has ``.lower``.
        MemoryAnalysisUnavailableError: if the backend does not report memory figures.
        DeviceOutOfMemoryError: if XLA refuses to compile because the program does not fit in
            device memory (``RESOURCE_EXHAUSTED``); the error carries XLA's figures.

    Example:
        >>> import jax
        >>> from jax.sharding import PartitionSpec as P, NamedSharding
        >>> from namedaxes.analysis import compiled_memory
        >>> mesh = jax.make_mesh((8,), ("data",))
        >>> x = jax.ShapeDtypeStruct((1024,), "float32", sharding=NamedSharding(mesh, P("data")))
        >>> compiled_memory(jax.jit(lambda x: x * 2), x)["argument_bytes"]
        512
    """
    if not (callable(fn) or hasattr(fn, "lower")):
        raise NamedTypeError(
            f"compiled_memory needs the function first, got {fn!r} ({type(fn).__name__}). Call "
            "compiled_memory(fn, *args), with fn a jax.jit/named_jit function or a plain callable."
        )
    args, kwargs = jax.tree.map(_abstract, (args, kwargs))
    lower = getattr(fn, "lower", None)
    if lower is None:
        lower = jax.jit(fn, keep_unused=True).lower
    compiled = compile_checked(lambda: lower(*args, **kwargs).compile())
    return memory_figures(compiled)


_OOM_MARKERS = ("RESOURCE_EXHAUSTED", "out of memory")
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _xla_bytes(number: str, unit: str) -> int:
    # XLA prints sizes like "20.51G" (binary units).
    return int(float(number) * _UNITS[unit.upper()[:1]])


def out_of_memory_error(e: BaseException) -> DeviceOutOfMemoryError | None:
    """A typed error for XLA's out-of-memory failure ``e`` (``None`` if ``e`` is something else)."""
    text = str(e)
    if not any(m.lower() in text.lower() for m in _OOM_MARKERS):
        return None
    used = capacity = None
    m = re.search(r"Used\s+([\d.]+)\s*([KMGT]?)i?B?\s+of\s+([\d.]+)\s*([KMGT]?)i?B?", text)
    if m:
        used, capacity = _xla_bytes(m[1], m[2]), _xla_bytes(m[3], m[4])
    figures = (
        f"it needs {used:,d} B ({format_bytes(used)}) per device but the device has "
        f"{capacity:,d} B ({format_bytes(capacity)}), {used - capacity:,d} B over"
        if used is not None and capacity is not None
        else "XLA gave no figures"
    )
    first = text.strip().splitlines()[0] if text.strip() else type(e).__name__
    return DeviceOutOfMemoryError(
        f"XLA cannot fit the program in device memory: {figures}. XLA said: {first[:400]} "
        "Shard more of the state (namedaxes.analysis.plan_search suggests layouts), shrink the batch, or "
        "rematerialize activations (jax.checkpoint).",
        used_bytes=used,
        capacity_bytes=capacity,
        xla_message=text,
    )


def compile_checked(compile_fn: Callable[[], Any]) -> Any:
    """Run ``compile_fn`` (a lowering's ``.compile``), turning XLA's out-of-memory failure into
    ``DeviceOutOfMemoryError``; other errors pass through unchanged."""
    try:
        return compile_fn()
    except Exception as e:  # XLA reports OOM as a runtime error whose type varies by jaxlib
        typed = out_of_memory_error(e)
        if typed is None:
            raise
        raise typed from e


def memory_figures(compiled: Any) -> dict[str, int]:
    """``compiled_memory``'s figures for an already compiled program."""
    backend = jax.default_backend()
    try:
        stats = compiled.memory_analysis()
    except Exception as e:  # backends signal "unsupported" with various exception types
        raise MemoryAnalysisUnavailableError(
            f"XLA cannot report memory figures on the {backend!r} backend: memory_analysis() "
            f"raised {type(e).__name__}: {e}. Use ShardingAnalyzer.estimate_memory_usage for an "
            "analytic estimate instead."
        ) from e
    if stats is None:
        raise MemoryAnalysisUnavailableError(
            f"XLA cannot report memory figures on the {backend!r} backend: memory_analysis() "
            "returned None. Use ShardingAnalyzer.estimate_memory_usage for an analytic estimate "
            "instead."
        )
    out = {
        "argument_bytes": int(stats.argument_size_in_bytes),
        "output_bytes": int(stats.output_size_in_bytes),
        "temp_bytes": int(stats.temp_size_in_bytes),
        "alias_bytes": int(stats.alias_size_in_bytes),
        "generated_code_bytes": int(getattr(stats, "generated_code_size_in_bytes", 0)),
    }
    out["total_bytes"] = (
        out["argument_bytes"] + out["output_bytes"] + out["temp_bytes"] - out["alias_bytes"]
    )
    return out


# -- create_monitored_function ---------------------------------------------------------------


def _signature(tree: Any) -> Any:
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return treedef, tuple(
        (getattr(x, "shape", None), str(getattr(x, "dtype", type(x)))) for x in leaves
    )


def create_monitored_function(
    fn: Callable[..., Any], partition_specs: Any, analyzer: ShardingAnalyzer
) -> Callable[..., tuple[Any, dict[str, Any]]]:
    """Wrap ``fn`` to return ``(result, metrics)``, checking its first argument's layout.

    ``partition_specs`` describes ``fn``'s first argument (typically the parameters). Each call
    validates it against the specs and estimates its memory (both cached per argument structure
    and shapes), runs ``fn``, waits for the result and times it. Problems are reported with a
    ``SpecValidationWarning`` and the function still runs.

    Returns:
        A function returning ``(result, metrics)`` with ``execution_time`` (seconds, including
        waiting for the result), ``memory_usage`` (``estimate_memory_usage``'s dict, or ``None``
        when the specs cannot be applied) and ``validation_issues`` (a list of messages).

    Raises:
        NamedTypeError: if ``fn`` is not callable or ``analyzer`` is not a ``ShardingAnalyzer``.

    Example:
        >>> import jax.numpy as jnp
        >>> from jax.sharding import PartitionSpec as P
        >>> from namedaxes.analysis import ShardingAnalyzer, create_monitored_function
        >>> analyzer = ShardingAnalyzer({"data": 8})
        >>> step = create_monitored_function(lambda p: p["w"].sum(), {"w": P("data")}, analyzer)
        >>> result, metrics = step({"w": jnp.ones(16)})
        >>> float(result), metrics["validation_issues"]
        (16.0, [])
    """
    if not callable(fn):
        raise NamedTypeError(
            f"create_monitored_function needs the function first, got {fn!r} "
            f"({type(fn).__name__}). Call create_monitored_function(fn, partition_specs, analyzer)."
        )
    if not isinstance(analyzer, ShardingAnalyzer):
        raise NamedTypeError(
            f"create_monitored_function needs a ShardingAnalyzer as analyzer, got {analyzer!r} "
            f"({type(analyzer).__name__}). Pass e.g. ShardingAnalyzer(mesh)."
        )
    cache: dict[Any, tuple[list[str], dict[str, Any] | None]] = {}

    def check(first: Any) -> tuple[list[str], dict[str, Any] | None]:
        try:
            key = _signature(first)
            hash(key)
        except TypeError:
            key = None
        if key is not None and key in cache:
            return cache[key]
        try:
            issues = analyzer.validate_partition_specs(first, partition_specs)
        except SpecMismatchError as e:
            issues, memory = [str(e)], None
        else:
            try:
                memory = analyzer.estimate_memory_usage(first, partition_specs)
            except ValueError:  # already described by the issues
                memory = None
        if key is not None:
            cache[key] = (issues, memory)
        return issues, memory

    @functools.wraps(fn)
    def monitored(*args: Any, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        if not args:
            raise NamedTypeError(
                f"{getattr(fn, '__name__', 'fn')} was called without positional arguments, but "
                "its partition specs describe the first positional argument."
            )
        issues, memory = check(args[0])
        if issues:
            shown = "; ".join(issues[:5]) + (
                f" (and {len(issues) - 5} more)" if len(issues) > 5 else ""
            )
            warnings.warn(
                f"{getattr(fn, '__name__', 'fn')}: {len(issues)} partition spec issue(s): {shown}",
                SpecValidationWarning,
                stacklevel=2,
            )
        start = time.perf_counter()
        result = jax.block_until_ready(fn(*args, **kwargs))
        elapsed = time.perf_counter() - start
        return result, {
            "execution_time": elapsed,
            "memory_usage": memory,
            "validation_issues": list(issues),
        }

    return monitored
