"""One process of a 2-process run that builds text batches, driven by tests/test_text_data.py.

Not a test module (pytest does not collect it). Usage:

    python tests/text_data_worker.py PROCESS_ID PORT CORPUS_DIR CACHE_DIR VOCAB

Each process gets 4 CPU devices, joins a 2-process runtime, loads the corpus from the cache the
test built, builds the same training and held-out batches as the test does on one process (on an
Auto and an Explicit mesh), gathers them, and prints one line ``RESULT {json}``.
"""

from __future__ import annotations

import _worker  # first: sets up JAX for this process
import jax
import numpy as np

LENGTH = 16
MAPPING = {"batch": "data"}


def batches(text, axis_type: str) -> dict:
    import text_data as td

    import namedaxes as na

    rows_drawn = []
    draw = td._random_start

    def recording(seed, stream, step, row, num_starts):
        rows_drawn.append(row)
        return draw(seed, stream, step, row, num_starts)

    td._random_start = recording
    try:
        mesh = na.mesh.create_mesh((2, 4), ("data", "model"), axis_types=axis_type)
        with jax.set_mesh(mesh):
            xs = {
                "train_0": text.train_batch(0, batch=8, length=LENGTH, seed=7, mapping=MAPPING),
                "train_5": text.train_batch(5, batch=8, length=LENGTH, seed=7, mapping=MAPPING),
                "heldout_1": text.heldout_batch(
                    1, batches=2, batch=8, length=LENGTH, mapping=MAPPING
                ),
            }
    finally:
        td._random_start = draw
    x = xs["train_0"]
    out = {
        name: np.asarray(na.distributed.process_allgather(v).array).tolist()
        for name, v in xs.items()
    }
    out["spec"] = [str(e) for e in x.sharding.spec]
    out["shard_shapes"] = sorted({tuple(s.data.shape) for s in x.array.addressable_shards})
    out["fully_addressable"] = x.array.is_fully_addressable
    out["rows_drawn"] = rows_drawn
    return out


def check(out: dict, corpus_dir: str, cache_dir: str, vocab: str) -> None:
    import text_data as td

    text = td.load_text(corpus_dir, vocab_size=int(vocab), cache_dir=cache_dir)
    out["from_cache"] = text.from_cache
    for axis_type in ("auto", "explicit"):
        out[axis_type] = batches(text, axis_type)


if __name__ == "__main__":
    _worker.serve(check)
