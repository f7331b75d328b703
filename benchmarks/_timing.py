"""Timing helpers the benchmarks share: one timed call, back-to-back calls, a time budget, rounds
of several calls interleaved."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax


def clock(fn: Callable[[], Any]) -> float:
    """Seconds for one call of ``fn``, its results ready."""
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


def per_call(fn: Callable[[], Any], calls: int) -> float:
    """Microseconds per call over ``calls`` back-to-back calls, blocked once at the end (so that
    dispatch overlaps execution, as in a training loop)."""
    out = None
    start = time.perf_counter()
    for _ in range(calls):
        out = fn()
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / calls * 1e6


class Budget:
    """A section's wall-clock allowance, checked between rounds."""

    def __init__(self, seconds: float):
        self.end = time.perf_counter() + seconds

    def left(self) -> float:
        return self.end - time.perf_counter()


def interleaved(
    slots: dict[str, Callable[[], Any]], budget: Budget, rounds: int
) -> dict[str, list[float]]:
    """Time each slot once per round, the order rotating between rounds, until rounds or budget."""
    names = list(slots)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        if r >= 2 and budget.left() <= 0:
            break
        order = names[r % len(names) :] + names[: r % len(names)]
        for n in order:
            times[n].append(clock(slots[n]))
    return times
