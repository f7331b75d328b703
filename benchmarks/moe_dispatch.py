"""nn.MoE's dispatches on one device: do "ragged" (jax.lax.ragged_dot) and "dense" agree, and which
is faster? Decides what ``dispatch="auto"`` should pick on an accelerator.

Run: ``python benchmarks/moe_dispatch.py`` on a GPU or TPU (``--small`` for a quick CPU check).
For each expert count, a bfloat16 MoE layer (float32 parameters, SwiGLU experts, top-2 softmax
routing) runs forward and backward on a batch of tokens with each dispatch. Printed per row: the
largest difference of the outputs and of the router gradient between the two dispatches (relative
to their scale), the median time of a forward+backward step, and how XLA compiled
``ragged_dot`` (the HLO ops that carry it: a grouped-GEMM custom call or kernel, or dense ``dot``s
over masked operands).
"""

from __future__ import annotations

import argparse
import re
import statistics
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import namedaxes as na


def step_fn(moe: na.nn.MoE, x: na.NamedArray) -> tuple[jax.Array, jax.Array]:
    def loss(moe: na.nn.MoE) -> tuple[jax.Array, jax.Array]:
        with na.nn.precision("params=float32,compute=bfloat16"):
            y, stats = moe(x)
        out = y.array.astype(jnp.float32)
        return jnp.mean(out**2) + 0.01 * stats.load_balancing_loss(), out

    (_, out), grads = eqx.filter_value_and_grad(loss, has_aux=True)(moe)
    return out, grads.router.weight.array


def kernels(hlo: str) -> str:
    calls = sorted(set(re.findall(r'custom_call_target="([^"]+)"', hlo)))
    dots = len(re.findall(r"\bdot\(", hlo))
    ragged = len(re.findall(r"\bragged-dot\(", hlo))
    return f"custom calls {calls or '-'}, {ragged} ragged-dot ops, {dots} dot ops"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny sizes (CPU check)")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    tokens, embed, hidden = (512, 64, 128) if args.small else (8192, 1024, 2048)
    counts = (4, 8) if args.small else (8, 32, 64)
    print(f"backend {jax.default_backend()}, {tokens} tokens, embed {embed}, expert width {hidden}")
    x = na.random.normal(jax.random.key(0), {"batch": 8, "position": tokens // 8, "embed": embed})
    for n in counts:
        experts = na.Axis("experts", n)
        results = {}
        for dispatch in ("dense", "ragged"):
            moe = na.nn.MoE(
                {"embed": embed}, experts, {"expert_mlp": hidden}, top_k=2,
                key=jax.random.key(1), dispatch=dispatch, normalize=True,
            )  # fmt: skip
            step = eqx.filter_jit(step_fn)
            out = jax.block_until_ready(step(moe, x))
            times = []
            for _ in range(args.steps):
                start = time.perf_counter()
                jax.block_until_ready(step(moe, x))
                times.append(time.perf_counter() - start)
            hlo = step.lower(moe, x).lowered.compile().as_text()
            results[dispatch] = (out, statistics.median(times), kernels(hlo))
        (y_d, g_d), t_d, _ = results["dense"]
        (y_r, g_r), t_r, how = results["ragged"]
        dy = float(np.abs(np.asarray(y_r) - np.asarray(y_d)).max() / np.abs(np.asarray(y_d)).max())
        dg = float(np.abs(np.asarray(g_r) - np.asarray(g_d)).max() / np.abs(np.asarray(g_d)).max())
        print(
            f"experts {n:3d}: dense {t_d * 1e3:8.2f} ms, ragged {t_r * 1e3:8.2f} ms "
            f"(ragged/dense {t_r / t_d:.2f}); max rel diff output {dy:.1e}, router grad {dg:.1e}; "
            f"ragged compiled to {how}"
        )


if __name__ == "__main__":
    main()
