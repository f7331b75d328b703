"""How a ``Plan`` prints: a plain-text table, and a ``rich`` one when rich is installed; its rules
as JSON."""

from __future__ import annotations

from typing import Any

from .._errors import format_mesh
from .._logical._rules import AxisRules
from .._partitioning._plan import describe_unmatched
from ..rules._base import format_bytes

__all__ = [
    "describe_budget",
    "mesh_text",
    "pairs_text",
    "plain_text",
    "rich_renderable",
    "rules_to_json",
]

#: A ``namedaxes.analysis.Plan`` (this module sits below the module that defines it).
Plan = Any


def _rules_text(p: Plan) -> str:
    return "-" if p.rules is None else pairs_text(rules_to_json(p.rules))


def pairs_text(pairs: list[list[Any]]) -> str:
    """Rules as ``rules_to_json`` gives them, for a line of text: ``embed->data, mlp->model``."""
    return (
        ", ".join(f"{n}->{'/'.join(t) if isinstance(t, list) else t}" for n, t in pairs) or "(none)"
    )


def _replicated_line(p: Plan) -> str:
    """``replicated: a, b (+3 more)`` naming the replicated leaves (empty when none is)."""
    if not p.replicated["paths"]:
        return ""
    shown = ", ".join(p.replicated["paths"][:6])
    more = len(p.replicated["paths"]) - 6
    return f"replicated: {shown}" + (f" (+{more} more)" if more > 0 else "")


def _summary(p: Plan) -> list[tuple[str, str]]:
    rows = [
        ("mesh", mesh_text(p)),
        ("rules", _rules_text(p)),
        ("parameters", f"{p.param_count:,d}"),
        ("state, unsharded", f"{p.total_bytes:,d} B  {format_bytes(p.total_bytes)}"),
        (
            "state per device",
            f"{p.state_bytes_per_device:,d} B  {format_bytes(p.state_bytes_per_device)}",
        ),
        (
            "replicated",
            f"{format_bytes(p.replicated['bytes_per_device'])} in {p.replicated['leaves']} leaves",
        ),
    ]
    for pipe in p.pipeline:
        rows.append(
            (
                "pipeline",
                f"{pipe['layer_axis']} over {'/'.join(pipe['mesh_axes'])}: {pipe['stages']} stages "
                f"of {pipe['layers_per_stage']} layers, {pipe['schedule']}, "
                f"{pipe['microbatches']} microbatches, bubble {pipe['bubble']:.1%}",
            )
        )
    if p.compiled is not None:
        c = p.compiled
        rows += [
            ("XLA arguments", f"{c['argument_bytes']:,d} B  {format_bytes(c['argument_bytes'])}"),
            ("XLA temporaries", f"{c['temp_bytes']:,d} B  {format_bytes(c['temp_bytes'])}"),
            (
                "XLA outputs (aliased)",
                f"{format_bytes(c['output_bytes'])} ({format_bytes(c['alias_bytes'])})",
            ),
            ("XLA total", f"{c['total_bytes']:,d} B  {format_bytes(c['total_bytes'])}"),
        ]
    if p.cost:
        rows.append(
            (
                "cost",
                f"{p.cost.get('flops', 0):.3g} flops, {format_bytes(p.cost.get('bytes_accessed', 0))} accessed",
            )
        )
    if p.collectives is not None:
        text = ", ".join(
            f"{c['kind']} x{c['count']} ({format_bytes(c['bytes'])})" for c in p.collectives
        )
        rows.append(("collectives", text or "none"))
    budget = describe_budget(p)
    if budget:
        rows.append(("verdict", budget))
    elif p.dominant:
        rows.append(("largest part", p.dominant))
    rows += [("note", n) for n in p.notes]
    return rows


def plain_text(p: Plan) -> str:
    """The plan as aligned plain text."""
    lines = ["Plan"]
    lines += [f"  {k:<22} {v}" for k, v in _summary(p)]
    lines += ["", f"  {'subtree':<32} {'per device':>14}"]
    lines += [f"  {k:<32} {format_bytes(v):>14}" for k, v in p.subtotals.items()]
    lines += [
        "",
        f"  {'logical axis':<20} {'mesh axes':<20} {'leaves':>7} {'saved per device':>18}",
    ]
    for name, info in p.axes.items():
        mesh_axes = ", ".join(info["mesh_axes"]) or "-"
        lines.append(
            f"  {name:<20} {mesh_axes:<20} {info['leaves']:>7} {format_bytes(info['saved_bytes']):>18}"
        )
    lines += ["", f"  {'largest leaves':<36} {'spec':<30} {'count':>5} {'per device':>12}"]
    for g in p.largest:
        lines.append(
            f"  {g['path']:<36} {g['spec']:<30} {g['count']:>5} {format_bytes(g['bytes_per_device']):>12}"
        )
    if _replicated_line(p):
        lines += ["", f"  {_replicated_line(p)}"]
    if p.unmatched:
        lines += ["", f"  {describe_unmatched(p.unmatched, [*p.axes, *p.step_axes])}"]
    return "\n".join(lines)


def rich_renderable(p: Plan) -> Any:
    """A ``rich`` group of tables for ``rich.print(plan)`` (plain text if rich is missing)."""
    try:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text
    except ImportError:  # rich is optional
        return plain_text(p)
    summary = Table(title="Plan", show_header=False, box=None)
    summary.add_column(style="bold")
    summary.add_column()
    for k, v in _summary(p):
        style = ""
        if k == "verdict":
            style = "green" if p.fits else "bold red"
        summary.add_row(k, v, style=style)
    subtrees = Table("subtree", "per device")
    for k, v in p.subtotals.items():
        subtrees.add_row(k, format_bytes(v))
    axes = Table("logical axis", "mesh axes", "leaves", "saved per device")
    for name, info in p.axes.items():
        axes.add_row(
            name,
            ", ".join(info["mesh_axes"]) or "-",
            str(info["leaves"]),
            format_bytes(info["saved_bytes"]),
        )
    largest = Table("largest leaves", "spec", "count", "per device")
    for g in p.largest:
        largest.add_row(g["path"], g["spec"], str(g["count"]), format_bytes(g["bytes_per_device"]))
    parts: list[Any] = [summary, subtrees, axes, largest]
    if _replicated_line(p):
        parts.append(Text(_replicated_line(p)))
    if p.unmatched:
        parts.append(
            Text(describe_unmatched(p.unmatched, [*p.axes, *p.step_axes]), style="bold yellow")
        )
    return Group(*parts)


def rules_to_json(rules: AxisRules) -> list[list[Any]]:
    """``AxisRules`` as ``[[name, mesh_axes or None], ...]`` (tuples as lists)."""
    return [
        [n, None if t is None else (t[0] if len(t) == 1 else list(t))]
        for n, t in rules.ordered_pairs
    ]


def describe_budget(p: Plan) -> str:
    """One line: ``fits, 3.2 GiB headroom of 16 GiB`` (empty without a budget)."""
    if p.fits is None or p.budget_bytes is None or p.headroom_bytes is None:
        return ""
    what = "step" if p.compiled is not None else "state"
    if p.fits:
        return (
            f"{what} fits: {format_bytes(p.headroom_bytes)} headroom of "
            f"{format_bytes(p.budget_bytes)} (largest part: {p.dominant})"
        )
    return (
        f"{what} does NOT fit: over {format_bytes(p.budget_bytes)} by "
        f"{format_bytes(-p.headroom_bytes)} (largest part: {p.dominant})"
    )


def mesh_text(p: Plan) -> str:
    """``Mesh(data=2, model=4)`` plus the compile target when there is one."""
    return format_mesh(p.mesh) + (f" [{p.target}]" if p.target else "")
