"""``pipeline_search``: stage counts and microbatch counts for a model, priced like ``plan``."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from .._axis import Axis
from .._errors import NamedTypeError, PlanError, ShardingError, format_mesh
from .._logical._resolve import resolve
from .._logical._rules import AxisRules, as_rules
from .._spec import entry_axes
from ._pipeline_plan import check_positive, is_stack, pipelines
from ._plan import Plan, parse_bytes, state_plan, verdict
from ._report import check_count

__all__ = ["pipeline_search"]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _counts(microbatches: Any) -> list[int]:
    """``microbatches`` (per stage) checked: a non-empty sequence of ints >= 1 (NumPy integers
    are ints; bools and floats are not)."""
    fix = "Pass e.g. microbatches=(1, 2, 4, 8)."
    if isinstance(microbatches, (str, bytes)) or not hasattr(microbatches, "__iter__"):
        raise NamedTypeError(
            f"pipeline_search: microbatches must be a tuple of ints (microbatches per stage to "
            f"try), got {microbatches!r}. {fix}"
        )
    counts = []
    for k in microbatches:
        k = int(k) if isinstance(k, np.integer) else k
        if isinstance(k, bool) or not isinstance(k, int):
            raise NamedTypeError(
                f"pipeline_search: microbatches must be a tuple of ints (microbatches per stage "
                f"to try), got {microbatches!r}, where {k!r} is a {type(k).__name__}. {fix}"
            )
        if k < 1:
            raise PlanError(
                f"pipeline_search: microbatches must be ints >= 1 (microbatches per stage to "
                f"try), got {microbatches!r}. {fix}"
            )
        counts.append(k)
    if not counts:
        raise PlanError(f"pipeline_search: microbatches is empty: no pipeline to try. {fix}")
    return counts


def _own_microbatches_dropped(tree: Any) -> Any:
    """``tree`` with each stack's own microbatch count dropped (the search chooses it), so that
    pricing the state never checks a count the search replaces."""

    def one(node: Any) -> Any:
        drop = getattr(node, "with_pipeline", None) if is_stack(node) else None
        return drop(microbatches=None) if callable(drop) else node

    return jax.tree.map(one, tree, is_leaf=is_stack)


def _batch_shards(tree: Any, batch: int, rules: AxisRules, grid: Mapping[str, int]) -> int:
    """How many shards the stacks' batch axes (``batch`` rows) are split into under ``rules`` (the
    most over the stacks: each microbatch's rows must divide into them). Raises ShardingError when
    the rules cannot place the batch."""
    names = {
        node.pipeline_options().get("batch_axis", "batch")
        for node in jax.tree.leaves(tree, is_leaf=is_stack)
        if is_stack(node)
    }
    shards = 1
    for name in sorted(names):
        entry = resolve((Axis(name, batch),), rules, grid)[0]
        shards = max(shards, math.prod(grid[a] for a in entry_axes(entry)))
    return shards


def pipeline_search(
    tree: Any,
    mesh: Mapping[str, int],
    rules: Any,
    *,
    batch: int,
    split: str = "data",
    stage_axis: str = "stage",
    layer_axis: str = "layer",
    microbatches: tuple[int, ...] = (1, 2, 4, 8),
    budget: int | str | None = None,
    top: int = 5,
) -> list[Plan]:
    """Search stage counts and microbatch counts for a model: which share of the ``split`` mesh
    axis should become pipeline stages, and into how many microbatches to split the batch.

    For each stage count ``p`` dividing ``mesh[split]`` (and the stacks' layer counts), the mesh
    ``{stage_axis: p, split: mesh[split] / p, ...}`` with ``rules`` plus ``{layer_axis:
    stage_axis}``; for each microbatch count ``p * k`` (``k`` in ``microbatches``) that splits
    ``batch`` evenly over the devices of ``split``: the exact state bytes per device (as
    :func:`plan`) and the bubble. Plans that fit ``budget`` come first, then by bubble (the least
    idle time), then by state per device. One stage (no pipeline) has no bubble: it ranks first
    whenever it fits, which is the point: pipeline only for memory.

    Args:
        tree: The stored state (as for :func:`plan`), with the stacks whose layers would be split.
        mesh: ``{mesh_axis: size}`` without ``stage_axis``: the devices to lay out.
        rules: The mapping of the other logical axes (``{"batch": "data", ...}``); it must not
            name ``stage_axis``.
        batch: The global batch (rows per step), an int >= 1.
        split: The mesh axis whose devices may become stages.
        stage_axis: The name of the stage mesh axis to make.
        layer_axis: The stacked layer axis.
        microbatches: Microbatches per stage to try (``m = p * k``): ints >= 1.
        budget: Bytes per device (int or ``"16GiB"``).
        top: How many plans to return (an int >= 1).

    Returns:
        A list of :class:`Plan`, best first; each has ``pipeline`` and a ``notes`` line.

    Raises:
        NamedTypeError: if ``batch``, ``top`` or an entry of ``microbatches`` is not an int.
        PlanError: if one of them is below 1, ``split`` is not in ``mesh``, ``stage_axis`` is, or
            no candidate exists.

    Example:
        >>> import jax
        >>> import namedaxes as na
        >>> from namedaxes.analysis import pipeline_search
        >>> stack = jax.eval_shape(lambda: na.nn.Stacked(
        ...     na.Axis("layer", 8), lambda k: na.nn.Linear({"embed": 512}, {"mlp": 512}, key=k),
        ...     key=jax.random.key(0)))
        >>> best = pipeline_search(stack, {"data": 8}, {"batch": "data"}, batch=64,
        ...                        budget="3MiB", top=1)[0]
        >>> best.mesh, best.pipeline[0]["microbatches"], round(best.pipeline[0]["bubble"], 3)
        ({'stage': 4, 'data': 2}, 32, 0.086)
    """
    batch = check_positive(batch, "pipeline_search", "batch", "rows per step")
    per_stage = _counts(microbatches)
    check_count(top, "pipeline_search", what="how many plans to return", minimum=1, error=PlanError)
    sizes = dict(mesh)
    if split not in sizes or stage_axis in sizes:
        raise PlanError(
            f"pipeline_search splits mesh axis {split!r} into stages named {stage_axis!r}: the "
            f"mesh {format_mesh(sizes)} must have {split!r} and no {stage_axis!r}."
        )
    base = as_rules(rules)
    if stage_axis in base.mesh_axes:
        raise PlanError(f"pipeline_search: the rules already name mesh axis {stage_axis!r}.")
    budget_bytes = None if budget is None else parse_bytes(budget)
    state_tree = _own_microbatches_dropped(tree)
    found = []
    for p in _divisors(sizes[split]):
        rest = sizes[split] // p
        grid = {stage_axis: p, **{a: (rest if a == split else n) for a, n in sizes.items()}}
        pairs = list(base.pairs) + ([(layer_axis, stage_axis)] if p > 1 else [])
        r = AxisRules(pairs, base.unsatisfied)
        try:
            state = state_plan(state_tree, grid, r)
            shards = _batch_shards(tree, batch, r, grid) if p > 1 else 1
        except (ShardingError, PlanError):  # p does not divide the layers (or the batch, ...)
            continue
        options = sorted({p * k for k in per_stage}) if p > 1 else [1]
        for m in options:
            if p > 1 and (batch % m or (batch // m) % shards):
                continue  # the microbatches would not split over the batch's shards
            try:
                piped = pipelines(tree, state.axes, grid, r, microbatches=m)
            except PlanError:  # a stack cannot run so (e.g. circular with m < p)
                continue
            if p > 1 and not piped:
                continue  # nothing to split into stages
            bubble = max((pipe["bubble"] for pipe in piped), default=0.0)
            note = (
                f"{p} stages x {m} microbatches of {batch // m} rows: bubble {bubble:.1%}"
                if p > 1
                else "no pipeline: no bubble"
            )
            found.append(verdict(state.with_(pipeline=piped, notes=(note,)), budget_bytes))
    if not found:
        raise PlanError(
            f"pipeline_search found no stage and microbatch count that split batch={batch} "
            f"and the layers on {format_mesh(sizes)}."
        )
    found.sort(
        key=lambda q: (
            q.fits is False,
            max((x["bubble"] for x in q.pipeline), default=0.0),
            q.state_bytes_per_device,
        )
    )
    return found[:top]
