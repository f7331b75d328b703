"""The main example's model (benchmarks/_twin.py: examples/train_lm.py's Llama-style Transformer,
loss, optimizer and na.fsdp step) against its plain-JAX twin on a tiny config: hand-written specs
equal what namedaxes resolves, losses agree step by step, and the compiled training steps contain
the same collectives. Speed is measured by benchmarks/model_step.py and benchmarks/accelerator.py."""

import re
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding

import namedaxes as na

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import _twin as tw  # noqa: E402

STEPS = 3
_RESULTS = {}


def twin_run(kind):
    """Train both for STEPS steps from the same values; compiled HLO of both steps. Cached per kind."""
    if kind in _RESULTS:
        return _RESULTS[kind]
    size = tw.TINY
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(kind,) * 2)
    model, n_state = tw.named_init(size, mesh)
    specs = {
        name: na.pspec_for(x, tw.PARAMS, mesh=mesh) for name, x in _named_leaves(model).items()
    }
    init, p_step = tw.plain_step(size, mesh)
    params, p_state = init(tw.plain_params(model))
    n_step = tw.named_step(size)
    n_losses, p_losses = [], []
    with jax.set_mesh(mesh):
        for tokens in tw.batches(size, STEPS):
            batch = na.shard(tw.named_batch(tokens), tw.COMPUTE)
            model, n_state, loss = n_step(model, n_state, batch)
            n_losses.append(float(loss))
            p_batch = jax.device_put(tokens, NamedSharding(mesh, tw.BATCH_SPEC))
            params, p_state, loss = p_step(params, p_state, p_batch)
            p_losses.append(float(loss))
        n_hlo = n_step.lower(model, n_state, batch).compile().as_text()
        p_hlo = p_step.lower(params, p_state, p_batch).compile().as_text()
    _RESULTS[kind] = dict(
        specs=specs,
        n_losses=n_losses,
        p_losses=p_losses,
        params=params,
        model=model,
        named=tw.collectives(n_hlo),
        plain=tw.collectives(p_hlo),
    )
    return _RESULTS[kind]


def _named_leaves(model):
    """The named model's NamedArrays under the twin's plain names (same order as plain_params)."""
    plain = tw.plain_params(model)
    by_id = {
        id(x.array): x
        for x in jax.tree.leaves(model, is_leaf=na.is_named_array)
        if isinstance(x, na.NamedArray)
    }
    return {name: by_id[id(array)] for name, array in plain.items()}


def _trim(spec):
    entries = list(spec)
    while entries and entries[-1] is None:
        entries.pop()
    return tuple(entries)


@pytest.mark.parametrize("kind", [AxisType.Auto, AxisType.Explicit], ids=["auto", "explicit"])
def test_twin_specs_and_losses_agree(kind):
    res = twin_run(kind)
    assert {n: _trim(s) for n, s in res["specs"].items()} == {
        n: _trim(s) for n, s in tw.PARAM_SPECS.items()
    }
    np.testing.assert_allclose(res["n_losses"], res["p_losses"], rtol=1e-5)
    assert res["n_losses"][-1] < res["n_losses"][0]  # it trains
    # After training, the parameters still agree and keep the hand-written layout.
    up = res["model"].layers.stacked.mlp.up.weight.array
    np.testing.assert_allclose(
        np.asarray(up), np.asarray(res["params"]["up"]), rtol=1e-4, atol=1e-6
    )
    assert _trim(up.sharding.spec) == _trim(tw.PARAM_SPECS["up"])


@pytest.mark.parametrize("kind", [AxisType.Auto, AxisType.Explicit], ids=["auto", "explicit"])
def test_twin_compiles_to_the_same_collectives(kind):
    res = twin_run(kind)
    named, plain = res["named"], res["plain"]
    assert tw.counts(named) == tw.counts(plain)
    assert {op: sorted(s) for op, s in named.items()} == {op: sorted(s) for op, s in plain.items()}
    assert sum(tw.counts(plain).values()) > 0  # the parser sees the FSDP gathers at all


def _moved(found):
    """Per collective, the arrays it moves: tuples flattened, scalars and size-1 dimensions dropped
    (XLA groups scalar all-reduces as it likes, and gathers a layer's weight before or after the
    unit-size slice of the stacked one depending on how the slice's sharding is stated)."""
    moved = {}
    for op, shapes in found.items():
        arrays = []
        for shape in shapes:
            for dtype, dims in re.findall(r"(\w+)\[([^\]]*)\]", shape):
                kept = [d for d in dims.split(",") if d and d != "1"]
                if kept:
                    arrays.append(f"{dtype}[{','.join(kept)}]")
        moved[op] = sorted(arrays)
    return moved


def test_explicit_mesh_compiles_to_the_collectives_of_the_auto_mesh():
    """The same model moves the same arrays on both mesh kinds: on an Explicit mesh the embedding
    lookup and the loss reduce the vocabulary where it lies (split over `model`) as XLA does on an
    Auto mesh, gathering neither the table nor the (batch, position, vocab) log-probabilities."""
    auto, explicit = (
        _moved(twin_run(AxisType.Auto)["named"]),
        _moved(twin_run(AxisType.Explicit)["named"]),
    )
    assert explicit == auto
    vocab = tw.model_config(tw.TINY, tw.TINY.vocab).vocab_size
    assert not any(str(vocab) in s for s in explicit["all-gather"])


def test_collective_parser():
    hlo = """
  %all-gather.1 = f32[16]{0} all-gather(%x), channel_id=1, dimensions={0}
  %ag-start = (f32[8]{0}, f32[16]{0}) all-gather-start(%y), channel_id=2
  %ar = (f32[8,16]{1,0}, /*index=1*/f32[]) all-reduce(%a, %b), to_apply=%sum
  %ar2 = (f32[], f32[4]{0}) all-reduce(%c, %d), to_apply=%sum
  %cp = s32[4]{0} collective-permute(%z), source_target_pairs={{0,1}}
  %add = f32[16]{0} add(%p, %q)
"""
    found = tw.collectives(hlo)
    assert found["all-gather"] == ["f32[16]", "(f32[16], f32[8])"]
    assert found["all-reduce"] == [
        "(f32[8,16], f32[])",
        "(f32[4], f32[])",
    ]  # tuple order normalized
    assert found["collective-permute"] == ["s32[4]"]
    assert tw.counts(found)["reduce-scatter"] == 0
