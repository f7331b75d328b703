"""Test configuration: 8 simulated CPU devices, strict numerics; the mesh fixtures of ``_meshes``."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The suite's programs are tiny: compiling them is most of its time, and LLVM's optimizations are
# most of a compile. Without them XLA compiles about twice as fast; its own passes (fusion,
# sharding propagation, collectives, buffer assignment) run as at the default level, so placements,
# compiled collectives and memory figures are unchanged, and values agree to float32 rounding.
# Subprocesses (the docs pages, the two-process tests) inherit it.
FAST_COMPILE = "--xla_backend_optimization_level=0"
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE}".strip()

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_numpy_rank_promotion", "raise")
# Mixed dtypes must be cast on purpose (no silent int32 + float32 -> float32 in the library).
jax.config.update("jax_numpy_dtype_promotion", "strict")

from _meshes import axis_type, mesh, mesh_2x4  # noqa: E402, F401  (fixtures, registered here)
