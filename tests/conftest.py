"""Test configuration: 8 simulated CPU devices, strict numerics; the mesh fixtures of ``_meshes``."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_numpy_rank_promotion", "raise")
# Mixed dtypes must be cast on purpose (no silent int32 + float32 -> float32 in the library).
jax.config.update("jax_numpy_dtype_promotion", "strict")

from _meshes import axis_type, mesh, mesh_2x4  # noqa: E402, F401  (fixtures, registered here)
