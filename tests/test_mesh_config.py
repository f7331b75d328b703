"""HybridMeshShape and MeshConfig: validation, mesh rules, ICI/DCN device layouts."""

import dataclasses
from dataclasses import dataclass
from types import SimpleNamespace

import jax
import numpy as np
import pytest
from jax.sharding import AxisType

from namedaxes import MeshError, NamedTypeError
from namedaxes.mesh import HybridMeshShape, MeshConfig


@dataclass(frozen=True)
class FakeDevice:
    """A hashable stand-in device (jax.sharding.Mesh hashes its devices)."""

    id: int
    process_index: int
    slice_index: int = 0


def hosts(num_hosts, per_host, *, slices=None):
    """Stand-in devices; with ``slices``, host h belongs to slice h // (num_hosts // slices)."""
    devs = []
    for h in range(num_hosts):
        for i in range(per_host):
            s = 0 if slices is None else h // (num_hosts // slices)
            devs.append(FakeDevice(id=h * per_host + i, process_index=h, slice_index=s))
    return devs


def attr_grid(arr, attr):
    return np.vectorize(lambda d: getattr(d, attr), otypes=[int])(arr).tolist()


# -- HybridMeshShape ---------------------------------------------------------------------------


def test_hybrid_mesh_shape_normalizes_and_is_frozen():
    shape = HybridMeshShape([1, 8], [2, 1])
    assert shape.ici_mesh_shape == (1, 8) and shape.dcn_mesh_shape == (2, 1)
    assert shape.ndim == 2
    assert hash(shape) == hash(HybridMeshShape((1, 8), (2, 1)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        shape.ici_mesh_shape = (8, 1)


def test_hybrid_mesh_shape_errors():
    with pytest.raises(
        MeshError,
        match=r"equally long shapes, got ici_mesh_shape \(1, 8\) \(2 axes\) and dcn_mesh_shape \(2,\) \(1 axes\)",
    ):
        HybridMeshShape((1, 8), (2,))
    with pytest.raises(MeshError, match=r"ici_mesh_shape \(-1, -1\) has 2 axes of size -1"):
        HybridMeshShape((-1, -1), (1, 1))
    with pytest.raises(MeshError, match=r"dcn_mesh_shape \(0, 1\) contains size 0"):
        HybridMeshShape((1, 8), (0, 1))


# -- MeshConfig validation ---------------------------------------------------------------------


def test_mesh_config_normalizes():
    config = MeshConfig([2, -1], ["data", "model"], batch_axis_names=["data"])
    assert config.mesh_shape == (2, -1)
    assert config.mesh_axis_names == ("data", "model")
    assert config.batch_axis_names == ("data",)
    assert MeshConfig((2, 4), ("data", "model")).batch_axis_names == "data"
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.mesh_shape = (1, 8)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(mesh_shape=(2, 4, 1), mesh_axis_names=("data", "model")),
            r"mesh_shape \(2, 4, 1\) has 3 entries but there are 2 mesh axis names \('data', 'model'\)",
        ),
        (
            dict(
                mesh_shape=HybridMeshShape((1, 1, 8), (2, 1, 1)), mesh_axis_names=("data", "model")
            ),
            r"mesh_shape HybridMeshShape\(.*\) has 3 axes but there are 2 mesh axis names",
        ),
        (
            dict(mesh_shape=(-1, -1), mesh_axis_names=("data", "model")),
            r"mesh_shape \(data=-1, model=-1\) has 2 axes of size -1",
        ),
        (
            dict(mesh_shape=(2, 4), mesh_axis_names=("data", "data")),
            r"Duplicate mesh axis names 'data' in mesh_axis_names",
        ),
        (
            dict(mesh_shape=(2, 4), mesh_axis_names=("dp", "tp")),
            r"batch_axis_names 'data' are not mesh axes\. Available axes: 'dp', 'tp'",
        ),
        (
            dict(
                mesh_shape=(2, 4),
                mesh_axis_names=("data", "model"),
                batch_axis_names=("data", "fsdp"),
            ),
            r"batch_axis_names 'fsdp' are not mesh axes",
        ),
        (
            dict(
                mesh_shape=(2, 4),
                mesh_axis_names=("data", "model"),
                batch_axis_names=("data", "data"),
            ),
            r"batch_axis_names 'data', 'data' repeat mesh axis 'data'; a batch is split over each mesh axis at most once\. List each batch axis once",
        ),
        (
            dict(
                mesh_shape=(2, 4),
                mesh_axis_names=("data", "model"),
                mesh_rules=(("tpu-(", (1, 8)),),
            ),
            r"mesh_rules\[0\] pattern 'tpu-\(' is not a valid regular expression",
        ),
        (
            dict(
                mesh_shape=(2, 4), mesh_axis_names=("data", "model"), mesh_rules=(("gpu-.*", (8,)),)
            ),
            r"mesh_rules\[0\] \('gpu-\.\*'\) mesh shape \(8,\) has 1 entries but there are 2",
        ),
        (
            dict(mesh_shape=(2, 4), mesh_axis_names=("data", "model"), mesh_rules=(("gpu-.*",),)),
            r"mesh_rules\[0\] is \('gpu-\.\*',\); each rule must be a \(regex, mesh_shape\) pair",
        ),
    ],
)
def test_mesh_config_errors(kwargs, message):
    with pytest.raises(MeshError, match=message):
        MeshConfig(**kwargs)


# -- mesh rules --------------------------------------------------------------------------------


RULES = (
    ("tpu-v5e-.*", (-1, 8)),
    ("tpu-v4-.*", HybridMeshShape((1, 4), (-1, 1))),
    ("gpu-h100-.*", None),
    ("gpu-.*", (1, -1)),
)


def make_config():
    return MeshConfig((2, -1), ("data", "model"), mesh_rules=RULES)


@pytest.mark.parametrize(
    "selector, expected",
    [
        ("tpu-v5e-256", (-1, 8)),
        ("tpu-v4-128", HybridMeshShape((1, 4), (-1, 1))),
        ("gpu-h100-8", (2, -1)),  # None rule: the default shape, and later rules are not tried
        ("gpu-a100-8", (1, -1)),
    ],
)
def test_select_first_full_match_wins(selector, expected):
    config = make_config()
    chosen = config.select(selector)
    assert chosen.mesh_shape == expected
    assert chosen.mesh_rules is None
    assert chosen.mesh_axis_names == config.mesh_axis_names
    assert config.mesh_shape == (2, -1)  # the original is untouched


def test_select_uses_fullmatch():
    with pytest.warns(UserWarning, match=r"matches none of the mesh rules"):
        chosen = MeshConfig((2, 4), ("data", "model"), mesh_rules=(("gpu", (1, 8)),)).select(
            "gpu-h100-8"
        )
    assert chosen.mesh_shape == (2, 4)


def test_select_without_a_match_warns_and_keeps_default():
    with pytest.warns(
        UserWarning,
        match=r"Mesh selector 'tpu-v9-8' matches none of the mesh rules \('tpu-v5e-\.\*', 'tpu-v4-\.\*', "
        r"'gpu-h100-\.\*', 'gpu-\.\*'\); using the default mesh shape \(2, -1\)",
    ):
        chosen = make_config().select("tpu-v9-8")
    assert chosen.mesh_shape == (2, -1)


def test_select_without_rules_is_silent():
    config = MeshConfig((2, 4), ("data", "model"))
    assert config.select("anything") == config


def test_select_rejects_non_string():
    with pytest.raises(
        NamedTypeError, match=r"The mesh selector must be a str such as 'tpu-v5e-256', got 8"
    ):
        make_config().select(8)


# -- device layouts, through create_device_mesh --------------------------------------------------


def test_create_device_mesh_over_stand_ins_is_a_jax_mesh():
    config = MeshConfig(HybridMeshShape((1, 4), (2, 1)), ("data", "model"))
    devs = hosts(2, 4)[::-1]
    mesh = config.create_device_mesh(devs, axis_types="explicit")
    assert isinstance(mesh, jax.sharding.Mesh)
    assert dict(mesh.shape) == {"data": 2, "model": 4}
    assert mesh.axis_types == (AxisType.Explicit,) * 2
    assert mesh.device_ids.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # device_array is the same layout without the Mesh
    assert (config.device_array(devs) == mesh.devices).all()


def test_create_device_mesh_refuses_unhashable_stand_ins():
    devs = [SimpleNamespace(id=i, process_index=0) for i in range(8)]
    with pytest.raises(
        NamedTypeError, match=r"needs hashable, non-sequence device objects.*\(SimpleNamespace\)"
    ):
        MeshConfig((2, 4), ("data", "model")).create_device_mesh(devs)


def test_plain_shape_infers_dcn_on_first_divisible_axis():
    # 4 hosts x 2 devices, global (1, 2, 4): 'data' (2) is not divisible by 4, 'model' (4) is.
    config = MeshConfig((1, 2, 4), ("pp", "data", "model"))
    arr = config.create_device_mesh(hosts(4, 2)).devices
    assert attr_grid(arr, "process_index") == [[[0, 1, 2, 3], [0, 1, 2, 3]]]


def test_hybrid_two_slices_of_four():
    devs = hosts(4, 2, slices=2)  # 2 slices, each 2 hosts x 2 devices
    config = MeshConfig(HybridMeshShape((1, 4), (2, 1)), ("data", "model"))
    arr = config.create_device_mesh(devs).devices
    assert attr_grid(arr, "slice_index") == [[0, 0, 0, 0], [1, 1, 1, 1]]
    # ICI axis 'model' runs within a slice, across its two hosts in id order
    assert attr_grid(arr, "id") == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_hybrid_two_hosts_of_four_with_minus_ones():
    config = MeshConfig(HybridMeshShape((2, -1), (-1, 1)), ("data", "model"))
    arr = config.create_device_mesh(hosts(2, 4)).devices
    assert arr.shape == (4, 2)
    assert attr_grid(arr, "process_index") == [[0, 0], [0, 0], [1, 1], [1, 1]]


def test_hybrid_four_hosts_of_two_dcn_on_second_axis():
    config = MeshConfig(HybridMeshShape((2, 1), (1, 4)), ("model", "data"))
    arr = config.create_device_mesh(hosts(4, 2)).devices
    assert attr_grid(arr, "process_index") == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert attr_grid(arr, "id") == [[0, 2, 4, 6], [1, 3, 5, 7]]


def test_hybrid_layout_errors():
    config = MeshConfig(HybridMeshShape((1, 4), (2, 1)), ("data", "model"))
    with pytest.raises(
        MeshError,
        match=r"ici_mesh_shape \(data=1, model=4\) needs 4 devices per process, but 2 are available",
    ):
        config.create_device_mesh(hosts(4, 2))
    with pytest.raises(
        MeshError,
        match=r"dcn_mesh_shape \(data=2, model=1\) needs 2 processes, but 1 are available",
    ):
        config.create_device_mesh(hosts(1, 4))
    with pytest.raises(MeshError, match=r"The device list is empty"):
        config.create_device_mesh([])


def test_create_device_mesh_on_real_devices(axis_type):
    config = MeshConfig((2, -1), ("data", "model"))
    mesh = config.create_device_mesh(axis_types=axis_type)
    assert dict(mesh.shape) == {"data": 2, "model": 4}
    assert mesh.axis_types == (axis_type, axis_type)
    assert [[d.id for d in row] for row in mesh.devices] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_create_device_mesh_hybrid_single_process():
    # one process is one granule: the DCN shape must be all ones
    config = MeshConfig(HybridMeshShape((2, 2), (1, 1)), ("data", "model"))
    mesh = config.create_device_mesh(jax.devices()[:4], axis_types="explicit")
    assert dict(mesh.shape) == {"data": 2, "model": 2}
    assert mesh.axis_types == (AxisType.Explicit,) * 2


def test_selected_config_builds_its_mesh():
    mesh = make_config().select("tpu-v5e-8").create_device_mesh(jax.devices())
    assert dict(mesh.shape) == {"data": 1, "model": 8}


def test_a_bare_string_is_one_axis_name():
    config = MeshConfig((8,), "data", batch_axis_names="data")
    assert config.mesh_axis_names == ("data",) and config.batch_axis_names == "data"
    assert dict(config.create_device_mesh().shape) == {"data": 8}
    with pytest.raises(
        MeshError,
        match=r"mesh_shape \(2, 4\) has 2 entries but there are 1 mesh axis names \('data'\)",
    ):
        MeshConfig((2, 4), "data")
