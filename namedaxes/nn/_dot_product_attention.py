"""``dot_product_attention``: attention over named axes, run by a fused kernel chosen by name.

The named axes are mapped onto ``jax.nn.dot_product_attention``'s ``(batch, seq, heads,
head_dim)`` layout (``_attention_layout``). Causal, sliding-window and padding options, and
grouped-query heads, go to the kernel as such (see ``_attention_kernels``). Under a mapping that
shards the batch, heads or query position axes the kernel runs per shard (``shard_map`` by name);
split query positions are context parallelism (``_context_parallel``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from .._array import NamedArray
from .._axis import Axis, AxisSelector, axis_name
from .._errors import (
    AttentionKernelError,
    AxisSizeError,
    LayerError,
    NamedTypeError,
    format_axes,
    format_names,
)
from .._mesh import context_mesh
from .._ops.contract import dot
from .._ops.creation import arange
from .._ops.reductions import softmax
from .._ops.sets import where
from .._ops.shape import broadcast_to, flatten_axes, rearrange, unflatten_axis
from .._partitioning._shard_map import shard_map
from .._spec import entry_axes, entry_of
from . import _attention_kernels as kernels
from . import _context_parallel as cp
from ._attention_checks import check_mask, check_padding, check_sizes, offset_value, scale_value
from ._attention_layout import Layout, classify, heads_layout, to_layout
from ._common import expect_axes, expect_free, mesh_entries, spec_by_name
from ._context_layout import LAYOUTS
from ._precision import current_precision, upcast

__all__ = ["dot_product_attention"]

_WHAT = "dot_product_attention"


@dataclasses.dataclass(frozen=True)
class _KVSelect:
    """Per shard, the one key/value head its query heads use.

    When the query heads are split over ``mesh_axes`` into more blocks than there are key/value
    heads (2 key/value heads, ``heads`` on ``model=4``), every shard gets all key/value heads and
    keeps the one of its query heads: block ``i`` uses key/value head ``i // per_kv``.
    """

    mesh_axes: tuple[str, ...]
    per_kv: int


def _local_attention(
    impl: str, layout: Layout, scale: float, causal: bool, window: int | None,
    select: _KVSelect | None, context: cp.Context | None, q: NamedArray, k: NamedArray,
    v: NamedArray, mask: NamedArray | None, key_mask: NamedArray | None,
    key_lengths: NamedArray | None, offset: Any,
) -> NamedArray:  # fmt: skip
    """The attention of (per-shard) NamedArrays by kernel ``impl``; the query's axes back.

    With a ``context``, ``q`` holds this shard's block of query positions and the keys and
    values this shard's block of key positions (or all of them): ``_context_parallel`` exchanges
    them.
    """
    sizes = {a.name: a.size for a in q.axes + k.axes}
    pos = () if layout.position is None else (layout.position,)
    t = q.axis_size(layout.position) if layout.position else 1
    s = k.axis_size(layout.kpos)
    groups_q = (layout.batch, pos, layout.q_heads, (layout.head,))
    groups_k = (layout.batch, (layout.kpos,), layout.kv_heads, (layout.head,))
    qa = to_layout(q, groups_q, sizes, (True,) * 4)
    ka = to_layout(k, groups_k, sizes, (True,) * 4)
    va = to_layout(v, groups_k, sizes, (True,) * 4)
    if select is not None:
        names = select.mesh_axes
        i = jax.lax.axis_index(entry_of(names)) // select.per_kv
        ka = jax.lax.dynamic_slice_in_dim(ka, i, 1, axis=2)
        va = jax.lax.dynamic_slice_in_dim(va, i, 1, axis=2)
    real = length = general = None
    if key_mask is not None:
        real = to_layout(key_mask, (layout.batch, (layout.kpos,)), sizes, (True, True))
    elif key_lengths is not None:
        length = to_layout(key_lengths, (layout.batch,), sizes, (True,)).astype(jnp.int32)
    if mask is not None:
        groups = (layout.batch, layout.q_heads, pos, (layout.kpos,))
        whole = dict(sizes, **{a.name: a.size for a in mask.axes})  # every key position
        general = to_layout(mask, groups, whole, (False,) * 4)
    if context is not None:
        out = cp.attend(
            impl, context, qa, ka, va, scale=scale, causal=causal, window=window,
            offset=offset, key_mask=real, key_lengths=length, mask=general,
        )  # fmt: skip
    else:
        call = kernels.KernelCall(
            q=qa, k=ka, v=va, scale=scale, causal=causal, window=window,
            offset=s - t if offset is None else offset,
            padding=kernels.padding_of(real, length, s), mask=general,
        )  # fmt: skip
        out = kernels.run(impl, call)
    axes = tuple(q.resolve_axis(n) for g in groups_q for n in g)
    named = NamedArray(out.reshape(tuple(a.size for a in axes)), axes)
    return rearrange(named, q.axis_names)


@dataclasses.dataclass(frozen=True)
class _Placement:
    """How the kernel runs per shard: ``{axis name: mesh axes}`` of the axes it runs split over
    (``mask`` is the general mask's: every key position on each shard), the key/value head
    selection, and the context parallelism when the query positions are split."""

    entries: dict[str, Any]
    mask: dict[str, Any]
    select: _KVSelect | None
    context: cp.Context | None


@dataclasses.dataclass(frozen=True)
class _ContextOptions:
    """What the caller asked of context parallelism: the strategy, the balance, the layout."""

    strategy: str | None
    balance: str | None
    layout: str | None


def _kernel_specs(
    impl: str, layout: Layout, q: NamedArray, k: NamedArray, v: NamedArray, causal: bool,
    options: _ContextOptions,
) -> _Placement | None:  # fmt: skip
    """Where the kernel runs split: batch axes, the leading query/key-value heads axes and the
    query positions (keys and values then split the same way along the key positions); ``None``
    when no mesh is involved.

    The query heads keep their placement whenever each block of them uses whole key/value heads
    (the key/value heads split the same way) or one key/value head (the key/value heads stay whole
    and each shard keeps its one: ``_KVSelect``); otherwise every head stays on each shard.
    """
    per_name = mesh_entries(q, k, v)
    if per_name is None:
        return None
    sizes = dict(context_mesh().shape)  # type: ignore[union-attr]

    def split(entry: Any) -> int:
        return math.prod(sizes[a] for a in entry_axes(entry))

    out: dict[str, Any] = {n: per_name[0][n] for n in layout.batch}
    select = None
    total = math.prod(q.axis_size(a) for a in layout.q_heads)
    heads = total  # on each shard
    if layout.q_heads:
        entry = kv_entry = per_name[0][layout.q_heads[0]]
        heads_split = split(entry)
        kv = k.axis_size(layout.kv_heads[0]) if layout.kv_heads else 1
        if heads_split > 1 and kv % heads_split:
            kv_entry = None  # the key/value heads stay whole on each shard
            one_each = len(layout.q_heads) == 1 and len(layout.kv_heads) == 1
            if not one_each or heads_split % kv:
                entry = None  # blocks of query heads would straddle key/value heads
            elif kv > 1:
                select = _KVSelect(entry_axes(entry), heads_split // kv)
        out[layout.q_heads[0]] = entry
        heads //= split(entry)
        if layout.kv_heads:
            out[layout.kv_heads[0]] = kv_entry
    context = None
    pos_entry = per_name[0][layout.position] if layout.position is not None else None
    shards = split(pos_entry)
    if shards > 1:
        context = cp.context_for(
            impl, options.strategy, options.balance, options.layout, causal, pos_entry, shards,
            t=q.axis_size(layout.position),  # type: ignore[arg-type]
            s=k.axis_size(layout.kpos), heads=heads, total_heads=total,
            names=(layout.position, layout.kpos, layout.q_heads),
        )  # fmt: skip
        out[layout.position] = pos_entry
        out[layout.kpos] = pos_entry if context.keys_split else None
    return _Placement(out, dict(out, **{layout.kpos: None}), select, context)


def _run_kernel(
    impl: str, layout: Layout, scale: float, causal: bool, window: int | None,
    options: _ContextOptions, arrays: tuple[Any, ...],
) -> NamedArray:  # fmt: skip
    q, k, v = arrays[:3]

    placed = _kernel_specs(impl, layout, q, k, v, causal, options)
    if options.layout is not None and placed is not None and placed.context is None:
        # A layout is made over some shards: read over none, it is a permuted sequence. With no
        # placement at all (no mesh), zigzag() left the inputs in order, and so reads them.
        name = layout.position or "position"
        spec = f" (it runs as {spec_by_name(q, placed.entries)})"
        raise AttentionKernelError(
            f"{_WHAT}(context_layout={options.layout!r}): the query "
            f"NamedArray({format_axes(q.axes)}) does not have {name!r} split here{spec}, so "
            "there are no context shards to read the layout over. Lay the inputs out by the "
            "query's split, namedaxes.nn.zigzag(x, like=query) (another array's split of "
            f"{name!r} may differ: a query axis ahead in the rules, such as the heads, may take "
            "that mesh axis), or pass them in order (context_layout=None)."
        )
    if placed is None:
        return _local_attention(impl, layout, scale, causal, window, None, None, *arrays)

    def local(*a: Any) -> NamedArray:
        return _local_attention(
            impl, layout, scale, causal, window, placed.select, placed.context, *a
        )

    specs = tuple(spec_by_name(x, placed.entries) for x in arrays)
    specs = specs[:3] + (spec_by_name(arrays[3], placed.mask),) + specs[4:]
    return shard_map(local, in_specs=specs, out_specs=specs[0], check_vma=False)(*arrays)


_FLAT, _PER_KV = "__query_heads__", "__queries_per_kv_head__"  # scratch names, never returned


def _general(
    q: NamedArray, k: NamedArray, v: NamedArray, scale: float, allowed: NamedArray | None,
    layout: Layout,
) -> NamedArray:  # fmt: skip
    """Attention with named ops (the value may have other axes than the key).

    Axes the query shares with the key pair by name. Grouped-query heads (key/value heads the
    query lacks) pair as on the kernel path: the query heads, flattened as ``layout`` orders
    them, are split into the key/value heads and a group of queries per key/value head, so that
    query head ``h`` meets key/value head ``h // (N // K)`` by name; the output is merged back.
    """
    query_names = q.axis_names
    q_heads = tuple(q.resolve_axis(n) for n in layout.q_heads)
    kv_heads = tuple(k.resolve_axis(n) for n in layout.kv_heads)
    grouped = any(not q.has_axis(a.name) for a in kv_heads)
    if grouped:
        n, kv = (math.prod(a.size for a in x) for x in (q_heads, kv_heads))
        per_kv = Axis(_PER_KV, n // kv)

        def group(x: NamedArray) -> NamedArray:
            flat = flatten_axes(broadcast_to(x, (*q_heads, ...)), layout.q_heads, _FLAT)
            return unflatten_axis(flat, _FLAT, (*kv_heads, per_kv))

        q = group(q)
        if allowed is not None and any(allowed.has_axis(a.name) for a in q_heads):
            allowed = group(allowed)
    scores = upcast(dot(q * jnp.asarray(scale, q.dtype), k, axis=layout.head))
    if allowed is not None:
        scores = where(allowed, scores, float(jnp.finfo(scores.dtype).min))
    weights = softmax(scores, layout.kpos).astype(v.dtype)
    out = dot(weights, v, axis=layout.kpos)
    if not grouped:
        return out
    out = flatten_axes(out, tuple(a.name for a in (*kv_heads, per_kv)), _FLAT)
    out = unflatten_axis(out, _FLAT, q_heads)
    return rearrange(out, (*(n for n in query_names if out.has_axis(n)), ...))


def _general_refuses_context(
    q: NamedArray, k: NamedArray, v: NamedArray, position: str, strategy: str | None,
    layout: str | None,
) -> None:  # fmt: skip
    """The general path (named ops) neither reads a laid-out sequence nor exchanges keys by a
    strategy: XLA places it by the mapping. Asking it for either raises."""
    if layout is not None:
        if mesh_entries(q) is None:  # no placement: zigzag() left the inputs in order
            return
        asked = f"context_layout={layout!r}"
    else:
        entries = mesh_entries(q) if strategy is not None and q.has_axis(position) else None
        if entries is None or entries[0].get(position) is None:
            return
        asked = f"context_strategy={strategy!r}"
    raise AttentionKernelError(
        f"{_WHAT}({asked}): the value NamedArray({format_axes(v.axes)}) has other axes than the "
        f"key NamedArray({format_axes(k.axes)}), so attention runs by named ops, and only the "
        "kernel path does context parallelism. Give the value the key's axes (its head axis "
        "too), or pass the positions in order with context_strategy=None and "
        "context_layout=None."
    )


def _structural(position: Axis | None, kpos: Axis, offset: Any, window: int | None) -> NamedArray:
    query_at = (arange(position) if position is not None else 0) + jnp.asarray(offset, jnp.int32)
    keys = arange(kpos)
    allowed = keys <= query_at
    if window is not None:
        allowed = allowed & (keys > query_at - window)
    return allowed


def dot_product_attention(
    query: NamedArray,
    key: NamedArray,
    value: NamedArray,
    *,
    head_axis: AxisSelector = "head_dim",
    key_position: AxisSelector = "key_position",
    position: AxisSelector = "position",
    heads: AxisSelector = "heads",
    mask: NamedArray | None = None,
    scale: float | None = None,
    causal: bool | None = None,
    sliding_window: int | None = None,
    key_lengths: NamedArray | None = None,
    key_mask: NamedArray | None = None,
    query_offset: int | jax.Array | NamedArray | None = None,
    implementation: str | None = None,
    context_strategy: str | None = None,
    context_balance: str | None = "zigzag",
    context_layout: str | None = None,
) -> NamedArray:
    """``softmax(query · key * scale, over key positions) · value``, axes matched by name.

    Axes: ``head_axis`` is contracted between query and key; ``key_position`` (key and value) is
    the softmax axis; ``position`` is the query's positions (a query without it is one query).
    Every other axis the three share (``batch``, ...) is matched, except ``heads``: in multi-head
    attention the three share ``heads``; in grouped-query attention the query has ``heads`` (N)
    and the key and value their own heads axis (``kv_heads``, K dividing N), and query head ``h``
    attends with key/value head ``h // (N // K)``, without repeating the keys. Any other query-only
    axis is part of the query heads (``(kv_heads, q_per_kv)`` queries are grouped-query attention
    too). Flattened heads pair by position, so two or more query-only axes besides ``heads`` with
    K > 1 (unless K divides ``heads``), or two or more key-only heads axes, raise rather than pair
    in the order they are laid out: flatten them into one axis, or share the axis by name.

    Structured options go to the kernel natively: ``causal`` (a query at key position ``i`` sees
    keys ``j <= i``), ``sliding_window=w`` (keys ``i - w < j <= i``; causal), padding as
    ``key_lengths`` (the first ``n`` keys of a row are real) or ``key_mask`` (``True`` at real
    keys; left padding works; the real keys of a row must be one contiguous run), and
    ``query_offset``: query ``t`` is key position ``t + query_offset``; by default the queries are
    the *last* positions of the key axis (``S - T``; 0 for self-attention), as when decoding with
    a cache. ``mask=`` is any boolean mask over the scores' axes (``True`` attends), combined with
    the rest; only XLA takes it without materializing it. A query that sees no key gets a finite
    but unspecified output (it differs between kernels).

    Kernels (``implementation``): ``"xla"`` (``jax.nn.dot_product_attention``'s XLA path; takes
    everything), ``"cudnn"`` (cuDNN flash attention: NVIDIA GPUs, bfloat16/float16, queries at
    offset 0 when causal), ``"splash"`` (TPU splash attention: lengths multiple of 128, a static
    offset, no ``mask=``), ``"pallas"`` (``namedaxes.kernels.flash_attention``: Triton on GPUs,
    interpret mode elsewhere; no padding or ``mask=``; opt-in only, until a GPU measures it
    against cuDNN; it returns the log-sum-exp, so the ring's blocks run it). ``None`` picks the platform's fastest (splash on TPU, cuDNN on GPU, XLA
    elsewhere) and falls back to XLA with a one-time logged note when that kernel cannot take the
    inputs; a kernel named explicitly that cannot run raises. Under an ``axis_mapping`` (or an
    Explicit mesh) that shards batch or heads axes, the kernel runs once per shard
    (``shard_map``); ``head_axis`` is gathered first. Query heads split into more blocks than
    there are key/value heads (2 ``kv_heads``, ``heads`` on ``model=4``) stay split: each shard
    takes the one key/value head its query heads use. Under a mixed-precision policy the query,
    key and value are cast to its compute dtype; the softmax is in float32.

    Context parallelism: when the mapping splits the query's ``position`` axis (``{"position":
    "context"}``), each shard keeps its block of queries and the output stays split the same way.
    The key positions follow the query positions (no rule for ``key_position`` is needed): the
    keys and values enter split the same way along ``key_position`` and the shards exchange them
    by ``context_strategy``: ``"all_gather"`` (gather every block, one kernel call per shard with
    its queries at their global positions), ``"ring"`` (pass the blocks around the mesh axis
    with ``ppermute``, one block at a time, merging the blocks' results by their log-sum-exp;
    under ``causal`` a block that no query of the shard sees is skipped; the backward pass is a
    second ring) or ``"ulysses"`` (an all-to-all makes the shards hold every position of some
    heads instead of some positions of every head, the kernel runs unmodified on the whole
    sequence, and an all-to-all brings the output back; the query heads must split into the
    shards, and key/value heads that do not are repeated until they do). The ring's blocks run
    the XLA kernel, or Pallas's with ``implementation="pallas"`` (merging needs each block's
    log-sum-exp with its gradient, which cuDNN and splash do not return); the all-gather runs any kernel that takes a query offset known
    only at run time (XLA; cuDNN and splash without ``causal``); Ulysses runs any kernel, causal
    included. ``None`` picks Ulysses where a fused kernel (cuDNN, splash) runs and the query heads
    of a shard split evenly, else the ring once each shard holds 4096 key
    positions or more, else the all-gather (a provisional rule: see ``docs/parallelism.md``).

    ``context_balance="zigzag"`` (the default) balances a causal ring: with the sequence in
    order the shard holding the last queries computes every block and the first only its own, so
    the ring runs on the zig-zag layout instead (the sequence cut into ``2c`` chunks, shard ``i``
    holding chunks ``i`` and ``2c - 1 - i``), where every shard does the same work: the inputs
    are moved into it and the output back (an exchange of half of each block each way). It
    needs query and key lengths that cut into ``2c`` chunks (else the ring runs unbalanced, with
    a one-time logged note); ``None`` keeps the order. ``context_layout="zigzag"`` says that the
    inputs' split positions (queries, keys, values, ``key_mask``) are in that layout already
    (made by :func:`zigzag`, as ``namedaxes.models.Transformer`` does once for all its layers):
    nothing is moved, the output stays in it, and every strategy takes it; causal masks, windows
    and offsets still use the positions in the sequence. The layout is read over the shards that
    split the *query*'s positions, so lay the inputs out by that split (``zigzag(x,
    like=query)``; keys ``zigzag((key, value), "key_position", like=query,
    like_axis="position")``): on a mesh, a query whose positions are not split raises rather
    than read a permuted sequence in order (with no mesh, ``zigzag`` is the identity). Only the kernel path does context parallelism: a value with
    other axes than the key refuses ``context_layout``, and a ``context_strategy`` under split
    query positions.

    Args:
        query: ``(..., position, heads..., head_dim)``; must not have ``key_position``.
        key: ``(..., key_position, heads or kv_heads, head_dim)``.
        value: Like ``key`` (the general XLA path also takes other value axes, e.g. another
            head size, without context parallelism).
        head_axis: The feature axis contracted between query and key.
        key_position: The key position axis (softmax axis).
        position: The query position axis.
        heads: The query heads axis name (shared with key/value in multi-head attention).
        mask: Boolean NamedArray over some of the scores' axes; ``True`` attends.
        scale: Multiplies the scores; default ``head_axis size ** -0.5``. A static real number
            (the kernels take it as a constant): a traced one raises.
        causal: Causal attention at ``query_offset``; ``None`` (the default) is causal exactly
            when ``sliding_window`` is given.
        sliding_window: Window size ``w`` (HF semantics); causal (``causal=False`` with it
            raises).
        key_lengths: Integer NamedArray over batch axes: real keys per row (right padding).
        key_mask: Boolean NamedArray ``(batch..., key_position)``: real keys (any padding side).
        query_offset: Key position of the first query: an int or an integer scalar (traced is
            fine for ``"xla"``); default ``key_position size - position size``.
        implementation: ``None``, ``"xla"``, ``"cudnn"``, ``"splash"`` or ``"pallas"``.
        context_strategy: With split query positions: ``"all_gather"``, ``"ring"``,
            ``"ulysses"``, or ``None`` (by sizes, above).
        context_balance: ``"zigzag"`` or ``None``: the layout of a causal ring (above).
        context_layout: ``None`` (the split positions are in order) or ``"zigzag"`` (laid out by
            :func:`zigzag`).

    Returns:
        The query's axes (``head_axis`` from the value), in the query's order.

    Raises:
        AxisNotFoundError: if ``head_axis``/``key_position`` is missing, or the mask or padding has
            an axis it may not have.
        AxisSizeError: if ``head_axis`` differs in size between query and key, the value's key
            positions differ from the key's, an axis name has two sizes among the inputs (a
            mask's size-1 axis does not broadcast either: leave the axis out), the key/value
            heads do not divide the query heads, or several heads axes would pair in their
            layout order (above).
        DuplicateAxisError: if the query has ``key_position``.
        NamedTypeError: if an option has the wrong type (``scale`` traced, too), or the query,
            key and value are not floating point.
        LayerError: if ``causal=False`` is passed with a ``sliding_window``.
        AttentionKernelError: if ``implementation`` or a context option is unknown, names a
            kernel that cannot run here (with the reason: device, dtype, shapes or options), asks
            for a ring whose key positions do not split into equal blocks, for Ulysses with query
            heads that do not split into the shards, for a zig-zag layout the lengths cannot
            have (or with ``mask=``, or query positions that are not split), or for context
            parallelism on the general path (a value with other axes than the key).

    Example:
        >>> import namedaxes as na
        >>> q = na.ones({"batch": 2, "position": 3, "heads": 4, "head_dim": 8})
        >>> k = na.ones({"batch": 2, "key_position": 3, "kv_heads": 2, "head_dim": 8})
        >>> dot_product_attention(q, k, k, causal=True)
        NamedArray(float32, batch=2, position=3, heads=4, head_dim=8)
    """
    head, kpos_name = axis_name(head_axis), axis_name(key_position)
    pos_name, heads_name = axis_name(position), axis_name(heads)
    if implementation is not None and implementation not in kernels.IMPLEMENTATIONS:
        raise AttentionKernelError(
            f"{_WHAT}: unknown implementation={implementation!r}. Choose None (the fastest "
            f"available), {format_names(kernels.IMPLEMENTATIONS)}."
        )
    if context_strategy is not None and context_strategy not in cp.STRATEGIES:
        raise AttentionKernelError(
            f"{_WHAT}: unknown context_strategy={context_strategy!r}. Choose None (by sizes), "
            f"{format_names(cp.STRATEGIES)}."
        )
    if context_balance is not None and context_balance not in cp.BALANCES:
        raise AttentionKernelError(
            f"{_WHAT}: unknown context_balance={context_balance!r}. Choose None (the sequence "
            f"in order) or {format_names(cp.BALANCES)}."
        )
    if context_layout is not None and context_layout not in LAYOUTS:
        raise AttentionKernelError(
            f"{_WHAT}: unknown context_layout={context_layout!r}. Choose None (the positions "
            f"in order) or {format_names(LAYOUTS)} (laid out by namedaxes.nn.zigzag)."
        )
    if context_layout is not None and mask is not None:
        raise AttentionKernelError(
            f"{_WHAT}: mask= takes query and key positions in order, and "
            f"context_layout={context_layout!r} says they are not. Pass key_mask= or "
            "key_lengths= for padding, or the inputs in order (context_layout=None)."
        )
    query = expect_axes(query, (), _WHAT, "query")
    key = expect_axes(key, (), _WHAT, "key")
    value = expect_axes(value, (), _WHAT, "value")
    q_head = query.resolve_axis(head)
    key = expect_axes(key, (q_head,), _WHAT, "key")
    kpos = key.resolve_axis(kpos_name)
    if not value.has_axis(kpos_name) or value.axis_size(kpos_name) != kpos.size:
        raise AxisSizeError(
            f"{_WHAT}: value NamedArray({format_axes(value.axes)}) needs axis {kpos_name!r} of "
            f"size {kpos.size}, as in the key. Give the value the key's positions."
        )
    why = "names the key positions; query positions need another name"
    expect_free(query, (kpos_name,), _WHAT, why)
    if causal is not None and not isinstance(causal, bool):
        raise NamedTypeError(f"{_WHAT}: causal must be True, False or None, got {causal!r}.")
    if sliding_window is not None:
        if (
            not isinstance(sliding_window, int)
            or isinstance(sliding_window, bool)
            or sliding_window < 1
        ):
            raise NamedTypeError(f"{_WHAT}: sliding_window must be a positive int, got {sliding_window!r}.")  # fmt: skip
        if causal is False:
            raise LayerError(
                f"{_WHAT}: sliding_window={sliding_window} is a causal window (a query sees the "
                "keys at and before it); pass causal=True (or leave it None), or "
                "sliding_window=None."
            )
    causal = sliding_window is not None if causal is None else causal
    if mask is not None:
        check_mask(mask, query, head, kpos)
    check_padding(key_mask, key_lengths, query, key, head, kpos, heads_name)
    inputs = dict(query=query, key=key, value=value, mask=mask, key_mask=key_mask)
    check_sizes(dict(inputs, key_lengths=key_lengths), head)
    offset = offset_value(query_offset)
    policy = current_precision()
    query, key, value = policy.cast_to_compute((query, key, value))
    if len({query.dtype, key.dtype, value.dtype}) > 1:
        raise NamedTypeError(
            f"{_WHAT}: query, key and value must share a dtype, got {query.dtype}, {key.dtype} "
            f"and {value.dtype}. Cast them (or use a precision policy)."
        )
    if not jnp.issubdtype(query.dtype, jnp.floating):
        raise NamedTypeError(
            f"{_WHAT}: query, key and value must be floating point (the softmax weights are "
            f"fractions), got {query.dtype}. Cast them, e.g. query.astype(jnp.float32)."
        )
    scale = scale_value(scale, q_head)

    layout = classify(query, key, value, head, kpos_name, pos_name, heads_name)
    if layout is None:
        heads_of = heads_layout(query, key, head, kpos_name, pos_name, heads_name)
        _general_refuses_context(query, key, value, pos_name, context_strategy, context_layout)
        if implementation not in (None, "xla"):
            raise AttentionKernelError(
                f"{_WHAT}(implementation={implementation!r}) cannot run: the value "
                f"NamedArray({format_axes(value.axes)}) has other axes than the key "
                f"NamedArray({format_axes(key.axes)}), which only implementation='xla' takes."
            )
        pos = query.resolve_axis(pos_name) if query.has_axis(pos_name) else None
        allowed = mask
        if causal:
            start = kpos.size - (pos.size if pos else 1) if offset is None else offset
            allowed = _and(allowed, _structural(pos, kpos, start, sliding_window))
        if key_mask is not None:
            allowed = _and(allowed, key_mask)
        elif key_lengths is not None:
            allowed = _and(allowed, arange(kpos) < key_lengths.astype(jnp.int32))
        return _general(query, key, value, scale, allowed, heads_of)

    arrays = (query, key, value, mask, key_mask, key_lengths, offset)
    strategy = _ContextOptions(context_strategy, context_balance, context_layout)
    if implementation is not None:
        try:
            return _run_kernel(
                implementation, layout, scale, causal, sliding_window, strategy, arrays
            )
        except kernels.Unavailable as e:
            raise AttentionKernelError(
                f"{_WHAT}(implementation={implementation!r}) cannot run here: {e}. Pass "
                "implementation=None to use the fastest kernel that can."
            ) from None
    best = kernels.preferred()
    if best != "xla":
        try:
            return _run_kernel(best, layout, scale, causal, sliding_window, strategy, arrays)
        except kernels.Unavailable as e:
            kernels.note_once(f"namedaxes: {_WHAT} uses XLA instead of {best}: {e}.")
    return _run_kernel("xla", layout, scale, causal, sliding_window, strategy, arrays)


def _and(a: NamedArray | None, b: NamedArray) -> NamedArray:
    return b if a is None else a & b
