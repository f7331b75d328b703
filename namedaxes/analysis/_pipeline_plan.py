"""Pricing pipeline parallelism: the bubble of a schedule and what a plan's pipelined stacks cost."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax

from .._errors import PlanError

__all__ = ["bubble_fraction", "pipelines"]


def bubble_fraction(stages: int, microbatches: int, repeats: int = 1) -> float:
    """The idle fraction of a pipeline step: ``(p - 1) / (repeats * m + p - 1)``.

    Each of ``p`` stages is busy for ``repeats * m`` of the ``repeats * m + p - 1`` ticks of a
    pass (``repeats`` blocks of layers per stage for the circular schedule, else 1).

    Example:
        >>> from namedaxes.analysis import bubble_fraction
        >>> round(bubble_fraction(4, 16), 3)  # 3 idle ticks of 19
        0.158
    """
    if min(stages, microbatches, repeats) < 1:
        raise PlanError(
            f"bubble_fraction needs positive counts, got stages={stages}, "
            f"microbatches={microbatches}, repeats={repeats}."
        )
    return (stages - 1) / (repeats * microbatches + stages - 1)


def _is_stack(x: Any) -> bool:
    return callable(getattr(x, "pipeline_options", None)) and not isinstance(x, type)


def pipelines(
    tree: Any, axes: Mapping[str, Mapping[str, Any]], sizes: Mapping[str, int]
) -> tuple[dict[str, Any], ...]:
    """What each stack of ``tree`` (an ``nn.Stacked``: anything with ``pipeline_options()``) costs as
    a pipeline, given where a plan put each logical axis (``axes``, as ``Plan.axes``).

    A stack whose layer axis no mesh axis splits is not pipelined and not listed.
    """
    out = []
    for node in jax.tree.leaves(tree, is_leaf=_is_stack):
        if not _is_stack(node):
            continue
        opt = node.pipeline_options()
        mesh_axes = list(axes.get(opt["layer"], {}).get("mesh_axes", []))
        p = math.prod(sizes[a] for a in mesh_axes)
        if p <= 1:
            continue
        repeats = opt["repeats"] if opt["schedule"] == "circular" else 1
        m = opt["microbatches"] or p
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
