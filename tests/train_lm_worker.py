"""One process of a 2-process training run of the main example, driven by tests/test_train_lm.py.

Not a test module (pytest does not collect it). Usage:

    python tests/train_lm_worker.py PROCESS_ID PORT CORPUS_DIR CACHE_DIR SIZE_JSON AXIS_TYPE

Each process gets 4 CPU devices, joins a 2-process runtime, loads the corpus from the cache the
test built, trains ``examples/train_lm.py``'s ``train`` on a (data=2, model=4) mesh of ``AXIS_TYPE``
axes (each process reading only its rows of every batch), and prints one line ``RESULT {json}``
with the training and held-out losses.
"""

from __future__ import annotations

import json

import _worker  # first: sets up JAX for this process
import jax


def check(out: dict, corpus_dir: str, cache_dir: str, size_json: str, axis_type: str) -> None:
    import text_data
    import train_lm

    import namedaxes as na

    text = text_data.load_text(corpus_dir, vocab_size=300, cache_dir=cache_dir)
    size = train_lm.Size(**json.loads(size_json))
    mesh = na.mesh.create_mesh((2, 4), ("data", "model"), axis_types=axis_type)
    result = train_lm.train(text, size, mesh, seed=3, eval_batches=2)
    out["losses"] = [result.losses[s] for s in sorted(result.losses)]
    out["heldout"] = {str(s): v for s, v in result.heldout.items()}
    out["devices"] = jax.device_count()
    out["local_devices"] = jax.local_device_count()


if __name__ == "__main__":
    _worker.serve(check)
