"""The ``Attention`` layer and ``causal_mask``; the function is ``dot_product_attention``.

Query positions and key positions are two different axes (``position`` and ``key_position`` by
default), so every other axis the query and the key share (``batch``, ``heads``, ``kv_heads``) is
matched by name. Multi-head, grouped-query and multi-query attention are the same function with
different axes.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax

from .._array import NamedArray
from .._axis import Axis
from .._errors import AxisSizeError, NamedTypeError
from .._ops.creation import arange
from .._ops.shape import rename
from ._common import expect_axes, place
from ._dot_product_attention import dot_product_attention
from ._linear import Linear
from ._norm import RmsNorm

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


class Attention(eqx.Module):
    """Self-attention: project to query/key/value heads, attend, project back to ``Embed``.

    Axes: the input is ``(..., position, Embed)``. With ``KVHeads=None`` (multi-head attention) the
    query, key and value are ``(..., position, heads, head_dim)``. With ``KVHeads`` (grouped-query
    attention; ``KVHeads.size == 1`` is multi-query) the key and value are
    ``(..., position, kv_heads, head_dim)`` and the query is ``(..., position, kv_heads,
    q_per_kv, head_dim)`` with ``q_per_kv = Heads.size // KVHeads.size``: each key/value head
    serves a group of query heads. The key/value positions are renamed to ``key_position``.
    ``qk_norm=True`` applies an ``RmsNorm`` over ``head_dim`` to queries and keys. Map ``heads``
    (or ``kv_heads``) to a mesh axis for tensor parallelism.

    Args:
        Embed: The model axis (input and output).
        Heads: The number of query heads, as an ``Axis`` (e.g. ``Axis("heads", 8)``).
        HeadDim: The per-head feature axis (e.g. ``Axis("head_dim", 64)``).
        key: PRNG key.
        KVHeads: Key/value heads for grouped-query attention; must divide ``Heads.size``.
        causal: Mask future positions.
        qk_norm: RmsNorm on queries and keys over ``HeadDim``.
        use_bias: Biases in the projections.
        position: The name of the input's sequence axis.
        init_scale: Passed to every ``Linear``.
        dtype: The parameters' float dtype.

    Raises:
        AxisSizeError: if ``KVHeads.size`` does not divide ``Heads.size``.

    Example:
        >>> import jax
        >>> import namedaxes as na
        >>> attn = na.nn.Attention(na.Axis("embed", 8), na.Axis("heads", 2), na.Axis("head_dim", 4),
        ...                        key=jax.random.key(0))
        >>> attn(na.ones({"batch": 2, "position": 5, "embed": 8}))
        NamedArray(float32, batch=2, position=5, embed=8)
    """

    q_proj: Linear
    k_proj: Linear
    v_proj: Linear
    o_proj: Linear
    q_norm: RmsNorm | None
    k_norm: RmsNorm | None
    Embed: Axis = eqx.field(static=True)
    QHeads: tuple[Axis, ...] = eqx.field(static=True)
    KVHeads: Axis = eqx.field(static=True)
    HeadDim: Axis = eqx.field(static=True)
    causal: bool = eqx.field(static=True)
    position: str = eqx.field(static=True)

    def __init__(
        self,
        Embed: Axis,
        Heads: Axis,
        HeadDim: Axis,
        *,
        key: jax.Array,
        KVHeads: Axis | None = None,
        causal: bool = True,
        qk_norm: bool = False,
        use_bias: bool = False,
        position: str = "position",
        init_scale: float = 1.0,
        dtype: Any = None,
    ):
        given = (("Embed", Embed), ("Heads", Heads), ("HeadDim", HeadDim), ("KVHeads", KVHeads))
        for what, a in given:
            if not isinstance(a, Axis) and not (what == "KVHeads" and a is None):
                raise NamedTypeError(f"Attention {what} must be an Axis, got {a!r}.")
        if KVHeads is None:
            q_heads: tuple[Axis, ...] = (Heads,)
            KVHeads = Heads
        else:
            if Heads.size % KVHeads.size:
                raise AxisSizeError(
                    f"Attention: KVHeads {KVHeads.name}={KVHeads.size} must divide Heads "
                    f"{Heads.name}={Heads.size} (each key/value head serves a group of query "
                    "heads)."
                )
            q_heads = (KVHeads, Axis("q_per_kv", Heads.size // KVHeads.size))
        kq, kk, kv, ko = jax.random.split(key, 4)
        kw = dict(use_bias=use_bias, init_scale=init_scale, dtype=dtype)
        self.q_proj = Linear(Embed, q_heads + (HeadDim,), key=kq, **kw)
        self.k_proj = Linear(Embed, (KVHeads, HeadDim), key=kk, **kw)
        self.v_proj = Linear(Embed, (KVHeads, HeadDim), key=kv, **kw)
        self.o_proj = Linear(q_heads + (HeadDim,), Embed, key=ko, **kw)
        self.q_norm = RmsNorm(HeadDim, dtype=dtype) if qk_norm else None
        self.k_norm = RmsNorm(HeadDim, dtype=dtype) if qk_norm else None
        self.Embed, self.QHeads, self.KVHeads, self.HeadDim = Embed, q_heads, KVHeads, HeadDim
        self.causal = causal
        self.position = position

    def __call__(self, x: NamedArray, *, mask: NamedArray | None = None) -> NamedArray:
        """Attend over the ``position`` axis of ``x``; the output has ``x``'s axes.

        Args:
            x: ``(..., position, Embed)``.
            mask: An extra boolean mask over the scores' axes, combined with the causal mask; e.g. a
                padding mask ``(batch, key_position)`` that is ``True`` at real tokens.

        Raises:
            AxisNotFoundError: if ``x`` lacks ``position`` or ``Embed``.
        """
        x = expect_axes(x, (self.Embed,), "Attention")
        pos = x.resolve_axis(self.position)
        kpos = Axis("key_position", pos.size)
        q = self.q_proj(x)
        k = rename(self.k_proj(x), {pos.name: kpos.name})
        v = rename(self.v_proj(x), {pos.name: kpos.name})
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        out = dot_product_attention(
            q,
            k,
            v,
            head_axis=self.HeadDim.name,
            key_position=kpos.name,
            position=pos.name,
            mask=mask,
            causal=self.causal,
        )
        return place(self.o_proj(out))
