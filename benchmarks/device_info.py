"""What the device machine has, for the log's head: JAX's version, the device and its compute
capability, and the signatures of the JAX Pallas GPU kernels namedaxes builds on (Mosaic GPU's
grouped matmuls and attention), whose experimental APIs change between JAX releases.

Run: ``python benchmarks/device_info.py``.
"""

from __future__ import annotations

import importlib
import inspect

import jax

KERNELS = {
    "jax.experimental.pallas.ops.gpu.ragged_dot_mgpu": "ragged_dot",
    "jax.experimental.pallas.ops.gpu.transposed_ragged_dot_mgpu": "transposed_ragged_dot",
    "jax.experimental.pallas.ops.gpu.attention_mgpu": "attention",
}


def main() -> None:
    device = jax.devices()[0]
    capability = getattr(device, "compute_capability", "-")
    print(f"jax {jax.__version__}, {device.device_kind} ({jax.default_backend()}), "
          f"compute capability {capability}, {jax.device_count()} device(s)")  # fmt: skip
    for module, name in KERNELS.items():
        try:
            fn = getattr(importlib.import_module(module), name)
            print(f"{module.rsplit('.', 1)[1]}.{name}{inspect.signature(fn)}")
        except Exception as e:  # noqa: BLE001 - a report, not a check
            print(f"{module}.{name}: {type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
