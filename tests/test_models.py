"""namedaxes.models against transformers' own logits (tests/fixtures/hf, see its README), on one
device and loaded sharded on (data=2, model=4) meshes; save_hf round trips; config reading; errors."""

import json
import shutil
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import run_two_processes, spec_of
from jax.sharding import PartitionSpec as P
from safetensors.numpy import load_file, save_file

import namedaxes as na
from namedaxes import models
from namedaxes.nn import _attention_kernels as kernels

FIXTURES = Path(__file__).parent / "fixtures" / "hf"
FAMILIES = ["llama", "qwen3", "gpt2", "gemma", "mistral", "qwen2", "olmo2"]
ROPE = ["llama_linear", "llama_dynamic", "llama_llama3", "llama_yarn"]
MOE = ["mixtral", "qwen2_moe", "qwen3_moe"]  # qwen3_moe's experts are stored fused
ALL = FAMILIES + ROPE + MOE
MAPPING = {"embed": "data", "mlp": "model", "vocab": "model", "heads": "model"}
TOL = 1e-4


def reference(name):
    r = np.load(FIXTURES / name / "reference.npz")
    ids = na.named(jnp.asarray(r["input_ids"], jnp.int32), ("batch", "position"))
    mask = na.named(jnp.asarray(r["attention_mask"] == 1), ("batch", "position"))
    return r, ids, mask


@eqx.filter_jit
def logits(model, ids, mask):
    if model.config.moe:  # and transformers' aux_loss (output_router_logits=True)
        return model(ids, return_aux_loss=True), model(
            ids, attention_mask=mask, return_aux_loss=True
        )
    return model(ids), model(ids, attention_mask=mask)


def assert_matches(r, plain, padded):
    if "aux_loss" in r:
        (plain, aux), (padded, aux_padded) = plain, padded
        np.testing.assert_allclose(aux, r["aux_loss"], rtol=1e-5)
        np.testing.assert_allclose(aux_padded, r["aux_loss_padded"], rtol=1e-5)
    assert plain.axis_names == ("batch", "position", "vocab")
    real = r["attention_mask"] == 1
    assert np.abs(np.asarray(plain.array) - r["logits"]).max() < TOL
    assert np.abs(np.asarray(padded.array) - r["logits_padded"])[real].max() < TOL


def per_expert(tensors):
    """Experts fused one tensor per layer (gate_up_proj: gate and up stacked on the output,
    down_proj) as transformers' conversion splits them into one tensor per expert."""
    out = {}
    for k, v in tensors.items():
        if k.endswith("experts.gate_up_proj"):
            base, half = k[: -len("gate_up_proj")], v.shape[1] // 2
            for e in range(v.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = np.ascontiguousarray(v[e, :half])
                out[f"{base}{e}.up_proj.weight"] = np.ascontiguousarray(v[e, half:])
        elif k.endswith("experts.down_proj"):
            for e in range(v.shape[0]):
                out[f"{k[: -len('down_proj')]}{e}.down_proj.weight"] = v[e]
        else:
            out[k] = v
    return out


def assert_same_tensors(folder, original):
    """The tensors save_hf wrote (one file or an index of shards) are the original file's, bit for
    bit, under the same names (read with the safetensors package; fused experts as one tensor per
    expert, which is what save_hf writes)."""
    files = sorted(Path(folder).glob("*.safetensors"))
    saved = {k: v for f in files for k, v in load_file(f).items()}
    want = per_expert(load_file(Path(original) / "model.safetensors"))
    assert sorted(saved) == sorted(want)
    for k, v in want.items():
        assert saved[k].dtype == v.dtype and saved[k].shape == v.shape, k
        np.testing.assert_array_equal(saved[k].view(np.uint8), v.view(np.uint8), err_msg=k)


@pytest.mark.parametrize("name", ALL)
def test_logits_match_transformers_and_save_round_trips(name, tmp_path):
    r, ids, mask = reference(name)
    model = models.from_hf(FIXTURES / name)
    assert (
        model.config.model_type
        == json.loads((FIXTURES / name / "config.json").read_text())["model_type"]
    )
    plain, padded = logits(model, ids, mask)
    assert_matches(r, plain, padded)
    models.save_hf(model, tmp_path)
    assert_same_tensors(tmp_path, FIXTURES / name)
    assert generation_config(tmp_path) == generation_config(FIXTURES / name)
    again = models.from_hf(tmp_path)
    assert again.config == model.config
    plain2, padded2 = logits(again, ids, mask)  # same structure: no new compile
    for a, b in zip(jax.tree.leaves((plain2, padded2)), jax.tree.leaves((plain, padded))):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", FAMILIES)
def test_logits_match_loaded_sharded(name, mesh_2x4, tmp_path, monkeypatch):
    """Loaded sharded by MAPPING: parameters where it says, logits as transformers'; attention is
    tensor-parallel too (each device attends 1 of the 4 query heads, with its key/value head, also
    where the 1 or 2 key/value heads do not divide model=4)."""
    config = models.config_from_hf(FIXTURES / name)
    calls = []
    run = kernels.run
    monkeypatch.setattr(kernels, "run", lambda impl, c: calls.append(c) or run(impl, c))
    r, ids, mask = reference(name)
    with jax.set_mesh(mesh_2x4):
        model = models.from_hf(FIXTURES / name, mapping=MAPPING)
        layer = model.layers.stacked
        assert spec_of(model.embed.weight) == P("model", "data")
        assert spec_of(layer.attn.q_proj.weight) == P(None, "data", "model")
        assert spec_of(layer.attn.o_proj.weight) == P(None, "model", None, "data")
        kv = P(None, "data") if config.grouped else P(None, "data", "model")
        assert spec_of(layer.attn.k_proj.weight) == kv
        assert spec_of(layer.mlp.up.weight) == P(None, "data", "model")
        assert spec_of(layer.mlp.down.weight) == P(None, "model", "data")
        assert spec_of(model.final_norm.weight) == P("data")
        if model.lm_head is not None:
            assert spec_of(model.lm_head.weight) == P("data", "model")
        shard = layer.attn.q_proj.weight.array.addressable_shards[0].data
        assert shard.shape == (config.num_layers, config.hidden_size // 2, 1, config.head_dim)
        models.save_hf(model, tmp_path)  # gathers each tensor
        assert_same_tensors(tmp_path, FIXTURES / name)
        with na.axis_mapping(MAPPING):
            plain, padded = na.named_jit(lambda m, i, k: (m(i), m(i, attention_mask=k)))(
                model, ids, mask
            )
    assert_matches(r, plain, padded)
    assert calls and {(c.q.shape[2], c.k.shape[2]) for c in calls} == {(1, 1)}


@pytest.mark.parametrize("name", MOE)
def test_experts_loaded_expert_parallel(name, mesh_2x4):
    """Mixtures of experts loaded with experts on `model` (expert parallelism 4) as well as
    MAPPING, run with grouped matmuls and all-to-all: transformers' logits and aux_loss."""
    config = models.config_from_hf(FIXTURES / name)
    r, ids, mask = reference(name)
    mapping = {**MAPPING, "experts": "model"}
    del mapping["mlp"]  # no such axis with experts (expert_mlp, shared_mlp): from_hf refuses it
    with jax.set_mesh(mesh_2x4):
        model = models.from_hf(FIXTURES / name, mapping=mapping, moe_dispatch="ragged")
        layer = model.layers.stacked
        assert model.config.moe_dispatch == "ragged" and layer.mlp.dispatch == "ragged"
        assert spec_of(layer.mlp.experts.up.weight) == P(None, "model", "data")
        assert spec_of(layer.mlp.router.weight) == P(None, "data", "model")
        shard = layer.mlp.experts.down.weight.array.addressable_shards[0].data
        per_device = config.num_experts // 4
        assert shard.shape == (2, per_device, config.axis("expert_mlp").size, 32)
        with na.axis_mapping(mapping):
            f = na.named_jit(
                lambda m, i, k: (
                    m(i, return_aux_loss=True),
                    m(i, attention_mask=k, return_aux_loss=True),
                )
            )
            plain, padded = f(model, ids, mask)
            assert "all-to-all" in f.lower(model, ids, mask).compile().as_text()
    assert_matches(r, plain, padded)


@pytest.mark.parametrize("name", ["mistral", "gpt2"])
def test_token_id_outside_the_vocabulary_raises_or_reads_nan(name):
    """transformers raises for an id past the vocabulary; a loaded model never reads another
    token's embedding for it (clamped, id 600 gave id 255's logits): called eagerly it raises
    naming the id; under jit the row with the id is NaN from there on (GPT-2: tied head, learned
    positions) and the other row is still transformers' logits."""
    r, ids, _ = reference(name)
    model = models.from_hf(FIXTURES / name)
    vocab = model.config.vocab_size
    bad = na.named(ids.array.at[1, 5].set(600), ids.axes)
    with pytest.raises(
        na.AxisIndexError,
        match=rf"Embedding: token id\(s\) 600 outside the vocabulary: 'vocab' has {vocab} "
        rf"entries, so ids must be in \[0, {vocab}\) \(first at batch=1, position=5\)",
    ):
        model(bad)
    out = np.asarray(eqx.filter_jit(lambda m, i: m(i))(model, bad).array)
    assert np.isnan(out[1, 5:]).all()
    assert np.abs(out[0] - r["logits"][0]).max() < TOL


def test_mixed_precision_llama_matches_float32_reference():
    """Parameters float32, compute bfloat16 (norms, softmax and RoPE tables in float32): logits
    within 1e-2 of transformers' float32 ones; so are those of the model loaded in bfloat16."""
    r, ids, mask = reference("llama")
    model = models.from_hf(FIXTURES / "llama")

    @eqx.filter_jit
    def mixed(model, ids, mask):
        with na.nn.precision("params=float32,compute=bfloat16"):
            return model(ids), model(ids, attention_mask=mask)

    plain, padded = mixed(model, ids, mask)
    assert plain.dtype == jnp.bfloat16 and model.embed.weight.dtype == jnp.float32
    real = r["attention_mask"] == 1
    assert np.abs(np.asarray(plain.array, np.float32) - r["logits"]).max() < 1e-2
    assert np.abs(np.asarray(padded.array, np.float32) - r["logits_padded"])[real].max() < 1e-2
    plain, padded = logits(models.from_hf(FIXTURES / "llama", dtype=jnp.bfloat16), ids, mask)
    assert plain.dtype == jnp.bfloat16
    assert np.abs(np.asarray(plain.array, np.float32) - r["logits"]).max() < 1e-2
    assert np.abs(np.asarray(padded.array, np.float32) - r["logits_padded"])[real].max() < 1e-2


def test_gradient_checkpointing_reaches_the_layers_with_the_same_gradients():
    """``gradient_checkpointing="dots"`` (a runtime option: here set on the loaded model) remats
    each layer (the policy is the stack's); the gradients are those of the model without it."""
    plain = models.from_hf(FIXTURES / "llama")
    remat = plain.with_options(gradient_checkpointing="dots")
    assert remat.config.gradient_checkpointing == "dots"
    built = models.Transformer(plain.config, key=jax.random.key(0), gradient_checkpointing="dots")
    assert built.config == remat.config and built.layers.gradient_checkpointing == "dots"
    _, ids, _ = reference("llama")

    def loss(model):
        return model(ids).array.std()

    assert remat.layers.gradient_checkpointing == "dots"
    assert "remat" in str(jax.make_jaxpr(jax.grad(loss))(remat))
    assert "remat" not in str(jax.make_jaxpr(jax.grad(loss))(plain))
    want, got = eqx.filter_jit(lambda a, b: (jax.grad(loss)(a), jax.grad(loss)(b)))(plain, remat)
    for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-7)


def test_runtime_options_of_a_loaded_model():
    """Every runtime option is a keyword of from_hf and of with_options, which keeps the
    parameters (the same arrays) and rebuilds what runs: here the context-parallel ring, which a
    loaded model could not be given before (the config is a static field)."""
    model = models.from_hf(FIXTURES / "llama", context_strategy="ring", gradient_checkpointing=True)
    assert model.config.context_strategy == "ring" and model.config.gradient_checkpointing is True
    layer = model.layers.stacked
    assert layer.attn.context_strategy == "ring" and model.layers.gradient_checkpointing is True
    gather = model.with_options(context_strategy="all_gather", gradient_checkpointing=False)
    assert gather.layers.stacked.attn.context_strategy == "all_gather"
    assert not gather.layers.gradient_checkpointing
    for a, b in zip(jax.tree.leaves(gather), jax.tree.leaves(model)):
        assert a is b
    assert model.with_options() is model
    assert gather.config.stored() == model.config.stored()  # what save_hf writes: the same

    ids = na.named(jnp.arange(16, dtype=jnp.int32).reshape(2, 8), ("batch", "position"))
    mesh = jax.make_mesh((2,), ("context",), axis_types=(jax.sharding.AxisType.Explicit,))

    def program(m):
        with jax.set_mesh(mesh), na.axis_mapping({"position": "context"}):
            return str(jax.make_jaxpr(lambda m, i: m(i).array)(m, na.shard(ids)))

    assert "ppermute" in program(model) and "all_gather" not in program(model)
    assert "ppermute" not in program(gather)

    experts = models.from_hf(FIXTURES / "mixtral", moe_dispatch="dense", capacity_factor=2.0)
    assert experts.layers.stacked.mlp.dispatch == "dense"
    assert experts.layers.stacked.mlp.capacity_factor == 2.0
    ragged = experts.with_options(moe_dispatch="ragged", capacity_factor=None)
    assert ragged.layers.stacked.mlp.dispatch == "ragged"
    assert ragged.layers.stacked.mlp.capacity_factor is None
    # each runtime option, by the one list, is a keyword of both and documented in both
    for name in models.TransformerConfig.RUNTIME_FIELDS:
        value = getattr(experts.config, name)
        assert getattr(experts.with_options(**{name: value}).config, name) == value
        assert f"``{name}``" in models.from_hf.__doc__
        assert f"``{name}``" in models.Transformer.with_options.__doc__


def test_options_that_are_not_runtime_options_are_refused():
    model = models.from_hf(FIXTURES / "qwen3")
    runtime = (
        r"Runtime options: 'context_strategy', 'context_balance', 'moe_dispatch', "
        r"'capacity_factor', "
        r"'gradient_checkpointing', 'pipeline_microbatches', 'pipeline_schedule', "
        r"'pipeline_repeats'\."
    )
    with pytest.raises(
        na.ModelConfigError,
        match=r"^Transformer\.with_options got an unknown option 'context_stratgy' \(did you "
        rf"mean 'context_strategy'\?\)\. {runtime}$",
    ):
        model.with_options(context_stratgy="ring")
    with pytest.raises(
        na.ModelConfigError,
        match=r"^Transformer\.with_options: 'num_heads' is not a runtime option but part of what "
        rf"the model is \(its parameters or config\.json\)\. {runtime} Build another model for "
        r"another num_heads\.$",
    ):
        model.with_options(num_heads=8)
    with pytest.raises(na.ModelConfigError, match=r"context_strategy must be one of 'all_gather'"):
        model.with_options(context_strategy="rings")
    with pytest.raises(na.ModelConfigError, match=r"gradient_checkpointing='dots_only' is not"):
        model.with_options(gradient_checkpointing="dots_only")
    with pytest.raises(
        na.ModelConfigError, match=r"^from_hf got an unknown option 'mapings' \(did you mean "
    ):
        models.from_hf(FIXTURES / "qwen3", mapings={"embed": "data"})
    with pytest.raises(na.ModelConfigError, match=r"^from_hf: 'sliding_window' is not a runtime"):
        models.from_hf(FIXTURES / "qwen3", sliding_window=4)


def test_a_mapping_typo_is_refused_with_the_axis_it_meant(mesh_2x4):
    """An entry that matches no axis of the model left it replicated without a word; from_hf now
    raises (strict by default, the model's axes being its parameters' and its activations'),
    suggesting the closest name, whether the mapping is given or in force; strict=False loads."""
    typo = {"emebd": "data", "heads": "model"}
    axes = (
        "'batch', 'embed', 'head_dim', 'heads', 'key_position', 'kv_heads', 'layer', 'mlp', "
        "'position', 'vocab'"
    )
    with jax.set_mesh(mesh_2x4):
        with pytest.raises(
            na.UnmatchedMappingError,
            match=r"^from_hf\(strict=True\): the mapping entry 'emebd' -> 'data' \(did you mean "
            rf"'embed'\?\) matches no axis of the model, whose axes are {axes}\. ",
        ):
            models.from_hf(FIXTURES / "llama", mapping=typo)
        with na.axis_mapping(typo), pytest.raises(na.UnmatchedMappingError, match="'emebd'"):
            models.from_hf(FIXTURES / "llama")
        loose = models.from_hf(FIXTURES / "llama", mapping=typo, strict=False)
        assert spec_of(loose.embed.weight) == P()  # what the typo did: embed replicated
        # the activation axes are the model's too: a mapping for the whole program loads
        whole = {"batch": "data", "position": "model", "key_position": "model", "embed": "data"}
        model = models.from_hf(FIXTURES / "llama", mapping=whole)
        assert spec_of(model.embed.weight) == P(None, "data")
        with pytest.raises(na.UnmatchedMappingError, match=r"the mapping entry 'mlp' -> 'model' "):
            models.from_hf(FIXTURES / "mixtral", mapping={"mlp": "model"})  # expert_mlp there


def test_rope_variant_loads_sharded(mesh_2x4):
    """One RoPE-scaling fixture (dynamic: its frequencies depend on the positions) sharded too; its
    2 heads do not divide model=4, so this mapping leaves them whole."""
    mapping = {"embed": "data", "mlp": "model", "vocab": "model"}
    r, ids, mask = reference("llama_dynamic")
    with jax.set_mesh(mesh_2x4), na.axis_mapping(mapping):
        model = models.from_hf(FIXTURES / "llama_dynamic")  # the mapping in force
        assert spec_of(model.layers.stacked.mlp.gate.weight) == P(None, "data", "model")
        plain, padded = na.named_jit(lambda m, i, k: (m(i), m(i, attention_mask=k)))(
            model, ids, mask
        )
    assert spec_of(plain) == P(None, None, "model")
    assert_matches(r, plain, padded)


def test_sharded_index_and_dtype(tmp_path):
    model = models.from_hf(FIXTURES / "llama")
    models.save_hf(model, tmp_path, max_shard_size="200KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    assert files == [f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)]
    assert sorted(set(index["weight_map"].values())) == files
    assert index["weight_map"]["model.layers.1.mlp.up_proj.weight"] in files
    assert_same_tensors(tmp_path, FIXTURES / "llama")
    again = models.from_hf(tmp_path)
    for a, b in zip(jax.tree.leaves(model), jax.tree.leaves(again)):
        np.testing.assert_array_equal(a, b)
    half = models.from_hf(tmp_path, dtype=jnp.bfloat16)
    w, w16 = model.layers.stacked.attn.q_proj.weight, half.layers.stacked.attn.q_proj.weight
    assert w16.dtype == jnp.bfloat16 and w16.axis_names == w.axis_names
    np.testing.assert_array_equal(w16.array, w.array.astype(jnp.bfloat16))
    models.save_hf(half, tmp_path / "bf16")
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"


def test_save_hf_keeps_a_transformers_4_torch_dtype_true(tmp_path):
    """A checkpoint whose config says torch_dtype (transformers 4's name), saved in bfloat16, says
    bfloat16 under both names, not a stale float32 that transformers 4 would load it as."""
    import shutil

    shutil.copytree(FIXTURES / "llama", tmp_path / "v4")
    config = json.loads((tmp_path / "v4" / "config.json").read_text())
    config["torch_dtype"] = config.pop("dtype")
    (tmp_path / "v4" / "config.json").write_text(json.dumps(config))
    models.save_hf(models.from_hf(tmp_path / "v4", dtype=jnp.bfloat16), tmp_path / "out")
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (saved["torch_dtype"], saved["dtype"]) == ("bfloat16", "bfloat16")


# -- configs --------------------------------------------------------------------------------


def test_config_reads_both_rope_spellings(tmp_path):
    legacy = models.config_from_hf(FIXTURES / "llama_linear")
    assert legacy.rope_scaling == na.nn.RopeScaling("linear", factor=2.0)
    raw = json.loads((FIXTURES / "llama_linear" / "config.json").read_text())
    raw.pop("rope_theta"), raw.pop("rope_scaling")
    raw["rope_parameters"] = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert models.config_from_hf(tmp_path) == legacy
    mistral = models.config_from_hf(FIXTURES / "mistral")
    assert (mistral.rope_theta, mistral.sliding_window, mistral.rope_scaling) == (1e6, 8, None)
    dynamic = models.config_from_hf(FIXTURES / "llama_dynamic").rope_scaling
    assert (dynamic.kind, dynamic.factor, dynamic.original_max_position_embeddings) == (
        "dynamic",
        2.0,
        16,
    )
    yarn = models.config_from_hf(FIXTURES / "llama_yarn").rope_scaling
    assert (yarn.kind, yarn.factor, yarn.original_max_position_embeddings) == ("yarn", 4.0, 32)


def test_experts_options_read_from_config(tmp_path):
    c = {n: models.config_from_hf(FIXTURES / n) for n in MOE}
    m, q2, q3 = c["mixtral"], c["qwen2_moe"], c["qwen3_moe"]
    assert (m.num_experts, m.num_experts_per_tok, m.norm_topk_prob) == (8, 2, True)
    assert m.moe_intermediate_size is None and m.axis("expert_mlp").size == 32
    assert (q2.num_experts, q2.moe_intermediate_size, q2.shared_expert_intermediate_size) == (
        4,
        32,
        48,
    )
    assert q2.qkv_bias and not q2.out_bias and not q2.norm_topk_prob
    assert (q3.num_experts, q3.norm_topk_prob, q3.qk_norm) == (8, True, "head")
    assert q3.axis("experts").size == 8 and q3.shared_expert_intermediate_size is None
    # transformers' defaults where the file is silent (MixtralConfig: RoPE theta 1e6, 8 experts).
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mixtral"}))
    d = models.config_from_hf(tmp_path)
    assert (d.rope_theta, d.num_experts, d.num_kv_heads, d.norm_eps) == (1e6, 8, 8, 1e-5)


def test_experts_options_a_family_cannot_express(tmp_path):
    folder = copy_fixture(tmp_path, "qwen2_moe")
    edit_config(folder, decoder_sparse_step=2)
    with pytest.raises(
        na.ModelConfigError,
        match=r"qwen2_moe: decoder_sparse_step=2 and mlp_only_layers=\[\] give dense MLPs in "
        r"layers \[0\] and experts in the others; a model with experts in every layer",
    ):
        models.config_from_hf(folder)
    edit_config(folder, decoder_sparse_step=1, mlp_only_layers=[1])
    with pytest.raises(na.ModelConfigError, match=r"dense MLPs in layers \[1\]"):
        models.config_from_hf(folder)
    folder = copy_fixture(tmp_path, "mixtral")
    edit_config(folder, router_jitter_noise=0.1)
    with pytest.raises(na.ModelConfigError, match=r"router_jitter_noise=0.1 .* is not supported"):
        models.config_from_hf(folder)
    mixtral = models.config_from_hf(FIXTURES / "mixtral").replace(hf_config="")
    with pytest.raises(
        na.ModelConfigError,
        match=r"A mixtral config.json cannot express this config: 'norm_topk_prob'",
    ):
        models.hf_config(mixtral.replace(norm_topk_prob=False))
    # How the experts run is not part of config.json: any dispatch or capacity is written.
    runtime = mixtral.replace(moe_dispatch="dense", capacity_factor=1.5)
    assert models.hf_config(runtime) == models.hf_config(mixtral)
    with pytest.raises(na.ModelConfigError, match=r"num_experts_per_tok=9 is more than the 8"):
        mixtral.replace(num_experts_per_tok=9)
    with pytest.raises(na.ModelConfigError, match=r"moe_dispatch must be one of"):
        mixtral.replace(moe_dispatch="sparse")


def test_family_options_read_from_config():
    c = {n: models.config_from_hf(FIXTURES / n) for n in FAMILIES}
    assert (c["qwen2"].qkv_bias, c["qwen2"].out_bias) == (True, False)
    assert c["qwen3"].qk_norm == "head" and c["olmo2"].qk_norm == "projection"
    assert c["olmo2"].norm_after and c["olmo2"].norm_eps == 1e-5
    assert c["gemma"].norm_weight_offset == 1.0 and c["gemma"].embed_scale == 8.0
    assert c["gemma"].activation == "gelu_pytorch_tanh"
    g = c["gpt2"]
    assert (g.norm, g.learned_positions, g.gated_mlp, g.activation) == (
        "layer",
        True,
        False,
        "gelu_new",
    )
    assert (g.intermediate_size, g.num_kv_heads, g.tie_word_embeddings) == (256, 4, True)
    assert not c["llama"].tie_word_embeddings and c["llama"].num_kv_heads == 2


@pytest.mark.parametrize("name", FAMILIES + MOE)
def test_generated_config_reads_back(name, tmp_path):
    """A config not read from a file is written by the family's writer so that it reads back equal."""
    config = models.config_from_hf(FIXTURES / name).replace(hf_config="")
    raw = models.hf_config(config)
    assert raw["model_type"] == config.model_type and len(raw["architectures"]) == 1
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert models.config_from_hf(tmp_path) == config


def test_config_that_a_family_cannot_express():
    config = models.config_from_hf(FIXTURES / "llama").replace(sliding_window=4, hf_config="")
    with pytest.raises(
        na.ModelConfigError,
        match=r"A llama config.json cannot express this config: 'sliding_window'",
    ):
        models.hf_config(config)


def config_of(tmp_path, raw):
    """The config of a folder holding only ``raw`` as config.json."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(raw))
    return models.config_from_hf(tmp_path)


def test_top_level_original_max_position_embeddings_overrides_the_rope_settings(tmp_path):
    """transformers 5 gives a top-level original_max_position_embeddings (Phi-3 style files)
    priority over the one in the RoPE settings for llama3 and yarn; it was ignored (64 and 128
    below), which changed the frequencies and the logits."""
    for name, inner in (("llama_llama3", 64), ("llama_yarn", None)):
        folder = copy_fixture(tmp_path, name)
        rope = json.loads((folder / "config.json").read_text())["rope_parameters"]
        original = rope.pop("original_max_position_embeddings")
        if inner is not None:
            rope["original_max_position_embeddings"] = inner
        edit_config(folder, rope_parameters=rope, original_max_position_embeddings=original)
        config = models.config_from_hf(folder)
        assert config.rope_scaling.original_max_position_embeddings == original == 32
        assert config == models.config_from_hf(FIXTURES / name)
    r, ids, mask = reference("llama_yarn")
    assert_matches(r, *logits(models.from_hf(folder), ids, mask))


@pytest.mark.parametrize("name", ["qwen2_moe", "qwen3_moe"])
def test_moe_config_without_a_sparse_layer_reads_as_a_dense_model(name, tmp_path):
    """mlp_only_layers naming every layer, or a decoder_sparse_step past the last layer, makes
    transformers build a dense MLP in every layer: the config has no experts and the dense
    checkpoint loads (it was read as all-sparse, and from_hf asked for expert tensors)."""
    dense = "llama" if name == "qwen2_moe" else "qwen3"  # the same tensors as these 2 layers
    moe = json.loads((FIXTURES / name / "config.json").read_text())
    keep = (
        "model_type",
        "architectures",
        "num_experts",
        "num_local_experts",
        "num_experts_per_tok",
    )
    want = models.from_hf(FIXTURES / dense)
    for i, layout in enumerate(({"mlp_only_layers": [0, 1]}, {"decoder_sparse_step": 3})):
        folder = copy_fixture(tmp_path / str(i), dense)
        edit_config(folder, **{k: moe[k] for k in keep if k in moe}, qkv_bias=False, **layout)
        config = models.config_from_hf(folder)
        assert (config.num_experts, config.shared_expert_intermediate_size) == (0, None)
        assert not config.moe and config.axis("mlp").size == want.config.intermediate_size
        model = models.from_hf(folder)
        for a, b in zip(jax.tree.leaves(model), jax.tree.leaves(want), strict=True):
            np.testing.assert_array_equal(a, b)
    for step in (0, -1, 1.5):
        with pytest.raises(
            na.ModelConfigError,
            match=rf"^{name}: decoder_sparse_step={step} must be a positive integer \(experts in "
            r"every step-th layer\)\. Use 1 for experts in every layer\.$",
        ):
            config_of(tmp_path / "bad", {"model_type": name, "decoder_sparse_step": step})


@pytest.mark.parametrize(
    "model_type, absent",
    [("llama", 64), ("olmo2", 64), ("mistral", 8), ("mixtral", 8), ("qwen2", 32), ("qwen3", 32),
     ("qwen2_moe", 16), ("qwen3_moe", 4), ("gemma", 16)],
)  # fmt: skip
def test_num_key_value_heads_defaults_per_family(model_type, absent, tmp_path):
    """An absent num_key_value_heads takes the family's transformers default (Qwen2/Qwen3: 32,
    Qwen2-MoE: 16, not num_attention_heads); an explicit null means num_attention_heads (Mistral
    read 8)."""
    raw = {"model_type": model_type, "hidden_size": 1024, "num_attention_heads": 64, "head_dim": 16}
    assert config_of(tmp_path / "absent", raw).num_kv_heads == absent
    null = config_of(tmp_path / "null", {**raw, "num_key_value_heads": None})
    assert null.num_kv_heads == 64
    assert config_of(tmp_path / "set", {**raw, "num_key_value_heads": 2}).num_kv_heads == 2


@pytest.mark.parametrize("name", ROPE + ["mistral"])
def test_written_config_states_rope_for_transformers_4_and_5(name, tmp_path):
    """save_hf's config.json states RoPE both ways: rope_parameters (transformers 5) and a
    top-level rope_theta with rope_scaling (transformers 4, which reads nothing else and ran theta
    10000 on a file with only rope_parameters). Either spelling alone reads back the same config."""
    config = models.config_from_hf(FIXTURES / name).replace(hf_config="")
    raw = models.hf_config(config)
    params = raw["rope_parameters"]
    assert raw["rope_theta"] == params["rope_theta"] == config.rope_theta
    if config.rope_scaling is None:
        assert raw["rope_scaling"] is None and params["rope_type"] == "default"
    else:
        assert raw["rope_scaling"] == {k: v for k, v in params.items() if k != "rope_theta"}
        assert raw["rope_scaling"]["rope_type"] == config.rope_scaling.kind
    new = {k: v for k, v in raw.items() if k not in ("rope_theta", "rope_scaling")}
    old = {k: v for k, v in raw.items() if k != "rope_parameters"}
    assert config_of(tmp_path / "both", raw) == config
    assert config_of(tmp_path / "new", new) == config
    assert config_of(tmp_path / "old", old) == config


def test_rope_theta_of_zero_is_refused_not_replaced(tmp_path):
    """rope_theta 0 (either spelling) read as 10000; TransformerConfig refuses it (NaN logits)."""
    base = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4}
    for where in (
        {"rope_theta": 0},
        {"rope_parameters": {"rope_type": "default", "rope_theta": 0}},
    ):
        with pytest.raises(
            na.ModelConfigError,
            match=r"^TransformerConfig\.rope_theta must be a finite number > 1, got 0\.0\.$",
        ):
            config_of(tmp_path, {**base, **where})
    # Absent: the family's default (MixtralConfig's 1e6), from either place.
    mixtral = {**base, "model_type": "mixtral", "num_attention_heads": 8}
    assert config_of(tmp_path, mixtral).rope_theta == 1e6
    assert config_of(tmp_path, {**base, "rope_theta": 5e5}).rope_theta == 5e5


def test_gemma_activation_as_transformers_runs_it(tmp_path):
    """Gemma runs hidden_act as transformers >= 4.48 (5.17 made the fixture) does: "gelu" is the
    exact GELU (it ran as tanh GELU). hidden_activation, which 4.38-4.47 ran instead, is used where
    it agrees with hidden_act and refused where it does not (the versions run different models);
    save_hf writes both."""
    base = {"model_type": "gemma", "hidden_size": 64, "num_attention_heads": 4, "head_dim": 16,
            "num_key_value_heads": 1}  # fmt: skip
    for raw, act in [
        ({}, "gelu_pytorch_tanh"),
        ({"hidden_act": "gelu"}, "gelu"),
        ({"hidden_act": "gelu", "hidden_activation": "gelu"}, "gelu"),
        ({"hidden_activation": "gelu_pytorch_tanh"}, "gelu_pytorch_tanh"),
        ({"hidden_act": "silu", "hidden_activation": None}, "silu"),
    ]:
        config = config_of(tmp_path, {**base, **raw})
        assert config.activation == act
        written = models.hf_config(config.replace(hf_config=""))
        assert written["hidden_act"] == written["hidden_activation"] == act
    assert models.config_from_hf(FIXTURES / "gemma").activation == "gelu_pytorch_tanh"
    with pytest.raises(
        na.ModelConfigError,
        match=r"^gemma: hidden_act='gelu' and hidden_activation='gelu_pytorch_tanh' disagree "
        r"\(transformers 4\.38-4\.47 runs hidden_activation, 4\.48 and later hidden_act\), so which "
        r"activation the weights expect is ambiguous\. Set both in config\.json to the one they "
        r"were trained with \('gelu_pytorch_tanh' for Google's Gemma checkpoints\)\.$",
    ):
        config_of(
            tmp_path, {**base, "hidden_act": "gelu", "hidden_activation": "gelu_pytorch_tanh"}
        )


# -- errors ---------------------------------------------------------------------------------


def generation_config(folder):
    return json.loads((Path(folder) / "generation_config.json").read_text())


@pytest.mark.parametrize("name", ["gemma", "olmo2"])  # bos/eos/pad set; olmo2: no bos, pad 1
def test_save_hf_writes_the_generation_config_it_was_loaded_with(name, tmp_path):
    """The generation_config.json from_hf read is written back (what transformers' generate takes
    its eos and pad ids from), also when config.json is written anew; without one it is made from
    config.json's token ids, as transformers makes it from the model config."""
    original = generation_config(FIXTURES / name)
    assert original["eos_token_id"] is not None and original["pad_token_id"] is not None
    model = models.from_hf(FIXTURES / name)
    models.save_hf(model, tmp_path / "as_loaded")
    assert generation_config(tmp_path / "as_loaded") == original
    again = models.from_hf(tmp_path / "as_loaded")
    assert json.loads(again.config.hf_generation_config) == original
    generated = model.config.replace(hf_config="")  # config.json written by the family's writer
    like = eqx.filter_eval_shape(models.Transformer, generated, key=jax.random.key(0))
    rewritten = jax.tree.unflatten(jax.tree.structure(like), jax.tree.leaves(model))
    models.save_hf(rewritten, tmp_path / "rewritten")
    assert generation_config(tmp_path / "rewritten") == original
    folder = copy_fixture(tmp_path, name)  # no generation_config.json
    (folder / "generation_config.json").unlink()
    models.save_hf(models.from_hf(folder), tmp_path / "made")
    ids = json.loads((FIXTURES / name / "config.json").read_text())
    want = {
        k: ids[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if ids[k] is not None
    }
    assert generation_config(tmp_path / "made") == {"_from_model_config": True, **want}
    assert want["eos_token_id"] == original["eos_token_id"]
    assert want["pad_token_id"] == original["pad_token_id"]


def test_generation_config_of_a_new_model_and_a_bad_file(tmp_path):
    cfg = models.TransformerConfig("llama", vocab_size=64, hidden_size=16, intermediate_size=32,
                                   num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8)  # fmt: skip
    models.save_hf(models.Transformer(cfg, key=jax.random.key(0)), tmp_path / "new")
    assert generation_config(tmp_path / "new") == {"_from_model_config": True}
    folder = copy_fixture(tmp_path)
    (folder / "generation_config.json").write_text("[1, 2]")
    with pytest.raises(
        na.ModelConfigError, match=r"generation_config\.json holds list, not a JSON object\."
    ):
        models.from_hf(folder)


def copy_fixture(tmp_path, name="llama"):
    folder = tmp_path / name
    shutil.copytree(FIXTURES / name, folder)
    return folder


def edit_config(folder, **changes):
    path = folder / "config.json"
    raw = json.loads(path.read_text())
    raw.update(changes)
    path.write_text(json.dumps(raw))


def test_missing_folder_config_and_weights(tmp_path):
    with pytest.raises(na.CheckpointNotFoundError, match=r"'.*nowhere' is not a folder"):
        models.from_hf(tmp_path / "nowhere")
    with pytest.raises(na.CheckpointNotFoundError, match=r"has no config.json"):
        models.from_hf(tmp_path)
    folder = copy_fixture(tmp_path)
    (folder / "model.safetensors").unlink()
    with pytest.raises(
        na.CheckpointNotFoundError,
        match=r"has neither model.safetensors nor model.safetensors.index.json",
    ):
        models.from_hf(folder)


def test_unsupported_model_type_lists_the_supported(tmp_path):
    folder = copy_fixture(tmp_path)
    edit_config(folder, model_type="deepseek_v3")
    with pytest.raises(
        na.ModelConfigError,
        match=r"model_type 'deepseek_v3' is not supported. Supported model types: gemma, gpt2, "
        r"llama, mistral, mixtral, olmo2, qwen2, qwen2_moe, qwen3, qwen3_moe\.",
    ):
        models.config_from_hf(folder)
    edit_config(folder, model_type="llama", rope_scaling={"rope_type": "longrope", "factor": 2.0})
    with pytest.raises(na.ModelConfigError, match=r"RoPE type 'longrope' is not supported"):
        models.from_hf(folder)


def test_missing_extra_and_misshaped_tensors_are_named(tmp_path):
    folder = copy_fixture(tmp_path)
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(8, np.float32)  # ignored
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(
        na.CheckpointStructureError, match=r"lacks tensor\(s\) 'model.layers.1.mlp.up_proj.weight'"
    ):
        models.from_hf(folder)
    tensors["model.layers.1.mlp.up_proj.weight"] = np.ones((160, 64), np.float32)
    tensors["model.layers.2.mlp.up_proj.weight"] = np.ones((160, 64), np.float32)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(
        na.CheckpointStructureError,
        match=r"has tensor\(s\) 'model.layers.2.mlp.up_proj.weight' that a llama model",
    ):
        models.from_hf(folder)
    edit_config(folder, intermediate_size=128)
    with pytest.raises(
        na.CheckpointAxisError,
        match=r"'model.layers.0.mlp.gate_proj.weight' has shape \(160, 64\), but the config says "
        r"\(128, 64\) \(\(mlp\) x \(embed\)\)",
    ):
        models.from_hf(folder)


def test_mapping_without_mesh_and_bad_inputs():
    with pytest.raises(na.MeshError, match=r"from_hf has a mapping .* but no mesh"):
        models.from_hf(FIXTURES / "qwen3", mapping=MAPPING)
    config = models.config_from_hf(FIXTURES / "qwen3")
    model = eqx.filter_eval_shape(models.Transformer, config, key=jax.random.key(0))
    ids = na.named(jnp.zeros((2, 4), jnp.int32), ("batch", "position"))
    with pytest.raises(na.NamedTypeError, match=r"ids must be an integer NamedArray"):
        model(ids.astype(jnp.float32))
    with pytest.raises(na.AxisNotFoundError, match=r"has no 'position' axis"):
        model(ids.rename({"position": "seq"}))
    with pytest.raises(na.NamedTypeError, match=r"attention_mask must be a boolean NamedArray"):
        model(ids, attention_mask=ids)
    with pytest.raises(na.AxisSizeError, match=r"positions NamedArray\(position=3\)"):
        model(ids, positions=na.arange(na.Axis("position", 3)))
    with pytest.raises(na.ModelConfigError, match=r"num_kv_heads=3 must divide num_heads=4"):
        config.replace(num_kv_heads=3)


def test_save_hf_of_a_donated_model_names_the_leaf_and_the_donation(mesh_2x4, tmp_path):
    """After a donating fsdp step, save_hf of the model before the step names the donated leaf
    and the fix instead of JAX's 'Array has been deleted'; the returned model saves."""
    m0 = models.from_hf(FIXTURES / "llama", mapping=MAPPING, mesh=mesh_2x4)
    step = na.fsdp(lambda m: jax.tree.map(lambda x: x * 1, m), MAPPING, {}, donate_args=(True,))
    with jax.set_mesh(mesh_2x4):
        m1 = step(m0)
    with pytest.raises(
        na.DonatedArrayError,
        match=r"save_hf: leaf 'embed/weight' was donated to an earlier call \(named_jit or fsdp "
        r"with donate_args=\.\.\., jax\.jit with donate_argnums=\.\.\.\), so its buffer is "
        r"gone\. Donation hands an argument's memory to the call's outputs: save the value the "
        r"call returned instead, or don't donate it\.$",
    ):
        models.save_hf(m0, tmp_path / "m0")
    assert not (tmp_path / "m0").exists()
    models.save_hf(m1, tmp_path / "m1")
    assert_same_tensors(tmp_path / "m1", FIXTURES / "llama")


def test_two_processes_read_only_their_blocks_and_write_their_files(tmp_path):
    """Each process of a 2-process run (4 devices each, process p holding data=p) reads only the
    `embed` columns its devices hold, the model gives transformers' logits, and save_hf's files,
    written by both processes, hold the original tensors bit for bit."""
    worker = Path(__file__).with_name("models_worker.py")
    results = run_two_processes(worker, tmp_path / "saved", timeout=120)
    for p, r in enumerate(results):
        assert r["up_spec"] == [None, "data", "model"] and r["fully_addressable"] is False
        assert r["up_shards"] == [[2, 32, 40]]
        assert r["up_columns_read"] == [[32 * p, 32 * (p + 1)]]
        assert r["max_diff"] < TOL and r["max_diff_padded"] < TOL
        assert r["same_names"] and r["bit_exact"]
    written = [set(r["wrote"]) for r in results]
    files = {f"model-0000{k}-of-00007.safetensors" for k in range(1, 8)}
    assert not written[0] & written[1] and written[0] | written[1] == files
    assert "model-00001-of-00007.safetensors" in written[0]  # process k writes files k, k + 2, ...


def test_gpt2_file_without_prefix_and_with_mask_buffers(tmp_path):
    """Older GPT-2 files name tensors without 'transformer.' and hold the attention-mask buffers
    (attn.bias, attn.masked_bias): they load as the prefixed file does."""
    folder = copy_fixture(tmp_path, "gpt2")
    tensors = {
        k.removeprefix("transformer."): v
        for k, v in load_file(folder / "model.safetensors").items()
    }
    for i in range(2):
        tensors[f"h.{i}.attn.bias"] = np.tril(np.ones((1, 1, 256, 256), np.float32))
        tensors[f"h.{i}.attn.masked_bias"] = np.array(-1e4, np.float32)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    old, new = models.from_hf(folder), models.from_hf(FIXTURES / "gpt2")
    for a, b in zip(jax.tree.leaves(old), jax.tree.leaves(new)):
        np.testing.assert_array_equal(a, b)


SMALL = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
             num_kv_heads=1, head_dim=8)  # fmt: skip


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("rope_theta", 0.0, r"rope_theta must be a finite number > 1, got 0\.0\."),
        ("rope_theta", -5.0, r"rope_theta must be a finite number > 1, got -5\.0\."),
        ("norm_eps", -1.0, r"norm_eps must be a finite number >= 0, got -1\.0\."),
        ("norm_eps", float("nan"), r"norm_eps must be a finite number >= 0, got nan\."),
        ("embed_scale", float("nan"), r"embed_scale must be a finite number > 0, got nan\."),
        ("attention_scale", float("inf"), r"attention_scale must be a finite number > 0 or None"),
        ("norm_weight_offset", "1", r"norm_weight_offset must be a finite number, got '1'\."),
        ("router_aux_loss_coef", -1, r"router_aux_loss_coef must be a finite number >= 0"),
        ("tie_word_embeddings", "no", r"tie_word_embeddings must be True or False, got 'no'\."),
        ("norm_after", "yes", r"norm_after must be True or False, got 'yes'\."),
        ("gated_mlp", 2, r"gated_mlp must be True or False, got 2\."),
        ("model_type", "lama", r"model_type 'lama' is not supported \(did you mean 'llama'\?\)\. "
         r"Supported model types: gemma, gpt2, llama, mistral, mixtral, olmo2, qwen2, qwen2_moe, "
         r"qwen3, qwen3_moe\."),
    ],
)  # fmt: skip
def test_config_refuses_values_that_build_a_broken_model(field, value, message):
    """A RoPE base of 0 gave NaN logits, tie_word_embeddings="no" (truthy) tied the head, and an
    unknown model_type failed only at save_hf: each is refused where the config is made."""
    fields = {"model_type": "llama", **SMALL, field: value}
    with pytest.raises(na.ModelConfigError, match=rf"^TransformerConfig\.{message}"):
        models.TransformerConfig(**fields)


def test_config_numbers_are_stored_as_floats():
    cfg = models.TransformerConfig("gemma", **SMALL, rope_theta=np.float32(500), embed_scale=4)
    assert (cfg.rope_theta, cfg.embed_scale) == (500.0, 4.0)
    assert type(cfg.rope_theta) is float and type(cfg.embed_scale) is float
    assert cfg.attention_scale is None and cfg.capacity_factor is None


def test_expert_options_on_a_dense_model_are_refused():
    """capacity_factor and moe_dispatch say how experts run: on a model without experts they
    did nothing."""
    for option in ({"capacity_factor": 1.25}, {"moe_dispatch": "capacity"}):
        given = ", ".join(f"{k}={v!r}" for k, v in option.items())
        with pytest.raises(
            na.ModelConfigError,
            match=rf"^TransformerConfig: {given} applies to experts, but this llama model has none "
            r"\(num_experts=0\): its MLPs are dense\. Leave the option out\.$",
        ):
            models.from_hf(FIXTURES / "llama", **option)
    model = models.Transformer(models.TransformerConfig("llama", **SMALL), key=jax.random.key(0))
    with pytest.raises(na.ModelConfigError, match=r"moe_dispatch='dense' applies to experts"):
        model.with_options(moe_dispatch="dense")


def test_from_hf_dtype_that_is_not_a_dtype():
    with pytest.raises(
        na.NamedTypeError,
        match=r"^from_hf dtype='bf17' is not a dtype\. Pass e\.g\. jnp\.float32 or 'bfloat16'\.$",
    ):
        models.from_hf(FIXTURES / "llama", dtype="bf17")
    with pytest.raises(
        na.NamedTypeError, match=r"^from_hf dtype must be a floating dtype, got int32\."
    ):
        models.from_hf(FIXTURES / "llama", dtype=jnp.int32)


def test_mask_and_positions_must_have_the_ids_axes_and_sizes():
    """The same bad input gave JAX's broadcasting error, an internal fold() error or a silent extra
    output axis, depending on the family."""
    cfg = models.TransformerConfig("llama", **SMALL)
    model = models.Transformer(cfg, key=jax.random.key(0))
    ids = na.named(jnp.zeros((2, 8), jnp.int32), ("batch", "position"))
    with pytest.raises(
        na.AxisSizeError,
        match=r"attention_mask NamedArray\(batch=3, position=8\) and ids .* differ in the size of 'batch'",
    ):
        model(ids, na.named(jnp.ones((3, 8), bool), ("batch", "position")))
    with pytest.raises(na.AxisNotFoundError, match=r"positions has axis 'beam' that the ids"):
        model(ids, None, na.named(jnp.zeros((8, 2), jnp.int32), ("position", "beam")))


def test_save_hf_into_an_earlier_save_leaves_only_its_weights(tmp_path):
    """Saved sharded, then unsharded into the same folder: the old index and shards stayed and
    from_hf read the OLD model; unsharded then sharded: the old model.safetensors stayed, which
    transformers reads first. Now the weight files of the earlier save go (other files stay), and
    a folder with both kinds is refused."""
    cfg = models.TransformerConfig("llama", **SMALL)
    old = models.Transformer(cfg, key=jax.random.key(0))
    new = models.Transformer(cfg, key=jax.random.key(1))
    (tmp_path / "README.md").write_text("notes")
    models.save_hf(old, tmp_path, max_shard_size="5KB")
    shards = sorted(p.name for p in tmp_path.glob("model-*.safetensors"))
    assert len(shards) > 1 and (tmp_path / "model.safetensors.index.json").exists()
    models.save_hf(new, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "README.md", "config.json", "generation_config.json", "model.safetensors"
    ]  # fmt: skip
    np.testing.assert_array_equal(
        models.from_hf(tmp_path).embed.weight.array, new.embed.weight.array
    )
    models.save_hf(old, tmp_path, max_shard_size="5KB")
    assert sorted(p.name for p in tmp_path.glob("*.safetensors")) == shards
    np.testing.assert_array_equal(
        models.from_hf(tmp_path).embed.weight.array, old.embed.weight.array
    )
    assert (tmp_path / "README.md").read_text() == "notes"
    models.save_hf(new, tmp_path / "single")
    shutil.copy(tmp_path / "single" / "model.safetensors", tmp_path)
    with pytest.raises(
        na.CheckpointStructureError,
        match=rf"^{tmp_path} holds both model\.safetensors and model\.safetensors\.index\.json "
        r"\(with its shards\): two sets of weights, and readers disagree on which is the model "
        r"\(transformers' from_pretrained takes model\.safetensors\)\. Delete the stale one; "
        r"save_hf into the folder leaves only what it wrote\.$",
    ):
        models.from_hf(tmp_path)


@pytest.mark.parametrize("size", [0, "0GB", "0.0001KB", "5 parsecs"])
def test_max_shard_size_must_be_a_positive_size(size, tmp_path):
    """'0GB' and '0.0001KB' came to 0 bytes and were taken (a file per tensor)."""
    model = models.Transformer(models.TransformerConfig("llama", **SMALL), key=jax.random.key(0))
    with pytest.raises(
        na.NamedTypeError,
        match=r"^save_hf max_shard_size must be a positive byte count or a string such as '5GB', "
        rf"got {size!r}\.$",
    ):
        models.save_hf(model, tmp_path, max_shard_size=size)
    assert not list(tmp_path.iterdir())


def test_from_hf_dtype_that_layers_do_not_keep():
    """float8 loaded (logits off by 0.08, and save_hf wrote a float8 folder); float64 with 64-bit
    floats off loaded as float32. Both are refused as the precision policy refuses them."""
    with pytest.raises(
        na.NamedTypeError,
        match=r"^from_hf dtype=float8_e4m3fn is not a dtype layers keep parameters in: use "
        r"float32, bfloat16 or float16 \(float64 with jax_enable_x64\)\. For float8 weights, load "
        r"the model in one of those and quantize it: models\.quantize\(model, 'float8'\)\.$",
    ):
        models.from_hf(FIXTURES / "llama", dtype=jnp.float8_e4m3fn)
    with pytest.raises(
        na.NamedTypeError,
        match=r"^from_hf dtype=float64 needs 64-bit floats, which are off here\. Turn them on "
        r"\(jax\.config\.update\('jax_enable_x64', True\)\) or use float32\.$",
    ):
        models.from_hf(FIXTURES / "llama", dtype=jnp.float64)


def test_gpt2_positions_past_the_learned_table_are_named():
    """300 tokens on GPT-2's 256 learned positions said 'token id(s) 256.. outside the vocabulary
    ... Use the tokenizer that matches the model'; it is the positions, and the fix is fewer."""
    model = models.from_hf(FIXTURES / "gpt2")
    ids = na.named(jnp.ones((1, 258), jnp.int32), ("batch", "position"))
    with pytest.raises(
        na.AxisIndexError,
        match=r"^Transformer: position\(s\) 256, 257 outside the learned position table: "
        r"'max_position' has 256 entries, so ids must be in \[0, 256\) \(first at position=256\)\. "
        r"Negative ids do not count from the end here\. This gpt2 model learned 256 positions: "
        r"give it at most 256 positions \(0 to 255, a cache's included\), e\.g\. by shortening "
        r"the input\.$",
    ):
        model(ids)


def test_from_hf_indivisible_axis_suggests_a_fallback_rule(mesh_2x4, tmp_path):
    """A vocabulary of 65 with vocab on model=4: the error suggested unsatisfied='replicate' and
    padding, which from_hf cannot take; it suggests the fallback rule, which loads."""
    cfg = models.TransformerConfig("llama", **{**SMALL, "vocab_size": 65})
    models.save_hf(models.Transformer(cfg, key=jax.random.key(0)), tmp_path)
    with pytest.raises(
        na.ShardingError,
        match=r"^from_hf: At leaf 'embed/weight': Cannot shard axis 'vocab' \(size 65\) of an array "
        r"with axes \(vocab=65, embed=16\) on Mesh\(data=2, model=4\): no rule applies\. "
        r"Candidates: \(model=4\): 4 does not divide 65\. A checkpoint's sizes are fixed: give "
        r"'vocab' a fallback in a list mapping, e\.g\. \[\.\.\., \('vocab', 'model'\), "
        r"\('vocab', None\)\], which replicates it where no earlier rule applies\.$",
    ):
        models.from_hf(tmp_path, mapping={"vocab": "model", "embed": "data"}, mesh=mesh_2x4)
    mapping = [("vocab", "model"), ("vocab", None), ("embed", "data"), ("mlp", "model")]
    model = models.from_hf(tmp_path, mapping=mapping, mesh=mesh_2x4)
    assert spec_of(model.embed.weight) == P(None, "data")
    assert spec_of(model.layers.stacked.mlp.up.weight) == P(None, "data", "model")
