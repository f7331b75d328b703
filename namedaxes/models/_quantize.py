"""``quantize``: a model whose weights are stored in int8 or float8 for inference."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax

from .. import nn
from .._errors import QuantizationError, did_you_mean, format_names
from ..nn._precision import as_rules, picks
from ..nn._quantized import FORMATS

__all__ = ["is_quantized", "quantize"]


def _layer(node: Any) -> bool:
    return isinstance(node, (nn.Linear, nn.Embedding))


def _names(layer: nn.Linear | nn.Embedding) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(the names the rules see, the contracted axes)`` of a layer's matmul."""
    if isinstance(layer, nn.Linear):
        ins = tuple(a.name for a in layer.In)
        return ins + tuple(a.name for a in layer.Out), ins
    return (layer.Vocab.name, layer.Embed.name), (layer.Embed.name,)


def is_quantized(tree: Any) -> bool:
    """Whether ``tree`` holds a :class:`~namedaxes.nn.QuantizedArray`."""
    leaves = jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, nn.QuantizedArray))
    return any(isinstance(x, nn.QuantizedArray) for x in leaves)


def quantize(model: Any, format: str, *, rules: Any = None) -> Any:  # noqa: A002 - the word
    """A copy of ``model`` whose layers' weights are stored in ``format``, for inference.

    Weight-only quantization: each picked weight becomes a :class:`~namedaxes.nn.QuantizedArray`,
    ``int8`` (symmetric, rounded) or ``float8`` (e4m3) values with one float32 scale per output
    channel (per slice over the axes the layer contracts; stacked layers get one per layer too),
    named like the weight. The values keep the weight's sharding (a model loaded onto a mesh stays
    placed by its mapping); the scales are placed by the mapping in force, as layers read them,
    else by the weight's entries of their axes (:meth:`~namedaxes.nn.QuantizedArray.of`). Layers
    read the narrow values (converted to the compute dtype where they multiply; a mixture of
    experts' grouped kernel converts them tile by tile) and scale the products, so the model
    runs, and :func:`generate` decodes, as before, with a quarter (from float32) or half (from
    bfloat16) of the weight bytes. ``model`` itself is not changed: keep it for :func:`save_hf`,
    which refuses a quantized model.

    Which layers: those the rules pick by the names of their matmul's axes, as for float8
    matmuls: ``rules`` first, then ``namedaxes.nn.MATMUL_RULES`` (by default every ``Linear``
    but the output head, the router and a shared-expert gate). An ``Embedding`` is a layer named
    ``vocab`` and ``embed``: ``{"vocab": True}`` adds the head and every embedding table, the
    input embedding of an untied model too (its lookups read it dequantized).

    Args:
        model: A :class:`Transformer`, or any pytree of ``namedaxes.nn`` layers.
        format: ``"int8"`` or ``"float8"`` (also ``"fp8"``).
        rules: ``(axis name, True/False)`` pairs or a ``{name: bool}`` dict, before the
            defaults; ``"*"`` names every layer.

    Returns:
        The quantized model (the arrays of the layers left alone are shared, not copied).

    Raises:
        QuantizationError: for an unknown format, a model that is already quantized, a rule
            whose name (other than ``"*"``) is no axis of any of the model's layers (named, with
            the closest axis name and the layers' axes), or a model of which the rules pick no
            layer (none at all, or only layers the defaults keep, such as an output head alone),
            which would come back unchanged; ``rules`` that themselves decide against every
            layer (``[("*", False)]``) return it unchanged.
        NamedTypeError: for a rule that is not ``(name, bool)``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import namedaxes as na
        >>> from namedaxes import models
        >>> cfg = models.TransformerConfig("llama", vocab_size=64, hidden_size=16,
        ...                                intermediate_size=32, num_layers=2, num_heads=4,
        ...                                num_kv_heads=2, head_dim=4)
        >>> model = models.Transformer(cfg, key=jax.random.key(0))
        >>> small = models.quantize(model, "int8")
        >>> small.layers.stacked.mlp.up.weight.values
        NamedArray(int8, layer=2, embed=16, mlp=32)
        >>> small.layers.stacked.mlp.up.weight.scale
        NamedArray(float32, layer=2, mlp=32)
        >>> prompt = na.named(jnp.array([[5, 6, 7]]), ("batch", "position"))
        >>> models.generate(small, prompt, max_new_tokens=4)
        NamedArray(int32, batch=1, position=7)
    """
    if not isinstance(format, str) or format not in FORMATS:
        raise QuantizationError(
            f"quantize: unknown format {format!r}. Pass one of {', '.join(map(repr, FORMATS))}."
        )
    rules = as_rules(rules, "quantize rules")
    if is_quantized(model):
        raise QuantizationError(
            "quantize: this model is already quantized. Quantize the model it was made from "
            "(quantize returns a new model and leaves its argument as it was)."
        )

    _check_what_is_picked(rules, model)

    def one(node: Any) -> Any:
        if not _layer(node):
            return node
        names, contracted = _names(node)
        if not picks(rules, names):
            return node
        weight = nn.QuantizedArray.of(node.weight, format, contracted=contracted)
        return eqx.tree_at(lambda layer: layer.weight, node, weight)

    return jax.tree.map(one, model, is_leaf=_layer)


def _check_what_is_picked(rules: tuple[tuple[str, bool], ...], model: Any) -> None:
    """Refuse a rule that names no axis of any layer (it would pick nothing, silently), and a call
    that would quantize nothing: a tree without layers, or layers none of which the rules pick
    unless ``rules`` themselves decide against every one (an explicit opt-out)."""
    layers = [_names(x)[0] for x in jax.tree.leaves(model, is_leaf=_layer) if _layer(x)]
    if not layers:
        raise QuantizationError(
            f"quantize: the {type(model).__name__} holds no nn.Linear or nn.Embedding, so there "
            "is nothing to quantize. Pass a model or a pytree of namedaxes.nn layers."
        )
    names = {name for layer in layers for name in layer}
    for name, yes in rules:
        if name != "*" and name not in names:
            raise QuantizationError(
                f"quantize: the rule {name!r} -> {yes}{did_you_mean(name, sorted(names))} names no "
                f"axis of the model's layers, whose axes are {format_names(sorted(names))}, so it "
                "would pick nothing. Name an axis the layers have (or drop the rule)."
            )
    decided = lambda layer: any(n == "*" or n in layer for n, _ in rules)  # noqa: E731
    if not any(picks(rules, layer) for layer in layers) and not all(map(decided, layers)):
        raise QuantizationError(
            f"quantize: the rules pick none of the model's layers, whose axes are "
            f"{format_names(sorted(names))}, so it would come back unchanged. Add a rule that "
            "picks one (e.g. rules={'vocab': True} for an output head)."
        )
