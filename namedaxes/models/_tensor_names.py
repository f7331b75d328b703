"""Where each module of :class:`Transformer` lives in a Hugging Face checkpoint: the tensor-name
tables of the families (``_families`` says which family uses which table).
"""

from __future__ import annotations

from dataclasses import dataclass

from ._config import TransformerConfig

__all__ = ["Module", "expert_modules", "gpt2_modules", "llama_modules"]


@dataclass(frozen=True)
class Module:
    """One module of the model and where its parameters live in a Hugging Face checkpoint.

    ``ours``: the attribute path in :class:`Transformer` (``layers.`` prefixes a module inside the
    stacked decoder layers); ``hf``: the Hugging Face module name (``{i}`` is the layer index,
    ``{e}`` the expert index of one tensor per expert); ``layout``: ``"linear"``, ``"conv1d"``,
    ``"norm"``, ``"embedding"`` or ``"experts"`` (``hf`` then names the tensor itself, without a
    ``.weight`` suffix); ``part``: for fused projections, ``(index, count)`` of this module's block
    along the output (GPT-2's ``c_attn`` holds q, k and v).
    """

    ours: str
    hf: str
    layout: str
    part: tuple[int, int] | None = None


def expert_modules(cfg: TransformerConfig, fused: bool) -> list[Module]:
    """The router, the experts (one tensor each, or fused) and the shared expert of a layer."""
    L = "model.layers.{i}."
    mixtral = cfg.model_type == "mixtral"
    block = L + ("block_sparse_moe." if mixtral and not fused else "mlp.")
    rows = [Module("layers.mlp.router", block + "gate", "linear")]
    if fused:
        rows += [
            Module("layers.mlp.experts.gate", block + "experts.gate_up_proj", "experts", (0, 2)),
            Module("layers.mlp.experts.up", block + "experts.gate_up_proj", "experts", (1, 2)),
            Module("layers.mlp.experts.down", block + "experts.down_proj", "experts"),
        ]
    else:
        names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
        rows += [
            Module(f"layers.mlp.experts.{ours}", block + "experts.{e}." + hf, "linear")
            for ours, hf in zip(("gate", "up", "down"), names)
        ]
    if cfg.shared_expert_intermediate_size:
        rows += [
            Module(f"layers.mlp.shared.{p}", L + f"mlp.shared_expert.{p}_proj", "linear")
            for p in ("gate", "up", "down")
        ]
        rows.append(Module("layers.mlp.shared_gate", L + "mlp.shared_expert_gate", "linear"))
    return rows


def llama_modules(cfg: TransformerConfig, fused: bool = False) -> list[Module]:
    L = "model.layers.{i}."
    rows = [Module("embed", "model.embed_tokens", "embedding")]
    if cfg.norm_after:
        rows += [
            Module("layers.attn_out_norm", L + "post_attention_layernorm", "norm"),
            Module("layers.mlp_out_norm", L + "post_feedforward_layernorm", "norm"),
        ]
    else:
        rows += [
            Module("layers.attn_norm", L + "input_layernorm", "norm"),
            Module("layers.mlp_norm", L + "post_attention_layernorm", "norm"),
        ]
    rows += [Module(f"layers.attn.{p}_proj", L + f"self_attn.{p}_proj", "linear") for p in "qkvo"]
    if cfg.qk_norm is not None:
        rows += [Module(f"layers.attn.{p}_norm", L + f"self_attn.{p}_norm", "norm") for p in "qk"]
    if cfg.moe:
        rows += expert_modules(cfg, fused)
    else:
        rows += [
            Module(f"layers.mlp.{ours}", L + f"mlp.{hf}_proj", "linear")
            for ours, hf in (("gate", "gate"), ("up", "up"), ("down", "down"))
        ]
    rows.append(Module("final_norm", "model.norm", "norm"))
    if not cfg.tie_word_embeddings:
        rows.append(Module("lm_head", "lm_head", "linear"))
    return rows


def gpt2_modules(cfg: TransformerConfig, fused: bool = False) -> list[Module]:
    L = "transformer.h.{i}."
    rows = [
        Module("embed", "transformer.wte", "embedding"),
        Module("position_embed", "transformer.wpe", "embedding"),
        Module("layers.attn_norm", L + "ln_1", "norm"),
        Module("layers.mlp_norm", L + "ln_2", "norm"),
    ]
    rows += [
        Module(f"layers.attn.{p}_proj", L + "attn.c_attn", "conv1d", part=(i, 3))
        for i, p in enumerate("qkv")
    ]
    rows += [
        Module("layers.attn.o_proj", L + "attn.c_proj", "conv1d"),
        Module("layers.mlp.up", L + "mlp.c_fc", "conv1d"),
        Module("layers.mlp.down", L + "mlp.c_proj", "conv1d"),
        Module("final_norm", "transformer.ln_f", "norm"),
    ]
    if not cfg.tie_word_embeddings:
        rows.append(Module("lm_head", "lm_head", "linear"))
    return rows
