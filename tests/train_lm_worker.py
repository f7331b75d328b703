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
import os
import sys
import traceback

os.environ["JAX_PLATFORMS"] = "cpu"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 4)
jax.config.update("jax_cpu_collectives_implementation", "gloo")


def main() -> None:
    process_id, port = int(sys.argv[1]), int(sys.argv[2])
    corpus_dir, cache_dir, size_json, axis_type = sys.argv[3:7]
    jax.distributed.initialize(
        f"127.0.0.1:{port}", num_processes=2, process_id=process_id, initialization_timeout=30
    )
    out: dict = {"process_index": jax.process_index()}
    try:
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
    except Exception:  # report, so the test shows the failure of this process
        out["error"] = traceback.format_exc()
    print("RESULT " + json.dumps(out), flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
