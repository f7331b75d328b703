"""``Dropout`` with an explicit key and an inference switch."""

from __future__ import annotations

from collections.abc import Sequence

import equinox as eqx
import jax

from .._array import NamedArray
from .._axis import Axis, AxisSelector, axis_names
from .._errors import LayerError, NamedTypeError
from ..random import bernoulli
from ._common import expect_axes, real_number

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
        rate: The drop probability, ``0 <= rate < 1`` (a Python or NumPy number, or a 0-d
            concrete array).
        broadcast_axes: The axes along which the mask is shared: a name or an ``Axis`` (whose
            size the input must have), or a sequence of them.
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
    # The broadcast axes given as an Axis, checked against the input's sizes at call time.
    _broadcast_sized: tuple[Axis, ...] = eqx.field(static=True)

    def __init__(
        self,
        rate: float = 0.5,
        *,
        broadcast_axes: AxisSelector | Sequence[AxisSelector] = (),
        inference: bool = False,
    ):
        value = real_number(rate)
        if value is None or not 0.0 <= value < 1.0:
            raise LayerError(
                f"Dropout rate must be a number in [0, 1), got {rate!r}. Use inference=True to "
                "turn dropout off."
            )
        self.rate = value
        self.broadcast_axes = axis_names(broadcast_axes)  # a name, an Axis, or several
        given = (broadcast_axes,) if isinstance(broadcast_axes, (str, Axis)) else broadcast_axes
        self._broadcast_sized = tuple(a for a in given if isinstance(a, Axis))
        self.inference = inference

    def __call__(
        self, x: NamedArray, *, key: jax.Array | None = None, inference: bool | None = None
    ) -> NamedArray:
        """``x`` with dropout applied (or unchanged in inference mode).

        Raises:
            NamedTypeError: if training (not inference, ``rate > 0``) without a ``key``.
            AxisNotFoundError: if a broadcast axis is not an axis of ``x``.
            AxisSizeError: if a broadcast axis given as an ``Axis`` has another size in ``x``.
        """
        x = expect_axes(x, (), "Dropout")
        if (self.inference if inference is None else inference) or self.rate == 0.0:
            return x
        if key is None:
            raise NamedTypeError(
                "Dropout needs key= when training (rate > 0, not in inference mode). Pass "
                "key=jax.random.key(...), or inference=True to turn it off."
            )
        expect_axes(x, self._broadcast_sized, "Dropout")  # an Axis given: its size too
        for name in self.broadcast_axes:
            x.resolve_axis(name)  # AxisNotFoundError listing x's axes
        # Draw in sorted-name order, so the mask depends on names, not on x's layout.
        mask_axes = sorted(
            (a for a in x.axes if a.name not in self.broadcast_axes), key=lambda a: a.name
        )
        keep = bernoulli(key, mask_axes, 1.0 - self.rate)
        # x on the left keeps x's axis order (the mask is broadcast by name).
        return x * (keep.astype(x.dtype) * (1.0 / (1.0 - self.rate)))
