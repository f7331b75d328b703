"""Parallelism by name: what each strategy saves per device, and what it costs.

Run: ``python benchmarks/parallelism.py [SECTION ...] [--seq 4096] [--rounds 5]`` (default: every
section). One section per strategy; each prints a table of per-device memory (XLA's compiled figures,
``namedaxes.analysis.compiled_memory``) and step time as the strategy's shard count grows, on 8
simulated CPU devices.

* ``context``: a llama-shaped ``namedaxes.models.Transformer`` training step (loss and gradients)
  at a fixed long sequence (``--seq``, batch 1), with ``position`` mapped to a ``context`` mesh axis
  of 1, 2, 4 and 8 of the 8 simulated CPU devices, for each exchange strategy (``all_gather``,
  ``ring`` with the sequence in order, ``ring zigzag``: the balanced ring, the default, and
  ``ulysses``). Per device, besides the attention the slowest shard computes (a ring's calls that
  are not skipped, counted by the ring's own code): XLA's compiled figures (``namedaxes.analysis.compiled_memory``: temporaries,
  i.e. the step's activations, and the total with arguments and outputs), the compiled exchange
  (collective kinds and counts), and the median step time over ``--rounds`` runs. Memory is exact;
  the times come from simulated devices sharing the machine's cores, so they show the exchange's
  overhead, not a speed-up, and mean something only on a quiet machine.
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

* ``pipeline``: a stack of 8 residual MLP layers (``nn.Stacked``) trained with ``{"layer":
  "stage"}`` on 1, 2, 4 and 8 devices, each schedule (``gpipe``, ``1f1b``, ``circular``) with
  ``m = 4p`` microbatches: XLA's per-device parameter and activation bytes. Then the bubble at
  ``m = 4p`` and ``8p`` for 2 and 4 stages against the schedule's theory ``(p - 1) / (r m + p -
  1)``, measured as device time: this section runs every simulated device on one thread of one
  core (``--xla_cpu_multi_thread_eigen=false`` and the process's CPU affinity), so a step's time
  is the sum of its devices' work, and compares the pipelined step with the 1-stage step that runs
  the same microbatches one after the other on one device (so the smaller matmuls of a microbatch
  cost both the same). On real devices each time divides by the device count, and the ratio is the
  same; this measures what the implementation adds to the schedule's own idle ticks.

Times on simulated CPU devices only compare rows with each other (and XLA:CPU computes
``ragged_dot`` as a masked dense product); they mean little on a busy machine.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "pipeline" in sys.argv[1:]:
    # Its bubble is device time: every device computes on one thread, all on one core.
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false"
    ).strip()
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

import jax

jax.config.update("jax_num_cpu_devices", 8)

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _twin as tw  # noqa: E402

import namedaxes as na  # noqa: E402
from namedaxes.models import Transformer, TransformerConfig  # noqa: E402
from namedaxes.nn._ring import Ring, work  # noqa: E402

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
    "llama",
    vocab_size=512,
    hidden_size=128,
    intermediate_size=256,
    num_layers=2,
    num_heads=8,
    num_kv_heads=2,
    head_dim=16,
)  # fmt: skip  (8 query heads: Ulysses splits them over up to 8 devices)
# (row label, runtime options): the ring in order, the balanced ring (the default), Ulysses.
CONTEXT_ROWS = (
    ("all_gather", {"context_strategy": "all_gather"}),
    ("ring", {"context_strategy": "ring", "context_balance": None}),
    ("ring zigzag", {"context_strategy": "ring"}),
    ("ulysses", {"context_strategy": "ulysses"}),
)


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
        for strategy, options in CONTEXT_ROWS if shards > 1 else (("-", {}),):
            model = Transformer(CONTEXT_CONFIG.with_options(**options), key=jax.random.key(0))
            mesh = Mesh(np.asarray(jax.devices()[:shards]), ("context",))
            step = na.named_jit(eqx.filter_value_and_grad(_loss), axis_resources=mapping)
            with jax.set_mesh(mesh):
                model, *batch = na.shard((model, ids, labels), mapping)  # parameters replicated
                memory = na.analysis.compiled_memory(step, model, *batch)
                hlo = step.lower(model, *batch).compile().as_text()
                ms = _median_ms(lambda: step(model, *batch), rounds)  # noqa: B023
            rows.append(
                (shards, strategy, memory, ms, _exchange(hlo), _slowest(strategy, shards, seq))
            )
            print(f"  measured {shards} shard(s), {strategy}", file=sys.stderr, flush=True)

    base = rows[0][2]["temp_bytes"]
    print(
        f"\nContext parallelism: llama-shaped Transformer ({CONTEXT_CONFIG.num_layers} layers, "
        f"embed {CONTEXT_CONFIG.hidden_size}, {CONTEXT_CONFIG.num_heads} heads), batch 1 x "
        f"{seq} positions, training step (loss + gradients), float32, XLA attention; "
        '{"position": "context"} on 1-8 simulated CPU devices. Per device; "slowest" is the '
        "attention the slowest shard computes, in blocks of (positions per shard)^2 x every "
        "head: a ring's calls it does not skip (counted by the ring's own test), else XLA's "
        "masked scores (all-gather: its queries x every key; Ulysses: every position of its "
        "heads, half that with a fused causal kernel):\n"
    )
    head = (
        f"{'shards':>6}  {'strategy':<11} {'activations MiB':>15} {'vs 1':>6} "
        f"{'total MiB':>9} {'step ms':>8} {'slowest':>7}  exchange (compiled collectives)"
    )
    print(head)
    print("-" * len(head))
    for shards, strategy, memory, ms, exchange, slowest in rows:
        temp = memory["temp_bytes"]
        print(
            f"{shards:>6}  {strategy:<11} {temp / MiB:>15.1f} {temp / base:>6.2f} "
            f"{memory['total_bytes'] / MiB:>9.1f} {ms:>8.1f} {slowest:>7}  {exchange}"
        )


def _slowest(strategy: str, shards: int, seq: int) -> str:
    """The attention the slowest shard computes, in blocks of ``(seq / shards)**2`` positions."""
    if strategy.startswith("ring"):
        cfg = Ring(None, shards, 1.0, True, None, strategy == "ring zigzag")
        return f"{max(work(cfg, seq // shards, seq // shards)) / (seq // shards) ** 2:.2f}"
    return f"{shards:.2f}"  # XLA: queries x keys of every head, or all positions of 1/c of them


# -- experts ----------------------------------------------------------------------------------

EXPERTS = TransformerConfig(
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


def experts(args: argparse.Namespace) -> None:
    steps = args.rounds
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
        model = Transformer(config, key=jax.random.key(1))
        for ep in (1, 2, 4, 8):
            mesh = jax.make_mesh((8 // ep, ep), ("data", "expert"))
            mapping = {"batch": ("data", "expert"), "experts": "expert"}
            with jax.set_mesh(mesh), na.axis_mapping(mapping):
                placed, x, y = na.shard((model, ids, labels))
                step = na.named_jit(_train_step)
                memory = na.analysis.compiled_memory(step, placed, x, y)
                hlo = step.lower(placed, x, y).compile().as_text()
                seconds = _median_ms(lambda: step(placed, x, y), steps) / 1e3  # noqa: B023
            print(
                f"{dispatch:<8} {capacity or '-':>8} {ep:>3} {config.num_experts // ep:>11} "
                f"{memory['argument_bytes'] / MiB:>9.2f} {memory['temp_bytes'] / MiB:>9.2f} "
                f"{memory['total_bytes'] / MiB:>10.2f} {seconds * 1e3:>8.1f}  {_exchange(hlo)}"
            )


# -- pipeline ---------------------------------------------------------------------------------

PIPE_LAYERS, PIPE_EMBED, PIPE_MLP, PIPE_ROWS, PIPE_POS = 8, 256, 1024, 64, 32


class _Block(eqx.Module):
    """A residual MLP block: the pipelined stack's layer (the stage work, nothing else)."""

    mlp: na.nn.MLP

    def __call__(self, x: na.NamedArray) -> na.NamedArray:
        return x + self.mlp(x)


def _pipe_stack(**options: Any) -> na.nn.Stacked:
    embed = na.Axis("embed", PIPE_EMBED)
    return na.nn.Stacked(
        na.Axis("layer", PIPE_LAYERS),
        lambda k: _Block(na.nn.MLP(embed, {"mlp": PIPE_MLP}, key=k)),
        key=jax.random.key(0),
        **options,
    )


def _pipe_step(stack: na.nn.Stacked, x: na.NamedArray) -> Any:
    return jax.value_and_grad(lambda s: (s(x) ** 2).mean().array)(stack)


def _pipe_run(stages: int, **options: Any) -> tuple[dict[str, int], Any]:
    """(compiled memory, a call of the step) with the layers over ``stages`` devices."""
    x = na.random.normal(
        jax.random.key(1), {"batch": PIPE_ROWS, "position": PIPE_POS, "embed": PIPE_EMBED}
    )
    mesh = Mesh(np.asarray(jax.devices()[:stages]), ("stage",))
    mapping = {"layer": "stage"}
    step = na.named_jit(_pipe_step, axis_resources=mapping)
    with jax.set_mesh(mesh):
        stack, x = na.shard((_pipe_stack(**options), x), mapping)
        memory = na.analysis.compiled_memory(step, stack, x)
    return memory, lambda: step(stack, x)


def pipeline(args: argparse.Namespace) -> None:
    print(
        f"Pipeline parallelism: a stack of {PIPE_LAYERS} residual MLP layers (embed {PIPE_EMBED}, "
        f"mlp {PIPE_MLP}), {PIPE_ROWS} x {PIPE_POS} tokens, training step (loss + gradients), "
        'float32, {"layer": "stage"} on 1-8 simulated CPU devices.\n\nPer device (XLA\'s '
        "compiled figures), m = 4 x stages microbatches:\n"
    )
    head = (
        f"{'stages':>6} {'schedule':<9} {'m':>3} {'parameters MiB':>14} {'activations MiB':>15} "
        f"{'total MiB':>9}"
    )
    print(head)
    print("-" * len(head))
    for stages in (1, 2, 4, 8):
        for schedule in ("gpipe", "1f1b", "circular") if stages > 1 else ("-",):
            if schedule == "circular" and 2 * stages > PIPE_LAYERS:
                continue  # two blocks per stage need 16 layers at 8 stages
            m = 4 * stages
            opts = {} if stages == 1 else {"schedule": schedule, "microbatches": m}
            memory, _ = _pipe_run(stages, **opts)
            print(
                f"{stages:>6} {schedule:<9} {m if stages > 1 else '-':>3} "
                f"{memory['argument_bytes'] / MiB:>14.2f} {memory['temp_bytes'] / MiB:>15.2f} "
                f"{memory['total_bytes'] / MiB:>9.2f}",
                flush=True,
            )

    # The bubble, measured as device time: every simulated device on one core (set at the top for
    # this section), so a step takes the sum of its devices' work, idle ticks included (in SPMD a
    # stage with nothing to do computes on what it holds, as long as a stage's tick). The 1-stage
    # step runs the same microbatches one after the other on one device: the work without the
    # bubble. On p real devices the ratio is the same (every time divided by p).
    print(
        "\nBubble: idle fraction 1 - T1 / Tp: T1 the 1-stage step (the same m microbatches one "
        "after the other, one device), Tp the pipelined step on p devices, both as device time "
        f"(every device on one core). Medians of {args.rounds} interleaved rounds; A/A is a "
        "second T1:\n"
    )
    head = (
        f"{'stages':>6} {'schedule':<9} {'m':>3} {'T1 ms':>8} {'Tp ms':>8} {'bubble':>7} "
        f"{'theory':>7} {'A/A':>6}"
    )
    print(head)
    print("-" * len(head))
    for stages in (2, 4):
        for m in (4 * stages, 8 * stages):
            one, again = _accumulated(m), _accumulated(m)
            for schedule in ("gpipe", "1f1b", "circular"):
                _, piped = _pipe_run(stages, schedule=schedule, microbatches=m)
                t1, tp, aa = _interleaved([one, piped, again], args.rounds)
                repeats = 2 if schedule == "circular" else 1
                theory = na.analysis.bubble_fraction(stages, m, repeats)
                print(
                    f"{stages:>6} {schedule:<9} {m:>3} {t1:>8.1f} {tp:>8.1f} "
                    f"{1 - t1 / tp:>7.3f} {theory:>7.3f} {aa / t1:>6.3f}",
                    flush=True,
                )


def _accumulated(m: int) -> Callable[[], Any]:
    """The 1-stage step on one device: the batch's ``m`` microbatches one after the other."""
    x = na.random.normal(
        jax.random.key(1), {"batch": PIPE_ROWS, "position": PIPE_POS, "embed": PIPE_EMBED}
    )
    parts = na.unflatten_axis(x, "batch", {"batch": PIPE_ROWS // m, "microbatch": m})

    @jax.jit
    def step(stack: na.nn.Stacked, parts: na.NamedArray) -> Any:
        def loss(s: na.nn.Stacked) -> jax.Array:
            body = lambda total, xj: total + (s(xj) ** 2).mean().array / m  # noqa: E731
            return na.fold(body, "microbatch")(jnp.zeros(()), parts)

        return jax.value_and_grad(loss)(stack)

    stack = _pipe_stack()
    return lambda: step(stack, parts)


def _interleaved(calls: list[Callable[[], Any]], rounds: int) -> list[float]:
    """Median ms of each call, the calls alternated round by round (drift hits all alike)."""
    for call in calls:
        jax.block_until_ready(call())
    times: list[list[float]] = [[] for _ in calls]
    for _ in range(rounds):
        for i, call in enumerate(calls):
            start = time.perf_counter()
            jax.block_until_ready(call())
            times[i].append(time.perf_counter() - start)
    return [1e3 * statistics.median(t) for t in times]


SECTIONS: dict[str, Callable[[argparse.Namespace], None]] = {
    "context": context_parallelism,
    "experts": experts,
    "pipeline": pipeline,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("sections", nargs="*", help=f"any of {', '.join(SECTIONS)} (default all)")
    parser.add_argument("--seq", type=int, default=4096, help="context: the sequence length")
    parser.add_argument("--rounds", type=int, default=5, help="timed runs per row")
    args = parser.parse_args()
    unknown = [s for s in args.sections if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {unknown}; sections: {', '.join(SECTIONS)}")
    for name in args.sections or SECTIONS:
        SECTIONS[name](args)
        print()


if __name__ == "__main__":
    main()
