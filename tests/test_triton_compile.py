"""The Pallas Triton kernels (grouped_matmul, flash_attention) compiled for an H100 (sm_90) and an
A100 (sm_80) by the ``triton`` package on this CPU: each module compiles with the kernel's own
warps and stages, fits the GPU's shared memory and multiplies with its tensor-core instructions
(wgmma on Hopper, mma.sync on Ampere).

A GPU is lent to few sessions, and an H100 once refused a kernel that lowered and passed every CPU
test (a loop bound typed i1); this compiles what the GPU would, without one. Needs ``triton``
(about 1 GB installed, Linux only), so it skips without it; CI runs it in its own environment
(``.ci/run``).
"""

import os
import re

import jax
import jax.numpy as jnp
import pytest
from _triton import triton_modules

from namedaxes.kernels import _flash_attention as flash
from namedaxes.kernels import _grouped_matmul as gmm
from namedaxes.kernels import flash_attention, grouped_matmul

# Triton 3.9 warns until this is set; 1 keeps its current default (floating-point fusion on).
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
triton = pytest.importorskip("triton", reason="needs the triton package (pip install triton)")
from triton.backends.compiler import GPUTarget  # noqa: E402

# (target, the most shared memory one block may use, the tensor-core instruction in its PTX)
GPUS = {
    "h100": (GPUTarget("cuda", 90, 32), 227 * 1024, r"wgmma\.mma_async"),
    "a100": (GPUTarget("cuda", 80, 32), 163 * 1024, r"mma\.sync"),
}


def compiled(module, params, tmp_path, name, gpu):
    path = tmp_path / f"{name}.ttir"
    path.write_text(module.operation.get_asm(enable_debug_info=False))
    options = {"num_warps": params.num_warps, "num_stages": params.num_stages}
    return triton.compile(str(path), target=GPUS[gpu][0], options=options)


def check(kernels, gpu):
    _, shared, mma = GPUS[gpu]
    for k in kernels:
        assert k.metadata.shared <= shared, k.metadata.shared
        assert re.search(mma, k.asm["ptx"]), f"no tensor-core MMA ({mma})"


@pytest.mark.parametrize("gpu", list(GPUS))
def test_grouped_matmul_kernels_compile(monkeypatch, tmp_path, gpu):
    """The forward product and both backward products, bfloat16, at the default tiling."""
    lhs, rhs = jnp.ones((512, 1024), jnp.bfloat16), jnp.ones((8, 1024, 2048), jnp.bfloat16)
    sizes = jnp.array([100, 0, 56, 60, 100, 60, 70, 66], jnp.int32)

    def loss(a, b):
        out = grouped_matmul(a, b, sizes, interpret=False, implementation="pallas")
        return jnp.sum(out.astype(jnp.float32))

    modules = triton_modules(monkeypatch, jax.grad(loss, (0, 1)), lhs, rhs)
    assert len(modules) == 3
    check([compiled(m, gmm._TRITON, tmp_path, f"gmm{i}", gpu) for i, m in enumerate(modules)], gpu)


@pytest.mark.parametrize("gpu", list(GPUS))
@pytest.mark.parametrize("kw", [dict(causal=True, window=256), dict(causal=False)])
def test_flash_attention_kernels_compile(monkeypatch, tmp_path, kw, gpu):
    """The forward, dk/dv and dq kernels, bfloat16, GQA 16/4 of 64, a traced query offset."""

    q, k = jnp.ones((1, 1024, 16, 64), jnp.bfloat16), jnp.ones((1, 1024, 4, 64), jnp.bfloat16)

    def loss(q, k, v, offset):
        out, lse = flash_attention(q, k, v, offset=offset, interpret=False, **kw)
        return jnp.sum(out.astype(jnp.float32)) + jnp.sum(lse)

    modules = triton_modules(monkeypatch, jax.grad(loss, (0, 1, 2)), q, k, k, jnp.int32(0))
    assert len(modules) == 3
    kernels = [
        compiled(m, flash._TRITON, tmp_path, f"flash{i}", gpu) for i, m in enumerate(modules)
    ]
    check(kernels, gpu)


@pytest.mark.parametrize(
    "gpu,fmt", [("h100", jnp.int8), ("a100", jnp.int8), ("h100", jnp.float8_e4m3fn)]
)
def test_grouped_kernel_on_narrow_weights_compiles(monkeypatch, tmp_path, gpu, fmt):
    """A quantized mixture of experts' product (scaled_grouped_matmul): bfloat16 rows, int8 or
    float8 weights converted tile by tile inside the kernel, the scales on its sums. float8
    weights only where reads_narrow says (an A100's Triton cannot convert float8)."""
    rows, weights = jnp.ones((512, 1024), jnp.bfloat16), jnp.ones((8, 1024, 2048), fmt)
    sizes = jnp.array([100, 0, 56, 60, 100, 60, 70, 66], jnp.int32)

    def product(rows, weights):
        scale = jnp.ones((8, 2048))
        return gmm.scaled_grouped_matmul(rows, weights, sizes, scale, interpret=False)

    modules = triton_modules(monkeypatch, product, rows, weights)
    assert len(modules) == 1
    check([compiled(modules[0], gmm._TRITON, tmp_path, "narrow", gpu)], gpu)
