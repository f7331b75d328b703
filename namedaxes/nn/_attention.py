"""The ``Attention`` layer and ``causal_mask``; the function is ``dot_product_attention``.

Query positions and key positions are two different axes (``position`` and ``key_position`` by
default), so every other axis the query and the key share (``batch``, ``heads``, ``kv_heads``) is
matched by name, and query-only axes (``q_per_kv`` in grouped-query attention) are kept. Multi-head,
grouped-query and multi-query attention are the same function with different axes.
"""

from __future__ import annotations

from typing import Any, overload

import equinox as eqx
import jax

from .._array import NamedArray
from .._axis import Axis
from .._errors import AxisSizeError, LayerError, NamedTypeError
from .._ops._checks import is_static_int
from .._ops.creation import arange
from .._ops.shape import rename
from ._common import expect_axes, place
from ._context_layout import zigzag
from ._context_parallel import BALANCES, STRATEGIES
from ._dot_product_attention import dot_product_attention
from ._kv_cache import KEY_POSITION, KVCache
from ._linear import Linear
from ._norm import RmsNorm
from ._rotary import RotaryEmbedding

__all__ = ["Attention", "causal_mask"]


def causal_mask(position: Axis, key_position: Axis) -> NamedArray:
    """Boolean ``(position, key_position)`` mask: a query attends to keys at or before it.

    Args:
        position: The query position axis.
        key_position: The key position axis (same size for self-attention; a longer key axis means
            the queries are the last ``position.size`` keys, as when decoding with a cache).

    Returns:
        ``mask[q, k] = k <= q + (key_position.size - position.size)``.

    Example:
        >>> import namedaxes as na
        >>> m = causal_mask(na.Axis("position", 3), na.Axis("key_position", 3))
        >>> m.array.astype(int)
        Array([[1, 0, 0],
               [1, 1, 0],
               [1, 1, 1]], dtype=int32)
    """
    offset = key_position.size - position.size
    return arange(position) + offset >= arange(key_position)


QK_NORMS = (False, True, "head", "projection")


class Attention(eqx.Module):
    """Self-attention: project to query/key/value heads, attend, project back to ``Embed``.

    Axes: the input is ``(..., position, Embed)``. Queries are ``(..., position, heads, head_dim)``
    with ``heads = Heads`` in every variant, so ``q_proj``'s weight is ``(Embed, heads, head_dim)``
    and ``o_proj``'s ``(heads, head_dim, Embed)``. With ``KVHeads=None`` (multi-head attention) keys
    and values have ``heads`` too. With ``KVHeads`` (grouped-query attention; ``KVHeads.size == 1``
    is multi-query) they are ``(..., position, kv_heads, head_dim)`` and query head ``h`` uses key
    /value head ``h // (Heads.size // KVHeads.size)`` (the convention of Hugging Face checkpoints and
    of ``jax.nn.dot_product_attention``, which :func:`dot_product_attention` takes as is: no key is
    repeated). Map ``heads`` to a mesh axis for tensor parallelism: the query and output
    projections and the attention itself shard the same way for multi-head and grouped-query
    attention, also when the mesh axis has more devices than there are key/value heads (each
    device then uses the key/value heads of its query heads; map ``kv_heads`` too where its size
    divides). Map ``position`` to a mesh axis for context parallelism: each device attends its
    block of the sequence, exchanging keys and values by ``context_strategy``, a causal ring
    balanced by ``context_balance``. The key/value positions are renamed to ``key_position``
    (which follows ``position``'s placement).

    Options: ``qk_norm`` applies an ``RmsNorm`` to queries and keys after the projections, over
    ``head_dim`` (``True`` or ``"head"``, one weight shared by the heads, as Qwen3) or over
    ``(heads, head_dim)`` / ``(kv_heads, head_dim)`` (``"projection"``, as OLMo 2). ``rotary``
    rotates queries and keys by position (after the norms). ``causal`` and ``sliding_window``
    (each query sees only the last ``sliding_window`` keys, itself included) go to the attention
    kernel as options, as do padding (``key_mask=`` per call) and ``scale``; no mask of positions x
    positions is built for them. ``use_bias`` puts biases on all four projections; ``out_bias``
    overrides it for ``o_proj`` (Qwen2: biases on q, k, v only). For decoding, a call with
    ``cache=`` (a :class:`KVCache`) writes the new keys and values into it and attends over it.

    Args:
        Embed: The model axis (input and output).
        Heads: The number of query heads, as an ``Axis`` (e.g. ``Axis("heads", 8)``).
        HeadDim: The per-head feature axis (e.g. ``Axis("head_dim", 64)``).
        key: PRNG key.
        KVHeads: Key/value heads for grouped-query attention; must divide ``Heads.size`` and have
            another name than ``Heads``.
        causal: Mask future positions.
        qk_norm: ``False``, ``True``/``"head"`` or ``"projection"`` (above).
        norm_eps: The q/k norms' epsilon.
        use_bias: Biases in the projections.
        out_bias: Bias in ``o_proj`` (default: ``use_bias``).
        sliding_window: The number of keys a query sees (itself included), or ``None`` for all;
            needs ``causal``.
        rotary: A :class:`RotaryEmbedding` over ``HeadDim``, or ``None``.
        scale: Multiplies the scores (default ``HeadDim.size ** -0.5``).
        position: The name of the input's sequence axis.
        context_strategy: How the shards exchange keys and values when a mapping splits
            ``position`` (context parallelism): ``"all_gather"``, ``"ring"``, ``"ulysses"``, or
            ``None`` to choose by sizes (see :func:`dot_product_attention`).
        context_balance: ``"zigzag"`` (default) runs a causal ring on the zig-zag layout, where
            every shard does the same work; ``None`` keeps the sequence in order.
        init_scale: Passed to every ``Linear``.
        dtype: The parameters' float dtype.

    Raises:
        AxisSizeError: if ``KVHeads.size`` does not divide ``Heads.size``.
        LayerError: for an unknown ``qk_norm`` or context option, a ``sliding_window`` below 1
            or without ``causal``, a ``rotary`` over another axis, or ``KVHeads`` named like
            ``Heads``.
        NamedTypeError: if an axis argument is not an ``Axis``, or ``causal`` not a bool.

    Example:
        >>> import jax
        >>> import namedaxes as na
        >>> attn = na.nn.Attention(na.Axis("embed", 8), na.Axis("heads", 4), na.Axis("head_dim", 4),
        ...                        KVHeads=na.Axis("kv_heads", 2), key=jax.random.key(0))
        >>> attn.q_proj.weight, attn.k_proj.weight
        (NamedArray(float32, embed=8, heads=4, head_dim=4), NamedArray(float32, embed=8, kv_heads=2, head_dim=4))
        >>> attn(na.ones({"batch": 2, "position": 5, "embed": 8}))
        NamedArray(float32, batch=2, position=5, embed=8)
    """

    q_proj: Linear
    k_proj: Linear
    v_proj: Linear
    o_proj: Linear
    q_norm: RmsNorm | None
    k_norm: RmsNorm | None
    rotary: RotaryEmbedding | None
    Embed: Axis = eqx.field(static=True)
    Heads: Axis = eqx.field(static=True)
    KVHeads: Axis | None = eqx.field(static=True)
    HeadDim: Axis = eqx.field(static=True)
    causal: bool = eqx.field(static=True)
    sliding_window: int | None = eqx.field(static=True)
    scale: float | None = eqx.field(static=True)
    position: str = eqx.field(static=True)
    context_strategy: str | None = eqx.field(static=True)
    context_balance: str | None = eqx.field(static=True)

    def __init__(
        self,
        Embed: Axis,
        Heads: Axis,
        HeadDim: Axis,
        *,
        key: jax.Array,
        KVHeads: Axis | None = None,
        causal: bool = True,
        qk_norm: bool | str = False,
        norm_eps: float = 1e-6,
        use_bias: bool = False,
        out_bias: bool | None = None,
        sliding_window: int | None = None,
        rotary: RotaryEmbedding | None = None,
        scale: float | None = None,
        position: str = "position",
        context_strategy: str | None = None,
        context_balance: str | None = "zigzag",
        init_scale: float = 1.0,
        dtype: Any = None,
    ):
        given = (("Embed", Embed), ("Heads", Heads), ("HeadDim", HeadDim), ("KVHeads", KVHeads))
        for what, a in given:
            if not isinstance(a, Axis) and not (what == "KVHeads" and a is None):
                raise NamedTypeError(f"Attention {what} must be an Axis, got {a!r}.")
        if KVHeads is not None:
            if KVHeads.name == Heads.name:
                raise LayerError(
                    f"Attention: KVHeads and Heads are both named {Heads.name!r}; name the key/value "
                    "heads differently (e.g. 'kv_heads'), or pass KVHeads=None for multi-head "
                    "attention."
                )
            if Heads.size % KVHeads.size:
                raise AxisSizeError(
                    f"Attention: KVHeads {KVHeads.name}={KVHeads.size} must divide Heads "
                    f"{Heads.name}={Heads.size} (each key/value head serves a group of query "
                    "heads)."
                )
        if not isinstance(causal, bool):
            raise NamedTypeError(f"Attention causal must be True or False, got {causal!r}.")
        if qk_norm not in QK_NORMS or isinstance(qk_norm, int) and not isinstance(qk_norm, bool):
            raise LayerError(
                f"Attention qk_norm must be one of {', '.join(map(repr, QK_NORMS))}, got "
                f"{qk_norm!r}."
            )
        if sliding_window is not None and (
            isinstance(sliding_window, bool)
            or not isinstance(sliding_window, int)
            or sliding_window < 1
        ):
            raise LayerError(
                f"Attention sliding_window must be a positive number of keys or None, got "
                f"{sliding_window!r}."
            )
        if sliding_window is not None and not causal:
            raise LayerError(
                f"Attention sliding_window={sliding_window} is a causal window (a query sees the "
                "keys at and before it); pass causal=True, or sliding_window=None."
            )
        if context_strategy is not None and context_strategy not in STRATEGIES:
            raise LayerError(
                f"Attention context_strategy must be one of {', '.join(map(repr, STRATEGIES))} "
                f"or None (chosen by sizes), got {context_strategy!r}."
            )
        if context_balance is not None and context_balance not in BALANCES:
            raise LayerError(
                f"Attention context_balance must be one of {', '.join(map(repr, BALANCES))} "
                f"or None (the sequence in order), got {context_balance!r}."
            )
        if rotary is not None and (
            not isinstance(rotary, RotaryEmbedding) or rotary.HeadDim != HeadDim
        ):
            raise LayerError(
                f"Attention rotary must be a RotaryEmbedding over {HeadDim}, got {rotary!r}."
            )
        kv = KVHeads if KVHeads is not None else Heads
        kq, kk, kv_key, ko = jax.random.split(key, 4)
        kw = dict(init_scale=init_scale, dtype=dtype)
        self.q_proj = Linear(Embed, (Heads, HeadDim), key=kq, use_bias=use_bias, **kw)
        self.k_proj = Linear(Embed, (kv, HeadDim), key=kk, use_bias=use_bias, **kw)
        self.v_proj = Linear(Embed, (kv, HeadDim), key=kv_key, use_bias=use_bias, **kw)
        o_bias = use_bias if out_bias is None else out_bias
        self.o_proj = Linear((Heads, HeadDim), Embed, key=ko, use_bias=o_bias, **kw)
        if qk_norm == "projection":
            self.q_norm = RmsNorm((Heads, HeadDim), eps=norm_eps, dtype=dtype)
            self.k_norm = RmsNorm((kv, HeadDim), eps=norm_eps, dtype=dtype)
        elif qk_norm:
            self.q_norm = RmsNorm(HeadDim, eps=norm_eps, dtype=dtype)
            self.k_norm = RmsNorm(HeadDim, eps=norm_eps, dtype=dtype)
        else:
            self.q_norm = self.k_norm = None
        self.rotary = rotary
        self.Embed, self.Heads, self.KVHeads, self.HeadDim = Embed, Heads, KVHeads, HeadDim
        self.causal = causal
        self.sliding_window = sliding_window
        self.scale = scale
        self.position = position
        self.context_strategy = context_strategy
        self.context_balance = context_balance

    @overload
    def __call__(
        self,
        x: NamedArray,
        *,
        mask: NamedArray | None = None,
        key_mask: NamedArray | None = None,
        positions: NamedArray | None = None,
        cache: None = None,
        context_layout: str | None = None,
    ) -> NamedArray: ...

    @overload
    def __call__(
        self,
        x: NamedArray,
        *,
        mask: NamedArray | None = None,
        key_mask: NamedArray | None = None,
        positions: NamedArray | None = None,
        cache: KVCache,
        context_layout: str | None = None,
    ) -> tuple[NamedArray, KVCache]: ...

    def __call__(
        self,
        x: NamedArray,
        *,
        mask: NamedArray | None = None,
        key_mask: NamedArray | None = None,
        positions: NamedArray | None = None,
        cache: KVCache | None = None,
        context_layout: str | None = None,
    ) -> NamedArray | tuple[NamedArray, KVCache]:
        """Attend over the ``position`` axis of ``x``; the output has ``x``'s axes.

        With ``cache``, the keys and values of ``x``'s positions are written into the cache at its
        ``index`` and the queries attend over every slot of the cache (the earlier positions and
        themselves), as key positions ``index ..``: one call serves a prompt (many positions)
        and a decoding step (one position). The call then returns ``(output, cache)``, the cache
        advanced past ``x``'s positions. Causal and sliding-window masking go to the kernel with
        the cache's ``index`` as the query offset and the cache's ``mask`` as the key mask; a
        traced ``index`` (a decoding loop) runs the XLA kernel, since the fused ones need a
        static offset.

        Args:
            x: ``(..., position, Embed)``.
            mask: A general boolean mask over the scores' axes (``True`` attends), combined with
                the causal and sliding-window options (with a cache: over the cache's slots).
                Only the XLA kernel takes it without building it out; prefer ``key_mask`` for
                padding.
            key_mask: Padding: boolean ``(batch..., key_position)``, ``True`` at real tokens, one
                contiguous run of them per row (left or right padding); passed to the kernel.
                With a cache, it marks ``x``'s positions and is kept in the cache's ``mask``.
            positions: Integer position ids for ``rotary``, with the ``position`` axis (e.g.
                ``(batch, position)``), in ``x``'s layout; default ``0 .. n-1`` (with a cache,
                ``index .. index + n - 1``; with ``context_layout="zigzag"``, laid out so over
                the shards that split the queries' positions).
            cache: A :class:`KVCache` (of this layer) to write to and attend over.
            context_layout: ``None`` (``x``'s positions are in order) or ``"zigzag"`` (``x``,
                ``key_mask`` and ``positions`` are laid out by :func:`zigzag` over the context
                shards, as ``namedaxes.models.Transformer`` lays out its activations once for
                all its layers); the output keeps the layout.

        Raises:
            AxisNotFoundError: if ``x`` lacks ``position`` or ``Embed``, ``positions`` lacks
                ``position``, or a mask has an axis it may not have.
            AxisSizeError: if ``positions``' ``position`` axis has another size than ``x``'s, or
                the cache's axes differ from this layer's keys.
        """
        x = expect_axes(x, (self.Embed,), "Attention")
        if cache is not None and not isinstance(cache, KVCache):
            raise NamedTypeError(f"Attention cache must be a KVCache or None, got {cache!r}.")
        pos = x.resolve_axis(self.position)
        kpos = Axis(KEY_POSITION, pos.size)
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary is not None:
            if positions is None and cache is not None:
                positions = arange(pos) + cache.index
            elif positions is None:  # laid out as x is, over the split attention reads
                laid_out = context_layout == "zigzag"
                positions = zigzag(arange(pos), pos.name, like=q) if laid_out else arange(pos)
            positions = expect_axes(positions, (pos,), "Attention", "positions")
            q, k = self.rotary(q, positions), self.rotary(k, positions)
        k, v = rename(k, {pos.name: kpos.name}), rename(v, {pos.name: kpos.name})
        offset = implementation = None
        if cache is not None:
            offset = cache.index
            cache = cache.update(k, v, key_mask)
            (k, v), key_mask = cache.read(), cache.mask
            if self.causal and not is_static_int(offset):
                implementation = "xla"  # cuDNN and splash take a static query offset only
        out = dot_product_attention(
            q,
            k,
            v,
            head_axis=self.HeadDim.name,
            key_position=kpos.name,
            position=pos.name,
            heads=self.Heads.name,
            mask=mask,
            scale=self.scale,
            causal=self.causal,
            sliding_window=self.sliding_window,
            key_mask=key_mask,
            query_offset=offset,
            implementation=implementation,
            context_strategy=self.context_strategy,
            context_balance=self.context_balance,
            context_layout=context_layout,
        )
        out = place(self.o_proj(out))
        return out if cache is None else (out, cache)
