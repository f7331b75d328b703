"""Save/restore times of namedaxes.checkpoint for a model of a few hundred MB (8 CPU devices).

Run: ``python benchmarks/checkpoint.py [--mb 300] [--dir /tmp/...]``. A GPT-like set of weights
(stacked layers on a ``layer`` axis, an embedding table) sharded FSDP+TP on (data=2, model=4) is
saved once with ``save``, once through ``CheckpointManager`` (time until ``save`` returns, then until
``wait`` does), and restored onto (data=8) with another mapping and onto 4 devices. Each is timed
once (wall clock, files on local disk, page cache warm after the first write); numbers from a busy
machine are indicative only.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax

jax.config.update("jax_num_cpu_devices", 8)

import argparse
import shutil
import tempfile
import time

import jax.numpy as jnp
import numpy as np

import namedaxes as na
from namedaxes.checkpoint import CheckpointManager, restore, save

SAVE_MAPPING = {"layer": None, "embed": "data", "mlp": "model", "vocab": "model"}


def model(mb: float, mesh: jax.sharding.Mesh) -> dict:
    """Float32 weights totalling about ``mb`` megabytes: 12 layers of (embed, 4*embed) x 2 + vocab."""
    embed = 256
    while 12 * 2 * embed * 4 * embed * 4 + 32000 * embed * 4 < mb * 1e6:
        embed += 128
    key = jax.random.key(0)
    k1, k2, k3 = jax.random.split(key, 3)
    tree = {
        "embed": na.named(jax.random.normal(k1, (32000, embed)), ("vocab", "embed")),
        "blocks": {
            "stacked": {
                "up": na.named(
                    jax.random.normal(k2, (12, embed, 4 * embed)), ("layer", "embed", "mlp")
                ),
                "down": na.named(
                    jax.random.normal(k3, (12, 4 * embed, embed)), ("layer", "mlp", "embed")
                ),
                "norm": na.named(jnp.ones((12, embed)), ("layer", "embed")),
            }
        },
        "step": 1000,
    }
    return na.shard(tree, SAVE_MAPPING, mesh=mesh)


def timed(label: str, fn) -> object:
    t = time.perf_counter()
    out = fn()
    jax.block_until_ready(out)
    print(f"{label:<58} {time.perf_counter() - t:7.2f} s")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=float, default=300.0, help="model size in MB (float32)")
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir, removed)")
    args = parser.parse_args()
    root = args.dir or tempfile.mkdtemp(prefix="namedaxes-ckpt-bench-")
    try:
        mesh = jax.make_mesh((2, 4), ("data", "model"))
        tree = model(args.mb, mesh)
        jax.block_until_ready(tree)
        nbytes = sum(x.nbytes for x in jax.tree.leaves(tree) if hasattr(x, "nbytes"))
        print(f"model: {nbytes / 1e6:.0f} MB float32 on {dict(mesh.shape)}, files in {root}")
        timed("save (synchronous, committed)", lambda: save(f"{root}/one", tree))
        with CheckpointManager(f"{root}/run", max_to_keep=2) as mgr:
            timed(
                "CheckpointManager.save (returns, writes in background)", lambda: mgr.save(1, tree)
            )
            timed("  ... wait() until committed", mgr.wait)
        like = jax.eval_shape(lambda: tree)
        mesh8 = jax.make_mesh((8,), ("data",))
        out = timed(
            "restore onto (data=8), embed->data",
            lambda: restore(f"{root}/one", like, mapping={"embed": "data"}, mesh=mesh8),
        )
        assert out["step"] == 1000
        np.testing.assert_array_equal(np.asarray(out["blocks"]["stacked"]["norm"].array), 1.0)
        mesh4 = jax.make_mesh((4,), ("model",), devices=jax.devices()[:4])
        timed(
            "restore onto 4 devices, mlp/vocab->model",
            lambda: restore(
                f"{root}/run", like, mapping={"mlp": "model", "vocab": "model"}, mesh=mesh4
            ),
        )
        timed("restore without like (saved structure, one device)", lambda: restore(f"{root}/one"))
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
