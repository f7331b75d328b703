"""``Dropout`` with an explicit key and an inference switch."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax

from .._array import NamedArray
from .._axis import axis_name
from .._errors import LayerError, NamedTypeError
from ..random import bernoulli
from ._common import expect_axes

__all__ = ["Dropout"]


class Dropout(eqx.Module):
    """Zero each element with probability ``rate`` and scale the rest by ``1 / (1 - rate)``.

    Randomness is explicit: pass ``key=`` on every training call. With ``inference=True`` (on the
    layer, or per call) the input is returned unchanged and no key is needed;
    ``equinox.nn.inference_mode(model)`` flips the ``inference`` field of every Dropout in a model.
    ``broadcast_axes`` share one mask along those axes (e.g. the same mask at every ``position``).
    The mask is drawn over the other axes in sorted-name order (as ``namedaxes.random.categorical``
    draws), so a key drops the same elements whatever the layout of ``x``.

    Args:
        rate: The drop probability, ``0 <= rate < 1``.
        broadcast_axes: Axis names along which the mask is shared.
        inference: Whether the layer starts in inference mode.

    Raises:
        LayerError: if ``rate`` is outside ``[0, 1)``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import namedaxes as na
        >>> drop = na.nn.Dropout(0.5)
        >>> x = na.ones({"batch": 2, "embed": 4})
        >>> y = drop(x, key=jax.random.key(0))
        >>> sorted({float(v) for v in y.array.ravel()})
        [0.0, 2.0]
        >>> drop(x, inference=True) is x
        True
    """

    rate: float = eqx.field(static=True)
    broadcast_axes: tuple[str, ...] = eqx.field(static=True)
    inference: bool

    def __init__(self, rate: float = 0.5, *, broadcast_axes: Any = (), inference: bool = False):
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= rate < 1.0:
            raise LayerError(
                f"Dropout rate must be a number in [0, 1), got {rate!r}. Use inference=True to "
                "turn dropout off."
            )
        if isinstance(broadcast_axes, str):
            broadcast_axes = (broadcast_axes,)
        self.rate = float(rate)
        self.broadcast_axes = tuple(axis_name(a) for a in broadcast_axes)
        self.inference = inference

    def __call__(
        self, x: NamedArray, *, key: jax.Array | None = None, inference: bool | None = None
    ) -> NamedArray:
        """``x`` with dropout applied (or unchanged in inference mode).

        Raises:
            NamedTypeError: if training (not inference, ``rate > 0``) without a ``key``.
            AxisNotFoundError: if a broadcast axis is not an axis of ``x``.
        """
        x = expect_axes(x, (), "Dropout")
        if (self.inference if inference is None else inference) or self.rate == 0.0:
            return x
        if key is None:
            raise NamedTypeError(
                "Dropout needs key= when training (rate > 0, not in inference mode). Pass "
                "key=jax.random.key(...), or inference=True to turn it off."
            )
        for name in self.broadcast_axes:
            x.resolve_axis(name)  # AxisNotFoundError listing x's axes
        # Draw in sorted-name order, so the mask depends on names, not on x's layout.
        mask_axes = sorted(
            (a for a in x.axes if a.name not in self.broadcast_axes), key=lambda a: a.name
        )
        keep = bernoulli(key, mask_axes, 1.0 - self.rate)
        # x on the left keeps x's axis order (the mask is broadcast by name).
        return x * (keep.astype(x.dtype) * (1.0 / (1.0 - self.rate)))
