"""The process side of ``_helpers.run_two_processes``: what every two-process worker does around
its checks.

Import it before anything that starts JAX: it sets the CPU platform, 4 devices per process and the
gloo collectives, and puts the repository root and ``examples/`` on ``sys.path``. Then a worker's
``main`` is ``serve(check)``.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable

os.environ["JAX_PLATFORMS"] = "cpu"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "examples")]

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 4)
jax.config.update("jax_cpu_collectives_implementation", "gloo")

NUM_PROCESSES = 2


def serve(check: Callable[..., None]) -> None:
    """Join the runtime as process ``argv[1]`` (coordinator on loopback port ``argv[2]``), call
    ``check(out, *argv[3:])`` and print one line ``RESULT {json of out}``. ``out`` starts with the
    process index; a failing check is reported in ``out["error"]``, so the test shows it."""
    process_id, port = int(sys.argv[1]), int(sys.argv[2])
    jax.distributed.initialize(
        f"127.0.0.1:{port}",
        num_processes=NUM_PROCESSES,
        process_id=process_id,
        initialization_timeout=30,
    )
    out: dict = {"process_index": jax.process_index()}
    try:
        check(out, *sys.argv[3:])
    except Exception:  # report, so the test shows the failure of this process
        out["error"] = traceback.format_exc()
    print("RESULT " + json.dumps(out), flush=True)
    jax.distributed.shutdown()
