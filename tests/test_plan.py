"""plan, plan_search, compile targets, compiled_memory's fixes, and the whole-device memory rule.

Module-level code here must not start JAX: the compile-target tests pickle ``train_step`` and
``take_state`` by reference, and the compiling subprocess imports this module before it sets its
device count.
"""

import importlib.util
import itertools
import json
import math
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import namedaxes as na
from namedaxes import models
from namedaxes._errors import PlanDoesNotFitError
from namedaxes.analysis._compile_target import parse_collectives, parse_target
from namedaxes.analysis._plan import parse_bytes

# -- a small Llama-shaped model ------------------------------------------------------------------

L, E, M, H, D, V = 2, 32, 64, 4, 8, 48


class Norm(eqx.Module):
    """A plain-array weight named with field(axis_names=...)."""

    scale: jax.Array = na.field(axis_names=("layers", "embed"))


def init_params(key):
    ks = jax.random.split(key, 5)

    def w(k, shape, axes):
        return na.named(jax.random.normal(k, shape, jnp.float32) * 0.02, axes)

    return {
        "embed": w(ks[0], (V, E), ("vocab", "embed")),
        "layers": {
            "q": w(ks[1], (L, E, H, D), ("layers", "embed", "heads", "head_dim")),
            "up": w(ks[2], (L, E, M), ("layers", "embed", "mlp")),
            "down": w(ks[3], (L, M, E), ("layers", "mlp", "embed")),
            "norm": Norm(jnp.ones((L, E), jnp.float32)),
        },
        "lm_head": w(ks[4], (E, V), ("embed", "vocab")),
    }


PARAM_COUNT = V * E + L * (E * H * D + 2 * E * M + E) + E * V


def abstract_state():
    def build(key):
        params = init_params(key)
        return {"params": params, "opt_state": optax.adamw(1e-3).init(params)}

    return eqx.filter_eval_shape(build, jax.random.key(0))


def take_state(state):
    """A step that only receives the state (XLA's argument bytes are the state's bytes)."""
    return None


def _loss(params, tokens):
    x = params["embed"].array[tokens]  # (batch, embed)
    layers = params["layers"]
    for i in range(L):
        h = jnp.einsum("be,ehd->bhd", x, layers["q"].array[i]).reshape(x.shape[0], H * D)
        x = x + h[:, :E] * layers["norm"].scale[i][None, :]
        x = x + jax.nn.relu(x @ layers["up"].array[i]) @ layers["down"].array[i]
    logits = x @ params["lm_head"].array
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(tokens.shape[0]), tokens])


def train_step(state, tokens):
    """Forward, loss, grad and an AdamW update."""
    loss, grads = jax.value_and_grad(_loss)(state["params"], tokens)
    updates, opt_state = optax.adamw(1e-3).update(grads, state["opt_state"], state["params"])
    return {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state}, loss


FSDP_TP = {"embed": "data", "mlp": "model", "heads": "model", "vocab": "model"}
LAYOUTS = [FSDP_TP, {"embed": ("data", "model")}, {"mlp": "model", "layers": "data"}]


# -- plan: counts ---------------------------------------------------------------------------------


def test_plan_param_count_subtotals_and_field_leaves():
    state = abstract_state()
    p = na.analysis.plan(state, {"data": 2, "model": 4}, FSDP_TP)
    assert p.param_count == PARAM_COUNT
    assert sum(p.subtotals.values()) == p.state_bytes_per_device
    assert set(p.subtotals) == {"params", "opt_state"}
    # AdamW keeps two fp32 moments per parameter: twice the parameters' bytes (plus the count).
    assert p.subtotals["opt_state"] == 2 * p.subtotals["params"] + 4
    # The field(axis_names=...) leaf is named: 'embed' on 'data' halves it.
    norm = [g for g in p.largest if g["path"].endswith("norm/scale")]
    assert (
        norm
        and norm[0]["spec"] == "P(None, 'data')"
        and norm[0]["bytes_per_device"] == L * E * 4 // 2
    )
    assert p.axes["embed"]["mesh_axes"] == ["data"] and p.axes["head_dim"]["saved_bytes"] == 0
    assert p.replicated["paths"] == ["opt_state/0/count"]
    json.dumps(p.to_dict())  # JSON-able
    assert p.to_dict()["rules"] == [
        ["embed", "data"],
        ["mlp", "model"],
        ["heads", "model"],
        ["vocab", "model"],
    ]


def test_plan_largest_dedupes_identical_leaves():
    w = na.named(jax.ShapeDtypeStruct((64, 16), "float32"), ("embed", "mlp"))
    tree = {"params": {f"w{i}": w for i in range(5)}, "b": jax.ShapeDtypeStruct((8,), "float32")}
    p = na.analysis.plan(tree, {"data": 2, "model": 4}, {"mlp": "model"})
    assert p.largest[0]["count"] == 5 and p.largest[0]["path"] == "params/w0"
    assert p.largest[0]["bytes_per_device"] == 64 * 16 * 4 // 4
    assert len(p.largest) == 2
    assert p.param_count == 5 * 64 * 16  # the 'params' subtree only


@pytest.mark.parametrize("layout", range(len(LAYOUTS)))
def test_plan_state_bytes_equal_xla_arguments(mesh_2x4, layout):
    """The analytic per-device bytes equal XLA's argument bytes on 8 CPU devices."""
    state = abstract_state()
    p = na.analysis.plan(
        state, mesh_2x4, na.AxisRules(LAYOUTS[layout], unsatisfied="replicate"), step=take_state
    )
    assert p.compiled is not None
    assert p.compiled["argument_bytes"] == p.state_bytes_per_device
    assert p.compiled["temp_bytes"] == 0


def sub_byte_state():
    """int4/uint4 leaves (XLA packs two per byte, rounding each shard up to a byte)."""
    return {
        "w": na.named(jax.ShapeDtypeStruct((64, 16), "int4"), ("embed", "mlp")),
        "odd": na.named(jax.ShapeDtypeStruct((3, 5), "uint4"), ("embed", "mlp")),
        "b": jax.ShapeDtypeStruct((7,), "int4"),
    }


def test_plan_packs_sub_byte_types(mesh_2x4):
    p = na.analysis.plan(
        sub_byte_state(),
        mesh_2x4,
        na.AxisRules({"mlp": "model"}, unsatisfied="replicate"),
        step=take_state,
    )
    # w: 64 x 4 int4 per device = 128 bytes; odd (5 % 4 != 0, replicated): 8; b: 4.
    assert p.state_bytes_per_device == 128 + 8 + 4
    assert p.compiled["argument_bytes"] == p.state_bytes_per_device
    assert p.total_bytes == 64 * 16 // 2 + 8 + 4


def test_plan_search_packs_sub_byte_types():
    mesh = {"data": 2, "model": 4}
    best = na.analysis.plan_search(sub_byte_state(), mesh, top=1)[0]
    # w over all 8 devices: 64 bytes each; odd cannot split (8 bytes); b is plain (4).
    assert best.state_bytes_per_device == 64 * 16 // 2 // 8 + 8 + 4
    again = na.analysis.plan(sub_byte_state(), mesh, best.rules)
    assert again.state_bytes_per_device == best.state_bytes_per_device


def test_plan_keeps_a_placed_plain_leaf_spec(mesh_2x4):
    """A placed plain array keeps its spec; an uneven split is counted in padded blocks."""
    even = jax.ShapeDtypeStruct((8, 3), "float32", sharding=NamedSharding(mesh_2x4, P("model")))
    odd = jax.ShapeDtypeStruct((10, 3), "float32", sharding=NamedSharding(mesh_2x4, P("model")))
    assert na.analysis.plan({"x": even}, mesh_2x4, {}).state_bytes_per_device == 2 * 3 * 4
    assert (
        na.analysis.plan({"x": odd}, mesh_2x4, {}).state_bytes_per_device
        == math.ceil(10 / 4) * 3 * 4
    )


# -- plan: budget and errors ------------------------------------------------------------------------


def test_plan_budget_verdict():
    w = na.named(jax.ShapeDtypeStruct((1024, 512), "float32"), ("embed", "mlp"))
    tree = {"params": {"w": w}, "opt": {"m": w, "v": w}}  # 512 KiB per device each
    fits = na.analysis.plan(tree, {"data": 2, "model": 4}, {"mlp": "model"}, budget="1.5MiB")
    assert (fits.fits, fits.headroom_bytes, fits.budget_bytes) == (True, 0, 3 * 2**19)
    over = na.analysis.plan(tree, {"data": 2, "model": 4}, {"mlp": "model"}, budget=3 * 2**19 - 1)
    assert over.fits is False and over.headroom_bytes == -1
    assert over.dominant == "state: opt"
    assert "does NOT fit: over 1.50 MiB by 1 B (largest part: state: opt)" in str(over)
    assert na.analysis.plan(tree, {"data": 2, "model": 4}, {"mlp": "model"}).fits is None


def test_parse_bytes():
    assert parse_bytes("16GiB") == 16 * 2**30
    assert parse_bytes("512MB") == 512 * 10**6
    assert parse_bytes("1.5 kib") == 1536
    assert parse_bytes(7) == 7 and parse_bytes(8.0) == 8
    with pytest.raises(
        na.PlanError, match=r"Cannot read budget '16 gigs': expected a number and a unit"
    ):
        parse_bytes("16 gigs")
    with pytest.raises(na.PlanError, match=r"budget must be a finite number of bytes, got nan"):
        parse_bytes(float("nan"))
    with pytest.raises(na.PlanError, match=r"budget must be >= 0 bytes, got -1"):
        parse_bytes(-1)
    with pytest.raises(na.PlanError, match=r"budget must be a number of bytes, got True"):
        parse_bytes(True)


def test_plan_errors():
    tree = {"w": na.named(jax.ShapeDtypeStruct((8,), "float32"), ("embed",))}
    with pytest.raises(
        na.ShardingError, match=r"plan\(\) got no rules and no axis_mapping is in force"
    ):
        na.analysis.plan(tree, {"data": 8})
    with pytest.raises(
        na.PlanError, match=r"mesh must be a Mesh, AbstractMesh, \{axis: size\} dict"
    ):
        na.analysis.plan(tree, 8, {"embed": "data"})
    with pytest.raises(na.CompileTargetError, match=r"needs 16 devices but this process has 8"):
        na.analysis.plan(tree, {"data": 16}, {"embed": None}, step=take_state)
    with na.axis_mapping({"embed": "data"}):
        assert na.analysis.plan(tree, {"data": 8}).state_bytes_per_device == 4


def test_plan_and_plan_search_check_params_and_top():
    """A misspelt ``params`` counted 0 parameters, ``top=-1`` dropped the last group and
    ``top="3"`` raised a bare TypeError from slicing."""
    w = na.named(jax.ShapeDtypeStruct((16, 8), "float32"), ("embed", "mlp"))
    tree = {"params": {"w": w}, "opt": {"m": w}}
    mesh, rules = {"data": 2, "model": 4}, {"mlp": "model"}
    typo = (
        r"params='parmas' names no top-level subtree of the tree holding arrays \(did you mean "
        r"'params'\?\)\. Top-level subtrees: 'opt', 'params'\. Pass one of them"
    )
    with pytest.raises(na.PlanError, match=r"plan: " + typo):
        na.analysis.plan(tree, mesh, rules, params="parmas")
    with pytest.raises(na.PlanError, match=r"plan_search: " + typo):
        na.analysis.plan_search(tree, mesh, params="parmas", top=1)
    assert na.analysis.plan(tree, mesh, rules, params="opt").param_count == 16 * 8
    with pytest.raises(
        na.PlanError,
        match=r"plan: top must be >= 0 \(how many of the largest leaves to list\), got -1\. "
        r"Pass top=0 to list none\.",
    ):
        na.analysis.plan(tree, mesh, rules, top=-1)
    with pytest.raises(
        na.NamedTypeError, match=r"plan: top must be an int .*got '3' \(str\)\. Pass e\.g\. top=10"
    ):
        na.analysis.plan(tree, mesh, rules, top="3")
    assert na.analysis.plan(tree, mesh, rules, top=0).largest == []
    with pytest.raises(
        na.PlanError,
        match=r"plan_search: top must be >= 1 \(how many plans to return\), got 0\. Pass top=1",
    ):
        na.analysis.plan_search(tree, mesh, top=0)
    with pytest.raises(na.NamedTypeError, match=r"plan_search: top must be an int .*got '3'"):
        na.analysis.plan_search(tree, mesh, top="3")
    with pytest.raises(na.PlanError, match=r"plan_search: compile_limit must be >= 1 .*got 0"):
        na.analysis.plan_search(tree, mesh, step=take_state, compile_limit=0)


# -- compiled steps ---------------------------------------------------------------------------------


def test_plan_train_step_on_cpu_target():
    """A real train step (forward, loss, grad, AdamW) compiled on 8 simulated devices in a subprocess."""
    state = abstract_state()
    tokens = jax.ShapeDtypeStruct((16,), "int32")
    p = na.analysis.plan(
        state, "cpu:data=4,model=2", FSDP_TP, step=train_step, args=(state, tokens), budget="64KiB"
    )
    c = p.compiled
    assert p.target == "cpu:data=4,model=2" and p.mesh == {"data": 4, "model": 2}
    # The state is the step's argument (the tokens add 16 * 4 bytes, replicated).
    assert c["argument_bytes"] == p.state_bytes_per_device + 16 * 4
    assert c["temp_bytes"] > 0 and c["total_bytes"] == (
        c["argument_bytes"] + c["output_bytes"] + c["temp_bytes"] - c["alias_bytes"]
    )
    assert p.cost["flops"] > 0
    assert {x["kind"] for x in p.collectives} & {"all-reduce", "all-gather", "reduce-scatter"}
    assert (
        p.fits == (c["total_bytes"] <= 64 * 1024)
        and p.headroom_bytes == 64 * 1024 - c["total_bytes"]
    )
    assert p.dominant in {"state (arguments)", "temporaries", "outputs (not aliased)"}


def test_cpu_target_refuses_unimportable_step():
    tree = {"w": na.named(jax.ShapeDtypeStruct((8,), "float32"), ("embed",))}
    with pytest.raises(
        na.CompileTargetError, match=r"Cannot send the step to the compiling subprocess"
    ):
        na.analysis.plan(tree, "cpu:data=8", {"embed": "data"}, step=lambda s: None)


def test_parse_target():
    t = parse_target("cpu:data=32,model=8")
    assert (t.platform, t.sizes, t.num_devices) == ("cpu", {"data": 32, "model": 8}, 256)
    assert parse_target("tpu-v5e-256:data=32,model=8").topology == "v5e:16x16"
    assert parse_target("tpu-v5p-128:data=64").topology == "v5p:4x4x4"
    assert parse_target("tpu-v5p:4x4x8:data=128").topology == "v5p:4x4x8"
    with pytest.raises(
        na.CompileTargetError, match=r"Compile target 'tpu-v5e-256:data=8' has 256 devices"
    ):
        parse_target("tpu-v5e-256:data=8")
    with pytest.raises(na.CompileTargetError, match=r"Unknown compile target platform 'gpu'"):
        parse_target("gpu:data=8")
    with pytest.raises(na.CompileTargetError, match=r"'data=x' is not 'axis=size'"):
        parse_target("cpu:data=x")
    with pytest.raises(na.CompileTargetError, match=r"Unknown TPU slice 'v9-8'"):
        parse_target("tpu-v9-8:data=8")


def test_mesh_axes_written_with_colons_say_to_write_equals():
    """'data:32,model:8' (parse_mesh_from_string's form) read 'data' as axes of platform 'data'."""
    with pytest.raises(
        na.CompileTargetError,
        match=r"^Cannot read 'data:32,model:8': text with ':' is a compile target "
        r"'PLATFORM:axis=size,\.\.\.', and 'data' is no platform\. Write the mesh axes with '=': "
        r"'data=32,model=8' \(or 'cpu:data=32,model=8' to compile on simulated CPU devices\)\.$",
    ):
        parse_target("data:32,model:8")
    with pytest.raises(
        na.CompileTargetError,
        match=r"^Cannot read the mesh axes 'data:4,model:2' of compile target "
        r"'cpu:data:4,model:2': 'data:4' is not 'axis=size' with a positive integer size\. "
        r"Write the mesh axes with '=': 'data=4,model=2'\.$",
    ):
        parse_target("cpu:data:4,model:2")
    tree = {"w": na.named(jax.ShapeDtypeStruct((8,), "float32"), ("embed",))}
    with pytest.raises(na.CompileTargetError, match=r"Write the mesh axes with '=': 'data=8'"):
        na.analysis.plan(tree, "data:8", {"embed": "data"})


_HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None


@pytest.mark.skipif(
    _HAS_LIBTPU, reason="libtpu is installed: the missing-libtpu error cannot occur"
)
def test_tpu_target_without_libtpu_says_how_to_install():
    tree = {"w": na.named(jax.ShapeDtypeStruct((8,), "float32"), ("embed",))}
    with pytest.raises(na.CompileTargetError, match=r"pip install 'namedaxes\[tpu\]'"):
        na.analysis.plan(tree, "tpu-v5e-8:data=8", {"embed": "data"}, step=take_state)


@pytest.mark.skipif(
    not _HAS_LIBTPU, reason="libtpu is not installed (pip install 'namedaxes[tpu]')"
)
def test_tpu_target_compiles_for_the_slice():
    state = abstract_state()
    p = na.analysis.plan(state, "tpu-v5e-8:data=4,model=2", FSDP_TP, step=take_state)
    # TPU pads small arrays to tiles: XLA reports at least the analytic bytes.
    assert p.compiled["argument_bytes"] >= p.state_bytes_per_device


def test_parse_collectives():
    hlo = """
      ag = f32[8,4]{1,0} all-gather(f32[2,4]{1,0} x), dimensions={0}
      ar = bf16[16]{0} all-reduce(bf16[16]{0} y), to_apply=add
      ar2 = (f32[4]{0}, f32[2]{0}) all-reduce(f32[4]{0} a, f32[2]{0} b), to_apply=add
      s = (f32[2]{0}, f32[8]{0}) all-gather-start(f32[2]{0} z), dimensions={0}
      d = f32[8]{0} all-gather-done(s)
    """
    assert parse_collectives(hlo) == [
        {"kind": "all-gather", "count": 2, "bytes": 128 + 32},
        {"kind": "all-reduce", "count": 2, "bytes": 32 + 24},
    ]
    # Sub-byte types are packed, each buffer rounded up to a byte.
    packed = """
      ag = s4[1024]{0} all-gather(s4[256]{0} x), dimensions={0}
      ar = f4e2m1fn[3,5]{1,0} all-reduce(f4e2m1fn[3,5]{1,0} y), to_apply=add
      cp = u2[10]{0} collective-permute(u2[10]{0} z), source_target_pairs={{0,1}}
    """
    assert parse_collectives(packed) == [
        {"kind": "all-gather", "count": 1, "bytes": 512},
        {"kind": "all-reduce", "count": 1, "bytes": 8},
        {"kind": "collective-permute", "count": 1, "bytes": 3},
    ]


def test_compiled_memory_counts_unused_arguments():
    x = jax.ShapeDtypeStruct((256,), "float32")
    figures = na.analysis.compiled_memory(lambda x, y: x * 2, x, x)
    assert figures["argument_bytes"] == 2 * 256 * 4


class _OomLowered:
    def compile(self):
        raise RuntimeError(
            "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space "
            "hbm. Used 20.51G of 15.48G hbm. Exceeded hbm capacity by 5.03G."
        )


class _OomFn:
    def __call__(self, *args):
        return None

    def lower(self, *args):
        return _OomLowered()


def test_compiled_memory_wraps_out_of_memory():
    with pytest.raises(
        na.DeviceOutOfMemoryError, match=r"needs 22,022,444,810 B \(20.51 GiB\) per device"
    ) as info:
        na.analysis.compiled_memory(_OomFn(), jax.ShapeDtypeStruct((4,), "float32"))
    assert info.value.used_bytes == int(20.51 * 2**30) and info.value.capacity_bytes == int(
        15.48 * 2**30
    )
    assert "RESOURCE_EXHAUSTED" in info.value.xla_message


# -- plan_search ------------------------------------------------------------------------------------


def test_plan_search_best_fits_and_matches_plan():
    state = abstract_state()
    mesh = {"data": 2, "model": 4}
    budget = 40 * 1024
    found = na.analysis.plan_search(state, mesh, budget=budget, top=3)
    assert 1 <= len(found) <= 3
    states = [p.state_bytes_per_device for p in found]
    assert states == sorted(states) and all(s <= budget for s in states)
    for p in found:
        assert isinstance(p.rules, na.AxisRules) and p.fits and p.notes
        # The arithmetic in the search agrees with plan() under the same rules.
        assert (
            na.analysis.plan(state, mesh, p.rules).state_bytes_per_device
            == p.state_bytes_per_device
        )
    assert found.counts["over_budget"] > 0 and found.rejected
    assert found.candidates == sum(found.counts.values()) + len(found)
    json.dumps(found.to_dict())


def test_plan_search_finds_the_smallest_state():
    """Oracle: every mapping of two logical axes, planned one by one."""
    w = na.named(jax.ShapeDtypeStruct((8, 12), "float32"), ("embed", "mlp"))
    mesh = {"data": 2, "model": 4}
    options = [(), ("data",), ("model",), ("data", "model")]
    best = math.inf
    for a, b in itertools.product(options, repeat=2):
        if set(a) & set(b):
            continue
        rules = na.AxisRules(
            [(n, t) for n, t in (("embed", a), ("mlp", b)) if t], unsatisfied="replicate"
        )
        best = min(best, na.analysis.plan({"w": w}, mesh, rules).state_bytes_per_device)
    assert (
        na.analysis.plan_search({"w": w}, mesh, top=1)[0].state_bytes_per_device
        == best
        == 8 * 12 * 4 // 8
    )


def test_plan_search_errors():
    w = na.named(jax.ShapeDtypeStruct((8, 12), "float32"), ("embed", "mlp"))
    with pytest.raises(
        PlanDoesNotFitError,
        match=r"No mapping of \['embed', 'mlp'\] on Mesh\(data=2, model=4\) fits",
    ):
        na.analysis.plan_search({"w": w}, {"data": 2, "model": 4}, budget=10)
    with pytest.raises(na.PlanError, match=r"logical_axes names \['heads'\], which no leaf has"):
        na.analysis.plan_search({"w": w}, {"data": 2, "model": 4}, logical_axes=["heads"])
    with pytest.raises(
        na.PlanError, match=r"would enumerate 12 mappings .* \(more than max_candidates=4\)"
    ):
        na.analysis.plan_search({"w": w}, {"data": 2, "model": 4}, max_candidates=4)


@pytest.mark.parametrize("order", [("embed", "mlp"), ("mlp", "embed")])
def test_plan_search_does_not_depend_on_axis_order(order):
    """Sharding `embed` or `mlp` over the whole mesh ties; the winner used to be whichever axis
    the array (or ``logical_axes``) listed last."""
    sizes = {"embed": 1024, "mlp": 512}
    w = na.named(jax.ShapeDtypeStruct(tuple(sizes[n] for n in order), "float32"), order)
    mesh = {"data": 2, "model": 4}
    both = na.AxisRules([("mlp", ("data", "model"))], unsatisfied="replicate")
    for logical_axes in (None, list(order)):
        found = na.analysis.plan_search(
            {"w": w}, mesh, budget="300KiB", top=3, logical_axes=logical_axes
        )
        assert [p.rules for p in found] == [
            both,
            na.AxisRules([("embed", ("data", "model"))], unsatisfied="replicate"),
            na.AxisRules([("embed", "data"), ("mlp", "model")], unsatisfied="replicate"),
        ]
        assert [p.state_bytes_per_device for p in found] == [1024 * 512 * 4 // 8] * 3


def test_plan_search_with_a_step_raises_does_not_fit_when_no_compiled_mapping_fits():
    """The budget holds the state but not the compiled step (its outputs): a PlanDoesNotFitError
    naming XLA's figure, as the state-only search raises."""
    w = na.named(jax.ShapeDtypeStruct((64, 32), "float32"), ("embed", "mlp"))
    state = {"params": {"w": w}}
    with pytest.raises(
        PlanDoesNotFitError,
        match=r"None of the 1 best mappings by state compiles within the budget of 1\.00 KiB per "
        r"device \(mlp->data/model: compiled step needs 2\.00 KiB\)",
    ):
        na.analysis.plan_search(
            state, {"data": 2, "model": 4}, step=scale_params, budget="1KiB", compile_limit=1
        )


def test_plan_and_plan_search_place_the_experts_axis():
    """A mixture of experts' parameters by the `experts` axis: plan counts what placing it saves
    (expert weights and router), plan_search finds expert parallelism over the whole mesh."""
    config = models.TransformerConfig(
        "mixtral", vocab_size=64, hidden_size=32, intermediate_size=16, num_layers=2,
        num_heads=4, num_kv_heads=4, head_dim=8, num_experts=8,
    )  # fmt: skip
    model = eqx.filter_eval_shape(models.Transformer, config, key=jax.random.key(0))
    mesh = {"data": 2, "model": 4}
    experts = 2 * 8 * (3 * 32 * 16 + 32) * 4  # gate, up, down and the router, float32
    p = na.analysis.plan(model, mesh, {"experts": "model"})
    assert p.axes["experts"] == {
        "mesh_axes": ["model"],
        "leaves": 4,
        "saved_bytes": experts * 3 // 4,
    }
    assert p.state_bytes_per_device == p.total_bytes - experts * 3 // 4
    best = na.analysis.plan_search(model, mesh, logical_axes=["experts", "expert_mlp"], top=1)[0]
    assert best.rules == na.AxisRules([("experts", ("data", "model"))], unsatisfied="replicate")
    assert best.state_bytes_per_device == p.total_bytes - experts * 7 // 8


def scale_params(state):
    """A cheap step with temporaries and outputs."""
    return jax.tree.map(lambda x: x * 2.0, state["params"])


def test_plan_search_ranks_compiled_steps():
    state = abstract_state()
    # Both layouts compile in one subprocess on 8 simulated devices.
    found = na.analysis.plan_search(
        state,
        "cpu:data=4,model=2",
        logical_axes=["embed", "mlp"],
        step=scale_params,
        top=2,
        compile_limit=2,
    )
    assert found.compiled == 2 and len(found) == 2
    assert all(p.compiled["argument_bytes"] == p.state_bytes_per_device for p in found)
    costs = [p.compiled["temp_bytes"] + sum(c["bytes"] for c in p.collectives) for p in found]
    assert costs == sorted(costs)
    assert "XLA temporaries + collective bytes" in found[0].notes[0]


def attend_step(params, x):
    """Causal self-attention of activations (batch, position, embed): its trace reads the mapping
    (the attention runs per shard, sequence-sharded when ``position`` is mapped)."""
    q = na.dot(x, params["wq"], axis="embed")
    k = q.rename({"position": "key_position"})
    return na.nn.dot_product_attention(q, k, k, causal=True).array.sum()


def test_plan_and_plan_search_place_the_sequence():
    """``position`` (an axis of the step's arguments only) is placed and searched like any axis:
    each mapping compiles its own trace (the same jitted step), and a mapping entry for it is
    matched by the arguments."""
    params = {"wq": na.named(jax.ShapeDtypeStruct((E, H, D), "float32"), ("embed", "heads", "head_dim"))}  # fmt: skip
    x = na.named(jax.ShapeDtypeStruct((2, 64, E), "float32"), ("batch", "position", "embed"))
    mesh = {"data": 2, "context": 4}
    step = jax.jit(attend_step)
    kinds = {}
    for rules in ({"batch": "data"}, {"batch": "data", "position": "context"}):
        p = na.analysis.plan(params, mesh, rules, step=step, args=(params, x))
        assert p.unmatched == ()
        kinds[len(rules)] = {c["kind"] for c in p.collectives}
    assert "all-gather" not in kinds[1] and "all-gather" in kinds[2]  # the keys, gathered

    found = na.analysis.plan_search(
        params, mesh, logical_axes=["batch", "position"], step=step, args=(params, x), top=1,
        compile_limit=3,
    )  # fmt: skip
    # batch: nothing or data; position: nothing, data, context or both; sharing data conflicts
    assert found.candidates == 8 and found.counts["conflict"] == 2
    assert dict(found[0].rules.pairs).get("position")  # the best plan splits the sequence


def test_an_unmatched_entry_is_reported_with_the_closest_axis_of_the_step():
    """A typo of an axis only the step's arguments have (``position``) is listed with that axis
    suggested, as the tree's axes are."""
    params = {"wq": na.named(jax.ShapeDtypeStruct((E, H, D), "float32"), ("embed", "heads", "head_dim"))}  # fmt: skip
    x = na.named(jax.ShapeDtypeStruct((2, 64, E), "float32"), ("batch", "position", "embed"))
    rules = {"batch": "data", "postion": "context", "embd": "data"}
    p = na.analysis.plan(params, {"data": 2, "context": 4}, rules, step=jax.jit(attend_step),
                         args=(params, x))  # fmt: skip
    assert p.unmatched == (("postion", "context"), ("embd", "data"))
    assert p.step_axes == ("batch", "embed", "head_dim", "heads", "position")
    assert str(p).splitlines()[-1].strip() == (
        "mapping entries that match no axis: 'postion' -> 'context' (did you mean 'position'?), "
        "'embd' -> 'data' (did you mean 'embed'?)"
    )


# -- MemoryConstrainedShardingRule: the whole-device budget ---------------------------------------


def _leaves(n):
    return {f"w{i}": jax.ShapeDtypeStruct((64, 16), "float32") for i in range(n)}


def test_memory_rule_device_scope_budgets_the_sum():
    tree = _leaves(8)  # 8 leaves of 4 KiB
    mesh = {"data": 2, "model": 4}
    per_leaf = na.rules.MemoryConstrainedShardingRule(4096, mesh).apply(tree)
    analyzer = na.analysis.ShardingAnalyzer(mesh)
    assert analyzer.estimate_memory_usage(tree, per_leaf)["size_per_device"] == 8 * 4096  # 8x over
    whole = na.rules.MemoryConstrainedShardingRule(4096, mesh, scope="device").apply(tree)
    assert analyzer.estimate_memory_usage(tree, whole)["size_per_device"] <= 4096
    assert set(whole.values()) == {P(("model", "data"), None)}


def test_memory_rule_device_scope_keeps_small_leaves_replicated():
    tree = {
        "big": jax.ShapeDtypeStruct((64, 64), "float32"),
        "small": jax.ShapeDtypeStruct((4,), "float32"),
    }
    specs = na.rules.MemoryConstrainedShardingRule(
        8192, {"data": 2, "model": 4}, scope="device"
    ).apply(tree)
    assert specs == {"big": P("model", None), "small": P(None)}


def test_memory_rule_device_scope_unfit():
    tree = {"odd": jax.ShapeDtypeStruct((7, 3), "float32")}
    rule = na.rules.MemoryConstrainedShardingRule(8, {"data": 2}, scope="device")
    with pytest.raises(
        na.ShardingError, match=r"one device still holds 84 bytes .* over the budget of 8 bytes"
    ):
        rule.apply(tree)
    warn = na.rules.MemoryConstrainedShardingRule(8, {"data": 2}, scope="device", on_unfit="warn")
    with pytest.warns(na.rules.MemoryBudgetWarning, match=r"still holds 84 bytes"):
        assert warn.apply(tree) == {"odd": P(None, None)}


def test_memory_rule_refuses_non_finite_budget_and_unknown_scope():
    with pytest.raises(
        na.ShardingError, match=r"max_memory_per_device must be a finite number of bytes, got nan"
    ):
        na.rules.MemoryConstrainedShardingRule(float("nan"), {"data": 2})
    with pytest.raises(na.ShardingError, match=r"got inf"):
        na.rules.MemoryConstrainedShardingRule(float("inf"), {"data": 2})
    with pytest.raises(
        na.ShardingError, match=r"scope must be 'leaf' \(budget each array\) or 'device'"
    ):
        na.rules.MemoryConstrainedShardingRule(1, {"data": 2}, scope="mesh")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert na.rules.MemoryConstrainedShardingRule(10**9, {"data": 2}).scope == "leaf"


def test_plan_values_match_numpy_bytes():
    """Oracle: without a mesh split, the state is the sum of the leaves' nbytes."""
    state = abstract_state()
    total = sum(np.dtype(x.dtype).itemsize * math.prod(x.shape) for x in jax.tree.leaves(state))
    p = na.analysis.plan(state, {"data": 1}, {})
    assert p.total_bytes == p.state_bytes_per_device == total


def test_plan_prints_as_text_and_rich():
    rich_console = pytest.importorskip("rich.console")
    import io

    w = na.named(jax.ShapeDtypeStruct((64, 16), "float32"), ("embed", "mlp"))
    p = na.analysis.plan(
        {"params": {"w": w}}, {"data": 2, "model": 4}, {"mlp": "model"}, budget=1024
    )
    text = str(p)
    assert "state per device       1,024 B  1.00 KiB" in text
    assert "step fits" not in text and "state fits: 0 B headroom of 1.00 KiB" in text
    out = io.StringIO()
    rich_console.Console(file=out, width=160).print(p)
    assert "state per device" in out.getvalue() and "params/w" in out.getvalue()


def failing_step(state):
    raise RuntimeError("step bug")


def test_plan_and_plan_search_refuse_args_that_are_not_a_tuple_or_lack_a_step():
    tree = {"w": na.named(jax.ShapeDtypeStruct((64, 32), "float32"), ("embed", "mlp"))}
    mesh = {"data": 2, "model": 4}
    not_tuple = (
        r"args must be a tuple of the step's arguments, e\.g\. args=\(state, batch\); got "
        r"{}\. For a step that takes one argument x, pass args=\(x,\)\."
    )
    for call, name in ((na.analysis.plan, "plan"), (na.analysis.plan_search, "plan_search")):
        rules = ({"embed": "data"},) if name == "plan" else ()
        for bad, kind in (
            (tree, "dict"),
            (jax.ShapeDtypeStruct((8,), "float32"), "ShapeDtypeStruct"),
        ):
            with pytest.raises(na.PlanError, match=rf"^{name}: " + not_tuple.format(kind)):
                call(tree, mesh, *rules, step=take_state, args=bad)
        with pytest.raises(na.PlanError, match=rf"^{name}: args needs step=: .* Pass the step"):
            call(tree, mesh, *rules, args=(tree,))


def test_a_failing_step_is_a_compile_target_error_locally_as_in_the_subprocess():
    tree = {"w": na.named(jax.ShapeDtypeStruct((64, 32), "float32"), ("embed", "mlp"))}
    with pytest.raises(
        na.CompileTargetError,
        match=r"Compiling the step on Mesh\(data=2, model=4\) failed: RuntimeError: step bug\. "
        r"Fix the step",
    ) as info:
        na.analysis.plan(tree, {"data": 2, "model": 4}, {"embed": "data"}, step=failing_step)
    assert isinstance(info.value.__cause__, RuntimeError)


def test_rich_plan_names_the_replicated_leaves():
    rich_console = pytest.importorskip("rich.console")
    import io

    w = na.named(jax.ShapeDtypeStruct((64, 16), "float32"), ("embed", "mlp"))
    b = na.named(jax.ShapeDtypeStruct((16,), "float32"), ("bias",))
    p = na.analysis.plan({"params": {"w": w, "b": b}}, {"data": 2, "model": 4}, {"mlp": "model"})
    assert "replicated: params/b" in str(p)
    out = io.StringIO()
    rich_console.Console(file=out, width=160, force_terminal=True).print(p)
    assert "replicated: params/b" in out.getvalue()
