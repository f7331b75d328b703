"""``TransformerConfig``: every family's decoder described by one set of typed fields."""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .._axis import Axis
from .._errors import ModelConfigError, NamedTypeError, did_you_mean, format_names
from ..nn import RopeScaling, activation
from ..nn._context_parallel import BALANCES, STRATEGIES
from ..nn._moe import DISPATCHES, SCORINGS
from ..nn._pipeline import check_options
from ..nn._stacked import check_gradient_checkpointing

__all__ = ["MODEL_TYPES", "RUNTIME_FIELDS", "TransformerConfig", "runtime_options"]

#: The Hugging Face ``model_type`` of each family (``_families.FAMILIES`` has one entry for each).
MODEL_TYPES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma",
    "olmo2",
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "gpt2",
)

#: The runtime options: fields that say how the model runs, not what it is (no parameter depends
#: on them). ``from_hf`` takes each as a keyword argument and ``Transformer.with_options`` changes
#: them on a loaded model; ``save_hf`` does not write them to ``config.json`` (a config is compared
#: with what a ``config.json`` reads back as without them). A new runtime option is a field of
#: ``TransformerConfig`` (checked in ``__post_init__``, used where the model is built) named here.
RUNTIME_FIELDS = (
    "context_strategy",
    "context_balance",
    "moe_dispatch",
    "capacity_factor",
    "gradient_checkpointing",
    "pipeline_microbatches",
    "pipeline_schedule",
    "pipeline_repeats",
)
NORMS = ("rms", "layer")
QK_NORMS = (None, "head", "projection")
# The fields that are True or False (a string such as "no" would be truthy).
FLAGS = (
    "norm_after",
    "gated_mlp",
    "mlp_bias",
    "qkv_bias",
    "out_bias",
    "learned_positions",
    "tie_word_embeddings",
    "norm_topk_prob",
)
# The real-number fields: (name, lowest value allowed, whether the lowest is excluded, None
# allowed). NaN and infinities are refused for all (NaN passes every comparison check).
NUMBERS = (
    ("norm_eps", 0.0, False, False),
    ("norm_weight_offset", -math.inf, False, False),
    ("rope_theta", 1.0, True, False),
    ("attention_scale", 0.0, True, True),
    ("embed_scale", 0.0, True, False),
    ("router_aux_loss_coef", 0.0, False, False),
    ("capacity_factor", 0.0, True, True),
)


@dataclass(frozen=True)
class TransformerConfig:
    """A decoder-only transformer: sizes and the options in which the families differ.

    The families are data here, not classes: Llama is the defaults; Mistral adds
    ``sliding_window``; Qwen2 ``qkv_bias``; Qwen3 ``qk_norm="head"``; Gemma
    ``norm_weight_offset=1.0``, ``activation="gelu_pytorch_tanh"`` and ``embed_scale``; OLMo 2
    ``norm_after=True`` and ``qk_norm="projection"``; GPT-2 ``norm="layer"``,
    ``learned_positions=True``, ``gated_mlp=False`` and biases everywhere. ``config_from_hf`` reads
    these fields from a Hugging Face ``config.json``.

    Mixtures of experts (Mixtral, Qwen2-MoE, Qwen3-MoE) set ``num_experts``: every layer's MLP
    is then a ``namedaxes.nn.MoE`` of ``num_experts`` gated MLPs of width
    ``moe_intermediate_size`` (default ``intermediate_size``), ``num_experts_per_tok`` of them per
    token, plus a gated shared expert of width ``shared_expert_intermediate_size`` (Qwen2-MoE).

    Logical axes of the model built from it (:class:`Transformer`): ``vocab``, ``embed``,
    ``heads``, ``kv_heads`` (only when ``num_kv_heads < num_heads``), ``head_dim``, ``mlp``,
    ``layer``, and ``max_position`` (the learned position table); with experts ``experts``,
    ``expert_mlp`` (each expert's hidden axis) and ``shared_mlp`` (the shared expert's) instead of
    ``mlp``.

    Args:
        model_type: The Hugging Face family (``"llama"``, ``"gpt2"``...), used to name tensors.
        vocab_size: Vocabulary size.
        hidden_size: Model width (the ``embed`` axis).
        intermediate_size: MLP width (the ``mlp`` axis).
        num_layers: Decoder layers (the ``layer`` axis).
        num_heads: Query heads.
        num_kv_heads: Key/value heads (divides ``num_heads``; equal for multi-head attention).
        head_dim: Features per head.
        max_position_embeddings: The context length (the learned position table's size).
        norm: ``"rms"`` (RMSNorm) or ``"layer"`` (LayerNorm with bias).
        norm_eps: The norms' epsilon (q/k norms too).
        norm_weight_offset: Norms scale by ``offset + weight`` (1.0 for Gemma).
        norm_after: Norm the attention and MLP outputs before the residual add (OLMo 2) instead
            of their inputs.
        activation: The MLP activation's Hugging Face name (see ``namedaxes.nn.activation``).
        gated_mlp: ``down(act(gate(x)) * up(x))`` (SwiGLU/GeGLU) instead of ``down(act(up(x)))``.
        mlp_bias: Biases in the MLP.
        qkv_bias: Biases in the query, key and value projections.
        out_bias: Bias in the attention output projection.
        qk_norm: ``None``, ``"head"`` (RMSNorm over ``head_dim``) or ``"projection"`` (over the
            whole projection).
        sliding_window: Keys a query sees (itself included), or ``None`` for all.
        learned_positions: A learned position table added to the embeddings (no RoPE).
        rope_theta: The RoPE base.
        rope_scaling: A ``namedaxes.nn.RopeScaling`` (``None``: plain RoPE).
        attention_scale: Multiplies the queries (default ``head_dim ** -0.5``).
        embed_scale: Multiplies the embeddings (Gemma: ``sqrt(hidden_size)``, in the parameters'
            dtype).
        tie_word_embeddings: The output head is the embedding table.
        context_strategy: How attention exchanges keys and values when a mapping splits
            ``position`` (context parallelism): ``"all_gather"``, ``"ring"``, ``"ulysses"``, or
            ``None`` to choose by sizes (see ``namedaxes.nn.dot_product_attention``). A runtime
            option.
        context_balance: ``"zigzag"`` (default): under a causal ring the model lays its
            activations out zig-zag over the context shards at its input (and back at its
            output), so that every shard does the same attention work; ``None``: the sequence
            stays in order. A runtime option.
        num_experts: Experts per layer; 0 for a dense MLP.
        num_experts_per_tok: Experts each token goes to (top-k).
        moe_intermediate_size: Each expert's width (``None``: ``intermediate_size``).
        shared_expert_intermediate_size: The width of a shared expert every token goes through,
            scaled by a sigmoid gate (``None``: no shared expert).
        norm_topk_prob: Renormalise each token's top-k routing weights to sum to 1 (Mixtral).
        router_scoring: ``"softmax"`` or ``"sigmoid"`` router scores.
        router_aux_loss_coef: The weight ``transformers`` gives the load-balancing loss in
            training (kept for ``config.json``; scale ``Transformer``'s ``aux_loss`` by it).
        moe_dispatch: How the experts run (``namedaxes.nn.MoE``'s ``dispatch``: ``"auto"``,
            ``"ragged"``, ``"grouped"``, ``"dense"``, ``"capacity"``). A runtime option.
        pipeline_microbatches: Microbatches of the pipeline when the mapping places ``layer`` on
            mesh axes (``{"layer": "stage"}``); ``None``: one per stage (see
            ``namedaxes.nn.Stacked``). A runtime option.
        pipeline_schedule: ``"gpipe"``, ``"1f1b"`` or ``"circular"``. A runtime option.
        pipeline_repeats: Blocks of layers per stage for the ``"circular"`` schedule. A runtime
            option.
        capacity_factor: Expert capacity (``namedaxes.nn.MoE``), ``None`` for dropless (as
            ``transformers``). A runtime option.
        gradient_checkpointing: What the backward pass keeps of each layer, as for
            ``namedaxes.nn.Stacked``: ``False`` (everything), ``"dots"``, ``"carry"`` (``True``),
            ``"offload"``, ``"full"``, or a ``jax.checkpoint_policies`` policy (or its name).
            Gradients are the same for all. A runtime option.
        hf_config: The ``config.json`` text this config was read from (kept so that ``save_hf``
            writes it back); not compared.
        hf_generation_config: The ``generation_config.json`` text read beside it (its bos, eos
            and pad token ids are what ``transformers``' ``generate`` uses), written back by
            ``save_hf``; ``""`` when the folder had none. Not compared.

    The runtime options (``TransformerConfig.RUNTIME_FIELDS``: ``context_strategy``,
    ``context_balance``, ``moe_dispatch``, ``capacity_factor``, ``gradient_checkpointing`` and the
    ``pipeline_*`` options) say how the model runs, not what it is: no
    parameter depends on them and ``save_hf`` does not write them. :meth:`with_options` changes
    them (and only them); so do ``from_hf``'s keyword arguments and
    ``Transformer.with_options`` for a model already built.

    Raises:
        ModelConfigError: for a ``model_type`` without a family, sizes that are not positive,
            ``num_kv_heads`` not dividing ``num_heads``, a flag (``tie_word_embeddings``,
            ``norm_after``, ``gated_mlp``, the biases...) that is not ``True``/``False``, a
            ``norm_eps``, ``rope_theta``, ``embed_scale`` or ``attention_scale`` that is not a
            finite positive number (or another real field not finite, or negative where it
            cannot be), an unknown norm, q/k norm, activation, runtime option value, or
            ``capacity_factor``/``moe_dispatch`` on a model without experts.

    Example:
        >>> from namedaxes.models import TransformerConfig
        >>> cfg = TransformerConfig("llama", vocab_size=256, hidden_size=64, intermediate_size=128,
        ...                         num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16)
        >>> cfg.axis("kv_heads"), cfg.replace(num_kv_heads=4).grouped
        (Axis(name='kv_heads', size=2), False)
    """

    RUNTIME_FIELDS: ClassVar[tuple[str, ...]] = RUNTIME_FIELDS

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int = 2048
    norm: str = "rms"
    norm_eps: float = 1e-6
    norm_weight_offset: float = 0.0
    norm_after: bool = False
    activation: str = "silu"
    gated_mlp: bool = True
    mlp_bias: bool = False
    qkv_bias: bool = False
    out_bias: bool = False
    qk_norm: str | None = None
    sliding_window: int | None = None
    learned_positions: bool = False
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    attention_scale: float | None = None
    embed_scale: float = 1.0
    tie_word_embeddings: bool = False
    context_strategy: str | None = None
    context_balance: str | None = "zigzag"
    num_experts: int = 0
    num_experts_per_tok: int = 2
    moe_intermediate_size: int | None = None
    shared_expert_intermediate_size: int | None = None
    norm_topk_prob: bool = False
    router_scoring: str = "softmax"
    router_aux_loss_coef: float = 0.001
    moe_dispatch: str = "auto"
    capacity_factor: float | None = None
    gradient_checkpointing: bool | str | Callable[..., Any] = False
    pipeline_microbatches: int | None = None
    pipeline_schedule: str = "gpipe"
    pipeline_repeats: int = 2
    hf_config: str = field(default="", compare=False, repr=False)
    hf_generation_config: str = field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.model_type not in MODEL_TYPES:
            raise ModelConfigError(
                f"TransformerConfig.model_type {self.model_type!r} is not supported"
                f"{did_you_mean(str(self.model_type), MODEL_TYPES)}. Supported model types: "
                f"{', '.join(sorted(MODEL_TYPES))}."
            )
        for name in FLAGS:
            if not isinstance(getattr(self, name), bool):
                raise ModelConfigError(
                    f"TransformerConfig.{name} must be True or False, got {getattr(self, name)!r}."
                )
        self._check_numbers()
        sizes = (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "max_position_embeddings",
        )
        for name in sizes:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ModelConfigError(
                    f"TransformerConfig.{name} must be a positive integer, got {v!r}."
                )
        if self.num_heads % self.num_kv_heads:
            raise ModelConfigError(
                f"TransformerConfig: num_kv_heads={self.num_kv_heads} must divide "
                f"num_heads={self.num_heads} (each key/value head serves a group of query heads)."
            )
        if self.norm not in NORMS:
            raise ModelConfigError(
                f"TransformerConfig.norm must be one of {NORMS}, got {self.norm!r}."
            )
        if self.qk_norm not in QK_NORMS:
            raise ModelConfigError(
                f"TransformerConfig.qk_norm must be one of {QK_NORMS}, got {self.qk_norm!r}."
            )
        if self.sliding_window is not None and (
            isinstance(self.sliding_window, bool)
            or not isinstance(self.sliding_window, int)
            or self.sliding_window < 1
        ):
            raise ModelConfigError(
                "TransformerConfig.sliding_window must be a positive integer or None, got "
                f"{self.sliding_window!r}."
            )
        if self.context_strategy is not None and self.context_strategy not in STRATEGIES:
            raise ModelConfigError(
                "TransformerConfig.context_strategy must be one of "
                f"{', '.join(map(repr, STRATEGIES))} or None (chosen by sizes), got "
                f"{self.context_strategy!r}."
            )
        if self.context_balance is not None and self.context_balance not in BALANCES:
            raise ModelConfigError(
                "TransformerConfig.context_balance must be one of "
                f"{', '.join(map(repr, BALANCES))} or None (the sequence in order), got "
                f"{self.context_balance!r}."
            )
        try:
            check_options(
                self.pipeline_microbatches, self.pipeline_schedule, self.pipeline_repeats,
                "TransformerConfig (pipeline_microbatches, pipeline_schedule, pipeline_repeats)",
            )  # fmt: skip
        except NamedTypeError as e:
            raise ModelConfigError(str(e)) from None
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            raise ModelConfigError(
                "TransformerConfig.rope_scaling must be a namedaxes.nn.RopeScaling or None, got "
                f"{self.rope_scaling!r}."
            )
        try:
            activation(self.activation)
        except Exception as e:
            raise ModelConfigError(f"TransformerConfig.activation: {e}") from None
        try:
            check_gradient_checkpointing(self.gradient_checkpointing, "TransformerConfig")
        except NamedTypeError as e:
            raise ModelConfigError(str(e)) from None
        self._check_experts()

    def _check_experts(self) -> None:
        def positive(name: str, optional: bool = False) -> None:
            v = getattr(self, name)
            if optional and v is None:
                return
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                more = " or None" if optional else ""
                raise ModelConfigError(
                    f"TransformerConfig.{name} must be a positive integer{more}, got {v!r}."
                )

        n = self.num_experts
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ModelConfigError(
                f"TransformerConfig.num_experts must be an integer >= 0 (0: dense MLP), got {n!r}."
            )
        positive("num_experts_per_tok")
        positive("moe_intermediate_size", optional=True)
        positive("shared_expert_intermediate_size", optional=True)
        if n and self.mlp_bias:
            raise ModelConfigError(
                "TransformerConfig: mlp_bias=True with experts is not supported (experts have no "
                "biases)."
            )
        if n and self.num_experts_per_tok > n:
            raise ModelConfigError(
                f"TransformerConfig: num_experts_per_tok={self.num_experts_per_tok} is more than "
                f"the {n} experts."
            )
        for name, options in (("router_scoring", SCORINGS), ("moe_dispatch", DISPATCHES)):
            if getattr(self, name) not in options:
                raise ModelConfigError(
                    f"TransformerConfig.{name} must be one of {options}, got "
                    f"{getattr(self, name)!r}."
                )
        if not n and (self.capacity_factor is not None or self.moe_dispatch != "auto"):
            given = (
                f"capacity_factor={self.capacity_factor!r}"
                if self.capacity_factor is not None
                else f"moe_dispatch={self.moe_dispatch!r}"
            )
            raise ModelConfigError(
                f"TransformerConfig: {given} applies to experts, but this {self.model_type} "
                "model has none (num_experts=0): its MLPs are dense. Leave the option out."
            )

    def _check_numbers(self) -> None:
        """Each real-number field finite and in its range, stored as a Python float."""
        for name, low, strict, optional in NUMBERS:
            v = getattr(self, name)
            if optional and v is None:
                continue
            ok = isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
            if not ok or v < low or (strict and v == low):
                rule = (
                    "a finite number"
                    if low == -math.inf
                    else f"a finite number {'>' if strict else '>='} {low:g}"
                )
                more = " or None" if optional else ""
                raise ModelConfigError(f"TransformerConfig.{name} must be {rule}{more}, got {v!r}.")
            object.__setattr__(self, name, float(v))  # a NumPy scalar would not write to JSON

    @property
    def grouped(self) -> bool:
        """Whether attention is grouped-query (fewer key/value heads than query heads)."""
        return self.num_kv_heads != self.num_heads

    def axis(self, name: str) -> Axis:
        """The model's logical axis ``name`` with its size (``"heads"``, ``"mlp"``, ...)."""
        sizes = {
            "vocab": self.vocab_size,
            "embed": self.hidden_size,
            "mlp": self.intermediate_size,
            "layer": self.num_layers,
            "heads": self.num_heads,
            "kv_heads": self.num_kv_heads,
            "q_per_kv": self.num_heads // self.num_kv_heads,
            "head_dim": self.head_dim,
            "max_position": self.max_position_embeddings,
            "experts": self.num_experts,
            "expert_mlp": self.moe_intermediate_size or self.intermediate_size,
            "shared_mlp": self.shared_expert_intermediate_size or 0,
        }
        if not sizes.get(name):
            raise ModelConfigError(
                f"TransformerConfig has no axis {name!r}. Axes: "
                f"{', '.join(k for k, v in sizes.items() if v)}."
            )
        return Axis(name, sizes[name])

    @property
    def moe(self) -> bool:
        """Whether the MLPs are mixtures of experts."""
        return self.num_experts > 0

    def replace(self, **changes: Any) -> TransformerConfig:
        """A copy with some fields changed (and checked again)."""
        return dataclasses.replace(self, **changes)

    def with_options(self, **options: Any) -> TransformerConfig:
        """A copy with some runtime options changed (and checked again): only the fields of
        ``RUNTIME_FIELDS``, which no parameter depends on.

        Raises:
            ModelConfigError: for a name that is not a runtime option (a field that describes
                the model itself, or no field at all: the message suggests the closest and lists
                the runtime options), or a value the option does not take.

        Example:
            >>> from namedaxes.models import TransformerConfig
            >>> cfg = TransformerConfig("llama", vocab_size=64, hidden_size=16,
            ...                         intermediate_size=32, num_layers=1, num_heads=2,
            ...                         num_kv_heads=1, head_dim=8)
            >>> cfg.with_options(context_strategy="ring").context_strategy
            'ring'
            >>> cfg.with_options(num_layers=2)
            Traceback (most recent call last):
            ...
            namedaxes._errors.ModelConfigError: TransformerConfig.with_options: 'num_layers' is not a runtime option but part of what the model is (its parameters or config.json). Runtime options: 'context_strategy', 'context_balance', 'moe_dispatch', ... Build another model for another num_layers.
        """
        return runtime_options(self, options, "TransformerConfig.with_options")

    def stored(self) -> TransformerConfig:
        """This config with the runtime fields (not in ``config.json``) at their defaults."""
        defaults: dict[str, Any] = {
            f.name: f.default for f in dataclasses.fields(self) if f.name in RUNTIME_FIELDS
        }
        return dataclasses.replace(self, **defaults)


def runtime_options(
    config: TransformerConfig, options: dict[str, Any], caller: str, also: tuple[str, ...] = ()
) -> TransformerConfig:
    """``config`` with the runtime ``options`` replaced, refusing any name that is not one of
    ``RUNTIME_FIELDS`` (``also``: the caller's other keywords, which a typo may be meant as)."""
    fields = [f.name for f in dataclasses.fields(config)]
    runtime = format_names(RUNTIME_FIELDS)
    for name in options:
        if name in RUNTIME_FIELDS:
            continue
        if name in fields:
            raise ModelConfigError(
                f"{caller}: {name!r} is not a runtime option but part of what the model is (its "
                f"parameters or config.json). Runtime options: {runtime}. Build another model "
                f"for another {name}."
            )
        raise ModelConfigError(
            f"{caller} got an unknown option {name!r}"
            f"{did_you_mean(name, RUNTIME_FIELDS + also)}. Runtime options: {runtime}."
        )
    return config.replace(**options) if options else config
