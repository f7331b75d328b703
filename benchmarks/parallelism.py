"""Parallelism by name: what each strategy saves per device, and what it costs.

Run: ``python benchmarks/parallelism.py [--section context] [--seq 4096] [--rounds 5]``. One
section per strategy; each prints a table.

* ``context``: a llama-shaped ``namedaxes.models.Transformer`` training step (loss and gradients)
  at a fixed long sequence (``--seq``, batch 1), with ``position`` mapped to a ``context`` mesh axis
  of 1, 2, 4 and 8 of the 8 simulated CPU devices, for both exchange strategies (``all_gather``,
  ``ring``). Per device: XLA's compiled figures (``namedaxes.analysis.compiled_memory``: temporaries,
  i.e. the step's activations, and the total with arguments and outputs), the compiled exchange
  (collective kinds and counts), and the median step time over ``--rounds`` runs. Memory is exact;
  the times come from simulated devices sharing the machine's cores, so they show the exchange's
  overhead, not a speed-up, and mean something only on a quiet machine.

(The expert-parallelism section joins ``SECTIONS`` next to ``context``.)
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax

jax.config.update("jax_num_cpu_devices", 8)

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import equinox as eqx
import numpy as np
from jax.sharding import Mesh

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _twin as tw  # noqa: E402

import namedaxes as na  # noqa: E402
from namedaxes.models import Transformer, TransformerConfig  # noqa: E402

MiB = 2**20


def _median_ms(fn: Callable[[], Any], rounds: int) -> float:
    jax.block_until_ready(fn())  # warm
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def _exchange(hlo: str) -> str:
    found = tw.collectives(hlo)
    return ", ".join(f"{op} x{len(s)}" for op, s in found.items() if s) or "none"


# -- context parallelism --------------------------------------------------------------------------

CONTEXT_CONFIG = TransformerConfig(
    "llama", vocab_size=512, hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4,
    num_kv_heads=2, head_dim=32,
)  # fmt: skip


def _loss(model: Transformer, ids: na.NamedArray, labels: na.NamedArray) -> Any:
    return na.nn.cross_entropy(model(ids), "vocab", labels).array


def context_parallelism(args: argparse.Namespace) -> None:
    seq, rounds = args.seq, args.rounds
    rng = np.random.default_rng(0)
    ids = na.named(rng.integers(0, 512, (1, seq)).astype(np.int32), ("batch", "position"))
    labels = na.named(rng.integers(0, 512, (1, seq)).astype(np.int32), ("batch", "position"))
    mapping = {"position": "context"}
    rows = []
    for shards in (1, 2, 4, 8):
        for strategy in ("all_gather", "ring") if shards > 1 else ("-",):
            cfg = CONTEXT_CONFIG.replace(context_strategy=None if shards == 1 else strategy)
            model = Transformer(cfg, key=jax.random.key(0))
            mesh = Mesh(np.asarray(jax.devices()[:shards]), ("context",))
            step = na.named_jit(eqx.filter_value_and_grad(_loss), axis_resources=mapping)
            with jax.set_mesh(mesh):
                model, *batch = na.shard((model, ids, labels), mapping)  # parameters replicated
                memory = na.analysis.compiled_memory(step, model, *batch)
                hlo = step.lower(model, *batch).compile().as_text()
                ms = _median_ms(lambda: step(model, *batch), rounds)  # noqa: B023
            rows.append((shards, strategy, memory, ms, _exchange(hlo)))
            print(f"  measured {shards} shard(s), {strategy}", file=sys.stderr, flush=True)

    base = rows[0][2]["temp_bytes"]
    print(
        f"\nContext parallelism: llama-shaped Transformer ({CONTEXT_CONFIG.num_layers} layers, "
        f"embed {CONTEXT_CONFIG.hidden_size}, {CONTEXT_CONFIG.num_heads} heads), batch 1 x "
        f"{seq} positions, training step (loss + gradients), float32, XLA attention; "
        '{"position": "context"} on 1-8 simulated CPU devices. Per device:\n'
    )
    head = (
        f"{'shards':>6}  {'strategy':<10} {'activations MiB':>15} {'vs 1':>6} "
        f"{'total MiB':>9} {'step ms':>8}  exchange (compiled collectives)"
    )
    print(head)
    print("-" * len(head))
    for shards, strategy, memory, ms, exchange in rows:
        temp = memory["temp_bytes"]
        print(
            f"{shards:>6}  {strategy:<10} {temp / MiB:>15.1f} {temp / base:>6.2f} "
            f"{memory['total_bytes'] / MiB:>9.1f} {ms:>8.1f}  {exchange}"
        )


SECTIONS: dict[str, Callable[[argparse.Namespace], None]] = {
    "context": context_parallelism,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--section", choices=list(SECTIONS), action="append")
    parser.add_argument("--seq", type=int, default=4096, help="context: the sequence length")
    parser.add_argument("--rounds", type=int, default=5, help="timed runs per row")
    args = parser.parse_args()
    for name in args.section or list(SECTIONS):
        SECTIONS[name](args)


if __name__ == "__main__":
    main()
