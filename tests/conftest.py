"""Test configuration: 8 simulated CPU devices, strict numerics; the mesh fixtures of ``_meshes``."""

import os
import shutil
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The suite's programs are tiny: compiling them is most of its time, and code generation is most
# of a compile. Two flags for XLA:CPU's code generator: no LLVM optimizations (about twice as fast),
# and the elemental emitters instead of the MLIR fusion emitters (about half the rest again).
# Sharding propagation, the SPMD partitioner and its collectives run before either, so placements
# and compiled collectives are unchanged and values agree to float32 rounding; the elemental
# emitters fuse a little differently, which moves XLA:CPU's temporary bytes slightly (0.2% in a
# pipelined step). Subprocesses (the docs pages, the two-process tests) inherit them. A jaxlib
# without one of these flags stops at start-up naming it ("Unknown flag in XLA_FLAGS"): drop it.
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
for flag in FAST_COMPILE.split():
    if flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()

# Identical programs recur across tests (a fixture model's forward pass in several tests, the same
# helper in both xdist workers): one compilation cache for the run's processes compiles each once
# (about 12% of the suite). The controller makes it before the workers start, so they (and the
# subprocesses tests start) inherit it, and removes it at the end: nothing carries over between runs
# (a JAX_COMPILATION_CACHE_DIR set by the caller is used as it is, and kept).
_CACHE_MADE_HERE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _CACHE_MADE_HERE = tempfile.mkdtemp(prefix="namedaxes-test-compile-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE_MADE_HERE
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_numpy_rank_promotion", "raise")
# Mixed dtypes must be cast on purpose (no silent int32 + float32 -> float32 in the library).
jax.config.update("jax_numpy_dtype_promotion", "strict")

from _meshes import axis_type, mesh, mesh_2x4  # noqa: E402, F401  (fixtures, registered here)


def pytest_sessionfinish(session):
    """Remove the run's compilation cache (in the process that made it: the controller)."""
    if _CACHE_MADE_HERE is not None and not hasattr(session.config, "workerinput"):
        shutil.rmtree(_CACHE_MADE_HERE, ignore_errors=True)
