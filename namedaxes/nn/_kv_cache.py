"""``KVCache``: the keys and values of past positions, preallocated, for decoding one token at a time."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax.numpy as jnp

from .._array import NamedArray
from .._axis import Axis, AxisSpec, to_axes
from .._errors import (
    AxisNotFoundError,
    AxisSizeError,
    LayerError,
    NamedTypeError,
    format_axes,
    format_names,
)
from .._ops._checks import is_static_int
from .._ops.creation import full, zeros
from .._ops.dynamic import updated_slice
from ._common import expect_axes, place

__all__ = ["KVCache"]

KEY_POSITION = "key_position"


class KVCache(eqx.Module):
    """Keys and values of the positions attended so far, in buffers preallocated to ``length``.

    ``keys`` and ``values`` are ``([layer,] batch..., key_position, kv_heads, head_dim)`` (the
    axis order of the attention kernels, so no step transposes them); ``mask`` is
    ``(batch..., key_position)``, ``True`` at slots that hold a real key (``False`` at padding and
    at slots not written yet); ``index`` is the number of slots written, the same for every row:
    a batch of left-padded prompts is written aligned, its padding marked in ``mask``, and each
    row's own positions go to the rotary embedding. An :class:`Attention` layer called with
    ``cache=`` writes its new keys and values at ``index`` (one ``dynamic_update_slice``, in place
    inside a compiled loop), marks them in ``mask``, attends over the cache (queries at key
    position ``index``, ``causal`` and ``sliding_window`` as kernel options, ``mask`` as the
    kernel's ``key_mask``) and returns the cache advanced by the number of new positions.

    A cache for a stack of layers has a ``Layer`` axis on ``keys`` and ``values`` (``mask`` and
    ``index`` are shared); the model's layer loop hands each layer ``cache.at_layer(i)``, a view
    that reads and writes layer ``i`` only. Under an ``axis_mapping`` the buffers are placed by
    their names: map ``batch`` and ``kv_heads`` (``heads`` for multi-head attention, where the
    keys have the query heads' axis) as for the weights and each device keeps its share.

    ``index`` may be a Python ``int`` (a static position: a first call at ``0`` lets fused
    kernels that need a static query offset run) or a traced ``int32`` scalar (inside a decoding
    loop). Writing past ``length`` is not checked inside a compiled function (JAX clamps the
    window): size the cache for the prompt plus every new token.

    Attributes:
        keys: ``([layer,] batch..., key_position, kv_heads, head_dim)``.
        values: Like ``keys``.
        mask: Boolean ``(batch..., key_position)``.
        index: Slots written so far.
        layer: For a cache with a ``Layer`` axis: the layer a call reads and writes (set by
            :meth:`at_layer`); ``None`` otherwise.

    Example:
        >>> import jax
        >>> import namedaxes as na
        >>> Embed, Heads, HeadDim = na.Axis("embed", 8), na.Axis("heads", 2), na.Axis("head_dim", 4)
        >>> attn = na.nn.Attention(Embed, Heads, HeadDim, key=jax.random.key(0))
        >>> cache = na.nn.KVCache.zeros({"batch": 1}, Heads, HeadDim, 6)
        >>> x = na.ones({"batch": 1, "position": 4, "embed": 8})
        >>> y, cache = attn(x, cache=cache)  # prefill: 4 positions
        >>> y, cache = attn(x["position", 3:], cache=cache)  # decode: 1 position
        >>> cache.keys, cache.index
        (NamedArray(float32, batch=1, key_position=6, heads=2, head_dim=4), 5)
    """

    keys: NamedArray
    values: NamedArray
    mask: NamedArray
    index: Any
    layer: Any = None

    @classmethod
    def zeros(
        cls,
        batch: AxisSpec,
        KVHeads: Axis,
        HeadDim: Axis,
        length: int,
        *,
        Layer: Axis | None = None,
        dtype: Any = None,
    ) -> KVCache:
        """An empty cache of ``length`` slots (``index`` 0), placed by the mapping in force.

        Args:
            batch: The batch axes, e.g. ``{"batch": 8}`` (``{}`` for none).
            KVHeads: The keys' heads axis (``kv_heads``, or ``heads`` for multi-head attention).
            HeadDim: The per-head feature axis.
            length: The number of slots (the prompt plus every token to generate).
            Layer: The stacking axis of a cache for a stack of layers (``None``: one layer).
            dtype: The keys' and values' dtype (JAX's default float when ``None``).

        Raises:
            NamedTypeError: if an axis is not an ``Axis`` or ``length`` not a positive int.

        Example:
            >>> import namedaxes as na
            >>> c = na.nn.KVCache.zeros({"batch": 2}, na.Axis("kv_heads", 2), na.Axis("head_dim", 4),
            ...                         16, Layer=na.Axis("layer", 3))
            >>> c.keys, c.mask
            (NamedArray(float32, layer=3, batch=2, key_position=16, kv_heads=2, head_dim=4), NamedArray(bool, batch=2, key_position=16))
        """
        for what, a in (("KVHeads", KVHeads), ("HeadDim", HeadDim), ("Layer", Layer)):
            if not isinstance(a, Axis) and not (what == "Layer" and a is None):
                raise NamedTypeError(f"KVCache.zeros: {what} must be an Axis, got {a!r}.")
        if not is_static_int(length) or length < 1:
            raise NamedTypeError(
                f"KVCache.zeros: length must be a positive int (the slots to preallocate), got "
                f"{length!r}."
            )
        batch_axes = to_axes(batch, what="KVCache.zeros batch")
        slots = Axis(KEY_POSITION, int(length))
        axes = ((Layer,) if Layer is not None else ()) + batch_axes + (slots, KVHeads, HeadDim)
        keys = place(zeros(axes, dtype))
        values = place(zeros(axes, dtype))
        mask = place(full(batch_axes + (slots,), False))
        return cls(keys, values, mask, 0)

    @property
    def length(self) -> int:
        """The number of slots."""
        return self.keys.axis_size(KEY_POSITION)

    def at_layer(self, layer: Any) -> KVCache:
        """The view of one layer of a stacked cache: calls read and write that layer's keys.

        Args:
            layer: The layer index (an int or a traced integer scalar, e.g. a scan's counter).

        Raises:
            LayerError: if the cache has no ``layer`` axis.
        """
        if self.keys.ndim != self.mask.ndim + 3:
            raise LayerError(
                f"KVCache.at_layer: the keys NamedArray({format_axes(self.keys.axes)}) have no "
                "layer axis; only a cache made with Layer= holds several layers."
            )
        return KVCache(self.keys, self.values, self.mask, self.index, layer)

    def _layer_name(self) -> str | None:
        return self.keys.axes[0].name if self.keys.ndim == self.mask.ndim + 3 else None

    def read(self) -> tuple[NamedArray, NamedArray]:
        """``(keys, values)`` of this layer (every slot; ``mask`` says which hold keys)."""
        name = self._layer_name()
        if name is None:
            return self.keys, self.values
        if self.layer is None:
            raise LayerError(
                f"KVCache holds {self.keys.axis_size(name)} layers ({name!r} axis); read one "
                "layer's view: cache.at_layer(i)."
            )
        return self.keys[name, self.layer], self.values[name, self.layer]

    def update(
        self, keys: NamedArray, values: NamedArray, key_mask: NamedArray | None = None
    ) -> KVCache:
        """This cache with ``keys``/``values`` written at slots ``index .. index + n - 1``.

        Args:
            keys: ``(batch..., key_position=n, kv_heads, head_dim)``: the new positions' keys.
            values: Like ``keys``.
            key_mask: Boolean ``(batch..., key_position=n)``, ``False`` at padding (default:
                every new key is real): ``key_position`` of the new keys' size, any of the cache's
                batch axes (those it lacks are broadcast).

        Returns:
            The cache with the keys written (in this view's layer), ``mask`` marking them and
            ``index`` advanced by ``n``.

        Raises:
            AxisNotFoundError / AxisSizeError: if the new keys lack an axis of the cache or have
                other sizes; a static ``index`` with ``n`` new positions that overrun ``length``;
                a ``key_mask`` with an axis the cache's ``mask`` lacks, or other sizes than the
                new keys'.
            NamedTypeError: if ``key_mask`` is not a boolean NamedArray.
            LayerError: if the cache holds several layers and this is not a view of one.
        """
        name = self._layer_name()
        if name is not None and self.layer is None:
            raise LayerError(
                f"KVCache holds {self.keys.axis_size(name)} layers ({name!r} axis); write one "
                "layer's view: cache.at_layer(i)."
            )
        rest = tuple(a for a in self.keys.axes if a.name not in (name, KEY_POSITION))
        keys = expect_axes(keys, rest, "KVCache.update", "keys")
        values = expect_axes(values, rest, "KVCache.update", "values")
        if not keys.has_axis(KEY_POSITION):
            raise AxisSizeError(
                f"KVCache.update: keys NamedArray({format_axes(keys.axes)}) need the new "
                f"positions on axis {KEY_POSITION!r}."
            )
        n = keys.axis_size(KEY_POSITION)
        if is_static_int(self.index) and self.index + n > self.length:
            raise AxisSizeError(
                f"KVCache.update: {n} new positions at index {self.index} overrun the cache's "
                f"{self.length} slots. Make the cache longer (KVCache.zeros(..., length))."
            )
        start: dict[str, Any] = {KEY_POSITION: self.index}
        if name is not None:
            start[name] = self.layer
            keys = keys.broadcast_axis(Axis(name, 1)) if not keys.has_axis(name) else keys
            values = values.broadcast_axis(Axis(name, 1)) if not values.has_axis(name) else values
        written = full({KEY_POSITION: n}, True) if key_mask is None else self._new_mask(key_mask, n)
        new_keys = updated_slice(self.keys, start, keys.astype(self.keys.dtype))
        new_values = updated_slice(self.values, start, values.astype(self.values.dtype))
        mask = updated_slice(self.mask, {KEY_POSITION: self.index}, written)
        return KVCache(new_keys, new_values, mask, self.index + n, self.layer)

    def _new_mask(self, key_mask: Any, n: int) -> NamedArray:
        """``key_mask`` checked against the ``n`` new keys: written as it is, a mask of another
        length would leave new keys unmarked or mark slots not written yet."""
        want = Axis(KEY_POSITION, n)
        rows = tuple(a for a in self.mask.axes if a.name != KEY_POSITION)
        shape = f"({format_axes((*rows, want))})"
        where = "KVCache.update (Attention's key_mask with cache=)"
        if not isinstance(key_mask, NamedArray) or key_mask.dtype != jnp.bool_:
            shape_of = getattr(key_mask, "shape", None)
            got = repr(key_mask) if shape_of is None else f"a plain array of shape {shape_of}"
            got = repr(key_mask) if isinstance(key_mask, NamedArray) else got
            raise NamedTypeError(
                f"{where}: key_mask must be a boolean NamedArray{shape}, True at the new real "
                f"keys, got {got}. Name its axes, and compare to get booleans (mask != 0)."
            )
        cache_axes = {a.name: a for a in self.mask.axes}
        cache_axes[KEY_POSITION] = want
        extra = [a for a in key_mask.axes if a.name not in cache_axes]
        if extra or not key_mask.has_axis(KEY_POSITION):
            fix = (
                f"Rename or drop {format_names(a.name for a in extra)} (the new keys' positions "
                f"are {KEY_POSITION!r})."
                if extra
                else f"Give it the new keys' positions as axis {KEY_POSITION!r}."
            )
            raise AxisNotFoundError(
                f"{where}: key_mask NamedArray({format_axes(key_mask.axes)}) must mark the {n} "
                f"new keys over {shape}: axes of the cache's mask NamedArray("
                f"{format_axes(self.mask.axes)}) only, with {KEY_POSITION!r}. {fix}"
            )
        wrong = [a for a in key_mask.axes if a != cache_axes[a.name]]
        if wrong:
            raise AxisSizeError(
                f"{where}: key_mask NamedArray({format_axes(key_mask.axes)}) has "
                f"{format_axes(wrong)}, but the {n} new keys need "
                f"{format_axes(tuple(cache_axes[a.name] for a in wrong))}. Pass one mask entry "
                "per new key (and per row)."
            )
        return key_mask

    def with_index(self, index: Any) -> KVCache:
        """The same buffers with ``index`` replaced (e.g. a static int made a traced ``int32``)."""
        return KVCache(self.keys, self.values, self.mask, index, self.layer)


def as_traced_index(cache: KVCache) -> KVCache:
    """``cache`` with its ``index`` as an ``int32`` array (a loop carry needs arrays)."""
    return cache.with_index(jnp.asarray(cache.index, jnp.int32))
