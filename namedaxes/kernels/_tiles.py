"""Tile sizes and padding the Pallas kernels share: Triton wants power-of-2 tiles, and operands
padded to whole tiles."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

__all__ = ["pad_to", "tile_size"]


def tile_size(size: int, tile: int) -> int:
    """The tile for a dimension of ``size``: ``tile``, or less for a small dimension (at least
    16, a power of 2)."""
    return min(tile, max(16, pl.next_power_of_2(size)))


def pad_to(x: jax.Array, axis: int, multiple: int) -> jax.Array:
    """``x`` padded with zeros at the end of ``axis`` to a multiple of ``multiple``."""
    extra = -x.shape[axis] % multiple
    if not extra:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths)
