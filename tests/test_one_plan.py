"""Every entry point that turns names into placements agrees with ``resolve``, leaf by leaf.

``pspec_for``, ``infer_resource_partitions``, ``shard``, ``named_jit``, ``fsdp``,
``LogicalAxisRule``, ``memory_report``, ``analysis.plan``, ``visualize_sharding`` and checkpoint
restore all read a tree through one walk and one plan, so on the same tree (NamedArrays,
field-declared plain arrays, ``eval_shape`` trees, already-placed plain arrays, mixed) they give the
same spec per leaf, on Auto and Explicit meshes.
"""

import io

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import spec_of
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import namedaxes as na

RULES = na.AxisRules(
    [("embed", "model"), ("batch", "model"), ("batch", "data"), ("mlp", "model"), ("mlp", "data")]
)


class Block(eqx.Module):
    w: jax.Array = na.field(axis_names=("embed", "mlp"))
    b: na.NamedArray
    scale: float = 1.0


def _trees(mesh):
    x = na.named(jnp.arange(8 * 16, dtype=jnp.float32).reshape(8, 16), ("batch", "embed"))
    xt = na.rearrange(x, ("embed", "batch"))
    block = Block(jnp.ones((16, 8)), na.named(jnp.zeros(8), "mlp"))
    placed = jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, P("data")))
    abstract = jax.eval_shape(lambda: {"x": x, "block": block})
    return {
        "named": {"x": x, "xt": xt},
        "field": block,
        "abstract": abstract,
        "placed_plain": {"p": placed},
        "mixed": {"x": x, "block": block, "p": placed, "n": 3},
    }


def _expected(leaf_axes):
    return lambda mesh: na.resolve(leaf_axes, RULES, mesh)


@pytest.mark.parametrize("kind", ["named", "field", "abstract", "placed_plain", "mixed"])
def test_entry_points_agree_leaf_by_leaf(mesh_2x4, kind):
    mesh = mesh_2x4
    tree = _trees(mesh)[kind]
    specs = na.pspec_for(tree, RULES, mesh=mesh)
    spec_leaves, spec_def = jax.tree_util.tree_flatten(
        specs, is_leaf=lambda s: isinstance(s, P) or s is None
    )

    # The reference: resolve on each leaf's axes (NamedArrays and field-declared arrays), the
    # current spec of placed plain arrays, P() for scalars.
    def reference(node):
        if isinstance(node, na.NamedArray):
            return na.resolve(node.axes, RULES, mesh)
        if isinstance(node, Block):
            return Block(
                na.resolve((na.Axis("embed", 16), na.Axis("mlp", 8)), RULES, mesh),
                na.resolve(node.b.axes, RULES, mesh),
                P(),
            )
        if isinstance(node, (int, float)):
            return P()
        sharding = getattr(node, "sharding", None)
        return sharding.spec if isinstance(sharding, NamedSharding) else None

    expected = jax.tree_util.tree_map(
        reference, tree, is_leaf=lambda n: isinstance(n, (na.NamedArray, Block))
    )
    assert specs == expected

    # LogicalAxisRule: the same specs for every array leaf (rules give None for Python scalars,
    # which are not arrays; pspec_for gives them P() so the result is a jit sharding prefix).
    nodes = jax.tree_util.tree_leaves(tree, is_leaf=lambda n: isinstance(n, na.NamedArray))
    array_specs = [s for n, s in zip(nodes, spec_leaves) if not isinstance(n, (int, float))]
    rule_specs = na.rules.LogicalAxisRule(RULES, mesh).apply(tree)
    assert jax.tree_util.tree_leaves(rule_specs) == array_specs

    # memory_report: every leaf listed with the same spec.
    report = na.analysis.memory_report(tree, RULES, mesh, top=100)
    listed = {row["path"]: row["spec"] for row in report.largest}
    flat_rule = jax.tree_util.tree_flatten_with_path(
        rule_specs, is_leaf=lambda s: isinstance(s, P)
    )[0]
    assert sorted(listed.values()) == sorted(str(s) for _, s in flat_rule if isinstance(s, P))

    # analysis.plan and visualize_sharding show the same specs.
    planned = na.analysis.plan(tree, mesh, RULES, top=100)
    assert {g["spec"] for g in planned.largest} == {
        str(s) for _, s in flat_rule if isinstance(s, P)
    }
    shown = io.StringIO()
    na.analysis.visualize_sharding(tree, RULES, mesh, file=shown)
    for _, s in flat_rule:
        assert str(s) in shown.getvalue()

    if kind == "abstract":
        return
    # shard, and named_jit's and fsdp's outputs, place each leaf as planned.
    with jax.set_mesh(mesh):
        placed = na.shard(tree, RULES)
        out = na.named_jit(lambda t: t, axis_resources=RULES)(tree)
        fsdp_out = na.fsdp(lambda t, n: t, RULES, RULES)(tree, 0)
    want = dict(
        jax.tree_util.tree_flatten_with_path(
            specs, is_leaf=lambda s: isinstance(s, P) or s is None
        )[0]
    )
    for result in (placed, out, fsdp_out):
        for path, node in jax.tree_util.tree_flatten_with_path(
            result, is_leaf=lambda n: isinstance(n, na.NamedArray)
        )[0]:
            if isinstance(node, (int, float)):
                continue
            assert spec_of_entries(spec_of(node)) == spec_of_entries(want[path]), path


def spec_of_entries(spec):
    entries = list(spec)
    while entries and entries[-1] is None:
        entries.pop()
    return tuple(entries)


def test_transpose_does_not_change_placement(mesh_2x4):
    """The issue's case: (batch, embed) and its transpose shard the same way, by name."""
    x = na.named(jnp.zeros((8, 16)), ("batch", "embed"))
    with jax.set_mesh(mesh_2x4):
        a = na.shard(x, RULES)
        b = na.shard(na.rearrange(x, ("embed", "batch")), RULES)
    assert spec_of(a) == P("data", "model") and spec_of(b) == P("model", "data")
    np.testing.assert_array_equal(np.asarray(a.array), np.asarray(b.array).T)


def test_field_declared_leaf_counts_as_sharded_in_memory_report():
    """memory_report once listed a field-declared (embed, mlp) array as replicated."""
    block = Block(jnp.ones((8, 16)), na.named(jnp.zeros(16), "mlp"))
    report = na.analysis.memory_report(block, {"mlp": "model"}, {"data": 2, "model": 4}, top=5)
    row = next(r for r in report.largest if r["path"] == "w")
    assert row["spec"] == str(P(None, "model")) and row["bytes_per_device"] == 8 * 16 * 4 // 4
    assert "w" not in report.replicated_leaves


def test_no_mapping_is_an_error_for_every_planner():
    tree = {"x": na.named(jax.ShapeDtypeStruct((8, 4), jnp.float32), ("batch", "embed"))}
    mesh = {"data": 2}
    for call, name in [
        (lambda: na.pspec_for(tree, mesh=mesh), "pspec_for"),
        (lambda: na.analysis.memory_report(tree, None, mesh), "memory_report"),
        (lambda: na.rules.LogicalAxisRule(None, mesh).apply(tree), r"LogicalAxisRule\.apply"),
    ]:
        with pytest.raises(
            na.ShardingError, match=rf"{name}\(\) got no mapping and no axis_mapping is in force"
        ):
            call()


def test_rule_objects_validate_on_construction():
    with pytest.raises(
        na.ShardingError, match=r"unsatisfied must be one of 'error', 'replicate', got 'bogus'"
    ):
        na.rules.LogicalAxisRule({"batch": "data"}, unsatisfied="bogus")
    with pytest.raises(na.MappingTypeError, match=r"Logical axis 'batch' is mapped to 3"):
        na.rules.LogicalAxisRule({"batch": 3})


def test_rules_as_pairs_everywhere(mesh_2x4):
    pairs = [("batch", "data"), ("embed", "model")]
    x = na.named(jnp.zeros((8, 16)), ("batch", "embed"))
    with jax.set_mesh(mesh_2x4):
        assert spec_of(na.shard(x, pairs)) == P("data", "model")
        with na.axis_mapping(pairs):
            assert spec_of(na.shard(x)) == P("data", "model")
            assert spec_of(na.named_jit(lambda t: t)(x)) == P("data", "model")
        assert na.pspec_for(x, tuple(pairs)) == P("data", "model")
    assert (
        na.analysis.memory_report(x, pairs, {"data": 2, "model": 4}).bytes_per_device
        == 8 * 16 * 4 // 8
    )


def test_every_permutation_shards_by_name(mesh_2x4):
    """Property: on Auto and Explicit meshes, permuting an array's axes permutes the
    placed spec, and pspec_for/shard agree with resolve for each permutation."""
    import itertools

    rules = na.AxisRules(
        [("embed", "model"), ("batch", "model"), ("batch", "data"), ("mlp", "data"), ("mlp", None)]
    )
    x = na.named(
        jnp.arange(8 * 4 * 6, dtype=jnp.float32).reshape(8, 4, 6), ("batch", "embed", "mlp")
    )
    base = dict(zip(x.axis_names, na.resolve(x.axes, rules, mesh_2x4)))
    with jax.set_mesh(mesh_2x4):
        for perm in itertools.permutations(x.axis_names):
            y = na.rearrange(x, perm)
            placed = na.shard(y, rules)
            want = P(*(base[n] for n in perm))
            assert spec_of_entries(placed.array.sharding.spec) == spec_of_entries(want)
            assert na.pspec_for(y, rules) == want


# -- mapping entries that match no axis ------------------------------------------------------------

# Grouped-query attention: the queries have kv_heads x q_per_kv heads, so a mapping written for
# a `heads` axis matches nothing, and the weights stay replicated.
GQA_MAPPING = {"embed": "data", "heads": "model", "mlp": "model"}
UNMATCHED_LINE = "mapping entries that match no axis: 'heads' -> 'model' (did you mean 'kv_heads'?)"


def _gqa_tree():
    q = na.named(jnp.zeros((8, 4, 2, 4)), ("embed", "kv_heads", "q_per_kv", "head_dim"))
    return {"q": q, "mlp": Block(jnp.ones((8, 8)), na.named(jnp.zeros(8), "mlp"))}


def test_unmatched_mapping_entries_are_listed_by_every_planner(mesh_2x4):
    """A mapping entry that matched nothing was silent: plan, memory_report and visualize_sharding
    now list it, the same way (one plan decides it)."""
    import io

    tree = _gqa_tree()
    planned = na.analysis.plan(tree, mesh_2x4, GQA_MAPPING)
    report = na.analysis.memory_report(tree, GQA_MAPPING, mesh_2x4)
    shown = io.StringIO()
    na.analysis.visualize_sharding(tree, GQA_MAPPING, mesh_2x4, file=shown)
    assert planned.unmatched == report.unmatched == (("heads", "model"),)
    assert planned.to_dict()["unmatched"] == [["heads", "model"]]
    for text in (str(planned), str(report), shown.getvalue()):
        assert text.rstrip().splitlines()[-1].strip() == UNMATCHED_LINE
    # the placement itself is unchanged: the query weight is split over embed only
    assert na.pspec_for(tree, GQA_MAPPING, mesh=mesh_2x4)["q"] == P("data", None, None, None)
    # with the entry renamed to an axis the tree has, nothing is listed
    matched = {**GQA_MAPPING, "kv_heads": "model"}
    del matched["heads"]
    assert na.analysis.plan(tree, mesh_2x4, matched).unmatched == ()
    assert "match no axis" not in str(na.analysis.memory_report(tree, matched, mesh_2x4))
    shown = io.StringIO()
    na.analysis.visualize_sharding(tree, matched, mesh_2x4, file=shown)
    assert "match no axis" not in shown.getvalue()


def test_strict_refuses_unmatched_entries_in_shard_named_jit_and_fsdp(mesh_2x4):
    tree = _gqa_tree()
    axes = "'embed', 'head_dim', 'kv_heads', 'mlp', 'q_per_kv'"
    with pytest.raises(
        na.UnmatchedMappingError,
        match=rf"^shard\(strict=True\): the mapping entry 'heads' -> 'model' \(did you mean "
        rf"'kv_heads'\?\) matches no axis of the tree, whose axes are {axes}\. Map axes the tree has \(or drop the entry\), or "
        r"pass strict=False to place the tree anyway\.$",
    ):
        na.shard(tree, GQA_MAPPING, mesh_2x4, strict=True)
    placed = na.shard(tree, GQA_MAPPING, mesh_2x4)  # not strict: placed, entry ignored
    assert spec_of(placed["q"]) == P("data")
    matched = {"embed": "data", "kv_heads": "model", "mlp": "model"}
    assert spec_of(na.shard(tree, matched, mesh_2x4, strict=True)["q"]) == P("data", "model")

    def forward(t, x):
        return na.dot(x, t["q"], axis="embed")

    x = na.shard(na.named(jnp.ones((4, 8)), ("batch", "embed")), {"batch": "data"}, mesh_2x4)
    strict_jit = na.named_jit(forward, strict=True)
    with jax.set_mesh(mesh_2x4):
        with na.axis_mapping({**GQA_MAPPING, "batch": "data"}):
            with pytest.raises(
                na.UnmatchedMappingError,
                match=r"^named_jit\(strict=True\): the mapping entry 'heads' -> 'model' \(did "
                r"you mean 'kv_heads'\?\) matches no axis of the arguments and outputs, whose axes are 'batch', 'embed', ",
            ):
                strict_jit(placed, x)
        with na.axis_mapping({**matched, "batch": "data"}):
            assert strict_jit(placed, x).axis_names == ("batch", "kv_heads", "q_per_kv", "head_dim")

        def step(params, x):
            return params, forward(params, x)

        # fsdp: the parameter mapping against the parameters, the compute mapping against all
        bad_params = na.fsdp(step, GQA_MAPPING, {"batch": "data"}, strict=True)
        with pytest.raises(
            na.UnmatchedMappingError,
            match=r"^fsdp\(strict=True\): the mapping entry 'heads' -> 'model' \(did you mean "
            rf"'kv_heads'\?\) matches no axis of the parameters \(the first argument\), whose axes are {axes}\.",
        ):
            bad_params(placed, x)
        bad_compute = na.fsdp(step, matched, {"batch": "data", "tokens": "data"}, strict=True)
        with pytest.raises(
            na.UnmatchedMappingError,
            match=r"^fsdp\(strict=True\): the mapping entry 'tokens' -> 'data' matches no axis "
            r"of the arguments and outputs, whose axes are 'batch', ",
        ):
            bad_compute(placed, x)
        good = na.fsdp(step, matched, {"batch": "data"}, strict=True)
        params, out = good(placed, x)
    assert spec_of(params["q"]) == P("data", "model") and spec_of(out) == P("data")


def test_checkpoint_restore_places_by_the_plan(tmp_path, mesh_2x4):
    """Restore reads each NamedArray straight into the sharding the plan gives it (here under
    another mapping than it was saved with)."""
    checkpoint = pytest.importorskip("namedaxes.checkpoint")
    tree = _trees(mesh_2x4)["named"]
    checkpoint.save(tmp_path / "c", na.shard(tree, {"batch": "data"}, mesh_2x4))
    with jax.set_mesh(mesh_2x4):
        restored = checkpoint.restore(tmp_path / "c", tree, mapping=RULES)
    specs = na.pspec_for(tree, RULES, mesh=mesh_2x4)
    for name, x in restored.items():
        assert spec_of_entries(spec_of(x)) == spec_of_entries(specs[name]), name
        np.testing.assert_array_equal(np.asarray(x.array), np.asarray(tree[name].array))


def test_a_plan_on_a_mesh_mapping_sizes_but_does_not_place():
    """A tree planned on an {axis: size} mapping has specs (for sizes and memory plans), and
    asking it for shardings is a typed error that says what to plan on instead."""
    from namedaxes._partitioning._plan import plan_tree

    tree = {"x": na.named(jnp.zeros((4, 2)), ("batch", "embed"))}
    planned = plan_tree(tree, na.AxisRules({"batch": "data"}), {"data": 2}, caller="test")
    assert planned.specs == [P("data", None)]
    for ask in (lambda: planned.targets, lambda: planned.target(0)):
        with pytest.raises(na.MeshError, match=r"planned on \{'data': 2\}, which can size shards"):
            ask()


def test_placement_errors_name_the_leaf_path(mesh_2x4):
    """In a large tree the path is how to find the leaf: every entry point says which one."""
    tree = {
        "layers": [
            {"w": na.named(jnp.ones((8, 4)), ("embed", "mlp"))},
            {"w": na.named(jnp.ones((6, 4)), ("embed", "mlp"))},
        ]
    }
    rules = {"embed": "model"}
    calls = {
        "shard": lambda: na.shard(tree, rules, mesh_2x4),
        "pspec_for": lambda: na.pspec_for(tree, rules, mesh=mesh_2x4),
        "named_jit": lambda: na.named_jit(lambda t: t, axis_resources=rules)(tree),
        "LogicalAxisRule": lambda: na.rules.LogicalAxisRule(rules, mesh_2x4).apply(tree),
    }
    for call in calls.values():
        with jax.set_mesh(mesh_2x4):
            with pytest.raises(
                na.ShardingError,
                match=r"At leaf 'layers/1/w': Cannot shard axis 'embed' \(size 6\)",
            ):
                call()


def test_a_field_declaration_must_match_a_named_arrays_own_names(mesh_2x4):
    """A NamedArray carries its names: a field(axis_names=...) naming others is an error, not a
    silent override; the same names in another order are the array's own."""

    class Declared(eqx.Module):
        w: na.NamedArray = na.field(axis_names=("vocab", "hidden"))

    wrong = Declared(na.named(jnp.ones((8, 4)), ("embed", "mlp")))
    with pytest.raises(
        na.AxisError,
        match=r"Field Declared.w is declared with axis_names \('vocab', 'hidden'\) but holds a NamedArray with axes \('embed', 'mlp'\)",
    ):
        na.pspec_for(wrong, {"embed": "data", "vocab": "model"}, mesh=mesh_2x4)
    same = Declared(na.named(jnp.ones((4, 8)), ("hidden", "vocab")))
    assert na.pspec_for(same, {"vocab": "data"}, mesh=mesh_2x4).w == P(None, "data")
