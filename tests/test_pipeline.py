"""Pipeline parallelism: ``nn.Stacked`` and ``models.Transformer`` with ``layer`` mapped to a
``stage`` mesh axis, compared with the same stack run unsharded (loss and every gradient, float32);
the compiled steps are checked for what crosses the stage axis."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _collectives import collectives_over
from _helpers import spec_of
from _meshes import make_mesh
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

import namedaxes as na
from namedaxes.models import Transformer, TransformerConfig

SCHEDULES = ["gpipe", "1f1b", "circular"]
FAST = {"compiler_options": {"xla_backend_optimization_level": 0}}
Embed = na.Axis("embed", 8)
LAYERS = 8


_STACK = []


def _stack(**options):
    """The test stack (built once) with ``options``."""
    if not _STACK:
        make = lambda k: na.nn.MLP(Embed, {"mlp": 16}, key=k)
        _STACK.append(na.nn.Stacked(na.Axis("layer", LAYERS), make, key=jax.random.key(0)))
    return _STACK[0].with_pipeline(**options)


def _input():
    return na.random.normal(jax.random.key(1), {"batch": 8, "position": 2, "embed": 8})


def _loss(stack, x):
    return (stack(x) ** 2).mean().array


_grad = jax.value_and_grad(_loss, argnums=(0, 1))


@functools.cache
def _unsharded():
    """The unsharded stack's loss and gradients (computed once: every pipelined case compares
    with them)."""
    return _grad(_stack(), _input())


# (stages, mesh shape, mesh axes, mapping besides the layer's)
# (2 stages with data and tensor parallelism; 4 stages alone, the batch whole on every device)
MESHES = {
    2: ((2, 2, 2), ("stage", "data", "model"), {"batch": "data", "mlp": "model"}),
    4: ((4, 2), ("stage", "data"), {}),
}


def _close(got, want):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("stages", [2, 4])
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_stacked_pipeline_equals_unsharded(stages, schedule, axis_type):
    """Loss, parameter and input gradients equal the unsharded stack's, with data (and tensor)
    parallelism on the other mesh axes; the parameters stay split over the stages."""
    want = _unsharded()
    shape, names, mapping = MESHES[stages]
    mesh = make_mesh(shape, names, axis_type)
    stack = _stack(schedule=schedule, microbatches=4)
    mapping = {"layer": "stage", **mapping}
    with jax.set_mesh(mesh), na.axis_mapping(mapping):
        stack, x = na.shard((stack, _input()))
        loss, (g_stack, g_x) = jax.jit(_grad)(stack, x)
    np.testing.assert_allclose(loss, want[0], rtol=1e-6)
    _close(g_stack.stacked, want[1][0].stacked)
    _close(g_x.array, want[1][1].array)
    assert spec_of(g_stack.stacked.up.weight)[0] == "stage"
    assert spec_of(g_x) == (P("data") if stages == 2 else P())


@pytest.mark.parametrize(
    "schedule, remat", [("gpipe", "dots"), ("1f1b", "carry"), ("circular", "full")]
)
def test_remat_policies_inside_the_stages(schedule, remat):
    """Each schedule with a remat policy of the stack: the same loss and gradients."""
    want = _unsharded()
    mesh = make_mesh((2, 4), ("stage", "data"), AxisType.Auto)
    stack = _stack(schedule=schedule, microbatches=2, gradient_checkpointing=remat)
    with jax.set_mesh(mesh), na.axis_mapping({"layer": "stage", "batch": "data"}):
        stack, x = na.shard((stack, _input()))
        loss, (g_stack, g_x) = jax.jit(_grad)(stack, x)
    np.testing.assert_allclose(loss, want[0], rtol=1e-6)
    _close(g_stack.stacked, want[1][0].stacked)
    _close(g_x.array, want[1][1].array)


def test_pipeline_under_bfloat16_compute(axis_type):
    """compute=bfloat16 through a pipelined stack, the input float32: it compiles on a CPU
    (XLA:CPU aborted the process on the pipeline's bfloat16 sums over the stages, "Invalid binary
    instruction opcode copy") and gives the unpipelined stack's loss and gradients under the same
    policy, within bfloat16's rounding."""
    policy = "params=float32,compute=bfloat16"
    grad = jax.jit(na.nn.precision(policy)(jax.value_and_grad(
        lambda stack, x: (stack(x).astype(jnp.float32) ** 2).mean().array, argnums=(0, 1)
    )))  # fmt: skip
    want = grad(_stack(), _input())
    mesh = make_mesh((2, 4), ("stage", "data"), axis_type)
    stack = _stack(schedule="1f1b", microbatches=4)
    with jax.set_mesh(mesh), na.axis_mapping({"layer": "stage"}):
        stack, x = na.shard((stack, _input()))
        loss, (g_stack, g_x) = grad(stack, x)
    np.testing.assert_allclose(loss, want[0], rtol=1e-5)
    for g, w in zip(jax.tree.leaves((g_stack.stacked, g_x)), jax.tree.leaves(want[1])):
        np.testing.assert_allclose(g, w, rtol=0, atol=2e-2 * np.abs(w).max())  # measured: 0.9%
    assert g_x.dtype == jnp.float32 and spec_of(g_stack.stacked.up.weight)[0] == "stage"


def _stage_collectives(schedule, axis_type):
    mesh = make_mesh((2, 2, 2), ("stage", "data", "model"), axis_type)
    stack = _stack(schedule=schedule, microbatches=4)
    with jax.set_mesh(mesh), na.axis_mapping({"layer": "stage", **MESHES[2][2]}):
        stack, x = na.shard((stack, _input()))
        hlo = jax.jit(_grad).lower(stack, x).compile().as_text()
    found = collectives_over(hlo, mesh)
    return [(op, arrays) for op, arrays, axes in found if "stage" in axes], found


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_only_activations_cross_the_stage_axis(schedule, axis_type):
    """Over ``stage``: collective-permutes of one microbatch's activations (forward and backward),
    and the all-reduces that hand the last stage's output to every stage (and the gradient back);
    never a parameter or a gradient of one."""
    found, everything = _stage_collectives(schedule, axis_type)
    # and inside the stages, data and tensor parallelism as without the pipeline: all-reduces of
    # activations over `model` and of gradients over `data`, no gather of anything
    assert {op for op, _, _ in everything} == {"collective-permute", "all-reduce"}, everything
    microbatch = [1, 2, 8]  # (batch 8 / data 2 / 4 microbatches, position, embed)
    outputs = [4, *microbatch]  # every microbatch's output
    permutes = [arrays for op, arrays in found if op == "collective-permute"]
    assert len(permutes) == 2 and all(a == [microbatch] for a in permutes), found
    assert {op for op, _ in found} == {"collective-permute", "all-reduce"}, found
    assert all(arrays == [outputs] for op, arrays in found if op == "all-reduce"), found


def test_circular_moves_parameters_to_their_stage():
    """The circular schedule's documented cost: the stored (contiguous) blocks move to their
    round-robin stage, an all-to-all of the parameters over the stage axis (and of their
    gradients back), besides the activations' permutes."""
    found, _ = _stage_collectives("circular", AxisType.Auto)
    assert any(op == "collective-permute" for op, _ in found)
    weights = [a for op, arrays in found if op == "all-to-all" for a in arrays]
    assert [1, 1, 1, 2, 8, 8] in weights, found  # an MLP weight block: (embed 8, mlp 16 / model 2)


def test_scan_ys_keep_a_microbatch_axis(axis_type):
    """``Stacked.scan`` pipelined: per-token ``ys`` come back on the batch axis as unsharded; the
    stack's ``ys`` without the batch axis get a ``microbatch`` axis after ``layer``, and plain-array
    ``ys`` a microbatch dimension after the layer's (they raised AttributeError)."""

    class Block(eqx.Module):
        mlp: na.nn.MLP

        def __call__(self, x):
            y = self.mlp(x)
            tot = y.sum(("batch", "position", "embed"))
            return x + y, (y.sum("embed"), tot, tot.array)

    stack = na.nn.Stacked(
        na.Axis("layer", 4),
        lambda k: Block(na.nn.MLP(Embed, {"mlp": 16}, key=k)),
        key=jax.random.key(0),
    )
    want_x, (want_tok, want_tot, want_plain) = stack.scan(_input())
    mesh = make_mesh((2, 4), ("stage", "data"), axis_type)
    with jax.set_mesh(mesh), na.axis_mapping({"layer": "stage", "batch": "data"}):
        piped, x = na.shard((stack.with_pipeline(microbatches=2), _input()))
        got_x, (tok, tot, plain) = jax.jit(lambda s, x: s.scan(x))(piped, x)
    _close(got_x.array, want_x.array)
    assert tok.axis_names == want_tok.axis_names
    _close(tok.array, want_tok.array)
    assert tot.axis_names == ("layer", "microbatch")
    _close(tot.sum("microbatch").array, want_tot.array)
    assert isinstance(plain, jax.Array) and want_plain.shape == (4,) and plain.shape == (4, 2)
    _close(plain.sum(1), want_plain)


class _Biased(eqx.Module):
    """A layer with a plain-array leaf, which the stack holds with the layer first."""

    w: na.NamedArray
    b: jax.Array

    def __init__(self, key):
        self.w = na.random.normal(key, {"embed": 8, "out": 8}) * 0.3
        self.b = jax.random.normal(jax.random.fold_in(key, 1), (8,))

    def __call__(self, x):
        return na.dot(x, self.w, axis="embed").rename({"out": "embed"}) + na.named(self.b, "embed")


@pytest.mark.parametrize("schedule", ["gpipe", "circular"])
def test_stacked_plain_array_leaves(axis_type, schedule):
    """Plain-array leaves (stacked by vmap with the layer first, mapped so by fold) are taken
    apart like NamedArrays: unstacked() kept the layer dimension, a precision policy raised
    AxisError, and the circular schedule raised AxisSizeError about the leading dimension."""
    stack = na.nn.Stacked(na.Axis("layer", 4), _Biased, key=jax.random.key(0))
    x = na.random.normal(jax.random.key(1), {"batch": 8, "embed": 8})
    want = stack(x)
    layers = stack.unstacked()
    assert layers[1].b.shape == (8,)
    _close(layers[1].b, stack.stacked.b[1])
    h = x
    for layer in layers:
        h = layer(h)
    _close(h.array, want.array)
    with na.nn.precision("params=float32,compute=bfloat16"):
        assert stack(x).axes == x.axes
    mesh = make_mesh((2, 4), ("stage", "data"), axis_type)
    with jax.set_mesh(mesh), na.axis_mapping({"layer": "stage", "batch": "data"}):
        piped, xs = na.shard((stack.with_pipeline(schedule=schedule, microbatches=2), x))
        got = jax.jit(lambda s, x: s(x), **FAST)(piped, xs)
    _close(got.array, want.array)


def test_microbatches_must_split_over_the_batch_shards(axis_type):
    """8 rows over 4 data shards in 8 microbatches: one row each cannot stay split over the
    shards (a JAX ShardingTypeError on Explicit meshes, a ShardingError from inside the layer
    on Auto ones)."""
    mesh = make_mesh((2, 4), ("stage", "data"), axis_type)
    with jax.set_mesh(mesh), na.axis_mapping({"layer": "stage", "batch": "data"}):
        piped, x = na.shard((_stack(microbatches=8), _input()))
        with pytest.raises(
            na.AxisSizeError,
            match=r"The pipeline splits the stack's input's 'batch' axis \(size 8\) into 8 "
            r"microbatches of size 1, but 'batch' is split over mesh axes \('data',\) \(4 "
            r"shards\), so each microbatch needs a multiple of 4 rows\. Pass microbatches=2 ",
        ):
            jax.jit(lambda s, x: s(x))(piped, x)


CONFIG = TransformerConfig(
    "llama", vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=4, num_heads=4,
    num_kv_heads=2, head_dim=4,
)  # fmt: skip
MOE = CONFIG.replace(
    model_type="mixtral", num_experts=4, num_experts_per_tok=2, moe_dispatch="dense"
)
_REFERENCE = {}


def _lm_loss(model, ids):
    logits, aux = model(ids, return_aux_loss=True) if model.config.moe else (model(ids), 0.0)
    return na.nn.cross_entropy(logits, "vocab", ids).array + 0.01 * aux


def _ids():
    ids = jax.random.randint(jax.random.key(2), (8, 6), 0, 64)
    return na.named(ids, ("batch", "position"))


def _reference(cfg):
    if cfg not in _REFERENCE:
        model = Transformer(cfg, key=jax.random.key(0))
        _REFERENCE[cfg] = na.named_jit(jax.value_and_grad(_lm_loss), **FAST)(model, _ids())
    return _REFERENCE[cfg]


TENSOR = {"heads": "model", "mlp": "model"}
CONTEXT = {"position": "model"}  # the third mesh axis splits the sequence instead
EXPERTS = {"experts": "model"}


@pytest.mark.parametrize(
    "cfg, schedule, kind, other",
    [
        (CONFIG, "gpipe", AxisType.Explicit, TENSOR),
        (CONFIG, "1f1b", AxisType.Auto, CONTEXT),
        (MOE, "circular", AxisType.Auto, EXPERTS),
    ],
    ids=["gpipe-tensor-explicit", "1f1b-context-auto", "moe-circular-experts-auto"],
)
def test_transformer_trains_pipelined(cfg, schedule, kind, other):
    """A whole model (embeddings and head replicated over the stages, the layers pipelined) with
    data parallelism and tensor, context or expert parallelism: loss and every gradient as
    unsharded."""
    want_loss, want_grads = _reference(cfg)
    piped = cfg.replace(pipeline_schedule=schedule, pipeline_microbatches=2, pipeline_repeats=2)
    mapping = {"layer": "stage", "batch": "data", **other}
    mesh = make_mesh((2, 2, 2), ("stage", "data", "model"), kind)
    model = Transformer(piped, key=jax.random.key(0))
    step = na.named_jit(jax.value_and_grad(_lm_loss), axis_resources=mapping, **FAST)
    with jax.set_mesh(mesh):
        loss, grads = step(model, na.shard(_ids(), mapping))
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    _close(jax.tree.leaves(grads), jax.tree.leaves(want_grads))
    assert spec_of(grads.layers.stacked.attn_norm.weight)[0] == "stage"


def test_checkpoint_restores_across_stage_counts(tmp_path, axis_type):
    """A stack saved split over 2 stages restores onto 4 (laid out by name), the same values."""
    checkpoint = pytest.importorskip("namedaxes.checkpoint")
    stack = _stack()
    two = make_mesh((2, 4), ("stage", "data"), axis_type)
    with jax.set_mesh(two), na.axis_mapping({"layer": "stage"}):
        checkpoint.save(tmp_path / "ckpt", {"stack": na.shard(stack)})
    four = make_mesh((4, 2), ("stage", "data"), axis_type)
    like = {"stack": eqx.filter_eval_shape(_stack)}
    restored = checkpoint.restore(tmp_path / "ckpt", like, mapping={"layer": "stage"}, mesh=four)
    w = restored["stack"].stacked.up.weight
    assert spec_of(w)[0] == "stage"
    assert w.array.sharding.shard_shape(w.array.shape)[0] == LAYERS // 4
    _close(w.array, stack.stacked.up.weight.array)


def test_pipeline_errors_name_the_fix(axis_type):
    mesh = make_mesh((2, 4), ("stage", "data"), axis_type)
    x = _input()
    with jax.set_mesh(mesh), na.axis_mapping({"layer": "stage", "batch": "data"}):
        with pytest.raises(na.AxisSizeError, match="into 3 microbatches, which do not divide it"):
            _stack(microbatches=3)(x)
        with pytest.raises(na.AxisSizeError, match="at least one microbatch per stage"):
            _stack(schedule="circular", microbatches=1)(x)
        odd = na.nn.Stacked(
            na.Axis("layer", 3), lambda k: na.nn.MLP(Embed, {"mlp": 4}, key=k),
            key=jax.random.key(0),
        )  # fmt: skip
        with pytest.raises(na.ShardingError):  # 2 stages do not divide 3 layers
            na.shard(odd)
    with jax.set_mesh(mesh), na.axis_mapping({"layer": "stage", "batch": ("stage", "data")}):
        with pytest.raises(na.ShardingError, match="also places 'batch' on them"):
            _stack()(jnp.zeros(()) + x)
    with jax.set_mesh(mesh), na.axis_mapping({"layer": "stage"}):
        with pytest.raises(
            na.AxisNotFoundError,
            match=r"got NamedArray\(position=2, embed=8\)\. Give the input a 'batch' axis \(a "
            r"models\.Transformer's ids: name their batch axis 'batch'\), or pass batch_axis=",
        ):
            _stack()(x["batch", 0])
    with pytest.raises(na.NamedTypeError, match="Stacked: unknown pipeline schedule 'zigzag'"):
        _stack(schedule="zigzag")
    with pytest.raises(na.ModelConfigError, match="microbatches must be a positive int"):
        CONFIG.replace(pipeline_microbatches=0)


def test_no_pipeline_without_a_stage_mapping():
    """A stack whose ``layer`` is not mapped runs its one scan, whatever its pipeline options."""
    x = _input()
    want = _stack()(x)
    mesh = make_mesh((8,), ("data",), AxisType.Auto)
    with jax.set_mesh(mesh), na.axis_mapping({"batch": "data"}):
        got = jax.jit(lambda s, x: s(x))(_stack(schedule="circular", microbatches=4), x)
    _close(got.array, want.array)


def test_plan_prices_the_pipeline():
    abstract = jax.eval_shape(
        lambda: Transformer(CONFIG.replace(pipeline_microbatches=4), key=jax.random.key(0))
    )
    p = na.analysis.plan(abstract, {"stage": 2, "data": 4}, {"layer": "stage", "batch": "data"})
    assert p.pipeline == (
        {
            "layer_axis": "layer", "mesh_axes": ["stage"], "stages": 2, "layers_per_stage": 2,
            "microbatches": 4, "schedule": "gpipe", "repeats": 1, "bubble": 0.2,
        },
    )  # fmt: skip
    assert "2 stages of 2 layers, gpipe, 4 microbatches, bubble 20.0%" in str(p)
    assert na.analysis.plan(abstract, {"data": 8}, {"batch": "data"}).pipeline == ()


def _linear_stack():
    return jax.eval_shape(
        lambda: na.nn.Stacked(
            na.Axis("layer", 8),
            lambda k: na.nn.Linear({"embed": 512}, {"mlp": 512}, key=k),
            key=jax.random.key(0),
        )
    )  # 8 layers of 1 MiB


def test_pipeline_search_pipelines_only_for_memory():
    """Without a budget no pipeline (no bubble) ranks first; under 3 MiB per device only 4 or 8
    stages fit, and the least idle time wins (4 stages x 32 microbatches: 3 idle ticks of 35)."""
    stack = _linear_stack()
    free = na.analysis.pipeline_search(stack, {"data": 8}, {"batch": "data"}, batch=64)
    assert free[0].mesh == {"stage": 1, "data": 8} and free[0].pipeline == ()
    tight = na.analysis.pipeline_search(
        stack, {"data": 8}, {"batch": "data"}, batch=64, budget="3MiB", top=20
    )
    fits = [p for p in tight if p.fits]
    assert {p.mesh["stage"] for p in fits} == {4, 8}
    assert fits[0].mesh == {"stage": 4, "data": 2}
    assert fits[0].pipeline[0]["microbatches"] == 32
    assert fits[0].state_bytes_per_device == 2 * (512 * 512 + 512) * 4  # 2 layers: w and b
    bubbles = [p.pipeline[0]["bubble"] for p in fits]
    assert bubbles == sorted(bubbles)
    assert fits[0].notes == ("4 stages x 32 microbatches of 2 rows: bubble 8.6%",)


@pytest.mark.parametrize("schedule", ["gpipe", "circular"])
def test_stages_over_mesh_axes_listed_out_of_mesh_order(axis_type, schedule):
    """layer over ("model", "data") on a (data, model) mesh: stage i is block i of that entry
    (first listed axis major), and the hand-off to the next stage must follow it (it followed the
    mesh order: wrong values, no error)."""
    mesh = make_mesh((2, 4), ("data", "model"), axis_type)
    embed = na.Axis("embed", 8)
    stack = na.nn.Stacked(
        na.Axis("layer", 8), lambda k: na.nn.MLP(embed, {"mlp": 16}, key=k), key=jax.random.key(0)
    )
    x = na.random.normal(jax.random.key(1), {"batch": 8, "embed": 8})
    want = stack(x)
    with jax.set_mesh(mesh), na.axis_mapping({"layer": ("model", "data")}):
        piped, xs = na.shard((stack.with_pipeline(schedule=schedule, microbatches=8, repeats=1), x))
        got = jax.jit(lambda s, x: s(x))(piped, xs)
    np.testing.assert_allclose(np.asarray(got.array), np.asarray(want.array), atol=1e-6)


class _Scaled(eqx.Module):
    """A layer with an extra argument: ``table``, reduced over its own ``microbatch`` axis;
    ``with_y`` returns it as the layer's y too (for ``scan``)."""

    mlp: na.nn.MLP
    with_y: bool = eqx.field(static=True, default=False)

    def __call__(self, x, table):
        out = x + self.mlp(x) * table.sum("microbatch")
        return (out, table) if self.with_y else out


def _scaled_stack(with_y=False):
    make = lambda k: _Scaled(na.nn.MLP(Embed, {"mlp": 16}, key=k), with_y)
    return na.nn.Stacked(na.Axis("layer", 4), make, key=jax.random.key(0))


def test_axes_named_microbatch_are_the_users(axis_type):
    """The pipeline's own microbatch axis is private: an argument whose first axis the user named
    ``microbatch`` (no batch axis) was taken for a split one and each stage got one slice of it
    (wrong values, or AxisNotFoundError inside the layer), and an input with a ``microbatch`` axis
    raised DuplicateAxisError from unflatten_axis. Only scan's ys without the batch axis get that
    name, so a y that has it already is refused."""
    x = na.random.normal(jax.random.key(1), {"microbatch": 2, "batch": 8, "embed": 8})
    table = na.named(jnp.array([[1.0] * 8, [3.0] * 8]), ("microbatch", "embed"))
    stack = _scaled_stack()
    want = stack(x, table)
    mesh = make_mesh((2, 4), ("stage", "data"), axis_type)
    with jax.set_mesh(mesh), na.axis_mapping({"layer": "stage"}):
        piped = stack.with_pipeline(microbatches=2)
        got = jax.jit(lambda s, x, t: s(x, t), **FAST)(piped, x, table)
        assert got.axis_names == want.axis_names
        _close(got.array, want.array)
        scan = _scaled_stack(with_y=True).with_pipeline(microbatches=2).scan
        with pytest.raises(
            na.DuplicateAxisError,
            match=r"Stacked\.scan pipelined gives each y without the 'batch' axis a 'microbatch' "
            r"axis \(one entry per microbatch\), but the layers returned a y that already has "
            r"one \(stacked: NamedArray\(layer=4, microbatch=2, embed=8\)\)\. Rename that axis",
        ):
            jax.eval_shape(scan, x, table)


def test_two_stacks_with_their_own_layer_names_share_the_stage_axis(axis_type):
    """``{"enc_layer": "stage", "dec_layer": "stage"}``: each stack pipelines its own layer axis
    (it raised ShardingError "also places 'dec_layer' on them", though no array entering the
    encoder has that axis); an axis that does enter the stages on them is still refused, named
    with the array that has it."""
    make = lambda k: na.nn.MLP(Embed, {"mlp": 16}, key=k)
    enc = na.nn.Stacked(na.Axis("enc_layer", 4), make, key=jax.random.key(0))
    dec = na.nn.Stacked(na.Axis("dec_layer", 4), make, key=jax.random.key(1))
    x = _input()
    want = dec(enc(x))
    mesh = make_mesh((2, 4), ("stage", "data"), axis_type)
    with jax.set_mesh(mesh), na.axis_mapping({"enc_layer": "stage", "dec_layer": "stage"}):
        e, d, xs = na.shard((enc, dec, x))
        got = jax.jit(lambda e, d, x: d(e(x)), **FAST)(e, d, xs)
    _close(got.array, want.array)
    with jax.set_mesh(mesh), na.axis_mapping({"enc_layer": "stage", "position": "stage"}):
        with pytest.raises(
            na.ShardingError,
            match=r"The mapping pipelines 'enc_layer' \(4 layers\) over mesh axes \('stage',\), "
            r"and also places 'position' on them \(the stack's input: NamedArray\(batch=8, "
            r"position=2, embed=8\) has 'position' on \('stage',\)\)\. The stage axes carry the "
            r"layers only: map 'position' to other mesh axes\.",
        ):
            jax.eval_shape(enc, x)


def test_microbatches_checked_against_the_inputs_own_layout():
    """Explicit mesh: an input placed over ``data`` before entering a mapping that only names the
    layers keeps that layout, so 8 microbatches of one row cannot split over it: a typed error (it
    was JAX's ShardingTypeError from dynamic_slice). On an Auto mesh XLA re-lays the input out."""
    mesh = make_mesh((2, 4), ("stage", "data"), AxisType.Explicit)
    with jax.set_mesh(mesh):
        x = na.shard(_input(), {"batch": "data"})
        with na.axis_mapping({"layer": "stage"}):
            piped = na.shard(_stack(microbatches=8))
            with pytest.raises(
                na.AxisSizeError,
                match=r"into 8 microbatches of size 1, but 'batch' is split over mesh axes "
                r"\('data',\) \(4 shards\), so each microbatch needs a multiple of 4 rows",
            ):
                jax.eval_shape(lambda s, x: s(x), piped, x)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_scan_ys_keep_the_batch_placement_on_explicit_meshes(schedule):
    """Explicit mesh, ``{"layer": "stage", "batch": "data"}``: per-token ys come back with the
    layer on ``stage`` and the batch on ``data`` as the circular schedule gave them (gpipe and
    1f1b typed them ``P('stage', None, None)``: the batch replicated)."""

    class Block(eqx.Module):
        mlp: na.nn.MLP

        def __call__(self, x):
            y = self.mlp(x)
            return x + y, y.sum("position")

    stack = na.nn.Stacked(
        na.Axis("layer", 4),
        lambda k: Block(na.nn.MLP(Embed, {"mlp": 16}, key=k)),
        key=jax.random.key(0),
    )
    want = stack.scan(_input())[1]
    mesh = make_mesh((2, 4), ("stage", "data"), AxisType.Explicit)
    with jax.set_mesh(mesh), na.axis_mapping({"layer": "stage", "batch": "data"}):
        piped, x = na.shard((stack.with_pipeline(schedule=schedule, microbatches=2), _input()))
        _, ys = jax.jit(lambda s, x: s.scan(x), **FAST)(piped, x)
    assert ys.axis_names == ("layer", "batch", "embed")
    assert jax.typeof(ys.array).sharding.spec == P("stage", "data", None)
    assert ys.array.sharding.shard_shape(ys.array.shape) == (2, 2, 8)
    _close(ys.array, want.array)


@pytest.mark.parametrize("bad", [5, "", None, ("batch",)])
def test_with_pipeline_checks_the_batch_axis(bad):
    """``with_pipeline(batch_axis=...)`` checks it as the constructor does (it took anything and
    failed later, generically)."""
    with pytest.raises(na.NamedTypeError, match=r"Stacked needs an axis name for batch_axis, got "):
        _stack(batch_axis=bad)


def _stack_shape(layers, **options):
    return jax.eval_shape(
        lambda: na.nn.Stacked(
            na.Axis("layer", layers),
            lambda k: na.nn.Linear({"embed": 64}, {"mlp": 64}, key=k),
            key=jax.random.key(0),
        ).with_pipeline(**options)
    )


def test_plan_prices_only_pipelines_that_run():
    """``plan`` applies the checks the stack applies when it runs, per stack: a circular schedule
    with fewer microbatches than stages and layers that do not divide into the blocks are
    PlanErrors naming the stack (they were priced), and a stack whose layers the rules leave
    whole (a fallback rule) is not listed (its neighbour's placement was taken for it)."""
    mesh = {"stage": 2, "data": 4}
    with pytest.raises(
        na.PlanError,
        match=r"The stack at <root> cannot run pipelined on Mesh\(stage=2, data=4\) \('layer' "
        r"over \['stage'\]\): The circular schedule needs at least one microbatch per stage \(2\), "
        r"got microbatches=1\. Pass microbatches >= 2\.",
    ):
        na.analysis.plan(
            _stack_shape(8, schedule="circular", microbatches=1), mesh, {"layer": "stage"}
        )
    with pytest.raises(
        na.PlanError,
        match=r"The stack at enc cannot run .*: Pipelining 'layer' \(6 layers\) over 2 stages x 2 "
        r"repeats needs a layer count divisible by 4\.",
    ):
        na.analysis.plan({"enc": _stack_shape(6, schedule="circular")}, mesh, {"layer": "stage"})
    tree = {"enc": _stack_shape(8), "dec": _stack_shape(3)}
    p = na.analysis.plan(tree, mesh, [("layer", "stage"), ("layer", None)])
    assert [(x["stages"], x["layers_per_stage"]) for x in p.pipeline] == [(2, 4)]


def test_plan_search_skips_mappings_whose_pipelines_cannot_run():
    """A circular stack of 6 layers cannot run over 2 stages (it needs a multiple of 4 layers):
    plan_search ranks the mappings that do not pipeline it and says why the others lost."""
    found = na.analysis.plan_search(
        {"enc": _stack_shape(6, schedule="circular")}, {"stage": 2}, logical_axes=["layer"], top=5
    )
    assert found and all(not p.pipeline for p in found)
    assert found.counts["cannot_run"] == 1
    assert any("divisible by 4" in r["reason"] for r in found.rejected)


def test_pipeline_search_ranks_only_candidates_that_run():
    """Circular over 8 layers: 8 stages x 2 repeats would need 16 layers (it was ranked); a stack
    built with too few microbatches for the circular schedule still gets the search's counts; and
    a batch over ``("data", "model")`` needs each microbatch's rows to divide into 4 shards (it
    was ranked with 2 rows)."""
    circular = na.analysis.pipeline_search(
        _stack_shape(8, schedule="circular", microbatches=1), {"data": 8}, {"batch": "data"},
        batch=64, top=50,
    )  # fmt: skip
    assert sorted({p.mesh["stage"] for p in circular}) == [1, 2, 4]
    assert all(x["microbatches"] >= x["stages"] for p in circular for x in p.pipeline)
    both = na.analysis.pipeline_search(
        _stack_shape(8), {"data": 4, "model": 2}, {"batch": ("data", "model")}, batch=16, top=50
    )
    assert [p.notes[0] for p in both] == [
        "no pipeline: no bubble",
        "2 stages x 4 microbatches of 4 rows: bubble 20.0%",
        "4 stages x 8 microbatches of 2 rows: bubble 27.3%",
        "2 stages x 2 microbatches of 8 rows: bubble 33.3%",
        "4 stages x 4 microbatches of 4 rows: bubble 42.9%",
    ]
    two = na.AxisRules({"batch": "data"}, unsatisfied="replicate")
    mixed = na.analysis.pipeline_search(
        {"enc": _stack_shape(8), "dec": _stack_shape(3)}, {"data": 8}, two, batch=64, top=50
    )
    assert {len(p.pipeline) for p in mixed if p.mesh["stage"] > 1} == {1}  # dec stays whole


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"microbatches": (0,)}, na.PlanError, r"microbatches must be ints >= 1 .* got \(0,\)"),
        (
            {"microbatches": (1.5,)},
            na.NamedTypeError,
            r"microbatches must be a tuple of ints .* where 1\.5 is a float",
        ),
        ({"microbatches": ()}, na.PlanError, r"microbatches is empty"),
        ({"batch": 0}, na.PlanError, r"batch must be >= 1 \(rows per step\), got 0"),
        ({"batch": -8}, na.PlanError, r"batch must be >= 1 \(rows per step\), got -8"),
        ({"batch": 8.0}, na.NamedTypeError, r"batch must be an int \(rows per step\)"),
        ({"top": -1}, na.PlanError, r"top must be >= 1 \(how many plans to return\), got -1"),
    ],
)
def test_pipeline_search_refuses_bad_counts(kwargs, error, match):
    """Counts that are not ints >= 1 are refused (a zero raised ZeroDivisionError, a negative
    batch gave "microbatches of -4 rows", top=-1 dropped the last plan, a float dropped every
    pipelined candidate)."""
    with pytest.raises(error, match=f"pipeline_search: {match}"):
        na.analysis.pipeline_search(
            _stack_shape(8), {"data": 8}, {"batch": "data"}, **{"batch": 64, **kwargs}
        )


def test_bubble_fraction_takes_counts():
    """Stages, microbatches and repeats are ints >= 1 (NumPy ints too); 2.5 stages gave 0.27 and
    True stages 0.0."""
    assert na.analysis.bubble_fraction(np.int64(2), 2) == 1 / 3
    with pytest.raises(na.NamedTypeError, match=r"stages must be an int .* got 2\.5 \(float\)"):
        na.analysis.bubble_fraction(2.5, 4)
    with pytest.raises(na.NamedTypeError, match=r"stages must be an int .* got True \(bool\)"):
        na.analysis.bubble_fraction(True, 4)
    with pytest.raises(na.PlanError, match=r"microbatches must be >= 1 .* got 0"):
        na.analysis.bubble_fraction(2, 0)
