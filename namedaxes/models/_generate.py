"""``generate``: tokens from a :class:`Transformer` with a KV cache, as ``transformers.generate`` does.

Two compiled programs per shape bucket: the prefill (the prompt through the model into a fresh
cache, the logits of its last position) and the decode loop (a ``lax.while_loop`` that samples a
token, feeds it back through the model with the cache, and stops when every row has met an end of
sequence). Python runs once per call, never per token. Prompts are left-padded to a bucket length
(a power of two, at least 16) so that prompts of nearby lengths share both programs; padding is
masked and each row's positions count from its first real token, so it changes no token.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

from .. import nn
from .._array import NamedArray
from .._axis import Axis
from .._errors import (
    AxisNotFoundError,
    GenerationError,
    NamedTypeError,
    ShardingError,
    format_axes,
    format_mesh,
)
from .._logical._context import current_rules
from .._mesh import context_mesh
from .._ops._checks import is_static_int
from .._ops.creation import full
from .._ops.dynamic import updated_slice
from .._ops.elementwise import minimum
from .._ops.join import concatenate
from .._ops.reductions import argmax, cumsum, softmax
from .._ops.sets import where
from .._ops.sorting import sort
from .._ops.sorting import top_k as _top_k
from .._ops.tiling import pad
from .._partitioning._named_jit import named_jit
from .._partitioning._shard import auto_sharded
from .._partitioning._specs import round_axis_for_partitioning
from ..nn._common import check_ids, real_number
from ..nn._kv_cache import as_traced_index
from ..random import categorical
from ._transformer import Transformer

__all__ = ["filter_logits", "generate"]

POSITION, VOCAB = "position", "vocab"
MIN_BUCKET = 16


def _bucket(n: int) -> int:
    """The padded prompt length: the next power of two, at least ``MIN_BUCKET``."""
    return max(MIN_BUCKET, 1 << (n - 1).bit_length())


def filter_logits(
    logits: NamedArray, *, top_k: int | None = None, top_p: Any = None, axis: str = VOCAB
) -> NamedArray:
    """``logits`` with the tokens that top-k and then top-p sampling drop set to ``-inf``.

    As ``transformers``' ``TopKLogitsWarper`` (keep the tokens at least as likely as the
    ``k``-th) and ``TopPLogitsWarper`` (sort ascending, drop the tokens whose cumulative
    probability is at most ``1 - top_p``; the most likely token always stays). Ties at the top-p
    cutoff are all kept.

    Args:
        logits: Float logits with ``axis`` (already divided by the temperature).
        top_k: Keep the ``top_k`` most likely tokens (``None``: all).
        top_p: Keep the smallest set of most likely tokens whose probability exceeds ``top_p``
            (a float in ``(0, 1]`` or a traced scalar; ``None`` or ``1``: all).
        axis: The vocabulary axis.

    Returns:
        A NamedArray with ``logits``' axes.

    Raises:
        NamedTypeError: if ``logits`` is not a floating NamedArray (``-inf`` marks a dropped
            token).
        GenerationError: for a ``top_k`` that is not a positive int, or a ``top_p`` that is not a
            number in ``(0, 1]`` nor a traced float scalar.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> from namedaxes.models import filter_logits
        >>> x = na.named(jnp.log(jnp.array([0.5, 0.3, 0.15, 0.05])), "vocab")
        >>> filter_logits(x, top_p=0.75).array
        Array([-0.6931472, -1.2039728,       -inf,       -inf], dtype=float32)
    """
    if not isinstance(logits, NamedArray) or not jnp.issubdtype(logits.dtype, jnp.floating):
        raise NamedTypeError(
            f"filter_logits: logits must be a floating NamedArray (a dropped token becomes -inf), "
            f"got {logits!r}. Cast them first: logits.astype(jnp.float32)."
        )
    top_p = _check_filters("filter_logits", top_k, top_p, traced_top_p=True)
    threshold = None
    if isinstance(top_p, float):  # as transformers: 1 - top_p in double, then float32
        threshold = 1.0 - top_p if top_p < 1 else None  # top_p = 1 keeps every token
    elif top_p is not None:
        threshold = 1 - top_p
    return _filter(logits, top_k, threshold, axis)


def _filter(logits: NamedArray, k: int | None, threshold: Any, axis: str) -> NamedArray:
    """Top-k, then top-p with ``threshold = 1 - top_p`` (``None``: no top-p)."""
    size = logits.axis_size(axis)
    neg = jnp.asarray(-jnp.inf, logits.dtype)
    if k is not None and k < size:
        kth = _top_k(logits, axis, k)[0].min(axis)
        logits = where(logits < kth, neg, logits)
    if threshold is not None:
        ascending = sort(logits, axis)
        cum = cumsum(softmax(ascending, axis), axis)
        removed = (cum <= jnp.asarray(threshold, cum.dtype)).sum(axis).astype(jnp.int32)
        cutoff = ascending[axis, minimum(removed, size - 1)]  # each row's smallest kept logit
        logits = where(logits < cutoff, neg, logits)
    return logits


def _check_filters(caller: str, top_k: Any, top_p: Any, *, traced_top_p: bool) -> Any:
    """Check the sampling filters; return ``top_p`` as a float (``None`` stays, and so does a
    traced float scalar when ``traced_top_p``).

    Raises:
        GenerationError: for a ``top_k`` that is not a positive int, or a ``top_p`` outside
            ``(0, 1]``.
    """
    if top_k is not None and (not is_static_int(top_k) or top_k < 1):
        raise GenerationError(f"{caller}: top_k must be a positive int or None, got {top_k!r}.")
    if top_p is None:
        return None
    if traced_top_p and isinstance(top_p, jax.core.Tracer):
        if top_p.ndim == 0 and jnp.issubdtype(top_p.dtype, jnp.floating):
            return top_p  # its range is not known here
    else:
        p = real_number(top_p)
        if p is not None and 0 < p <= 1:
            return p
    traced = " or a traced float scalar" if traced_top_p else ""
    raise GenerationError(
        f"{caller}: top_p must be a number in (0, 1]{traced} or None, got {top_p!r}."
    )


def _is_key(key: Any) -> bool:
    """A typed key (``jax.random.key``) or a raw ``uint32[2]`` one (``jax.random.PRNGKey``)."""
    if not isinstance(key, jax.Array):
        return False
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        return key.ndim == 0
    return key.dtype == jnp.uint32 and key.shape == (2,)


def _typed_key(key: jax.Array) -> jax.Array:
    """``key`` as a typed key: a raw ``jax.random.PRNGKey`` holds the same bits for the default
    implementation, and one key type means one decoding program for both kinds."""
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        return key
    return jax.random.wrap_key_data(key)


def _check_token_id(name: str, value: Any, vocab: Axis) -> None:
    if not is_static_int(value):
        raise GenerationError(
            f"generate: {name} must be an int or a sequence of ints, got {value!r}."
            if name == "eos_token_id"
            else f"generate: {name} must be an int, got {value!r}."
        )
    if not 0 <= value < vocab.size:
        raise GenerationError(
            f"generate: {name}={value} is outside the vocabulary: {vocab.name!r} has "
            f"{vocab.size} entries, so ids must be in [0, {vocab.size}). Pass the model's own "
            "id (its generation_config.json's)."
        )


def _check(prompt: Any, attention_mask: Any, max_new_tokens: Any, temperature: Any, top_k: Any,
           top_p: Any, key: Any, eos: tuple[Any, ...], pad: Any,
           vocab: Axis) -> tuple[float, float | None]:  # fmt: skip
    """Check generate's arguments; return ``temperature`` and ``top_p`` as floats."""
    if not isinstance(prompt, NamedArray) or not jnp.issubdtype(prompt.dtype, jnp.integer):
        raise NamedTypeError(
            "generate: prompt must be an integer NamedArray of token ids (batch, position), e.g. "
            f"named(ids, ('batch', 'position')), got {prompt!r}."
        )
    if jnp.iinfo(prompt.dtype).max < vocab.size - 1:  # the new tokens take the prompt's dtype
        raise GenerationError(
            f"generate: the prompt's dtype {prompt.dtype.name} cannot hold every token id of the "
            f"vocabulary ({vocab.name!r} has {vocab.size} entries, ids up to {vocab.size - 1}), so "
            "new tokens would wrap around. Pass the prompt as int32: prompt.astype(jnp.int32)."
        )
    if not prompt.has_axis(POSITION):
        raise AxisNotFoundError(
            f"generate: prompt NamedArray({format_axes(prompt.axes)}) has no {POSITION!r} axis. "
            "Rename its sequence axis to 'position'."
        )
    if prompt.axis_size(POSITION) == 0:
        raise GenerationError(
            f"generate: the prompt NamedArray({format_axes(prompt.axes)}) is empty; the first "
            "token is predicted from the prompt's last one. Give each row at least one token "
            "(a bos id)."
        )
    if attention_mask is not None and (
        not isinstance(attention_mask, NamedArray)
        or attention_mask.dtype != jnp.bool_
        or set(attention_mask.axis_names) != set(prompt.axis_names)
        or any(attention_mask.axis_size(a.name) != a.size for a in prompt.axes)
    ):
        raise NamedTypeError(
            "generate: attention_mask must be a boolean NamedArray with the prompt's axes "
            f"({format_axes(prompt.axes)}), True at real tokens, got {attention_mask!r}."
        )
    if not is_static_int(max_new_tokens) or max_new_tokens < 1:
        raise GenerationError(
            f"generate: max_new_tokens must be a positive int, got {max_new_tokens!r}."
        )
    t = real_number(temperature)
    if t is None or not math.isfinite(t) or t < 0:
        raise GenerationError(
            f"generate: temperature must be a finite number >= 0 (0 is greedy), got "
            f"{temperature!r}."
        )
    top_p = _check_filters("generate", top_k, top_p, traced_top_p=False)
    if t > 0 and key is None:
        raise GenerationError(
            f"generate: temperature={t} samples, which needs key=jax.random.key(...); "
            "pass temperature=0.0 for greedy decoding."
        )
    if key is not None and not _is_key(key):
        raise GenerationError(
            f"generate: key must be a PRNG key such as jax.random.key(0), got {key!r} "
            f"({type(key).__name__})."
        )
    for e in eos:
        _check_token_id("eos_token_id", e, vocab)
    if pad is not None:
        _check_token_id("pad_token_id", pad, vocab)
    return t, top_p


def _check_mask_rows(mask: NamedArray) -> None:
    """Refuse a right-padded row or a row with no real token (checked on the host when the mask is
    a concrete local array)."""
    array = mask.array
    if isinstance(array, jax.core.Tracer) or not getattr(array, "is_fully_addressable", True):
        return
    rows = np.asarray(mask.rearrange((..., POSITION)).array).reshape(-1, mask.axis_size(POSITION))
    empty = np.flatnonzero(~rows.any(axis=1))
    if empty.size:
        raise GenerationError(
            f"generate: attention_mask has no real token in row {int(empty[0])} (of the batch "
            "flattened): its new tokens would come from padding alone. Give each row at least "
            "one real token (a bos id), or leave the row out."
        )
    bad = np.flatnonzero((rows[:, 1:] < rows[:, :-1]).any(axis=1))
    if bad.size:
        raise GenerationError(
            f"generate: attention_mask has padding after real tokens (row {int(bad[0])} of the "
            "batch flattened); decoder-only generation needs left padding: put each row's "
            "padding before its tokens."
        )


def _checkpoint_ids(config: Any, vocab: Axis) -> dict[str, Any]:
    """The eos ids and pad id ``transformers``' ``generate`` takes from the checkpoint: its
    ``generation_config.json`` (``config.hf_generation_config``), else its ``config.json`` (as
    ``GenerationConfig.from_model_config`` does). Ids outside the vocabulary are left out: the
    model never emits them (GPT-2's 50256 in a small vocabulary), so they change nothing there."""
    text = config.hf_generation_config or config.hf_config
    raw = json.loads(text) if text else {}
    found: dict[str, Any] = {}
    for name in ("eos_token_id", "pad_token_id"):
        value = raw.get(name)
        ids = value if isinstance(value, list) else [value]
        kept = [i for i in ids if is_static_int(i) and 0 <= i < vocab.size]
        if kept:
            found[name] = kept if name == "eos_token_id" else kept[0]
    return found


def _eos_ids(eos_token_id: Any) -> tuple[int, ...]:
    if eos_token_id is None:
        return ()
    if isinstance(eos_token_id, Sequence) and not isinstance(eos_token_id, str):
        return tuple(eos_token_id)
    return (eos_token_id,)


def _eos_bucket(eos: tuple[int, ...]) -> jax.Array:
    """The eos ids padded with ``-1`` (no token) to a power of two, at least 4: how many ids there
    are is then part of the program's shape only past 4."""
    size = max(4, 1 << (len(eos) - 1).bit_length()) if eos else 4
    return jnp.asarray(eos + (-1,) * (size - len(eos)), jnp.int32)


def generate(
    model: Transformer,
    prompt: NamedArray,
    *,
    max_new_tokens: int,
    attention_mask: NamedArray | None = None,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    key: jax.Array | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
) -> NamedArray:
    """The prompt followed by ``max_new_tokens`` tokens from ``model``, decoded with a KV cache.

    ``temperature=0`` is greedy (the most likely token; ``top_k``/``top_p`` are then unused);
    otherwise each token is drawn from ``softmax(logits / temperature)`` after top-k and top-p
    filtering as in ``transformers`` (:func:`filter_logits`), with randomness from ``key`` only.
    A row that emits ``eos_token_id`` stops: its later tokens are ``pad_token_id`` (default: the
    first eos id), and the loop ends when every row has stopped. Not given, both are the
    checkpoint's, as ``transformers.generate`` takes them: those of the ``generation_config.json``
    the model was loaded with (``config.hf_generation_config``), else of its ``config.json``.
    Rows are left-padded (``attention_mask`` ``False`` at padding): positions count from each
    row's first real token, as ``transformers.generate`` does, so a row gets the tokens it gets
    alone.

    Compiled: the prompt is left-padded to a bucket length (a power of two, at least 16); one
    program fills the cache from the prompt and one runs the whole decoding loop on the device,
    each compiled once per (batch, bucket, ``max_new_tokens``, sampling options) and reused.
    The temperature, ``top_p``, the key (either kind) and the eos and pad ids are arguments of
    those programs; the eos ids are padded to a power of two, at least 4.
    Inside an ``axis_mapping`` (with a mesh) the model runs as mapped: map ``batch`` for data
    parallelism and ``heads``/``kv_heads``/``mlp``/``vocab`` for tensor parallelism; the cache is
    placed by the same names. A batch the mapping cannot split (one prompt with ``batch`` on
    ``data=2``) is padded, like the prompt length, to the next multiple of the mesh axes of
    ``batch``'s first rule (``round_axis_for_partitioning``), with copies of its last row that are
    dropped from the result: each row gets the tokens it gets alone. A precision policy in force
    applies (the cache holds its compute dtype).

    The programs run where the model's parameters live: a prompt (or mask, or key) committed
    elsewhere, made under another ``jax.set_mesh`` or put on another device, is moved there
    first (it is small), and a model loaded onto a mesh runs on that mesh when none is set.

    Args:
        model: A :class:`Transformer`.
        prompt: Integer token ids ``(batch, position)`` (any batch axes; ``(position,)`` too).
        max_new_tokens: How many tokens to add.
        attention_mask: Boolean, the prompt's axes, ``True`` at real tokens (left padding).
        temperature: ``0`` for greedy, else the softmax temperature (a finite real number: a
            Python, NumPy or 0-d JAX scalar).
        top_k: Sample among the ``top_k`` most likely tokens (``None``: no filter; note that
            ``transformers`` samples with ``top_k=50`` unless told otherwise).
        top_p: Sample among the most likely tokens whose probability exceeds ``top_p``.
        key: A PRNG key; needed when ``temperature > 0``.
        eos_token_id: The end-of-sequence id (or ids); ``None``: the checkpoint's (above; ids
            outside the vocabulary, which the model never emits, are left out), none for a model
            built from a ``TransformerConfig``; ``[]`` never stops early.
        pad_token_id: What stopped rows emit; ``None``: the checkpoint's, else the (first) eos
            id.

    Returns:
        A NamedArray of the prompt's dtype and axes, ``position`` grown by ``max_new_tokens``.

    Raises:
        NamedTypeError: if ``model`` is not a ``Transformer``, the prompt not integer ids, or
            the mask not boolean with the prompt's axes.
        AxisNotFoundError: if the prompt has no ``position`` axis.
        ShardingError: if a mesh set around the call is not the one the model lives on (other
            devices, or the same devices in another shape, axis names or axis types).
        AxisIndexError: if the prompt holds a token id outside ``[0, vocab_size)`` (checked on the
            host before anything runs: the compiled programs cannot raise).
        GenerationError: for a prompt dtype that cannot hold every id of the vocabulary
            (``uint8`` with 512 entries: pass ``int32``), a bad option (non-positive
            ``max_new_tokens``, ``top_k``, a negative or non-finite ``temperature``, a ``top_p``
            outside ``(0, 1]``, sampling without ``key``, an eos or pad id outside
            ``[0, vocab_size)``), an empty prompt or an
            ``attention_mask`` row with no real token (or padding after its tokens), or a model
            with learned positions too short for the prompt plus the new tokens.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import namedaxes as na
        >>> from namedaxes import models
        >>> cfg = models.TransformerConfig("llama", vocab_size=64, hidden_size=16,
        ...                                intermediate_size=32, num_layers=2, num_heads=4,
        ...                                num_kv_heads=2, head_dim=4)
        >>> model = models.Transformer(cfg, key=jax.random.key(0))
        >>> prompt = na.named(jnp.array([[5, 6, 7]]), ("batch", "position"))
        >>> models.generate(model, prompt, max_new_tokens=4)
        NamedArray(int32, batch=1, position=7)
    """
    if not isinstance(model, Transformer):
        raise NamedTypeError(
            f"generate needs a namedaxes.models.Transformer, got {type(model).__name__}."
        )
    vocab = model.embed.Vocab
    if eos_token_id is None or pad_token_id is None:
        stored = _checkpoint_ids(model.config, vocab)
        eos_token_id = stored.get("eos_token_id") if eos_token_id is None else eos_token_id
        pad_token_id = stored.get("pad_token_id") if pad_token_id is None else pad_token_id
    eos = _eos_ids(eos_token_id)
    temperature, top_p = _check(prompt, attention_mask, max_new_tokens, temperature, top_k, top_p,
                                key, eos, pad_token_id, vocab)  # fmt: skip
    check_ids(prompt, vocab, "generate: prompt")
    pad_id = int(pad_token_id if pad_token_id is not None else eos[0] if eos else 0)
    n = prompt.axis_size(POSITION)
    cfg = model.config
    if cfg.learned_positions and n + max_new_tokens - 1 > cfg.max_position_embeddings:
        raise GenerationError(
            f"generate: a prompt of {n} positions and {max_new_tokens} new tokens need position "
            f"ids up to {n + max_new_tokens - 2}, but this {cfg.model_type} model learned "
            f"{cfg.max_position_embeddings} positions. Generate fewer tokens or shorten the "
            "prompt."
        )
    if attention_mask is not None:
        _check_mask_rows(attention_mask)
    mesh, (prompt, attention_mask, key) = _placed(model, prompt, attention_mask, key)
    with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
        # Rows added so that the mapping can split the batch: copies of the last row, dropped
        # from the result.
        rows = _padded_batch(prompt)
        ids = pad(prompt, rows, mode="edge") if rows else prompt
        mask = attention_mask if attention_mask is not None else full(ids.axes, True)
        mask = pad(mask, rows, mode="edge") if rows and attention_mask is not None else mask
        bucket = _bucket(n)
        ids = pad(ids, {POSITION: (bucket - n, 0)}) if bucket > n else ids
        mask = pad(mask, {POSITION: (bucket - n, 0)}) if bucket > n else mask
        policy = nn.current_precision()
        length = bucket + max_new_tokens - 1
        logits, cache, next_position = _prefill(model, ids, mask, length=length, policy=policy)
        sample = temperature > 0
        options = dict(steps=max_new_tokens, top_k=top_k if sample else None, policy=policy,
                       sample=sample, top_p=top_p is not None and top_p < 1 and sample)  # fmt: skip
        dynamic = (
            jnp.asarray(temperature if sample else 1.0, jnp.float32),
            jnp.asarray(1.0 - top_p if top_p is not None else 0.0, jnp.float32),
            _typed_key(key) if sample else jax.random.key(0),
            _eos_bucket(eos),
            jnp.asarray(pad_id, jnp.int32),
        )
        new, _ = _decode(model, cache, logits, next_position, dynamic, **options)
        if rows:
            new = new[{name: slice(0, prompt.axis_size(name)) for name in rows}]
        return concatenate(POSITION, [prompt, new.astype(prompt.dtype)])


def _placed(model: Transformer, *inputs: Any) -> tuple[Mesh | None, list[Any]]:
    """``inputs`` (NamedArrays, a key, or ``None``) moved to where the model's parameters live,
    and the model's mesh when the call should set it (it lives on a mesh and none is set).

    A prompt made under another mesh, or committed to another device, would otherwise meet the
    parameters in one program on two sets of devices; the prompt is small, so it moves (replicated
    on the model's mesh: the prefill then places it by the mapping). A mesh set around the call
    that is not the model's (other devices, or another shape, names or axis types) cannot be fixed
    by moving the prompt: that is an error.
    """
    weight = jax.tree.leaves(model.embed.weight)[0]  # its array, also when it is quantized
    sharding = getattr(weight, "sharding", None)
    if isinstance(weight, jax.core.Tracer) or sharding is None:
        return None, list(inputs)
    devices = sharding.device_set
    mesh = sharding.mesh if isinstance(sharding, NamedSharding) else None
    mesh = mesh if isinstance(mesh, Mesh) else None
    if mesh is not None:
        home, target = _mesh_text(mesh), NamedSharding(mesh, PartitionSpec())
    elif len(devices) == 1:
        home = f"one device ({_devices(devices)})"
        target = SingleDeviceSharding(next(iter(devices)))
    else:
        return None, list(inputs)  # another kind of sharding: JAX decides
    context = context_mesh()
    # The mesh itself, not only its devices: JAX refuses a context mesh of another shape, names
    # or axis types than the parameters' shardings (or, on Auto axes, places by the wrong one).
    if isinstance(context, Mesh) and (
        context != mesh if mesh is not None else set(context.devices.flat) != devices
    ):
        raise ShardingError(
            f"generate: the model's parameters live on {home}, but the mesh set around the call "
            f"is {_mesh_text(context)}: one program cannot use both. Call generate "
            "outside that `with jax.set_mesh(...)` block, or load the model onto that mesh "
            "(models.from_hf(path, mapping=...) inside it)."
        )

    def place(x: Any) -> Any:
        array = x.array if isinstance(x, NamedArray) else x
        now = getattr(array, "sharding", None)
        if not getattr(array, "committed", False):
            return x  # None, host data, or an uncommitted array: JAX puts it where it is used
        if now.device_set == devices and (mesh is None or getattr(now, "mesh", None) == mesh):
            return x
        array = jax.device_put(array, target)
        return NamedArray(array, x.axes) if isinstance(x, NamedArray) else array

    return (mesh if context is None else None), [place(x) for x in inputs]


def _mesh_text(mesh: Mesh) -> str:
    """``Mesh(data=2, model=4) (Explicit axes, devices 0, 1, ...)``: its devices in mesh order."""
    types = [t.name for t in mesh.axis_types]
    kind = f"{types[0]} axes" if len(set(types)) == 1 else f"axis types {', '.join(types)}"
    return f"{format_mesh(mesh)} ({kind}, {_devices(list(mesh.devices.flat))})"


def _devices(devices: Any) -> str:
    """``devices 0, 1, 2``: sorted for a set, else in the order given (a mesh's)."""
    ids = [d.id for d in devices]
    ids = sorted(ids) if isinstance(devices, (set, frozenset)) else ids
    shown = ", ".join(map(str, ids)) if len(ids) <= 8 else f"{ids[0]}, {ids[1]}, ..., {ids[-1]}"
    return f"device {shown}" if len(ids) == 1 else f"devices {shown}"


def _padded_batch(prompt: NamedArray) -> dict[str, tuple[int, int]]:
    """``{axis: (0, rows to add)}`` for each batch axis of ``prompt`` that the mapping in force
    splits over mesh axes whose size does not divide it (one prompt on ``data=2``): padded to
    the next multiple, as ``round_axis_for_partitioning`` rounds it."""
    rules, mesh = current_rules(), context_mesh()
    if rules is None or mesh is None:
        return {}
    rows = {}
    for axis in prompt.axes:
        if axis.name != POSITION:
            size = round_axis_for_partitioning(axis, rules, mesh).size
            if size > axis.size:
                rows[axis.name] = (0, size - axis.size)
    return rows


@named_jit
def _prefill(
    model: Transformer, ids: NamedArray, mask: NamedArray, *, length: int, policy: nn.Precision
) -> tuple[NamedArray, nn.KVCache, NamedArray]:
    """The prompt into a fresh cache: the last position's logits (float32), the cache and each
    row's next position (its number of real tokens)."""
    with nn.precision(policy):
        ids, mask = auto_sharded(ids), auto_sharded(mask)
        counted = cumsum(mask.astype(jnp.int32), POSITION)
        positions = where(mask, counted - 1, 0)
        batch = [a for a in ids.axes if a.name != POSITION]
        cache = model.init_cache(batch, length)
        hidden, cache = model.hidden_states(ids, mask, positions, cache=cache)
        logits = model.logits(hidden[POSITION, -1]).astype(jnp.float32)
    return logits, as_traced_index(cache), counted[POSITION, -1]


def _choose(logits: NamedArray, step: Any, dynamic: tuple[Any, ...], *, sample: bool,
            top_k: int | None, top_p: bool) -> NamedArray:  # fmt: skip
    if not sample:
        return argmax(logits, VOCAB)
    temperature, threshold, key = dynamic[:3]
    scaled = _filter(logits / temperature, top_k, threshold if top_p else None, VOCAB)
    return categorical(jax.random.fold_in(key, step), scaled, VOCAB)


# The cache is donated and returned (unused), so that the loop updates it in place.
@functools.partial(named_jit, donate_args=(False, True, False, False, False))
def _decode(
    model: Transformer, cache: nn.KVCache, logits: NamedArray, next_position: NamedArray,
    dynamic: tuple[Any, ...], *, steps: int, top_k: int | None, top_p: bool,
    policy: nn.Precision, sample: bool,
) -> tuple[NamedArray, nn.KVCache]:  # fmt: skip
    """Every new token (``(batch..., position=steps)``) and the cache after them: sample, feed
    the token back with the cache, until ``steps`` tokens or every row has ended."""
    choose = dict(sample=sample, top_k=top_k, top_p=top_p)
    # A private axis name: a user's batch axis may be called "eos".
    eos = NamedArray(dynamic[3], (Axis("_eos", dynamic[3].shape[0]),))
    pad = dynamic[4]

    def ended(token: NamedArray) -> NamedArray:
        return (token == eos).any("_eos")

    with nn.precision(policy):
        first = _choose(logits, 0, dynamic, **choose).astype(jnp.int32)
        out = auto_sharded(full(first.axes + (Axis(POSITION, steps),), pad, jnp.int32))
        out = updated_slice(out, {POSITION: 0}, first.broadcast_axis(Axis(POSITION, 1)))
        done = ended(first)

        def cond(carry: Any) -> Any:
            step, _, _, _, done = carry
            return (step < steps) & ~done.all().array

        def body(carry: Any) -> Any:
            step, out, cache, last, done = carry
            ids = last.broadcast_axis(Axis(POSITION, 1))
            positions = (next_position + (step - 1)).broadcast_axis(Axis(POSITION, 1))
            hidden, cache = model.hidden_states(ids, None, positions, cache=cache)
            logits = model.logits(hidden[POSITION, 0]).astype(jnp.float32)
            token = _choose(logits, step, dynamic, **choose).astype(jnp.int32)
            token = where(done, pad, token)
            done = done | ended(token)
            out = updated_slice(out, {POSITION: step}, token.broadcast_axis(Axis(POSITION, 1)))
            return step + 1, out, cache, token, done

        init = (jnp.asarray(1, jnp.int32), out, cache, first, done)
        _, out, cache, _, _ = jax.lax.while_loop(cond, body, init)
    return out, cache
