"""How named query, key and value axes map onto the kernel's ``(batch, seq, heads, head_dim)``.

Every axis the query, key and value share (besides ``heads`` and ``head_dim``) is flattened into
the kernel's batch; the query's ``heads`` axis (and any other query-only axis besides
``position``) into its heads; the key's and value's own axes (``kv_heads``) into its key/value
heads, which pair with the query heads by position (so a side may not have several heads axes
whose order would decide the pairing).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from .._array import NamedArray
from .._errors import AxisSizeError, format_axes
from .._ops.shape import rearrange

__all__ = ["Layout", "classify", "heads_layout", "to_layout"]

_WHAT = "dot_product_attention"


@dataclasses.dataclass(frozen=True)
class Layout:
    """Which named axes become the kernel's batch, query heads and key/value heads."""

    batch: tuple[str, ...]
    position: str | None  # the query's position axis, if it has one (else one query)
    q_heads: tuple[str, ...]
    kv_heads: tuple[str, ...]
    head: str
    kpos: str


def classify(q: NamedArray, k: NamedArray, v: NamedArray, head: str, kpos: str, position: str,
              heads: str) -> Layout | None:  # fmt: skip
    """The kernel layout, or ``None`` when the value's axes differ from the key's."""
    if k.axes != v.axes and (
        set(k.axis_names) != set(v.axis_names) or any(v.axis_size(a.name) != a.size for a in k.axes)
    ):
        return None
    return heads_layout(q, k, head, kpos, position, heads)


def heads_layout(q: NamedArray, k: NamedArray, head: str, kpos: str, position: str,
                 heads: str) -> Layout:  # fmt: skip
    """Which of the query's and key's axes are batch, query heads and key/value heads.

    The kernel path and the named-ops path both pair query heads with key/value heads by it.

    Raises:
        AxisSizeError: if the key/value heads do not divide the query heads, or several heads
            axes on a side would pair in their layout order.
    """
    in_k = set(k.axis_names)
    pos = position if q.has_axis(position) else None
    batch = tuple(n for n in q.axis_names if n in in_k and n not in (head, heads))
    q_heads = tuple([heads] if q.has_axis(heads) else []) + tuple(
        n for n in q.axis_names if n not in in_k and n not in (pos, head, heads)
    )
    kv_heads = tuple([heads] if q.has_axis(heads) and k.has_axis(heads) else []) + tuple(
        n for n in k.axis_names if not q.has_axis(n) and n not in (kpos, head)
    )
    qa, ka = [q.resolve_axis(a) for a in q_heads], [k.resolve_axis(a) for a in kv_heads]
    n, kv = math.prod(a.size for a in qa), math.prod(a.size for a in ka)
    # Flattened heads pair by position: several unnamed heads axes on a side would pair in the
    # order they are laid out (a leading `heads` pairs by name when the kv heads divide it).
    rest_q = [a for a in qa if a.name != heads and a.size > 1]
    rest_k = [a for a in ka if a.name != heads and a.size > 1]
    if len(rest_k) > 1 or len(rest_q) > 1 and (q.axis_size(heads) if q.has_axis(heads) else 1) % kv:
        side, axes, paired, to = (
            ("key", rest_k, qa, "kv_heads") if len(rest_k) > 1 else ("query", qa, ka, heads)
        )
        axes, paired = (sorted(x, key=lambda a: a.name) for x in (axes, paired))  # not layout
        raise AxisSizeError(
            f"{_WHAT}: the {side} has several heads axes ({format_axes(axes)}), which flatten into "
            f"heads that pair with the other side's ({format_axes(paired)}) by position, so the "
            "pairing would follow the order of those axes in the array. Flatten them into one axis "
            f"(flatten_axes({side}, {tuple(a.name for a in axes)!r}, {to!r})), or give the query "
            "the key/value heads axis by name (axes the query shares with the key pair by name)."
        )
    if n % kv:
        raise AxisSizeError(
            f"{_WHAT}: the key/value heads ({format_axes(ka)}) must divide the query heads "
            f"({format_axes(qa)}): each key/value head serves a group of query heads."
        )
    return Layout(batch, pos, q_heads, kv_heads, head, kpos)


def to_layout(
    x: NamedArray,
    groups: tuple[tuple[str, ...], ...],
    sizes: dict[str, int],
    full: tuple[bool, ...],
) -> jax.Array:
    """``x`` as one array dimension per group of names (flattened in group order).

    A group ``x`` has only some axes of is broadcast over the rest; a group it has none of is a
    dimension of size 1 unless ``full`` asks for its whole size.
    """
    names = [n for g in groups for n in g if x.has_axis(n)]
    arr = rearrange(x, names).array if names else x.array
    shape: list[int] = []
    source: list[int] = []
    for g, want_full in zip(groups, full):
        some = any(x.has_axis(n) for n in g)
        for n in g:
            shape.append(sizes[n] if (some or want_full) else 1)
            source.append(x.axis_size(n) if x.has_axis(n) else 1)
    arr = jnp.broadcast_to(arr.reshape(source), shape)
    out_shape, i = [], 0
    for g in groups:
        out_shape.append(math.prod(shape[i : i + len(g)]))
        i += len(g)
    return arr.reshape(out_shape)
