"""Lower a function's Pallas kernels for CUDA on this CPU and run MLIR's verifier on each Triton
module, as XLA does when a GPU parses them (``Failed to parse Triton module: ...``).

Lowering alone does not verify the modules Pallas builds, so a kernel can lower here and still be
refused by the first GPU that compiles it; this catches that class of failure without a GPU. It
reaches into Pallas's private Triton lowering (the one place the module exists as an object);
if that moves, the tests using it fail loudly rather than pass unchecked.
"""

import jax
from jax._src.pallas.triton import lowering as triton_lowering


def verified_triton_modules(monkeypatch, fn, *args):
    """Lower ``jax.jit(fn)(*args)`` for CUDA; return ``(module count, [verifier errors])``."""
    built, errors = [], []
    lower = triton_lowering.lower_jaxpr_to_triton_module

    def lower_and_verify(*a, **k):
        result = lower(*a, **k)
        built.append(result)
        try:
            result.module.operation.verify()
        except Exception as e:  # MLIR raises its own error type: keep the text
            errors.append(str(e).splitlines()[1] if "\n" in str(e) else str(e))
        return result

    monkeypatch.setattr(triton_lowering, "lower_jaxpr_to_triton_module", lower_and_verify)
    jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
    return len(built), errors
