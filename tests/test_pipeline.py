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
        with pytest.raises(na.AxisNotFoundError, match=r"got NamedArray\(position=2, embed=8\)"):
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
