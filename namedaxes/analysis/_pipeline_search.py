"""``pipeline_search``: stage counts and microbatch counts for a model, priced like ``plan``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._errors import PlanError, ShardingError, format_mesh
from .._logical._rules import AxisRules, as_rules
from ._pipeline_plan import bubble_fraction
from ._plan import Plan, parse_bytes, state_plan, verdict

__all__ = ["pipeline_search"]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


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
        batch: The global batch (rows per step).
        split: The mesh axis whose devices may become stages.
        stage_axis: The name of the stage mesh axis to make.
        layer_axis: The stacked layer axis.
        microbatches: Microbatches per stage to try (``m = p * k``).
        budget: Bytes per device (int or ``"16GiB"``).
        top: How many plans to return.

    Returns:
        A list of :class:`Plan`, best first; each has ``pipeline`` and a ``notes`` line.

    Raises:
        PlanError: if ``split`` is not in ``mesh``, ``stage_axis`` is, or no candidate exists.

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
    found = []
    for p in _divisors(sizes[split]):
        rest = sizes[split] // p
        grid = {stage_axis: p, **{a: (rest if a == split else n) for a, n in sizes.items()}}
        pairs = list(base.pairs) + ([(layer_axis, stage_axis)] if p > 1 else [])
        r = AxisRules(pairs, base.unsatisfied)
        try:
            state = state_plan(tree, grid, r)
        except ShardingError:  # p does not divide the layers (or another axis)
            continue
        options = sorted({p * k for k in microbatches}) if p > 1 else [1]
        for m in options:
            if p > 1 and (batch % m or (batch // m) % rest):
                continue
            piped = tuple(
                {**pipe, "microbatches": m, "bubble": bubble_fraction(p, m, pipe["repeats"])}
                for pipe in state.pipeline
            )
            if p > 1 and not piped:
                continue  # nothing to split into stages (or they do not divide the layers)
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
