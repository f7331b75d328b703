"""The main example's training step, namedaxes against its plain-JAX twin, on Auto and Explicit meshes.

Run: ``python benchmarks/model_step.py`` (defaults: the example's default model and batch, 20 steps,
30 timing rounds, both mesh kinds; ``--config tiny --rounds 3`` for a quick check). Both programs
start from the same values (the plain parameters are the named model's arrays), use the example's
optax AdamW and the same batches of random tokens, on 8 simulated CPU devices as (data=2, model=4)
with FSDP + tensor parallelism. Reported per mesh kind:

* loss agreement over ``--steps`` steps (max absolute difference);
* the interleaved median step-time ratio namedaxes / plain, and plain / plain (an A/A run with a
  second, separately compiled copy of the plain step) for the noise level;
* first-call time (trace + compile + run) of each;
* traces per step (Python trace count over the steps run);
* count and result shapes of all-gather / reduce-scatter / all-reduce / all-to-all /
  collective-permute in both compiled programs.

The models live in ``benchmarks/_twin.py`` (shared with ``tests/test_model_twin.py``). Times are
only meaningful on a quiet machine.
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
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jax.sharding import AxisType, NamedSharding

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _twin as tw  # noqa: E402

import namedaxes as na  # noqa: E402


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    return time.perf_counter() - start, out


def run(size: tw.Size, kind: AxisType, steps: int, rounds: int) -> dict[str, Any]:
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(kind,) * 2)
    traces: Counter = Counter()
    model, n_state = tw.named_init(size, mesh)
    init, p_step = tw.plain_step(size, mesh, traces)
    _, p_step_b = tw.plain_step(size, mesh)  # the A/A copy: same program, compiled separately
    params, p_state = init(tw.plain_params(model))
    n_step = tw.named_step(size, traces)
    tokens = tw.batches(size, steps)
    out: dict[str, Any] = {"mesh": f"{dict(mesh.shape)} {kind.name}"}

    with jax.set_mesh(mesh):
        n_batches = [na.shard(tw.named_batch(t), tw.COMPUTE) for t in tokens]
        p_batches = [jax.device_put(t, NamedSharding(mesh, tw.BATCH_SPEC)) for t in tokens]

        # First call: trace + compile + run.
        out["first_named_s"], (model, n_state, n_loss) = timed(
            lambda: n_step(model, n_state, n_batches[0])
        )
        out["first_plain_s"], (params, p_state, p_loss) = timed(
            lambda: p_step(params, p_state, p_batches[0])
        )
        n_losses, p_losses = [float(n_loss)], [float(p_loss)]
        for nb, pb in zip(n_batches[1:], p_batches[1:]):
            model, n_state, n_loss = n_step(model, n_state, nb)
            params, p_state, p_loss = p_step(params, p_state, pb)
            n_losses.append(float(n_loss))
            p_losses.append(float(p_loss))
        out["losses"] = (n_losses[0], n_losses[-1], p_losses[0], p_losses[-1])
        out["max_loss_diff"] = max(abs(a - b) for a, b in zip(n_losses, p_losses))
        out["traces_per_step"] = {k: v / steps for k, v in traces.items()}

        # Interleaved timing; which program goes first alternates between rounds. Each call
        # continues from its own state (the named step donates its arguments, as the example's).
        state = {"n": (model, n_state), "p": (params, p_state), "b": init(tw.plain_params(model))}
        jax.block_until_ready(p_step_b(*state["b"], p_batches[0]))  # compile the A/A copy

        def call(name: str, step: Any, batch: Any) -> Callable[[], Any]:
            def run_step() -> Any:
                *state[name], loss = step(*state[name], batch)
                return loss

            return run_step

        ratios, aa, t_named, t_plain = [], [], [], []
        for r in range(rounds):
            nb, pb = n_batches[r % steps], p_batches[r % steps]
            calls = [
                ("n", call("n", n_step, nb)),
                ("p", call("p", p_step, pb)),
                ("b", call("b", p_step_b, pb)),
            ]
            if r % 2:
                calls.reverse()
            t = {name: timed(call)[0] for name, call in calls}
            ratios.append(t["n"] / t["p"])
            aa.append(t["b"] / t["p"])
            t_named.append(t["n"])
            t_plain.append(t["p"])
        out["ratio"] = statistics.median(ratios)
        out["aa_ratio"] = statistics.median(aa)
        out["named_ms"] = statistics.median(t_named) * 1e3
        out["plain_ms"] = statistics.median(t_plain) * 1e3

        n_hlo = n_step.lower(*state["n"], n_batches[0]).compile().as_text()
        p_hlo = p_step.lower(*state["p"], p_batches[0]).compile().as_text()
    out["collectives"] = (tw.collectives(n_hlo), tw.collectives(p_hlo))
    return out


def report(res: dict[str, Any]) -> None:
    print(f"\n== mesh {res['mesh']}")
    n0, n1, p0, p1 = res["losses"]
    print(
        f"loss      namedaxes {n0:.5f} -> {n1:.5f}   plain {p0:.5f} -> {p1:.5f}   "
        f"max |diff| {res['max_loss_diff']:.2e}"
    )
    print(
        f"step time namedaxes {res['named_ms']:.2f} ms   plain {res['plain_ms']:.2f} ms   "
        f"median ratio {res['ratio']:.3f}   A/A plain/plain {res['aa_ratio']:.3f}"
    )
    print(f"first call namedaxes {res['first_named_s']:.2f} s   plain {res['first_plain_s']:.2f} s")
    print(f"traces per step {res['traces_per_step']}")
    named, plain = res["collectives"]
    same = all(sorted(named[op]) == sorted(plain[op]) for op in tw.COLLECTIVES)
    print(f"collectives ({'identical' if same else 'DIFFERENT'}):")
    for op in tw.COLLECTIVES:
        if named[op] or plain[op]:
            print(f"  {op:19s} namedaxes {len(named[op]):3d}   plain {len(plain[op]):3d}")
            if sorted(named[op]) != sorted(plain[op]):
                only_n = Counter(named[op]) - Counter(plain[op])
                only_p = Counter(plain[op]) - Counter(named[op])
                print(f"      only namedaxes: {dict(only_n)}\n      only plain:     {dict(only_p)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=("default", "tiny"), default="default")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--mesh", choices=("auto", "explicit", "both"), default="both")
    args = parser.parse_args()
    size = tw.TINY if args.config == "tiny" else tw.SIZES["small"]
    kinds = {"auto": [AxisType.Auto], "explicit": [AxisType.Explicit]}.get(
        args.mesh, [AxisType.Auto, AxisType.Explicit]
    )
    print(f"size {size}\nmodel {tw.model_config(size, size.vocab)}")
    print(f"parameters {tw.PARAMS}\ncompute    {tw.COMPUTE}")
    for kind in kinds:
        report(run(size, kind, args.steps, args.rounds))


if __name__ == "__main__":
    main()
