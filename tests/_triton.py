"""Lower a function's Pallas kernels for CUDA on this CPU and look at each Triton module: run
MLIR's verifier on it, as XLA does when a GPU parses it (``Failed to parse Triton module: ...``),
or hand its text to the ``triton`` package to compile for a GPU (``test_triton_compile.py``).

Lowering alone does not verify the modules Pallas builds, so a kernel can lower here and still be
refused by the first GPU that compiles it; this catches that class of failure without a GPU. It
reaches into Pallas's private Triton lowering (the one place the module exists as an object);
if that moves, the tests using it fail loudly rather than pass unchecked.
"""

import jax
from jax._src.pallas.triton import lowering as triton_lowering


def triton_modules(monkeypatch, fn, *args):
    """Lower ``jax.jit(fn)(*args)`` for CUDA; return each Triton module Pallas built (MLIR)."""
    built = []
    lower = triton_lowering.lower_jaxpr_to_triton_module

    def keep(*a, **k):
        result = lower(*a, **k)
        built.append(result.module)
        return result

    monkeypatch.setattr(triton_lowering, "lower_jaxpr_to_triton_module", keep)
    jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
    return built


def verified_triton_modules(monkeypatch, fn, *args):
    """Lower ``jax.jit(fn)(*args)`` for CUDA; return ``(module count, [verifier errors])``."""
    errors = []
    modules = triton_modules(monkeypatch, fn, *args)
    for module in modules:
        try:
            module.operation.verify()
        except Exception as e:  # MLIR raises its own error type: keep the text
            errors.append(str(e).splitlines()[1] if "\n" in str(e) else str(e))
    return len(modules), errors
