"""nn.MoE's dispatches on one device: which is fastest, and how close to the routed work's floor?
Decides what ``dispatch="auto"`` should pick on each backend.

Run: ``python benchmarks/moe_dispatch.py`` on a GPU or TPU (``--quick`` for a CPU check of the
script: tiny sizes, where only agreement means anything; ``grouped`` runs in Pallas interpret mode
there, slowly).

For each expert count (8, 32, 64, 128) and top-k (2, 8), a bfloat16 MoE layer (float32
parameters, SwiGLU experts, softmax routing renormalised over the top-k) runs forward and backward
on a batch of tokens with each dispatch: ``dense``, ``ragged`` (``jax.lax.ragged_dot``),
``grouped`` (``namedaxes.kernels.grouped_matmul``) and ``capacity`` (GShard slots, one batched
matmul, at ``--capacity-factor``). Printed per row: the median time of a forward+backward step;
the *active* TFLOP/s, the routed work only (``6 x tokens x top_k x 3 x embed x width``: the three
expert projections of the choices, forward and backward; the router and the dense or padded
extra work not counted) over that time, and its share of the bfloat16 peak (``--peak`` in
TFLOP/s, else measured as ``benchmarks/accelerator.py`` does); the largest difference of the
output and of the router gradient from ``dense`` with the same capacity (relative to their
scale); and what XLA compiled the expert products to (custom calls, ragged-dot and dot ops).

The kernel alone, per implementation and tiling: ``benchmarks/grouped_matmul.py``. ``--budget``
bounds the whole run: rows past it are skipped. A row that fails (a kernel this device cannot
compile) prints its first error line and the table goes on.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import Budget, clock  # noqa: E402
from accelerator import failure, peak_bf16  # noqa: E402

import namedaxes as na  # noqa: E402
from namedaxes.kernels import _grouped_matmul as gm  # noqa: E402

DISPATCHES = ("dense", "ragged", "grouped", "capacity")


def step_fn(moe: na.nn.MoE, x: na.NamedArray) -> tuple[jax.Array, jax.Array]:
    def loss(moe: na.nn.MoE) -> tuple[jax.Array, jax.Array]:
        with na.nn.precision("params=float32,compute=bfloat16"):
            y, stats = moe(x)
        out = y.array.astype(jnp.float32)
        return jnp.mean(out**2) + 0.01 * stats.load_balancing_loss(), out

    (_, out), grads = eqx.filter_value_and_grad(loss, has_aux=True)(moe)
    return out, grads.router.weight.array


def compiled_to(hlo: str) -> str:
    calls = sorted(set(re.findall(r'custom_call_target="([^"]+)"', hlo)))
    dots = len(re.findall(r"\bdot\(", hlo))
    ragged = len(re.findall(r"\bragged-dot\(", hlo))
    return f"custom calls {calls or '-'}, {ragged} ragged-dot, {dots} dot"


def set_mosaic(option: str | None) -> None:
    """Sets the Mosaic GPU kernel's blocks from a ``--mosaic`` value (the benchmarks' override of
    ``MOSAIC_TILING`` and ``MOSAIC_PIPELINE``); ``None`` keeps the defaults."""
    if option:
        values = tuple(int(v) for v in option.split(","))
        gm.MOSAIC_TILING, gm.MOSAIC_PIPELINE = values[:3], values[3:5]


def active_flops(tokens: int, top_k: int, embed: int, width: int) -> float:
    """The routed work of a forward and backward step: 3 gated-MLP projections per choice."""
    return 6.0 * tokens * top_k * 3 * embed * width


def rel_diff(a: Any, b: Any) -> float:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def moe_rows(args: argparse.Namespace, peak: float, budget: Budget) -> None:
    tokens, embed, width = args.tokens, args.embed, args.width
    x = na.random.normal(jax.random.key(0), {"batch": 8, "position": tokens // 8, "embed": embed})
    print(
        f"| experts | top-k | dispatch | ms | active TFLOP/s | % of peak | diff out | diff grad "
        f"| compiled to |\n|{'---|' * 9}"
    )
    for n in args.experts:
        for k in args.top_k:
            flops = active_flops(tokens, k, embed, width)
            refs: dict[float | None, Any] = {}
            for dispatch in args.dispatches:
                if budget.left() <= 0:
                    print(f"| {n} | {k} | {dispatch} | skipped (budget) |")
                    continue
                capacity = args.capacity_factor if dispatch == "capacity" else None
                make = lambda d: na.nn.MoE(  # noqa: E731
                    {"embed": embed}, na.Axis("experts", n), {"expert_mlp": width}, top_k=k,
                    key=jax.random.key(1), dispatch=d, normalize=True, capacity_factor=capacity,
                )  # fmt: skip
                step = eqx.filter_jit(step_fn)
                try:
                    moe = make(dispatch)
                    out = jax.block_until_ready(step(moe, x))
                    if capacity not in refs:  # dense with the same capacity: the reference
                        ref = out if dispatch == "dense" else step(make("dense"), x)
                        refs[capacity] = jax.block_until_ready(ref)
                    times = [clock(lambda: step(moe, x)) for _ in range(args.steps)]
                    how = ""
                    if dispatch in ("ragged", "grouped"):  # a second compile: only where it tells
                        how = compiled_to(step.lower(moe, x).lowered.compile().as_text())
                except Exception as e:  # noqa: BLE001 - one row failing must not end the table
                    print(f"| {n} | {k} | {dispatch} | {failure(e)} |", flush=True)
                    continue
                t = statistics.median(times)
                (y, g), (y_ref, g_ref) = out, refs[capacity]
                print(
                    f"| {n} | {k} | {dispatch} | {t * 1e3:.2f} | {flops / t / 1e12:.1f} "
                    f"| {100 * flops / t / peak:.1f} | {rel_diff(y, y_ref):.1e} "
                    f"| {rel_diff(g, g_ref):.1e} | {how} |",
                    flush=True,
                )


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", "--small", action="store_true", help="tiny sizes (CPU check)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per row")
    parser.add_argument("--experts", type=_ints, help="expert counts, e.g. 8,32,64,128")
    parser.add_argument("--top-k", type=_ints, help="top-k values, e.g. 2,8")
    parser.add_argument("--dispatches", type=lambda s: s.split(","), default=list(DISPATCHES))
    parser.add_argument("--capacity-factor", type=float, default=1.25)
    parser.add_argument("--peak", type=float, help="bfloat16 peak TFLOP/s (default: measured)")
    parser.add_argument("--budget", type=float, default=600.0, help="seconds for all rows")
    parser.add_argument("--mosaic", help="Mosaic GPU blocks: rows,contraction,columns,depth,sweep")
    args = parser.parse_args()
    args.tokens, args.embed, args.width = (256, 64, 64) if args.quick else (8192, 1024, 2048)
    args.experts = args.experts or ([8] if args.quick else [8, 32, 64, 128])
    args.top_k = args.top_k or [2, 8]
    peak = 1e12 * args.peak if args.peak else peak_bf16(Budget(20.0))
    print(
        f"grouped: Mosaic GPU blocks {gm.MOSAIC_TILING if args.mosaic is None else args.mosaic}, "
        f"pipeline {gm.MOSAIC_PIPELINE}; "
        f"backend {jax.default_backend()} ({jax.devices()[0].device_kind}), {args.tokens} tokens, "
        f"embed {args.embed}, expert width {args.width}, bfloat16 peak {peak / 1e12:.1f} TFLOP/s "
        f"({'given' if args.peak else 'measured'}), capacity factor {args.capacity_factor}"
    )
    set_mosaic(args.mosaic)
    budget = Budget(args.budget)
    moe_rows(args, peak, budget)


if __name__ == "__main__":
    main()
