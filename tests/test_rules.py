"""Sharding rules: the specs each rule chooses, their validity, placement, determinism, bad input."""

import itertools
import math
import os
import subprocess
import sys
import textwrap

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import sds
from _meshes import make_mesh
from jax.sharding import AbstractMesh, NamedSharding
from jax.sharding import PartitionSpec as P

import namedaxes as na
from namedaxes import MeshError, NamedTypeError, ShardingError
from namedaxes.analysis import ShardingAnalyzer
from namedaxes.rules import (
    AutoShardingRule,
    CompositeShardingRule,
    LogicalAxisRule,
    MemoryBudgetWarning,
    MemoryConstrainedShardingRule,
    MeshPartitionHelper,
    PathRegexRule,
    ShapeBasedShardingRule,
    ShardingRule,
)

MESH = {"data": 2, "model": 4}


def shard_shapes(x):
    return [s.data.shape for s in x.addressable_shards]


def padded(spec, ndim):
    """A spec with one entry per dimension (Auto-mode jit outputs drop trailing Nones)."""
    return P(*spec, *([None] * (ndim - len(spec))))


def assert_valid(tree, specs, mesh):
    assert ShardingAnalyzer(mesh).validate_partition_specs(tree, specs) == []


# -- AutoShardingRule --------------------------------------------------------------------------


def test_auto_largest_dimension_takes_largest_axis():
    rule = AutoShardingRule(MESH)
    specs = rule.apply(
        {"w": sds(6, 8), "sq": sds(8, 8), "v": sds(12), "odd": sds(3, 5), "s": sds()}
    )
    # (6, 8): 8 takes model=4, then 6 takes data=2. Ties (8, 8) go by dimension index.
    assert specs == {
        "w": P("data", "model"),
        "sq": P("model", "data"),
        "v": P("model"),
        "odd": P(None, None),
        "s": P(),
    }


def test_auto_reverse_visits_smallest_first():
    specs = AutoShardingRule({"a": 4, "b": 2}, reverse=True).apply({"w": sds(8, 4)})
    # smallest dim (4) first takes a=4, then 8 takes b=2; without reverse: 8->a, 4->b.
    assert specs["w"] == P("b", "a")
    assert AutoShardingRule({"a": 4, "b": 2}).apply({"w": sds(8, 4)})["w"] == P("a", "b")


def test_auto_axis_names_order_min_size_and_size_one_axes():
    mesh = {"one": 1, "data": 2, "model": 4}
    assert AutoShardingRule(mesh, axis_names=["data", "model"]).apply([sds(8, 4)]) == [
        P("data", "model")
    ]
    # the size-1 axis is never used even when listed first
    assert AutoShardingRule(mesh, axis_names=["one", "data"]).apply([sds(8)]) == [P("data")]
    small = AutoShardingRule(mesh, min_shard_size=64).apply({"small": sds(8, 4), "big": sds(16, 4)})
    assert small == {"small": P(None, None), "big": P("model", "data")}
    assert AutoShardingRule(mesh).apply([sds(0, 8)]) == [P(None, None)]


def test_auto_non_array_leaves_get_none_and_structure_is_kept():
    x = na.named(jnp.zeros((8, 6)), ("batch", "embed"))
    tree = {"x": x, "lr": 0.1, "nothing": None, "layers": [jnp.zeros(4), "name"]}
    specs = AutoShardingRule(MESH).apply(tree)
    assert specs == {
        "x": P("model", "data"),
        "lr": None,
        "nothing": None,
        "layers": [P("model"), None],
    }


def test_auto_specs_are_valid_on_random_shapes():
    rng = np.random.default_rng(0)
    mesh = {"a": 2, "b": 3, "c": 4, "d": 1}
    tree = [sds(*rng.integers(1, 25, rng.integers(0, 4))) for _ in range(200)]
    for rule in (AutoShardingRule(mesh), AutoShardingRule(mesh, reverse=True)):
        assert_valid(tree, rule.apply(tree), mesh)


def test_auto_rejects_unknown_axis_names():
    with pytest.raises(
        ShardingError,
        match=r"axis_names 'tensor', which the mesh Mesh\(data=2, model=4\) lacks\. Available mesh axes: 'data', 'model'",
    ):
        AutoShardingRule(MESH, axis_names=["data", "tensor"]).apply([sds(8)])


def test_auto_uses_the_context_mesh_and_needs_one():
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    with jax.set_mesh(mesh):
        assert AutoShardingRule().apply([sds(8, 2)]) == [P("model", "data")]
    with pytest.raises(
        MeshError,
        match=r"AutoShardingRule needs a device mesh, but none was given and none is set\. Pass mesh=\.\.\. \(a jax\.sharding\.Mesh, AbstractMesh or \{axis: size\} mapping\)",
    ):
        AutoShardingRule().apply([sds(8)])


def test_mesh_without_devices_is_rejected():
    empty = jax.sharding.Mesh(np.empty((0,), dtype=object), ("data",))
    with pytest.raises(MeshError, match=r"has no devices"):
        AutoShardingRule(empty).apply([sds(8)])
    with pytest.raises(MeshError, match=r"has no devices"):
        ShardingAnalyzer({"data": 0})
    with pytest.raises(MeshError, match=r"has no devices"):
        AutoShardingRule({}).apply([sds(8)])


# -- placement ---------------------------------------------------------------------------------


def test_shard_places_arrays_named_arrays_and_abstract_leaves(mesh):
    rule = AutoShardingRule(mesh)
    x = na.named(jnp.arange(64.0).reshape(8, 8), ("batch", "embed"))
    tree = {"w": jnp.ones((16, 2)), "x": x, "abs": sds(8, 4), "lr": 0.5}
    specs = rule.apply(tree)
    out = rule.shard(tree)
    assert out["w"].sharding.spec == specs["w"]
    assert isinstance(out["x"], na.NamedArray) and out["x"].axes == x.axes
    assert out["x"].array.sharding.spec == specs["x"]
    np.testing.assert_array_equal(out["x"].array, x.array)
    assert out["abs"].sharding.spec == specs["abs"]
    assert out["lr"] == 0.5
    ways = [
        math.prod(mesh.shape[a] for a in ((e,) if isinstance(e, str) else e or ()))
        for e in specs["w"]
    ]
    assert shard_shapes(out["w"]) == [(16 // ways[0], 2 // ways[1])] * 8
    shardings = rule.to_shardings(tree)
    assert shardings["x"] == NamedSharding(mesh, specs["x"]) and shardings["lr"] is None


def test_shard_inside_jit_constrains(mesh):
    rule = AutoShardingRule(mesh)

    @jax.jit
    def f(tree):
        return jax.tree.map(lambda a: a * 2, rule.shard(tree))

    tree = {"w": jnp.ones((8, 4)), "x": na.named(jnp.ones((4, 8)), ("a", "b"))}
    with jax.set_mesh(mesh):
        out = f(tree)
    specs = rule.apply(tree)
    assert padded(out["w"].sharding.spec, 2) == specs["w"]
    assert padded(out["x"].array.sharding.spec, 2) == specs["x"]
    np.testing.assert_array_equal(out["w"], 2 * np.ones((8, 4)))


def test_to_shardings_needs_a_real_mesh():
    with pytest.raises(
        MeshError, match=r"to_shardings needs a jax.sharding.Mesh.*\{axis: size\} dict can plan"
    ):
        AutoShardingRule(MESH).to_shardings([sds(8)])
    abstract = AbstractMesh((2, 4), ("data", "model"))
    assert AutoShardingRule(abstract).to_shardings([sds(8)])[0].spec == P("model")


# -- MemoryConstrainedShardingRule -------------------------------------------------------------


def test_memory_rule_shards_only_what_does_not_fit():
    rule = MemoryConstrainedShardingRule(1024, MESH)
    specs = rule.apply({"small": sds(16), "big": sds(64, 16), "huge": sds(64, 32)})
    # big: 4096 B -> model=4 on dim 0 gives 1024 B (fits, stop). huge: 8 KiB -> needs all 8.
    assert specs == {"small": P(None), "big": P("model", None), "huge": P("model", "data")}


def test_memory_rule_stacks_mesh_axes_on_one_dimension():
    specs = MemoryConstrainedShardingRule(32, MESH).apply([sds(64)])  # 256 B -> 8-way
    assert specs == [P(("model", "data"))]
    assert ShardingAnalyzer(MESH).estimate_memory_usage([sds(64)], specs)["size_per_device"] == 32


@pytest.mark.parametrize("scope", ["leaf", "device"])
def test_memory_rule_counts_sub_byte_types_packed(scope):
    """int4[64, 16] is 512 bytes on a device (two per byte), not 1024: it fits a 512-byte budget
    replicated, and 511 bytes shard it."""
    leaf = {"w": sds(64, 16, dtype="int4")}
    assert MemoryConstrainedShardingRule(512, MESH, scope=scope).apply(leaf) == {"w": P(None, None)}
    assert MemoryConstrainedShardingRule(511, MESH, scope=scope).apply(leaf) != {"w": P(None, None)}


def test_memory_rule_searches_when_greedy_fails():
    # Greedy puts a=6 on the 12 (largest), leaving b=4 nothing to divide (12 B/device);
    # a=6 on dim 0 and b=4 on dim 1 reaches 3 B/device.
    specs = MemoryConstrainedShardingRule(5, {"a": 6, "b": 4}).apply(
        {"w": sds(6, 12, dtype="int8")}
    )
    assert specs == {"w": P("a", "b")}


def test_memory_rule_unfit_error_and_warning():
    tree = {"layer": {"w": sds(10, 6)}}  # 240 B; model=4 divides neither: data=2 on 10 -> 120 B
    with pytest.raises(
        ShardingError,
        match=r"leaf 'layer/w' \(shape \(10, 6\), float32\) holds 240 bytes .*best valid spec on "
        r"Mesh\(data=2, model=4\), P\('data', None\), still leaves 120 bytes .* over the budget of 100 bytes",
    ):
        MemoryConstrainedShardingRule(100, MESH).apply(tree)
    with pytest.warns(MemoryBudgetWarning, match=r"leaf 'layer/w'.*120 bytes"):
        specs = MemoryConstrainedShardingRule(100, MESH, on_unfit="warn").apply(tree)
    assert specs == {"layer": {"w": P("data", None)}}


def test_memory_rule_bad_budget():
    with pytest.raises(ShardingError, match=r"max_memory_per_device must be >= 0 bytes, got -1"):
        MemoryConstrainedShardingRule(-1, MESH)
    with pytest.raises(
        NamedTypeError, match=r"max_memory_per_device must be a number of bytes, got '1GB'"
    ):
        MemoryConstrainedShardingRule("1GB", MESH)
    with pytest.raises(ShardingError, match=r"on_unfit must be 'error' or 'warn', got 'ignore'"):
        MemoryConstrainedShardingRule(1, MESH, on_unfit="ignore")


def _fewest_bytes(shape, itemsize, mesh):
    """Oracle: the fewest bytes per device of any valid spec (every axis to a dim or to none)."""
    best = math.prod(shape) * itemsize
    for choice in itertools.product(range(len(shape) + 1), repeat=len(mesh)):
        ways = [1] * len(shape)
        for (_, size), d in zip(mesh.items(), choice):
            if d < len(shape):
                ways[d] *= size
        if all(n % w == 0 for n, w in zip(shape, ways)):
            best = min(best, math.prod(shape) * itemsize // math.prod(ways))
    return best


def test_memory_rule_fits_whenever_any_valid_spec_fits():
    rng = np.random.default_rng(1)
    mesh = {"a": 2, "b": 3, "c": 4}
    tree = [sds(*rng.integers(1, 30, rng.integers(1, 4))) for _ in range(100)]
    rule = MemoryConstrainedShardingRule(256, mesh, on_unfit="warn")
    with pytest.warns(MemoryBudgetWarning):  # some random shapes (primes) cannot fit
        specs = rule.apply(tree)
    assert_valid(tree, specs, mesh)
    usage = ShardingAnalyzer(mesh).estimate_memory_usage(tree, specs)["leaves"]
    for i, leaf in enumerate(tree):
        got = usage[str(i)]["bytes_per_device"]
        best = _fewest_bytes(leaf.shape, 4, mesh)
        assert (got <= 256) == (best <= 256), (leaf.shape, specs[i])
        if best > 256:
            assert got == best


# -- ShapeBasedShardingRule ------------------------------------------------------------------


def test_shape_rule_first_match_wins_in_order():
    patterns = [((None, 1024), P("model", None)), ((1024, 1024), P(None, "model")), ((None,), None)]
    rule = ShapeBasedShardingRule(patterns, mesh=MESH)
    tree = {"emb": sds(32000, 1024), "sq": sds(1024, 1024), "b": sds(7), "other": sds(4, 4)}
    assert rule.apply(tree) == {
        "emb": P("model", None),
        "sq": P("model", None),
        "b": P(),
        "other": P(None, None),
    }
    as_dict = ShapeBasedShardingRule(
        {(1024, 1024): P(None, "model"), (None, 1024): P("model")}, mesh=MESH
    )
    assert as_dict.apply(tree)["sq"] == P(None, "model")


def test_shape_rule_checks_specs():
    with pytest.raises(
        ShardingError,
        match=r"Shape pattern \(None,\) \(rank 1\) has spec P\('data', 'model'\) with 2 entries",
    ):
        ShapeBasedShardingRule({(None,): P("data", "model")})
    # a mesh axis the mesh lacks fails when the rule is built with that mesh (matched or not)
    with pytest.raises(
        ShardingError,
        match=r"shape pattern \(None, 8\) has spec P\('tensor',\), which names mesh axis 'tensor', but Mesh\(data=2, model=4\) has axes 'data', 'model'",
    ):
        ShapeBasedShardingRule({(None, 8): P("tensor")}, mesh=MESH)
    rule = ShapeBasedShardingRule({(None, 8): P("model")}, mesh=MESH)
    with pytest.raises(
        ShardingError,
        match=r"leaf 'w'.*dimension 0 of shape \(6, 8\) has size 6, which is not divisible by 4",
    ):
        rule.apply({"w": sds(6, 8)})
    with pytest.raises(
        NamedTypeError, match=r"shape pattern must be a tuple of ints and None wildcards, got \[8\]"
    ):
        ShapeBasedShardingRule([([8], P())])


# -- PathRegexRule ---------------------------------------------------------------------------


def test_path_rule_matches_rendered_paths():
    x = na.named(jnp.zeros((8, 6)), ("batch", "embed"))
    tree = {"attn": [{"kernel": jnp.zeros((8, 8))}], "x": x, "bias": jnp.zeros(8), "step": 3}
    rule = PathRegexRule(
        [(r"attn/0/kernel$", P(None, "model")), (r"^x$", {"batch": "data"}), (r".*", P())],
        mesh=MESH,
    )
    assert rule.apply(tree) == {
        "attn": [{"kernel": P(None, "model")}],
        "x": P("data", None),  # the NamedArray's own `array` field is not part of its path
        "bias": P(),
        "step": None,
    }


def test_path_rule_strict_lists_unmatched():
    tree = {"a": jnp.zeros(4), "b": {"c": jnp.zeros(4)}, "d": jnp.zeros(4)}
    with pytest.raises(
        ShardingError,
        match=r"matched no pattern for 2 leaf path\(s\): 'b/c', 'd'\. Patterns: '\^a'",
    ):
        PathRegexRule([(r"^a", P("data"))], mesh=MESH).apply(tree)
    loose = PathRegexRule([(r"^a", P("data"))], strict=False, mesh=MESH).apply(tree)
    assert loose == {"a": P("data"), "b": {"c": P(None)}, "d": P(None)}


def test_path_rule_bad_input():
    with pytest.raises(ShardingError, match=r"pattern '\(' is not a valid regex"):
        PathRegexRule([("(", P())])
    with pytest.raises(
        NamedTypeError, match=r"Pattern 'w' has spec 'data' \(str\); expected a PartitionSpec"
    ):
        PathRegexRule([("w", "data")])
    rule = PathRegexRule([("w", {"embed": "model"})], mesh=MESH)
    with pytest.raises(
        ShardingError,
        match=r"gives leaf 'w' the axis mapping .* plain array of shape \(8,\) with no axis names",
    ):
        rule.apply({"w": jnp.zeros(8)})
    with pytest.raises(
        ShardingError,
        match=r"PathRegexRule pattern 'x': The axis mapping names mesh axis 'tensor' \(used by logical axis 'batch'\)",
    ):
        PathRegexRule([("x", {"batch": "tensor"})], mesh=MESH)
    rule = PathRegexRule([("x", {"batch": "model"})], mesh=MESH)
    with pytest.raises(ShardingError, match=r"At leaf 'x': .*'batch'"):
        rule.apply({"x": na.named(jnp.zeros(6), "batch")})


# -- LogicalAxisRule -------------------------------------------------------------------------


def test_logical_rule_resolves_named_arrays_and_replicates_plain_ones():
    x = na.named(jnp.zeros((8, 6)), ("batch", "embed"))
    specs = LogicalAxisRule(
        {"batch": "data", "embed": "model"}, MESH, unsatisfied="replicate"
    ).apply({"x": x, "plain": jnp.zeros((4, 4))})
    assert specs == {"x": P("data", None), "plain": P(None, None)}  # 6 % 4 != 0: replicated


def test_logical_rule_uses_context_mapping_and_mesh(mesh_2x4):
    x = na.named(jnp.zeros((8, 8)), ("batch", "embed"))
    with jax.set_mesh(mesh_2x4), na.axis_mapping({"batch": "data", "embed": "model"}):
        specs = LogicalAxisRule().apply([x])
        out = LogicalAxisRule().shard([x])
    assert specs == [P("data", "model")]
    assert out[0].array.sharding.spec == P("data", "model")
    assert shard_shapes(out[0].array) == [(4, 2)] * 8


def test_logical_rule_on_eval_shape_of_equinox_module():
    class Layer(eqx.Module):
        w: na.NamedArray
        b: na.NamedArray
        name: str = eqx.field(static=True, default="layer")

    def make():
        return Layer(na.named(jnp.zeros((16, 8)), ("embed", "mlp")), na.named(jnp.zeros(8), "mlp"))

    abstract = eqx.filter_eval_shape(make)
    specs = LogicalAxisRule({"embed": "data", "mlp": "model"}, MESH).apply(abstract)
    assert (specs.w, specs.b) == (P("data", "model"), P("model"))


def test_logical_rule_errors_name_the_leaf():
    x = na.named(jnp.zeros((8,)), "batch")
    with pytest.raises(ShardingError, match=r"mesh axis 'replica'.*Mesh\(data=2, model=4\)"):
        LogicalAxisRule({"batch": "replica"}, MESH).apply({"layers": [x]})
    with pytest.raises(ShardingError, match=r"At leaf 'y': Cannot shard axis 'batch' \(size 3\)"):
        LogicalAxisRule({"batch": "data"}, MESH).apply({"y": na.named(jnp.zeros(3), "batch")})


# -- CompositeShardingRule -------------------------------------------------------------------


def test_composite_first_rule_that_shards_wins():
    x = na.named(jnp.zeros((8, 6)), ("batch", "embed"))
    rule = CompositeShardingRule(
        LogicalAxisRule({"batch": "data"}, MESH),
        PathRegexRule([("special", P(None, "data"))], strict=False, mesh=MESH),
        AutoShardingRule(MESH),
    )
    tree = {
        "x": x,
        "w": jnp.zeros((16, 4)),
        "special": jnp.zeros((4, 4)),
        "odd": jnp.zeros(3),
        "k": "s",
    }
    assert rule.apply(tree) == {
        "x": P("data", None),
        "w": P("model", "data"),
        "special": P(None, "data"),
        "odd": P(None),  # nobody shards it: the first rule's spec
        "k": None,
    }


def test_composite_bad_input():
    with pytest.raises(NamedTypeError, match=r"needs at least one rule"):
        CompositeShardingRule()
    with pytest.raises(
        NamedTypeError,
        match=r"argument 1 is \{'a': 'b'\} \(dict\); every argument must be a ShardingRule",
    ):
        CompositeShardingRule(AutoShardingRule(), {"a": "b"})


def test_custom_rule_subclass():
    class Everything(ShardingRule):
        def apply(self, tree):
            return jax.tree.map(lambda _: P("data"), tree)

    mesh = jax.make_mesh((8,), ("data",))
    out = Everything().shard({"w": jnp.zeros(16)}, mesh=mesh)
    assert shard_shapes(out["w"]) == [(2,)] * 8


# -- MeshPartitionHelper ---------------------------------------------------------------------


def test_helper_suggestions_and_specs():
    helper = MeshPartitionHelper({"dp": 2, "fsdp": 4, "tp": 2, "sp": 2, "ep": 1})
    tree = {"w": sds(1024, 4096), "b": sds(4096), "odd": sds(3, 5), "again": sds(1024, 4096)}
    assert helper.analyze_pytree(tree) == {
        (4096,): [("fsdp", "sp"), ("fsdp",), ("tp",), ("sp",), ("dp",)],
        (3, 5): [],
        (1024, 4096): [("fsdp", "sp"), ("fsdp",), ("tp",), ("sp",), ("dp",)],
    }
    methods = helper.analyze_pytree(tree)[(1024, 4096)]
    assert helper.create_partition_spec((1024, 4096), methods) == P("tp", ("fsdp", "sp"))
    assert helper.create_partition_spec((16, 16), methods) == P(None, None)  # < min_shard_size
    # ties between equal dimensions go to the first one
    assert helper.create_partition_spec((16, 16), methods, min_shard_size=1) == P(
        ("fsdp", "sp"), "tp"
    )


def test_helper_generic_mesh_and_validity():
    helper = MeshPartitionHelper({"data": 2, "model": 4, "x": 3}, min_shard_size=1)
    assert helper.suggest_methods((6, 8)) == [("model",), ("x",), ("data",)]
    rng = np.random.default_rng(2)
    tree = [sds(*rng.integers(1, 40, rng.integers(0, 4))) for _ in range(100)]
    assert_valid(tree, helper.apply(tree), {"data": 2, "model": 4, "x": 3})
    with pytest.raises(
        ShardingError, match=r"methods naming mesh axis 'tp', which the mesh .* lacks"
    ):
        helper.create_partition_spec((8,), [("tp",)])


def test_helper_auto_shard_pytree(mesh):
    helper = MeshPartitionHelper(mesh)
    tree = {
        "w": jnp.zeros((64, 64)),
        "b": jnp.zeros(64),
        "x": na.named(jnp.zeros((64, 32)), ("a", "b")),
    }
    out = helper.auto_shard_pytree(tree)
    specs = helper.apply(tree)
    assert out["w"].sharding.spec == specs["w"] and out["b"].sharding.spec == P(None)  # 64 < 1024
    assert out["x"].array.sharding.spec == specs["x"] and out["x"].axes == tree["x"].axes
    assert helper.shard_array(jnp.zeros(16), P(mesh.axis_names[0])).sharding.spec == P(
        mesh.axis_names[0]
    )


# -- determinism -----------------------------------------------------------------------------

_SCRIPT = textwrap.dedent(
    """
    import jax
    from jax.sharding import PartitionSpec as P
    import namedaxes as na
    from namedaxes.rules import *
    mesh = {"a": 2, "b": 2, "c": 2, "d": 2, "e": 1}
    tree = {f"w{i}": jax.ShapeDtypeStruct(s, "float32") for i, s in enumerate(
        [(8, 8), (16, 16, 16), (4, 8, 2), (32,), (2, 2, 2, 2), (64, 64)])}
    tree["x"] = na.named(jax.ShapeDtypeStruct((8, 8), "float32"), ("p", "q"))
    rules = [AutoShardingRule(mesh), AutoShardingRule(mesh, reverse=True),
             MemoryConstrainedShardingRule(64, mesh, on_unfit="warn"), MeshPartitionHelper(mesh, 1),
             LogicalAxisRule({"p": ("a", "b"), "q": "c"}, mesh),
             CompositeShardingRule(LogicalAxisRule({"p": "d"}, mesh), AutoShardingRule(mesh))]
    for r in rules:
        print(type(r).__name__, sorted(r.apply(tree).items()))
    print(MeshPartitionHelper(mesh).analyze_pytree(tree))
    """
)


def test_rules_do_not_depend_on_hash_seed():
    outputs = []
    for seed in ("1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "JAX_PLATFORMS": "cpu"}
        proc = subprocess.run(
            [sys.executable, "-c", _SCRIPT],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        )
        assert proc.returncode == 0, proc.stderr
        outputs.append(proc.stdout)
    assert outputs[0] == outputs[1]
    assert "AutoShardingRule" in outputs[0] and "P(" in outputs[0]


def test_path_rule_accepts_axis_rules_and_helper_uses_context_mesh():
    x = na.named(jnp.zeros((8, 3)), ("batch", "embed"))
    relaxed = na.AxisRules({"batch": "data", "embed": "model"}, unsatisfied="replicate")
    assert PathRegexRule([("x", relaxed)], mesh=MESH).apply({"x": x}) == {"x": P("data", None)}
    with jax.set_mesh(jax.make_mesh((8,), ("data",))):
        assert MeshPartitionHelper(min_shard_size=1).apply([sds(16)]) == [P("data")]


# -- pattern rules without a mesh, and mesh typos in unmatched patterns --------------------------


def test_shape_and_path_rules_need_no_mesh():
    tree = {"w": sds(6, 8), "b": sds(7), "x": na.named(sds(4, 8), ("batch", "embed"))}
    shape_rule = ShapeBasedShardingRule({(None, 8): P(None, "model"), (7,): P("data")})
    # no mesh given or set: specs are returned as written (7 is not checked against any size)
    assert shape_rule.apply(tree) == {"w": P(None, "model"), "b": P("data"), "x": P(None, "model")}
    path_rule = PathRegexRule([(r"^w$", P("fsdp")), (r".*", P())])
    assert path_rule.apply(tree) == {"w": P("fsdp"), "b": P(), "x": P()}
    # checks that need no mesh still apply: rank, and a mesh axis used twice
    with pytest.raises(
        ShardingError,
        match=r"PathRegexRule pattern '\^w\$' gives leaf 'w' \(shape \(6, 8\)\) an invalid spec: spec P\('a', 'b', 'c'\) has 3 entries but the array has rank 2",
    ):
        PathRegexRule([(r"^w$", P("a", "b", "c")), (r".*", P())]).apply(tree)
    with pytest.raises(
        ShardingError,
        match=r"Pattern 'w' has an invalid spec: spec P\('data', 'data'\) uses mesh axis 'data' more than once",
    ):
        PathRegexRule([("w", P("data", "data"))])
    with pytest.raises(
        ShardingError,
        match=r"Shape pattern \(None, 8\) has an invalid spec: spec P\(\('a', 'a'\),\) uses mesh axis 'a' more than once",
    ):
        ShapeBasedShardingRule({(None, 8): P(("a", "a"))})
    # a mapping spec needs a mesh to be resolved
    with pytest.raises(
        ShardingError,
        match=r"pattern '\^x\$' gives leaf 'x' the axis mapping \{'batch': 'data'\}, which needs a device mesh to resolve.*Pass mesh=\.\.\. to PathRegexRule",
    ):
        PathRegexRule([(r"^x$", {"batch": "data"}), (r".*", P())]).apply(tree)


def test_shape_and_path_rules_check_against_the_context_mesh(mesh_2x4):
    tree = {"w": sds(6, 8)}
    with jax.set_mesh(mesh_2x4):
        assert ShapeBasedShardingRule({(None, 8): P(None, "model")}).apply(tree) == {
            "w": P(None, "model")
        }
        with pytest.raises(
            ShardingError,
            match=r"leaf 'w'.*dimension 0 of shape \(6, 8\) has size 6, which is not divisible by 4",
        ):
            ShapeBasedShardingRule({(None, 8): P("model")}).apply(tree)
        with pytest.raises(
            ShardingError,
            match=r"PathRegexRule pattern 'nothing' has spec P\('tensor',\), which names mesh axis 'tensor'",
        ):
            PathRegexRule([("nothing", P("tensor")), (".*", P())]).apply(tree)


@pytest.mark.parametrize("given", ["argument", "context"])
def test_mesh_typo_in_a_pattern_that_matches_nothing_raises(given, mesh_2x4):
    tree = {"w": sds(6, 8)}
    shape_patterns = [((None, 8), P()), ((3, 3), P("tensor"))]
    path_patterns = [("^w$", P()), ("^never$", P(None, "modle")), ("^x$", {"batch": "dta"})]
    if given == "argument":
        with pytest.raises(
            ShardingError,
            match=r"ShapeBasedShardingRule shape pattern \(3, 3\) has spec P\('tensor',\), which names mesh axis 'tensor', but Mesh\(data=2, model=4\) has axes 'data', 'model' \(every pattern is checked, whether a leaf matches it or not\)\. Fix the spec's mesh-axis name",
        ):
            ShapeBasedShardingRule(shape_patterns, mesh=mesh_2x4)
        with pytest.raises(
            ShardingError,
            match=r"PathRegexRule pattern '\^never\$' has spec P\(None, 'modle'\), which names mesh axis 'modle'",
        ):
            PathRegexRule(path_patterns, mesh=mesh_2x4)
        with pytest.raises(
            ShardingError,
            match=r"PathRegexRule pattern '\^x\$': The axis mapping names mesh axis 'dta' \(used by logical axis 'batch'\)",
        ):
            PathRegexRule(path_patterns[::2], mesh=mesh_2x4)
    else:
        shape_rule, path_rule = (
            ShapeBasedShardingRule(shape_patterns),
            PathRegexRule(path_patterns[::2]),
        )
        assert shape_rule.apply(tree) == {"w": P()} and path_rule.apply(tree) == {
            "w": P()
        }  # no mesh
        with jax.set_mesh(mesh_2x4):
            with pytest.raises(
                ShardingError,
                match=r"shape pattern \(3, 3\) has spec P\('tensor',\), which names mesh axis 'tensor'",
            ):
                shape_rule.apply(tree)
            with pytest.raises(
                ShardingError, match=r"pattern '\^x\$': The axis mapping names mesh axis 'dta'"
            ):
                path_rule.apply(tree)


def test_composite_refuses_rules_on_different_meshes(axis_type):
    a = make_mesh((2, 4), ("data", "model"), axis_type)
    b = make_mesh((4, 2), ("data", "model"), axis_type)
    with pytest.raises(
        MeshError,
        match=r"CompositeShardingRule combines rules planned on different meshes: rule 0 \(LogicalAxisRule\) uses Mesh\(data=2, model=4\) on devices \[0, 1, 2, 3, 4, 5, 6, 7\] and rule 1 \(AutoShardingRule\) uses Mesh\(data=4, model=2\) on devices .*Give every rule the same mesh",
    ):
        CompositeShardingRule(LogicalAxisRule({"batch": "data"}, a), AutoShardingRule(b))
    with pytest.raises(
        MeshError,
        match=r"rule 0 \(AutoShardingRule\) uses Mesh\(data=2, model=4\) and rule 2 \(AutoShardingRule\) uses Mesh\(data=8\)",
    ):
        CompositeShardingRule(
            AutoShardingRule(MESH), AutoShardingRule(), AutoShardingRule({"data": 8})
        )
    # same devices in another order: shardings would be built on the first mesh only
    c = jax.sharding.Mesh(np.array(jax.devices()[::-1]).reshape(2, 4), ("data", "model"))
    with pytest.raises(MeshError, match=r"on devices \[7, 6, 5, 4, 3, 2, 1, 0\]"):
        CompositeShardingRule(AutoShardingRule(a), AutoShardingRule(c))
    # the same shape as a dict, an abstract mesh or the real mesh plans the same specs: accepted
    rule = CompositeShardingRule(
        AutoShardingRule(a), AutoShardingRule(MESH), AutoShardingRule(a.abstract_mesh)
    )
    assert rule.mesh is a and rule.apply({"w": sds(6, 8)}) == {"w": P("data", "model")}


# -- MeshPartitionHelper.create_partition_spec bad input ------------------------------------------


@pytest.mark.parametrize(
    "shape, methods, error, message",
    [
        (
            (8, 16),
            [("data", "data")],
            ShardingError,
            r"create_partition_spec: method \('data', 'data'\) names mesh axis 'data' more than once; a mesh axis can split a dimension only once\. List it once, e\.g\. \('data',\)",
        ),
        (
            (-8, 16),
            [("data",)],
            ShardingError,
            r"create_partition_spec: shape \(-8, 16\) has negative dimension size -8; sizes must be >= 0",
        ),
        (
            (8.5, 16),
            [("data",)],
            NamedTypeError,
            r"create_partition_spec: shape \(8\.5, 16\) has dimension 8\.5 \(float\); dimension sizes must be ints",
        ),
        (
            "8",
            [("data",)],
            NamedTypeError,
            r"create_partition_spec: shape must be a sequence of ints, got '8'",
        ),
        (
            (8, 16),
            [3],
            NamedTypeError,
            r"create_partition_spec: method 3 must be a mesh axis name or a non-empty tuple of them",
        ),
        (
            (8, 16),
            [()],
            NamedTypeError,
            r"method \(\) must be a mesh axis name or a non-empty tuple",
        ),
        ((8, 16), "tensor", ShardingError, r"methods naming mesh axis 'tensor', which the mesh"),
    ],
)
def test_create_partition_spec_refuses_bad_input(shape, methods, error, message):
    helper = MeshPartitionHelper(MESH)
    with pytest.raises(error, match=message):
        helper.create_partition_spec(shape, methods, min_shard_size=1)


def test_create_partition_spec_string_is_one_name():
    helper = MeshPartitionHelper(MESH)
    # "data" is one mesh axis (not the axes 'd', 'a', 't'), as a method list or as a method
    assert helper.create_partition_spec((8, 16), "data", min_shard_size=1) == P(None, "data")
    assert helper.create_partition_spec((8, 16), ["model", "data"], min_shard_size=1) == P(
        "data", "model"
    )
    assert helper.create_partition_spec(np.array([8, 16]), [("model",)], min_shard_size=1) == P(
        None, "model"
    )
    with pytest.raises(ShardingError, match=r"shape \(-1,\) has negative dimension size -1"):
        helper.suggest_methods((-1,))


def test_rules_read_a_bare_string_as_one_mesh_axis():
    tree = {"w": sds(8, 16)}
    assert AutoShardingRule(MESH, axis_names="data").apply(tree) == {"w": P(None, "data")}
    assert MemoryConstrainedShardingRule(128, MESH, axis_names="model").apply(tree) == {
        "w": P(None, "model")
    }
    with pytest.raises(
        ShardingError,
        match=r"AutoShardingRule was given axis_names 'dat', which the mesh Mesh\(data=2, model=4\) lacks",
    ):
        AutoShardingRule(MESH, axis_names="dat").apply(tree)


def test_path_rule_mapping_resolves_field_declared_arrays_as_pspec_for():
    class Block(eqx.Module):
        w: jax.Array = na.field(axis_names=("embed", "mlp"))
        b: na.NamedArray
        k: jax.Array

    block = Block(jnp.ones((16, 8)), na.named(jnp.zeros(8), "mlp"), jnp.zeros((4, 4)))
    mapping = {"embed": "data", "mlp": "model"}
    rule = PathRegexRule([(r"^(w|b)$", mapping), (r"^k$", P("data"))], mesh=MESH)
    specs = rule.apply(block)
    assert (specs.w, specs.b, specs.k) == (P("data", "model"), P("model"), P("data"))
    expected = na.pspec_for(block, mapping, mesh=MESH)
    assert (specs.w, specs.b) == (expected.w, expected.b)


# -- which mesh a rule plans and places on -------------------------------------------------------


def test_to_shardings_plans_on_the_mesh_given(axis_type):
    m1 = make_mesh((2, 4), ("data", "model"), axis_type)
    m2 = make_mesh((8,), ("x",), axis_type)
    tree = {"w": jnp.zeros((16, 8))}
    # a rule without a mesh plans on the one given, with no context mesh or another one
    out = AutoShardingRule().shard(tree, mesh=m1)
    assert out["w"].sharding == NamedSharding(m1, P("model", "data"))
    assert shard_shapes(out["w"]) == [(4, 4)] * 8
    with jax.set_mesh(m2):
        assert AutoShardingRule().to_shardings(tree, mesh=m1)["w"] == NamedSharding(
            m1, P("model", "data")
        )
    # a rule whose own mesh differs: named, not JAX's "Resource axis" error
    with pytest.raises(
        MeshError,
        match=r"AutoShardingRule\.to_shardings was given the mesh Mesh\(data=2, model=4\) on devices \[0, 1, 2, 3, 4, 5, 6, 7\], but the rule plans on Mesh\(x=8\) on devices \[0, .*\]\. Pass the rule's own mesh \(or none\), or build the rule with mesh=None",
    ):
        AutoShardingRule(m2).to_shardings(tree, mesh=m1)
    with pytest.raises(MeshError, match=r"was given the mesh Mesh\(x=8\).*plans on Mesh\(data=2"):
        AutoShardingRule(MESH).shard(tree, mesh=m2)
    # a rule on a dict of the same shape places on the mesh given, or the context mesh
    assert AutoShardingRule(MESH).to_shardings(tree, mesh=m1)["w"].mesh is m1
    with jax.set_mesh(m1):
        assert AutoShardingRule(MESH).shard(tree)["w"].sharding == NamedSharding(
            m1, P("model", "data")
        )
    with (
        jax.set_mesh(m2),
        pytest.raises(
            MeshError,
            match=r"AutoShardingRule\.to_shardings: the rule plans on Mesh\(data=2, model=4\) \(a \{axis: size\} dict\), but the context mesh is Mesh\(x=8\)",
        ),
    ):
        AutoShardingRule(MESH).to_shardings(tree)


def test_composite_plans_on_one_mesh(axis_type):
    m1 = make_mesh((2, 4), ("data", "model"), axis_type)
    m2 = make_mesh((8,), ("x",), axis_type)
    x = na.named(jnp.zeros((8, 16)), ("batch", "embed"))
    tree = {"x": x, "w": jnp.zeros((16, 8))}
    # a sub-rule without a mesh plans on the other rules' mesh
    rule = CompositeShardingRule(LogicalAxisRule({"batch": "x"}), AutoShardingRule(m2))
    assert rule.mesh is m2
    assert rule.apply(tree) == {"x": P("x", None), "w": P("x", None)}
    out = rule.shard(tree)
    assert out["x"].array.sharding == NamedSharding(m2, P("x", None))
    assert shard_shapes(out["x"].array) == [(1, 16)] * 8
    # ... and a different context mesh, which it would otherwise use, is refused
    with (
        jax.set_mesh(m1),
        pytest.raises(
            MeshError,
            match=r"CompositeShardingRule: rule 0 \(LogicalAxisRule\) has no mesh, so it plans on the other rules' mesh Mesh\(x=8\) on devices .*, but the context mesh is Mesh\(data=2, model=4\) on devices .*\. Give rule 0 its mesh",
        ),
    ):
        rule.apply(tree)
    # agreeing meshes: the most concrete one places (a dict first is no MeshTypeError)
    rule = CompositeShardingRule(
        LogicalAxisRule({"batch": "data"}, MESH),
        AutoShardingRule(m1.abstract_mesh),
        AutoShardingRule(m1),
    )
    assert rule.mesh is m1
    out = rule.shard(tree)
    assert out["x"].array.sharding == NamedSharding(m1, P("data", None))
    assert out["w"].sharding == NamedSharding(m1, P("model", "data"))
    # no sub-rule mesh: the mesh given to shard
    rule = CompositeShardingRule(LogicalAxisRule({"batch": "data"}), AutoShardingRule())
    assert rule.mesh is None
    assert rule.to_shardings(tree, m1)["x"] == NamedSharding(m1, P("data", None))


def test_custom_rule_mapping_into_named_arrays_is_named(mesh_2x4):
    class ShardFirstDim(ShardingRule):
        def apply(self, tree):
            return jax.tree.map(lambda x: P("data"), tree)  # maps into the NamedArray

    tree = {"x": na.named(jnp.zeros((8, 4)), ("batch", "embed")), "w": jnp.zeros(8)}
    message = (
        r"ShardFirstDim\.apply gave leaf 'x' NamedArray\(P, batch=8, embed=4\) \(NamedArray\), "
        r"not a PartitionSpec or None\. It mapped into the NamedArray: a NamedArray is one leaf, "
        r"so pass is_leaf=na\.is_named_array"
    )
    with pytest.raises(NamedTypeError, match=message):
        ShardFirstDim().to_shardings(tree, mesh_2x4)
    with pytest.raises(NamedTypeError, match=message):
        ShardFirstDim().shard(tree, mesh_2x4)
    with pytest.raises(NamedTypeError, match=message):  # not silently dropped by a composite
        CompositeShardingRule(ShardFirstDim(), AutoShardingRule(mesh_2x4)).apply(tree)

    class Documented(ShardingRule):
        def apply(self, tree):
            return jax.tree.map(lambda x: P("data"), tree, is_leaf=na.is_named_array)

    out = Documented().shard(tree, mesh_2x4)
    assert out["x"].array.sharding.spec == P("data") and out["w"].sharding.spec == P("data")
    assert shard_shapes(out["x"].array) == [(4, 4)] * 8

    class Wrong(ShardingRule):
        def apply(self, tree):
            return [P()]

    with pytest.raises(
        na.SpecMismatchError,
        match=r"Wrong\.apply returned a tree whose structure is not the input's",
    ):
        Wrong().to_shardings(tree, mesh_2x4)


def test_shard_on_an_abstract_mesh_outside_jit_is_refused(mesh_2x4):
    abstract = mesh_2x4.abstract_mesh
    tree = {"w": jnp.zeros(16)}
    with pytest.raises(
        ShardingError,
        match=r"AutoShardingRule\.shard was given an AbstractMesh outside jit, but placing arrays needs devices\. Pass the concrete jax\.sharding\.Mesh",
    ):
        AutoShardingRule(abstract).shard(tree)
    with pytest.raises(ShardingError, match=r"shard_array was given an AbstractMesh outside jit"):
        MeshPartitionHelper(abstract).shard_array(jnp.zeros(16), P("model"))
    # abstract leaves take the sharding, and inside jit the abstract mesh is enough
    assert AutoShardingRule(abstract).shard({"w": sds(16)})["w"].sharding.spec == P("model")
    with jax.set_mesh(mesh_2x4):
        out = jax.jit(AutoShardingRule(abstract).shard)(tree)
    assert padded(out["w"].sharding.spec, 1) == P("model")


def test_helper_follows_a_reassigned_mesh():
    helper = MeshPartitionHelper({"data": 8}, min_shard_size=1)
    tree = {"w": sds(16, 4)}
    assert helper.apply(tree) == {"w": P("data", None)}
    helper.mesh = {"model": 4}
    assert helper.axis_sizes == {"model": 4}
    assert helper.apply(tree) == {"w": P("model", None)}


@pytest.mark.parametrize(
    "rule",
    [
        AutoShardingRule(MESH),
        AutoShardingRule(MESH, reverse=True),
        MemoryConstrainedShardingRule(64, MESH),
        MemoryConstrainedShardingRule(192, MESH, scope="device"),
        MeshPartitionHelper(MESH, min_shard_size=1),
    ],
    ids=["auto", "auto-reverse", "memory", "memory-device", "helper"],
)
def test_shape_rules_break_ties_by_axis_name(rule):
    names = ("embed", "mlp", "heads")
    leaves = [na.named(sds(4, 4, 4), order) for order in itertools.permutations(names)]
    placed = [dict(zip(x.axis_names, spec)) for x, spec in zip(leaves, rule.apply(leaves))]
    assert all(p == placed[0] for p in placed)  # the same mesh axes per name, in every order
    assert any(placed[0].values())
    # two leaves of one shape, names swapped (scope="device": the budget needs one mesh axis)
    pair = [na.named(sds(8, 8), ("embed", "mlp")), na.named(sds(8, 8), ("mlp", "embed"))]
    a, b = rule.apply(pair)
    assert dict(zip(pair[0].axis_names, a)) == dict(zip(pair[1].axis_names, b))


def test_plain_arrays_keep_position_ties():
    assert AutoShardingRule(MESH).apply([sds(8, 8)]) == [P("model", "data")]
    assert MemoryConstrainedShardingRule(64, MESH).apply([sds(8, 8)]) == [P("model", None)]
    assert AutoShardingRule(MESH).apply([na.named(sds(8, 8), ("mlp", "embed"))]) == [
        P("data", "model")
    ]


class _EmbedMlp(eqx.Module):
    w: jax.Array = na.field(axis_names=("embed", "mlp"))


class _MlpEmbed(eqx.Module):
    w: jax.Array = na.field(axis_names=("mlp", "embed"))


@pytest.mark.parametrize(
    "rule",
    [
        AutoShardingRule(MESH),
        MemoryConstrainedShardingRule(64, MESH),
        MemoryConstrainedShardingRule(600, MESH, scope="device"),
        MeshPartitionHelper(MESH, min_shard_size=1),
    ],
    ids=["auto", "memory", "memory-device", "helper"],
)
def test_shape_rules_break_ties_by_field_axis_names(rule):
    # field(axis_names=...) arrays are named like NamedArrays: equal sizes tie by name, not position
    a, b = _EmbedMlp(sds(8, 8)), _MlpEmbed(sds(8, 8))
    specs = rule.apply({"a": a, "b": b, "n": na.named(sds(8, 8), ("embed", "mlp"))})
    by_a = dict(zip(("embed", "mlp"), specs["a"].w))
    assert (
        by_a == dict(zip(("mlp", "embed"), specs["b"].w)) == dict(zip(("embed", "mlp"), specs["n"]))
    )
    assert any(by_a.values())


def test_auto_rule_places_field_arrays_by_name(mesh_2x4):
    tree = {"a": _EmbedMlp(jnp.ones((8, 8))), "b": _MlpEmbed(jnp.ones((8, 8)))}
    out = AutoShardingRule().shard(tree, mesh_2x4)
    assert out["a"].w.sharding.spec == P("model", "data")  # embed -> model, mlp -> data
    assert out["b"].w.sharding.spec == P("data", "model")
    assert shard_shapes(out["b"].w) == [(4, 2)] * 8


class _Const(ShardingRule):
    def __init__(self, spec):
        self.spec = spec

    def apply(self, tree):
        return jax.tree.map(lambda _: self.spec, tree, is_leaf=na.is_named_array)


@pytest.mark.parametrize(
    "spec, problem",
    [
        (P("dta"), r"names mesh axis 'dta', which is not in the mesh .*Available mesh axes"),
        (P("data"), r"dimension 0 of shape \(3, 8\) has size 3, which is not divisible by 2"),
        (P(None, None, "model"), r"has 3 entries but the array has rank 2"),
        (P(None, ("model", "model")), r"'model' more than once"),
    ],
    ids=["unknown", "indivisible", "rank", "repeated"],
)
def test_custom_rule_invalid_specs_are_named_before_jax(mesh_2x4, spec, problem):
    # The same typed error on Auto and Explicit meshes, naming the rule, the leaf and its shape.
    tree = {"w": jnp.ones((3, 8))}
    message = (
        r"_Const\.apply on Mesh\(data=2, model=4\) gives leaf 'w' \(shape \(3, 8\)\) an invalid spec: .*"
        + problem
    )
    with pytest.raises(ShardingError, match=message):
        _Const(spec).to_shardings(tree, mesh_2x4)
    with pytest.raises(ShardingError, match=message):
        _Const(spec).shard(tree, mesh_2x4)


def test_helper_shard_array_checks_the_spec(mesh_2x4):
    helper = MeshPartitionHelper(mesh_2x4)
    with pytest.raises(
        ShardingError,
        match=r"shard_array: spec P\('data',\) does not fit the array of shape \(3,\) on "
        r"Mesh\(data=2, model=4\): dimension 0 of shape \(3,\) has size 3, which is not divisible",
    ):
        helper.shard_array(jnp.ones(3), P("data"))
    with pytest.raises(ShardingError, match=r"names mesh axis 'dta', which is not in the mesh"):
        helper.shard_array(jnp.ones(4), P("dta"))
    with pytest.raises(ShardingError, match=r"has 2 entries but the array has rank 1"):
        helper.shard_array(jnp.ones(4), P("data", "model"))
    with pytest.raises(
        NamedTypeError,
        match=r"spec must be a PartitionSpec \(or None\), got 'data' \(str\)\. Build one, e\.g\. "
        r"PartitionSpec\('data'\)\.",
    ):
        helper.shard_array(jnp.ones(4), "data")
    with pytest.raises(
        NamedTypeError, match=r"places one array or NamedArray, got dict\. For a pytree"
    ):
        helper.shard_array({"a": jnp.ones(4)}, P("data"))
    out = helper.shard_array(na.named(jnp.ones((4, 8)), ("a", "b")), P("data", "model"))
    assert out.array.sharding.spec == P("data", "model")
    assert shard_shapes(out.array) == [(2, 2)] * 8
    assert helper.shard_array(jnp.ones(4), None).sharding.spec == P()


def test_shape_pattern_with_a_negative_size_is_refused():
    with pytest.raises(
        ShardingError,
        match=r"Shape pattern \(-8, 4\) has negative size -8, which no array has\. Give the "
        r"dimension's size \(>= 0\), or None to match any size\.",
    ):
        ShapeBasedShardingRule([((-8, 4), P("data"))])


def test_strict_path_rule_allows_patterns_for_modules_a_tree_lacks():
    """strict refuses leaves no pattern matches, never patterns no leaf matches: a rule set
    carries patterns for optional modules (an lm_head a tied model lacks, biases) and is applied
    to subtrees."""
    rules = [
        (r"embed/kernel", P("model", None)),
        (r"lm_head/kernel", P(None, "model")),
        (r"bias", P()),
        (r".*", P()),
    ]
    tree = {"embed": {"kernel": sds(16, 8)}, "layer0": {"w": sds(8, 8)}}
    assert PathRegexRule(rules, mesh=MESH).apply(tree) == {
        "embed": {"kernel": P("model", None)},
        "layer0": {"w": P()},
    }
    with pytest.raises(ShardingError, match=r"layer0/w"):  # a leaf no pattern matches still is
        PathRegexRule(rules[:3], mesh=MESH).apply(tree)
