"""Assertion helpers shared by the test files (imported as ``from _helpers import ...``)."""

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

import namedaxes as na


def _array(x):
    return x.array if isinstance(x, na.NamedArray) else x


def spec_of(x):
    """A placed array's spec without trailing Nones (Auto-mode jit outputs drop them)."""
    entries = list(_array(x).sharding.spec)
    while entries and entries[-1] is None:
        entries.pop()
    return P(*entries)


def shard_shapes(x):
    """The distinct shapes of the shards this process holds, sorted."""
    return sorted({s.data.shape for s in _array(x).addressable_shards})


def same(named_array, expected, axes):
    """``named_array`` has exactly ``axes`` (in order) and the values of ``expected``."""
    assert named_array.axis_names == tuple(axes)
    np.testing.assert_array_equal(np.asarray(named_array.array), np.asarray(expected))


def equations(jaxpr):
    """Every equation of a jaxpr, nested ones (scan bodies, remat, custom rules) included."""
    for eqn in jaxpr.eqns:
        yield eqn
        for p in eqn.params.values():
            for sub in p if isinstance(p, (tuple, list)) else (p,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from equations(inner)


def sds(*shape, dtype="float32"):
    """An abstract array (``jax.ShapeDtypeStruct``) of ``shape``."""
    return jax.ShapeDtypeStruct(shape, dtype)


def run_two_processes(worker, *args, timeout):
    """Run ``worker`` (a script path) as processes 0 and 1 on a free loopback port, each given
    ``process_id port *args``; return the JSON each printed on its last ``RESULT `` line.

    Fails the test (workers killed) after ``timeout`` seconds, or with a worker's output when it
    exits non-zero, prints no result or reports an ``error``.
    """
    import json
    import os
    import socket
    import subprocess
    import sys

    import pytest

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "JAX_"))}
    env["JAX_PLATFORMS"] = "cpu"
    # as conftest.py: compiles fast
    env["XLA_FLAGS"] = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
    procs = [
        subprocess.Popen(
            [sys.executable, str(worker), str(i), str(port), *map(str, args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(2)
    ]
    try:
        outputs = [p.communicate(timeout=timeout) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        for p in procs:
            p.communicate()
        pytest.fail(f"{worker.name} did not finish within {timeout} s (killed)")
    results = []
    for i, (p, (stdout, stderr)) in enumerate(zip(procs, outputs)):
        lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
        assert p.returncode == 0 and lines, (
            f"worker {i} failed (rc={p.returncode}):\n{stdout}\n{stderr[-3000:]}"
        )
        result = json.loads(lines[-1][len("RESULT ") :])
        assert "error" not in result, f"worker {i} raised:\n{result['error']}"
        results.append(result)
    return results
