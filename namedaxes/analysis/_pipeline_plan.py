"""Pricing pipeline parallelism: the bubble of a schedule and what a plan's pipelined stacks cost.

``pipeline_counts`` is the one check of a pipeline's shape (the layers divide into the stages'
blocks; the circular schedule has a microbatch per stage): ``nn.Stacked`` applies it when it runs,
and the planner when it prices a stack, so a plan never lists a pipeline that fails at runtime.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from .._array import NamedArray, is_named_array
from .._errors import AxisSizeError, PlanError, format_mesh, format_path
from .._logical._resolve import resolve
from .._spec import entry_axes
from ._report import check_count

__all__ = ["bubble_fraction", "check_positive", "is_stack", "pipeline_counts", "pipelines"]


def check_positive(value: Any, caller: str, name: str, what: str) -> int:
    """``value`` as an int >= 1 (a NumPy integer is one; a bool or a float is not).

    Raises:
        NamedTypeError: if ``value`` is not an int.
        PlanError: if it is below 1.
    """
    if isinstance(value, np.integer):
        value = int(value)
    return check_count(value, caller, name=name, what=what, minimum=1, error=PlanError)


def bubble_fraction(stages: int, microbatches: int, repeats: int = 1) -> float:
    """The idle fraction of a pipeline step: ``(p - 1) / (repeats * m + p - 1)``.

    Each of ``p`` stages is busy for ``repeats * m`` of the ``repeats * m + p - 1`` ticks of a
    pass (``repeats`` blocks of layers per stage for the circular schedule, else 1).

    Raises:
        NamedTypeError: if a count is not an int (NumPy integers are; bools and floats are not).
        PlanError: if a count is below 1.

    Example:
        >>> from namedaxes.analysis import bubble_fraction
        >>> round(bubble_fraction(4, 16), 3)  # 3 idle ticks of 19
        0.158
    """
    p = check_positive(stages, "bubble_fraction", "stages", "pipeline stages")
    m = check_positive(microbatches, "bubble_fraction", "microbatches", "microbatches per step")
    v = check_positive(repeats, "bubble_fraction", "repeats", "blocks of layers per stage")
    return (p - 1) / (v * m + p - 1)


def pipeline_counts(
    layer: str, layers: int, stages: int, microbatches: int | None, schedule: str, repeats: int
) -> tuple[int, int]:
    """``(microbatches, repeats)`` of ``layers`` layers (axis ``layer``) pipelined over ``stages``
    stages with ``schedule``: ``microbatches`` ``None`` is one per stage, and only ``"circular"``
    repeats. The one check, at runtime (``nn.Stacked``) and in plans.

    Raises:
        AxisSizeError: if ``stages * repeats`` blocks do not divide the layers, or the circular
            schedule has fewer microbatches than stages.
    """
    if schedule != "circular":
        repeats = 1
    m = stages if microbatches is None else microbatches
    blocks = stages * repeats
    if layers % blocks:
        raise AxisSizeError(
            f"Pipelining {layer!r} ({layers} layers) over {stages} stages"
            + (f" x {repeats} repeats" if repeats > 1 else "")
            + f" needs a layer count divisible by {blocks}. Change the layer count, the stage "
            "axis size or the repeats."
        )
    if schedule == "circular" and m < stages:
        raise AxisSizeError(
            f"The circular schedule needs at least one microbatch per stage ({stages}), got "
            f"microbatches={m}. Pass microbatches >= {stages}."
        )
    return m, repeats


def is_stack(x: Any) -> bool:
    return callable(getattr(x, "pipeline_options", None)) and not isinstance(x, type)


def _stage_axes(
    stack: Any, layer: str, axes: Mapping[str, Mapping[str, Any]], sizes: Mapping[str, int],
    rules: Any,
) -> list[str]:  # fmt: skip
    """The mesh axes ``rules`` place this stack's layer axis on: those of its first NamedArray with
    the layer axis (as ``nn.Stacked`` finds them when it runs), through ``resolve``. Without
    ``rules``, the mesh axes ``layer`` has on any leaf of the plan (``axes``)."""
    if rules is None:
        return list(axes.get(layer, {}).get("mesh_axes", []))
    for v in jax.tree.leaves(stack, is_leaf=is_named_array):
        if isinstance(v, NamedArray) and v.has_axis(layer):
            spec = resolve(v.axes, rules, sizes)
            return list(entry_axes(spec[v.axis_names.index(layer)]))
    return []


def pipelines(
    tree: Any,
    axes: Mapping[str, Mapping[str, Any]],
    sizes: Mapping[str, int],
    rules: Any = None,
    *,
    microbatches: int | None = None,
) -> tuple[dict[str, Any], ...]:
    """What each stack of ``tree`` (an ``nn.Stacked``: anything with ``pipeline_options()``) costs as
    a pipeline on a mesh of ``sizes``: its stages are where ``rules`` place its own layer axis, as
    when it runs, and a stack that would fail there (``pipeline_counts``) is a ``PlanError``.

    A stack whose layer axis no mesh axis splits is not pipelined and not listed.

    Args:
        tree: The state, with its stacks.
        axes: ``Plan.axes``: where the plan put each logical axis (on any leaf). Only read
            without ``rules``, as a rough guess (the union over the tree's stacks, unchecked).
        sizes: ``{mesh_axis: size}``.
        rules: The rules in force, resolved per stack.
        microbatches: The microbatch count to price instead of each stack's own.

    Raises:
        PlanError: if a stack cannot run pipelined where ``rules`` place it, naming its path.
    """
    out = []
    for path, node in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_stack)[0]:
        if not is_stack(node):
            continue
        opt = node.pipeline_options()
        mesh_axes = _stage_axes(node, opt["layer"], axes, sizes, rules)
        p = math.prod(sizes[a] for a in mesh_axes)
        if p <= 1:
            continue
        m = microbatches or opt["microbatches"]
        if rules is None:
            repeats = opt["repeats"] if opt["schedule"] == "circular" else 1
            m = m or p
        else:
            try:
                m, repeats = pipeline_counts(
                    opt["layer"], opt["layers"], p, m, opt["schedule"], opt["repeats"]
                )
            except AxisSizeError as e:
                raise PlanError(
                    f"The stack at {format_path(path)} cannot run pipelined on "
                    f"{format_mesh(sizes)} ({opt['layer']!r} over {mesh_axes!r}): {e}"
                ) from e
        out.append(
            {
                "layer_axis": opt["layer"],
                "mesh_axes": mesh_axes,
                "stages": p,
                "layers_per_stage": opt["layers"] // p,
                "microbatches": m,
                "schedule": opt["schedule"],
                "repeats": repeats,
                "bubble": bubble_fraction(p, m, repeats),
            }
        )
    return tuple(out)
