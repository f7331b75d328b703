"""One process of a 2-process namedaxes.models run on loopback, driven by tests/test_models.py.

Not a test module (pytest does not collect it). Usage:

    python tests/models_worker.py PROCESS_ID PORT DIRECTORY

Each process gets 4 CPU devices and joins a 2-process runtime; the (data=2, model=4) mesh gives
process p the devices of data=p. Both load the llama fixture with from_hf sharded by MAPPING (every
storage read is recorded), run it, and save it with save_hf into DIRECTORY (several files: each
process writes its own). Prints one line ``RESULT {json}``.
"""

from __future__ import annotations

from pathlib import Path

import _worker  # first: sets up JAX for this process
import jax
import numpy as np

FIXTURE = Path(__file__).parent / "fixtures" / "hf" / "llama"
MAPPING = {"embed": "data", "mlp": "model", "vocab": "model", "heads": "model"}


def check(out: dict, directory: str) -> None:
    import jax.numpy as jnp
    from jax.sharding import AxisType

    import namedaxes as na
    from namedaxes import models
    from namedaxes.models import _safetensors

    reads: list[tuple[str, list[list[int]]]] = []
    original = _safetensors.Checkpoint.read

    def recording(self, name, index):
        info = self.tensors[name]
        reads.append((name, [list(s.indices(n)[:2]) for s, n in zip(index, info.shape)]))
        return original(self, name, index)

    _safetensors.Checkpoint.read = recording
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    with jax.set_mesh(mesh):
        model = models.from_hf(FIXTURE, mapping=MAPPING)
    _safetensors.Checkpoint.read = original
    up = model.layers.stacked.mlp.up.weight  # (layer, embed, mlp); stored (mlp, embed) per layer
    out["up_spec"] = [s for s in up.array.sharding.spec]
    out["fully_addressable"] = up.array.is_fully_addressable
    out["up_shards"] = sorted({tuple(s.data.shape) for s in up.array.addressable_shards})
    out["up_columns_read"] = sorted(
        {tuple(idx[1]) for name, idx in reads if name == "model.layers.0.mlp.up_proj.weight"}
    )
    r = np.load(FIXTURE / "reference.npz")
    ids = na.named(jnp.asarray(r["input_ids"], jnp.int32), ("batch", "position"))
    mask = na.named(jnp.asarray(r["attention_mask"] == 1), ("batch", "position"))
    with jax.set_mesh(mesh), na.axis_mapping(MAPPING):
        plain, padded = na.named_jit(lambda m, i, k: (m(i), m(i, attention_mask=k)))(
            model, ids, mask
        )
        plain, padded = (
            na.distributed.process_allgather(plain),
            na.distributed.process_allgather(padded),
        )
    real = r["attention_mask"] == 1
    out["max_diff"] = float(np.abs(np.asarray(plain.array) - r["logits"]).max())
    out["max_diff_padded"] = float(
        np.abs(np.asarray(padded.array) - r["logits_padded"])[real].max()
    )
    from namedaxes.models import _hf

    wrote: list[str] = []
    write = _hf.write_safetensors

    def recording_write(path, *args):
        wrote.append(Path(path).name)
        return write(path, *args)

    _hf.write_safetensors = recording_write
    models.save_hf(model, directory, max_shard_size="100KB")
    _hf.write_safetensors = write
    out["wrote"] = wrote
    na.distributed.barrier_sync(60, name="saved")
    from safetensors.numpy import load_file

    saved = {k: v for f in Path(directory).glob("*.safetensors") for k, v in load_file(f).items()}
    want = load_file(FIXTURE / "model.safetensors")
    out["same_names"] = sorted(saved) == sorted(want)
    out["bit_exact"] = all(np.array_equal(saved[k], v) for k, v in want.items() if k in saved)


if __name__ == "__main__":
    _worker.serve(check)
