"""Decoder-only language models read from and written to Hugging Face checkpoints.

One :class:`Transformer` (``namedaxes.nn`` layers, named axes throughout) covers the families
``llama`` (RoPE scalings ``default``, ``linear``, ``dynamic``, ``llama3``, ``yarn``), ``mistral``,
``qwen2``, ``qwen3``, ``gemma``, ``olmo2``, ``gpt2`` and the mixtures of experts ``mixtral``,
``qwen2_moe`` and ``qwen3_moe``; a :class:`TransformerConfig` says how they differ. :func:`from_hf` reads a ``config.json`` + safetensors folder straight into the shardings a
mapping gives; :func:`save_hf` writes the tensors back with the names and layouts ``transformers``
uses.

Example:
    >>> import jax, tempfile
    >>> from namedaxes import models
    >>> cfg = models.TransformerConfig("llama", vocab_size=64, hidden_size=16, intermediate_size=32,
    ...                                num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8)
    >>> folder = tempfile.mkdtemp()
    >>> models.save_hf(models.Transformer(cfg, key=jax.random.key(0)), folder)
    >>> models.config_from_hf(folder) == cfg
    True
"""

from ._config import TransformerConfig as TransformerConfig
from ._families import FAMILIES as _FAMILIES
from ._generate import filter_logits as filter_logits
from ._generate import generate as generate
from ._hf import config_from_hf as config_from_hf
from ._hf import from_hf as from_hf
from ._hf import hf_config as hf_config
from ._hf import save_hf as save_hf
from ._quantize import quantize as quantize
from ._transformer import DecoderLayer as DecoderLayer
from ._transformer import Transformer as Transformer

SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(_FAMILIES))
"""The Hugging Face ``model_type``\\s :func:`from_hf` reads."""

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "DecoderLayer",
    "Transformer",
    "TransformerConfig",
    "config_from_hf",
    "filter_logits",
    "from_hf",
    "generate",
    "hf_config",
    "quantize",
    "save_hf",
]
