"""``namedaxes.kernels.grouped_matmul`` alone: each implementation and tiling against
``jax.lax.ragged_dot`` and a plain matmul of the same work, to set the GPU defaults
(``GPU_DEFAULT``, ``GPU_TILING``, ``MOSAIC_TILING``, ``MOSAIC_PIPELINE`` in
``namedaxes/kernels/_grouped_matmul.py``).

Run: ``python benchmarks/grouped_matmul.py`` on a GPU (``--quick`` on a CPU checks the script at
tiny sizes, the Pallas kernel in interpret mode; Mosaic GPU rows need a Hopper GPU and say so).

The product is an MoE up projection: ``(tokens x top_k, embed) x (experts, embed, width)``,
bfloat16, rows routed uniformly at random, except that group 1 is empty and the last 37 rows are
past the groups (both edge cases every kernel must get right). Per row: the forward product
alone and forward + both backward products (``jax.vjp`` with a random cotangent), each in
ms (the median of ``--repeats`` runs of ``--calls`` back-to-back calls), the routed work's
TFLOP/s and its share of the bfloat16 peak, and the relative error ``|a - ref| / |ref|`` of the
output and both gradients against float32 ``ragged_dot`` (bfloat16 rounding is ~4e-3). The
"matmul" row is one ``(rows, embed) x (embed, width)`` product: the same FLOPs with no groups,
what a grouped kernel at full speed would take. A row that fails prints its first error line
and the table goes on.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import Budget, per_call  # noqa: E402
from accelerator import failure, peak_bf16  # noqa: E402

from namedaxes.kernels import _grouped_matmul as gm  # noqa: E402
from namedaxes.kernels import grouped_matmul  # noqa: E402

PALLAS_TILINGS = ((64, 64, 128), (128, 64, 128))
# (block rows, contraction, columns), then (pipeline depth, column blocks per sweep).
MOSAIC_CONFIGS = (
    ((128, 64, 128), (4, 8)),
    ((64, 64, 128), (4, 8)),
    ((128, 64, 128), (4, 16)),
    ((128, 64, 128), (3, 8)),
)


def routing(rows: int, experts: int) -> jax.Array:
    choice = jax.random.randint(jax.random.key(3), (rows - 37,), 0, experts)
    sizes = jnp.zeros(experts, jnp.int32).at[choice].add(1)
    return sizes.at[0].add(sizes[1]).at[1].set(0)


def rel_err(a: jax.Array, ref: jax.Array) -> float:
    a, ref = a.astype(jnp.float32), ref.astype(jnp.float32)
    return float(jnp.linalg.norm(a - ref) / jnp.maximum(jnp.linalg.norm(ref), 1e-30))


def timed(fn: Any, args: argparse.Namespace) -> float:
    """ms per call: the median of ``repeats`` runs of ``calls`` back-to-back calls."""
    jax.block_until_ready(fn())
    return statistics.median(per_call(fn, args.calls) for _ in range(args.repeats)) / 1e3


def products(sizes: jax.Array, quick: bool) -> dict[str, Any]:
    """Each implementation and tiling as ``(name, product(lhs, rhs))``: Mosaic GPU first (the
    Hopper default, whose configuration the table sets), then the Triton kernel, then
    ``ragged_dot`` (measured slow on GPUs), so that a short budget drops the least needed rows."""
    out: dict[str, Any] = {}
    for t, pipeline in MOSAIC_CONFIGS[:1] if quick else MOSAIC_CONFIGS:

        def mosaic(a: jax.Array, b: jax.Array, t: Any = t, pipeline: Any = pipeline) -> Any:
            gm.MOSAIC_PIPELINE = pipeline  # read when the product is traced, just below
            return grouped_matmul(a, b, sizes, implementation="mosaic", tiling=t)

        out[f"mosaic {t} {pipeline}"] = mosaic
    tilings = [(16, 16, 16)] if quick else PALLAS_TILINGS
    for t in tilings:
        out[f"pallas {t}"] = lambda a, b, t=t: grouped_matmul(
            a, b, sizes, implementation="pallas", tiling=t
        )
    out["ragged_dot"] = lambda a, b: jax.lax.ragged_dot(a, b, sizes)
    return out


def rows_for(
    experts: int, args: argparse.Namespace, peak: float, budget: Budget
) -> dict[str, float]:
    """Prints the rows for ``experts``; returns each product's forward+backward ms."""
    rows, embed, width = args.tokens * args.top_k, args.embed, args.width
    keys = jax.random.split(jax.random.key(2), 3)
    lhs = jax.random.normal(keys[0], (rows, embed), jnp.bfloat16)
    rhs = jax.random.normal(keys[1], (experts, embed, width), jnp.bfloat16) * embed**-0.5
    cot = jax.random.normal(keys[2], (rows, width), jnp.bfloat16)
    sizes = routing(rows, experts)
    flops_fwd = 2.0 * (rows - 37) * embed * width

    def both(product: Any) -> Any:
        @jax.jit
        def f(a: jax.Array, b: jax.Array) -> Any:
            out, vjp = jax.vjp(product, a, b)
            return (out, *vjp(cot.astype(out.dtype)))

        return f

    f32 = [x.astype(jnp.float32) for x in (lhs, rhs)]
    with jax.default_matmul_precision("highest"):
        ref = both(lambda a, b: jax.lax.ragged_dot(a, b, sizes))(*f32)
    plain = {"matmul (same FLOPs, no groups)": lambda a, b: a @ b[0]}
    times: dict[str, float] = {}
    for name, product in {**plain, **products(sizes, args.quick)}.items():
        if budget.left() <= 0:
            print(f"| {experts} | {name} | skipped (budget) |")
            continue
        try:
            fwd, grads = jax.jit(product), both(product)
            err = "-"
            if not name.startswith("matmul"):
                got = grads(lhs, rhs)
                err = " / ".join(f"{rel_err(a, b):.0e}" for a, b in zip(got, ref))
            t_fwd = timed(lambda: fwd(lhs, rhs), args)
            t_all = timed(lambda: grads(lhs, rhs), args)
        except Exception as e:  # noqa: BLE001 - one kernel failing must not end the table
            print(f"| {experts} | {name} | failed: {failure(e)} |", flush=True)
            continue
        times[name] = t_all
        tflops = 3 * flops_fwd / t_all / 1e9
        print(
            f"| {experts} | {name} | {t_fwd:.3f} | {t_all:.3f} | {tflops:.0f} "
            f"| {100 * tflops * 1e12 / peak:.0f} | {err} |",
            flush=True,
        )
    return times


def mosaic_option(config: tuple[tuple[int, int, int], tuple[int, int]]) -> str:
    """A Mosaic configuration as ``--mosaic`` takes it: ``rows,contraction,columns,depth,sweep``."""
    return ",".join(str(v) for v in (*config[0], *config[1]))


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CPU check)")
    parser.add_argument("--experts", type=_ints, help="expert counts (default 8,64)")
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--calls", type=int, default=10, help="back-to-back calls per timing")
    parser.add_argument("--repeats", type=int, default=3, help="timings per row (median)")
    parser.add_argument("--peak", type=float, help="bfloat16 peak TFLOP/s (default: measured)")
    parser.add_argument("--budget", type=float, default=300.0, help="seconds for all rows")
    args = parser.parse_args()
    args.tokens, args.embed, args.width = (96, 64, 64) if args.quick else (8192, 1024, 2048)
    if args.quick:
        args.calls, args.repeats = 1, 1
    experts = args.experts or ([4] if args.quick else [8, 64])
    peak = 1e12 * args.peak if args.peak else peak_bf16(Budget(20.0))
    device = jax.devices()[0]
    print(
        f"backend {jax.default_backend()} ({device.device_kind}, compute capability "
        f"{getattr(device, 'compute_capability', '-')}), jax {jax.__version__}; "
        f"{args.tokens} tokens x top-{args.top_k}, embed {args.embed}, width {args.width}, "
        f"bfloat16 peak {peak / 1e12:.0f} TFLOP/s; default implementation for bfloat16: "
        f"{gm._default_implementation(jax.default_backend(), jnp.bfloat16)}\n"
    )
    print(
        "| experts | product | fwd ms | fwd+bwd ms | TFLOP/s | % of peak "
        f"| error out / d lhs / d rhs |\n|{'---|' * 7}"
    )
    budget = Budget(args.budget)
    slowest: dict[str, float] = {}  # each product's time at the expert count it ran slowest
    for n in experts:
        for name, t in rows_for(n, args, peak, budget).items():
            slowest[name] = max(slowest.get(name, 0.0), t)
    mosaic = {c: slowest[f"mosaic {c[0]} {c[1]}"] for c in MOSAIC_CONFIGS
              if f"mosaic {c[0]} {c[1]}" in slowest}  # fmt: skip
    if mosaic:  # the session script passes this on to the MoE benchmarks (--mosaic)
        print(f"\nbest mosaic: {mosaic_option(min(mosaic, key=mosaic.__getitem__))}")


if __name__ == "__main__":
    main()
