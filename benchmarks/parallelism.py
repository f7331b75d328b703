"""Parallelism by name: per-device memory (XLA's figures) and step time as a strategy's shard count
grows, on 8 simulated CPU devices. One section per strategy.

Run: ``python benchmarks/parallelism.py [SECTION ...] [--steps N]`` (default: every section).

Sections:

* ``experts``: expert parallelism 1/2/4/8 at a fixed expert count. A mixture-of-experts
  Transformer (16 experts of width 256 per layer, top-2, 2 layers, hidden 128, vocabulary 1024)
  trains on a fixed global batch (16 x 128 tokens) with plain SGD. The 8 devices are a mesh
  ``(data=8/ep, expert=ep)`` and the mapping ``{"batch": ("data", "expert"), "experts":
  "expert"}``: every device holds 256 tokens, ``ep`` devices share out the experts. Rows per
  dispatch (``nn.MoE``'s ``dispatch``): ``ragged`` dropless (grouped matmuls, choices exchanged by
  all-to-all in blocks sized for the worst case), ``ragged`` with ``capacity_factor=1.25`` (blocks
  bounded by the capacity) and ``dense`` (every local expert on every token of the group, partial
  sums reduce-scattered). Reported per row: XLA's per-device argument (parameters and batch),
  temporary and total bytes of the compiled step (``namedaxes.analysis.compiled_memory``), the
  median step time, and the collectives in the compiled step.

Times on simulated CPU devices only compare rows with each other (and XLA:CPU computes
``ragged_dot`` as a masked dense product); they mean little on a busy machine.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax

jax.config.update("jax_num_cpu_devices", 8)

import argparse
import re
import statistics
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax.numpy as jnp

import namedaxes as na
from namedaxes import models
from namedaxes.analysis import compiled_memory

MiB = 2**20


def _collectives(hlo: str) -> str:
    kinds = ("all-to-all", "all-gather", "reduce-scatter", "all-reduce", "collective-permute")
    found = Counter(
        k for line in hlo.splitlines() for k in kinds if re.search(rf"\b{k}(-start)?\(", line)
    )
    return ", ".join(f"{k} {n}" for k, n in found.items()) or "none"


def _median_time(step: Callable[[], Any], steps: int) -> float:
    jax.block_until_ready(step())  # compile and warm up
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        jax.block_until_ready(step())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# -- experts ----------------------------------------------------------------------------------

EXPERTS = models.TransformerConfig(
    "mixtral", vocab_size=1024, hidden_size=128, intermediate_size=256, num_layers=2,
    num_heads=4, num_kv_heads=4, head_dim=32, num_experts=16, num_experts_per_tok=2,
    norm_topk_prob=True,
)  # fmt: skip
BATCH, SEQ = 16, 128


def _train_step(model: Any, ids: na.NamedArray, labels: na.NamedArray) -> Any:
    def loss(model: Any) -> jax.Array:
        logits, aux = model(ids, return_aux_loss=True)
        ce = na.nn.cross_entropy(logits, "vocab", labels).array
        return ce + model.config.router_aux_loss_coef * aux

    value, grads = eqx.filter_value_and_grad(loss)(model)
    return value, jax.tree.map(lambda p, g: p - 0.1 * g, model, grads)


def experts(steps: int) -> None:
    key = jax.random.key(0)
    ids = na.named(jax.random.randint(key, (BATCH, SEQ), 0, 1024), ("batch", "position"))
    labels = na.named(jnp.roll(ids.array, -1, axis=1), ("batch", "position"))
    rows = [("ragged", None), ("ragged", 1.25), ("dense", None)]
    print(
        f"expert parallelism: {EXPERTS.num_experts} experts x {EXPERTS.num_layers} layers, "
        f"{BATCH}x{SEQ} tokens, 8 CPU devices as (data=8/ep, expert=ep)"
    )
    header = (
        f"{'dispatch':<8} {'capacity':>8} {'ep':>3} {'experts/dev':>11} {'args MiB':>9} "
        f"{'temp MiB':>9} {'total MiB':>10} {'step ms':>8}  collectives"
    )
    print(header)
    print("-" * len(header))
    for dispatch, capacity in rows:
        config = EXPERTS.replace(moe_dispatch=dispatch, capacity_factor=capacity)
        model = models.Transformer(config, key=jax.random.key(1))
        for ep in (1, 2, 4, 8):
            mesh = jax.make_mesh((8 // ep, ep), ("data", "expert"))
            mapping = {"batch": ("data", "expert"), "experts": "expert"}
            with jax.set_mesh(mesh), na.axis_mapping(mapping):
                placed, x, y = na.shard((model, ids, labels))
                step = na.named_jit(_train_step)
                memory = compiled_memory(step, placed, x, y)
                hlo = step.lower(placed, x, y).compile().as_text()
                seconds = _median_time(lambda: step(placed, x, y), steps)
            print(
                f"{dispatch:<8} {capacity or '-':>8} {ep:>3} {config.num_experts // ep:>11} "
                f"{memory['argument_bytes'] / MiB:>9.2f} {memory['temp_bytes'] / MiB:>9.2f} "
                f"{memory['total_bytes'] / MiB:>10.2f} {seconds * 1e3:>8.1f}  {_collectives(hlo)}"
            )


SECTIONS: dict[str, Callable[[int], None]] = {"experts": experts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sections", nargs="*", help=f"any of {', '.join(SECTIONS)} (default all)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per row")
    args = parser.parse_args()
    unknown = [s for s in args.sections if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {unknown}; sections: {', '.join(SECTIONS)}")
    for name in args.sections or SECTIONS:
        SECTIONS[name](args.steps)
        print()


if __name__ == "__main__":
    main()
