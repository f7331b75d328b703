"""Regression tests: the known defects of Haliax, eformer and loadax are not repeated here.

Each test is named after one defect listed in ``shared/seeds/README.md`` and quotes it in its
docstring. Defects already pinned down elsewhere are not tested twice:

- rule specs vary with ``PYTHONHASHSEED``: ``test_rules.py::test_rules_do_not_depend_on_hash_seed``;
- ``MemoryConstrainedShardingRule`` never checks the fit:
  ``test_rules.py::test_memory_rule_unfit_error_and_warning`` and
  ``test_rules.py::test_memory_rule_fits_whenever_any_valid_spec_fits``;
- plain-array outputs forced replicated:
  ``test_named_jit.py::test_outputs_placed_by_mapping_and_plain_outputs_keep_sharding``;
- ``axis_mapping(merge=True)`` lets the outer mapping win:
  ``test_axis_mapping.py::test_merge_inner_wins``;
- context leaks out of suspended generators / across threads:
  ``test_axis_mapping.py::test_suspended_generator_does_not_leak``, ``test_threads_are_isolated``.

The tests below cover what those leave open: the user-visible consequence through ``named_jit``,
both mesh axis types, and XLA's own figures. The last section holds gaps found while auditing the
issues against the code.
"""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import sds, shard_shapes, spec_of
from _meshes import make_mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import namedaxes as na


def data():
    return na.named(jnp.arange(8 * 4, dtype=jnp.float32).reshape(8, 4), ("batch", "embed"))


# -- eformer: rules and analysis --------------------------------------------------------------


def test_rules_and_analyzer_work_with_the_context_mesh(axis_type):
    """eformer: "`np.prod(mesh.shape)` is a dict on current JAX, so `AutoShardingRule()` and
    `estimate_memory_usage` raise `TypeError`"."""
    mesh = make_mesh((2, 4), ("data", "model"), axis_type)
    tree = {"w": sds(6, 8), "b": sds(8), "x": na.named(sds(8, 4), ("batch", "embed"))}
    specs = {"w": P("data", "model"), "b": P(), "x": P("data")}
    with jax.set_mesh(mesh):
        # 8 takes model=4, then 6 takes data=2; the named leaf is treated by its shape too.
        assert na.rules.AutoShardingRule().apply(tree) == {
            "w": P("data", "model"),
            "b": P("model"),
            "x": P("model", "data"),
        }
        assert na.rules.MemoryConstrainedShardingRule(64).apply(tree) == {
            "w": P(None, "model"),  # 192 B -> 48 B: model=4 on the 8 is enough
            "b": P(None),  # 32 B already fits
            "x": P("model", None),  # 128 B -> 32 B
        }
        usage = na.analysis.ShardingAnalyzer().estimate_memory_usage(tree, specs)
        report = na.analysis.memory_report(tree, {"batch": "data"})
        placed = na.rules.AutoShardingRule().shard({"w": jnp.ones((6, 8))})
    assert usage["size_per_device"] == 6 * 8 * 4 // 8 + 8 * 4 + 8 * 4 * 4 // 2 == 120
    assert usage["per_device"] == [120] * 8
    assert report.bytes_per_device == 120 - 6 * 8 * 4 // 8 + 6 * 8 * 4  # plain "w" replicated
    assert spec_of(placed["w"]) == P("data", "model") and shard_shapes(placed["w"]) == [(3, 2)]


def test_estimate_memory_counts_replicated_in_full_and_divides_once(axis_type):
    """eformer: "`estimate_memory_usage` divides by the device count twice and undercounts
    replicated arrays"."""
    mesh = make_mesh((2, 4), ("data", "model"), axis_type)
    tree = {
        "rep": sds(16, 8),  # 512 B, replicated: 512 B on every device
        "flat": sds(64, 8),  # 2048 B over both axes on one dim: 256 B
        "both": sds(8, 16),  # 512 B over data x model: 64 B
        "part": sds(8, 4),  # 128 B over model only (replicated over data): 32 B
        "x": na.named(sds(8, 4, dtype="bfloat16"), ("batch", "embed")),  # 64 B over data: 32 B
    }
    specs = {
        "rep": P(),
        "flat": P(("data", "model")),
        "both": P("data", "model"),
        "part": P("model"),
        "x": P("data"),
    }
    usage = na.analysis.ShardingAnalyzer(mesh).estimate_memory_usage(tree, specs)
    hand = 512 + 2048 // 8 + 512 // 8 + 128 // 4 + 64 // 2
    assert usage["size_per_device"] == hand == 896
    assert usage["per_device"] == [hand] * 8
    assert usage["total_size"] == 512 + 2048 + 512 + 128 + 64
    assert usage["replicated_bytes"] == 512
    assert usage["leaves"]["rep"]["bytes_per_device"] == 512

    # XLA's own figure for a jitted function taking this tree with these shardings.
    arrays = {k: v.array if isinstance(v, na.NamedArray) else v for k, v in tree.items()}
    shardings = {k: NamedSharding(mesh, s) for k, s in specs.items()}
    fn = jax.jit(lambda t: jax.tree.map(lambda a: a * 2, t), in_shardings=(shardings,))
    xla = fn.lower(arrays).compile().memory_analysis().argument_size_in_bytes
    assert usage["size_per_device"] == xla


# -- Haliax: named_jit ------------------------------------------------------------------------


def test_named_jit_no_stale_program_when_only_the_mapping_changes(axis_type):
    """Haliax: "`named_jit` reuses a stale compiled program when only the context mapping
    changes"."""
    mesh = make_mesh((2, 4), ("data", "model"), axis_type)
    traces = []

    @na.named_jit
    def f(x):
        traces.append(na.current_axis_mapping())
        return na.named(x.array * 2, x.axes)

    x = data()
    with jax.set_mesh(mesh):
        with na.axis_mapping({"batch": "data"}):
            sharded = f(x)
        with na.axis_mapping({"batch": None}):
            replicated = f(x)
        with na.axis_mapping({"batch": "data"}):
            again = f(x)  # the first program, from the cache
    assert traces == [{"batch": "data"}, {"batch": None}]
    assert spec_of(sharded) == P("data") and shard_shapes(sharded) == [(4, 4)]
    assert spec_of(replicated) == P() and shard_shapes(replicated) == [(8, 4)]
    assert spec_of(again) == P("data")
    for out in (sharded, replicated, again):
        np.testing.assert_array_equal(np.asarray(out.array), np.asarray(x.array) * 2)


def test_named_jit_merged_mapping_is_a_new_signature(axis_type):
    """Haliax: "`axis_mapping(merge=True)` lets the *outer* mapping win" (seen through
    ``named_jit``: the merged mapping, inner entries first, places the outputs)."""
    mesh = make_mesh((2, 4), ("data", "model"), axis_type)
    traces = []

    @na.named_jit
    def f(x):
        traces.append(na.current_axis_mapping())
        return na.named(x.array + 1, x.axes)

    with jax.set_mesh(mesh), na.axis_mapping({"batch": "data", "embed": "model"}):
        outer = f(data())
        with na.axis_mapping({"batch": None}, merge=True):
            inner = f(data())
    assert spec_of(outer) == P("data", "model")
    assert spec_of(inner) == P(None, "model")
    assert traces == [{"batch": "data", "embed": "model"}, {"batch": None, "embed": "model"}]


def test_named_jit_traces_each_distinct_call_once(axis_type):
    """Haliax: "traces every function twice"; here one trace per distinct call signature, also
    with in/out resources, keyword arguments and after ``.lower``."""
    mesh = make_mesh((2, 4), ("data", "model"), axis_type)
    traces = []

    def body(x, scale=1.0):
        traces.append(x.shape)
        return na.named(x.array * scale, x.axes)

    plain = na.named_jit(body)
    placed = na.named_jit(
        body, in_axis_resources={"batch": "data"}, out_axis_resources={"batch": "model"}
    )
    x = data()
    with jax.set_mesh(mesh), na.axis_mapping(batch="data"):
        plain.lower(x)
        plain(x)
        plain(x)
        assert len(traces) == 1
        plain(x, scale=3.0)  # a static keyword: a new signature
        plain(x, scale=3.0)
        assert len(traces) == 2
        out = placed(x)
        placed(x)
        placed.lower(x)
        assert len(traces) == 3
        wider = na.named(jnp.ones((8, 8)), ("batch", "embed"))
        placed(wider)  # a new shape
        placed(wider)
    assert traces == [{"batch": 8, "embed": 4}] * 3 + [{"batch": 8, "embed": 8}]
    assert spec_of(out) == P("model") and shard_shapes(out) == [(2, 4)]


def test_named_jit_moves_arguments_committed_elsewhere(axis_type):
    """Haliax: "fails on already-committed arguments when `in_axis_resources` is given" (here:
    committed to one device, and to another mesh)."""
    mesh = make_mesh((2, 4), ("data", "model"), axis_type)
    seen = []

    def body(x):
        seen.append(jax.typeof(x.array).sharding.spec)
        return na.named(x.array - 1, x.axes)

    resources = {"batch": "data"}
    f = na.named_jit(body, in_axis_resources=resources, out_axis_resources=resources)
    x = data()
    on_one_device = na.named(jax.device_put(x.array, jax.devices()[5]), x.axes)
    on_other_mesh = na.shard(x, {"embed": "data"}, make_mesh((4,), ("data",), axis_type))
    with jax.set_mesh(mesh):
        outs = [f(on_one_device), f(on_other_mesh)]
    for out in outs:
        assert spec_of(out) == P("data") and shard_shapes(out) == [(4, 4)]
        assert out.array.sharding.mesh.shape == mesh.shape
        np.testing.assert_array_equal(np.asarray(out.array), np.asarray(x.array) - 1)
    if axis_type == jax.sharding.AxisType.Explicit:
        assert set(seen) == {P("data", None)}  # the traced input already had the new placement


def test_named_jit_context_isolated_across_threads(axis_type):
    """Haliax: "its thread-local context leaks" (seen through ``named_jit``: threads calling one
    function at once under different mappings or meshes each get their own placement)."""
    meshes = {s: make_mesh(s, ("data", "model"), axis_type) for s in ((2, 4), (4, 2))}
    f = na.named_jit(lambda x: na.named(x.array * 2, x.axes))
    jobs = [("data", (2, 4)), ("model", (2, 4)), ("data", (4, 2))]
    barrier = threading.Barrier(len(jobs), timeout=60)
    results, errors = {}, []

    def worker(i, mesh_axis, shape):
        try:
            with jax.set_mesh(meshes[shape]), na.axis_mapping(batch=mesh_axis):
                barrier.wait()  # every thread inside its blocks at once
                out = f(data())
                barrier.wait()
                results[i] = (spec_of(out), shard_shapes(out), na.current_axis_mapping())
        except Exception as e:  # surfaced in the main thread below
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(i, *job)) for i, job in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert results == {
        0: (P("data"), [(4, 4)], {"batch": "data"}),
        1: (P("model"), [(2, 4)], {"batch": "model"}),
        2: (P("data"), [(2, 4)], {"batch": "data"}),  # data=4 on the (4, 2) mesh
    }
    assert na.current_axis_mapping() is None


def test_named_jit_not_affected_by_a_suspended_generator(axis_type):
    """Haliax: "its thread-local context leaks out of suspended generators" (seen through
    ``named_jit``: the caller's mapping places the outputs)."""
    mesh = make_mesh((2, 4), ("data", "model"), axis_type)
    f = na.named_jit(lambda x: na.named(x.array * 2, x.axes))

    def batches():
        with na.axis_mapping(batch="model"):
            while True:
                yield f(data())

    with jax.set_mesh(mesh), na.axis_mapping(batch="data"):
        gen = batches()
        inside = next(gen)
        outside = f(data())
        inside_again = next(gen)
        gen.close()
    assert spec_of(inside) == P("model") and spec_of(inside_again) == P("model")
    assert spec_of(outside) == P("data")


# -- gaps found in the audit: behaviour that exists but was untested -----------------------------


def test_memory_rule_axis_names_restricts_and_checks_mesh_axes():
    """`MemoryConstrainedShardingRule(max_memory_per_device, mesh=None,
    axis_names=None)`: only the named mesh axes are used, and they must exist."""
    mesh = {"data": 2, "model": 4}
    tree = {"w": sds(8, 6)}  # 192 B
    # Only 'data' may be used: 96 B per device is the best, so a 100 B budget fits with data alone.
    rule = na.rules.MemoryConstrainedShardingRule(100, mesh, axis_names=["data"])
    assert rule.apply(tree) == {"w": P("data", None)}
    with pytest.raises(na.ShardingError, match=r"still leaves 96 bytes .* over the budget of 50"):
        na.rules.MemoryConstrainedShardingRule(50, mesh, axis_names=["data"]).apply(tree)
    with pytest.raises(
        na.ShardingError,
        match=r"MemoryConstrainedShardingRule was given axis_names 'dta', which the mesh "
        r"Mesh\(data=2, model=4\) lacks\. Available mesh axes: 'data', 'model'",
    ):
        na.rules.MemoryConstrainedShardingRule(100, mesh, axis_names=["dta"]).apply(tree)


def test_pspec_for_plain_array_without_a_spec_is_none():
    """pspec_for gives "for other plain arrays their current spec when they have one, else
    `None`" (a single-device array has none)."""
    x = na.named(jnp.ones((8, 4)), ("batch", "embed"))
    on_device = jax.device_put(jnp.ones(3), jax.devices()[2])
    specs = na.pspec_for({"p": on_device, "x": x}, {"batch": "data"}, mesh={"data": 2, "model": 4})
    assert specs == {"p": None, "x": P("data", None)}


def test_named_jit_out_axis_resources_without_a_mesh_is_an_error():
    """DESIGN: "Never silently ignore a bad mapping": outputs that the given out_axis_resources
    shards cannot be placed without a mesh; say so as in_axis_resources and shard do."""
    f = na.named_jit(lambda x: na.named(x.array * 2, x.axes), out_axis_resources={"batch": "data"})
    with pytest.raises(
        na.ShardingError,
        match=r"named_jit was given axis resources that shard the output axes .batch., but it needs a device mesh",
    ):
        f(data())


def test_logical_rule_typo_in_mapping_is_an_error_without_named_leaves():
    """Documented: "Every mesh axis named anywhere in the rules must exist in the mesh, else a
    `ShardingError`" / bad input: "rules that name mesh axes the mesh lacks"."""
    rule = na.rules.LogicalAxisRule({"batch": "dta"}, {"data": 2, "model": 4})
    with pytest.raises(na.ShardingError, match=r"mesh axis 'dta'"):
        rule.apply({"w": sds(8)})
