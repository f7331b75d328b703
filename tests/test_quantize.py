"""models.quantize and nn.QuantizedArray: int8/float8 weights with per-channel scales, dequantized
where layers read them; against transformers' logits and greedy tokens (tests/fixtures/hf), placed
by the model's mapping on Auto and Explicit meshes; what a quantized model refuses."""

import functools
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import equations, spec_of
from jax.sharding import PartitionSpec as P

import namedaxes as na
from namedaxes import models

FIXTURES = Path(__file__).parent / "fixtures" / "hf"
MAPPING = {"batch": "data", "heads": "model", "mlp": "model", "vocab": "model"}
# The largest logit difference from transformers' float32 logits, as a share of the largest logit.
# Per output channel, int8 rounds each weight by at most 1/254 of the channel's largest one and
# e4m3 by at most 1/16 of the weight itself; through two layers the fixtures' logits (llama, qwen3)
# move by 0.5-1.1% (int8) and 2.5-5.3% (float8) of their largest value, the head quantized or not.
LOGITS_TOL = {"int8": 0.02, "float8": 0.08}


@functools.cache
def load(name):
    return models.from_hf(FIXTURES / name)


def ids(a):
    return na.named(jnp.asarray(a, jnp.int32), ("batch", "position"))


@functools.cache
def forward():
    return jax.jit(lambda model, tokens: model(tokens))


@pytest.mark.parametrize(
    "name,fmt,rules", [("llama", "int8", None), ("qwen3", "float8", {"vocab": True})]
)
def test_quantized_model_keeps_transformers_logits_and_greedy_tokens(name, fmt, rules):
    """Logits within LOGITS_TOL of transformers'; at every position of the reference ids the
    quantized model's most likely next token is transformers' on >= 90% of them (measured: 98-100%,
    the others near-ties: top-2 gaps below the logits' error); greedy generate, unchanged, gives
    transformers' greedy tokens on >= 90% of the new positions (measured: all). Qwen3's tied
    embedding is quantized too (lookup and head)."""
    ref = np.load(FIXTURES / name / "reference.npz")
    model = load(name)
    small = models.quantize(model, fmt, rules=rules)
    logits = np.asarray(forward()(small, ids(ref["input_ids"])).array)
    want = ref["logits"]
    assert np.abs(logits - want).max() <= LOGITS_TOL[fmt] * np.abs(want).max()
    assert np.abs(logits - want).max() > 1e-4  # the weights did change
    assert (logits.argmax(-1) == want.argmax(-1)).mean() >= 0.9
    prompt = ref["prompt"]
    out = models.generate(small, ids(prompt), max_new_tokens=12).array
    n = prompt.shape[1]
    assert (np.asarray(out)[:, n:] == ref["greedy"][:, n:]).mean() >= 0.9
    # quantize made a new model: the original's weights are as loaded
    assert model.layers.stacked.mlp.up.weight.dtype == jnp.float32


def test_weights_scales_and_which_layers():
    """Per output channel (and per layer of the stack): the scale has the weight's axes but the
    contracted ones and maps each channel's largest weight to 127; the head, the embedding and
    norms stay by default, a rule adds the head (tied: the embedding table)."""
    model = load("qwen3")  # tied head, q/k norms
    small = models.quantize(model, "int8")
    up = small.layers.stacked.mlp.up.weight
    w = model.layers.stacked.mlp.up.weight
    assert isinstance(up, na.nn.QuantizedArray) and up.values.axes == w.axes
    assert up.values.dtype == jnp.int8 and up.scale.dtype == jnp.float32
    assert up.scale.axis_names == ("layer", "mlp")
    amax = abs(w).max("embed")
    np.testing.assert_allclose(up.scale.array, (amax / 127).array, rtol=1e-6)
    assert int(abs(up.values.astype(jnp.int32)).max().scalar()) == 127
    error = abs(up.dequantize() - w)
    assert bool((error <= up.scale / 2 * (1 + 1e-5)).all())  # rounded to the nearest step
    o = small.layers.stacked.attn.o_proj.weight  # contracts (heads, head_dim)
    assert o.scale.axis_names == ("layer", "embed")
    assert small.embed.weight.array is model.embed.weight.array  # the same arrays
    norm = small.layers.stacked.attn.q_norm.weight
    assert norm.array is model.layers.stacked.attn.q_norm.weight.array
    head = models.quantize(model, "float8", rules={"vocab": True}).embed.weight
    assert head.values.dtype == jnp.float8_e4m3fn and head.scale.axis_names == ("vocab",)
    none = models.quantize(model, "fp8", rules=[("*", False)])
    assert not models._quantize.is_quantized(none)


@pytest.mark.parametrize("fmt", ["int8", "float8"])
def test_a_quantized_linear_reads_the_narrow_values_and_scales_its_result(fmt):
    """The matmul's weight operand is the narrow values, only converted (the operand a GEMM with
    mixed dtypes fuses; decoding reads a byte per weight), and the per-channel scales multiply the
    result, not the weight: no operation the size of the weight but the conversion. The result
    equals dequantizing first, up to float32 rounding."""
    lin = na.nn.Linear(na.Axis("embed", 16), {"mlp": 32}, key=jax.random.key(0), use_bias=False)
    small = eqx.tree_at(
        lambda m: m.weight, lin, na.nn.QuantizedArray.of(lin.weight, fmt, contracted=("embed",))
    )
    x = na.random.normal(jax.random.key(1), {"batch": 4, "embed": 16})
    jaxpr = jax.make_jaxpr(lambda m, x: m(x))(small, x).jaxpr
    [dot] = [e for e in equations(jaxpr) if e.primitive.name == "dot_general"]
    [convert] = [e for e in equations(jaxpr) if dot.invars[1] in e.outvars]
    assert convert.primitive.name == "convert_element_type"
    assert convert.invars[0].aval.dtype == small.weight.values.dtype
    weight_sized = [e for e in equations(jaxpr) if e is not convert and e.outvars
                    and e.outvars[0].aval.shape == small.weight.values.shape]  # fmt: skip
    assert weight_sized == []
    want = na.dot(x, small.weight.dequantize(), axis="embed")
    np.testing.assert_allclose(small(x).array, want.array, rtol=1e-6, atol=1e-6)


def test_quantized_weights_are_placed_by_the_models_mapping(mesh_2x4):
    """A model loaded onto a mesh: the values keep each weight's sharding and the scales take the
    entries of their axes; the model runs under its mapping (tensor-parallel heads, mlp and vocab)
    with the logits of the quantized model on one device."""
    ref = np.load(FIXTURES / "llama" / "reference.npz")
    want = np.asarray(
        forward()(models.quantize(load("llama"), "int8"), ids(ref["input_ids"])).array
    )
    with jax.set_mesh(mesh_2x4), na.axis_mapping(MAPPING):
        model = models.from_hf(FIXTURES / "llama", mapping=MAPPING)
        small = models.quantize(model, "int8")
        q = small.layers.stacked.attn.q_proj.weight
        assert spec_of(q.values) == spec_of(model.layers.stacked.attn.q_proj.weight)
        assert spec_of(q.values) == P(None, None, "model")
        assert spec_of(q.scale) == P(None, "model")  # (layer, heads, head_dim)
        assert spec_of(small.layers.stacked.mlp.down.weight.scale) == P()  # (layer, embed)
        logits = na.named_jit(lambda m, t: m(t))(small, ids(ref["input_ids"]))
        assert spec_of(logits) == P("data", None, "model")
    np.testing.assert_allclose(np.asarray(logits.array), want, atol=1e-5)


def test_what_a_quantized_model_refuses_and_keeps():
    model = load("llama")
    small = models.quantize(model, "int8")
    with pytest.raises(na.QuantizationError, match=r"save_hf: this model's weights are quantized"):
        models.save_hf(small, "unused")
    with pytest.raises(na.QuantizationError, match=r"quantize: this model is already quantized"):
        models.quantize(small, "float8")
    with pytest.raises(
        na.QuantizationError, match=r"quantize: unknown format 'int4'. Pass one of 'int8'"
    ):
        models.quantize(model, "int4")
    with pytest.raises(na.NamedTypeError, match=r"quantize rules: 'vocab' is not an \(axis name"):
        models.quantize(model, "int8", rules=["vocab"])
    # runtime options keep the quantized arrays (the same arrays)
    ring = small.with_options(context_strategy="ring")
    assert ring.layers.stacked.attn.context_strategy == "ring"
    assert ring.layers.stacked.mlp.up.weight is small.layers.stacked.mlp.up.weight
