"""``plan``: what a tree costs per device under a mapping, what XLA says about a step, and a verdict.

Specs come from the tree's plan (NamedArrays by their axes, ``field(axis_names=...)`` arrays by
their declared names, through ``resolve``; other arrays keep the sharding they carry, else are
replicated); bytes from ``ShardingAnalyzer``'s exact per-device count; compiled figures from XLA
(``_compile_target``). Nothing is placed or run, so a 70B-parameter model built with
``eqx.filter_eval_shape`` plans on a laptop.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

import numpy as np
from jax.sharding import AbstractMesh, Mesh, PartitionSpec

from .._axis import Axis
from .._errors import PlanError, ShardingError, did_you_mean, format_names, format_path
from .._logical._context import current_axis_mapping
from .._logical._rules import AxisRules
from .._mesh import mesh_axis_sizes
from .._partitioning._plan import plan_tree, unmatched_entries
from .._spec import entry_axes
from ..rules._base import dtype_bits, flatten_leaves, packed_bytes, planned_spec
from ._compile_target import CompileTarget, compile_step, parse_target
from ._memory import per_device_bytes
from ._pipeline_plan import pipelines
from ._plan_format import plain_text, rich_renderable, rules_to_json
from ._report import check_count

__all__ = ["Plan", "parse_bytes", "plan"]

_UNIT = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_bytes(value: Any, *, what: str = "budget") -> int:
    """A byte count from ``16 * 2**30``, ``"16GiB"``, ``"512MB"`` or ``"1.5 GiB"``.

    Decimal units (kB, MB, GB, TB) are powers of 1000, binary ones (KiB, MiB, GiB, TiB) of 1024;
    case does not matter. Fractions of a byte are rounded down.

    Raises:
        PlanError: for negative, non-finite or unreadable values, naming the accepted forms.

    Example:
        >>> parse_bytes("16GiB"), parse_bytes("512MB"), parse_bytes(1024)
        (17179869184, 512000000, 1024)
    """
    forms = "Give bytes as an int or a string such as '16GiB' or '512MB'."
    if isinstance(value, bool):
        raise PlanError(f"{what} must be a number of bytes, got {value!r}. {forms}")
    if isinstance(value, (int, np.integer)):
        amount = Decimal(int(value))
    elif isinstance(value, (float, np.floating)):
        if not math.isfinite(value):
            raise PlanError(f"{what} must be a finite number of bytes, got {value!r}. {forms}")
        amount = Decimal(float(value))
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value)
        unit = m[2].lower() if m else None
        if m is None or unit not in _UNIT:
            raise PlanError(
                f"Cannot read {what} {value!r}: expected a number and a unit (B, kB, MB, GB, TB, "
                f"KiB, MiB, GiB, TiB). {forms}"
            )
        try:
            amount = Decimal(m[1]) * _UNIT[unit]
        except InvalidOperation as e:  # pragma: no cover - the pattern admits only numbers
            raise PlanError(f"Cannot read {what} {value!r}. {forms}") from e
    else:
        raise PlanError(
            f"{what} must be a number of bytes, got {value!r} ({type(value).__name__}). {forms}"
        )
    if amount < 0:
        raise PlanError(f"{what} must be >= 0 bytes, got {value!r}. {forms}")
    return int(amount)


# -- the leaves --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Leaf:
    path: str
    top: str
    shape: tuple[int, ...]
    dtype: np.dtype
    axes: tuple[Axis, ...] | None
    spec: PartitionSpec


def collect_leaves(tree: Any, rules: AxisRules | Any, sizes: Mapping[str, int]) -> list[_Leaf]:
    """Each array leaf of ``tree`` with its path, axes and the spec the tree's plan gives it.

    The leaves and their axes come from the engine's one tree walk (NamedArrays and
    ``field(axis_names=...)`` arrays are named, as ``shard``/``pspec_for`` see them); a plain array
    keeps the spec it is placed with on this mesh's axes, else is replicated (``P()``).
    """
    planned = plan_tree(tree, rules, dict(sizes), caller="plan")
    flat, _ = flatten_leaves(tree)
    leaves = []
    for lf in flat:
        if not lf.is_array:
            continue
        if lf.axes is not None:
            spec = planned_spec(planned, lf)
        else:
            spec = (planned.spec(lf.index) if lf.index is not None else None) or PartitionSpec()
        top = format_path(lf.keys[:1]) if lf.keys else "<root>"
        leaves.append(_Leaf(lf.path, top, lf.shape, lf.dtype, lf.axes, spec))  # type: ignore[arg-type]
    return leaves


def _entries(spec: PartitionSpec, rank: int) -> tuple[tuple[str, ...], ...]:
    out = []
    for e in list(spec) + [None] * (rank - len(spec)):
        out.append(entry_axes(e))
    return tuple(out)


def _busiest(shape: tuple[int, ...], bits: int, ks: list[int]) -> int:
    return packed_bytes(math.prod(-(-n // k) for n, k in zip(shape, ks)), bits)


# -- the plan ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a tree costs per device under a mapping on a mesh (see :func:`plan`).

    Attributes:
        mesh: ``{mesh_axis: size}``.
        target: The compile target string when one was given (``"cpu:data=4,model=2"``), else None.
        rules: The ``AxisRules`` planned with.
        param_count: Elements of the parameters (the ``params`` subtree when the tree has one).
        total_bytes: Bytes of the whole tree, unsharded.
        state_bytes_per_device: Bytes of the tree on the busiest device, exact (XLA's padded blocks).
        subtotals: ``{top-level subtree: bytes}`` on that busiest device (they sum to the above).
        axes: Per logical axis: ``mesh_axes`` it got, ``leaves`` having it, and ``saved_bytes`` per
            device its sharding saves.
        largest: The largest distinct leaves (same shape, dtype, axes and spec counted once, with
            ``count``): ``path`` (the first), ``shape``, ``dtype``, ``axes``, ``spec``,
            ``bytes_per_device`` (one leaf), ``count``.
        replicated: ``{"bytes_per_device", "leaves", "paths"}`` of leaves no mesh axis splits.
        compiled: ``None``, or XLA's per-device ``argument_bytes``, ``output_bytes``,
            ``temp_bytes``, ``alias_bytes`` and ``total_bytes`` for the step.
        cost: ``None``, or XLA's ``flops`` and ``bytes_accessed`` for the step.
        collectives: ``None``, or ``[{"kind", "count", "bytes"}]`` in the compiled step.
        budget_bytes: The budget given, else None.
        fits: Whether the step (compiled total) or, without a step, the state fits the budget;
            ``None`` without a budget.
        headroom_bytes: Budget minus what is needed (negative: over by that much); None without one.
        dominant: The largest part of per-device memory (a subtree of the state, or the step's
            state/temporaries/outputs when compiled).
        notes: Remarks, e.g. why ``plan_search`` ranked this plan where it did.
        unmatched: The ``(logical_name, mesh_axes)`` entries of ``rules`` that match no axis of
            the tree, nor, with a step, of its arguments (they place nothing: a typo, or a name
            the model does not use).
        pipeline: One dict per stack (``nn.Stacked``) whose layer axis the rules split into
            pipeline stages: ``layer_axis``, ``mesh_axes``, ``stages``, ``layers_per_stage``,
            ``microbatches``, ``schedule``, ``repeats`` and ``bubble`` (the idle fraction,
            :func:`bubble_fraction`). With a step, the compiled ``collectives`` hold the
            point-to-point bytes (``collective-permute``).
        step_axes: With a step, the axis names of its arguments (sorted): matched as the tree's
            are, and, with ``axes``' names, what the report of ``unmatched`` suggests from.
    """

    mesh: dict[str, int]
    target: str | None
    rules: AxisRules | None
    param_count: int
    total_bytes: int
    state_bytes_per_device: int
    subtotals: dict[str, int]
    axes: dict[str, dict[str, Any]]
    largest: list[dict[str, Any]]
    replicated: dict[str, Any]
    compiled: dict[str, int] | None = None
    cost: dict[str, float] | None = None
    collectives: list[dict[str, Any]] | None = None
    budget_bytes: int | None = None
    fits: bool | None = None
    headroom_bytes: int | None = None
    dominant: str | None = None
    notes: tuple[str, ...] = ()
    unmatched: tuple[tuple[str, Any], ...] = ()
    pipeline: tuple[dict[str, Any], ...] = ()
    step_axes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (rules as ``[[logical_name, mesh_axes], ...]``)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["rules"] = None if self.rules is None else rules_to_json(self.rules)
        out["notes"] = list(self.notes)
        out["pipeline"] = [dict(x) for x in self.pipeline]
        return _jsonable(out)

    def with_(self, **changes: Any) -> Plan:
        """A copy with some fields replaced."""
        return dataclasses.replace(self, **changes)

    def __str__(self) -> str:
        return plain_text(self)

    def __rich__(self) -> Any:
        return rich_renderable(self)


def _jsonable(x: Any) -> Any:
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return str(x)


def mesh_sizes_and_target(mesh: Any) -> tuple[dict[str, int], Any]:
    """``({axis: size}, what to compile on)`` for a ``Mesh``, ``AbstractMesh``, dict or target."""
    if isinstance(mesh, str):
        target = parse_target(mesh)
        return dict(target.sizes), target
    if isinstance(mesh, CompileTarget):
        return dict(mesh.sizes), mesh
    if isinstance(mesh, (Mesh, AbstractMesh, Mapping)):
        return mesh_axis_sizes(mesh), mesh
    raise PlanError(
        f"mesh must be a Mesh, AbstractMesh, {{axis: size}} dict or a compile target such as "
        f"'cpu:data=4,model=2', got {mesh!r} ({type(mesh).__name__})."
    )


def _rules_arg(rules: Any) -> AxisRules:
    if rules is None:
        rules = current_axis_mapping()
        if rules is None:
            raise ShardingError(
                "plan() got no rules and no axis_mapping is in force. Pass them, e.g. "
                "plan(tree, mesh, {'embed': 'data', 'mlp': 'model'}), or call it inside "
                "`with axis_mapping({...}):`."
            )
    return rules if isinstance(rules, AxisRules) else AxisRules(rules)


def check_params(params: Any, leaves: list[_Leaf], caller: str = "plan") -> None:
    """Fail unless ``params`` (when given) names a top-level subtree holding arrays: a typo would
    otherwise count 0 parameters."""
    if params is None:
        return
    tops = list(dict.fromkeys(lf.top for lf in leaves))
    if params not in tops:
        hint = did_you_mean(params, tops) if isinstance(params, str) else ""
        raise PlanError(
            f"{caller}: params={params!r} names no top-level subtree of the tree holding arrays"
            f"{hint}. Top-level subtrees: {format_names(tops)}. Pass one of them, or params=None "
            "to count the 'params' subtree when there is one, else the whole tree."
        )


def state_plan(
    tree: Any,
    sizes: Mapping[str, int],
    rules: AxisRules,
    *,
    params: str | None = None,
    top: int = 10,
    caller: str = "plan",
) -> Plan:
    """The analytic part of :func:`plan` (no compiling, no budget)."""
    check_count(top, caller, error=PlanError)
    leaves = collect_leaves(tree, rules, sizes)
    check_params(params, leaves, caller)
    records = [(lf.shape, dtype_bits(lf.dtype), _entries(lf.spec, len(lf.shape))) for lf in leaves]
    n_dev = math.prod(sizes.values())
    by_top: dict[str, list[int]] = {}
    for i, lf in enumerate(leaves):
        by_top.setdefault(lf.top, []).append(i)
    per_device = np.zeros(n_dev, dtype=np.int64)
    sub_arrays = {}
    busiest = np.zeros(len(leaves), dtype=np.int64)
    for name, idxs in by_top.items():
        total, peak = per_device_bytes([records[i] for i in idxs], sizes)
        sub_arrays[name] = total
        per_device += total
        busiest[idxs] = peak
    hot = int(np.argmax(per_device)) if n_dev else 0
    subtotals = {name: int(arr[hot]) for name, arr in sub_arrays.items()}

    axes: dict[str, dict[str, Any]] = {}
    groups: dict[Any, dict[str, Any]] = {}
    rep_paths, rep_bytes = [], 0
    for lf, rec, peak in zip(leaves, records, busiest.tolist()):
        ks = [math.prod(sizes[a] for a in e) for e in rec[2]]
        if all(k == 1 for k in ks):
            rep_paths.append(lf.path)
            rep_bytes += peak
        for d, axis in enumerate(lf.axes or ()):
            slot = axes.setdefault(axis.name, {"mesh_axes": [], "leaves": 0, "saved_bytes": 0})
            slot["leaves"] += 1
            if ks[d] > 1:
                unsharded = ks[:d] + [1] + ks[d + 1 :]
                slot["saved_bytes"] += _busiest(lf.shape, dtype_bits(lf.dtype), unsharded) - peak
                slot["mesh_axes"] += [a for a in rec[2][d] if a not in slot["mesh_axes"]]
        names = tuple(a.name for a in lf.axes) if lf.axes else None
        key = (lf.shape, lf.dtype.str, names, lf.spec)
        g = groups.get(key)
        if g is None:
            groups[key] = {
                "path": lf.path,
                "shape": list(lf.shape),
                "dtype": str(lf.dtype),
                "axes": list(names) if names else None,
                "spec": str(lf.spec),
                "bytes_per_device": peak,
                "count": 1,
            }
        else:
            g["count"] += 1
    largest = sorted(
        groups.values(), key=lambda g: (-g["bytes_per_device"], -g["count"], g["path"])
    )
    if params is None and "params" in by_top:
        params = "params"
    counted = by_top[params] if params is not None else range(len(leaves))
    return Plan(
        mesh=dict(sizes),
        target=None,
        rules=rules,
        param_count=sum(math.prod(leaves[i].shape) for i in counted),
        total_bytes=sum(packed_bytes(math.prod(lf.shape), dtype_bits(lf.dtype)) for lf in leaves),
        state_bytes_per_device=int(per_device[hot]) if n_dev else 0,
        subtotals=subtotals,
        axes=axes,
        largest=largest[:top],
        replicated={"bytes_per_device": rep_bytes, "leaves": len(rep_paths), "paths": rep_paths},
        unmatched=unmatched_entries(rules, axes),
        pipeline=pipelines(tree, axes, sizes, rules),
    )


def verdict(p: Plan, budget: int | None) -> Plan:
    """Fill ``fits``, ``headroom_bytes`` and ``dominant`` of ``p`` for ``budget``."""
    if p.compiled is not None:
        c = p.compiled
        parts = {
            "state (arguments)": c["argument_bytes"],
            "temporaries": c["temp_bytes"],
            "outputs (not aliased)": max(c["output_bytes"] - c["alias_bytes"], 0),
        }
        used = c["total_bytes"]
    else:
        parts = {f"state: {k}": v for k, v in p.subtotals.items()}
        used = p.state_bytes_per_device
    dominant = max(parts, key=lambda k: parts[k]) if parts else None
    if budget is None:
        return p.with_(dominant=dominant)
    return p.with_(
        budget_bytes=budget, fits=used <= budget, headroom_bytes=budget - used, dominant=dominant
    )


def plan(
    tree: Any,
    mesh: Any,
    rules: Any = None,
    *,
    step: Any = None,
    args: tuple[Any, ...] = (),
    budget: int | str | None = None,
    params: str | None = None,
    top: int = 10,
    timeout: float = 900.0,
) -> Plan:
    """Plan ``tree`` on ``mesh`` under ``rules``: exact state bytes per device, and, with a step,
    XLA's compiled memory, cost and collectives; with a budget, a verdict.

    The state count uses XLA's block layout (a device holds ``ceil(n / k)`` of a split dimension)
    and equals XLA's ``argument_size_in_bytes`` for a step that takes just the tree (checked on simulated CPU
    devices; on TPU, arrays are padded to tiles, so XLA reports more: compile for the slice).

    Args:
        tree: The stored state: a pytree of NamedArrays, ``field(axis_names=...)`` modules and
            arrays, concrete or abstract (``jax.eval_shape`` / ``eqx.filter_eval_shape``).
        mesh: A ``Mesh``, ``AbstractMesh``, ``{axis: size}`` dict, or a compile target:
            ``"cpu:data=32,model=8"`` (compiles on that many simulated CPU devices in a
            subprocess) or ``"tpu-v5e-256:data=32,model=8"`` (compiles for the TPU slice; needs
            ``pip install 'namedaxes[tpu]'``). A dict or ``AbstractMesh`` compiles on local
            devices when there are enough.
        rules: ``AxisRules`` or ``{logical_name: mesh_axes}``; ``None`` uses the context mapping.
        step: The function to compile (``jax.jit``/``named_jit``-wrapped or plain, jitted with
            ``keep_unused=True``), or ``"module:function"``. For a target string it must be
            importable in a fresh process (a module-level function or that string).
        args: The step's example arguments as a tuple (``step(*args)``), laid out by ``rules``;
            default ``(tree,)``. Only with ``step``.
        budget: Bytes per device (int, or ``"16GiB"``, ``"512MB"``).
        params: The top-level subtree holding the parameters, for ``param_count``; default
            ``"params"`` when the tree has it, else the whole tree.
        top: How many distinct leaves to list in ``largest`` (an int >= 0).
        timeout: Seconds allowed for a compiling subprocess.

    Returns:
        A :class:`Plan`; ``print`` it for a table, ``.to_dict()`` for JSON.

    Raises:
        ShardingError: without rules, or when ``resolve`` cannot place an axis.
        PlanError: for an unreadable budget or step, ``args`` that is not a tuple or comes
            without a step, ``top < 0``, or ``params`` naming no top-level subtree of the tree.
        NamedTypeError: if ``top`` is not an int.
        CompileTargetError: for a bad target, a missing ``libtpu``, or a failed subprocess.
        DeviceOutOfMemoryError: when XLA refuses the step for lack of device memory.

    Example:
        >>> import jax
        >>> from namedaxes import named
        >>> from namedaxes.analysis import plan
        >>> w = named(jax.ShapeDtypeStruct((1024, 512), "float32"), ("embed", "mlp"))
        >>> p = plan({"params": {"w": w}}, {"data": 2, "model": 4}, {"mlp": "model"}, budget="1MiB")
        >>> p.param_count, p.state_bytes_per_device, p.fits, p.headroom_bytes
        (524288, 524288, True, 524288)
    """
    step_args = step_arguments(tree, step, args, caller="plan")
    sizes, where = mesh_sizes_and_target(mesh)
    budget_bytes = None if budget is None else parse_bytes(budget)
    rules_n = _rules_arg(rules)
    p = state_plan(tree, sizes, rules_n, params=params, top=top)
    if isinstance(where, CompileTarget):
        p = p.with_(target=where.text)
    if step is not None:
        result = compile_step(step, step_args, rules_n, where, timeout=timeout)
        memory = {
            k: result["memory"][k]
            for k in ("argument_bytes", "output_bytes", "temp_bytes", "alias_bytes", "total_bytes")
        }
        p = p.with_(compiled=memory, cost=result["cost"], collectives=result["collectives"])
        p = with_step_axes(p, args, sizes)
    return verdict(p, budget_bytes)


def step_arguments(tree: Any, step: Any, args: Any, *, caller: str) -> tuple[Any, ...]:
    """The step's example arguments: ``args`` as given, or ``(tree,)`` when empty.

    ``args`` is read as ``step(*args)`` reads it, so anything but a tuple is refused rather than
    coerced (``tuple(a_dict)`` would compile the step on the dict's keys).

    Raises:
        PlanError: if ``args`` is not a tuple, or is given without a ``step`` to take it.
    """
    if args is None:
        args = ()
    if not isinstance(args, tuple):
        raise PlanError(
            f"{caller}: args must be a tuple of the step's arguments, e.g. args=(state, batch); "
            f"got {type(args).__name__}. For a step that takes one argument x, pass args=(x,)."
        )
    if args and step is None:
        raise PlanError(
            f"{caller}: args needs step=: args are the example arguments of the step to compile "
            "(step(*args)). Pass the step, e.g. step=train_step, or drop args."
        )
    return args if args else (tree,)


def with_step_axes(p: Plan, args: Any, sizes: Mapping[str, int]) -> Plan:
    """``p`` with the step's arguments' axes counted as matched (``position`` in a batch of token
    ids places the step's activations though no parameter has it)."""
    if p.rules is None or not p.unmatched or not args:
        return p
    names = {a.name for lf in collect_leaves(args, AxisRules(()), sizes) for a in lf.axes or ()}
    return p.with_(
        unmatched=unmatched_entries(p.rules, set(p.axes) | names), step_axes=tuple(sorted(names))
    )
