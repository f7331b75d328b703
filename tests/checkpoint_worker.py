"""One process of a 2-process checkpoint run on loopback, driven by tests/test_checkpoint.py.

Not a test module (pytest does not collect it). Usage:

    python tests/checkpoint_worker.py PROCESS_ID PORT DIRECTORY

Each process gets 4 CPU devices and joins a 2-process runtime. Both save a tree sharded on a
(data=2, model=4) mesh (each process writes its own shards), then restore it on a (data=4, model=2)
mesh with another mapping, so each process reads only the shards its devices hold; then a
CheckpointManager saves asynchronously from both. Prints one line ``RESULT {json}``.
"""

from __future__ import annotations

import os

import _worker  # first: sets up JAX for this process
import jax
import numpy as np


def global_data() -> np.ndarray:
    return np.arange(64, dtype=np.float32).reshape(8, 8)


def check(out: dict, directory: str, mode: str) -> None:
    import equinox as eqx
    import optax

    import namedaxes as na
    from namedaxes.checkpoint import restore, save

    pid = jax.process_index()
    saved_on = na.mesh.create_mesh((2, 4), ("data", "model"), axis_types=mode)
    rows = slice(pid * 4, (pid + 1) * 4)
    local = na.named(global_data()[rows], ("batch", "embed"))
    x = na.distributed.from_process_local(local, {"batch": "data", "embed": "model"}, saved_on)
    opt_state = optax.adam(0.1).init({"w": x})
    opt_state = (opt_state[0]._replace(count=opt_state[0].count + 1),) + tuple(opt_state[1:])
    tree = {"params": {"w": x}, "opt": opt_state}
    save(os.path.join(directory, mode), tree)

    mesh = na.mesh.create_mesh((4, 2), ("data", "model"), axis_types=mode)
    like = eqx.filter_eval_shape(lambda: tree)
    with jax.set_mesh(mesh), na.axis_mapping({"embed": "data"}):
        out_tree = restore(os.path.join(directory, mode), like)
    w = out_tree["params"]["w"]
    data = global_data()
    shards = w.array.addressable_shards
    out[mode] = {
        "spec": [e for e in w.sharding.spec],
        "fully_addressable": w.array.is_fully_addressable,
        "shard_shapes": sorted({tuple(s.data.shape) for s in shards}),
        "values_match": all(np.array_equal(np.asarray(s.data), data[s.index]) for s in shards),
        "columns": sorted({c for s in shards for c in range(8)[s.index[1]]}),
        "opt_spec": [e for e in out_tree["opt"][0].mu["w"].sharding.spec],
        "count": int(np.asarray(out_tree["opt"][0].count.addressable_shards[0].data)),
    }


def check_manager(out: dict, directory: str) -> None:
    import namedaxes as na
    from namedaxes.checkpoint import CheckpointManager

    mesh = na.mesh.create_mesh((2, 4), ("data", "model"))
    pid = jax.process_index()
    local = na.named(global_data()[pid * 4 : (pid + 1) * 4], ("batch", "embed"))
    x = na.distributed.from_process_local(local, {"batch": "data"}, mesh)
    with CheckpointManager(os.path.join(directory, "run"), max_to_keep=1) as mgr:
        mgr.save(0, {"x": x})
        mgr.save(1, {"x": x * 2})
        mgr.wait()
        back = mgr.restore(mapping={"batch": "data", "embed": "model"}, mesh=mesh)["x"]
        out["manager_steps"] = mgr.all_steps()
    data = global_data() * 2
    out["manager_values_match"] = all(
        np.array_equal(np.asarray(s.data), data[s.index]) for s in back.array.addressable_shards
    )


def check_all(out: dict, directory: str) -> None:
    for mode in ("auto", "explicit"):
        check(out, directory, mode)
    check_manager(out, directory)


if __name__ == "__main__":
    _worker.serve(check_all)
