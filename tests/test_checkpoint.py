"""namedaxes.checkpoint: save on one mesh/mapping, restore on another; errors; atomicity; interchange."""

import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from _helpers import run_two_processes, spec_of
from _meshes import make_mesh
from jax.sharding import NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

import namedaxes as na
from namedaxes import (
    CheckpointAxisError,
    CheckpointDtypeError,
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointStructureError,
    DonatedArrayError,
    MeshError,
    MeshTypeError,
    NamedTypeError,
)
from namedaxes.checkpoint import (
    CheckpointManager,
    from_state_dict,
    load_safetensors,
    restore,
    save,
    save_safetensors,
    to_state_dict,
)

MAPPING = {"batch": "data", "embed": "model"}
DATA = np.arange(64, dtype=np.float32).reshape(8, 8)


def _model(mesh, mapping=MAPPING):
    """A small tree: a sharded NamedArray, a plain array, nested containers and Python scalars."""
    x = na.shard(na.named(jnp.asarray(DATA), ("batch", "embed")), mapping, mesh=mesh)
    return {
        "x": x,
        "bias": jnp.arange(4, dtype=jnp.int32),
        "layers": [{"scale": na.named(jnp.ones(8, jnp.bfloat16), "embed")}, (1.5, True)],
        "step": 7,
        "name": "run-1",
    }


def _values(tree):
    """Every leaf as a list of floats (strings as they are), to compare trees by value."""
    leaves = jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, na.NamedArray))
    return [
        x
        if isinstance(x, str)
        else np.asarray(x.array if isinstance(x, na.NamedArray) else x, dtype=np.float32).tolist()
        for x in leaves
    ]


# -- resharding ---------------------------------------------------------------------------------


def test_saved_structure_comes_back_without_like(tmp_path, mesh_2x4):
    save(tmp_path / "c", _model(mesh_2x4))
    with (
        jax.set_mesh(make_mesh((8,), ("data",), mesh_2x4.axis_types[0])),
        na.axis_mapping({"batch": "data"}),
    ):
        out = restore(tmp_path / "c")
    assert set(out) == {"x", "bias", "layers", "step", "name"}
    assert out["x"].axis_names == ("batch", "embed") and out["x"].sharding.spec == P("data", None)
    np.testing.assert_array_equal(np.asarray(out["x"].array), DATA)
    assert out["layers"][0]["scale"].dtype == jnp.bfloat16
    assert out["layers"][0]["scale"].sharding.spec == P(None)  # embed has no rule here
    assert out["layers"][1] == [1.5, True] and type(out["layers"][1][1]) is bool  # tuples: lists
    assert (out["step"], out["name"]) == (7, "run-1")
    assert out["bias"].sharding.spec == P() and out["bias"].tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "shape, names, mapping",
    [
        ((8,), ("data",), {"batch": "data"}),  # (data=2, model=4) -> (data=8)
        ((4,), ("model",), {"embed": "model"}),  # -> 4 devices
        (
            (2, 4),
            ("data", "model"),
            {"batch": "model", "embed": "data"},
        ),  # same mesh, other mapping
        ((2, 2, 2), ("data", "model", "replica"), {"batch": ("data", "replica"), "embed": "model"}),
    ],
    ids=["8", "4dev", "other-mapping", "2x2x2"],
)
def test_restore_reshards_onto_another_mesh_and_mapping(
    tmp_path, mesh_2x4, axis_type, shape, names, mapping
):
    saved = _model(mesh_2x4)
    save(tmp_path / "c", saved)
    n = int(np.prod(shape))
    mesh = jax.make_mesh(
        shape, names, axis_types=(axis_type,) * len(names), devices=jax.devices()[:n]
    )
    like = eqx.filter_eval_shape(lambda: saved)
    out = restore(tmp_path / "c", like, mapping=mapping, mesh=mesh)
    assert jax.tree.structure(out) == jax.tree.structure(saved)
    assert _values(out) == _values(saved)
    x = out["x"]
    expected = na.resolve(x.axes, mapping, mesh)
    assert x.sharding == NamedSharding(mesh, expected)
    factors = [
        1
        if e is None
        else int(np.prod([mesh.shape[a] for a in ((e,) if isinstance(e, str) else e)]))
        for e in tuple(expected) + (None,) * (2 - len(expected))
    ]
    assert {s.data.shape for s in x.array.addressable_shards} == {
        (8 // factors[0], 8 // factors[1])
    }
    for s in x.array.addressable_shards:  # every device holds exactly its slice
        np.testing.assert_array_equal(np.asarray(s.data), DATA[s.index])
    # plain leaves of an eval_shape like have no sharding: replicated on the new mesh
    assert out["bias"].sharding == NamedSharding(mesh, P())


def test_restore_uses_the_mapping_and_mesh_in_force(tmp_path, mesh_2x4):
    like = _model(mesh_2x4)
    save(tmp_path / "c", like)
    mesh = make_mesh((8,), ("data",), mesh_2x4.axis_types[0])
    with jax.set_mesh(mesh), na.axis_mapping({"embed": "data"}):
        out = restore(tmp_path / "c", like)
    assert out["x"].sharding == NamedSharding(mesh, P(None, "data"))
    assert out["layers"][0]["scale"].sharding == NamedSharding(mesh, P("data"))
    # an uncommitted plain array (jnp.arange) carries no placement: replicated on the mesh in
    # force, so the tree is on one device set (it came back committed to device 0 and a jit over
    # the tree failed); one committed to a device keeps that placement
    assert not like["bias"].committed
    assert out["bias"].sharding == NamedSharding(mesh, P())
    jax.jit(lambda b, x: (b.sum(), x.array.sum()))(out["bias"], out["x"])
    pinned = {"bias": jax.device_put(like["bias"], jax.devices()[1])}
    with jax.set_mesh(mesh):
        kept = restore(tmp_path / "c", pinned)
    assert kept["bias"].sharding == SingleDeviceSharding(jax.devices()[1])


def test_like_axis_order_wins(tmp_path, mesh_2x4):
    save(tmp_path / "c", {"x": _model(mesh_2x4)["x"]})
    like = {"x": na.named(jax.ShapeDtypeStruct((8, 8), jnp.float32), ("embed", "batch"))}
    out = restore(tmp_path / "c", like, mapping=MAPPING, mesh=mesh_2x4)["x"]
    assert out.axis_names == ("embed", "batch")
    assert out.sharding == NamedSharding(mesh_2x4, P("model", "data"))
    np.testing.assert_array_equal(np.asarray(out.array), DATA.T)


def test_without_mapping_named_arrays_keep_like_sharding_or_replicate(tmp_path, mesh_2x4):
    tree = _model(mesh_2x4)
    save(tmp_path / "c", tree)
    out = restore(tmp_path / "c", tree)  # no mapping, no mesh: like's shardings
    assert out["x"].sharding == tree["x"].sharding
    single = restore(tmp_path / "c")  # nothing at all: whole on the first local device
    assert single["x"].sharding == SingleDeviceSharding(jax.local_devices()[0])
    on_mesh = restore(tmp_path / "c", mesh=mesh_2x4)  # a mesh but no mapping: replicated
    assert on_mesh["x"].sharding == NamedSharding(mesh_2x4, P())


class _Lin(eqx.Module):
    """A module with a plain-array weight named by ``field(axis_names=...)``."""

    weight: jax.Array = na.field(axis_names=("embed", "mlp"))
    bias: jax.Array


def test_restore_places_field_axis_names_arrays_by_name(tmp_path, axis_type):
    """Weights declared with field(axis_names=...) came back replicated (eval_shape like) or on
    one device (concrete like), where na.shard of the same module places them by name."""
    mesh = make_mesh((8,), ("model",), axis_type)
    lin = _Lin(jnp.arange(128.0).reshape(16, 8), jnp.zeros(8))
    save(tmp_path / "c", lin)
    with jax.set_mesh(mesh), na.axis_mapping({"embed": "model"}):
        expected = na.shard(lin).weight.sharding
        outs = [restore(tmp_path / "c", jax.eval_shape(lambda: lin)), restore(tmp_path / "c", lin)]
    outs.append(restore(tmp_path / "c", lin, mapping={"embed": "model"}, mesh=mesh))
    for out in outs:
        assert out.weight.sharding == expected == NamedSharding(mesh, P("model", None))
        assert {s.data.shape for s in out.weight.addressable_shards} == {(2, 8)}
        np.testing.assert_array_equal(np.asarray(out.weight), np.asarray(lin.weight))
    assert outs[0].bias.sharding == NamedSharding(mesh, P())  # no names, no like sharding
    # without like, the recorded names place it too (it came back replicated)
    plain = restore(tmp_path / "c", mapping={"embed": "model"}, mesh=mesh)
    assert plain["weight"].sharding == NamedSharding(mesh, P("model", None))
    assert plain["bias"].sharding == NamedSharding(mesh, P())


class _LinT(eqx.Module):
    """``_Lin``'s weight declared in the other axis order."""

    weight: jax.Array = na.field(axis_names=("mlp", "embed"))
    bias: jax.Array


def test_field_axis_names_arrays_are_aligned_by_name(tmp_path):
    """field(axis_names=...) arrays were saved by position: a square (embed, mlp) weight loaded
    untransposed into an (mlp, embed) field, and a NamedArray and a field with the same names
    were refused as different kinds. Their names are now saved and checked, as a NamedArray's."""
    data = np.arange(32.0, dtype=np.float32).reshape(4, 8)
    square = data[:, :4]
    save(tmp_path / "sq", _Lin(jnp.asarray(square), jnp.zeros(2)))
    out = restore(tmp_path / "sq", _LinT(jnp.zeros((4, 4)), jnp.zeros(2)))
    np.testing.assert_array_equal(np.asarray(out.weight), square.T)
    # a field and a NamedArray with the same names restore into each other, by name
    save(tmp_path / "f", _Lin(jnp.asarray(data), jnp.zeros(2)))
    named = {"weight": na.named(jnp.zeros((8, 4)), ("mlp", "embed")), "bias": jnp.zeros(2)}
    back = restore(tmp_path / "f", named)["weight"]
    assert back.axis_names == ("mlp", "embed")
    np.testing.assert_array_equal(np.asarray(back.array), data.T)
    save(tmp_path / "n", {**named, "weight": na.named(jnp.asarray(data), ("embed", "mlp"))})
    out = restore(tmp_path / "n", _LinT(jnp.zeros((8, 4)), jnp.zeros(2)))
    np.testing.assert_array_equal(np.asarray(out.weight), data.T)
    with pytest.raises(
        CheckpointAxisError,
        match=r"^Leaf 'weight': the checkpoint has axes \(embed=4, mlp=8\) but like has "
        r"\(mlp=8, hidden=4\)\. Restore into a like with the saved axis names",
    ):
        restore(tmp_path / "f", {"weight": na.named(jnp.zeros((8, 4)), ("mlp", "hidden"))})
    # state dicts align a named entry to a field like by name as well
    state = {
        "weight": na.named(jnp.asarray(data), ("embed", "mlp")),
        "bias": np.zeros(2, np.float32),
    }
    out = from_state_dict(_LinT(jnp.zeros((8, 4)), jnp.zeros(2)), state)
    np.testing.assert_array_equal(np.asarray(out.weight), data.T)


def test_explicit_mesh_wins_over_like_shardings(tmp_path, axis_type):
    """restore(like, mesh=m8) left leaves whose like was placed on another mesh there, and plain
    jnp arrays (one device) on their device: a tree spread over two device sets, which jit
    refused. An explicit mesh= now takes every leaf onto it (the one-device ones replicated)."""
    m4 = jax.make_mesh((4,), ("data",), axis_types=(axis_type,), devices=jax.devices()[:4])
    m8 = make_mesh((8,), ("data",), axis_type)
    w = na.shard(na.named(jnp.arange(16.0), "embed"), {"embed": "data"}, mesh=m4)
    b = jax.device_put(jnp.arange(8.0), NamedSharding(m4, P("data")))
    one = {"c": jnp.arange(8.0), "d": jax.device_put(jnp.ones(8), jax.devices()[1])}
    like = {"w": w, "b": b, **one}
    save(tmp_path / "c", like)
    for mapping in (None, {"embed": "data"}):
        out = restore(tmp_path / "c", like, mapping=mapping, mesh=m8)
        assert out["w"].sharding == out["b"].sharding == NamedSharding(m8, P("data"))
        assert {s.data.shape for s in out["b"].addressable_shards} == {(1,)}
        assert out["c"].sharding == out["d"].sharding == NamedSharding(m8, P())
        assert _values(out) == _values(like)
        total = jax.jit(lambda t: t["w"].array.sum() + t["b"] + t["c"] + t["d"])(out)
        assert total.sharding.mesh == m8
    with jax.set_mesh(m8):  # a mesh in force (not given): like's own placement is kept
        out = restore(tmp_path / "c", like)
    assert out["b"].sharding == b.sharding and out["d"].sharding == one["d"].sharding
    small = jax.device_put(jnp.arange(4.0), NamedSharding(m4, P("data")))
    save(tmp_path / "s", {"b": small})
    with pytest.raises(
        MeshError,
        match=r"^like leaf 'b' is sharded P\('data',\) on Mesh\(data=4\), and restore reads it "
        r"onto the mesh= given, Mesh\(data=8\), with that spec, but dimension 0 of shape \(4,\) "
        r"has size 4, which is not divisible by 8 .* Build like on the mesh to read onto \(or "
        r"leave out mesh= to keep like's placement\)\.$",
    ):
        restore(tmp_path / "s", {"b": small}, mesh=m8)


def test_equinox_module_and_optax_adamw_state_round_trip(tmp_path, mesh_2x4):
    class Block(eqx.Module):
        w: na.NamedArray
        b: jax.Array
        act: object = jax.nn.gelu  # not data: restored from like

    params = Block(
        na.shard(na.named(jnp.asarray(DATA), ("batch", "embed")), MAPPING, mesh=mesh_2x4),
        jnp.ones(3),
    )
    opt = optax.adamw(1e-2)
    arrays = eqx.filter(params, eqx.is_array)
    state = opt.init(arrays)
    with jax.numpy_dtype_promotion("standard"):  # optax's bias correction mixes float and int32
        _, state = opt.update(jax.tree.map(lambda p: p * 0.5, arrays), state, arrays)
    save(tmp_path / "c", {"params": params, "opt": state, "epoch": 2})
    like = eqx.filter_eval_shape(lambda: {"params": params, "opt": state, "epoch": 0})
    like = {**like, "epoch": 0}
    out = restore(tmp_path / "c", like, mapping=MAPPING, mesh=mesh_2x4)
    assert jax.tree.structure(out) == jax.tree.structure(
        {"params": params, "opt": state, "epoch": 2}
    )
    assert out["params"].act is jax.nn.gelu and out["epoch"] == 2
    assert _values(out["opt"]) == _values(state)
    assert int(out["opt"][0].count) == 1 and out["opt"][0].count.dtype == jnp.int32
    assert out["opt"][0].mu.w.sharding.spec == P("data", "model")


def _train_state(mesh):
    """A model (an equinox module) and its adamw state after one update, as a training loop saves."""

    class Block(eqx.Module):
        w: na.NamedArray
        b: jax.Array

    model = Block(
        na.shard(na.named(jnp.asarray(DATA), ("batch", "embed")), MAPPING, mesh=mesh), jnp.ones(3)
    )
    opt = optax.adamw(1e-2)
    state = opt.init(model)
    with jax.numpy_dtype_promotion("standard"):  # optax's bias correction mixes float and int32
        _, state = opt.update(jax.tree.map(lambda p: p * 0.5, model), state, model)
    return model, state


def test_restore_part_of_a_checkpoint_reads_only_that_part(tmp_path, mesh_2x4, monkeypatch):
    """A like that is part of the saved tree (the model of a {model, opt_state, step} checkpoint,
    for export or evaluation) restores that part, placed by the mapping, and reads no other array;
    the manager's restore does the same."""
    model, state = _train_state(mesh_2x4)
    tree = {"model": model, "opt_state": state, "step": 3}
    save(tmp_path / "c", tree)
    like = {"model": eqx.filter_eval_shape(lambda: model)}
    read = []
    deserialize = ocp.type_handlers.ArrayHandler.deserialize

    async def spy(self, infos, args=None):
        read.extend(info.name for info in infos)
        return await deserialize(self, infos, args)

    monkeypatch.setattr(ocp.type_handlers.ArrayHandler, "deserialize", spy)
    out = restore(tmp_path / "c", like, mapping={"embed": "model"}, mesh=mesh_2x4)
    assert sorted(read) == ["model.b", "model.w"]  # nothing of opt_state
    assert jax.tree.structure(out) == jax.tree.structure({"model": model})
    assert out["model"].w.sharding.spec == P(None, "model")
    assert _values(out) == _values({"model": model})
    part = {"opt_state": [{"mu": {"w": like["model"].w}}], "step": 0}  # any part, nested too
    out = restore(tmp_path / "c", part, mapping=MAPPING, mesh=mesh_2x4)
    assert out["step"] == 3 and out["opt_state"][0]["mu"]["w"].sharding.spec == P("data", "model")
    np.testing.assert_array_equal(out["opt_state"][0]["mu"]["w"].array, state[0].mu.w.array)
    with CheckpointManager(tmp_path / "run") as mgr:
        mgr.save(0, tree)
        out = mgr.restore(like, mapping={"embed": "model"}, mesh=mesh_2x4)
    assert out["model"].w.sharding.spec == P(None, "model") and _values(out) == _values(
        {"model": model}
    )


def test_a_like_that_is_not_part_of_the_checkpoint_is_refused(tmp_path, mesh_2x4):
    model, state = _train_state(mesh_2x4)
    save(tmp_path / "c", {"model": model, "opt_state": state})
    with pytest.raises(  # the saved model's leaves are under 'model': say how to ask for them
        CheckpointStructureError,
        match=r"like has 2 leaf/leaves the checkpoint lacks: 'w', 'b'\. They are saved under "
        r"'model': restore into \{'model': like\}\.$",
    ):
        restore(tmp_path / "c", model)
    save(tmp_path / "d", {"train": {"model": model}})
    with pytest.raises(CheckpointStructureError, match=r"\{'train': \{'model': like\}\}\.$"):
        restore(tmp_path / "d", model)
    with pytest.raises(
        CheckpointStructureError,
        match=r"like has 1 leaf/leaves the checkpoint lacks: 'model\.c'\. Restore into the "
        r"structure that was saved or a part of it \(checkpoint leaves: 'model\.w', 'model\.b', ",
    ):
        restore(tmp_path / "c", {"model": {"w": model.w, "c": model.b}})


def test_python_scalars_into_a_jax_eval_shape_like(tmp_path, mesh_2x4):
    tree = {"step": 7, "lr": 0.5, "x": na.named(jnp.ones(8), "embed")}
    save(tmp_path / "c", tree)
    like = jax.eval_shape(lambda: tree)  # Python numbers become 0-d ShapeDtypeStructs
    out = restore(tmp_path / "c", like, mapping={"embed": "model"}, mesh=mesh_2x4)
    assert out["step"].dtype == jnp.int32 and int(out["step"]) == 7 and float(out["lr"]) == 0.5
    assert out["step"].sharding == NamedSharding(mesh_2x4, P())
    assert out["x"].sharding.spec == P("model")
    bad = {**like, "step": jax.ShapeDtypeStruct((), jnp.float32)}
    with pytest.raises(
        CheckpointDtypeError,
        match=r"Leaf 'step' is a Python int \(7\) in the checkpoint but an array of float32 in like\. Build like with a matching scalar, or pass cast=True\.",
    ):
        restore(tmp_path / "c", bad, mapping={"embed": "model"}, mesh=mesh_2x4)
    assert (
        float(
            restore(tmp_path / "c", bad, mapping={"embed": "model"}, mesh=mesh_2x4, cast=True)[
                "step"
            ]
        )
        == 7.0
    )


def test_numpy_scalars_are_saved_as_0d_arrays(tmp_path):
    """np.bool_ had no orbax handler (a bare ValueError mid-save); NumPy scalars save as 0-d
    arrays and come back with their dtype."""
    tree = {"flag": np.bool_(True), "lr": np.float32(0.5), "n": np.uint8(4)}
    save(tmp_path / "c", tree)
    out = restore(tmp_path / "c", tree)
    assert {k: (v.dtype, v.item()) for k, v in out.items()} == {
        "flag": (np.dtype(bool), True), "lr": (np.dtype("float32"), 0.5),
        "n": (np.dtype("uint8"), 4),
    }  # fmt: skip


def test_eval_shape_like_under_the_context_mesh(tmp_path, mesh_2x4):
    """``restore`` and ``from_state_dict`` into an ``eqx.filter_eval_shape`` like built under
    ``jax.set_mesh``, no ``mesh=``: on Explicit meshes the like's shardings are on an abstract mesh,
    and JAX's "not implemented for AbstractMesh" leaked out."""
    explicit = mesh_2x4.axis_types[0] == jax.sharding.AxisType.Explicit
    tree = {"w": na.named(jnp.asarray(DATA[:, :4]), ("embed", "mlp")), "b": jnp.arange(4.0)}
    save(tmp_path / "c", tree)
    state = {"w": DATA[:, :4], "b": np.arange(4.0, dtype=np.float32)}

    def build():
        w = na.named(jnp.zeros((8, 4)), ("embed", "mlp"))
        return {"w": na.shard(w, {"embed": "data"}), "b": jnp.zeros(4)}

    with jax.set_mesh(mesh_2x4):
        like = eqx.filter_eval_shape(build)
        restored = restore(tmp_path / "c", like)
        converted = from_state_dict(like, state)
    for out in (restored, converted):
        assert _values(out) == _values(tree)
        # Explicit: like's sharding (in its type); Auto: like has none, so replicated on the mesh
        assert out["w"].sharding.mesh == mesh_2x4 and out["b"].sharding.mesh == mesh_2x4
        assert spec_of(out["w"]) == (P("data") if explicit else P())
    if explicit:  # outside the mesh's context the abstract shardings have no devices to go to
        message = (
            r"like leaf 'b' is sharded P\(None,\) on an abstract mesh Mesh\(data=2, "
            r"model=4\) \(jax.eval_shape under jax.set_mesh gives those\), which has no devices "
            r"to read onto, and no concrete mesh is set\. Call this inside `with "
            r"jax.set_mesh\(mesh\):` with the mesh like was built under"
        )
        with pytest.raises(MeshError, match=message):
            restore(tmp_path / "c", like)
        with pytest.raises(MeshError, match=message):
            from_state_dict(like, state)


# -- bad input ----------------------------------------------------------------------------------


@pytest.fixture
def saved(tmp_path, mesh_2x4):
    tree = _model(mesh_2x4)
    save(tmp_path / "c", tree)
    return tmp_path / "c", tree


def test_axis_name_and_size_mismatch(saved):
    path, tree = saved
    renamed = {**tree, "x": na.named(tree["x"].array, ("batch", "hidden"))}
    with pytest.raises(
        CheckpointAxisError,
        match=r"Leaf 'x': the checkpoint has axes \(batch=8, embed=8\) but like has \(batch=8, hidden=8\)",
    ):
        restore(path, renamed)
    resized = {**tree, "x": na.named(jax.ShapeDtypeStruct((8, 4), jnp.float32), ("batch", "embed"))}
    with pytest.raises(
        CheckpointAxisError,
        match=r"Leaf 'x': axis 'embed' has size 8 in the checkpoint but 4 in like",
    ):
        restore(path, resized)
    with pytest.raises(
        CheckpointAxisError,
        match=r"Leaf 'bias' has shape \(4,\) in the checkpoint but \(5,\) in like",
    ):
        restore(path, {**tree, "bias": jnp.zeros(5, jnp.int32)})


def test_missing_extra_and_kind_mismatch(saved):
    path, tree = saved
    with pytest.raises(
        CheckpointStructureError, match=r"like has 1 leaf/leaves the checkpoint lacks: 'extra'"
    ):
        restore(path, {**tree, "extra": jnp.zeros(2)})
    with pytest.raises(  # a part of the saved tree may be restored, but not with new leaves
        CheckpointStructureError, match=r"like has 1 leaf/leaves the checkpoint lacks: 'extra'"
    ):
        restore(path, {"bias": tree["bias"], "extra": jnp.zeros(2)})
    with pytest.raises(
        CheckpointStructureError,
        match=r"Leaf 'x' is a NamedArray in the checkpoint but a plain array in like \(ArrayImpl\)",
    ):
        restore(path, {**tree, "x": tree["x"].array})


def test_dtype_mismatch_and_cast(saved):
    path, tree = saved
    like = {**tree, "bias": jnp.zeros(4, jnp.float32), "step": 0.0}
    with pytest.raises(
        CheckpointDtypeError,
        match=r"Leaf 'bias' is int32 in the checkpoint but like has float32\. Pass cast=True",
    ):
        restore(path, like)
    out = restore(path, like, cast=True)
    assert out["bias"].dtype == jnp.float32 and out["bias"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert out["step"] == 7.0 and type(out["step"]) is float
    with pytest.raises(
        CheckpointDtypeError,
        match=r"Leaf 'step' is a Python int \(7\) in the checkpoint but a float in like",
    ):
        restore(path, {**tree, "step": 0.0})


def test_casts_follow_astype_and_refuse_what_like_cannot_hold(tmp_path, mesh_2x4):
    """Saved Python scalars that like's type or dtype cannot hold raised bare OverflowError,
    ValueError or TypeError; cast arrays went through TensorStore's conversion, which wraps
    (300.7 into int8 gave 44 where astype gives 127)."""
    x = jnp.array([1.5, -2.25, 300.7, 0.1, 7.0, -1.0, 2.5, 9.9])
    save(tmp_path / "c", {"step": 2**40, "name": "run7", "z": 1 + 2j, "x": x})
    big = (
        r"^Leaf 'step' is a Python int \(1099511627776\) in the checkpoint, which int32 cannot hold"
    )
    for cast in (False, True):
        with pytest.raises(CheckpointDtypeError, match=big):
            restore(tmp_path / "c", {"step": jax.ShapeDtypeStruct((), jnp.int32)}, cast=cast)
    refused = [
        ({"name": 0}, r"'name' is a Python str \('run7'\) in the checkpoint, which int\(\) cannot"),
        ({"name": jax.ShapeDtypeStruct((), jnp.float32)}, r"'name' .*, which float32 cannot hold"),
        ({"z": 0.0}, r"'z' is a Python complex \(\(1\+2j\)\) in the checkpoint, which float\(\)"),
    ]
    for like, match in refused:
        with pytest.raises(CheckpointDtypeError, match=match):
            restore(tmp_path / "c", like, cast=True)
    sharding = NamedSharding(mesh_2x4, P("model"))
    for dtype in (jnp.int8, jnp.uint8, jnp.bfloat16):
        like = {"x": jax.ShapeDtypeStruct((8,), dtype, sharding=sharding)}
        out = restore(tmp_path / "c", like, cast=True)["x"]
        assert out.dtype == dtype and out.sharding == sharding
        np.testing.assert_array_equal(np.asarray(out), np.asarray(x.astype(dtype)))


def test_paths_without_a_checkpoint(tmp_path, saved):
    path, tree = saved
    with pytest.raises(
        CheckpointNotFoundError, match=r"No checkpoint at '.*nowhere': the path does not exist"
    ):
        restore(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(
        CheckpointNotFoundError, match=r"empty': it is an unfinished save \(no 'commit_success.txt'"
    ):
        restore(tmp_path / "empty")
    assert issubclass(CheckpointNotFoundError, FileNotFoundError)
    with pytest.raises(
        CheckpointNotFoundError, match=r"No checkpoint of step 3 in .*: the path does not exist"
    ):
        restore(path, step=3)
    with pytest.raises(
        CheckpointError,
        match=r"already exists\. Save to a new path or step, or pass overwrite=True",
    ):
        save(path, tree)
    save(path, {"only": 1}, overwrite=True)
    assert restore(path) == {"only": 1}
    save(tmp_path / "new" / "parents" / "c", {"only": 2})  # missing parents are created
    assert restore(tmp_path / "new" / "parents" / "c") == {"only": 2}


def test_other_bad_input(tmp_path, saved, mesh_2x4):
    path, tree = saved
    with pytest.raises(
        MeshError,
        match=r"restore has a mapping \(\{'batch': 'data'\}\) to place NamedArrays with but no mesh",
    ):
        restore(path, mapping={"batch": "data"})
    with pytest.raises(
        MeshTypeError, match=r"restore needs a concrete jax.sharding.Mesh.*got dict"
    ):
        restore(path, mesh={"data": 8})
    with pytest.raises(  # a mapping-level error: no leaf is to blame
        na.ShardingError, match=r"^The axis mapping names mesh axis 'nope'"
    ):
        restore(path, mapping={"embed": "nope"}, mesh=mesh_2x4)
    with pytest.raises(
        NamedTypeError, match=r"Leaf 'a' is ShapeDtypeStruct .* which holds no values to save"
    ):
        save(tmp_path / "abstract", {"a": jax.ShapeDtypeStruct((2,), jnp.float32)})
    with pytest.raises(
        NamedTypeError,
        match=r"Leaf 'k' holds typed PRNG keys \(key<fry>\)\. Save jax.random.key_data\(key\)",
    ):
        save(tmp_path / "key", {"k": jax.random.key(0)})
    with pytest.raises(
        CheckpointStructureError, match=r"Leaves 'a/b' and 'a\.b' both have the dotted key 'a\.b'"
    ):
        save(tmp_path / "clash", {"a.b": 1, "a": {"b": 2}})
    save(tmp_path / "fn", {"f": jax.nn.relu, "w": jnp.ones(2)})
    with pytest.raises(
        CheckpointStructureError, match=r"Leaves 'f' are not data .*restore needs like=\.\.\."
    ):
        restore(tmp_path / "fn")
    with pytest.raises(NamedTypeError, match=r"save step must be an int >= 0, got -1"):
        save(tmp_path, tree, step=-1)


def test_restore_errors_name_the_leaf_at_fault(tmp_path, axis_type):
    """A mapping error was reported as 'Cannot place leaf <first leaf>', whichever leaf (or none)
    was at fault."""
    mesh = make_mesh((8,), ("data",), axis_type)
    tree = {
        "a": na.named(jnp.ones(8), "batch"),
        "z": na.named(jnp.ones((6, 4)), ("vocab", "embed")),
    }
    save(tmp_path / "c", tree)
    for like in (None, tree):
        with pytest.raises(
            na.ShardingError, match=r"leaf 'z'.*Cannot shard axis 'vocab' \(size 6\)"
        ):
            restore(tmp_path / "c", like, mapping={"vocab": "data"}, mesh=mesh)
        with pytest.raises(  # the mapping is at fault, not a leaf
            na.ShardingError,
            match=r"^The axis mapping names mesh axis 'model' \(used by logical axis 'embed'\), "
            r"but Mesh\(data=8\) has axes 'data'",
        ):
            restore(tmp_path / "c", like, mapping={"embed": "model"}, mesh=mesh)


def test_storage_keys_never_collide(tmp_path):
    """A key with characters orbax cannot store under ('w/x') fell back to 'leaf<index>', which
    could be another leaf's key: that leaf was silently overwritten."""
    from namedaxes.checkpoint._io import read_metadata

    tree = {"leaf2": jnp.zeros(3), "leaf2_": jnp.full(3, 2.0), "w/x": jnp.ones(3), "z z": 4}
    save(tmp_path / "c", tree)
    for out in (restore(tmp_path / "c"), restore(tmp_path / "c", tree)):
        assert _values(out) == _values(tree)
    stored = {r["key"]: r.get("store") for r in read_metadata(tmp_path / "c")}
    assert stored == {"leaf2": "leaf2", "leaf2_": "leaf2_", "w/x": "leaf2__", "z z": None}
    # without a clash the names are what earlier versions wrote (they are read from the metadata)
    save(tmp_path / "d", {"w/x": jnp.ones(2), "a": jnp.ones(2)})
    assert [r["store"] for r in read_metadata(tmp_path / "d")] == ["a", "leaf1"]


# -- atomicity and the manager ------------------------------------------------------------------


def test_interrupted_save_is_never_restored(tmp_path):
    save(tmp_path, {"w": jnp.full(3, 1.0)}, step=1)
    # a crash before the commit: orbax's temporary directory, and a copy without the marker
    shutil.copytree(tmp_path / "1", tmp_path / "3.orbax-checkpoint-tmp-1700000000")
    shutil.copytree(tmp_path / "1", tmp_path / "2")
    (tmp_path / "2" / "commit_success.txt").unlink()
    assert restore(tmp_path)["w"].tolist() == [1.0, 1.0, 1.0]  # the latest complete step is 1
    with pytest.raises(
        CheckpointNotFoundError,
        match=r"No checkpoint of step 2 in .*: it is an unfinished save \(no 'commit_success.txt' commit marker\)\. Complete steps there: \[1\]",
    ):
        restore(tmp_path, step=2)
    with pytest.raises(CheckpointNotFoundError, match=r"it is an unfinished save"):
        restore(tmp_path / "3.orbax-checkpoint-tmp-1700000000")
    with CheckpointManager(tmp_path) as mgr:
        assert mgr.all_steps() == [1] and mgr.latest_step() == 1


def test_manager_saves_async_and_keeps_the_last_steps(tmp_path, mesh_2x4):
    x = na.shard(na.named(jnp.asarray(DATA), ("batch", "embed")), MAPPING, mesh=mesh_2x4)
    with CheckpointManager(tmp_path / "run", max_to_keep=2) as mgr:
        with pytest.raises(
            CheckpointNotFoundError, match=r"CheckpointManager has no committed step"
        ):
            mgr.restore()
        for step in range(4):
            mgr.save(step, {"x": x + step, "step": step})
        mgr.wait()
        assert mgr.all_steps() == [2, 3] and mgr.latest_step() == 3
        assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["2", "3"]
        latest = mgr.restore(mapping={"embed": "model"}, mesh=mesh_2x4)
        assert latest["step"] == 3 and latest["x"].sharding.spec == P(None, "model")
        np.testing.assert_array_equal(np.asarray(latest["x"].array), DATA + 3)
        assert mgr.restore(step=2)["step"] == 2
        with pytest.raises(CheckpointError, match=r"step 1 is not after the latest step 3"):
            mgr.save(1, {"x": x})
    assert restore(tmp_path / "run")["step"] == 3  # the plain restore reads a manager's directory


def test_saving_a_donated_tree_names_the_leaf_and_the_donation(tmp_path, mesh_2x4):
    """After a donating step the old model's buffers are gone: save, the manager's save and
    save_safetensors name the leaf and the fix instead of JAX's 'Array has been deleted'."""
    m0 = {"w": na.shard(na.named(jnp.asarray(DATA), ("batch", "embed")), MAPPING, mesh=mesh_2x4)}
    step = na.fsdp(
        lambda m: jax.tree.map(lambda x: x * 2, m), MAPPING, MAPPING, donate_args=(True,)
    )
    with jax.set_mesh(mesh_2x4):
        m1 = step(m0)
    assert m0["w"].array.is_deleted()
    message = (
        r"{}: leaf 'model/w' was donated to an earlier call \(named_jit or fsdp with "
        r"donate_args=\.\.\., jax\.jit with donate_argnums=\.\.\.\), so its buffer is gone\. "
        r"Donation hands an argument's memory to the call's outputs: save the value the call "
        r"returned instead, or don't donate it\.$"
    )
    with pytest.raises(DonatedArrayError, match=message.format("save")):
        save(tmp_path / "c", {"model": m0, "step": 1})
    assert not (tmp_path / "c").exists()
    with CheckpointManager(tmp_path / "run") as mgr:
        with pytest.raises(DonatedArrayError, match=message.format(r"CheckpointManager\.save")):
            mgr.save(0, {"model": m0})
        assert mgr.all_steps() == []
    with pytest.raises(RuntimeError, match=message.format("save_safetensors")):  # JAX's type too
        save_safetensors(tmp_path / "w.safetensors", {"model": m0})
    save(tmp_path / "c", {"model": m1, "step": 1})  # the step's returned model saves
    np.testing.assert_array_equal(np.asarray(restore(tmp_path / "c")["model"]["w"].array), DATA * 2)


# -- interchange --------------------------------------------------------------------------------


def _stacked_model():
    w = na.named(jnp.arange(24, dtype=jnp.float32).reshape(2, 3, 4), ("layer", "embed", "mlp"))
    return {"blocks": {"stacked": {"attn": {"w": w}}}, "head": {"b": jnp.ones(4)}, "n": 3}


def test_state_dict_unstacks_layers_and_round_trips():
    tree = _stacked_model()
    state = to_state_dict(tree)
    assert sorted(state) == ["blocks.0.attn.w", "blocks.1.attn.w", "head.b", "n"]
    np.testing.assert_array_equal(state["blocks.1.attn.w"], np.arange(12, 24).reshape(3, 4))
    back = from_state_dict(tree, {k: np.asarray(v) for k, v in state.items()})
    assert back["blocks"]["stacked"]["attn"]["w"].axis_names == ("layer", "embed", "mlp")
    assert _values(back) == _values(tree)
    # without a `stacked` component the index goes before the leaf's name; the axis is a parameter
    flat = {"blocks": {"w": na.named(jnp.zeros((2, 3)), ("depth", "embed"))}}
    assert sorted(to_state_dict(flat, stacked_axis="depth")) == ["blocks.0.w", "blocks.1.w"]
    assert sorted(to_state_dict(flat)) == ["blocks.w"]
    # a dict key holding a dot is one component: the index goes by path, not by splitting on '.'
    w = tree["blocks"]["stacked"]["attn"]["w"]
    dotted = {"model.blocks": {"stacked": {"w": w}}, "blocks": {"w.x": w}}
    state = to_state_dict(dotted)
    assert sorted(state) == ["blocks.0.w.x", "blocks.1.w.x", "model.blocks.0.w", "model.blocks.1.w"]
    assert _values(from_state_dict(dotted, state)) == _values(dotted)


def test_state_dict_errors():
    tree = _stacked_model()
    state = to_state_dict(tree)
    with pytest.raises(
        CheckpointStructureError,
        match=r"The state dict has no key 'blocks.1.attn.w', which like needs",
    ):
        from_state_dict(tree, {k: v for k, v in state.items() if k != "blocks.1.attn.w"})
    with pytest.raises(
        CheckpointStructureError, match=r"The state dict has 1 key\(s\) like does not use: 'junk'"
    ):
        from_state_dict(tree, {**state, "junk": np.zeros(1)})
    with pytest.raises(
        CheckpointAxisError,
        match=r"State-dict entry for 'head.b' has shape \(5,\) but like has shape \(4,\)",
    ):
        from_state_dict(tree, {**state, "head.b": np.zeros(5, np.float32)})
    with pytest.raises(
        CheckpointDtypeError, match=r"State-dict key 'head.b' is float64 but like has float32"
    ):
        from_state_dict(tree, {**state, "head.b": np.zeros(4)})


def test_state_dict_casts_follow_astype():
    """A NumPy float entry cast into an integer like converts as jnp's astype (and restore) does:
    saturating, NaN to 0. NumPy's astype wrapped 300.7 into int8 as 44."""
    v = np.array([1.5, -2.25, 300.7, -300.2, np.nan, np.inf], np.float32)
    for dtype in (jnp.int8, jnp.uint8, jnp.int32):
        got = from_state_dict({"w": jnp.zeros(6, dtype)}, {"w": v}, cast=True)["w"]
        np.testing.assert_array_equal(got, jnp.asarray(v).astype(dtype))


def test_state_dict_python_numbers_for_array_leaves():
    """Python numbers (which to_state_dict keeps) and lists for array leaves crashed
    from_state_dict with "'float' object has no attribute 'dtype'"."""
    like = {"b": jnp.zeros(()), "w": jnp.zeros(2), "n": jnp.zeros((), jnp.int8)}
    out = from_state_dict(like, {"b": 1.5, "w": [1.0, 2.0], "n": 3})
    assert [out[k].dtype for k in ("b", "w", "n")] == [jnp.float32, jnp.float32, jnp.int8]
    assert (float(out["b"]), out["w"].tolist(), int(out["n"])) == (1.5, [1.0, 2.0], 3)
    tree = {"lr": 0.5, "step": 7}  # to_state_dict keeps Python scalars; eval_shape makes 0-d arrays
    out = from_state_dict(jax.eval_shape(lambda: tree), to_state_dict(tree))
    assert (float(out["lr"]), int(out["step"])) == (0.5, 7)
    with pytest.raises(
        CheckpointDtypeError,
        match=r"^State-dict key 'b' is a Python int \(1\) but an array of float32 in like\. "
        r"Build like with a matching scalar, or pass cast=True\.$",
    ):
        from_state_dict({"b": like["b"]}, {"b": 1})
    assert float(from_state_dict({"b": like["b"]}, {"b": 1}, cast=True)["b"]) == 1.0
    with pytest.raises(
        CheckpointDtypeError,
        match=r"^State-dict key 'n' is a Python int \(300\), which int8 cannot hold \(Python "
        r"integer 300 out of bounds for int8\)\. Build like with a dtype that holds it\.$",
    ):
        from_state_dict({"n": like["n"]}, {"n": 300}, cast=True)
    with pytest.raises(
        CheckpointStructureError,
        match=r"^State-dict key 'w' is a Python dict \(\{'a': 1\}\), not an array; like has an "
        r"array of float32 with shape \(2,\) there\.",
    ):
        from_state_dict({"w": like["w"]}, {"w": {"a": 1}})


def test_state_dict_named_entries_are_aligned_by_name():
    """A NamedArray entry with its axes in another order was refused ("has shape ('mlp',
    'embed')", axis names printed as a shape) instead of being transposed by name."""
    tree = _stacked_model()  # blocks.stacked.attn.w: (layer=2, embed=3, mlp=4)
    w = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    state = {
        "blocks.0.attn.w": na.named(jnp.asarray(w[0].T), ("mlp", "embed")),
        "blocks.1.attn.w": na.named(jnp.asarray(w[1]), ("embed", "mlp")),
        "head.b": np.ones(4, np.float32),
        "n": 3,
    }
    back = from_state_dict(tree, state)
    assert back["blocks"]["stacked"]["attn"]["w"].axis_names == ("layer", "embed", "mlp")
    assert _values(back) == _values(tree)
    flat = {"w": na.named(jnp.zeros((2, 3)), ("embed", "mlp"))}
    entry = na.named(jnp.arange(6.0).reshape(3, 2), ("mlp", "embed"))
    np.testing.assert_array_equal(
        from_state_dict(flat, {"w": entry})["w"].array, np.arange(6.0).reshape(3, 2).T
    )
    with pytest.raises(
        CheckpointAxisError,
        match=r"^State-dict entry for 'w' has axes \(mlp=3, hidden=2\) but like has \(embed=2, "
        r"mlp=3\)\. Rename or resize the entry's axes to like's",
    ):
        from_state_dict(flat, {"w": na.named(jnp.zeros((3, 2)), ("mlp", "hidden"))})
    with pytest.raises(CheckpointAxisError, match=r"has axes \(mlp=3, embed=4\) but like has"):
        from_state_dict(flat, {"w": na.named(jnp.zeros((3, 4)), ("mlp", "embed"))})
    # plain arrays are still compared by shape, and the message shows shapes
    with pytest.raises(
        CheckpointAxisError,
        match=r"^State-dict entry for 'w' has shape \(3, 2\) but like has axes \(embed=2, mlp=3\), "
        r"shape \(2, 3\)\. Transpose or reshape it",
    ):
        from_state_dict(flat, {"w": np.zeros((3, 2), np.float32)})


def test_safetensors_round_trip(tmp_path):
    tree = _stacked_model()
    tree["blocks"]["stacked"]["norm"] = na.named(jnp.ones((2, 3), jnp.bfloat16), ("layer", "embed"))
    save_safetensors(tmp_path / "m.safetensors", tree)
    from safetensors import safe_open

    with safe_open(tmp_path / "m.safetensors", framework="numpy") as f:
        assert sorted(f.keys()) == [
            "blocks.0.attn.w",
            "blocks.0.norm",
            "blocks.1.attn.w",
            "blocks.1.norm",
            "head.b",
            "n",
        ]
        axes = json.loads(f.metadata()["namedaxes.axes"])
    # the names of each tensor, under its own key (a layer's without the layer axis)
    assert axes == {
        "blocks.0.attn.w": ["embed", "mlp"],
        "blocks.1.attn.w": ["embed", "mlp"],
        "blocks.0.norm": ["embed"],
        "blocks.1.norm": ["embed"],
    }
    back = load_safetensors(tmp_path / "m.safetensors", tree)
    assert back["blocks"]["stacked"]["norm"].dtype == jnp.bfloat16
    assert _values(back) == _values(tree) and back["n"] == 3


def test_safetensors_aligns_by_the_saved_axis_names(tmp_path):
    """load_safetensors ignored the names it saved: a square (embed, mlp) weight came back
    silently transposed into an (mlp, embed) like, a non-square one was refused."""
    f = tmp_path / "w.safetensors"
    for shape in [(4, 4), (2, 4)]:
        data = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        save_safetensors(f, {"w": na.named(jnp.asarray(data), ("embed", "mlp"))})
        like = {"w": na.named(jnp.zeros(shape[::-1]), ("mlp", "embed"))}
        np.testing.assert_array_equal(load_safetensors(f, like)["w"].array, data.T)
    with pytest.raises(
        CheckpointAxisError,
        match=r"^State-dict entry for 'w' has axes \(embed=2, mlp=4\) but like has \(embed=2, "
        r"hidden=4\)\. Rename or resize",
    ):
        load_safetensors(f, {"w": na.named(jnp.zeros((2, 4)), ("embed", "hidden"))})
    # stacked layers: each layer's tensor is aligned by its own names
    tree = _stacked_model()  # blocks.stacked.attn.w: (layer=2, embed=3, mlp=4)
    save_safetensors(f, tree)
    w = tree["blocks"]["stacked"]["attn"]["w"]
    like = {**tree, "blocks": {"stacked": {"attn": {"w": w.rearrange(("mlp", "layer", "embed"))}}}}
    back = load_safetensors(f, like)["blocks"]["stacked"]["attn"]["w"]
    assert back.axis_names == ("mlp", "layer", "embed")
    np.testing.assert_array_equal(back.array, np.transpose(np.asarray(w.array), (2, 0, 1)))
    # a file without names (another framework's) is read by position, as before
    from safetensors.numpy import save_file

    save_file({"w": np.arange(8, dtype=np.float32).reshape(4, 2)}, str(f))
    back = load_safetensors(f, {"w": na.named(jnp.zeros((4, 2)), ("mlp", "embed"))})["w"]
    np.testing.assert_array_equal(back.array, np.arange(8).reshape(4, 2))


def test_safetensors_low_precision_dtypes(tmp_path):
    """float8 tensors crashed load_safetensors with NumPy's AttributeError; int4 got safetensors'
    untyped error without the leaf's name."""
    f = tmp_path / "q.safetensors"
    values = np.array([[0.5, -1.0, 2.0, 448.0]], np.float32)
    for dtype in (jnp.float8_e4m3fn, jnp.float8_e5m2, jnp.bfloat16):
        tree = {"q": na.named(jnp.asarray(values, dtype), ("embed", "mlp"))}
        save_safetensors(f, tree)
        back = load_safetensors(f, tree)["q"]
        assert back.dtype == dtype
        np.testing.assert_array_equal(
            back.array.astype(jnp.float32), tree["q"].array.astype(jnp.float32)
        )
    with pytest.raises(
        CheckpointDtypeError,
        match=r"^Leaf 'blocks\.q' is int4, which save_safetensors cannot write \(the safetensors "
        r"dtypes it writes: float64, .*int8.*\)\. Cast it to one of those before saving\.$",
    ):
        save_safetensors(tmp_path / "int4.safetensors", {"blocks": {"q": jnp.ones(4, jnp.int4)}})
    assert not (tmp_path / "int4.safetensors").exists()


def test_dtypes_checkpoints_cannot_store_are_refused_before_writing(tmp_path):
    """uint4 (and uint2, float8_e4m3: TensorStore has no such types) failed inside orbax with a
    bare ValueError after the write began; the manager's save returned and left a temporary
    directory behind."""
    message = (
        r"^Leaf 'blocks\.q' is {}, which checkpoints cannot store \(TensorStore, orbax's storage, "
        r"has no such type\)\. Cast it to a dtype it stores \(int4, int8, .*\) before saving\.$"
    )
    for dtype in (jnp.uint4, jnp.float8_e4m3):
        tree = {"blocks": {"q": jnp.zeros(4, dtype)}, "w": jnp.ones(2)}
        name = np.dtype(dtype).name
        with pytest.raises(CheckpointDtypeError, match=message.format(name)):
            save(tmp_path / "c", tree)
        assert not (tmp_path / "c").exists()
        with CheckpointManager(tmp_path / "run") as mgr:
            with pytest.raises(CheckpointDtypeError, match=message.format(name)):
                mgr.save(0, tree)
            assert mgr.all_steps() == [] and not any((tmp_path / "run").iterdir())


# -- packaging ----------------------------------------------------------------------------------


def test_importing_namedaxes_does_not_import_orbax():
    code = "import namedaxes, sys; print(any(m.split('.')[0] == 'orbax' for m in sys.modules))"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.stdout.strip() == "False", out.stderr


def test_missing_orbax_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "orbax.checkpoint", None)
    for name in [m for m in sys.modules if m.startswith("namedaxes.checkpoint")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(
        ImportError,
        match=r"namedaxes.checkpoint needs orbax-checkpoint.*pip install 'namedaxes\[checkpoint\]'",
    ):
        importlib.import_module("namedaxes.checkpoint")


# -- two processes ------------------------------------------------------------------------------

WORKER = Path(__file__).with_name("checkpoint_worker.py")
RUN_TIMEOUT = 120  # seconds for both processes together


def test_two_processes_save_and_restore_only_their_shards(tmp_path):
    results = run_two_processes(WORKER, tmp_path, timeout=RUN_TIMEOUT)
    for r in results:
        for mode in ("auto", "explicit"):
            got = r[mode]
            # saved on (data=2, model=4) with batch->data, embed->model; restored on (data=4, model=2)
            # with embed->data: each process holds 4 devices' shards of (8, 2) columns
            assert got["spec"] == [None, "data"] and got["fully_addressable"] is False
            assert got["shard_shapes"] == [[8, 2]] and got["values_match"] is True
            assert got["opt_spec"] == [None, "data"] and got["count"] == 1
        assert r["manager_steps"] == [1] and r["manager_values_match"] is True
    # the two processes hold disjoint column blocks that together cover the array
    cols = [sorted(c for c in r["explicit"]["columns"]) for r in results]
    assert not set(cols[0]) & set(cols[1]) and sorted(cols[0] + cols[1]) == list(range(8))


def test_relative_paths_are_taken_from_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    x = na.named(jnp.arange(4.0), "a")
    save("relative", {"x": x})
    np.testing.assert_array_equal(np.asarray(restore("relative")["x"].array), np.arange(4.0))
