"""The main example's pieces (examples/train_lm.py) on a tiny corpus and a tiny model.

Two processes train the same run as one (same losses), a run resumed from a checkpoint on the other
mesh kind continues with the same losses, the FLOPs behind MFU are the model's matmuls, the mesh
follows the devices, samples come from held-out prompts, and the export loads back. The full run is
the README's first command (and CI's short version of it), not a test.
"""

import dataclasses
import json
import shutil
import sys
from pathlib import Path

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import run_two_processes
from jax.sharding import AxisType

pytest.importorskip("tokenizers")
pytest.importorskip("optax")
pytest.importorskip("rich")

import namedaxes as na
from namedaxes import models

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

import text_data as td
import train_lm

WORKER = Path(__file__).with_name("train_lm_worker.py")
SIZE = train_lm.Size(hidden=32, layers=2, heads=4, kv_heads=2, head_dim=8, mlp=64, vocab=300,
                     seq=16, batch=8, steps=4, lr=1e-2, eval_every=2)  # fmt: skip
SEED = 3  # the worker's
STDLIB_TEXTS = ["json/decoder.py", "json/encoder.py", "textwrap.py", "string.py", "keyword.py"]


def heldout_names(n):
    """The first ``n`` names doc{i}.txt that the split rule holds out."""
    return [f"doc{i}.txt" for i in range(1000) if td.is_heldout(f"doc{i}.txt")][:n]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    names = ["a.py", "b.py", "c.py", *heldout_names(2)]
    for name, source in zip(names, STDLIB_TEXTS):
        (folder / name).write_text((td.stdlib_folder() / source).read_text())
    return folder


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def text(corpus, cache):
    return td.load_text(corpus, vocab_size=SIZE.vocab, cache_dir=cache)


def mesh_of(kind):
    return jax.make_mesh((2, 4), ("data", "model"), axis_types=(kind,) * 2)


def train(text, kind=AxisType.Auto, **kwargs):
    with jax.numpy_dtype_promotion("standard"):  # optax mixes Python floats and int counts
        return train_lm.train(text, SIZE, mesh_of(kind), seed=SEED, eval_batches=2, **kwargs)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    pytest.importorskip("orbax.checkpoint")
    return tmp_path_factory.mktemp("checkpoints")


@pytest.fixture(scope="module")
def one_process(text, checkpoints):
    """The reference run: one process, 8 devices, an Auto mesh; checkpoints at steps 1 and 3."""
    return train(text, checkpoint_dir=str(checkpoints), checkpoint_every=2)


def test_two_processes_train_like_one(one_process, text, corpus, cache):
    """Each process reads only its rows of every batch; the global batches, and so the losses, are
    those of one process with all 8 devices."""
    size = json.dumps(dataclasses.asdict(SIZE))
    results = run_two_processes(WORKER, corpus, cache, size, "auto", timeout=120)
    want = [one_process.losses[s] for s in range(SIZE.steps)]
    assert want[-1] < want[0]  # it trains
    for r in results:
        assert (r["devices"], r["local_devices"]) == (8, 4)
        np.testing.assert_allclose(r["losses"], want, rtol=0, atol=1e-5)
        got = {int(s): v for s, v in r["heldout"].items()}
        assert sorted(got) == [1, 3]  # every eval_every steps and at the end
        np.testing.assert_allclose([got[1], got[3]], [one_process.heldout[s] for s in (1, 3)],
                                   rtol=0, atol=1e-5)  # fmt: skip


def test_resuming_on_the_other_mesh_kind_continues_the_same_run(one_process, text, checkpoints,
                                                                tmp_path):  # fmt: skip
    """Checkpoints at steps 1 and 3; without the last one, a run on an Explicit mesh resumes after
    step 1 and trains steps 2 and 3 with the same data and state: the same losses."""
    assert sorted(p.name for p in checkpoints.iterdir() if p.name.isdigit()) == ["1", "3"]
    shutil.copytree(checkpoints, tmp_path, dirs_exist_ok=True)
    shutil.rmtree(tmp_path / "3")
    resumed = train(text, AxisType.Explicit, checkpoint_dir=str(tmp_path), checkpoint_every=2)
    assert sorted(resumed.losses) == [2, 3]
    np.testing.assert_allclose([resumed.losses[2], resumed.losses[3]],
                               [one_process.losses[2], one_process.losses[3]],
                               rtol=0, atol=1e-5)  # fmt: skip
    spec = resumed.model.layers.stacked.mlp.up.weight.array.sharding.spec
    assert tuple(spec)[:3] == (None, "data", "model")  # restored into the parameter layout


def _dot_flops(jaxpr):
    """FLOPs of every dot_general in ``jaxpr`` (scan bodies times their length)."""
    total = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (lhs_contract, _), _ = eqn.params["dimension_numbers"]
            k = np.prod([eqn.invars[0].aval.shape[d] for d in lhs_contract])
            total += 2 * int(np.prod(eqn.outvars[0].aval.shape)) * int(k)
        times = eqn.params.get("length", 1) if eqn.primitive.name == "scan" else 1
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            total += times * _dot_flops(sub)
    return total


def test_pipelined_run_trains_like_the_unpipelined_one(one_process, text):
    """``--mesh stage=2,data=2,model=2``: the layers in two stages (GPipe, 4 microbatches), the
    same batches: the losses of the unpipelined run, to float32 rounding."""
    mesh = train_lm.make_mesh("stage=2,data=2,model=2", explicit=False)
    with jax.numpy_dtype_promotion("standard"):
        piped = train_lm.train(text, SIZE, mesh, seed=SEED, eval_batches=2)
    spec = piped.model.layers.stacked.mlp.up.weight.array.sharding.spec
    assert tuple(spec)[:3] == ("stage", "data", "model")  # stored split into stages
    want = [one_process.losses[s] for s in range(SIZE.steps)]
    np.testing.assert_allclose([piped.losses[s] for s in range(SIZE.steps)], want, atol=1e-4)
    np.testing.assert_allclose(piped.heldout[3], one_process.heldout[3], atol=1e-4)


def test_flops_per_token_are_three_times_the_forward_matmuls():
    """6 x (matmul parameters) + causal attention: three times the forward pass's dot FLOPs
    (counted in its jaxpr: projections, MLP, the tied head, attention scores and values), with
    half of the attention's scores and values masked."""
    cfg = train_lm.model_config(SIZE, 300)
    model = jax.eval_shape(lambda: models.Transformer(cfg, key=jax.random.key(0)))
    ids = na.named(jnp.zeros((2, SIZE.seq), jnp.int32), ("batch", "position"))
    forward = _dot_flops(jax.make_jaxpr(lambda m: m(ids).array)(model).jaxpr) / ids.size
    attention = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * SIZE.seq  # scores + values
    assert train_lm.flops_per_token(cfg, SIZE.seq) == pytest.approx(3 * (forward - attention / 2))


def test_presets_are_the_sizes_they_say():
    counts = {}
    for name, size in train_lm.SIZES.items():
        cfg = train_lm.model_config(size, size.vocab)
        abstract = jax.eval_shape(lambda cfg=cfg: models.Transformer(cfg, key=jax.random.key(0)))
        counts[name] = sum(x.size for x in jax.tree.leaves(abstract))
        assert cfg.vocab_size % 128 == 0 and cfg.grouped and cfg.model_type == "llama"
    assert 0.5e6 < counts["small"] < 2e6
    assert 0.08e9 < counts["100m"] < 0.13e9
    assert 0.9e9 < counts["1b"] < 1.2e9


def test_default_size_follows_the_platform(capsys):
    """Without --size: the small preset on CPUs (as before), 100m on GPUs and TPUs (the small one
    trained in 8 s at 0.3% MFU on an H100); flags still override the preset's fields; --help
    says so."""
    assert train_lm.default_size("cpu") == "small"
    assert train_lm.default_size("gpu") == train_lm.default_size("tpu") == "100m"
    assert train_lm.chosen_size(train_lm.parse_args([]), "cpu") == (
        "small",
        train_lm.SIZES["small"],
    )
    name, size = train_lm.chosen_size(train_lm.parse_args(["--steps", "7"]), "gpu")
    assert name == "100m" and size == dataclasses.replace(train_lm.SIZES["100m"], steps=7)
    assert train_lm.chosen_size(train_lm.parse_args(["--size", "1b"]), "cpu")[0] == "1b"
    with pytest.raises(SystemExit):
        train_lm.parse_args(["--help"])
    assert "(default: small on CPUs, 100m on GPUs and TPUs)" in " ".join(
        capsys.readouterr().out.split()
    )


def test_precision_option():
    """--precision takes a policy string (float8 matmuls, for one), over --mixed-precision."""
    policy = train_lm.chosen_policy(
        train_lm.parse_args(["--precision", "params=float32,compute=bfloat16,matmul=float8"]), False
    )
    assert policy == na.nn.Precision("float32", "bfloat16", matmul="float8")
    assert train_lm.chosen_policy(train_lm.parse_args([]), True) == train_lm.MIXED
    assert train_lm.chosen_policy(train_lm.parse_args([]), False) is None


def test_compile_cache_option(tmp_path, monkeypatch):
    """--compile-cache DIR (default under the examples' cache root) sets JAX's persistent
    compilation cache; --no-compile-cache leaves it unset."""
    import caches

    monkeypatch.setenv("NAMEDAXES_CACHE", str(tmp_path))
    assert train_lm.parse_args([]).compile_cache == str(tmp_path / "jax")
    assert td.default_cache_dir() == tmp_path / "text"  # one root for both caches
    assert train_lm.parse_args(["--no-compile-cache"]).compile_cache is None
    assert train_lm.parse_args(["--compile-cache", "x"]).compile_cache == "x"
    before = jax.config.jax_compilation_cache_dir
    try:
        caches.use_compile_cache(None)
        assert jax.config.jax_compilation_cache_dir == before
        caches.use_compile_cache(tmp_path / "jax")
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "jax")
    finally:
        jax.config.update("jax_compilation_cache_dir", before)


def test_mesh_follows_the_devices_and_the_flag(capsys):
    auto = train_lm.make_mesh(None, explicit=False)
    assert dict(auto.shape) == {"data": 2, "model": 4}  # 8 CPU devices
    assert set(auto.axis_types) == {AxisType.Auto}
    given = train_lm.make_mesh("data=4,model=2", explicit=True)
    assert dict(given.shape) == {"data": 4, "model": 2}
    assert set(given.axis_types) == {AxisType.Explicit}
    with pytest.raises(SystemExit):
        train_lm.parse_args(["--help"])
    assert (
        "default: every accelerator on data, or the 8 simulated CPU devices as data=2,model=4"
        in (" ".join(capsys.readouterr().out.split()))
    )


def test_a_bad_mesh_flag_is_quoted_as_typed():
    """The error names the flag's own text (it quoted 'data:2,modl', a rewrite of it) and the fix
    in the flag's spelling."""
    with pytest.raises(
        na.MeshError,
        match=r"^Mesh string 'data=2,modl': 'modl' has no size and is not a mesh axis\. Available "
        r"axes: 'data', 'model'\. Write 'axis=N' with one of them\.$",
    ):
        train_lm.make_mesh("data=2,modl", explicit=False)
    with pytest.raises(
        na.MeshError, match=r"^Mesh string 'data=2,model': 'model' has no size: write 'model=N'\.$"
    ):
        train_lm.make_mesh("data=2,model", explicit=False)


@pytest.mark.parametrize("flag", ["--eval-every", "--checkpoint-every", "--eval-batches"])
def test_periods_and_counts_are_positive(flag, capsys):
    """0 reached `(step + 1) % 0` (ZeroDivisionError) after the data and model were built."""
    assert getattr(train_lm.parse_args([flag, "5"]), flag[2:].replace("-", "_")) == 5
    with pytest.raises(SystemExit):
        train_lm.parse_args([flag, "0"])
    assert f"argument {flag}: '0' is not a positive integer" in capsys.readouterr().err


def test_vocabulary_is_rounded_up_to_split_over_any_model_axis():
    assert train_lm.model_config(SIZE, 300).vocab_size == 384
    assert train_lm.model_config(SIZE, 50257).vocab_size == 50304
    assert train_lm.model_config(SIZE, 4096).vocab_size == 4096


def test_prompts_are_the_starts_of_heldout_documents(text):
    prompts = train_lm.heldout_prompts(text, 2, 12)
    assert prompts.shape == (2, 12) and prompts.dtype == np.int32
    docs = [doc for _, doc in text_data_documents(text)]
    starts = [text.decode(row) for row in prompts]
    assert all(any(doc.startswith(s) for doc in docs) for s in starts)
    assert starts[0] != starts[1]  # two documents, spread over the split


def text_data_documents(text):
    return td.discover(text.meta["source"]).documents("heldout")


def greedy_reference(model, ids, new_tokens):
    """Greedy decoding done slowly, without a cache: one compiled forward over a fixed buffer per
    new token (attention is causal: later positions do not change earlier logits)."""
    n, p = ids.shape
    buf = jnp.zeros((n, p + new_tokens), jnp.int32).at[:, :p].set(ids)
    for i in range(new_tokens):
        buf = buf.at[:, p + i].set(jnp.argmax(logits_at(model, buf, p + i - 1), -1))
    return np.asarray(buf)


@jax.jit
def logits_at(model, ids, i):
    return model(na.named(ids, ("batch", "position"))).array[:, i]


def test_continuations_of_heldout_prompts(one_process, text, monkeypatch):
    """Greedy and sampled continuations through ``models.generate``: greedy as a decoder without
    cache has it, decoded up to the first end-of-text token."""
    calls, generate = [], models.generate

    def recording(model, prompt, **options):
        calls.append(dict(options, axes=prompt.axis_names, shape=prompt.array.shape))
        return generate(model, prompt, **options)

    monkeypatch.setattr(models, "generate", recording)
    with jax.set_mesh(mesh_of(AxisType.Auto)):
        samples = train_lm.continuations(one_process.model, text, n=2, prompt_tokens=8,
                                         new_tokens=6)  # fmt: skip
        want = greedy_reference(one_process.model, train_lm.heldout_prompts(text, 2, 8), 6)
    assert [c.get("temperature", 0.0) for c in calls] == [0.0, 0.8]
    assert calls[1]["top_k"] == 40 and calls[1]["key"] is not None
    assert all(c["axes"] == ("batch", "position") and c["shape"] == (2, 8) for c in calls)
    assert all(c["eos_token_id"] == text.eos_id for c in calls)
    for (prompt, greedy, sampled), row in zip(samples, want):
        assert prompt == text.decode(row[:8])
        new = list(row[8:])
        assert greedy == text.decode(new[: new.index(text.eos_id) if text.eos_id in new else 6])
        assert isinstance(sampled, str)


def test_export_loads_back_with_its_tokenizer(one_process, text, tmp_path):
    train_lm.save_for_transformers(one_process.model, text, str(tmp_path))
    names = {p.name for p in tmp_path.iterdir()}
    assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= names
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["eos_token"] == td.EOS
    again = models.from_hf(tmp_path)
    ids = na.named(jnp.asarray(train_lm.heldout_prompts(text, 2, 8)), ("batch", "position"))
    with jax.set_mesh(mesh_of(AxisType.Auto)):
        want = jax.jit(lambda m, x: m(x))(one_process.model, ids)
    got = again(ids)
    np.testing.assert_allclose(np.asarray(got.array), np.asarray(want.array), atol=1e-5)
    reloaded = td.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    sample = "def f(x):\n    return x\n"
    assert reloaded.encode(sample).ids == list(text.encode(sample))
