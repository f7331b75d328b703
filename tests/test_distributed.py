"""namedaxes.distributed: single-process behaviour here, and a real 2-process run on loopback."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import run_two_processes
from jax.sharding import PartitionSpec as P

from namedaxes import (
    AxisError,
    BarrierTimeoutError,
    DistributedError,
    MappingTypeError,
    MeshError,
    NamedAxesError,
    NamedTypeError,
    ShardingError,
    axis_mapping,
    named,
)
from namedaxes.distributed import (
    barrier_sync,
    from_process_local,
    is_multiprocess,
    process_allgather,
    process_local_indices,
)

WORKER = Path(__file__).with_name("multiprocess_worker.py")
RUN_TIMEOUT = 60  # seconds for both processes together; a hang fails the test instead of CI


# -- one process -------------------------------------------------------------------------------


def test_single_process_basics():
    assert not is_multiprocess()
    assert barrier_sync() is None  # a no-op that returns at once
    assert barrier_sync(timeout=0.001, name="x") is None
    assert issubclass(BarrierTimeoutError, TimeoutError)
    assert issubclass(BarrierTimeoutError, DistributedError)
    assert issubclass(BarrierTimeoutError, NamedAxesError)


@pytest.mark.parametrize("bad", [0, -1.0, "10", True, float("inf"), float("nan"), 1e300])
def test_barrier_rejects_bad_timeout(bad):
    """inf passed the check and crashed at math.ceil(inf * 1000) with several processes."""
    with pytest.raises(
        NamedTypeError,
        match=r"^barrier_sync timeout must be a positive, finite number of seconds, got "
        r".+\. Pass a finite number of seconds, such as timeout=3600\.$",
    ):
        barrier_sync(timeout=bad)


def test_barrier_takes_numpy_numbers():
    assert barrier_sync(timeout=np.float32(2.5)) is None
    assert barrier_sync(timeout=np.int64(10)) is None


def test_barrier_rejects_bad_name():
    with pytest.raises(NamedTypeError, match=r"barrier_sync name must be a non-empty str, got ''"):
        barrier_sync(name="")


def test_from_process_local_shards_as_mapped(mesh_2x4):
    data = np.arange(64, dtype=np.float32).reshape(8, 8)
    x = from_process_local(
        named(data, ("batch", "embed")), {"batch": "data", "embed": "model"}, mesh_2x4
    )
    assert x.axis_names == ("batch", "embed")
    assert x.shape == {"batch": 8, "embed": 8}
    assert x.sharding.spec == P("data", "model")
    assert {s.data.shape for s in x.array.addressable_shards} == {(4, 2)}
    np.testing.assert_array_equal(np.asarray(x.array), data)


def test_from_process_local_uses_the_context_mapping_and_mesh(mesh_2x4):
    data = jnp.ones((4, 3))
    with jax.set_mesh(mesh_2x4), axis_mapping({"batch": "data"}):
        x = from_process_local(named(data, ("batch", "embed")))
    assert x.sharding.spec == P("data", None)
    assert x.sharding.mesh == mesh_2x4
    assert {s.data.shape for s in x.array.addressable_shards} == {(2, 3)}


def test_from_process_local_empty_mapping_replicates(mesh_2x4):
    x = from_process_local(named(jnp.ones((4, 3)), ("batch", "embed")), {}, mesh_2x4)
    assert x.sharding.spec == P(None, None)
    assert {s.data.shape for s in x.array.addressable_shards} == {(4, 3)}


def test_from_process_local_errors(mesh_2x4):
    local = named(jnp.ones((4, 3)), ("batch", "embed"))
    with pytest.raises(
        ShardingError,
        match=r"from_process_local\(\) got no mapping and no axis_mapping is in force\. Pass one",
    ):
        from_process_local(local, mesh=mesh_2x4)
    with pytest.raises(
        MeshError,
        match=r"from_process_local needs a device mesh, but none was given and none is set\. Pass mesh=\.\.\. \(a concrete jax\.sharding\.Mesh\), or wrap the code in `with jax.set_mesh",
    ):
        from_process_local(local, {"batch": "data"})
    with pytest.raises(
        NamedTypeError, match=r"from_process_local expects a NamedArray, got ndarray"
    ):
        from_process_local(np.ones((4, 3)), {"batch": "data"}, mesh_2x4)
    with pytest.raises(
        ShardingError,
        match=r"Cannot shard axis 'embed' \(size 3\).*\(from_process_local resolves process 0's local axes "
        r"against its share of each mesh axis: \{'data': 2, 'model': 4\} of \{'data': 2, 'model': 4\}\.\)",
    ):
        from_process_local(local, {"embed": "model"}, mesh_2x4)


def test_from_process_local_shows_the_mapping_it_was_given(mesh_2x4):
    """A list of names where a mapping is expected said only "got 'batch'", not what was passed."""
    local = named(jnp.ones((4, 3)), ("batch", "embed"))
    with pytest.raises(
        MappingTypeError,
        match=r"^from_process_local\(\): Each rule must be a \(logical_name, mesh_axes\) pair, got "
        r"'batch' in \['batch'\]\. Use e\.g\. \[\('batch', 'data'\)\], or a dict "
        r"\{'batch': 'data'\}\.$",
    ):
        from_process_local(local, ["batch"], mesh_2x4)


def test_process_local_indices_are_whole_on_one_process(mesh_2x4):
    idx = process_local_indices(
        {"batch": 8, "embed": 4}, {"batch": "data", "embed": "model"}, mesh_2x4
    )
    assert list(idx) == ["batch", "embed"]
    np.testing.assert_array_equal(idx["batch"], np.arange(8))
    np.testing.assert_array_equal(idx["embed"], np.arange(4))
    with jax.set_mesh(mesh_2x4), axis_mapping({"batch": "data"}):
        assert process_local_indices({"batch": 6})["batch"].tolist() == [0, 1, 2, 3, 4, 5]
    data = np.arange(32, dtype=np.float32).reshape(8, 4)
    x = from_process_local(
        named(data[idx["batch"]], ("batch", "embed")), {"batch": "data"}, mesh_2x4
    )
    np.testing.assert_array_equal(np.asarray(x.array), data)


def test_process_local_indices_errors(mesh_2x4):
    with pytest.raises(
        ShardingError,
        match=r"process_local_indices\(\) got no mapping and no axis_mapping is in force\.",
    ):
        process_local_indices({"batch": 8}, mesh=mesh_2x4)
    with pytest.raises(MeshError, match=r"process_local_indices needs a device mesh, but none"):
        process_local_indices({"batch": 8}, {"batch": "data"})
    with pytest.raises(ShardingError, match=r"Cannot shard axis 'batch' \(size 3\)"):
        process_local_indices({"batch": 3}, {"batch": "data"}, mesh_2x4)
    with pytest.raises(NamedTypeError, match=r"process_local_indices axes must be"):
        process_local_indices(("batch",), {"batch": "data"}, mesh_2x4)


def test_from_process_local_takes_the_global_axes(mesh_2x4):
    """global_axes= places the global array by resolve; a local piece of another size is refused."""
    data = np.arange(24, dtype=np.float32).reshape(6, 4)
    mapping = [("batch", "data"), ("batch", None)]
    x = from_process_local(
        named(data, ("batch", "embed")), mapping, mesh_2x4, global_axes={"embed": 4, "batch": 6}
    )
    assert x.axis_names == ("batch", "embed") and x.shape == {"batch": 6, "embed": 4}
    assert x.sharding.spec == P("data", None)
    np.testing.assert_array_equal(np.asarray(x.array), data)
    with pytest.raises(
        ShardingError,
        match=r"^from_process_local: process 0's local axis 'batch' has size 6, but the global "
        r"array \(batch=12, embed=4\) placed as P\('data', None\) on Mesh\(data=2, model=4\) "
        r"gives each process 12 of it\. Pass the indices process_local_indices names",
    ):
        from_process_local(
            named(data, ("batch", "embed")),
            mapping,
            mesh_2x4,
            global_axes={"batch": 12, "embed": 4},
        )
    with pytest.raises(
        AxisError,
        match=r"global_axes \(batch=6\) must name exactly the axes of the local piece "
        r"NamedArray\(float32, batch=6, embed=4\): 'batch', 'embed'\.",
    ):
        from_process_local(
            named(data, ("batch", "embed")), mapping, mesh_2x4, global_axes={"batch": 6}
        )


def test_process_allgather_refuses_traced_arrays():
    """Under jit it reached JAX's ConcretizationTypeError."""
    with pytest.raises(
        NamedTypeError,
        match=r"^process_allgather got the traced NamedArray\(float32, x=3\): it gathers concrete "
        r"arrays across processes on the host and cannot run under jax\.jit, vmap or grad\. Call "
        r"it outside the jitted function, on its output\.",
    ):
        jax.jit(lambda a: process_allgather(named(a, "x")).array)(jnp.ones(3))


def test_process_allgather_is_identity_when_fully_addressable(mesh_2x4):
    data = np.arange(64, dtype=np.float32).reshape(8, 8)
    x = from_process_local(named(data, ("batch", "embed")), {"batch": "data"}, mesh_2x4)
    y = process_allgather(x)
    assert y is x
    assert y.array.is_fully_addressable
    with pytest.raises(
        NamedTypeError, match=r"process_allgather expects a NamedArray, got ndarray"
    ):
        process_allgather(data)


# -- two processes on loopback -----------------------------------------------------------------


def _run_workers() -> list[dict]:
    return run_two_processes(WORKER, timeout=RUN_TIMEOUT)


@pytest.fixture(scope="module")
def two_processes():
    """Both workers, launched once for all the checks below."""
    return _run_workers()


def test_runtime_has_two_processes_of_four_devices(two_processes):
    assert [r["process_index"] for r in two_processes] == [0, 1]
    for r in two_processes:
        assert (r["process_count"], r["device_count"], r["is_multiprocess"]) == (2, 8, True)


def test_create_mesh_puts_dcn_axis_across_processes(two_processes):
    for r in two_processes:
        # (data=2, model=4): each process owns one row; model (ICI) stays inside a process
        assert r["mesh_2x4_processes"] == [[0, 0, 0, 0], [1, 1, 1, 1]]
        # default (1, -1, 1, 1, 1): fsdp=8 split into two contiguous blocks of 4
        assert r["mesh_default_shape"] == {"dp": 1, "fsdp": 8, "ep": 1, "tp": 1, "sp": 1}
        assert r["mesh_default_processes"] == [0, 0, 0, 0, 1, 1, 1, 1]
        assert r["host_mesh_shape"] == [1, 4]


@pytest.mark.parametrize("axis_type", ["auto", "explicit"])
def test_process_local_arrays_reduce_like_one_process(two_processes, axis_type):
    data = np.arange(64, dtype=np.float32).reshape(8, 8) / 8  # the worker's global_data()
    for pid, r in enumerate(two_processes):
        got = r[axis_type]
        # process_local_indices: each process reads its own half of the rows, every column
        assert got["local_indices"] == {
            "batch": [4 * pid + i for i in range(4)],
            "embed": list(range(8)),
        }
        assert got["global_shape"] == {"batch": 8, "embed": 8}
        assert got["spec"] == ["data", "model"]
        assert got["shard_shapes"] == [[4, 2]]
        assert got["fully_addressable"] is False
        # named_jit placed the named output by the mapping in force: embed -> model
        assert got["col_sum_axes"] == ["embed"] and got["col_sum_spec"] == ["model"]
        np.testing.assert_allclose(got["col_sum"], data.sum(axis=0), rtol=1e-6)
        np.testing.assert_allclose(got["sq_sum"], (data**2).sum(), rtol=1e-6)
        np.testing.assert_array_equal(np.asarray(got["gathered"]), data)
        assert got["gathered_fully_addressable"] is True
        assert (
            "which is already a global array spanning several processes"
            in got["global_input_error"]
        )
    first, second = (
        {k: v for k, v in r[axis_type].items() if k != "local_indices"} for r in two_processes
    )
    assert first == second


def test_process_local_indices_follow_the_mesh_order_of_the_devices(two_processes):
    data = np.arange(64, dtype=np.float32).reshape(8, 8) / 8
    for pid, r in enumerate(two_processes):
        got = r["interleaved"]
        assert got["mesh_processes"] == [0, 1, 0, 1, 0, 1, 0, 1]
        assert got["rows"] == [pid, pid + 2, pid + 4, pid + 6]
        np.testing.assert_array_equal(np.asarray(got["gathered"]), data)


def test_fallback_rule_rows_are_placed_as_resolve_says(two_processes):
    """6 rows under [batch -> data (4, across processes), batch -> model]: resolve falls back to
    `model`, so each process holds all 6 rows. from_process_local read the 6 local rows as half of
    12 on `data` (duplicated data); now it asks for the global sizes, and places them as resolve."""
    data = np.arange(12, dtype=np.float32).reshape(6, 2)
    for pid, r in enumerate(two_processes):
        got = r["fallback"]
        assert got["rows"] == list(range(6))
        assert got["resolve"] == got["spec"] == "P('model', None)"
        assert got["shape"] == {"batch": 6, "embed": 2}
        np.testing.assert_array_equal(np.asarray(got["gathered"]), data)
        assert got["ambiguous_error"] == (
            "from_process_local cannot tell the global size of axis 'batch' from process "
            f"{pid}'s local piece (batch=6, embed=2): under the mapping on Mesh(data=4, model=2) it "
            "is the piece of (batch=6, embed=2) placed as P('model', None) and of (batch=12, "
            "embed=2) placed as P('data', None). Pass the global sizes given to "
            "process_local_indices: global_axes={'batch': 6, 'embed': 2} or {'batch': 12, "
            "'embed': 2}."
        )


def test_barrier_passes_and_times_out_when_a_process_never_arrives(two_processes):
    first, second = two_processes
    for r in two_processes:
        assert r["inf_timeout_error"].startswith(
            "barrier_sync timeout must be a positive, finite number of seconds, got inf."
        )
    assert first["barrier_ok_seconds"] < 10 and second["barrier_ok_seconds"] < 10
    err = first["timeout_error"]
    assert err is not None, "barrier_sync returned although process 1 never called it"
    assert err["type"] == "BarrierTimeoutError" and err["is_timeout_error"]
    assert err["message"].startswith(
        "Barrier 'namedaxes_barrier_1' timed out after 1 s: not all 2 processes reached it "
        "(this is process 0)."
    )
    assert 0.9 < first["timeout_seconds"] < 10  # gave up near its 1 s timeout instead of hanging
    assert "timeout_error" not in second
    assert first["rejoined"] and second["rejoined"]
