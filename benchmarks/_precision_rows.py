"""float8 training rows for ``accelerator.py --precision fp8``: the example's named step with float8
matmuls (``Precision(..., matmul="float8")``, the default rules) against the same step in bfloat16.

Per size: both steps from the same parameters on the same batches (tokens with a learnable pattern,
so that the loss falls: each row counts up from a random start by strides of 1 to 4, mod the
vocabulary); the largest relative difference of their losses over the first ``loss_steps`` steps,
at single steps and between 10-step running means;
then step times interleaved, tokens/s of each, the speedup, MFU against the measured bfloat16 peak
(float8 runs above it), and how many of the float8 program's GEMMs are cuBLASLt float8 GEMMs
(``__cublas$lt$matmul$f8`` custom calls; on other backends 0).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import _twin as tw
import jax
import jax.numpy as jnp
import numpy as np
from _timing import Budget

import namedaxes as na

POLICIES = {
    "bf16": tw.train_lm.MIXED,
    "fp8": na.nn.Precision("float32", "bfloat16", matmul="float8"),
    "fp8-row": na.nn.Precision("float32", "bfloat16", matmul="float8", scaling="row"),
}
HEADER = ["size", "params", "batch", "step ms bf16 / fp8", "tokens/s bf16 / fp8", "fp8/bf16",
          "MFU % bf16 / fp8", "fp8 GEMMs", "loss rel diff step / 10-mean", "first loss bf16 / fp8",
          "first call s", "rounds"]  # fmt: skip
WIDTHS = [7, 7, 9, 19, 21, 8, 16, 9, 29, 21, 12, 6]


def pattern_batches(size: tw.Size, vocab: int, n: int) -> list[na.NamedArray]:
    """``n`` batches of ``size.seq + 1`` tokens per row: a random start, then strides of 1 to 4."""
    rng = np.random.default_rng(0)
    shape = (n, size.batch, size.seq + 1)
    rows = rng.integers(0, vocab, shape[:2] + (1,)) + np.cumsum(rng.integers(1, 5, shape), -1)
    return [na.named(jnp.asarray(r % vocab, jnp.int32), ("batch", "position")) for r in rows]


def mean_diffs(base: list[float], other: list[float], window: int = 10) -> list[float]:
    """Relative differences of the two curves' ``window``-step running means. A step's loss moves
    with its batch and with every rounding before it (float32 against bfloat16 differ by ~1.6% at
    single steps of the CPU example), so the criterion reads the curves, not single steps."""
    mean = lambda v: np.convolve(v, np.ones(window) / window, mode="valid")  # noqa: E731
    return [abs(a / b - 1) for a, b in zip(mean(other), mean(base))] if len(base) >= window else []


def gemms(hlo: str) -> tuple[int, int]:
    """``(float8 cuBLASLt GEMMs, every cuBLAS GEMM custom call)`` of a compiled program."""
    fp8 = hlo.count('custom_call_target="__cublas$lt$matmul$f8"')
    every = hlo.count('custom_call_target="__cublas$lt$matmul') + hlo.count(
        'custom_call_target="__cublas$gemm"'
    )
    return fp8, every


def precision_row(
    name: str, size: tw.Size, fp8: str, peak: float, budget: Budget, rounds: int,
    per_round: int, loss_steps: int, save_hlo: str | None = None,
) -> list[str]:  # fmt: skip
    """The table's row for ``size``: bfloat16 against the ``fp8`` policy (``fp8``, ``fp8-row``)."""
    opt = tw.optimizer(size)
    cfg = tw.model_config(size, size.vocab)
    mesh = tw.one_device_mesh()
    kinds = ("bf16", fp8)
    steps = {k: tw.train_lm.make_steps(opt, POLICIES[k])[0] for k in kinds}
    with jax.set_mesh(mesh):
        state = tw.train_lm.init_state(cfg, size, opt, seed=0)
    states = {"bf16": state, fp8: jax.tree.map(jnp.copy, state)}  # the steps donate theirs
    count = sum(x.size for x in jax.tree.leaves(state["model"]))
    batches = pattern_batches(size, cfg.vocab_size, max(loss_steps, per_round))

    def step(k: str, tokens: na.NamedArray) -> Any:
        with jax.set_mesh(mesh):
            s = states[k]
            s["model"], s["opt_state"], loss = steps[k](s["model"], s["opt_state"], tokens)
        return loss

    t0 = time.perf_counter()
    with jax.set_mesh(mesh):
        s = states[fp8]
        hlo = steps[fp8].lower(s["model"], s["opt_state"], batches[0]).compile().as_text()
    fp8_gemms, all_gemms = gemms(hlo)
    if save_hlo:
        Path(save_hlo).mkdir(parents=True, exist_ok=True)
        Path(save_hlo, f"{name}-{fp8}.hlo.txt").write_text(hlo)
    first_call = {"bf16": 0.0, fp8: time.perf_counter() - t0}  # fp8's compiled here
    losses: dict[str, list[float]] = {k: [] for k in kinds}
    for k in kinds:
        for i in range(loss_steps):
            t0 = time.perf_counter()
            losses[k].append(float(step(k, batches[i])))
            if i == 0:
                first_call[k] += time.perf_counter() - t0
            if i > 0 and budget.left() <= 0:
                break
    n = min(len(losses[k]) for k in kinds)
    diffs = [abs(a / b - 1) for a, b in zip(losses[fp8][:n], losses["bf16"][:n])]
    rel = max(diffs)
    smooth = max(mean_diffs(losses["bf16"][:n], losses[fp8][:n]), default=rel)
    every = max(1, n // 10)
    curve = ", ".join(
        f"{i}: {losses['bf16'][i]:.3f}/{losses[fp8][i]:.3f}" for i in range(0, n, every)
    )
    print(f"  {name} losses bf16/{fp8} by step: {curve}; largest difference at step "
          f"{diffs.index(rel)} ({losses['bf16'][diffs.index(rel)]:.4f} / "
          f"{losses[fp8][diffs.index(rel)]:.4f})", flush=True)  # fmt: skip

    def run(k: str) -> Any:
        for b in batches[:per_round]:
            loss = step(k, b)
        return loss

    times: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(rounds):
        if r >= 2 and budget.left() <= 0:
            break
        for k in kinds[r % 2 :] + kinds[: r % 2]:
            t0 = time.perf_counter()
            jax.block_until_ready(run(k))
            times[k].append(time.perf_counter() - t0)
    ms = {k: statistics.median(t) / per_round for k, t in times.items()}
    speedup = statistics.median(a / b for a, b in zip(times["bf16"], times[fp8]))
    tokens = size.batch * size.seq
    flops = tw.flops_per_token(cfg, size.seq) * tokens
    return [
        name,
        f"{count / 1e6:.1f}M",
        f"{size.batch}x{size.seq}",
        f"{ms['bf16'] * 1e3:.2f} / {ms[fp8] * 1e3:.2f}",
        f"{tokens / ms['bf16']:,.0f} / {tokens / ms[fp8]:,.0f}",
        f"{speedup:.3f}",
        f"{100 * flops / ms['bf16'] / peak:.1f} / {100 * flops / ms[fp8] / peak:.1f}",
        f"{fp8_gemms}/{all_gemms}",
        f"{rel:.3f} / {smooth:.3f} ({n})",
        f"{losses['bf16'][0]:.4f} / {losses[fp8][0]:.4f}",
        f"{first_call['bf16']:.0f} / {first_call[fp8]:.0f}",
        f"{len(times['bf16'])}",
    ]
