"""``Transformer``: one decoder-only language model for every family, built from ``namedaxes.nn``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, overload

import equinox as eqx
import jax
import jax.numpy as jnp

from .. import nn
from .._array import NamedArray
from .._axis import Axis, AxisSpec
from .._errors import (
    AxisNotFoundError,
    AxisSizeError,
    ModelConfigError,
    NamedTypeError,
    format_axes,
)
from .._ops.creation import arange
from .._ops.hof import fold
from .._ops.shape import rename
from .._partitioning._plan import tree_axis_names
from ..nn._attention_kernels import preferred
from ..nn._common import check_ids
from ..nn._context_layout import context_shards, lay_out
from ..nn._context_parallel import strategy_for
from ..nn._kv_cache import KEY_POSITION
from ._config import TransformerConfig, runtime_options

__all__ = ["ACTIVATION_AXES", "DecoderLayer", "Transformer", "mappable_axes"]

BATCH, POSITION = "batch", "position"
#: The axes of the activations that no parameter has, as the forward pass names them: the ids'
#: ``position`` and their ``batch`` (the name the docs and ``generate``'s examples give it; the
#: model takes any batch axes), and ``key_position``, the keys' and values' positions in attention
#: and in the KV cache.
ACTIVATION_AXES = (BATCH, POSITION, KEY_POSITION)


def _norm(cfg: TransformerConfig, axis: Axis, dtype: Any) -> nn.RmsNorm | nn.LayerNorm:
    if cfg.norm == "layer":
        return nn.LayerNorm(axis, eps=cfg.norm_eps, dtype=dtype)
    return nn.RmsNorm(axis, eps=cfg.norm_eps, weight_offset=cfg.norm_weight_offset, dtype=dtype)


class DecoderLayer(eqx.Module):
    """One decoder layer: attention then MLP, each with a residual connection.

    Pre-norm (``attn_norm``, ``mlp_norm`` on the inputs of the sublayers) or, with
    ``config.norm_after``, post-norm (``attn_out_norm``, ``mlp_out_norm`` on their outputs, before
    the residual add). ``x`` is ``(..., position, embed)``. With ``config.num_experts`` the MLP is
    a ``namedaxes.nn.MoE``.

    Args:
        config: The model's configuration.
        key: PRNG key.
        dtype: The parameters' float dtype.
    """

    attn_norm: nn.RmsNorm | nn.LayerNorm | None
    attn: nn.Attention
    attn_out_norm: nn.RmsNorm | nn.LayerNorm | None
    mlp_norm: nn.RmsNorm | nn.LayerNorm | None
    mlp: nn.MLP | nn.MoE
    mlp_out_norm: nn.RmsNorm | nn.LayerNorm | None

    def __init__(self, config: TransformerConfig, *, key: jax.Array, dtype: Any = None):
        cfg = config
        Embed, HeadDim = cfg.axis("embed"), cfg.axis("head_dim")
        k_attn, k_mlp = jax.random.split(key)
        rotary = None
        if not cfg.learned_positions:
            rotary = nn.RotaryEmbedding(HeadDim, theta=cfg.rope_theta, scaling=cfg.rope_scaling)
        self.attn = nn.Attention(
            Embed,
            cfg.axis("heads"),
            HeadDim,
            key=k_attn,
            KVHeads=cfg.axis("kv_heads") if cfg.grouped else None,
            qk_norm=cfg.qk_norm or False,
            norm_eps=cfg.norm_eps,
            use_bias=cfg.qkv_bias,
            out_bias=cfg.out_bias,
            sliding_window=cfg.sliding_window,
            rotary=rotary,
            scale=cfg.attention_scale,
            context_strategy=cfg.context_strategy,
            context_balance=cfg.context_balance,
            position=POSITION,
            dtype=dtype,
        )
        if cfg.moe:
            shared = cfg.shared_expert_intermediate_size
            self.mlp = nn.MoE(
                Embed,
                cfg.axis("experts"),
                cfg.axis("expert_mlp"),
                top_k=cfg.num_experts_per_tok,
                key=k_mlp,
                activation=cfg.activation,
                gated=cfg.gated_mlp,
                scoring=cfg.router_scoring,
                normalize=cfg.norm_topk_prob,
                capacity_factor=cfg.capacity_factor,
                dispatch=cfg.moe_dispatch,
                SharedHidden=cfg.axis("shared_mlp") if shared else None,
                shared_gate=bool(shared),
                position=POSITION,
                dtype=dtype,
            )
        else:
            self.mlp = nn.MLP(
                Embed,
                cfg.axis("mlp"),
                key=k_mlp,
                activation=cfg.activation,
                gated=cfg.gated_mlp,
                use_bias=cfg.mlp_bias,
                dtype=dtype,
            )
        before = None if cfg.norm_after else (_norm(cfg, Embed, dtype), _norm(cfg, Embed, dtype))
        after = (_norm(cfg, Embed, dtype), _norm(cfg, Embed, dtype)) if cfg.norm_after else None
        self.attn_norm, self.mlp_norm = before or (None, None)
        self.attn_out_norm, self.mlp_out_norm = after or (None, None)

    def __call__(
        self,
        x: NamedArray,
        *,
        key_mask: NamedArray | None,
        positions: NamedArray,
        cache: nn.KVCache | None = None,
        token_mask: NamedArray | None = None,
        context_layout: str | None = None,
    ) -> Any:
        """The layer's output; with ``cache`` (this layer's), ``(output, cache)``; with experts
        and no cache, ``(output, router statistics)``. ``token_mask`` (``True`` at real tokens)
        is the experts' ``where``; ``context_layout`` is attention's (the layout of the
        positions of every input)."""
        a = x if self.attn_norm is None else self.attn_norm(x)
        if cache is None:
            h = self.attn(a, key_mask=key_mask, positions=positions, context_layout=context_layout)
        else:
            h, cache = self.attn(a, key_mask=key_mask, positions=positions, cache=cache)
        x = x + (h if self.attn_out_norm is None else self.attn_out_norm(h))
        h = x if self.mlp_norm is None else self.mlp_norm(x)
        stats = None
        if isinstance(self.mlp, nn.MoE):
            h, stats = self.mlp(h, where=token_mask)
        else:
            h = self.mlp(h)
        x = x + (h if self.mlp_out_norm is None else self.mlp_out_norm(h))
        if cache is not None:
            return x, cache
        return x if stats is None else (x, stats)


def _check_like_ids(x: NamedArray, what: str, ids: NamedArray) -> None:
    """``x`` (a mask or positions) has only axes of the ids, each of the ids' size."""
    for a in x.axes:
        if not ids.has_axis(a.name):
            raise AxisNotFoundError(
                f"Transformer: {what} has axis {a.name!r} that the ids "
                f"NamedArray({format_axes(ids.axes)}) lack. Give it the ids' axes."
            )
        if ids.axis_size(a.name) != a.size:
            raise AxisSizeError(
                f"Transformer: {what} NamedArray({format_axes(x.axes)}) and ids "
                f"NamedArray({format_axes(ids.axes)}) differ in the size of {a.name!r}."
            )


class Transformer(eqx.Module):
    """A decoder-only language model: ids ``(batch, position)`` -> logits ``(batch, position, vocab)``.

    Token embeddings (scaled by ``config.embed_scale``; plus a learned position table with
    ``config.learned_positions``), ``config.num_layers`` :class:`DecoderLayer`\\s stacked on the
    ``layer`` axis (``nn.Stacked``, one scan), a final norm, and the output head (the embedding
    table when ``config.tie_word_embeddings``). Every family of ``namedaxes.models`` is this class
    with another :class:`TransformerConfig`; load one with :func:`from_hf`.

    Parameters have the logical axes ``vocab``, ``embed``, ``heads``, ``kv_heads``, ``head_dim``,
    ``mlp``, ``layer`` (and ``max_position``; with experts ``experts``, ``expert_mlp`` and
    ``shared_mlp``), so one mapping such as ``{"embed": "data", "heads": "model", "mlp":
    "model", "vocab": "model"}`` places all of them; adding ``"experts": "model"`` runs the
    experts expert-parallel.

    How it runs (the context-parallel strategy, how experts are dispatched, what the backward
    pass keeps) is the config's runtime options: :meth:`with_options` gives the same parameters
    run another way, e.g. ``model.with_options(context_strategy="ring")``.

    Args:
        config: The model's configuration.
        key: PRNG key.
        dtype: The parameters' float dtype (JAX's default float when ``None``).
        gradient_checkpointing: Sets ``config.gradient_checkpointing`` (what the backward pass
            keeps of each layer: ``False``, ``"dots"``, ``"carry"``, ``"offload"``, ``"full"``
            or a ``jax.checkpoint_policies`` policy); ``None``: the config's.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import namedaxes as na
        >>> from namedaxes.models import Transformer, TransformerConfig
        >>> cfg = TransformerConfig("llama", vocab_size=64, hidden_size=16, intermediate_size=32,
        ...                         num_layers=2, num_heads=4, num_kv_heads=2, head_dim=4)
        >>> model = Transformer(cfg, key=jax.random.key(0))
        >>> ids = na.named(jnp.zeros((2, 5), jnp.int32), ("batch", "position"))
        >>> model(ids)
        NamedArray(float32, batch=2, position=5, vocab=64)
        >>> model.layers.stacked.attn.q_proj.weight
        NamedArray(float32, layer=2, embed=16, heads=4, head_dim=4)
    """

    embed: nn.Embedding
    position_embed: nn.Embedding | None
    layers: nn.Stacked[DecoderLayer]
    final_norm: nn.RmsNorm | nn.LayerNorm
    lm_head: nn.Linear | None
    config: TransformerConfig = eqx.field(static=True)

    def __init__(
        self,
        config: TransformerConfig,
        *,
        key: jax.Array,
        dtype: Any = None,
        gradient_checkpointing: bool | str | Callable[..., Any] | None = None,
    ):
        if not isinstance(config, TransformerConfig):
            raise NamedTypeError(f"Transformer needs a TransformerConfig, got {config!r}.")
        cfg = config
        if gradient_checkpointing is not None:
            cfg = cfg.with_options(gradient_checkpointing=gradient_checkpointing)
        Embed, Vocab = cfg.axis("embed"), cfg.axis("vocab")
        k_emb, k_pos, k_layers, k_head = jax.random.split(key, 4)
        self.embed = nn.Embedding(Vocab, Embed, key=k_emb, dtype=dtype)
        self.position_embed = (
            nn.Embedding(cfg.axis("max_position"), Embed, key=k_pos, dtype=dtype)
            if cfg.learned_positions
            else None
        )
        self.layers = nn.Stacked(
            cfg.axis("layer"),
            lambda k: DecoderLayer(cfg, key=k, dtype=dtype),
            key=k_layers,
            gradient_checkpointing=cfg.gradient_checkpointing,
            microbatches=cfg.pipeline_microbatches,
            schedule=cfg.pipeline_schedule,
            repeats=cfg.pipeline_repeats,
        )
        self.final_norm = _norm(cfg, Embed, dtype)
        self.lm_head = (
            None
            if cfg.tie_word_embeddings
            else nn.Linear(Embed, Vocab, key=k_head, use_bias=False, dtype=dtype)
        )
        self.config = cfg

    def with_options(self, **options: Any) -> Transformer:
        """This model run another way: the same parameters (the same arrays, not copies) with
        some runtime options of its config changed.

        The runtime options are the config's fields that no parameter depends on
        (``RUNTIME_FIELDS``): ``context_strategy`` (``"all_gather"``, ``"ring"``,
        ``"ulysses"`` or ``None``), ``context_balance`` (``"zigzag"`` or ``None``: whether a
        causal ring runs on the zig-zag layout of the sequence, which the model makes at its
        input and undoes at its output), ``moe_dispatch`` (``"auto"``, ``"ragged"``, ``"grouped"``, ``"dense"``,
        ``"capacity"``), ``capacity_factor``,
        ``gradient_checkpointing``, and the pipeline's ``pipeline_microbatches``,
        ``pipeline_schedule`` and ``pipeline_repeats`` (see :class:`TransformerConfig`).
        ``from_hf`` takes the same keywords.

        Raises:
            ModelConfigError: for a name that is not a runtime option (the message lists them)
                or a value it does not take.

        Example:
            >>> import jax
            >>> from namedaxes.models import Transformer, TransformerConfig
            >>> cfg = TransformerConfig("llama", vocab_size=64, hidden_size=16, intermediate_size=32,
            ...                         num_layers=2, num_heads=4, num_kv_heads=2, head_dim=4)
            >>> model = Transformer(cfg, key=jax.random.key(0))
            >>> ring = model.with_options(context_strategy="ring", gradient_checkpointing="dots")
            >>> ring.config.context_strategy, ring.layers.stacked.attn.context_strategy
            ('ring', 'ring')
            >>> ring.embed.weight.array is model.embed.weight.array
            True
        """
        config = runtime_options(self.config, options, "Transformer.with_options")
        if config == self.config:
            return self
        like = eqx.filter_eval_shape(Transformer, config, key=jax.random.key(0))
        # Parameter by parameter: a quantized weight (models.quantize) stands where its weight does.
        leaves = jax.tree.leaves(self, is_leaf=_is_parameter)
        new, structure = jax.tree.flatten(like, is_leaf=_is_parameter)
        if [_shape(x) for x in leaves] != [_shape(x) for x in new]:
            raise ModelConfigError(  # a runtime option that changed the parameters: a bug
                f"Transformer.with_options({', '.join(options)}): these options change the "
                "parameters, so they cannot be runtime options (RUNTIME_FIELDS)."
            )
        return jax.tree.unflatten(structure, leaves)

    def init_cache(self, batch: AxisSpec, length: int, *, dtype: Any = None) -> nn.KVCache:
        """An empty :class:`~namedaxes.nn.KVCache` for every layer: ``length`` slots per row.

        Args:
            batch: The ids' batch axes, e.g. ``{"batch": 4}``.
            length: Slots per row: the prompt plus every position to generate.
            dtype: The keys' dtype: default the precision policy's compute dtype, else the
                embedding's.

        Example:
            >>> import jax
            >>> from namedaxes.models import Transformer, TransformerConfig
            >>> cfg = TransformerConfig("llama", vocab_size=64, hidden_size=16, intermediate_size=32,
            ...                         num_layers=2, num_heads=4, num_kv_heads=2, head_dim=4)
            >>> Transformer(cfg, key=jax.random.key(0)).init_cache({"batch": 2}, 10).keys
            NamedArray(float32, layer=2, batch=2, key_position=10, kv_heads=2, head_dim=4)
        """
        cfg = self.config
        if dtype is None:
            dtype = nn.current_precision().compute or self.embed.weight.dtype
        kv = cfg.axis("kv_heads") if cfg.grouped else cfg.axis("heads")
        return nn.KVCache.zeros(
            batch, kv, cfg.axis("head_dim"), length, Layer=cfg.axis("layer"), dtype=dtype
        )

    @overload
    def __call__(
        self,
        ids: NamedArray,
        attention_mask: NamedArray | None = None,
        positions: NamedArray | None = None,
        *,
        cache: None = None,
        return_aux_loss: Literal[False] = False,
    ) -> NamedArray: ...

    @overload
    def __call__(
        self,
        ids: NamedArray,
        attention_mask: NamedArray | None = None,
        positions: NamedArray | None = None,
        *,
        cache: None = None,
        return_aux_loss: Literal[True],
    ) -> tuple[NamedArray, jax.Array]: ...

    @overload
    def __call__(
        self,
        ids: NamedArray,
        attention_mask: NamedArray | None = None,
        positions: NamedArray | None = None,
        *,
        cache: nn.KVCache,
        return_aux_loss: Literal[False] = False,
    ) -> tuple[NamedArray, nn.KVCache]: ...

    def __call__(
        self,
        ids: NamedArray,
        attention_mask: NamedArray | None = None,
        positions: NamedArray | None = None,
        *,
        cache: nn.KVCache | None = None,
        return_aux_loss: bool = False,
    ) -> NamedArray | tuple[NamedArray, nn.KVCache] | tuple[NamedArray, jax.Array]:
        """Logits for every position: the ids' axes plus ``vocab``.

        Args:
            ids: Integer token ids with a ``position`` axis, e.g. ``(batch, position)``.
            attention_mask: Boolean ``(batch, position)`` (or ``(position,)``), ``True`` at real
                tokens, one contiguous run of them per row (left or right padding): keys at
                ``False`` are never attended to. It goes to the attention kernel as its
                ``key_mask``.
            positions: Integer position ids with the ``position`` axis (e.g. ``(batch,
                position)``, counted from each row's first real token); default ``0 .. n-1``
                (with a cache: its ``index`` onwards).
            cache: A :class:`~namedaxes.nn.KVCache` from :meth:`init_cache`: the ids are the
                positions after those already in it; the call then returns ``(logits, cache)``.
            return_aux_loss: Also return the router's load-balancing loss (``aux_loss`` of
                ``transformers`` with ``output_router_logits=True``, over the tokens of
                ``attention_mask``; unscaled: add ``config.router_aux_loss_coef`` times it to the
                training loss): ``(logits, aux_loss)``; 0.0 for a model without experts. Not
                with a cache.

        Raises:
            NamedTypeError: if ``ids``/``positions`` are not integer NamedArrays or the mask is
                not boolean.
            AxisNotFoundError: if an input lacks ``position``, or the mask or the positions have
                an axis the ids lack.
            AxisSizeError: if an axis of the mask or the positions has another size than the
                ids' axis of that name.
            AxisIndexError: for concrete ids outside the vocabulary, or (learned positions, as
                GPT-2's) positions outside the learned table (both named; inside ``jit`` their
                logits are NaN instead).
        """
        if return_aux_loss and cache is not None:
            raise NamedTypeError(
                "Transformer: return_aux_loss=True is for training, without a cache; call the "
                "model with cache=None."
            )
        h, cache, aux = self._forward(ids, attention_mask, positions, cache)
        logits = self.logits(h)
        if cache is not None:
            return logits, cache
        return (logits, aux) if return_aux_loss else logits

    def logits(self, hidden: NamedArray) -> NamedArray:
        """The output head: hidden states (after the final norm) ``(..., embed)`` -> ``(..., vocab)``."""
        return self.embed.unembed(hidden) if self.lm_head is None else self.lm_head(hidden)

    @overload
    def hidden_states(
        self,
        ids: NamedArray,
        attention_mask: NamedArray | None = None,
        positions: NamedArray | None = None,
        *,
        cache: None = None,
    ) -> NamedArray: ...

    @overload
    def hidden_states(
        self,
        ids: NamedArray,
        attention_mask: NamedArray | None = None,
        positions: NamedArray | None = None,
        *,
        cache: nn.KVCache,
    ) -> tuple[NamedArray, nn.KVCache]: ...

    def hidden_states(
        self,
        ids: NamedArray,
        attention_mask: NamedArray | None = None,
        positions: NamedArray | None = None,
        *,
        cache: nn.KVCache | None = None,
    ) -> NamedArray | tuple[NamedArray, nn.KVCache]:
        """The last layer's outputs after the final norm, ``(..., position, embed)``; the
        arguments are those of calling the model (:meth:`logits` turns them into logits)."""
        h, cache, _ = self._forward(ids, attention_mask, positions, cache)
        return h if cache is None else (h, cache)

    def _forward(
        self,
        ids: NamedArray,
        attention_mask: NamedArray | None,
        positions: NamedArray | None,
        cache: nn.KVCache | None,
    ) -> tuple[NamedArray, nn.KVCache | None, jax.Array]:
        """Hidden states after the final norm, the cache (or ``None``) and the experts'
        load-balancing loss (0.0 without experts or with a cache)."""
        pos = _position_axis(ids, "ids", integer=True)
        if cache is not None and not isinstance(cache, nn.KVCache):
            raise NamedTypeError(f"Transformer cache must be a KVCache or None, got {cache!r}.")
        if positions is None:
            positions = arange(pos) if cache is None else arange(pos) + cache.index
        elif _position_axis(positions, "positions", integer=True) != pos:
            raise AxisSizeError(
                f"Transformer: positions NamedArray({format_axes(positions.axes)}) and ids "
                f"NamedArray({format_axes(ids.axes)}) differ in the size of 'position'."
            )
        key_mask = None
        if attention_mask is not None:
            if _position_axis(attention_mask, "attention_mask", integer=False) != pos:
                raise AxisSizeError(
                    f"Transformer: attention_mask NamedArray({format_axes(attention_mask.axes)}) "
                    f"and ids NamedArray({format_axes(ids.axes)}) differ in the size of "
                    "'position'."
                )
            _check_like_ids(attention_mask, "attention_mask", ids)
        if positions is not None:
            _check_like_ids(positions, "positions", ids)
        layout = split = None
        if cache is None:
            layout, split = self._context_layout(ids)
        if layout is not None:  # laid out once for all the layers: see _context_layout
            # all alike: default positions and a mask may be placed otherwise than the ids
            ids, positions, attention_mask = lay_out(
                (ids, positions, attention_mask), pos.name, split
            )
        if attention_mask is not None:
            key_mask = rename(attention_mask, {pos.name: KEY_POSITION})
        x = self.embed(ids)
        if self.config.embed_scale != 1.0:
            x = x * jnp.asarray(self.config.embed_scale, x.dtype)
        if self.position_embed is not None:
            # The table's own lookup would call a position past it a token outside the vocabulary.
            table = self.position_embed.Vocab
            check_ids(
                positions, table, "Transformer", what="position(s)",
                outside="the learned position table",
                fix=f"This {self.config.model_type} model learned {table.size} positions: give it "
                f"at most {table.size} positions (0 to {table.size - 1}, a cache's included), e.g. "
                "by shortening the input.",
            )  # fmt: skip
            x = x + self.position_embed(positions)
        aux = jnp.zeros((), jnp.float32)
        if cache is not None:
            x, cache = self._cached_layers(x, key_mask, positions, cache, pos.size, attention_mask)
            return self.final_norm(x), cache, aux
        kw = dict(key_mask=key_mask, positions=positions, context_layout=layout)
        if self.config.moe:
            x, stats = self.layers.scan(x, token_mask=attention_mask, **kw)
            aux = stats.load_balancing_loss()
        else:
            x = self.layers(x, **kw)
        x = self.final_norm(x)
        return (x if layout is None else lay_out(x, pos.name, split, inverse=True)), cache, aux

    def _context_layout(self, ids: NamedArray) -> tuple[str | None, tuple[Any, int]]:
        """``"zigzag"`` when attention's queries will have ``position`` split and it will run a
        causal ring balanced by ``config.context_balance``, else ``None``; and that split (mesh
        axes, shard count).

        Everything but attention works per position, so the model lays out its inputs (ids,
        positions, mask: integers and booleans) once and its hidden states back once, instead of
        every attention call moving its queries, keys, values and output in and out of the
        layout (4 exchanges per layer, and 4 more backward). Attention reads the layout over the
        shards that split its query's positions, so the split is the query's (the ids' axes
        with the heads and head size, resolved together: heads may take the mesh axis that
        ``position``'s rule names), not the ids'. Attention takes the zig-zag layout whatever
        strategy it runs, so a wrong guess of the strategy here costs time, not correctness.
        """
        cfg = self.config
        query = (cfg.axis("heads"), cfg.axis("head_dim"))
        split = context_shards(ids, POSITION, beside=query)
        shards = split[1]
        n = ids.axis_size(POSITION)
        if cfg.context_balance is None or shards == 1 or n % (2 * shards):
            return None, split
        fused = preferred() != "xla"
        strategy = strategy_for(cfg.context_strategy, n, shards, heads=cfg.num_heads, fused=fused)
        return (cfg.context_balance if strategy == "ring" else None), split

    def _cached_layers(
        self,
        x: NamedArray,
        key_mask: NamedArray | None,
        positions: NamedArray,
        cache: nn.KVCache,
        n: int,
        token_mask: NamedArray | None,
    ) -> tuple[NamedArray, nn.KVCache]:
        """The layer stack with a cache: one fold over ``layer``, each layer writing its own
        slice of the stacked keys in place (``cache.at_layer(i)``)."""
        Layer = self.layers.Layer
        if cache.keys.ndim == 0 or cache.keys.axes[0] != Layer:
            raise AxisSizeError(
                f"Transformer: the cache's keys NamedArray({format_axes(cache.keys.axes)}) need "
                f"the stack's {Layer} first; make the cache with model.init_cache(batch, length)."
            )

        def body(carry: Any, xs: Any) -> Any:
            h, keys, values, mask = carry
            layer, i = xs
            view = nn.KVCache(keys, values, mask, cache.index, i)
            h, view = layer(
                h, key_mask=key_mask, positions=positions, cache=view, token_mask=token_mask
            )
            return h, view.keys, view.values, view.mask

        init = (x, cache.keys, cache.values, cache.mask)
        xs = (self.layers.stacked, jnp.arange(Layer.size, dtype=jnp.int32))
        x, keys, values, mask = fold(body, Layer)(init, xs)
        return x, nn.KVCache(keys, values, mask, cache.index + n)


def _is_parameter(x: Any) -> bool:
    return isinstance(x, (NamedArray, nn.QuantizedArray))


def _shape(x: Any) -> Any:
    return x.axes if _is_parameter(x) else jnp.shape(x)


def _position_axis(x: Any, what: str, *, integer: bool) -> Axis:
    kind = "an integer" if integer else "a boolean"
    ok = isinstance(x, NamedArray) and (
        jnp.issubdtype(x.dtype, jnp.integer) if integer else x.dtype == jnp.bool_
    )
    if not ok:
        raise NamedTypeError(
            f"Transformer: {what} must be {kind} NamedArray with a 'position' axis, e.g. "
            f"named(array, ('batch', 'position')), got {x!r}."
        )
    if not x.has_axis(POSITION):
        raise AxisNotFoundError(
            f"Transformer: {what} NamedArray({format_axes(x.axes)}) has no {POSITION!r} axis. "
            f"Rename its sequence axis to {POSITION!r}."
        )
    return x.resolve_axis(POSITION)


def mappable_axes(model: Transformer) -> frozenset[str]:
    """Every axis name a mapping can place in ``model`` (concrete or from ``eval_shape``): its
    parameters' and ``ACTIVATION_AXES``."""
    return tree_axis_names(model) | frozenset(ACTIVATION_AXES)
