"""models.generate and nn.KVCache against transformers (tests/fixtures/hf: each fixture's greedy
continuation in reference.npz; generation.npz: left-padded batches and the sampling filters, made by
make_generation_refs.py), on one device and on (data=2, model=4) meshes; traces per bucket; errors."""

import collections
import functools
import json
import logging
import shutil
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import spec_of
from _meshes import make_mesh
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

import namedaxes as na
from namedaxes import models
from namedaxes.nn import _attention_kernels as kernels

FIXTURES = Path(__file__).parent / "fixtures" / "hf"
ALL = ["llama", "qwen3", "gpt2", "gemma", "mistral", "qwen2", "olmo2"] + [
    "llama_linear", "llama_dynamic", "llama_llama3", "llama_yarn"
] + ["mixtral", "qwen2_moe", "qwen3_moe"]  # fmt: skip
REFS = np.load(FIXTURES / "generation.npz")
MAPPING = {"batch": "data", "heads": "model", "mlp": "model", "vocab": "model"}


@functools.cache
def load(name):
    return models.from_hf(FIXTURES / name)


def ids(a):
    return na.named(jnp.asarray(a, jnp.int32), ("batch", "position"))


def mask_of(a):
    return na.named(jnp.asarray(a == 1), ("batch", "position"))


def greedy_reference(name):
    r = np.load(FIXTURES / name / "reference.npz")
    return r["prompt"], r["greedy"]


@pytest.mark.parametrize("name", ALL)
def test_greedy_matches_transformers(name):
    prompt, want = greedy_reference(name)
    out = models.generate(load(name), ids(prompt), max_new_tokens=12)
    assert out.axis_names == ("batch", "position") and out.dtype == jnp.int32
    np.testing.assert_array_equal(out.array, want)


def test_prompt_without_batch_axis():
    prompt, want = greedy_reference("llama")
    out = models.generate(load("llama"), na.named(jnp.asarray(prompt[0]), "position"),
                          max_new_tokens=3)  # fmt: skip
    assert out.axis_names == ("position",)
    np.testing.assert_array_equal(out.array, want[0, :11])


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_left_padded_batch_matches_transformers_and_each_row_alone(name):
    """Rows of 8, 5 and 2 real tokens left-padded to 8: transformers' tokens, and each row's
    tokens are those it gets generated alone (no padding)."""
    prompt, mask, want = REFS[f"{name}_prompt"], REFS[f"{name}_mask"], REFS[f"{name}_greedy"]
    out = models.generate(load(name), ids(prompt), attention_mask=mask_of(mask), max_new_tokens=12)
    np.testing.assert_array_equal(out.array, want)
    for row in range(3):
        real = prompt[row][mask[row] == 1]
        alone = models.generate(load(name), ids(real[None]), max_new_tokens=12)
        np.testing.assert_array_equal(alone.array[0], np.concatenate([real, want[row, 8:]]))


def test_eos_rows_stop_and_emit_pad():
    prompt, mask, want = REFS["llama_prompt"], REFS["llama_mask"], REFS["llama_greedy"]
    new = want[:, 8:]
    assert 109 in new[1] and 403 in new[2] and not {109, 403} & set(new[0])
    out = models.generate(load("llama"), ids(prompt), attention_mask=mask_of(mask),
                          max_new_tokens=12, eos_token_id=[109, 403], pad_token_id=7)  # fmt: skip
    got = np.asarray(out.array)[:, 8:]
    np.testing.assert_array_equal(got[0], new[0])  # never ends
    for row, eos in ((1, 109), (2, 403)):
        end = list(new[row]).index(eos)
        np.testing.assert_array_equal(got[row, : end + 1], new[row, : end + 1])
        assert (got[row, end + 1 :] == 7).all()
    # One row, default pad (the eos id): everything after the eos is the eos id.
    prompt, want = greedy_reference("llama")
    eos = int(want[0, 10])
    out = models.generate(load("llama"), ids(prompt), max_new_tokens=12, eos_token_id=eos)
    stop = list(want[0, 8:]).index(eos) + 8
    np.testing.assert_array_equal(out.array[0, : stop + 1], want[0, : stop + 1])
    assert (np.asarray(out.array)[0, stop + 1 :] == eos).all()


def test_sampling_top_k_1_is_greedy_and_a_key_fixes_the_samples():
    prompt, want = greedy_reference("llama")
    model, p = load("llama"), ids(prompt)
    one = models.generate(model, p, max_new_tokens=12, temperature=1.0, top_k=1,
                          key=jax.random.key(3))  # fmt: skip
    np.testing.assert_array_equal(one.array, want)

    def sample(seed, temperature=1.5):
        out = models.generate(model, p, max_new_tokens=12, temperature=temperature, top_p=0.9,
                              key=jax.random.key(seed))  # fmt: skip
        return np.asarray(out.array)

    a = sample(0)
    np.testing.assert_array_equal(a, sample(0))
    np.testing.assert_array_equal(a[:, :8], prompt)
    assert not np.array_equal(a, sample(1))
    assert not np.array_equal(a, want)


@pytest.mark.parametrize("case", range(len(REFS["top_k"])))
def test_filters_match_transformers_warpers(case):
    """Temperature, then top-k, then top-p, as transformers' warpers (generation.npz): the same
    tokens dropped (-inf) and the same values kept."""
    t, k, p = (REFS[n][case] for n in ("temperature", "top_k", "top_p"))
    logits = na.named(jnp.asarray(REFS["logits"]) / jnp.float32(t), ("batch", "vocab"))
    got = models.filter_logits(logits, top_k=int(k) or None, top_p=float(p) if p < 1 else None)
    want = REFS["filtered"][case]
    np.testing.assert_array_equal(np.isinf(got.array), np.isinf(want))
    np.testing.assert_allclose(
        np.asarray(got.array)[~np.isinf(want)], want[~np.isinf(want)], rtol=1e-6
    )
    assert 0 < np.isinf(want).sum() < want.size


def test_cache_prefill_and_steps_match_transformers_logits():
    """Mistral (sliding window 8 over 24 positions), one row left-padded: a 16-position prefill
    into the cache, then 8 one-position steps (one trace with a traced cache index), give
    transformers' logits at every real position."""
    r = np.load(FIXTURES / "mistral" / "reference.npz")
    model, tokens, mask = load("mistral"), ids(r["input_ids"]), mask_of(r["attention_mask"])
    positions = na.arange(na.Axis("position", 24))  # transformers' positions for these logits

    traced = []

    @eqx.filter_jit
    def run(model, cache, tokens, mask, positions):
        traced.append(tokens.axis_size("position"))
        return model(tokens, mask, positions, cache=cache)

    cache = model.init_cache({"batch": 2}, 24)
    first, cache = run(model, cache, tokens["position", :16], mask["position", :16],
                       positions["position", :16])  # fmt: skip
    assert cache.index == 16
    cache = cache.with_index(jnp.asarray(cache.index, jnp.int32))
    steps = [first]
    for t in range(16, 24):
        s = slice(t, t + 1)
        logits, cache = run(model, cache, tokens["position", s], mask["position", s],
                            positions["position", s])  # fmt: skip
        steps.append(logits)
    assert traced == [16, 1]  # the prefill and one step
    got = np.asarray(na.concatenate("position", steps).array)
    real = r["attention_mask"] == 1
    assert np.abs(got - r["logits_padded"])[real].max() < 1e-4
    np.testing.assert_array_equal(np.asarray(cache.mask.array), real)


def test_attention_layer_with_cache_equals_full_attention():
    """Mistral's first attention layer (grouped-query heads, rotary, sliding window 8): a
    7-position prefill and 3 one-position steps with the layer's default positions (the cache
    index on) equal attention over all 10 positions."""
    attn = load("mistral").layers.unstacked()[0].attn
    x = na.named(jnp.sin(jnp.arange(2 * 10 * 64, dtype=jnp.float32)).reshape(2, 10, 64),
                 ("batch", "position", "embed"))  # fmt: skip

    @jax.jit
    def run(x):
        cache = na.nn.KVCache.zeros({"batch": 2}, attn.KVHeads, attn.HeadDim, 11)
        out, cache = attn(x["position", :7], cache=cache)
        outs = [out]
        for t in (7, 8, 9):
            out, cache = attn(x["position", t : t + 1], cache=cache)
            outs.append(out)
        return attn(x), na.concatenate("position", outs), cache

    full, cached, cache = run(x)
    assert cache.index == 10
    assert cache.keys.axis_names == ("batch", "key_position", "kv_heads", "head_dim")
    np.testing.assert_allclose(cached.array, full.array, atol=1e-5)
    np.testing.assert_array_equal(cache.mask.array, np.arange(11)[None, :].repeat(2, 0) < 10)


def test_prefill_takes_the_fused_kernel_and_decoding_asks_for_xla(monkeypatch, caplog):
    """As on a GPU (cuDNN preferred; its mapping emulated on the CPU): the prefill, at the static
    query offset 0, runs cuDNN's mapping of a left-padded row; the decoding loop, at a traced
    offset, asks for XLA itself, so nothing falls back and nothing is logged."""
    calls = []
    run = kernels.run
    monkeypatch.setattr(kernels, "_EMULATE", True)
    monkeypatch.setattr(kernels, "preferred", lambda: "cudnn")
    monkeypatch.setattr(kernels, "run", lambda impl, c: calls.append((impl, c.q.shape[1], c.static_offset)) or run(impl, c))  # fmt: skip
    prompt, mask, want = REFS["llama_prompt"], REFS["llama_mask"], REFS["llama_greedy"]
    with caplog.at_level(logging.WARNING, logger="namedaxes"):
        out = models.generate(
            load("llama"), ids(prompt[1:]), attention_mask=mask_of(mask[1:]), max_new_tokens=4
        )  # fmt: skip  (shapes no other test compiles)
    np.testing.assert_array_equal(out.array, want[1:, :12])
    assert calls == [("cudnn", 16, 0), ("xla", 1, None)]
    assert not caplog.records


def test_generate_sharded(mesh_2x4):
    """Data-parallel batch and tensor-parallel heads/mlp/vocab: transformers' tokens; the cache is
    placed by its names (kv_heads unmapped for Llama's 2 key/value heads, heads on model for
    GPT-2's multi-head cache)."""
    rows = [0, 2]
    prompt, mask = REFS["llama_prompt"][rows], REFS["llama_mask"][rows]
    with jax.set_mesh(mesh_2x4), na.axis_mapping(MAPPING):
        model = models.from_hf(FIXTURES / "llama", mapping=MAPPING)
        assert spec_of(model.init_cache({"batch": 2}, 8).keys) == P(None, "data")
        gpt2 = models.from_hf(FIXTURES / "gpt2", mapping=MAPPING)
        cache = gpt2.init_cache({"batch": 2}, 8)
        assert spec_of(cache.keys) == P(None, "data", None, "model")
        assert spec_of(cache.mask) == P("data")
        out = models.generate(model, ids(prompt), attention_mask=mask_of(mask), max_new_tokens=12)
    np.testing.assert_array_equal(out.array, REFS["llama_greedy"][rows])
    assert spec_of(out)[0] == "data"


def test_the_prompt_goes_where_the_model_lives(mesh_2x4):
    """A prompt made under jax.set_mesh (on 8 devices) or committed to another device, with a
    model loaded on one device, and with a model loaded onto the mesh called outside it: the
    prompt moves to the model (JAX raised 'Received incompatible devices ... _prefill') and the
    tokens are transformers'. A mesh set around the call that does not hold the model is a
    ShardingError naming both placements and the fix."""
    prompt, want = greedy_reference("llama")
    with jax.set_mesh(mesh_2x4):
        on_mesh = ids(prompt)
        sharded = models.from_hf(FIXTURES / "llama", mapping=MAPPING)
    on_device_3 = na.named(jax.device_put(jnp.asarray(prompt, jnp.int32), jax.devices()[3]),
                           ("batch", "position"))  # fmt: skip
    single = load("llama")
    for model in (single, sharded):
        for p in (on_mesh, on_device_3):
            out = models.generate(model, p, max_new_tokens=12)
            np.testing.assert_array_equal(out.array, want)
    assert out.array.sharding.device_set == set(jax.devices())
    out = models.generate(single, on_mesh, max_new_tokens=12)
    assert out.array.sharding.device_set == {jax.devices()[0]}
    with (
        jax.set_mesh(mesh_2x4),
        pytest.raises(
            na.ShardingError,
            match=r"generate: the model's parameters live on one device \(device 0\), but the mesh "
            rf"set around the call is Mesh\(data=2, model=4\) \({mesh_2x4.axis_types[0].name} "
            r"axes, devices 0, 1, 2, 3, 4, 5, 6, 7\): one program cannot use both\. Call generate "
            r"outside that "
            r"`with jax.set_mesh\(\.\.\.\)` block, or load the model onto that mesh",
        ),
    ):
        models.generate(single, ids(prompt), max_new_tokens=12)


def test_one_prompt_under_a_data_parallel_mapping(mesh_2x4):
    """batch on data=2 and one prompt (ShardingError '2 does not divide 1' before), or three
    left-padded rows: generate pads the batch to a multiple of 2 with copies of the last row and
    drops them from the result. Greedy tokens are transformers'; sampled ones those of the
    unsharded run with the same key."""
    prompt, want = greedy_reference("llama")
    rows, mask = REFS["llama_prompt"], REFS["llama_mask"]
    sample = dict(max_new_tokens=12, temperature=1.5, top_p=0.9, key=jax.random.key(0))
    with jax.set_mesh(mesh_2x4), na.axis_mapping(MAPPING):
        model = models.from_hf(FIXTURES / "llama", mapping=MAPPING)
        one = models.generate(model, ids(prompt), max_new_tokens=12)
        three = models.generate(model, ids(rows), attention_mask=mask_of(mask), max_new_tokens=12)
        sampled = models.generate(model, ids(prompt), **sample)
    assert one.shape == {"batch": 1, "position": 20} and three.shape["batch"] == 3
    np.testing.assert_array_equal(one.array, want)
    np.testing.assert_array_equal(three.array, REFS["llama_greedy"])
    alone = models.generate(load("llama"), ids(prompt), **sample)
    np.testing.assert_array_equal(sampled.array, alone.array)


def test_generate_with_the_prompt_split_over_context(mesh_2x4):
    """A mapping that splits position: the prefill splits the prompt, the one-position decode
    step needs the fallback rule (a typed error says so without it); transformers' tokens."""
    rows = [0, 2]
    prompt, mask = REFS["llama_prompt"][rows], REFS["llama_mask"][rows]
    split = [("batch", "data"), ("position", "model")]
    with jax.set_mesh(mesh_2x4), na.axis_mapping(split):
        model = models.from_hf(FIXTURES / "llama", mapping=split)
        with pytest.raises(na.ShardingError, match=r"'position' \(size 1\).*\('position', None\)"):
            models.generate(model, ids(prompt), attention_mask=mask_of(mask), max_new_tokens=12)
        with na.axis_mapping(split + [("position", None)]):
            out = models.generate(
                model, ids(prompt), attention_mask=mask_of(mask), max_new_tokens=12
            )
    np.testing.assert_array_equal(out.array, REFS["llama_greedy"][rows])


def test_decode_traces_once_per_bucket():
    """Prompts of 3, 9 and 16 positions share the bucket 16: one trace of the prefill and one of
    the decode loop, whatever the eos, pad and temperature values, one to four eos ids (padded to
    4) and either kind of key."""
    traces = collections.Counter()

    def listen(event, duration, **kwargs):
        if event == "/jax/core/compile/jaxpr_trace_duration":
            traces[kwargs.get("fun_name")] += 1

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        model = load("llama")
        runs = [(3, {}), (9, {"eos_token_id": 5}), (16, {"pad_token_id": 1}),
                (4, {"eos_token_id": [5, 6]}), (5, {"eos_token_id": [5, 6, 7, 8]}),
                (6, {"eos_token_id": 5, "key": jax.random.PRNGKey(6)})]  # fmt: skip
        for n, options in runs:
            p = ids(np.arange(1, n + 1)[None])
            options = {"key": jax.random.key(n), **options}
            out = models.generate(model, p, max_new_tokens=5, temperature=0.5 * n, **options)
            assert out.shape == {"batch": 1, "position": n + 5}
    finally:
        jax.monitoring.clear_event_listeners()
    assert traces["_prefill"] == 1 and traces["_decode"] == 1


def test_errors():
    model, p = load("llama"), ids([[1, 2, 3]])
    gen = functools.partial(models.generate, model, p, max_new_tokens=2)
    with pytest.raises(na.NamedTypeError, match="needs a namedaxes.models.Transformer"):
        models.generate(object(), p, max_new_tokens=2)
    with pytest.raises(na.NamedTypeError, match="prompt must be an integer NamedArray"):
        models.generate(model, jnp.ones((1, 3), jnp.int32), max_new_tokens=2)
    with pytest.raises(na.AxisNotFoundError, match="has no 'position' axis"):
        models.generate(model, na.named(jnp.ones((1, 3), jnp.int32), ("batch", "seq")),
                        max_new_tokens=2)  # fmt: skip
    with pytest.raises(na.NamedTypeError, match="attention_mask must be a boolean NamedArray"):
        gen(attention_mask=na.named(jnp.ones((1, 3), jnp.int32), ("batch", "position")))
    with pytest.raises(na.GenerationError, match="max_new_tokens must be a positive int, got 0"):
        models.generate(model, p, max_new_tokens=0)
    with pytest.raises(na.GenerationError, match=r"temperature must be a finite number >= 0"):
        gen(temperature=-1.0)
    with pytest.raises(na.GenerationError, match=r"top_p must be a number in \(0, 1\]"):
        gen(top_p=1.5)
    with pytest.raises(na.GenerationError, match="top_k must be a positive int or None, got 0"):
        gen(top_k=0)
    with pytest.raises(na.GenerationError, match=r"needs key=jax.random.key"):
        gen(temperature=0.8)
    with pytest.raises(na.GenerationError, match="eos_token_id must be an int or a sequence"):
        gen(eos_token_id="</s>")
    with pytest.raises(
        na.AxisIndexError,
        match=r"generate: prompt: token id\(s\) -1, 600 outside the vocabulary: 'vocab' has 512 "
        r"entries, so ids must be in \[0, 512\) \(first at batch=0, position=1\)",
    ):
        models.generate(model, ids([[1, 600, 3, -1]]), max_new_tokens=2)
    right = na.named(jnp.array([[True, True, False]]), ("batch", "position"))
    with pytest.raises(na.GenerationError, match="padding after real tokens \\(row 0"):
        gen(attention_mask=right)
    with pytest.raises(na.GenerationError, match="learned 256 positions"):
        models.generate(load("gpt2"), p, max_new_tokens=255)
    # The cache.
    kv, hd = na.Axis("kv_heads", 2), na.Axis("head_dim", 4)
    one = na.nn.KVCache.zeros({"batch": 1}, kv, hd, 4)
    new = na.zeros({"batch": 1, "key_position": 3, "kv_heads": 2, "head_dim": 4})
    with pytest.raises(na.AxisSizeError, match="3 new positions at index 3 overrun the cache's 4"):
        one.update(new, new).update(new, new)
    with pytest.raises(na.LayerError, match="have no layer axis"):
        one.at_layer(0)
    stacked = na.nn.KVCache.zeros({"batch": 1}, kv, hd, 4, Layer=na.Axis("layer", 2))
    with pytest.raises(na.LayerError, match=r"write one layer's view: cache.at_layer\(i\)"):
        stacked.update(new, new)
    with pytest.raises(na.NamedTypeError, match="length must be a positive int"):
        na.nn.KVCache.zeros({"batch": 1}, kv, hd, 0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -0.5, "0.7", np.ones(2), True])
def test_temperature_must_be_a_finite_real_number(bad):
    """NaN would decode greedily and inf sample uniformly: both are refused, as is a non-number."""
    with pytest.raises(
        na.GenerationError,
        match=r"generate: temperature must be a finite number >= 0 \(0 is greedy\), got ",
    ):
        models.generate(load("llama"), ids([[1, 2, 3]]), max_new_tokens=2, temperature=bad,
                        key=jax.random.key(0))  # fmt: skip


def test_temperature_takes_numpy_and_jax_scalars():
    model, p = load("llama"), ids([[1, 2, 3]])
    want = models.generate(model, p, max_new_tokens=2, temperature=0.7, key=jax.random.key(0))
    for t in (np.float32(0.7), jnp.float32(0.7), np.asarray(0.7)):
        got = models.generate(model, p, max_new_tokens=2, temperature=t, key=jax.random.key(0))
        np.testing.assert_array_equal(got.array, want.array)


def test_key_must_be_a_prng_key():
    model, p = load("llama"), ids([[1, 2, 3]])
    for key in (5, jnp.zeros(3, jnp.uint32), jax.random.split(jax.random.key(0))):
        with pytest.raises(na.GenerationError, match=r"generate: key must be a PRNG key such as"):
            models.generate(model, p, max_new_tokens=2, temperature=0.7, key=key)
    raw = models.generate(model, p, max_new_tokens=2, temperature=0.7, key=jax.random.PRNGKey(0))
    typed = models.generate(model, p, max_new_tokens=2, temperature=0.7, key=jax.random.key(0))
    np.testing.assert_array_equal(raw.array, typed.array)  # the same bits, read alike


def test_filter_logits_checks_its_options():
    """The same checks as generate's: top_p in (0, 1], top_k a positive int (0 used to surface an
    inner op's error); a traced scalar top_p still works under jit."""
    x = na.named(jnp.log(jnp.array([0.5, 0.3, 0.15, 0.05])), "vocab")
    for top_p in (1.5, -0.5, 0.0, float("nan"), jnp.ones(2)):
        with pytest.raises(
            na.GenerationError,
            match=r"filter_logits: top_p must be a number in \(0, 1\] or a traced float scalar "
            r"or None, got ",
        ):
            models.filter_logits(x, top_p=top_p)
    for top_k in (0, -1, 2.5, True):
        with pytest.raises(
            na.GenerationError, match=r"filter_logits: top_k must be a positive int or None, got "
        ):
            models.filter_logits(x, top_k=top_k)
    # Integer logits have no -inf to mark a dropped token (used to be a bare OverflowError).
    ints = na.named(jnp.arange(8).reshape(2, 4), ("batch", "vocab"))
    with pytest.raises(
        na.NamedTypeError,
        match=r"filter_logits: logits must be a floating NamedArray .* got NamedArray\(int32, "
        r"batch=2, vocab=4\)\. Cast them first: logits.astype\(jnp.float32\)",
    ):
        models.filter_logits(ints, top_k=2)
    want = models.filter_logits(x, top_p=0.75).array
    np.testing.assert_array_equal(models.filter_logits(x, top_p=np.float32(0.75)).array, want)
    traced = jax.jit(lambda p: models.filter_logits(x, top_p=p).array)(jnp.float32(0.75))
    np.testing.assert_array_equal(traced, want)


def test_a_prompt_or_row_without_tokens_is_refused():
    """Tokens made from padding logits alone are refused: an empty prompt, a mask row that is all
    padding."""
    model = load("llama")
    empty = na.named(jnp.zeros((1, 0), jnp.int32), ("batch", "position"))
    with pytest.raises(
        na.GenerationError,
        match=r"generate: the prompt NamedArray\(batch=1, position=0\) is empty; .* Give each row "
        r"at least one token",
    ):
        models.generate(model, empty, max_new_tokens=2)
    mask = na.named(jnp.array([[True, True, True], [False, False, False]]), ("batch", "position"))
    with pytest.raises(
        na.GenerationError,
        match=r"generate: attention_mask has no real token in row 1 \(of the batch flattened\)",
    ):
        models.generate(model, ids([[1, 2, 3], [0, 0, 0]]), attention_mask=mask, max_new_tokens=2)


@pytest.mark.parametrize(
    "option, value",
    [("eos_token_id", 512), ("eos_token_id", [2, 2**40]), ("pad_token_id", -1),
     ("pad_token_id", 9999)],
)  # fmt: skip
def test_eos_and_pad_ids_must_be_in_the_vocabulary(option, value):
    """An eos id outside the vocabulary never matches (2**40 overflowed int32); a pad id outside
    it would be emitted as a token."""
    bad = value[-1] if isinstance(value, list) else value
    with pytest.raises(
        na.GenerationError,
        match=rf"generate: {option}={bad} is outside the vocabulary: 'vocab' has 512 entries, so "
        r"ids must be in \[0, 512\)",
    ):
        models.generate(load("llama"), ids([[1, 2, 3]]), max_new_tokens=2, **{option: value})


@pytest.mark.parametrize("dtype", [jnp.int8, jnp.uint8])
def test_prompt_dtype_must_hold_every_token_id(dtype):
    """The result has the prompt's dtype: one that cannot hold ids up to 511 would wrap new
    tokens (uint8: 300 became 44), so it is refused before anything runs."""
    prompt = na.named(jnp.array([[5, 6, 7]], dtype), ("batch", "position"))
    with pytest.raises(
        na.GenerationError,
        match=rf"generate: the prompt's dtype {jnp.dtype(dtype).name} cannot hold every token id "
        r"of the vocabulary \('vocab' has 512 entries, ids up to 511\), so new tokens would wrap "
        r"around\. Pass the prompt as int32: prompt.astype\(jnp.int32\)\.",
    ):
        models.generate(load("llama"), prompt, max_new_tokens=2)


def test_a_batch_axis_named_eos():
    """The decoding loop's own axis of eos ids is private: a batch axis called "eos" works (it used
    to meet it in the eos comparison: AxisSizeError)."""
    prompt, mask, want = (REFS[f"llama_{k}"][:2] for k in ("prompt", "mask", "greedy"))
    names = ("eos", "position")
    out = models.generate(load("llama"), na.named(jnp.asarray(prompt, jnp.int32), names),
                          attention_mask=na.named(jnp.asarray(mask == 1), names),
                          max_new_tokens=2, eos_token_id=[1, 2, 3])  # fmt: skip
    assert out.axis_names == names
    np.testing.assert_array_equal(out.array, want[:, : prompt.shape[1] + 2])


def test_a_mesh_of_another_shape_on_the_model_devices_is_refused(mesh_2x4):
    """The model on (data=2, model=4), a mesh on the same 8 devices set around the call: Explicit
    axes gave JAX's 'Context mesh ... must match the mesh passed to shardings', Auto axes ran for
    (data=8) and raised IndivisibleError for (data=4, model=2). Another shape, other names or
    the other axis type is the ShardingError that says what to do, on both kinds."""
    prompt, _ = greedy_reference("llama")
    model = models.from_hf(FIXTURES / "llama", mapping=MAPPING, mesh=mesh_2x4)
    kind = mesh_2x4.axis_types[0]
    other_kind = next(t for t in (AxisType.Auto, AxisType.Explicit) if t != kind)
    others = [
        (make_mesh((8,), ("data",), kind), f"Mesh\\(data=8\\) \\({kind.name} axes"),
        (make_mesh((4, 2), ("data", "model"), kind), rf"Mesh\(data=4, model=2\) \({kind.name} axes"),
        (make_mesh((2, 4), ("dp", "tp"), kind), rf"Mesh\(dp=2, tp=4\) \({kind.name} axes"),
        (make_mesh((2, 4), ("data", "model"), other_kind),
         rf"Mesh\(data=2, model=4\) \({other_kind.name} axes"),
    ]  # fmt: skip
    for other, shown in others:
        with (
            jax.set_mesh(other),
            na.axis_mapping({"batch": "data"}),
            pytest.raises(
                na.ShardingError,
                match=rf"^generate: the model's parameters live on Mesh\(data=2, model=4\) "
                rf"\({kind.name} axes, devices 0, 1, 2, 3, 4, 5, 6, 7\), but the mesh set around "
                rf"the call is {shown}, devices 0, 1, 2, 3, 4, 5, 6, 7\): one program cannot use "
                r"both\. Call generate outside that `with jax\.set_mesh\(\.\.\.\)` block, or load "
                r"the model onto that mesh \(models\.from_hf\(path, mapping=\.\.\.\) inside it\)\.$",
            ),
        ):
            models.generate(model, ids(prompt), max_new_tokens=2)


def test_eos_and_pad_default_to_the_checkpoints(tmp_path):
    """transformers' generate stops on the generation_config's eos (else config.json's) unless
    told otherwise; generate ignored it. Llama's greedy continuation emits 222 second: with 222 as
    the checkpoint's eos it stops there and pads with the checkpoint's pad id; eos_token_id=[]
    never stops; an eos outside the vocabulary changes nothing (as GPT-2's 50256 in 512 tokens:
    test_greedy_matches_transformers runs every fixture with its own generation_config)."""
    prompt, want = greedy_reference("llama")
    assert want[0, 9] == 222 and 222 not in want[0, 8:9]
    folder = tmp_path / "llama"
    shutil.copytree(FIXTURES / "llama", folder)
    generation = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(
        json.dumps({**generation, "eos_token_id": [222, 50000], "pad_token_id": 7})
    )
    model = models.from_hf(folder)
    stopped = np.asarray(models.generate(model, ids(prompt), max_new_tokens=12).array)
    np.testing.assert_array_equal(stopped[0, :10], want[0, :10])
    assert (stopped[0, 10:] == 7).all()
    out = models.generate(model, ids(prompt), max_new_tokens=12, eos_token_id=[])
    np.testing.assert_array_equal(out.array, want)
    out = models.generate(model, ids(prompt), max_new_tokens=12, eos_token_id=5, pad_token_id=1)
    np.testing.assert_array_equal(out.array, want)  # given ids win: 5 is never emitted
    (folder / "generation_config.json").unlink()  # then config.json's, as from_model_config
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "eos_token_id": 222}))
    stopped = np.asarray(
        models.generate(models.from_hf(folder), ids(prompt), max_new_tokens=12).array
    )
    np.testing.assert_array_equal(stopped[0, :10], want[0, :10])
    assert (stopped[0, 10:] == 222).all()  # no pad id: the eos id
