"""One process of a 2-process JAX run on loopback, driven by tests/test_distributed.py.

Not a test module (pytest does not collect it). Usage:

    python tests/multiprocess_worker.py PROCESS_ID PORT

Each process gets 4 CPU devices and joins a 2-process runtime through ``jax.distributed``, runs
every check, and prints one line ``RESULT {json}`` that the test compares across processes and
against a single-process NumPy oracle. Checks are combined in one launch to keep the suite fast.
"""

from __future__ import annotations

import time

import _worker  # first: sets up JAX for this process
import jax
import numpy as np

BARRIER_TIMEOUT = 1.0  # the one barrier that process 1 skips


def global_data() -> np.ndarray:
    """The array the processes build together; each holds half of the batch rows."""
    return np.arange(64, dtype=np.float32).reshape(8, 8) / 8


def grid(mesh: jax.sharding.Mesh, attr: str) -> list:
    return np.vectorize(lambda d: getattr(d, attr), otypes=[int])(mesh.devices).tolist()


def check_meshes(out: dict) -> None:
    import namedaxes as na

    mesh = na.mesh.create_mesh((2, 4), ("data", "model"))
    out["mesh_2x4_processes"] = grid(mesh, "process_index")
    default = na.mesh.create_mesh()  # all 8 devices on fsdp, split across the 2 processes
    out["mesh_default_shape"] = dict(default.shape)
    out["mesh_default_processes"] = np.asarray(grid(default, "process_index")).ravel().tolist()
    out["host_mesh_shape"] = list(na.mesh.calculate_host_mesh_shape((2, 4)))


def check_arrays(out: dict, axis_type: str) -> None:
    import namedaxes as na

    mesh = na.mesh.create_mesh((2, 4), ("data", "model"), axis_types=axis_type)
    mapping = {"batch": "data", "embed": "model"}
    indices = na.distributed.process_local_indices({"batch": 8, "embed": 8}, mapping, mesh)
    local = na.named(np.asarray(global_data()[indices["batch"]]), ("batch", "embed"))

    @na.named_jit
    def reduce(x):
        x = na.shard(x)  # a no-op here; checks that shard resolves on the global mesh under jit
        # a per-feature sum over the process-spanning batch axis, and a global sum of squares
        return na.sum(x, "batch"), na.sum(na.square(x))

    with jax.set_mesh(mesh), na.axis_mapping(mapping):
        x = na.distributed.from_process_local(local)
        col_sum, sq_sum = reduce(x)
    gathered = na.distributed.process_allgather(x)
    try:
        na.distributed.from_process_local(x, {"batch": "data"}, mesh)
        global_input_error = None
    except na.ShardingError as e:
        global_input_error = str(e)
    out[axis_type] = {
        "local_indices": {name: idx.tolist() for name, idx in indices.items()},
        "global_shape": x.shape,
        "spec": [str(e) for e in x.sharding.spec],
        "shard_shapes": sorted({tuple(s.data.shape) for s in x.array.addressable_shards}),
        "fully_addressable": x.array.is_fully_addressable,
        "col_sum_axes": list(col_sum.axis_names),
        "col_sum_spec": [str(e) for e in col_sum.sharding.spec],
        "col_sum": np.asarray(na.distributed.process_allgather(col_sum).array).tolist(),
        "sq_sum": float(np.asarray(na.distributed.process_allgather(sq_sum).array)),
        "gathered": np.asarray(gathered.array).tolist(),
        "gathered_fully_addressable": gathered.array.is_fully_addressable,
        "global_input_error": global_input_error,
    }


def check_interleaved_rows(out: dict) -> None:
    """A mesh whose `data` positions alternate between the processes: each holds every other row."""
    import namedaxes as na

    devices = sorted(jax.devices(), key=lambda d: (d.id % 4, d.process_index))
    mesh = jax.sharding.Mesh(np.array(devices), ("data",))
    mapping = {"batch": "data"}
    rows = na.distributed.process_local_indices({"batch": 8, "embed": 8}, mapping, mesh)["batch"]
    x = na.distributed.from_process_local(
        na.named(global_data()[rows], ("batch", "embed")), mapping, mesh
    )
    out["interleaved"] = {
        "mesh_processes": grid(mesh, "process_index"),
        "rows": rows.tolist(),
        "gathered": np.asarray(na.distributed.process_allgather(x).array).tolist(),
    }


def check_fallback_rows(out: dict) -> None:
    """A mapping with a fallback: 6 rows do not divide `data` (4, across the processes), so `batch`
    falls back to `model` (inside each process) and every process passes all 6 rows."""
    import namedaxes as na

    mesh = na.mesh.create_mesh((4, 2), ("data", "model"))
    mapping = [("batch", "data"), ("batch", "model")]
    axes = {"batch": 6, "embed": 2}
    data = np.arange(12, dtype=np.float32).reshape(6, 2)
    rows = na.distributed.process_local_indices(axes, mapping, mesh)["batch"]
    local = na.named(data[rows], ("batch", "embed"))
    try:  # 6 local rows are also half of 12 rows on `data`
        na.distributed.from_process_local(local, mapping, mesh)
        ambiguous = None
    except na.ShardingError as e:
        ambiguous = str(e)
    x = na.distributed.from_process_local(local, mapping, mesh, global_axes=axes)
    out["fallback"] = {
        "rows": rows.tolist(),
        "resolve": str(na.resolve(tuple(na.Axis(n, s) for n, s in axes.items()), mapping, mesh)),
        "spec": str(x.sharding.spec),
        "shape": x.shape,
        "gathered": np.asarray(na.distributed.process_allgather(x).array).tolist(),
        "ambiguous_error": ambiguous,
    }


def check_barriers(out: dict) -> None:
    import namedaxes as na

    try:  # refused up front on every process, instead of an OverflowError at the runtime call
        na.distributed.barrier_sync(timeout=float("inf"))
        out["inf_timeout_error"] = None
    except na.NamedTypeError as e:
        out["inf_timeout_error"] = str(e)
    t = time.monotonic()
    na.distributed.barrier_sync(timeout=30)
    out["barrier_ok_seconds"] = time.monotonic() - t
    if jax.process_index() == 0:
        t = time.monotonic()
        try:
            na.distributed.barrier_sync(timeout=BARRIER_TIMEOUT)
            out["timeout_error"] = None
        except na.BarrierTimeoutError as e:
            out["timeout_error"] = {
                "type": type(e).__name__,
                "is_timeout_error": isinstance(e, TimeoutError),
                "message": str(e),
            }
        out["timeout_seconds"] = time.monotonic() - t
    # process 1 never calls that barrier; both meet again here before exiting
    na.distributed.barrier_sync(timeout=30, name="worker-done")
    out["rejoined"] = True


def check_all(out: dict) -> None:
    import namedaxes as na

    out["process_count"] = jax.process_count()
    out["device_count"] = jax.device_count()
    out["is_multiprocess"] = na.distributed.is_multiprocess()
    check_meshes(out)
    for axis_type in ("auto", "explicit"):
        check_arrays(out, axis_type)
    check_interleaved_rows(out)
    check_fallback_rows(out)
    check_barriers(out)


if __name__ == "__main__":
    _worker.serve(check_all)
