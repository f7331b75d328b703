"""models.quantize and nn.QuantizedArray: int8/float8 weights with per-channel scales, dequantized
where layers read them; against transformers' logits and greedy tokens (tests/fixtures/hf), placed
by the model's mapping on Auto and Explicit meshes; what a quantized model refuses."""

import functools
import math
import re
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
    "name,fmt,rules",
    [("llama", "int8", None), ("qwen3", "float8", {"vocab": True}), ("mixtral", "float8", None),
     ("qwen3_moe", "int8", None)],
)  # fmt: skip
def test_quantized_model_keeps_transformers_logits_and_greedy_tokens(name, fmt, rules):
    """Logits within LOGITS_TOL of transformers'; at every position of the reference ids the
    quantized model's most likely next token is transformers' on >= 90% of them (measured: 98-100%,
    the others near-ties: top-2 gaps below the logits' error); greedy generate, unchanged, gives
    transformers' greedy tokens on >= 90% of the new positions (measured: all). Qwen3's tied
    embedding is quantized too (lookup and head). The mixtures of experts run the grouped
    dispatch, whose kernel reads the quantized experts' narrow values: Mixtral in float8 agrees
    on 92% of the positions, Qwen3-MoE in int8 on all (in float8 on 85%: at the 7 of 48 positions
    that differ, transformers' top-2 gap, 0.001-0.009, is below the row's logits error)."""
    ref = np.load(FIXTURES / name / "reference.npz")
    model = load(name)
    small = models.quantize(model, fmt, rules=rules)
    if "experts" in small.layers.stacked.mlp.__dict__:  # a mixture of experts
        small = small.with_options(moe_dispatch="grouped")
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
    quantized = lambda x: isinstance(x, na.nn.QuantizedArray)  # noqa: E731
    assert not any(map(quantized, jax.tree.leaves(model, is_leaf=quantized)))


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


@pytest.mark.parametrize("fmt", ["int8", "float8"])
def test_a_float16_computation_scales_in_float32(fmt):
    """Weights of 1e-5 have scales of 1e-7 to 1e-8, which float16 cannot hold (its smallest
    normal number is 6e-5, its smallest 6e-8): under compute=float16 a quantized layer's dot
    writes float32 and the float32 scales multiply it before the cast, so the result is the
    dequantized weight's within float16's rounding (it was all zeros); dequantize(float16) is the
    float32 weight rounded to float16."""
    lin = na.nn.Linear(na.Axis("embed", 64), {"mlp": 8}, key=jax.random.key(0), use_bias=False)
    weight = na.nn.QuantizedArray.of(lin.weight * 1e-5, fmt, contracted="embed")
    small = eqx.tree_at(lambda m: m.weight, lin, weight)
    x = na.random.normal(jax.random.key(1), {"batch": 4, "embed": 64})
    want = na.dot(x, weight.dequantize(jnp.float32), axis="embed").array
    with na.nn.precision("compute=float16"):
        y = small(x)
    assert y.dtype == jnp.float16
    err = np.abs(np.asarray(y.array, np.float32) - want).max()
    assert err <= 0.01 * np.abs(want).max()  # measured: 0.0012
    half = weight.dequantize(jnp.float16).array
    np.testing.assert_array_equal(half, weight.dequantize(jnp.float32).array.astype(jnp.float16))
    assert bool((jnp.abs(half).max(0) > 0).all())  # no channel flushed to zero


def test_quantized_experts_under_float16_scale_in_float32():
    """A quantized MoE's dense dispatch dequantized its experts in float16: weights of 1e-5
    lost their small channels (error 1.2e-5 on outputs of 2.3e-5); scaled in float32 it errs as
    the same model with its weights dequantized beforehand does."""
    moe = na.nn.MoE(
        {"embed": 16}, na.Axis("experts", 4), {"expert_mlp": 8}, top_k=2,
        key=jax.random.key(1), dispatch="dense",
    )  # fmt: skip
    moe = eqx.tree_at(lambda m: m.experts.up.weight, moe, moe.experts.up.weight * 1e-5)
    small = models.quantize(moe, "int8")
    plain = jax.tree.map(
        lambda v: v.dequantize() if isinstance(v, na.nn.QuantizedArray) else v,
        small, is_leaf=lambda v: isinstance(v, na.nn.QuantizedArray),
    )  # fmt: skip
    x = na.random.normal(jax.random.key(3), {"batch": 2, "position": 4, "embed": 16})
    run = jax.jit(lambda m, x: m(x)[0].array)  # traced under the policy in force
    want = np.asarray(run(small, x))
    with na.nn.precision("compute=float16"):
        got, ref = run(small, x), run(plain, x)
    err = np.abs(np.asarray(got, np.float32) - want).max()
    assert err <= 2 * np.abs(np.asarray(ref, np.float32) - want).max() + 1e-9  # measured: equal


def test_quantized_array_takes_a_name_and_refuses_what_it_cannot_hold():
    """A bare axis name is one contracted axis (it was read letter by letter); a format that is
    not a string, and a dtype to dequantize to that is not floating (int32 truncated the weight
    to zeros, bool gave booleans), are refused, naming them."""
    w = na.random.normal(jax.random.key(0), {"embed": 4, "mlp": 3})
    q = na.nn.QuantizedArray.of(w, "int8", contracted="embed")
    assert q.scale.axis_names == ("mlp",)
    np.testing.assert_array_equal(
        q.scale.array, na.nn.QuantizedArray.of(w, "int8", contracted=("embed",)).scale.array
    )
    with pytest.raises(
        na.NamedTypeError,
        match=r"^QuantizedArray.of: the weight NamedArray\(float32, embed=4, mlp=3\) has no axis "
        r"'embd' \(did you mean 'embed'\?\) to contract. Pass contracted= the axes the layer "
        r"contracts, of 'embed', 'mlp'.$",
    ):
        na.nn.QuantizedArray.of(w, "int8", contracted="embd")
    with pytest.raises(
        na.QuantizationError,
        match=r"^QuantizedArray.of: unknown format \['int8'\]. Pass one of 'int8', 'float8'",
    ):
        na.nn.QuantizedArray.of(w, ["int8"], contracted="embed")
    for dtype, name in ((jnp.int32, "int32"), ("bool", "bool")):
        with pytest.raises(
            na.NamedTypeError,
            match=rf"^QuantizedArray.dequantize needs a floating dtype, got {name}. Pass e.g.",
        ):
            q.dequantize(dtype)


def test_quantized_array_reads_contracted_axes_given_as_axis_objects():
    """contracted= as Axis objects was ignored (a list of them gave a scale per element, a single
    one a bare TypeError) and an empty one gave a scale per element silently: an Axis now counts
    by its name (and size), and naming no axis is refused."""
    w = na.random.normal(jax.random.key(0), {"embed": 4, "mlp": 3})
    by_name = na.nn.QuantizedArray.of(w, "int8", contracted="embed")
    for given in (na.Axis("embed", 4), [na.Axis("embed", 4)], ("embed",)):
        q = na.nn.QuantizedArray.of(w, "int8", contracted=given)
        assert q.scale.axis_names == ("mlp",)
        np.testing.assert_array_equal(q.scale.array, by_name.scale.array)
        np.testing.assert_array_equal(q.values.array, by_name.values.array)
    for empty in ((), []):
        with pytest.raises(
            na.NamedTypeError,
            match=rf"^QuantizedArray.of: contracted={re.escape(repr(empty))} names no axis, which "
            r"would give one scale per element. Pass the axes the layer contracts, of 'embed', "
            r"'mlp'.$",
        ):
            na.nn.QuantizedArray.of(w, "int8", contracted=empty)
    with pytest.raises(
        na.AxisSizeError,
        match=r"^Axis 'embed' has size 4 in NamedArray\(embed=4, mlp=3\), but size 8 was asked",
    ):
        na.nn.QuantizedArray.of(w, "int8", contracted=na.Axis("embed", 8))


def test_a_quantize_that_would_pick_nothing_is_refused():
    """A tree without layers, or whose layers the default rules all keep (a head alone), came
    back unchanged without a word; rules that decide against every layer themselves still
    return it unchanged."""
    w = na.random.normal(jax.random.key(0), {"embed": 4, "mlp": 3})
    with pytest.raises(
        na.QuantizationError,
        match=r"^quantize: the dict holds no nn.Linear or nn.Embedding, so there is nothing to "
        r"quantize. Pass a model or a pytree of namedaxes.nn layers.$",
    ):
        models.quantize({"w": w}, "int8")
    head = na.nn.Linear({"embed": 4}, {"vocab": 8}, key=jax.random.key(0))
    with pytest.raises(
        na.QuantizationError,
        match=r"^quantize: the rules pick none of the model's layers, whose axes are 'embed', "
        r"'vocab', so it would come back unchanged. Add a rule that picks one \(e.g. "
        r"rules=\{'vocab': True\} for an output head\).$",
    ):
        models.quantize(head, "int8")
    assert models.quantize(head, "int8", rules=[("*", False)]) is head
    assert isinstance(models.quantize(head, "int8", rules={"vocab": True}).weight,
                      na.nn.QuantizedArray)  # fmt: skip


def test_quantized_array_of_places_the_scales_by_the_mapping(mesh_2x4):
    """With a mapping in force the scales are placed as resolve places them (as shard and the
    layers that read them do): here 'mlp' takes 'data' on the scales, which the weight's 'embed'
    holds on the weight. Without one they take the weight's entries of their axes. The values
    keep the weight's sharding either way."""
    mapping = [("embed", "data"), ("mlp", "data"), ("mlp", None)]
    with jax.set_mesh(mesh_2x4), na.axis_mapping(mapping):
        lin = na.shard(na.nn.Linear({"embed": 16}, {"mlp": 8}, key=jax.random.key(0)))
        q = na.nn.QuantizedArray.of(lin.weight, "int8", contracted="embed")
        assert spec_of(lin.weight) == spec_of(q.values) == P("data")
        assert spec_of(q.scale) == spec_of(na.shard(q).scale) == P("data")
    with jax.set_mesh(mesh_2x4), na.axis_mapping({"mlp": "model"}):
        w = na.shard(lin.weight)
    q = na.nn.QuantizedArray.of(w, "int8", contracted="embed")
    assert spec_of(q.values) == P(None, "model") and spec_of(q.scale) == P("model")


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


def test_a_rule_that_names_no_layer_axis_is_refused():
    """A typo in a rule's name picked nothing and left the head unquantized without a word."""
    model = load("llama")
    with pytest.raises(
        na.QuantizationError,
        match=r"^quantize: the rule 'vocabb' -> True \(did you mean 'vocab'\?\) names no axis of "
        r"the model's layers, whose axes are 'embed', 'head_dim', 'heads', 'kv_heads', 'mlp', "
        r"'vocab', so it would pick nothing\. Name an axis the layers have \(or drop the rule\)\.$",
    ):
        models.quantize(model, "int8", rules={"vocabb": True})
    with pytest.raises(na.QuantizationError, match=r"the rule 'experts' -> False names no axis"):
        models.quantize(model, "int8", rules=[("*", True), ("experts", False)])
    # "*" and the names the layers have are taken
    small = models.quantize(model, "int8", rules=[("vocab", True), ("*", False)])
    assert isinstance(small.lm_head.weight, na.nn.QuantizedArray)
    assert not isinstance(small.layers.stacked.mlp.up.weight, na.nn.QuantizedArray)


# -- a mixture of experts -------------------------------------------------------------------------

MIXTRAL = models.TransformerConfig(
    "mixtral", vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=2, num_heads=4,
    num_kv_heads=2, head_dim=4, num_experts=4, num_experts_per_tok=2,
)  # fmt: skip
DISPATCHES = {  # with_options of each dispatch
    "grouped": dict(moe_dispatch="grouped"),
    "ragged": dict(moe_dispatch="ragged"),
    "dense": dict(moe_dispatch="dense"),
    "capacity": dict(moe_dispatch="capacity", capacity_factor=4.0),
}


def dequantized(model):
    """The model whose quantized weights are replaced by what they stand for (values x scales)."""
    quantized = lambda x: isinstance(x, na.nn.QuantizedArray)  # noqa: E731
    return jax.tree.map(lambda x: x.dequantize() if quantized(x) else x, model, is_leaf=quantized)


@pytest.mark.parametrize("fmt", ["int8", "float8"])
def test_a_quantized_moe_reads_its_experts_narrow(fmt):
    """The routed experts' quantized weights (values and scales per expert and output column) go
    into the experts' products as stored: the grouped kernel reads the narrow values, converts
    them tile by tile inside and scales its sums, so no expert-weight-sized array is made outside
    it (before, every step made the whole dequantized weight first); the other dispatches scale
    them where they multiply. Every dispatch gives the logits of the model whose weights are the
    dequantized ones, and the input's gradient goes through."""
    small = models.quantize(models.Transformer(MIXTRAL, key=jax.random.key(0)), fmt)
    plain = dequantized(small)
    ids_ = ids(np.arange(16).reshape(2, 8) % 64)
    up = small.layers.stacked.mlp.experts.up.weight.values
    assert up.dtype == jnp.dtype(fmt if fmt == "int8" else jnp.float8_e4m3fn)
    for name, options in DISPATCHES.items():
        got = forward()(small.with_options(**options), ids_).array
        want = forward()(plain.with_options(**options), ids_).array
        np.testing.assert_allclose(got, want, atol=1e-5 * float(abs(want).max()), err_msg=name)
    grouped = small.with_options(moe_dispatch="grouped")
    jaxpr = jax.make_jaxpr(lambda m, t: m(t))(grouped, ids_).jaxpr
    kernels = [e for e in equations(jaxpr) if e.primitive.name == "pallas_call"]
    # each layer's gate, up and down product reads the values as stored
    per_layer = math.prod(up.array.shape[1:])
    narrow = [v for e in kernels for v in e.invars if np.prod(v.aval.shape) == per_layer]
    assert len(kernels) == 3 and {str(v.aval.dtype) for v in narrow} == {str(up.dtype)}
    assert not [n for e in equations(jaxpr) for n in _weight_sized_one(e, per_layer)]

    moe = na.nn.MoE({"embed": 16}, na.Axis("experts", 4), {"expert_mlp": 8}, top_k=2,
                    key=jax.random.key(1), dispatch="grouped")  # fmt: skip
    moe_small = models.quantize(moe, fmt)
    x = na.random.normal(jax.random.key(3), {"batch": 2, "position": 8, "embed": 16})
    # jitted: eagerly, the kernel's interpret mode runs op by op (5 s)
    grad = jax.jit(jax.grad(lambda m, x: jnp.sum(jnp.sin(m(x)[0].array)), argnums=1))
    got, want = grad(moe_small, x).array, grad(dequantized(moe_small), x).array
    np.testing.assert_allclose(got, want, atol=1e-5 * float(abs(want).max()))


def _weight_sized_one(eqn, size):
    """An equation's results of ``size`` elements made from a narrow array (a dequantization)."""
    if eqn.primitive.name not in ("mul", "convert_element_type"):
        return []
    return [v for v in eqn.outvars if np.prod(v.aval.shape) == size]


def test_a_quantized_moe_is_placed_by_the_mapping(mesh_2x4):
    """Expert parallelism (and tensor parallelism inside the experts): the narrow values and
    their scales enter the layer's per-device function split like the weight, and the logits are
    those of the quantized model on one device."""
    small = models.quantize(models.Transformer(MIXTRAL, key=jax.random.key(0)), "int8")
    small = small.with_options(moe_dispatch="grouped")
    ids_ = ids(np.arange(16).reshape(2, 8) % 64)
    want = np.asarray(forward()(small, ids_).array)
    for mapping in (
        {"batch": "data", "experts": "model"},
        {"batch": "data", "experts": "data", "expert_mlp": "model"},
    ):
        with jax.set_mesh(mesh_2x4), na.axis_mapping(mapping):
            sharded = na.shard(small)
            up = sharded.layers.stacked.mlp.experts.up.weight
            experts = mapping["experts"]
            assert tuple(spec_of(up.values))[:2] == (None, experts)
            hidden = ("model",) if "expert_mlp" in mapping else ()
            assert spec_of(up.scale) == P(None, experts, *hidden)  # (layer, experts, expert_mlp)
            logits = na.named_jit(lambda m, t: m(t))(sharded, ids_)
        np.testing.assert_allclose(np.asarray(logits.array), want, atol=1e-5)


def test_narrow_experts_are_opt_in_on_gpus(monkeypatch):
    """The grouped kernel reads quantized experts narrow off GPUs (interpret mode: the tests
    above); on GPUs only with NAMEDAXES_NARROW_EXPERTS=1 until it has run on one; never on TPUs
    (megablox) or for weights it cannot read."""
    from namedaxes.nn._moe_dispatch import narrow_experts_available

    assert narrow_experts_available(jnp.int8) and not narrow_experts_available(jnp.bfloat16)
    monkeypatch.delenv("NAMEDAXES_NARROW_EXPERTS", raising=False)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert not narrow_experts_available(jnp.int8)
    monkeypatch.setenv("NAMEDAXES_NARROW_EXPERTS", "1")
    assert narrow_experts_available(jnp.int8)
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    assert not narrow_experts_available(jnp.int8)
