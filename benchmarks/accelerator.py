"""Accelerator speed: the example's language model in namedaxes against its plain-JAX twin, and attention.

Run on a GPU (or TPU) machine from the repository root:

    python benchmarks/accelerator.py              # peak matmul, attention, sizes example/100m/1b
    python benchmarks/accelerator.py --quick      # fewer rounds; 1b and 16k-token attention skipped
    python benchmarks/accelerator.py --sizes 100m --rounds 5
    python benchmarks/accelerator.py --check      # cuDNN attention numerics against XLA, then exit
    python benchmarks/accelerator.py --precision fp8   # float8 matmuls vs bfloat16: 100m/1b/8b-wide
    python benchmarks/accelerator.py --sizes 1b-32k,1b-64k --remat carry,dots   # long context

On a CPU it runs tiny sizes (the same code) in well under a minute; only ratios mean anything there.

Both models are ``examples/train_lm.py``'s Llama-style ``namedaxes.models.Transformer`` (RMSNorm,
rotary embeddings, SwiGLU, grouped-query attention, a tied output head), trained with the example's
optax AdamW on random tokens: namedaxes runs the example's own ``na.fsdp`` step on a one-device mesh
under ``Precision(param=float32, compute=bfloat16)`` with ``Transformer(gradient_checkpointing=)``;
its plain twin (``benchmarks/_twin.py``) starts from the same float32 parameters (the named model's
arrays), casts them to bfloat16 where used, and runs ``lax.scan`` + ``jax.checkpoint`` with the same
policy and ``jax.nn.dot_product_attention`` on the same grouped-query layout (cuDNN on GPUs).
Sections, each with a hard time budget (checked between rounds; a section out of time reports what
it measured):

* peak: the device's measured bfloat16 matmul throughput (the MFU denominator);
* attention: forward + backward of causal bfloat16 attention, 16 heads x 64, at 4k and 16k tokens:
  ``namedaxes.nn.dot_product_attention`` against a direct ``jax.nn.dot_product_attention`` call;
* one row per model size (the example's presets ``small`` as "example", ``100m`` and ``1b``, at
  2048 tokens per row: see ``GPU_SIZES``): step time, tokens/s, model FLOP/s (the example's
  ``flops_per_token``: 6 x the matmuls' parameters plus causal attention; remat recomputation not
  counted), MFU, the interleaved median step-time ratio namedaxes / plain and plain / plain (A/A:
  the plain step timed in a second slot of every round), and both first losses.

``--remat`` takes several ``gradient_checkpointing`` policies (a row each; default ``dots``).
The long-context sizes ``1b-32k`` and ``1b-64k`` (one sequence of 32k or 64k tokens; on a CPU
``example-long`` and ``example-longer``, 512 and 1024) run only when ``--sizes`` names them, in a
table of their own (``_long_context.py``): the named step alone, per policy (default the size's
own: ``dots`` at 32k, ``carry`` at 64k), with the device's peak memory and the attention kernel
the step lowered to; the attention section runs only for the other sizes.

``--precision fp8`` (or ``fp8-row``: row scaling) replaces the attention section and the training
table with one of the named step under float8 matmuls against the same step in bfloat16
(``_precision_rows.py``): loss agreement over ``--loss-steps`` steps from the same parameters,
step times, the speedup and the float8 GEMMs in the compiled program; on an accelerator for
``100m``, ``1b`` and ``8b-wide`` (hidden 4096, MLP 14336, 32 query / 8 key-value heads of 128,
``--wide-layers`` layers: an 8B model's width on one GPU).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import io
import logging
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _twin as tw  # noqa: E402  (the example's model and its plain twin)
from _long_context import HEADER as LONG_HEADER  # noqa: E402
from _long_context import WIDTHS as LONG_WIDTHS  # noqa: E402
from _long_context import device_limit, long_context_row  # noqa: E402
from _precision_rows import HEADER as PRECISION_HEADER  # noqa: E402
from _precision_rows import POLICIES as PRECISION_POLICIES  # noqa: E402
from _precision_rows import WIDTHS as PRECISION_WIDTHS  # noqa: E402
from _precision_rows import precision_row  # noqa: E402
from _timing import Budget, clock, interleaved  # noqa: E402

import namedaxes as na  # noqa: E402
from namedaxes.nn import _attention_kernels as kernels  # noqa: E402
from namedaxes.nn._stacked import REMAT_POLICIES  # noqa: E402

POLICY = tw.train_lm.MIXED  # the example's on accelerators: float32 parameters, bfloat16 compute
BF16, F32 = jnp.bfloat16, jnp.float32


def _at(name: str, **changes: Any) -> tw.Size:
    return dataclasses.replace(tw.SIZES[name], **changes)


GPU_SIZES = {
    # The example's presets at a real sequence length; the default one ("small") has a
    # vocabulary of 2048 (a BPE trained on the standard library's source).
    "example": _at("small", seq=2048, batch=16),
    "100m": _at("100m", seq=2048, batch=8),
    "1b": _at("1b", seq=2048, batch=4),
    # An 8B model's width (Llama 3 8B: hidden 4096, MLP 14336, GQA 32/8 of 128) with fewer layers,
    # so that it trains on one 80 GB GPU (--wide-layers).
    "8b-wide": _at(
        "1b",
        hidden=4096,
        mlp=14336,
        heads=32,
        kv_heads=8,
        head_dim=128,
        layers=12,
        seq=2048,
        batch=2,
    ),  # fmt: skip
}
CPU_SIZES = {
    "example": _at("small", seq=64, batch=8),
    "wide": _at("small", hidden=256, heads=8, kv_heads=4, mlp=768, seq=128, batch=4),
}
# One long sequence on one device (issue 30): named step only, peak memory per remat policy
# (_long_context.py). Not run unless --sizes names them. The 1b's policy is "dots"; at 64k the
# matmul outputs it keeps are ~49 GB (16 layers x 47 KB a token), which with the optimizer state
# and the output head's float32 log-probabilities does not fit 80 GB: 64k keeps each layer's input.
LONG_GPU_SIZES = {
    "1b-32k": _at("1b", seq=32768, batch=1),
    "1b-64k": _at("1b", seq=65536, batch=1, remat="carry"),
}
LONG_CPU_SIZES = {  # the same code at CPU sizes
    "example-long": _at("small", seq=512, batch=1, remat="dots"),
    "example-longer": _at("small", seq=1024, batch=1, remat="carry"),
}
LONG = {**LONG_GPU_SIZES, **LONG_CPU_SIZES}


def platform() -> str:
    return jax.default_backend()


def on_accelerator() -> bool:
    return platform() in ("gpu", "tpu")


def attention_kernel() -> str | None:
    """What the plain twin asks ``jax.nn.dot_product_attention`` for (cuDNN on GPUs)."""
    return "cudnn" if platform() == "gpu" else None


def out_of_memory(e: Exception) -> bool:
    text = str(e)
    return "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()


def failure(e: Exception) -> str:
    """A failed row's cell: "out of memory", else the error's type and its first line."""
    if out_of_memory(e):
        return "out of memory"
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:100] if lines else ''}"


class Stream:
    """A table printed row by row (a run cut short keeps what it printed), fixed column widths."""

    def __init__(self, title: str, header: list[str], widths: list[int]):
        self.widths = [max(w, len(h)) for h, w in zip(header, widths)]
        line = "  ".join("-" * w for w in self.widths)
        print(f"\n{title}\n{line}")
        self.row(header)
        print(line)

    def row(self, cells: list[str]) -> None:
        print("  ".join(str(c).rjust(w) for c, w in zip(cells, self.widths)))
        sys.stdout.flush()


def table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    line = "  ".join("-" * w for w in widths)
    print(f"\n{title}\n{line}")
    print("  ".join(str(h).rjust(w) for h, w in zip(header, widths)))
    print(line)
    for r in rows:
        print("  ".join(str(c).rjust(w) for c, w in zip(r, widths)))
    sys.stdout.flush()


# -- peak -----------------------------------------------------------------------------------------


def peak_bf16(budget: Budget) -> float:
    """The best measured bfloat16 matmul FLOP/s over a few square sizes."""
    sizes = (4096, 8192) if on_accelerator() else (512,)
    best = 0.0
    for n in sizes:
        a = jax.random.normal(jax.random.key(0), (n, n), BF16)
        b = jax.random.normal(jax.random.key(1), (n, n), BF16)
        reps = 10

        @jax.jit
        def chain(a: jax.Array, b: jax.Array) -> jax.Array:
            def body(_: int, x: jax.Array) -> jax.Array:
                return (x @ b) * jnp.asarray(1e-2, BF16)  # keep the values finite

            return jax.lax.fori_loop(0, reps, body, a)

        clock(lambda: chain(a, b))
        for _ in range(5):
            t = clock(lambda: chain(a, b))
            best = max(best, reps * 2 * n**3 / t)
            if budget.left() <= 0:
                break
    return best


# -- attention ------------------------------------------------------------------------------------


def attention_fwd_bwd(budget: Budget, tokens: list[int], rounds: int) -> list[list[str]]:
    heads, head_dim = (16, 64) if on_accelerator() else (4, 32)
    rows = []
    for t in tokens:
        if budget.left() <= 0:
            rows.append([f"{t}", "skipped (budget)", "", "", "", ""])
            continue
        keys = jax.random.split(jax.random.key(0), 4)
        shape = (1, t, heads, head_dim)
        q, k, v, g = (jax.random.normal(kk, shape, BF16) for kk in keys)
        names = ("batch", "position", "heads", "head_dim")
        kv_names = ("batch", "key_position", "heads", "head_dim")

        def named_loss(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
            out = na.nn.dot_product_attention(
                na.named(q, names), na.named(k, kv_names), na.named(v, kv_names), causal=True
            )
            return jnp.sum(out.array.astype(F32) * g.astype(F32))

        def direct_loss(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
            out = jax.nn.dot_product_attention(
                q, k, v, is_causal=True, implementation=attention_kernel()
            )
            return jnp.sum(out.astype(F32) * g.astype(F32))

        named = jax.jit(jax.grad(named_loss, argnums=(0, 1, 2)))
        direct = jax.jit(jax.grad(direct_loss, argnums=(0, 1, 2)))
        try:
            clock(lambda: named(q, k, v))
            clock(lambda: direct(q, k, v))
        except Exception as e:  # noqa: BLE001 - report and go on
            rows.append([f"{t}", f"failed: {type(e).__name__}: {str(e)[:80]}", "", "", "", ""])
            continue
        times = interleaved(
            {
                "named": lambda: named(q, k, v),
                "direct": lambda: direct(q, k, v),
                "direct2": lambda: direct(q, k, v),
            },
            budget,
            rounds,
        )
        med = {n: statistics.median(ts) for n, ts in times.items()}
        flops = 3.5 * 2 * t * t * heads * head_dim  # causal: half of 4 T^2 H D forward, bwd 2.5x
        ratio = statistics.median(a / b for a, b in zip(times["named"], times["direct"]))
        aa = statistics.median(a / b for a, b in zip(times["direct2"], times["direct"]))
        rows.append([
            f"{t}",
            f"{med['named'] * 1e3:.2f}",
            f"{med['direct'] * 1e3:.2f}",
            f"{ratio:.3f}",
            f"{aa:.3f}",
            f"{flops / med['named'] / 1e12:.1f} / {flops / med['direct'] / 1e12:.1f}",
        ])  # fmt: skip
    return rows


# -- the model ------------------------------------------------------------------------------------


def steps(size: tw.Size, remat: str) -> tuple[Any, Any, Any]:
    """``(optimizer, named step, plain step)``: the example's step and the plain twin's."""
    opt = tw.optimizer(size)
    named = tw.train_lm.make_steps(opt, POLICY)[0]
    cfg = tw.model_config(size, size.vocab)
    options = dict(compute=BF16, remat=remat, implementation=attention_kernel())

    def plain(params: Any, state: Any, tokens: jax.Array) -> Any:
        with jax.numpy_dtype_promotion("standard"):
            loss, grads = jax.value_and_grad(tw.plain_loss)(params, tokens, cfg, **options)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    return opt, named, jax.jit(plain, donate_argnums=(0, 1))


def model_row(
    name: str, size: tw.Size, peak: float, budget: Budget, rounds: int, per_round: int
) -> list[str]:  # noqa: E501
    opt, named_step, plain_step = steps(size, size.remat)
    cfg = tw.model_config(size, size.vocab)
    mesh = tw.one_device_mesh()
    with jax.set_mesh(mesh):
        state = tw.train_lm.init_state(cfg, size, opt, seed=0)
    model = state["model"]
    params = jax.tree.map(jnp.copy, tw.plain_params(model))  # the named step donates the model
    p_state = jax.jit(opt.init)(params)
    count = sum(x.size for x in jax.tree.leaves(model))
    tokens = [  # seq + 1 per row: the model runs on seq positions, as in the example
        jax.random.randint(jax.random.key(i), (size.batch, size.seq + 1), 0, cfg.vocab_size)
        for i in range(per_round)
    ]
    ids = [na.named(t, ("batch", "position")) for t in tokens]
    state = {"model": model, "n": state["opt_state"], "params": params, "p": p_state}

    def run_named() -> Any:
        with jax.set_mesh(mesh):
            for b in ids:
                state["model"], state["n"], loss = named_step(state["model"], state["n"], b)
        return loss

    def run_plain() -> Any:
        for t in tokens:
            state["params"], state["p"], loss = plain_step(state["params"], state["p"], t)
        return loss

    t0 = time.perf_counter()
    with jax.set_mesh(mesh):
        state["model"], state["n"], loss_n = named_step(state["model"], state["n"], ids[0])
    first_named = float(loss_n)
    compile_named = time.perf_counter() - t0
    t0 = time.perf_counter()
    state["params"], state["p"], loss_p = plain_step(state["params"], state["p"], tokens[0])
    first_plain = float(loss_p)
    compile_plain = time.perf_counter() - t0
    times = interleaved(
        {"named": run_named, "plain": run_plain, "plain2": run_plain}, budget, rounds
    )
    step = {n: statistics.median(ts) / per_round for n, ts in times.items()}
    ratio = statistics.median(a / b for a, b in zip(times["named"], times["plain"]))
    aa = statistics.median(a / b for a, b in zip(times["plain2"], times["plain"]))
    tokens_per_step = size.batch * size.seq
    flops = tw.flops_per_token(cfg, size.seq) * tokens_per_step
    return [
        name,
        f"{count / 1e6:.1f}M",
        f"{size.batch}x{size.seq}",
        f"{step['named'] * 1e3:.2f} / {step['plain'] * 1e3:.2f}",
        f"{tokens_per_step / step['named']:,.0f}",
        f"{flops / step['named'] / 1e12:.2f}",
        f"{100 * flops / step['named'] / peak:.1f} / {100 * flops / step['plain'] / peak:.1f}",
        f"{ratio:.3f}",
        f"{aa:.3f}",
        f"{first_named:.4f} / {first_plain:.4f}",
        f"{compile_named:.0f} / {compile_plain:.0f}",
        f"{len(times['named'])}",
    ]


# -- check ----------------------------------------------------------------------------------------


def check() -> int:
    """cuDNN attention (named, and direct) against XLA on this device, forward and gradients."""
    emulated = platform() != "gpu"
    if emulated:
        kernels._EMULATE = True  # noqa: SLF001 - no GPU: run the cuDNN mapping through XLA
        print(f"no GPU ({platform()}): the cuDNN mapping is emulated with XLA; numerics only")
    b, t, d = (2, 1024, 128) if not emulated else (2, 64, 16)
    i = jnp.arange(t)
    starts = jnp.array([0, t // 3])
    lengths = jnp.array([t, t - t // 5])
    left = na.named(i[None, :] >= starts[:, None], ("batch", "key_position"))
    right = na.named(lengths, ("batch",))
    cases = {
        "causal, 16 heads": (16, 16, dict(causal=True)),
        "causal, GQA 16/4": (16, 4, dict(causal=True)),
        "causal, left-padded, GQA 8/2": (8, 2, dict(causal=True, key_mask=left)),
        f"window {t // 4}, right-padded, GQA 8/2": (
            8,
            2,
            dict(sliding_window=t // 4, key_lengths=right),
        ),
        "non-causal, left-padded, MQA 8/1": (8, 1, dict(key_mask=left)),
    }
    rows, failed = [], 0
    for title, (n, kv, kw) in cases.items():
        keys = jax.random.split(jax.random.key(1), 4)
        q = na.named(
            jax.random.normal(keys[0], (b, t, n, d), BF16),
            ("batch", "position", "heads", "head_dim"),
        )  # noqa: E501
        kvn = "heads" if n == kv else "kv_heads"
        k, v = (
            na.named(
                jax.random.normal(kk, (b, t, kv, d), BF16),
                ("batch", "key_position", kvn, "head_dim"),
            )
            for kk in keys[1:3]
        )  # noqa: E501
        g = jax.random.normal(keys[3], (b, t, n, d), F32)
        if "left" in title:
            seen = (i[None, :] >= starts[:, None])[:, :, None, None]  # rows that see a key
        else:
            seen = jnp.ones((b, t, 1, 1), bool)

        def loss(q: Any, k: Any, v: Any, impl: str | None) -> Any:
            out = na.nn.dot_product_attention(q, k, v, implementation=impl, **kw)
            return jnp.sum(jnp.where(seen, out.array.astype(F32), 0.0) * g), out

        def run(impl: str | None) -> Any:
            f = jax.jit(
                jax.value_and_grad(
                    lambda q, k, v: loss(q, k, v, impl), argnums=(0, 1, 2), has_aux=True
                )
            )  # noqa: E501
            hlo = f.lower(q, k, v).compile().as_text()
            return f(q, k, v), "cudnn$fmha" in hlo

        logs = io.StringIO()
        handler = logging.StreamHandler(logs)
        logging.getLogger("namedaxes").addHandler(handler)
        try:
            ((_, out_c), grads_c), fused = run("cudnn")
            ((_, out_d), _), fused_default = run(None)
            ((_, out_x), grads_x), _ = run("xla")
        except Exception as e:  # noqa: BLE001
            rows.append([title, f"FAILED: {type(e).__name__}: {str(e)[:100]}", "", "", "", ""])
            failed += 1
            continue
        finally:
            logging.getLogger("namedaxes").removeHandler(handler)
        diff = float(
            jnp.max(
                jnp.where(seen, jnp.abs(out_c.array.astype(F32) - out_x.array.astype(F32)), 0.0)
            )
        )  # noqa: E501
        rel = max(
            float(
                jnp.linalg.norm((a.array - bb.array).astype(F32))
                / jnp.linalg.norm(bb.array.astype(F32))
            )  # noqa: E501
            for a, bb in zip(grads_c, grads_x)
        )
        same_default = bool(jnp.array_equal(out_d.array, out_c.array))
        ok = diff < 2e-2 and rel < 2e-2 and (emulated or (fused and fused_default and same_default))
        failed += not ok
        rows.append([
            title, f"{diff:.2e}", f"{rel:.2e}",
            "n/a" if emulated else ("yes" if fused else "NO"),
            "n/a" if emulated else ("yes" if fused_default and same_default else f"NO {logs.getvalue().strip()[:60]}"),  # noqa: E501
            "ok" if ok else "FAIL",
        ])  # fmt: skip
    # The named call against a direct jax.nn cuDNN call: the same kernel, so (nearly) the same bits.
    if not emulated:
        q = jax.random.normal(jax.random.key(2), (b, t, 16, d), BF16)
        names = ("batch", "position", "heads", "head_dim")
        kn = ("batch", "key_position", "heads", "head_dim")
        direct = jax.nn.dot_product_attention(q, q, q, is_causal=True, implementation="cudnn")
        named = na.nn.dot_product_attention(
            na.named(q, names), na.named(q, kn), na.named(q, kn), causal=True
        )  # noqa: E501
        diff = float(jnp.max(jnp.abs(direct.astype(F32) - named.array.astype(F32))))
        ok = diff < 1e-3
        failed += not ok
        rows.append(
            ["named vs direct jax.nn cuDNN", f"{diff:.2e}", "", "", "", "ok" if ok else "FAIL"]
        )  # noqa: E501
    table(
        f"cuDNN attention vs XLA, bfloat16, batch {b} x {t} tokens x head_dim {d} ({platform()})",
        ["case", "max |out diff|", "grad rel err", "fused kernel", "None picks it", "result"],
        rows,
    )
    print("\nCHECK", "PASSED" if not failed else f"FAILED ({failed})")
    return 1 if failed else 0


# -- main -----------------------------------------------------------------------------------------


def table_rows(
    out: Stream, runs: list[tuple[str, tw.Size]], row: Callable[[str, tw.Size, Budget], list[str]],
    total: Budget, cap: float,
) -> None:  # fmt: skip
    """``out.row(row(label, size, budget))`` per run, each row's budget what is left of ``total``,
    at most ``cap`` seconds; a row that fails prints why, and the table goes on."""
    for label, size in runs:
        left = total.left()
        if left <= 0:
            out.row([label, "skipped (budget)"])
            continue
        try:
            out.row(row(label, size, Budget(min(cap, left))))
        except Exception as e:  # noqa: BLE001 - one size failing must not lose the others
            out.row([label, failure(e)])
        gc.collect()
        jax.clear_caches()


def with_remat(
    names: list[str], sizes: dict[str, tw.Size], remats: list[str] | None, labelled: bool
) -> list[tuple[str, tw.Size]]:  # noqa: E501
    """``(label, size)`` per size and remat policy (``None``: each size's own); with ``labelled``
    and several policies the label names the policy."""
    runs = []
    for name in names:
        for r in remats or [sizes[name].remat]:
            label = f"{name} {r}" if labelled and remats and len(remats) > 1 else name
            runs.append((label, dataclasses.replace(sizes[name], remat=r)))
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="verify cuDNN numerics and exit")
    parser.add_argument("--quick", action="store_true", help="fewer rounds, no 1b, no 16k")
    parser.add_argument("--sizes", default=None,
                        help="comma-separated: " + ", ".join([*GPU_SIZES, *LONG_GPU_SIZES]))  # fmt: skip
    parser.add_argument("--rounds", type=int, default=None, help="timing rounds per section")
    parser.add_argument("--steps", type=int, default=None, help="steps per round")
    parser.add_argument(
        "--remat", default=None, type=lambda s: s.split(","),
        help="gradient_checkpointing policies, comma-separated, a row each: "
        f"{', '.join(REMAT_POLICIES)} (the plain twin: none, dots, carry). Default: dots; the "
        "long-context sizes their own",
    )  # fmt: skip
    parser.add_argument(
        "--precision", default="bf16", choices=("bf16", "fp8", "fp8-row"),
        help="fp8/fp8-row: float8 matmuls (tensor/row scaling) against bfloat16",
    )  # fmt: skip
    parser.add_argument("--loss-steps", type=int, default=None,
                        help="--precision: steps compared (default 100; 10 on CPU)")  # fmt: skip
    parser.add_argument("--wide-layers", type=int, default=None, help="layers of 8b-wide (12)")
    parser.add_argument("--peak", type=float, help="bfloat16 peak TFLOP/s (default: measured)")
    parser.add_argument(
        "--fp8-form",
        choices=("output", "operands"),
        default=None,
        help="--precision fp8: how tensor scaling is written (nn._fp8.TENSOR_FORM; operands)",
    )
    parser.add_argument(
        "--save-hlo",
        default=None,
        help="--precision: write each float8 step's compiled HLO to this folder",
    )
    parser.add_argument("--budget", type=float, default=None,
                        help="total seconds (default 480 on an accelerator, 50 on CPU)")  # fmt: skip
    args = parser.parse_args()
    if args.check:
        return check()

    accel = on_accelerator()
    total = Budget(args.budget or (480.0 if accel else 50.0))
    rounds = args.rounds or (3 if args.quick else 7 if accel else 3)
    per_round = args.steps or (3 if accel else 2)
    # On a CPU only the tiny sizes: a GPU size's first step alone would take minutes there.
    gpu_default = ["example", "100m"] if args.quick else ["example", "100m", "1b"]
    if args.precision != "bf16":
        gpu_default = ["100m", "1b"] if args.quick else ["100m", "1b", "8b-wide"]
    default = gpu_default if accel else list(CPU_SIZES)
    chosen = args.sizes.split(",") if args.sizes else default
    sizes = {**CPU_SIZES, **GPU_SIZES} if accel else {**GPU_SIZES, **CPU_SIZES}
    sizes.update(LONG)
    if args.wide_layers:
        sizes["8b-wide"] = dataclasses.replace(sizes["8b-wide"], layers=args.wide_layers)
    unknown = [s for s in chosen if s not in sizes]
    if unknown:
        parser.error(f"unknown sizes {unknown}; choose from {list(sizes)}")
    long, short = [n for n in chosen if n in LONG], [n for n in chosen if n not in LONG]
    bad = [r for r in args.remat or [] if r not in REMAT_POLICIES]
    if short and args.precision == "bf16":  # the plain twin's policies
        bad += [r for r in args.remat or [] if r not in ("none", *tw.REMAT)]
    if bad:
        parser.error(f"--remat {sorted(set(bad))}: choose from {list(REMAT_POLICIES)} "
                     "(none, dots or carry for the rows with the plain twin)")  # fmt: skip
    if long and args.precision != "bf16":
        parser.error(f"the long-context sizes {long} run in bfloat16 only")
    device = jax.devices()[0]
    remat = ",".join(args.remat or ["dots"]) + (
        " (long-context sizes: their own)" if long and not args.remat else ""
    )
    print(f"device: {device.device_kind} ({platform()}), jax {jax.__version__}, namedaxes "
          f"{na.__version__}; precision {POLICY}, remat {remat}")  # fmt: skip

    peak = 1e12 * args.peak if args.peak else peak_bf16(Budget(min(30.0, total.left())))
    print(f"{'given' if args.peak else 'measured'} bfloat16 matmul peak: {peak / 1e12:.1f} TFLOP/s")
    runs = with_remat(short, sizes, args.remat or ["dots"], labelled=True)
    if args.precision != "bf16":
        if args.fp8_form:
            na.nn._fp8.TENSOR_FORM = args.fp8_form
        loss_steps = args.loss_steps or (100 if accel else 10)
        out = Stream(f"training step (AdamW), float8 matmuls ({args.precision}: "
                     f"{PRECISION_POLICIES[args.precision]}) vs bfloat16, namedaxes",
                     PRECISION_HEADER, PRECISION_WIDTHS)  # fmt: skip
        table_rows(out, runs, lambda name, size, budget: precision_row(
            name, size, args.precision, peak, budget, rounds, per_round, loss_steps,
            args.save_hlo), total, 240.0)  # fmt: skip
        return 0

    if short:
        tokens = ([4096] if args.quick else [4096, 16384]) if accel else [256, 512]
        rows = attention_fwd_bwd(Budget(min(90.0, total.left())), tokens, rounds=max(rounds, 5))
        table(
            "attention forward+backward, causal, bfloat16, batch 1"
            + (", 16 heads x 64" if accel else ", 4 heads x 32 (CPU)"),
            ["tokens", "named ms", "direct ms", "named/direct", "A/A", "TFLOP/s named / direct"],
            rows,
        )
        header = ["size", "params", "batch", "step ms named / plain", "tokens/s", "TFLOP/s",
                  "MFU % named / plain", "named/plain", "A/A", "first loss named / plain",
                  "first call s", "rounds"]  # fmt: skip
        vocab = (GPU_SIZES if accel else CPU_SIZES)["example"].vocab
        title = f"training step (AdamW), namedaxes vs plain JAX (example: vocabulary {vocab})"
        out = Stream(title, header, [7, 7, 9, 21, 10, 7, 19, 11, 5, 24, 12, 6])
        table_rows(out, runs, lambda name, size, budget: model_row(
            name, size, peak, budget, rounds, per_round), total, 180.0)  # fmt: skip
    if long:
        # A step is seconds here: fewer rounds and steps unless asked.
        r, n = args.rounds or 3, args.steps or 1
        out = Stream(f"long context: one sequence, training step (AdamW), namedaxes{device_limit()}",
                     LONG_HEADER, LONG_WIDTHS)  # fmt: skip
        table_rows(out, with_remat(long, sizes, args.remat, labelled=False),
                   lambda name, size, budget: long_context_row(name, size, peak, budget, r, n),
                   total, 300.0)  # fmt: skip
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
