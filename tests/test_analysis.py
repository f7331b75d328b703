"""Memory and sharding analysis: spec validation, exact per-device bytes, XLA agreement, reports."""

import itertools
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import sds
from jax.sharding import AbstractMesh, NamedSharding
from jax.sharding import PartitionSpec as P

import namedaxes as na
from namedaxes import MemoryAnalysisUnavailableError, MeshError, ShardingError, SpecMismatchError
from namedaxes.analysis import (
    ShardingAnalyzer,
    SpecValidationWarning,
    compiled_memory,
    create_monitored_function,
    memory_report,
)

MESH = {"data": 2, "model": 4}


# -- validate_partition_specs ------------------------------------------------------------------


def test_validate_reports_each_problem_with_its_path():
    tree = {
        "layer": {"w": jnp.zeros((3, 4)), "b": jnp.zeros(4)},
        "x": na.named(jnp.zeros((8, 2)), ("a", "b")),
        "lr": 0.1,
    }
    specs = {
        "layer": {"w": P("data"), "b": P("model", "data")},
        "x": P(("data", "tensor"), None),
        "lr": P(),
    }
    issues = ShardingAnalyzer(MESH).validate_partition_specs(tree, specs)
    assert issues == [
        "layer/b: spec P('model', 'data') has 2 entries but the array has rank 1 (shape (4,)); give "
        "at most one entry per dimension",
        "layer/w: dimension 0 of shape (3, 4) has size 3, which is not divisible by 2 (data=2) in spec "
        "P('data',); pick mesh axes whose product divides it, or pad the dimension",
        "lr: has spec P() but is not an array (float); give it None",
        "x: spec P(('data', 'tensor'), None) names mesh axis 'tensor', which is not in the mesh "
        "Mesh(data=2, model=4). Available mesh axes: 'data', 'model'",
    ]


def test_validate_duplicates_and_valid_specs():
    analyzer = ShardingAnalyzer(MESH)
    issues = analyzer.validate_partition_specs([jnp.zeros((4, 8))], [P("model", ("data", "model"))])
    assert issues == [
        "0: spec P('model', ('data', 'model')) uses mesh axis 'model' more than once; each mesh axis "
        "may shard at most one dimension of an array"
    ]
    assert (
        analyzer.validate_partition_specs([jnp.zeros((4, 8)), 1], [P("model", "data"), None]) == []
    )
    assert analyzer.validate_partition_specs([jnp.zeros(4)], [None]) == []  # None: replicated


def test_spec_tree_mismatch_names_the_first_path():
    analyzer = ShardingAnalyzer(MESH)
    tree = {"a": jnp.zeros(4), "b": {"c": jnp.zeros(4), "d": jnp.zeros(4)}}
    with pytest.raises(
        SpecMismatchError,
        match=r"the first mismatch is leaf 'b/d', which has no spec \(3 leaves vs 2 specs\)",
    ):
        analyzer.validate_partition_specs(tree, {"a": P(), "b": {"c": P()}})
    with pytest.raises(
        SpecMismatchError, match=r"leaf 'b/d', which has no spec \(the specs have 'b/e' instead\)"
    ):
        analyzer.estimate_memory_usage(tree, {"a": P(), "b": {"c": P(), "e": P()}})
    with pytest.raises(
        SpecMismatchError, match=r"the first mismatch is 'z' in the specs, which is not a leaf"
    ):
        analyzer.estimate_memory_usage({"a": jnp.zeros(4)}, {"a": P(), "z": P()})


# -- estimate_memory_usage ---------------------------------------------------------------------


def _oracle(shape, itemsize, spec, mesh):
    """Bytes per device in row-major device order, computed one device at a time."""
    out = []
    for coord in itertools.product(*[range(s) for s in mesh.values()]):
        at = dict(zip(mesh, coord))
        elements = 1
        for d, n in enumerate(shape):
            entry = spec[d] if d < len(spec) else None
            names = () if entry is None else (entry,) if isinstance(entry, str) else entry
            k = math.prod(mesh[a] for a in names)
            i = 0
            for a in names:
                i = i * mesh[a] + at[a]
            c = -(-n // k)
            elements *= min(c, max(0, n - i * c))
        out.append(elements * itemsize)
    return out


def test_estimate_matches_per_device_oracle_on_random_specs():
    mesh = {"a": 2, "b": 3, "c": 4}
    rng = np.random.default_rng(0)
    tree, specs = [], []
    for _ in range(150):
        rank = int(rng.integers(0, 4))
        shape = tuple(int(s) for s in rng.integers(1, 14, rank))
        entries = [[] for _ in range(rank)]
        for a in rng.permutation(list(mesh)):
            if rank and rng.random() < 0.7:
                entries[rng.integers(0, rank)].append(str(a))
        dtype = str(rng.choice(["int8", "bfloat16", "float32"]))
        tree.append(sds(*shape, dtype=dtype))
        specs.append(P(*[None if not e else e[0] if len(e) == 1 else tuple(e) for e in entries]))
    usage = ShardingAnalyzer(AbstractMesh((2, 3, 4), ("a", "b", "c"))).estimate_memory_usage(
        tree, specs
    )
    per_leaf = [_oracle(x.shape, np.dtype(x.dtype).itemsize, s, mesh) for x, s in zip(tree, specs)]
    assert usage["per_device"] == [sum(col) for col in zip(*per_leaf)]
    assert usage["size_per_device"] == max(usage["per_device"])
    assert [usage["leaves"][str(i)]["bytes_per_device"] for i in range(len(tree))] == [
        max(p) for p in per_leaf
    ]


def test_estimate_counts_replicated_in_full_and_tuple_entries():
    tree = {
        "rep": sds(8, 8),
        "t": sds(64, dtype="bfloat16"),
        "x": na.named(sds(8, 4), ("a", "b")),
        "n": None,
        "s": "str",
    }
    specs = {"rep": P(), "t": P(("data", "model")), "x": P("model"), "n": None, "s": None}
    usage = ShardingAnalyzer(MESH).estimate_memory_usage(tree, specs)
    assert usage["total_size"] == 256 + 128 + 128
    assert usage["per_device"] == [256 + 16 + 32] * 8
    assert usage["size_per_device"] == 304
    assert usage["replicated_bytes"] == 256
    assert usage["num_devices"] == 8
    assert usage["leaves"]["t"] == {
        "spec": P(("data", "model")),
        "total_bytes": 128,
        "bytes_per_device": 16,
    }


def test_estimate_uneven_shards_in_device_order():
    usage = ShardingAnalyzer(MESH).estimate_memory_usage(
        {"v": sds(10, dtype="int8"), "w": sds(3, dtype="int8")}, {"v": P("model"), "w": P("data")}
    )
    # devices.flat order is (data, model) row-major: model coordinate = i % 4, data = i // 4.
    # v: 10 over 4 -> blocks of 3: [3, 3, 3, 1]; w: 3 over 2 -> [2, 1].
    assert usage["per_device"] == [5, 5, 5, 3, 4, 4, 4, 2]
    assert usage["size_per_device"] == 5
    assert usage["leaves"]["v"]["bytes_per_device"] == 3


def test_estimate_matches_real_shards(mesh):
    names = mesh.axis_names
    tree = {"w": jnp.zeros((16, 8)), "b": jnp.zeros(8, jnp.int8), "t": jnp.zeros(32, jnp.bfloat16)}
    specs = {
        "w": P(names[-1], names[0] if len(names) > 1 else None),
        "b": P(),
        "t": P(tuple(names)),
    }
    placed = jax.device_put(tree, {k: NamedSharding(mesh, s) for k, s in specs.items()})
    usage = ShardingAnalyzer(mesh).estimate_memory_usage(placed, specs)
    by_device = {d: 0 for d in mesh.devices.flat}
    for x in jax.tree.leaves(placed):
        for shard in x.addressable_shards:
            by_device[shard.device] += shard.data.nbytes
    assert usage["per_device"] == [by_device[d] for d in mesh.devices.flat]


def test_a_sharding_of_another_mesh_is_refused_not_counted_here(mesh_2x4):
    """A NamedSharding of an 8-device 'data' mesh was counted on the analyzer's (2, 4) mesh by
    its spec alone: 2048 bytes per device where the real shards hold 512. One of this mesh's
    shape is counted."""
    other = jax.make_mesh((8,), ("data",))
    x = jax.device_put(jnp.zeros((64, 16)), NamedSharding(other, P("data")))
    analyzer = ShardingAnalyzer(mesh_2x4)
    for check in (analyzer.estimate_memory_usage, analyzer.validate_partition_specs):
        with pytest.raises(
            ShardingError,
            match=r"At leaf 'x': the NamedSharding P\('data',\) is on Mesh\(data=8\), but the "
            r"analysis is of Mesh\(data=2, model=4\); .* Pass the spec \(sharding.spec\)",
        ):
            check({"x": x}, {"x": x.sharding})
    y = jax.device_put(jnp.zeros((64, 16)), NamedSharding(mesh_2x4, P("data")))
    assert analyzer.estimate_memory_usage({"y": y}, {"y": y.sharding})["size_per_device"] == 2048


def test_estimate_rejects_specs_it_cannot_count():
    with pytest.raises(
        ShardingError,
        match=r"Cannot estimate memory: 2 invalid spec\(s\): a: spec P\(None, None\) has 2 entries but the array has rank 1.*b: spec P\('replica',\) names mesh axis 'replica'",
    ):
        ShardingAnalyzer(MESH).estimate_memory_usage(
            {"a": sds(4), "b": sds(4)}, {"a": P(None, None), "b": P("replica")}
        )


def test_analyzer_meshes():
    tree, specs = [sds(16)], [P("data")]
    expect = [32] * 2
    assert ShardingAnalyzer({"data": 2}).estimate_memory_usage(tree, specs)["per_device"] == expect
    assert (
        ShardingAnalyzer(AbstractMesh((2,), ("data",))).estimate_memory_usage(tree, specs)[
            "per_device"
        ]
        == expect
    )
    analyzer = ShardingAnalyzer()  # the context mesh, looked up at each call
    with jax.set_mesh(jax.make_mesh((8,), ("data",))):
        assert analyzer.estimate_memory_usage(tree, specs)["per_device"] == [8] * 8
    with pytest.raises(
        MeshError,
        match=r"ShardingAnalyzer needs a device mesh, but none was given and none is set\. Pass mesh=\.\.\. \(a jax\.sharding\.Mesh, AbstractMesh or \{axis: size\} mapping\)",
    ):
        analyzer.estimate_memory_usage(tree, specs)
    with pytest.raises(MeshError, match=r"The mesh Mesh\(data=0\) has no devices"):
        ShardingAnalyzer({"data": 0})
    with pytest.raises(MeshError, match=r"has no devices"):
        ShardingAnalyzer(jax.sharding.Mesh(np.empty((0,), dtype=object), ("data",)))


def test_plans_a_256_device_model_abstractly():
    mesh = AbstractMesh((16, 16), ("data", "model"))

    def init():
        return {
            "emb": na.named(jnp.zeros((256_000, 16_384), jnp.bfloat16), ("vocab", "embed")),
            "mlp": na.named(
                jnp.zeros((64, 16_384, 65_536), jnp.bfloat16), ("layer", "embed", "mlp")
            ),
        }

    params = jax.eval_shape(init)  # ~145 GB: never allocated
    report = memory_report(params, {"vocab": "model", "embed": "data", "mlp": "model"}, mesh)
    total = (256_000 * 16_384 + 64 * 16_384 * 65_536) * 2
    assert report.total_bytes == total
    assert report.bytes_per_device == total // 256
    assert len(report.per_device) == 256


# -- accuracy against XLA ----------------------------------------------------------------------


def test_estimate_equals_xla_argument_size(mesh):
    names = mesh.axis_names
    specs = {
        "rep": P(),
        "row": P(names[0]),
        "tuple": P(tuple(names)),
        "i8": P(None, names[-1]),
        "x": P(None, names[0]),
        "scalar": P(),
        # Sub-byte types: XLA packs two int4 per byte and rounds each shard up to a byte.
        "i4": P(None, names[-1]),
        "i4_odd": P(),
        "u4_tuple": P(tuple(names)),
    }
    tree = {
        "rep": sds(8, 6),
        "row": sds(16, 4),
        "tuple": sds(32, dtype="bfloat16"),
        "i8": sds(3, 8, dtype="int8"),
        "x": na.named(sds(4, 8, dtype="float16"), ("a", "b")),
        "scalar": sds(),
        "i4": sds(6, 16, dtype="int4"),
        "i4_odd": sds(3, 5, dtype="int4"),
        "u4_tuple": sds(40, dtype="uint4"),
    }

    class Fixed(na.rules.ShardingRule):
        def apply(self, tree):
            return specs

    placed = Fixed().shard(tree, mesh)  # ShapeDtypeStructs carrying the shardings
    xla = compiled_memory(jax.jit(lambda t: jax.tree.map(lambda a: a * 2, t)), placed)
    estimate = ShardingAnalyzer(mesh).estimate_memory_usage(tree, specs)
    assert estimate["size_per_device"] == xla["argument_bytes"]
    assert estimate["replicated_bytes"] == 8 * 6 * 4 + 4 + 8  # int4[3, 5]: 7.5 bytes -> 8
    assert estimate["leaves"]["i4"]["total_bytes"] == 6 * 16 // 2


def test_xla_refuses_uneven_arguments():
    # Why the uneven estimate cannot be compared with XLA's argument figures: JAX rejects uneven
    # shardings at jit boundaries; they only occur for constrained intermediates.
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    x = jax.ShapeDtypeStruct((10,), jnp.float32, sharding=NamedSharding(mesh, P("model")))
    with pytest.raises(ValueError):  # JAX's own error (its wording is JAX's to change)
        compiled_memory(jax.jit(lambda a: a * 2), x)


def test_compiled_memory_of_concrete_arguments_and_named_jit():
    mesh = jax.make_mesh((8,), ("data",))
    x = jax.device_put(jnp.zeros((64, 4)), NamedSharding(mesh, P("data")))
    out = compiled_memory(lambda a: a.sum(axis=1), x)
    assert out["argument_bytes"] == 128 and out["output_bytes"] == 32
    assert (
        out["total_bytes"]
        == out["argument_bytes"] + out["output_bytes"] + out["temp_bytes"] - out["alias_bytes"]
    )
    named_jit = getattr(na, "named_jit", None)
    if named_jit is not None:
        f = named_jit(lambda t: t.array * 2, in_axis_resources={"batch": "data"})
        with jax.set_mesh(mesh):
            got = compiled_memory(f, na.named(sds(64, 4), ("batch", "embed")))
        assert got["argument_bytes"] == 128


def test_compiled_memory_of_uncommitted_arguments(mesh_2x4):
    # An uncommitted argument (a plain jnp array, an unplaced NamedArray) is free to move, as in
    # jax.jit: its figures are jit's own, not an "incompatible devices" error.
    x = jax.device_put(jnp.ones((8, 16)), NamedSharding(mesh_2x4, P("data", "model")))
    y = jnp.ones((1, 16))
    f = lambda a, b: a * b  # noqa: E731
    expected = jax.jit(f).lower(x, y).compile().memory_analysis().argument_size_in_bytes
    assert compiled_memory(f, x, y)["argument_bytes"] == expected
    xn = na.named(jnp.ones((8, 16)), ("batch", "embed"))
    wn = na.named(jnp.ones((16,)), ("embed",))
    with jax.set_mesh(mesh_2x4), na.axis_mapping({"batch": "data", "embed": "model"}):
        assert compiled_memory(f, x, y)["argument_bytes"] == expected
        g = na.named_jit(lambda a, b: (a * b).sum("embed"))
        expected = g.lower(xn, wn).compile().memory_analysis().argument_size_in_bytes
        assert compiled_memory(g, xn, wn)["argument_bytes"] == expected


class _FakeCompiled:
    def __init__(self, result):
        self.result = result

    def memory_analysis(self):
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


class _FakeJitted:
    def __init__(self, result):
        self.result = result

    def lower(self, *args, **kwargs):
        return self

    def compile(self):
        return _FakeCompiled(self.result)


def test_compiled_memory_unavailable_is_a_typed_error():
    with pytest.raises(
        MemoryAnalysisUnavailableError,
        match=r"memory_analysis\(\) returned None\. Use ShardingAnalyzer.estimate_memory_usage",
    ):
        compiled_memory(_FakeJitted(None), jnp.zeros(3))
    with pytest.raises(
        MemoryAnalysisUnavailableError,
        match=r"memory_analysis\(\) raised RuntimeError: UNIMPLEMENTED",
    ):
        compiled_memory(_FakeJitted(RuntimeError("UNIMPLEMENTED")), jnp.zeros(3))
    assert issubclass(MemoryAnalysisUnavailableError, NotImplementedError)


# -- memory_report -----------------------------------------------------------------------------


def _report_tree():
    return {
        "w": na.named(sds(1024, 512), ("embed", "mlp")),
        "b": na.named(sds(512), ("mlp",)),
        "s": sds(3, dtype="int32"),
        "name": "mlp",
    }


def test_memory_report_numbers():
    report = memory_report(_report_tree(), {"mlp": "model", "embed": "data"}, MESH)
    assert report.total_bytes == 1024 * 512 * 4 + 512 * 4 + 12
    assert report.bytes_per_device == 1024 * 512 * 4 // 8 + 512 + 12
    assert report.per_device == [report.bytes_per_device] * 8
    assert report.replicated_bytes == 12 and report.replicated_leaves == ["s"]
    assert report.axes == {
        # w without mlp sharding: 1 MiB vs 256 KiB; b: 2048 vs 512.
        "mlp": {"mesh_axes": ["model"], "leaves": 2, "saved_bytes": 786432 + 1536},
        "embed": {"mesh_axes": ["data"], "leaves": 1, "saved_bytes": 262144},
    }
    assert [leaf["path"] for leaf in report.largest] == ["w", "b", "s"]
    assert report.largest[0]["spec"] == "P('data', 'model')"
    assert report.largest[0]["axes"] == "embed=1024, mlp=512"


def test_memory_report_packs_sub_byte_types(mesh_2x4):
    # int4 takes half a byte on the device (XLA packs it), not NumPy's itemsize of 1.
    w = na.named(sds(64, 16, dtype="int4"), ("embed", "mlp"))
    report = memory_report({"w": w}, {"mlp": "model"}, mesh_2x4)
    assert report.total_bytes == 64 * 16 // 2
    assert report.bytes_per_device == 64 * 16 // 2 // 4
    assert report.axes["mlp"]["saved_bytes"] == 64 * 16 // 2 - 64 * 16 // 2 // 4
    assert report.largest[0]["total_bytes"] == 64 * 16 // 2


def test_memory_report_table_dict_and_context():
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    with jax.set_mesh(mesh), na.axis_mapping({"mlp": "model"}):
        report = memory_report(_report_tree())
    text = str(report)
    assert "Memory report on Mesh(data=2, model=4)" in text
    assert "mlp                  model                          2          1,574,400 B" in text
    assert "embed                -                              1                  0 B" in text
    assert "replicated leaves: s" in text
    d = report.to_dict()
    assert d["bytes_per_device"] == 1024 * 512 * 4 // 4 + 512 + 12
    assert d["axes"]["embed"] == {"mesh_axes": [], "leaves": 1, "saved_bytes": 0}


def test_memory_report_bad_mapping():
    with pytest.raises(
        ShardingError,
        match=r"^The axis mapping names mesh axis 'tensor' \(used by logical axis 'mlp'\)",
    ):
        memory_report(_report_tree(), {"mlp": "tensor"}, MESH)


# -- create_monitored_function -----------------------------------------------------------------


def test_monitored_function_returns_metrics():
    analyzer = ShardingAnalyzer(MESH)
    step = create_monitored_function(lambda p, k: p["w"].sum() * k, {"w": P("model")}, analyzer)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result, metrics = step({"w": jnp.ones(16)}, 2.0)
    assert float(result) == 32.0
    assert metrics["validation_issues"] == []
    assert metrics["memory_usage"]["size_per_device"] == 16
    assert metrics["execution_time"] > 0


def test_monitored_function_warns_and_still_runs():
    analyzer = ShardingAnalyzer(MESH)
    step = create_monitored_function(lambda p: p["w"] + 1, {"w": P("model")}, analyzer)
    with pytest.warns(
        SpecValidationWarning,
        match=r"1 partition spec issue\(s\): w: dimension 0 of shape \(6,\) has size 6, which is not divisible by 4",
    ):
        result, metrics = step({"w": jnp.zeros(6)})
    np.testing.assert_array_equal(result, np.ones(6))
    assert metrics["memory_usage"]["size_per_device"] == 8  # uneven: blocks of 2
    with pytest.warns(
        SpecValidationWarning, match=r"the first mismatch is leaf 'v', which has no spec"
    ):
        result, metrics = step({"w": jnp.zeros(8), "v": jnp.zeros(2)})
    assert metrics["memory_usage"] is None and len(metrics["validation_issues"]) == 1


def test_named_shardings_are_accepted_as_specs(mesh_2x4):
    tree = {"w": sds(16, 8), "b": sds(8)}
    rule = na.rules.AutoShardingRule(mesh_2x4)
    by_sharding = ShardingAnalyzer(mesh_2x4).estimate_memory_usage(tree, rule.to_shardings(tree))
    by_spec = ShardingAnalyzer(mesh_2x4).estimate_memory_usage(tree, rule.apply(tree))
    assert by_sharding == by_spec
    assert by_spec["size_per_device"] == (16 * 8 * 4) // 8 + 8 * 4 // 4


# -- fail closed: bad arguments, colliding rendered paths -------------------------------------


@pytest.mark.parametrize(
    "top, error, message",
    [
        (
            -1,
            ShardingError,
            r"memory_report: top must be >= 0 \(how many of the largest leaves to list\), got -1\. Pass top=0 to list none",
        ),
        (
            "3",
            na.NamedTypeError,
            r"memory_report: top must be an int \(how many of the largest leaves to list\), got '3' \(str\)\. Pass e\.g\. top=10",
        ),
        (2.0, na.NamedTypeError, r"top must be an int .*got 2\.0 \(float\)"),
        (True, na.NamedTypeError, r"top must be an int .*got True \(bool\)"),
    ],
)
def test_memory_report_refuses_bad_top(top, error, message):
    with pytest.raises(error, match=message):
        memory_report(_report_tree(), {"mlp": "model"}, MESH, top=top)


def test_memory_report_top_zero_and_some():
    assert memory_report(_report_tree(), {"mlp": "model"}, MESH, top=0).largest == []
    assert [
        leaf["path"]
        for leaf in memory_report(_report_tree(), {"mlp": "model"}, MESH, top=2).largest
    ] == ["w", "b"]


def test_estimate_keeps_leaves_whose_rendered_paths_collide():
    tree = {"a/b": jnp.zeros(8), "a": {"b": jnp.zeros(16)}}
    specs = {"a/b": P(), "a": {"b": P("data")}}
    usage = ShardingAnalyzer(MESH).estimate_memory_usage(tree, specs)
    leaves = usage["leaves"]
    assert len(leaves) == 2
    DK = jax.tree_util.DictKey
    assert list(leaves) == [(DK("a"), DK("b")), (DK("a/b"),)]  # key paths, in tree order
    assert leaves[(DK("a/b"),)] == {"spec": P(), "total_bytes": 32, "bytes_per_device": 32}
    assert leaves[(DK("a"), DK("b"))] == {
        "spec": P("data"),
        "total_bytes": 64,
        "bytes_per_device": 32,
    }
    assert usage["total_size"] == 96 and usage["size_per_device"] == 64
    # a rendered path is a key only when it names one leaf
    with pytest.raises(
        KeyError,
        match=r"Path 'a/b' names 2 leaves \(\['a'\]\['b'\], \['a/b'\]\); index by key path",
    ):
        leaves["a/b"]
    assert "a/b" not in leaves and (DK("a/b"),) in leaves
    one = ShardingAnalyzer(MESH).estimate_memory_usage({"w": jnp.zeros(8)}, {"w": P("data")})[
        "leaves"
    ]
    assert one["w"] == {"spec": P("data"), "total_bytes": 32, "bytes_per_device": 16} and "w" in one
    with pytest.raises(KeyError):
        one["v"]


def test_memory_report_on_colliding_paths_counts_both():
    tree = {"a/b": na.named(sds(8), "embed"), "a": {"b": na.named(sds(16), "embed")}}
    report = memory_report(tree, {"embed": "model"}, MESH)
    assert [
        (leaf["path"], leaf["total_bytes"], leaf["bytes_per_device"]) for leaf in report.largest
    ] == [("a/b", 64, 16), ("a/b", 32, 8)]
    assert report.total_bytes == 96 and report.bytes_per_device == 24


def test_compiled_memory_and_monitor_refuse_non_functions():
    analyzer = ShardingAnalyzer(MESH)
    with pytest.raises(
        na.NamedTypeError,
        match=r"compiled_memory needs the function first, got 3 \(int\)\. Call compiled_memory\(fn, \*args\)",
    ):
        compiled_memory(3, jnp.zeros(4))
    with pytest.raises(
        na.NamedTypeError,
        match=r"create_monitored_function needs the function first, got 3 \(int\)",
    ):
        create_monitored_function(3, {"w": P()}, analyzer)
    with pytest.raises(
        na.NamedTypeError,
        match=r"create_monitored_function needs a ShardingAnalyzer as analyzer, got \{'data': 2, 'model': 4\} \(dict\)\. Pass e\.g\. ShardingAnalyzer\(mesh\)",
    ):
        create_monitored_function(lambda p: p, {"w": P()}, MESH)


def test_estimate_and_validate_on_containers_that_refuse_placeholders():
    # key paths are normally rebuilt from the structure with placeholders; a container that checks
    # its children when rebuilt falls back to the tree itself
    import dataclasses

    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class Params:
        w: jax.Array
        b: jax.Array

        def __post_init__(self):
            if not hasattr(self.w, "shape"):
                raise TypeError("w must be an array")

    params = Params(jnp.zeros((8, 4)), jnp.zeros(3))
    specs = Params.__new__(Params)
    object.__setattr__(specs, "w", P("data"))
    object.__setattr__(specs, "b", P("model"))
    analyzer = ShardingAnalyzer(MESH)
    assert analyzer.validate_partition_specs(params, specs) == [
        "b: dimension 0 of shape (3,) has size 3, which is not divisible by 4 (model=4) in spec "
        "P('model',); pick mesh axes whose product divides it, or pad the dimension"
    ]
    usage = analyzer.estimate_memory_usage(params, specs)
    GA = jax.tree_util.GetAttrKey
    assert list(usage["leaves"]) == [(GA("w"),), (GA("b"),)]
    assert usage["leaves"]["w"] == {"spec": P("data"), "total_bytes": 128, "bytes_per_device": 64}
    assert usage["leaves"]["b"]["bytes_per_device"] == 4  # ceil(3 / 4) float32


def test_estimate_table_does_not_keep_the_arrays_alive():
    import gc
    import weakref

    x = jnp.zeros(16)
    ref = weakref.ref(x)
    usage = ShardingAnalyzer(MESH).estimate_memory_usage({"x": x}, {"x": P("model")})
    del x
    gc.collect()
    assert ref() is None
    assert usage["leaves"]["x"]["bytes_per_device"] == 16
