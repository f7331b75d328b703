"""Long-context rows for ``accelerator.py --sizes 1b-32k,1b-64k``: the example's named training step
on one sequence of 32k or 64k tokens per remat policy, with the device's peak memory.

Per (size, policy): step time, tokens/s, model FLOP/s and MFU (the example's ``flops_per_token``,
whose causal attention term grows with the sequence: at 32k it is about as large as the matmuls'),
the device's peak memory (``memory_stats()["peak_bytes_in_use"]``; "n/a" where the backend keeps
none, as the CPU), which attention kernel the step lowered to (``cudnn``: the fused causal kernel;
``xla``: scores materialized, which at 32k tokens cannot fit), the first loss and the first call's
seconds. Only the namedaxes model runs: the plain twin would double the time and has no remat
policies beyond ``dots`` and ``carry``.

The device's peak is a high-water mark of the whole process, which JAX cannot reset: a row that
raised it shows its own peak; a row that stayed under an earlier row's peak shows ``<= that``.
List the policies from the least memory to the most (``full,offload,carry,dots,none``) so that
every row's figure is its own.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import _twin as tw
import jax
from _timing import Budget, interleaved

HEADER = ["size", "remat", "params", "batch", "step ms", "tokens/s", "TFLOP/s", "MFU %",
          "peak GiB", "attention", "first loss", "first call s", "rounds"]  # fmt: skip
WIDTHS = [14, 7, 7, 8, 9, 8, 7, 5, 8, 9, 10, 12, 6]


def device_peak() -> int | None:
    """The first device's peak bytes in use so far (``None`` where the backend does not say)."""
    stats = jax.devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    return None if peak is None else int(peak)


def device_limit() -> str:
    """The first device's memory for the table's title ("" where the backend does not say)."""
    limit = (jax.devices()[0].memory_stats() or {}).get("bytes_limit")
    return "" if limit is None else f", device memory {limit / 2**30:.1f} GiB"


def attention_kernel(lowered: str) -> str:
    """What the step's attention lowered to: cuDNN's fused kernel, or XLA's materialized scores."""
    return "cudnn" if "cudnn$fmha" in lowered else "xla"


def long_context_row(
    name: str, size: tw.Size, peak: float, budget: Budget, rounds: int, per_round: int
) -> list[str]:  # noqa: E501
    """The table's row for ``size`` (its ``remat`` is the policy): the example's named step."""
    before = device_peak()
    opt = tw.optimizer(size)
    step = tw.train_lm.make_steps(opt, tw.train_lm.MIXED)[0]
    cfg = tw.model_config(size, size.vocab)
    mesh = tw.one_device_mesh()
    with jax.set_mesh(mesh):
        state = tw.train_lm.init_state(cfg, size, opt, seed=0)
    count = sum(x.size for x in jax.tree.leaves(state["model"]))
    batches = [tw.named_batch(t) for t in tw.batches(size, per_round)]

    def run() -> Any:
        with jax.set_mesh(mesh):
            for b in batches:
                state["model"], state["opt_state"], loss = step(
                    state["model"], state["opt_state"], b
                )
        return loss

    t0 = time.perf_counter()
    with jax.set_mesh(mesh):  # lowering only: the first call compiles
        lowered = step.lower(state["model"], state["opt_state"], batches[0]).as_text()
        state["model"], state["opt_state"], loss = step(
            state["model"], state["opt_state"], batches[0]
        )
    first_loss = float(loss)
    first_call = time.perf_counter() - t0
    times = interleaved({"named": run}, budget, rounds)["named"]
    after = device_peak()
    if after is None:
        memory = "n/a"
    elif before is None or after > before:
        memory = f"{after / 2**30:.1f}"
    else:
        memory = f"<= {after / 2**30:.1f}"  # under an earlier row's high-water mark
    ms = statistics.median(times) / per_round
    tokens = size.batch * size.seq
    flops = tw.flops_per_token(cfg, size.seq) * tokens
    return [
        name, str(size.remat), f"{count / 1e6:.1f}M", f"{size.batch}x{size.seq}",
        f"{ms * 1e3:.1f}", f"{tokens / ms:,.0f}", f"{flops / ms / 1e12:.1f}",
        f"{100 * flops / ms / peak:.1f}", memory, attention_kernel(lowered),
        f"{first_loss:.4f}", f"{first_call:.0f}", str(len(times)),
    ]  # fmt: skip
