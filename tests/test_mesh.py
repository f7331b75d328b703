"""create_mesh (real and stand-in devices), parse_mesh_from_string/parse_mesh_shape, CPU helpers,
host mesh shape."""

from dataclasses import dataclass
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import namedaxes as na
from namedaxes import MeshError, NamedTypeError
from namedaxes.mesh import (
    calculate_host_mesh_shape,
    cpu_context,
    create_cpu_mesh,
    create_device_array,
    create_mesh,
    force_cpu,
    parse_mesh_from_string,
    parse_mesh_shape,
)


@dataclass(frozen=True)
class FakeDevice:
    """A stand-in device: hashable, as jax.sharding.Mesh needs (CPU/GPU report slice_index 0)."""

    id: int
    process_index: int
    slice_index: int = 0


def fake_devices(num_granules, per_granule, *, slices=False):
    """Stand-in devices: granule g holds ids g*100 .. g*100+per_granule-1 (listed shuffled)."""
    devs = []
    for g in range(num_granules):
        for i in range(per_granule):
            if slices:  # one process per 2 devices inside each slice
                devs.append(
                    FakeDevice(
                        id=g * 100 + i, slice_index=g, process_index=(g * per_granule + i) // 2
                    )
                )
            else:
                devs.append(FakeDevice(id=g * 100 + i, process_index=g))
    return devs[::-1]  # order of the list must not matter


def granule_of(arr, attr):
    return np.vectorize(lambda d: getattr(d, attr), otypes=[int])(arr)


def assert_contiguous_blocks(arr, attr, dcn_axis):
    """Each granule's devices form one contiguous block along dcn_axis and span other axes whole."""
    g = granule_of(arr, attr)
    for value in np.unique(g):
        where = np.argwhere(g == value)
        lo, hi = where.min(axis=0), where.max(axis=0)
        block = g[tuple(slice(a, b + 1) for a, b in zip(lo, hi))]
        assert (block == value).all(), f"granule {value} is not one block:\n{g}"
        for k in range(arr.ndim):
            if k != dcn_axis:
                assert (lo[k], hi[k]) == (0, arr.shape[k] - 1), f"granule {value} split on axis {k}"
    return g


# -- create_mesh on real devices ---------------------------------------------------------------


def test_create_mesh_default_puts_all_devices_on_fsdp():
    mesh = create_mesh()
    assert dict(mesh.shape) == {"dp": 1, "fsdp": 8, "ep": 1, "tp": 1, "sp": 1}
    assert mesh.axis_types == (AxisType.Auto,) * 5
    assert [d.id for d in mesh.devices.flat] == sorted(d.id for d in jax.devices())


@pytest.mark.parametrize(
    "axis_types, expected",
    [
        ("explicit", (AxisType.Explicit, AxisType.Explicit)),
        (AxisType.Explicit, (AxisType.Explicit, AxisType.Explicit)),
        (("auto", "Manual"), (AxisType.Auto, AxisType.Manual)),
        (None, (AxisType.Auto, AxisType.Auto)),
    ],
)
def test_create_mesh_axis_types(axis_types, expected):
    mesh = create_mesh((2, -1), ("data", "model"), axis_types=axis_types)
    assert dict(mesh.shape) == {"data": 2, "model": 4}
    assert mesh.axis_types == expected


def test_create_mesh_on_device_subset_and_backend():
    devs = jax.devices()[4:]
    mesh = create_mesh((2, 2), ("data", "model"), devices=devs)
    assert [[d.id for d in row] for row in mesh.devices] == [[4, 5], [6, 7]]
    cpu = create_mesh((4, 2), ("data", "model"), backend="cpu")
    assert dict(cpu.shape) == {"data": 4, "model": 2}


def test_create_mesh_is_usable_for_sharding(axis_type):
    mesh = create_mesh((2, 4), ("data", "model"), axis_types=axis_type)
    x = jax.device_put(jnp.arange(32.0).reshape(8, 4), NamedSharding(mesh, P("data", "model")))
    assert x.sharding.spec == P("data", "model")
    assert {s.data.shape for s in x.addressable_shards} == {(4, 1)}
    np.testing.assert_array_equal(np.asarray(x), np.arange(32.0).reshape(8, 4))


def test_top_level_exports():
    assert na.mesh.create_mesh is create_mesh
    assert na.mesh.create_mesh is create_mesh
    assert na.mesh.parse_mesh_from_string is parse_mesh_from_string
    assert na.mesh.MeshConfig is na.mesh.MeshConfig


# -- stand-in multi-host layouts, through create_mesh -------------------------------------------


def test_create_mesh_over_stand_ins_is_a_jax_mesh():
    devs = fake_devices(2, 4)
    mesh = create_mesh((2, 4), ("data", "model"), devices=devs, axis_types="explicit")
    assert isinstance(mesh, jax.sharding.Mesh)
    assert dict(mesh.shape) == {"data": 2, "model": 4}
    assert mesh.axis_types == (AxisType.Explicit,) * 2
    assert mesh.device_ids.tolist() == [[0, 1, 2, 3], [100, 101, 102, 103]]
    # the mesh plans specs like any other
    assert na.pspec_for(
        na.named(jax.ShapeDtypeStruct((8, 4), "float32"), ("batch", "embed")),
        {"batch": "data", "embed": "model"},
        mesh=mesh,
    ) == P("data", "model")
    # create_device_array gives the same layout as a bare array
    assert (create_device_array((2, 4), ("data", "model"), devices=devs) == mesh.devices).all()


@dataclass(frozen=True)
class FakeTpu:
    """A stand-in with platform and device_kind too, so that mesh.abstract_mesh works."""

    id: int
    process_index: int
    slice_index: int
    platform: str = "tpu"
    device_kind: str = "TPU v5 lite"


def test_a_256_device_two_slice_mesh_of_stand_ins_plans_like_a_real_one():
    devs = [FakeTpu(id=i, process_index=i // 4, slice_index=i // 128) for i in range(256)]
    mesh = create_mesh((16, 16), ("data", "model"), devices=devs[::-1])
    g = assert_contiguous_blocks(mesh.devices, "slice_index", dcn_axis=0)
    assert g[:, 0].tolist() == [0] * 8 + [1] * 8  # only 'data' crosses the slow network
    assert mesh.abstract_mesh.abstract_device.device_kind == "TPU v5 lite"
    tree = {"w": jax.ShapeDtypeStruct((1024, 1024), "float32")}
    specs = na.rules.AutoShardingRule(mesh).apply(tree)
    assert specs == {"w": P("data", "model")}
    assert (
        na.analysis.ShardingAnalyzer(mesh).estimate_memory_usage(tree, specs)["size_per_device"]
        == 1024 * 1024 * 4 // 256
    )


def test_two_slices_of_four_split_first_divisible_axis():
    devs = fake_devices(2, 4, slices=True)
    arr = create_mesh((1, 2, 4), ("pp", "data", "model"), devices=devs).devices
    assert arr.shape == (1, 2, 4)
    g = assert_contiguous_blocks(arr, "slice_index", dcn_axis=1)
    assert g.tolist() == [[[0, 0, 0, 0], [1, 1, 1, 1]]]
    # within a slice, ICI order follows device ids
    assert [d.id for d in arr[0, 1]] == [100, 101, 102, 103]


def test_four_hosts_of_two_on_fsdp():
    devs = fake_devices(4, 2)
    arr = create_mesh((1, -1, 1), ("dp", "fsdp", "tp"), devices=devs).devices
    assert arr.shape == (1, 8, 1)
    g = assert_contiguous_blocks(arr, "process_index", dcn_axis=1)
    assert g[0, :, 0].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [d.id for d in arr[0, :, 0]] == [0, 1, 100, 101, 200, 201, 300, 301]


def test_two_hosts_of_four_with_ici_axes_inside_a_host():
    devs = fake_devices(2, 4)
    arr = create_mesh((2, 2, 2), ("dp", "fsdp", "tp"), devices=devs).devices
    g = assert_contiguous_blocks(arr, "process_index", dcn_axis=0)
    assert g[:, 0, 0].tolist() == [0, 1]
    # ICI axes (fsdp, tp) never leave one host
    for host in range(2):
        assert set(g[host].flat) == {host}


def test_dcn_on_a_later_axis_when_the_first_is_not_divisible():
    devs = fake_devices(2, 4)
    arr = create_mesh((1, 3, 8), ("a", "b", "c"), devices=fake_devices(2, 12)).devices
    assert_contiguous_blocks(arr, "process_index", dcn_axis=2)
    arr = create_mesh((1, 8), ("data", "model"), devices=devs).devices
    assert granule_of(arr, "process_index").tolist() == [[0, 0, 0, 0, 1, 1, 1, 1]]


def test_explicit_dcn_dims_over_two_axes():
    devs = fake_devices(4, 2)
    arr = create_mesh((2, 4), ("data", "model"), dcn_mesh_dims=(2, 2), devices=devs).devices
    g = granule_of(arr, "process_index")
    # four 1x2 blocks, row-major over the DCN grid
    assert g.tolist() == [[0, 0, 1, 1], [2, 2, 3, 3]]


def test_single_process_stand_ins_keep_id_order():
    devs = [FakeDevice(id=i, process_index=0) for i in (3, 1, 0, 2)]
    arr = create_mesh((2, 2), ("data", "model"), devices=devs).devices
    assert [[d.id for d in row] for row in arr] == [[0, 1], [2, 3]]


# -- bad input ---------------------------------------------------------------------------------


def test_wrong_number_of_sizes():
    with pytest.raises(
        MeshError,
        match=r"axis_dims \(2, 4\) has 2 entries but there are 3 mesh axis names \('a', 'b', 'c'\)",
    ):
        create_mesh((2, 4), ("a", "b", "c"))


def test_two_minus_ones():
    with pytest.raises(MeshError, match=r"\(a=-1, b=-1\) has 2 axes of size -1; at most one"):
        create_mesh((-1, -1), ("a", "b"))


def test_product_not_device_count():
    with pytest.raises(
        MeshError, match=r"axis_dims \(a=2, b=3\) needs 6 devices, but 8 are available"
    ):
        create_mesh((2, 3), ("a", "b"))
    with pytest.raises(MeshError, match=r"the other axes multiply to 3, which does not divide 8"):
        create_mesh((3, -1), ("a", "b"))


def test_bad_sizes_and_names():
    with pytest.raises(MeshError, match=r"contains size 0; sizes must be >= 1, or -1"):
        create_mesh((0, 8), ("a", "b"))
    with pytest.raises(MeshError, match=r"contains '2' \(str\); mesh axis sizes must be ints"):
        create_mesh(("2", 4), ("a", "b"))
    with pytest.raises(
        MeshError, match=r"Duplicate mesh axis names 'a' in axis_names \('a', 'a'\)"
    ):
        create_mesh((2, 4), ("a", "a"))
    with pytest.raises(
        MeshError, match=r"Unknown axis type 'implicit'. Use one of 'auto', 'explicit', 'manual'"
    ):
        create_mesh((2, 4), ("a", "b"), axis_types="implicit")
    with pytest.raises(MeshError, match=r"Got 1 axis_types for 2 mesh axes"):
        create_mesh((2, 4), ("a", "b"), axis_types=("auto",))


def test_empty_device_list():
    with pytest.raises(
        MeshError, match=r"The device list is empty; a mesh needs at least one device"
    ):
        create_mesh((1,), ("a",), devices=[])


def test_devices_and_backend_together():
    with pytest.raises(MeshError, match=r"Got both devices \(8 of them\) and backend='cpu'"):
        create_mesh((8,), ("a",), devices=jax.devices(), backend="cpu")


def test_unknown_backend():
    with pytest.raises(MeshError, match=r"Cannot get the devices of backend 'nope'"):
        create_mesh((8,), ("a",), backend="nope")


def test_dcn_split_that_divides_no_axis():
    with pytest.raises(
        MeshError,
        match=r"Cannot split mesh \(a=2, b=2\) across 4 processes: no axis size is divisible by 4\. "
        r"Pass dcn_mesh_dims=\(2, 2\)",
    ):
        create_mesh((2, 2), ("a", "b"), devices=fake_devices(4, 1))
    with pytest.raises(
        MeshError,
        match=r"Cannot split mesh \(a=3, b=2, c=2\) across 4 processes.*dcn_mesh_dims=\(1, 2, 2\)",
    ):
        create_mesh((3, 2, 2), ("a", "b", "c"), devices=fake_devices(4, 3))


def test_explicit_dcn_dims_errors():
    devs = fake_devices(2, 4)
    with pytest.raises(MeshError, match=r"splits axis 'b' of size 1 into 2 process blocks"):
        create_mesh((8, 1), ("a", "b"), dcn_mesh_dims=(1, 2), devices=devs)
    with pytest.raises(
        MeshError, match=r"dcn_mesh_dims \(a=1, b=1\) needs 1 processes, but 2 are available"
    ):
        create_mesh((2, 4), ("a", "b"), dcn_mesh_dims=(1, 1), devices=devs)


def test_unequal_granules():
    devs = fake_devices(2, 4)[:7]
    with pytest.raises(
        MeshError,
        match=r"Every process must contribute the same number of devices.*process 0: 3, process 1: 4",
    ):
        create_mesh((7,), ("a",), devices=devs)


def test_unhashable_or_tuple_stand_ins_are_refused():
    devs = [SimpleNamespace(id=i, process_index=0) for i in range(8)]  # no __hash__
    with pytest.raises(
        NamedTypeError,
        match=r"needs hashable, non-sequence device objects, got namespace\(id=0, process_index=0\) \(SimpleNamespace\)\. .*frozen dataclass",
    ):
        create_mesh((2, 4), ("a", "b"), devices=devs)


def test_string_axis_names_are_one_name():
    # A bare string where a sequence of names is expected is one name, across the API.
    mesh = create_mesh((8,), "data")
    assert mesh.axis_names == ("data",)
    with pytest.raises(
        MeshError,
        match=r"axis_dims \(2, 4\) has 2 entries but there are 1 mesh axis names \('data'\)",
    ):
        create_mesh((2, 4), "data")


def test_duplicate_devices():
    d = jax.devices()[0]
    with pytest.raises(MeshError, match=r"Devices with ids \[0\] appear more than once"):
        create_mesh((2,), ("a",), devices=[d, d])


# -- parse_mesh_from_string / parse_mesh_shape ---------------------------------------------------


@pytest.mark.parametrize(
    "spec, names, expected",
    [
        ("dp:2,tp:4", ("dp", "tp"), (2, 4)),
        ("tp:4, dp:2", ("dp", "fsdp", "tp"), (2, 1, 4)),
        ("fsdp:-1", ("dp", "fsdp", "ep", "tp", "sp"), (1, -1, 1, 1, 1)),
        ("2,4", ("data", "model"), (2, 4)),
        (" 2 , -1 ", ("data", "model"), (2, -1)),
    ],
)
def test_parse_mesh_shape(spec, names, expected):
    dims, out_names = parse_mesh_shape(spec, names)
    assert dims == expected and out_names == tuple(names)


@pytest.mark.parametrize(
    "spec, names, expected",
    [
        ("dp:2,tp:4", ("dp", "tp"), {"dp": 2, "tp": 4}),
        ("tp:4, dp:2", ("dp", "fsdp", "tp"), {"dp": 2, "fsdp": 1, "tp": 4}),
        ("model:2,data:-1", ("data", "model"), {"data": 4, "model": 2}),
        ("2,4", ("data", "model"), {"data": 2, "model": 4}),
        ("8", "data", {"data": 8}),
    ],
)
def test_parse_mesh_from_string_returns_a_mesh(spec, names, expected):
    mesh = parse_mesh_from_string(spec, names)
    assert isinstance(mesh, jax.sharding.Mesh)
    assert dict(mesh.shape) == expected
    assert [d.id for d in mesh.devices.flat] == [d.id for d in jax.devices()]
    assert mesh.axis_types == (AxisType.Auto,) * len(expected)


def test_parse_mesh_from_string_options(axis_type):
    mesh = parse_mesh_from_string("2,-1", ("data", "model"), num_devices=4, axis_types=axis_type)
    assert dict(mesh.shape) == {"data": 2, "model": 2}
    assert mesh.axis_types == (axis_type, axis_type)
    assert mesh.device_ids.tolist() == [[0, 1], [2, 3]]
    devs = fake_devices(2, 4)
    mesh = parse_mesh_from_string("dp:-1,tp:4", ("dp", "tp"), devices=devs)
    assert granule_of(mesh.devices, "process_index").tolist() == [[0, 0, 0, 0], [1, 1, 1, 1]]


def test_parse_shape_with_explicit_device_count():
    assert parse_mesh_shape("2,-1", ("a", "b"), num_devices=64) == ((2, -1), ("a", "b"))


@pytest.mark.parametrize(
    "spec, names, message",
    [
        (
            "dp:2,xp:4",
            ("dp", "tp"),
            r"names axis 'xp', which is not a mesh axis\. Available axes: 'dp', 'tp'",
        ),
        ("dp:2,dp:4", ("dp", "tp"), r"gives axis 'dp' twice"),
        ("dp:two", ("dp", "tp"), r"'dp:two' has size 'two', which is not an integer"),
        ("dp:", ("dp", "tp"), r"'dp:' has size '', which is not an integer"),
        ("2,x", ("dp", "tp"), r"'x' has size 'x', which is not an integer"),
        ("dp:0", ("dp", "tp"), r"has size 0; sizes must be >= 1, or -1"),
        ("2,4,1", ("dp", "tp"), r"gives 3 sizes for 2 mesh axes \('dp', 'tp'\)"),
        (
            "dp:2,4",
            ("dp", "tp"),
            r"^Mesh string 'dp:2,4' mixes named \('dp:2'\) and positional \('4'\) entries\. "
            r"Use one form throughout\.$",
        ),
        ("8,tp:1", ("dp", "tp"), r"mixes named \('tp:1'\) and positional \('8'\) entries"),
        (
            "data:2,model",
            ("data", "model"),
            r"^Mesh string 'data:2,model': 'model' has no size: write 'model:N'\.$",
        ),
        (
            "data:2,modl",
            ("data", "model"),
            r"^Mesh string 'data:2,modl': 'modl' has no size and is not a mesh axis\. "
            r"Available axes: 'data', 'model'\. Write 'axis:N' with one of them\.$",
        ),
        ("dp:2,,tp:4", ("dp", "tp"), r"has an empty entry"),
        ("", ("dp", "tp"), r"has an empty entry"),
        ("dp:-1,tp:-1", ("dp", "tp"), r"\(dp=-1, tp=-1\) has 2 axes of size -1"),
        (
            "dp:2,tp:3",
            ("dp", "tp"),
            r"'dp:2,tp:3' = \(dp=2, tp=3\) needs 6 devices, but 8 are available",
        ),
        ("3,-1", ("dp", "tp"), r"the other axes multiply to 3, which does not divide 8"),
        ("2,4", ("dp", "dp"), r"Duplicate mesh axis names 'dp' in names"),
    ],
)
@pytest.mark.parametrize("parse", [parse_mesh_shape, parse_mesh_from_string])
def test_parse_errors(parse, spec, names, message):
    with pytest.raises(MeshError, match=message):
        parse(spec, names)


@pytest.mark.parametrize("parse", [parse_mesh_shape, parse_mesh_from_string])
def test_parse_rejects_non_string(parse):
    with pytest.raises(NamedTypeError, match=r"The mesh string must be a str, got \(2, 4\)"):
        parse((2, 4), ("a", "b"))


@pytest.mark.parametrize("parse", [parse_mesh_shape, parse_mesh_from_string])
@pytest.mark.parametrize("n", [0, -8])
def test_parse_rejects_non_positive_num_devices(parse, n):
    with pytest.raises(
        MeshError,
        match=rf"Mesh string '2,4': num_devices must be at least 1, got {n}\. Pass the number of devices",
    ):
        parse("2,4", ("a", "b"), num_devices=n)


@pytest.mark.parametrize("parse", [parse_mesh_shape, parse_mesh_from_string])
@pytest.mark.parametrize("n", ["8", 8.0, True])
def test_parse_rejects_non_int_num_devices(parse, n):
    # "8" used to print "needs 8 devices, but 8 are available"
    with pytest.raises(
        NamedTypeError,
        match=r"Mesh string '2,4': num_devices must be an int, got .* Pass e\.g\. num_devices=8",
    ):
        parse("2,4", ("a", "b"), num_devices=n)


def test_parse_mesh_from_string_more_devices_than_available():
    with pytest.raises(
        MeshError, match=r"Mesh string '2,8': num_devices=16, but only 8 devices are available"
    ):
        parse_mesh_from_string("2,8", ("a", "b"), num_devices=16)


CPU_HINT = (
    r"On CPU, JAX makes as many devices per process as its jax_num_cpu_devices option says \(1 "
    r'by default\): call jax\.config\.update\("jax_num_cpu_devices", 16\) before JAX initializes '
    r"its backends \(at the top of the script, before the first jax\.devices\(\) call or array\)\.$"
)


@pytest.mark.parametrize(
    "make",
    [
        lambda: create_mesh((4, 4), ("data", "model")),
        lambda: create_mesh((16, -1), ("data", "model")),
        lambda: create_cpu_mesh((2, 8), ("data", "model")),
        lambda: parse_mesh_shape("data:4,model:4", ("data", "model")),
        lambda: parse_mesh_from_string("4,4", ("data", "model")),
        lambda: parse_mesh_from_string("2,8", ("a", "b"), num_devices=16),
        lambda: na.mesh.MeshConfig(
            na.mesh.HybridMeshShape((4, 4), (1, 1)), ("data", "model")
        ).device_array(),
    ],
    ids=["create", "minus_one", "cpu_mesh", "parse_shape", "parse", "num_devices", "hybrid"],
)
def test_too_large_a_mesh_on_cpu_names_jax_num_cpu_devices(make):
    """On CPU the fix for too few devices is jax_num_cpu_devices (set before JAX starts)."""
    with pytest.raises(MeshError, match=CPU_HINT):
        make()


def test_no_cpu_hint_without_real_cpu_devices_or_when_devices_are_left_over():
    with pytest.raises(MeshError, match=r"needs 16 devices, but 8 are available") as e:
        create_mesh((4, 4), ("data", "model"), devices=fake_devices(1, 8))
    assert "jax_num_cpu_devices" not in str(e.value)
    with pytest.raises(MeshError, match=r"needs 4 devices, but 8 are available") as e:
        create_mesh((2, 2), ("data", "model"))
    assert "jax_num_cpu_devices" not in str(e.value)
    with pytest.raises(MeshError, match=r"needs 16 devices, but 8 are available") as e:
        parse_mesh_shape("4,4", ("a", "b"), num_devices=8)  # a count, not this machine's devices
    assert "jax_num_cpu_devices" not in str(e.value)


# -- CPU helpers -------------------------------------------------------------------------------


def test_create_cpu_mesh():
    mesh = create_cpu_mesh((2, -1), ("data", "model"), axis_types="explicit")
    assert dict(mesh.shape) == {"data": 2, "model": 4}
    assert {d.platform for d in mesh.devices.flat} == {"cpu"}
    assert mesh.axis_types == (AxisType.Explicit,) * 2


def test_force_cpu_sets_and_restores_default_device():
    other = jax.devices()[3]
    with jax.default_device(other):
        with force_cpu() as cpu:
            assert jnp.ones(2).devices() == {cpu}
        assert jnp.ones(2).devices() == {other}
    assert cpu == jax.local_devices(backend="cpu")[0]


def test_cpu_context_sets_mesh():
    assert jax.sharding.get_mesh().empty
    with cpu_context((2, -1), ("data", "model")) as mesh:
        assert jax.sharding.get_mesh() == mesh
        assert dict(mesh.shape) == {"data": 2, "model": 4}
        # under jax.set_mesh, new arrays are placed on the mesh's (CPU) devices
        assert jnp.zeros(3).devices() == set(mesh.devices.flat)
    assert jax.sharding.get_mesh().empty


# -- calculate_host_mesh_shape -----------------------------------------------------------------


@pytest.mark.parametrize(
    "global_shape, per_host, processes, expected",
    [
        ((2, 4), 4, 2, (1, 4)),  # first axis divisible by 2: dp goes across hosts
        ((1, 8), 2, 4, (1, 2)),  # dp=1 is skipped, fsdp is split across the 4 hosts
        ((1, -1, 1), 4, 2, (1, 4, 1)),
        ((2, 12), 6, 4, (2, 3)),
        ((8,), 8, 1, (8,)),
    ],
)
def test_calculate_host_mesh_shape(global_shape, per_host, processes, expected):
    assert calculate_host_mesh_shape(global_shape, per_host, processes) == expected


def test_host_mesh_shape_matches_create_mesh_layout():
    devs = fake_devices(4, 2)
    arr = create_mesh((2, 4), ("a", "b"), devices=devs).devices
    host = calculate_host_mesh_shape((2, 4), 2, 4)
    g = granule_of(arr, "process_index")
    for p in range(4):
        rows, cols = np.nonzero(g == p)
        assert (len(set(rows)), len(set(cols))) == host


def test_host_mesh_shape_defaults_to_this_run():
    assert calculate_host_mesh_shape((2, 4)) == (2, 4)
    assert calculate_host_mesh_shape((2, -1), devices=jax.devices()[:4]) == (2, 2)


@pytest.mark.parametrize("shape", [(2, 4), (4, 2), (8, 1), (1, 8), (2, -1)])
def test_host_mesh_shape_of_devices_follows_create_mesh_across_slices(shape):
    """2 slices x 2 hosts x 2 devices: create_mesh((2, 4)) gives a host (1, 2), but the counts
    (which take each process as a granule) said (2, 1)."""
    devs = fake_devices(2, 4, slices=True)
    g = granule_of(create_mesh(shape, ("a", "b"), devices=devs).devices, "process_index")
    host = calculate_host_mesh_shape(shape, devices=devs)
    for p in range(4):
        assert tuple(len(set(ix)) for ix in np.nonzero(g == p)) == host
    assert calculate_host_mesh_shape((2, 4), devices=devs) == (1, 2)


def test_host_mesh_shape_takes_numpy_ints():
    assert calculate_host_mesh_shape((2, 4), np.int64(4), np.int32(2)) == (1, 4)
    with pytest.raises(
        NamedTypeError, match=r"^total_devices must be an int, got 2\.0 \(float\)\. Pass e\.g\."
    ):
        calculate_host_mesh_shape((2, 4), 2.0, 2)


def test_host_mesh_shape_errors():
    with pytest.raises(
        MeshError,
        match=r"^global_mesh_shape \(2, 4\) needs 8 devices, but 6 \(2 processes x 3\) are "
        r"available\. Make the sizes multiply to 6",
    ):
        calculate_host_mesh_shape((2, 4), total_devices=3, num_processes=2)
    with pytest.raises(
        MeshError,
        match=r"global_mesh_shape \(4, -1\) cannot use 6 devices \(2 processes x 3\): the other",
    ):
        calculate_host_mesh_shape((4, -1), total_devices=3, num_processes=2)
    with pytest.raises(
        MeshError,
        match=r"^calculate_host_mesh_shape got devices \(8 of them\) and device counts "
        r"\(total_devices=2, num_processes=4\)\. Pass one",
    ):
        calculate_host_mesh_shape((2, 4), 2, 4, devices=fake_devices(4, 2))
    with pytest.raises(MeshError, match=r"Cannot split mesh \(2, 2\) across 4 processes"):
        calculate_host_mesh_shape((2, 2), total_devices=1, num_processes=4)
    with pytest.raises(MeshError, match=r"num_processes must be a positive int, got 0"):
        calculate_host_mesh_shape((2, 4), total_devices=4, num_processes=0)
