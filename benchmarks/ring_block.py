"""One ring block's attention, forward + backward with its log-sum-exp, per kernel (issue 30 item 1).

Run on a GPU from the repository root: ``python benchmarks/ring_block.py`` (``--quick``: tiny CPU
sizes, where the Pallas kernel runs in interpret mode and only the agreement column means
anything). Per block of ``T`` queries and ``T`` keys (2k/4k/8k on a GPU), bfloat16, 16 heads x 64,
two masks: ``causal`` (a shard's own block: the diagonal, offset 0) and ``full`` (an earlier
shard's block, which every query sees whole):

* ``pallas``: the ring's own block code with ``implementation="pallas"``
  (``namedaxes.nn._ring._block_forward`` then ``_block_backward`` given the log-sum-exp and
  ``delta``), i.e. ``namedaxes.kernels.flash_attention``'s three Triton kernels, once per
  ``--pallas`` configuration (query block, key block, warps, stages; the first is the kernel's
  default), so one run on a GPU also picks the default;
* ``cudnn``: ``jax.nn.dot_product_attention(implementation="cudnn")`` forward + backward of the same
  block (which returns no log-sum-exp: the bar the ring's kernel is measured against, issue 30
  wants pallas/cudnn <= 1.3);
* ``xla``: the ring's block code with the XLA kernel (today's default).

Prints a markdown table: block, mask, each kernel's median ms, the fastest Pallas configuration
against cuDNN, and the largest difference of the Pallas gradients from the XLA ones (relative to
their largest magnitude); then the configuration fastest over all rows.
Failing cells print their first error line (``accelerator.failure``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import Budget, interleaved  # noqa: E402
from accelerator import failure  # noqa: E402

from namedaxes.kernels import _flash_attention as flash  # noqa: E402
from namedaxes.nn import _attention_kernels as kernels  # noqa: E402
from namedaxes.nn import _ring as ring  # noqa: E402

# (query block, key block, warps, stages) of the Pallas kernel: the default first.
DEFAULT_PALLAS = (*flash.GPU_BLOCKS, flash._TRITON.num_warps, flash._TRITON.num_stages)  # noqa: SLF001
SWEEP = "64,64,4,2;128,64,4,2;128,64,8,3;128,128,8,2"


def configured(config: tuple[int, int, int, int], fn: Any) -> Any:
    """``fn`` called with the Pallas kernel's blocks and Triton options set to ``config`` (read
    while tracing: each configuration's jitted function compiles its own)."""

    def call(*args: Any) -> Any:
        saved = flash.GPU_BLOCKS, flash._TRITON  # noqa: SLF001
        flash.GPU_BLOCKS = config[:2]
        flash._TRITON = flash.plgpu.CompilerParams(num_warps=config[2], num_stages=config[3])  # noqa: SLF001
        try:
            return fn(*args)
        finally:
            flash.GPU_BLOCKS, flash._TRITON = saved  # noqa: SLF001

    return call


def label(config: tuple[int, int, int, int]) -> str:
    return "pallas {}x{} w{} s{}".format(*config)


def ring_block(impl: str, causal: bool) -> Any:
    """Compiled ``(q, k, v, do) -> (dq, dk, dv)`` of one ring block by the ring's code."""

    def f(q: jax.Array, k: jax.Array, v: jax.Array, do: jax.Array) -> Any:
        b, t, n, h = q.shape
        kv = k.shape[2]
        call = kernels.KernelCall(
            q=q, k=k, v=v, scale=h**-0.5, causal=causal, window=None, offset=0, padding=None,
            mask=None,
        )  # fmt: skip
        out, lse = ring._block_forward(call, impl)  # noqa: SLF001
        dg = do.astype(jnp.float32).reshape(b, t, kv, n // kv, h)
        delta = jnp.moveaxis(jnp.sum(dg * out, axis=-1), 1, 3)
        return ring._block_backward(call, impl, dg, lse, delta)  # noqa: SLF001

    return jax.jit(f)


def cudnn_block(causal: bool) -> Any:
    def f(q: jax.Array, k: jax.Array, v: jax.Array, do: jax.Array) -> Any:
        def attend(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
            return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="cudnn")

        _, vjp = jax.vjp(attend, q, k, v)
        return vjp(do)

    return jax.jit(f)


def row(t: int, causal: bool, args: Any, budget: Budget, rounds: int) -> tuple[list[str], Any]:
    """The table's row, and each Pallas configuration's median seconds."""
    b, heads, dim, dtype = args.batch, args.heads, args.head_dim, args.dtype
    keys = jax.random.split(jax.random.key(t), 4)
    q, k, v, do = (jax.random.normal(x, (b, t, heads, dim), dtype) for x in keys)
    fns = {label(c): configured(c, ring_block("pallas", causal)) for c in args.pallas}
    fns["cudnn"], fns["xla"] = cudnn_block(causal), ring_block("xla", causal)
    slots, cells, grads = {}, {}, {}
    for impl, fn in fns.items():
        if impl == "cudnn" and jax.default_backend() != "gpu":
            cells[impl] = "needs a GPU"
            continue
        try:
            grads[impl] = jax.block_until_ready(fn(q, k, v, do))  # compile, and the values
            slots[impl] = lambda fn=fn: fn(q, k, v, do)
        except Exception as e:  # noqa: BLE001 - a failing cell prints its first error line
            cells[impl] = failure(e)
    times = interleaved(slots, budget, rounds) if slots else {}
    median = {impl: statistics.median(ts) for impl, ts in times.items()}
    for impl, m in median.items():
        cells[impl] = f"{m * 1e3:.2f}"
    pallas = {i: m for i, m in median.items() if i.startswith("pallas")}
    best = min(pallas, key=pallas.get) if pallas else None
    ratio = "n/a"
    if best and "cudnn" in median:
        ratio = f"{pallas[best] / median['cudnn']:.2f} ({best[7:]})"
    error = "n/a"
    if best and "xla" in grads:
        error = f"{max(_rel(a, w) for a, w in zip(grads[best], grads['xla'])):.1e}"
    mask = "causal" if causal else "full"
    return [f"{t}", mask, *(cells[i] for i in fns), ratio, error], pallas


def _rel(a: jax.Array, want: jax.Array) -> float:
    a, want = np.asarray(a, np.float32), np.asarray(want, np.float32)
    return float(np.abs(a - want).max() / max(np.abs(want).max(), 1e-30))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", default=None, help="block lengths (default 2048,4096,8192)")
    p.add_argument("--heads", type=int, default=None)
    p.add_argument("--head-dim", type=int, default=None)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--budget", type=float, default=75.0, help="seconds for the whole table")
    p.add_argument("--quick", action="store_true", help="tiny CPU sizes (interpret mode)")
    p.add_argument("--pallas", default=None,
                   help=f"Pallas configurations 'bq,bk,warps,stages;...' (default {SWEEP})")  # fmt: skip
    args = p.parse_args()
    quick = args.quick
    tokens = args.tokens or ("32,64" if quick else "2048,4096,8192")
    args.heads = args.heads or (2 if quick else 16)
    args.head_dim = args.head_dim or (16 if quick else 64)
    args.dtype = jnp.float32 if quick else jnp.bfloat16
    sweep = args.pallas or ("16,16,4,2;32,16,4,2" if quick else SWEEP)
    configs = [tuple(int(x) for x in c.split(",")) for c in sweep.split(";")]
    args.pallas = list(dict.fromkeys([DEFAULT_PALLAS, *configs]))
    budget = Budget(args.budget)
    print(
        f"ring block forward+backward (with the log-sum-exp), {jnp.dtype(args.dtype).name}, "
        f"batch {args.batch}, {args.heads} heads x {args.head_dim}, {jax.devices()[0].device_kind}"
    )
    header = ["block", "mask", *(f"{label(c)} ms" for c in args.pallas), "cudnn ms", "xla ms",
              "best pallas/cudnn", "pallas err"]  # fmt: skip
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    totals: dict[str, list[float]] = {}
    for t in (int(x) for x in tokens.split(",")):
        for causal in (True, False):
            if budget.left() <= 0:
                print(f"| {t} | {'causal' if causal else 'full'} | skipped: out of budget |")
                continue
            cells, pallas = row(t, causal, args, budget, args.rounds)
            print("| " + " | ".join(cells) + " |", flush=True)
            for impl, m in pallas.items():
                totals.setdefault(impl, []).append(m)
    complete = {i: sum(ms) for i, ms in totals.items() if len(ms) == max(map(len, totals.values()))}
    if complete:
        print(f"fastest Pallas configuration over the rows: {min(complete, key=complete.get)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
