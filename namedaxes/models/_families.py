"""The Hugging Face families as data: how each reads and writes ``config.json`` and names its tensors.

A family is a :class:`Family`: a reader (``config.json`` dict -> :class:`TransformerConfig`
fields, with the defaults of that family's ``transformers`` config class), a writer (the inverse),
and a table saying which Hugging Face module each module of :class:`Transformer` is stored as, and
in which layout (``"linear"``: ``torch.nn.Linear``, weight ``(out, in)``; ``"conv1d"``: GPT-2's
``Conv1D``, weight ``(in, out)``; ``"norm"``; ``"embedding"``; ``"experts"``: the experts of a
layer in one tensor, ``(experts, out, in)``). Adding a family is adding one entry to ``FAMILIES``
(its reader, writer and architecture) and its name to ``_config.MODEL_TYPES``.

Mixtures of experts are stored either one tensor per expert (``...experts.{e}.w1.weight``, what
``save_pretrained`` writes by default and what older files hold; ``{e}`` is the expert index) or
fused, one 3-D tensor per layer (``...mlp.experts.gate_up_proj``, gate and up stacked on the
output, and ``...mlp.experts.down_proj``, as ``transformers`` 5 holds them in memory and writes with
``save_original_format=False``). ``modules(config, fused=...)`` gives either table.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._errors import ModelConfigError
from ..nn import RopeScaling
from ._config import MODEL_TYPES, TransformerConfig
from ._tensor_names import Module, gpt2_modules, llama_modules

__all__ = ["FAMILIES", "Family", "Module", "family_of"]


@dataclass(frozen=True)
class Family:
    """How one ``model_type`` is read, written and named (see the module docstring)."""

    model_type: str
    architecture: str
    read: Callable[[dict[str, Any]], dict[str, Any]]
    write: Callable[[TransformerConfig], dict[str, Any]]
    modules: Callable[..., list[Module]]  # (config, fused=False)
    base_prefix: str
    # Tensors some checkpoints hold that are not parameters (buffers), as name suffixes.
    ignored_suffixes: tuple[str, ...] = ()


# -- reading helpers ------------------------------------------------------------------------


def _int(raw: dict[str, Any], key: str, default: Any) -> Any:
    v = raw.get(key, default)
    return default if v is None else v


def _first(*values: Any) -> Any:
    """The first value that is not ``None`` (``0`` is a value: the config check refuses it)."""
    return next(v for v in values if v is not None)


def _rope(raw: dict[str, Any], max_positions: int, default_theta: float) -> dict[str, Any]:
    """``rope_theta`` and ``rope_scaling`` from either spelling (``rope_parameters``, or a top-level
    ``rope_theta`` with ``rope_scaling``), as transformers reads them."""
    params = dict(raw.get("rope_scaling") or raw.get("rope_parameters") or {})
    if any(isinstance(v, dict) for v in params.values()):
        raise ModelConfigError(
            "RoPE parameters per layer type (a nested rope_parameters) are not supported for "
            f"{raw.get('model_type')!r}."
        )
    theta = _first(params.get("rope_theta"), raw.get("rope_theta"), default_theta)
    factor = params.get("partial_rotary_factor", raw.get("partial_rotary_factor"))
    if factor is not None and float(factor) != 1.0:
        raise ModelConfigError(
            f"partial_rotary_factor={factor} (RoPE on part of each head) is not supported."
        )
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return {"rope_theta": float(theta), "rope_scaling": None}
    # transformers 5 (standardize_rope_params) lets a top-level original_max_position_embeddings
    # (Phi-3 style files) override the one in the RoPE settings, for llama3 and yarn alike.
    original = _first(
        raw.get("original_max_position_embeddings"),
        params.get("original_max_position_embeddings"),
        max_positions,
    )
    try:
        if kind == "linear":
            scaling = RopeScaling("linear", factor=float(params["factor"]))
        elif kind == "dynamic":
            scaling = RopeScaling(
                "dynamic",
                factor=float(params["factor"]),
                original_max_position_embeddings=max_positions,
            )
        elif kind == "llama3":
            scaling = RopeScaling(
                "llama3",
                factor=float(params["factor"]),
                low_freq_factor=float(params["low_freq_factor"]),
                high_freq_factor=float(params["high_freq_factor"]),
                original_max_position_embeddings=int(original),
            )
        elif kind == "yarn":
            f = params.get("factor")
            scaling = RopeScaling(
                "yarn",
                factor=float(f) if f is not None else max_positions / original,
                original_max_position_embeddings=int(original),
                beta_fast=float(params.get("beta_fast") or 32.0),
                beta_slow=float(params.get("beta_slow") or 1.0),
                attention_factor=params.get("attention_factor"),
                mscale=params.get("mscale"),
                mscale_all_dim=params.get("mscale_all_dim"),
                truncate=bool(params.get("truncate", True)),
            )
        else:
            raise ModelConfigError(
                f"RoPE type {kind!r} is not supported. Supported: 'default', 'linear', 'dynamic', "
                "'llama3', 'yarn'."
            )
    except KeyError as e:
        raise ModelConfigError(f"RoPE type {kind!r} needs {e.args[0]!r} in its settings.") from None
    return {"rope_theta": float(theta), "rope_scaling": scaling}


def _rope_parameters(cfg: TransformerConfig) -> dict[str, Any]:
    s = cfg.rope_scaling
    out: dict[str, Any] = {"rope_type": "default" if s is None else s.kind}
    out["rope_theta"] = cfg.rope_theta
    if s is None:
        return out
    out["factor"] = s.factor
    if s.kind == "llama3":
        out.update(
            low_freq_factor=s.low_freq_factor,
            high_freq_factor=s.high_freq_factor,
            original_max_position_embeddings=s.original_max_position_embeddings,
        )
    if s.kind == "yarn":
        out.update(
            original_max_position_embeddings=s.original_max_position_embeddings,
            beta_fast=s.beta_fast,
            beta_slow=s.beta_slow,
            truncate=s.truncate,
        )
        for key in ("attention_factor", "mscale", "mscale_all_dim"):
            if getattr(s, key) is not None:
                out[key] = getattr(s, key)
    return out


def _layer_window(raw: dict[str, Any], layers: int) -> int | None:
    """Qwen2/Qwen3: the sliding window if every layer slides, ``None`` if none does."""
    window = raw.get("sliding_window", 4096) if raw.get("use_sliding_window", False) else None
    types = raw.get("layer_types") or [
        "sliding_attention"
        if window is not None and i >= _int(raw, "max_window_layers", 28)
        else "full_attention"
        for i in range(layers)
    ]
    kinds = set(types)
    if kinds == {"full_attention"}:
        return None
    if kinds == {"sliding_attention"} and window is not None:
        return int(window)
    raise ModelConfigError(
        f"layer_types {types} mixes sliding-window and full attention layers (or names a sliding "
        "layer without a window); one kind of attention for every layer is supported."
    )


def _kv_heads(raw: dict[str, Any], default: int | None, heads: int) -> int:
    """``num_key_value_heads``: the family's default when the key is absent (``None``: as many as
    query heads), and as many as query heads when it is ``null`` (every config class's fallback)."""
    kv = raw.get("num_key_value_heads", default)
    return heads if kv is None else kv


def _llama_like(raw: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    d = defaults
    heads = _int(raw, "num_attention_heads", d["heads"])
    hidden = _int(raw, "hidden_size", d["hidden"])
    max_pos = _int(raw, "max_position_embeddings", d["max_pos"])
    out = dict(
        vocab_size=_int(raw, "vocab_size", d["vocab"]),
        hidden_size=hidden,
        intermediate_size=_int(raw, "intermediate_size", d["inter"]),
        num_layers=_int(raw, "num_hidden_layers", d["layers"]),
        num_heads=heads,
        num_kv_heads=_kv_heads(raw, d.get("kv"), heads),
        head_dim=_int(raw, "head_dim", d.get("head_dim") or hidden // heads),
        max_position_embeddings=max_pos,
        norm_eps=float(_int(raw, "rms_norm_eps", d.get("eps", 1e-6))),
        activation=_int(raw, "hidden_act", d.get("act", "silu")),
        tie_word_embeddings=bool(_int(raw, "tie_word_embeddings", d.get("tie", False))),
    )
    out.update(_rope(raw, max_pos, d.get("theta", 10000.0)))
    return out


def _bias(raw: dict[str, Any]) -> dict[str, Any]:
    b = bool(_int(raw, "attention_bias", False))
    return {"qkv_bias": b, "out_bias": b}


def _read_llama(raw: dict[str, Any]) -> dict[str, Any]:
    d = dict(vocab=32000, hidden=4096, inter=11008, layers=32, heads=32, max_pos=2048)
    return {**_llama_like(raw, d), **_bias(raw), "mlp_bias": bool(_int(raw, "mlp_bias", False))}


def _read_mistral(raw: dict[str, Any]) -> dict[str, Any]:
    d = dict(vocab=32000, hidden=4096, inter=14336, layers=32, heads=32, kv=8, max_pos=131072)
    window = raw.get("sliding_window", 4096)
    return {**_llama_like(raw, d), "sliding_window": None if window is None else int(window)}


def _read_qwen2(raw: dict[str, Any]) -> dict[str, Any]:
    d = dict(vocab=151936, hidden=4096, inter=22016, layers=32, heads=32, kv=32, max_pos=32768)
    out = _llama_like(raw, d)
    window = _layer_window(raw, out["num_layers"])
    return {**out, "qkv_bias": True, "sliding_window": window}


def _read_qwen3(raw: dict[str, Any]) -> dict[str, Any]:
    d = dict(vocab=151936, hidden=4096, inter=22016, layers=32, heads=32, kv=32, head_dim=128)
    out = _llama_like(raw, {**d, "max_pos": 32768})
    window = _layer_window(raw, out["num_layers"])
    return {**out, **_bias(raw), "qk_norm": "head", "sliding_window": window}


def _read_gemma(raw: dict[str, Any]) -> dict[str, Any]:
    d = dict(vocab=256000, hidden=3072, inter=24576, layers=28, heads=16, kv=16, head_dim=256)
    out = _llama_like(raw, {**d, "max_pos": 8192, "act": "gelu_pytorch_tanh", "tie": True})
    if raw.get("use_bidirectional_attention"):
        raise ModelConfigError("gemma with use_bidirectional_attention=true is not supported.")
    # transformers >= 4.48 (and 5, which made the fixtures) runs hidden_act as written ("gelu" is
    # the exact GELU) and ignores hidden_activation; 4.38-4.47 ran hidden_activation (tanh GELU
    # when unset) and ignored hidden_act. Where a file states both and they differ, the versions
    # run different models: refuse rather than pick one.
    legacy = raw.get("hidden_activation")
    if legacy is not None and legacy != out["activation"]:
        raise ModelConfigError(
            f"gemma: hidden_act={out['activation']!r} and hidden_activation={legacy!r} disagree "
            "(transformers 4.38-4.47 runs hidden_activation, 4.48 and later hidden_act), so which "
            "activation the weights expect is ambiguous. Set both in config.json to the one they "
            "were trained with ('gelu_pytorch_tanh' for Google's Gemma checkpoints)."
        )
    return {
        **out,
        **_bias(raw),
        "norm_weight_offset": 1.0,
        "embed_scale": math.sqrt(out["hidden_size"]),
    }


def _read_olmo2(raw: dict[str, Any]) -> dict[str, Any]:
    d = dict(vocab=50304, hidden=4096, inter=11008, layers=32, heads=32, max_pos=2048, eps=1e-5)
    return {**_llama_like(raw, d), **_bias(raw), "qk_norm": "projection", "norm_after": True}


def _experts(raw: dict[str, Any], layers: int, defaults: dict[str, Any]) -> dict[str, Any]:
    """The mixture-of-experts fields; every layer must be sparse, or every layer dense (no experts,
    or ``decoder_sparse_step``/``mlp_only_layers`` leaving none sparse: a dense model)."""
    n = _int(raw, "num_local_experts", _int(raw, "num_experts", defaults["n"]))
    step = _int(raw, "decoder_sparse_step", 1)
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ModelConfigError(
            f"{raw.get('model_type')}: decoder_sparse_step={step!r} must be a positive integer "
            "(experts in every step-th layer). Use 1 for experts in every layer."
        )
    dense_only = _int(raw, "mlp_only_layers", [])
    sparse = [i not in dense_only and n > 0 and (i + 1) % step == 0 for i in range(layers)]
    if any(sparse) and not all(sparse):
        raise ModelConfigError(
            f"{raw.get('model_type')}: decoder_sparse_step={step} and mlp_only_layers="
            f"{dense_only} give dense MLPs in layers "
            f"{[i for i, s in enumerate(sparse) if not s]} and experts in the others; a model "
            "with experts in every layer (or in none) is supported."
        )
    if float(_int(raw, "router_jitter_noise", 0.0)) != 0.0:
        raise ModelConfigError(
            f"router_jitter_noise={raw['router_jitter_noise']} (training-time noise on the router "
            "input) is not supported."
        )
    out: dict[str, Any] = dict(
        num_experts=n if any(sparse) else 0,  # transformers builds a dense MLP in every layer
        num_experts_per_tok=_int(raw, "num_experts_per_tok", defaults["k"]),
        router_aux_loss_coef=float(_int(raw, "router_aux_loss_coef", 0.001)),
    )
    if "inter" in defaults:
        out["moe_intermediate_size"] = _int(raw, "moe_intermediate_size", defaults["inter"])
        out["norm_topk_prob"] = bool(_int(raw, "norm_topk_prob", False))
    else:  # Mixtral: experts as wide as intermediate_size, weights always renormalised
        out["norm_topk_prob"] = True
    return out


def _read_mixtral(raw: dict[str, Any]) -> dict[str, Any]:
    d = dict(vocab=32000, hidden=4096, inter=14336, layers=32, heads=32, kv=8, max_pos=131072)
    out = _llama_like(raw, {**d, "eps": 1e-5, "theta": 1e6})  # MixtralConfig.default_theta
    window = raw.get("sliding_window")
    out["sliding_window"] = None if window is None else int(window)
    return {**out, **_experts(raw, out["num_layers"], dict(n=8, k=2))}


def _read_qwen2_moe(raw: dict[str, Any]) -> dict[str, Any]:
    d = dict(vocab=151936, hidden=2048, inter=5632, layers=24, heads=16, kv=16, max_pos=32768)
    out = _llama_like(raw, d)
    layers = out["num_layers"]
    if not raw.get("layer_types"):  # Qwen2MoeConfig: every other layer below max_window_layers
        use = bool(raw.get("use_sliding_window", False))
        top = _int(raw, "max_window_layers", 28)
        raw = {**raw, "layer_types": [
            "sliding_attention" if use and (i + 1) % 2 and i < top else "full_attention"
            for i in range(layers)
        ]}  # fmt: skip
    experts = _experts(raw, layers, dict(n=60, k=4, inter=1408))
    shared = _int(raw, "shared_expert_intermediate_size", 5632)
    return {
        **out,
        "qkv_bias": bool(_int(raw, "qkv_bias", True)),
        "sliding_window": _layer_window(raw, layers),
        **experts,
        "shared_expert_intermediate_size": shared if experts["num_experts"] else None,
    }


def _read_qwen3_moe(raw: dict[str, Any]) -> dict[str, Any]:
    d = dict(vocab=151936, hidden=2048, inter=6144, layers=24, heads=32, kv=4, max_pos=32768)
    out = _llama_like(raw, d)
    window = raw.get("sliding_window", 4096) if raw.get("use_sliding_window", False) else None
    return {
        **out,
        **_bias(raw),
        "qk_norm": "head",
        "sliding_window": None if window is None else int(window),
        **_experts(raw, out["num_layers"], dict(n=128, k=8, inter=768)),
    }


def _read_gpt2(raw: dict[str, Any]) -> dict[str, Any]:
    for key in ("scale_attn_by_inverse_layer_idx", "add_cross_attention"):
        if raw.get(key):
            raise ModelConfigError(f"gpt2 with {key}=true is not supported.")

    def get(key: str, alias: str, default: Any) -> Any:
        return _int(raw, key, _int(raw, alias, default))

    hidden = get("n_embd", "hidden_size", 768)
    heads = get("n_head", "num_attention_heads", 12)
    if hidden % heads:
        raise ModelConfigError(f"gpt2: n_embd={hidden} is not a multiple of n_head={heads}.")
    return dict(
        vocab_size=_int(raw, "vocab_size", 50257),
        hidden_size=hidden,
        intermediate_size=_int(raw, "n_inner", 4 * hidden),
        num_layers=get("n_layer", "num_hidden_layers", 12),
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=hidden // heads,
        max_position_embeddings=get("n_positions", "max_position_embeddings", 1024),
        norm="layer",
        norm_eps=float(_int(raw, "layer_norm_epsilon", 1e-5)),
        activation=_int(raw, "activation_function", "gelu_new"),
        gated_mlp=False,
        mlp_bias=True,
        qkv_bias=True,
        out_bias=True,
        learned_positions=True,
        attention_scale=None if _int(raw, "scale_attn_weights", True) else 1.0,
        tie_word_embeddings=bool(_int(raw, "tie_word_embeddings", True)),
    )


# -- writing --------------------------------------------------------------------------------


def _write_llama_like(cfg: TransformerConfig, extra: dict[str, Any]) -> dict[str, Any]:
    rope = _rope_parameters(cfg)
    # Both spellings: transformers 5 reads rope_parameters (rope_scaling first, when set, with the
    # top-level rope_theta as its default), transformers 4 only rope_theta and rope_scaling (and
    # would silently run theta 10000 without them; its rope_scaling has no rope_theta key).
    legacy = (
        None if cfg.rope_scaling is None else {k: v for k, v in rope.items() if k != "rope_theta"}
    )
    return {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.max_position_embeddings,
        "hidden_act": cfg.activation,
        "rms_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "rope_parameters": rope,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": legacy,
        **extra,
    }


def _sliding(cfg: TransformerConfig) -> dict[str, Any]:
    if cfg.sliding_window is None:
        return {"use_sliding_window": False, "sliding_window": None}
    return {
        "use_sliding_window": True,
        "sliding_window": cfg.sliding_window,
        "max_window_layers": 0,
    }


def _write_experts(c: TransformerConfig, qwen: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "num_experts_per_tok": c.num_experts_per_tok,
        "router_aux_loss_coef": c.router_aux_loss_coef,
    }
    if not qwen:
        return {**out, "num_local_experts": c.num_experts, "router_jitter_noise": 0.0}
    return {
        **out,
        "num_experts": c.num_experts,
        "moe_intermediate_size": c.moe_intermediate_size,
        "norm_topk_prob": c.norm_topk_prob,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    }


def _write_qwen2_moe(c: TransformerConfig) -> dict[str, Any]:
    kind = "full_attention" if c.sliding_window is None else "sliding_attention"
    return _write_llama_like(c, {
        **_sliding(c),
        "layer_types": [kind] * c.num_layers,
        "qkv_bias": c.qkv_bias,
        "shared_expert_intermediate_size": c.shared_expert_intermediate_size,
        **_write_experts(c, qwen=True),
    })  # fmt: skip


WRITERS: dict[str, Callable[[TransformerConfig], dict[str, Any]]] = {
    "llama": lambda c: _write_llama_like(c, {"attention_bias": c.qkv_bias, "mlp_bias": c.mlp_bias}),
    "mistral": lambda c: _write_llama_like(c, {"sliding_window": c.sliding_window}),
    "qwen2": lambda c: _write_llama_like(c, _sliding(c)),
    "qwen3": lambda c: _write_llama_like(c, {"attention_bias": c.qkv_bias, **_sliding(c)}),
    "gemma": lambda c: _write_llama_like(  # hidden_activation: what transformers 4.38-4.47 runs
        c, {"attention_bias": c.qkv_bias, "hidden_activation": c.activation}
    ),
    "olmo2": lambda c: _write_llama_like(c, {"attention_bias": c.qkv_bias}),
    "mixtral": lambda c: _write_llama_like(
        c, {"sliding_window": c.sliding_window, **_write_experts(c, qwen=False)}
    ),
    "qwen2_moe": _write_qwen2_moe,
    "qwen3_moe": lambda c: _write_llama_like(
        c, {"attention_bias": c.qkv_bias, **_sliding(c), **_write_experts(c, qwen=True)}
    ),
    "gpt2": lambda c: {
        "vocab_size": c.vocab_size,
        "n_embd": c.hidden_size,
        "n_inner": c.intermediate_size,
        "n_layer": c.num_layers,
        "n_head": c.num_heads,
        "n_positions": c.max_position_embeddings,
        "layer_norm_epsilon": c.norm_eps,
        "activation_function": c.activation,
        "scale_attn_weights": c.attention_scale is None,
        "tie_word_embeddings": c.tie_word_embeddings,
    },
}


_ARCH = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma": "GemmaForCausalLM",
    "olmo2": "Olmo2ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "gpt2": "GPT2LMHeadModel",
}
_READERS = {
    "llama": _read_llama,
    "mistral": _read_mistral,
    "qwen2": _read_qwen2,
    "qwen3": _read_qwen3,
    "gemma": _read_gemma,
    "olmo2": _read_olmo2,
    "mixtral": _read_mixtral,
    "qwen2_moe": _read_qwen2_moe,
    "qwen3_moe": _read_qwen3_moe,
    "gpt2": _read_gpt2,
}

FAMILIES: dict[str, Family] = {
    name: Family(
        model_type=name,
        architecture=_ARCH[name],
        read=_READERS[name],
        write=WRITERS[name],
        modules=gpt2_modules if name == "gpt2" else llama_modules,
        base_prefix="transformer." if name == "gpt2" else "model.",
        ignored_suffixes=(".attn.bias", ".attn.masked_bias")
        if name == "gpt2"
        else (".rotary_emb.inv_freq",),
    )
    for name in MODEL_TYPES  # TransformerConfig accepts these model types
}


def family_of(model_type: Any) -> Family:
    """The family of ``model_type``.

    Raises:
        ModelConfigError: if it is not supported (the message lists the supported ones).
    """
    try:
        return FAMILIES[model_type]
    except (KeyError, TypeError):
        raise ModelConfigError(
            f"model_type {model_type!r} is not supported. Supported model types: "
            f"{', '.join(sorted(FAMILIES))}."
        ) from None
