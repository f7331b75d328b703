"""Timing helpers the benchmarks share: one timed call, back-to-back calls, a time budget."""

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
