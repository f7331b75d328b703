"""Per-call cost of ``fsdp``/``named_jit`` over ``jax.jit`` at the main example's size.

Run: ``python benchmarks/step_overhead.py`` (``--rounds 40``, ``--mesh auto|explicit|both``). The
model is examples/train_lm.py's Llama-style Transformer with optax AdamW (through
``benchmarks/_twin.py``), on 8 simulated CPU devices as (data=2, model=4). Three figures per mesh
kind:

* **wrapper alone**: the ``fsdp`` step with its compiled call stubbed (the cached program is
  replaced by a function returning the outputs of one real call), so what remains is namedaxes'
  own Python per call: flattening the arguments, the cache lookups, the input-placement check and
  rebuilding the outputs. Next to it, the floor any pytree wrapper pays (one ``tree_flatten`` of
  the arguments and one ``unflatten`` of the outputs, which ``jax.jit`` does too, in C++ calling
  the same pytree callbacks): the difference is what namedaxes adds per call. A third line calls
  it with arguments whose arrays carry new (equal) sharding objects every call, as a runtime that
  builds fresh sharding objects for each step's outputs does.
* **whole step, back to back**: the ``fsdp`` step against ``jax.jit`` of the same body (the same
  mapping in force, ``out_shardings`` set to what ``fsdp`` returns), each called ``--calls`` times
  back to back per round, rounds interleaved and alternating in order; the difference of the
  medians is the per-call overhead, and an A/A run (``jax.jit`` against a second ``jax.jit`` of the
  same body) shows how much of it is noise.
* the same whole-step comparison for ``named_jit`` with the compute mapping. That is another
  program (parameters placed by the compute mapping, not sharded over ``data``): with the same
  (FSDP-placed) inputs it moves them to its layout every call, and in the training loop it keeps
  them there and gathers nothing, so its whole-step ratios say how the layouts differ, not what
  the wrapper costs; its per-call cost is the stubbed line below.

Times are only meaningful on a quiet machine; the A/A ratio says how quiet it was.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax

jax.config.update("jax_num_cpu_devices", 8)  # CPU only; an accelerator runs on its own devices

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import equinox as eqx
from jax.sharding import AxisType, NamedSharding, PartitionSpec

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _twin as tw  # noqa: E402
from _timing import per_call  # noqa: E402

import namedaxes as na  # noqa: E402


def body_for(cfg: tw.Size) -> Callable[..., Any]:
    """The example's step body, with the compute mapping in force (what ``fsdp`` traces)."""
    opt = tw.optimizer(cfg)

    def body(model: Any, opt_state: Any, batch: na.NamedArray) -> Any:
        with na.axis_mapping(tw.COMPUTE):
            loss, grads = eqx.filter_value_and_grad(tw.train_lm.loss_fn)(model, batch)
            with jax.numpy_dtype_promotion("standard"):
                updates, opt_state = opt.update(grads, opt_state, model)
            return eqx.apply_updates(model, updates), opt_state, loss

    return body


class _Stub:
    """Stands in for a compiled program: runs it once, then returns those outputs every call."""

    def __init__(self, real: Callable[..., Any]) -> None:
        self.real = real
        self.out: Any = None

    def __call__(self, *args: Any) -> Any:
        if self.out is None:
            self.out = jax.block_until_ready(self.real(*args))
        return self.out


def stub_programs(wrapped: Any) -> int:
    """Replace every compiled program ``wrapped`` (a named_jit/fsdp function) holds by a stub."""
    n = 0
    for entry in wrapped._fast.values():
        programs = entry[1].values() if isinstance(entry[1], dict) else [entry[1]]
        for program in programs:
            program.jitted = _Stub(program.jitted)
            n += 1
    return n


def rewrapped(tree: Any) -> Any:
    """``tree`` with every array a new ``jax.Array`` object over the same buffers, whose sharding is
    a new object, equal in value, with trailing ``None`` spec entries dropped: what a runtime that
    builds fresh sharding objects for a program's outputs hands the next step."""

    def new(x: Any) -> Any:
        if not isinstance(x, jax.Array) or not isinstance(x.sharding, NamedSharding):
            return x
        entries = list(x.sharding.spec)
        while entries and entries[-1] is None:
            entries.pop()
        sharding = NamedSharding(x.sharding.mesh, PartitionSpec(*entries))
        shards = [s.data for s in x.addressable_shards]
        return jax.make_array_from_single_device_arrays(x.shape, sharding, shards)

    return jax.tree.map(new, tree)


def interleaved(
    fns: dict[str, Callable[[], Any]], calls: int, rounds: int
) -> dict[str, list[float]]:
    """Per-call times of each function over ``rounds`` rounds, the order alternating each round."""
    for fn in fns.values():
        for _ in range(3):  # warm: a training loop's second step may compile for new layouts
            jax.block_until_ready(fn())
    times: dict[str, list[float]] = {k: [] for k in fns}
    order = list(fns)
    for r in range(rounds):
        for name in order if r % 2 == 0 else order[::-1]:
            times[name].append(per_call(fns[name], calls))
    return times


def show(t: dict[str, list[float]], title: str) -> None:
    """Median per-call times, their difference to ``jax.jit`` and the median paired ratio."""
    base = statistics.median(t["jax.jit"])
    print(f"{title:<28}{'us/call':>10}{'- jax.jit us':>14}{'ratio':>8}")
    for name, values in t.items():
        value = statistics.median(values)
        ratio = statistics.median(a / b for a, b in zip(values, t["jax.jit"]))
        print(f"  {name:<26}{value:>10.1f}{value - base:>14.1f}{ratio:>8.3f}")


def run(cfg: tw.Size, kind: AxisType, calls: int, rounds: int) -> None:
    n = len(jax.devices())
    shape = (2, n // 2) if n % 2 == 0 else (n, 1)  # (data=2, model=4) on 8 CPU devices
    mesh = jax.make_mesh(shape, ("data", "model"), axis_types=(kind,) * 2)
    model, opt_state = tw.named_init(cfg, mesh)
    body = body_for(cfg)
    with jax.set_mesh(mesh):
        batch = na.shard(tw.named_batch(tw.batches(cfg, 1)[0]), tw.COMPUTE)
        step = na.fsdp(body, tw.PARAMS, tw.COMPUTE)
        nj = na.named_jit(body, tw.COMPUTE)
        out = step(model, opt_state, batch)
        shardings = jax.tree.map(lambda x: x.sharding, out)
        plain = jax.jit(body, out_shardings=shardings)
        plain_b = jax.jit(body_for(cfg), out_shardings=shardings)  # A/A: a second program
        n_leaves = len(jax.tree_util.tree_leaves((model, opt_state, batch)))
        print(f"\n== mesh {dict(mesh.shape)} {kind.name}: {n_leaves} argument leaves")

        t = interleaved(
            {
                "fsdp": lambda: step(model, opt_state, batch),
                "named_jit": lambda: nj(model, opt_state, batch),
                "jax.jit": lambda: plain(model, opt_state, batch),
                "jax.jit (A/A)": lambda: plain_b(model, opt_state, batch),
            },
            calls,
            rounds,
        )
        show(t, "whole step, same inputs")

        # A training loop: each call gets the previous call's outputs (new arrays every step).
        def loop(fn: Callable[..., Any]) -> Callable[[], Any]:
            state = [model, opt_state]

            def call() -> Any:
                state[0], state[1], loss = fn(state[0], state[1], batch)
                return loss

            return call

        t = interleaved(
            {
                "fsdp": loop(step),
                "named_jit": loop(nj),
                "jax.jit": loop(plain),
                "jax.jit (A/A)": loop(plain_b),
            },
            calls,
            rounds,
        )
        show(t, "whole step, training loop")

        # The wrapper alone: stub the compiled programs, keep everything else.
        stubbed_fsdp = na.fsdp(body, tw.PARAMS, tw.COMPUTE)
        stubbed_nj = na.named_jit(body, tw.COMPUTE)
        stubbed_fsdp(model, opt_state, batch), stubbed_nj(model, opt_state, batch)
        n = stub_programs(stubbed_fsdp) + stub_programs(stubbed_nj)
        assert n == 2, f"expected one cached program each, found {n}"
        args = ((model, opt_state, batch), {})
        outs = stubbed_fsdp(model, opt_state, batch)
        out_def = jax.tree_util.tree_structure(outs)
        out_leaves = jax.tree_util.tree_leaves(outs)

        def floor() -> Any:
            jax.tree_util.tree_flatten(args)
            return out_def.unflatten(out_leaves)

        # Two copies of the arguments whose arrays carry new, equal sharding objects, alternated:
        # a wrapper that trusts only the very same sharding object checks every leaf each call.
        copies = [rewrapped((model, opt_state, batch)) for _ in range(2)]
        turn = [0]

        def fresh_shardings() -> Any:
            turn[0] ^= 1
            return stubbed_fsdp(*copies[turn[0]])

        w = interleaved(
            {
                "fsdp, program stubbed": lambda: stubbed_fsdp(model, opt_state, batch),
                "named_jit, program stubbed": lambda: stubbed_nj(model, opt_state, batch),
                "fsdp, new sharding objects": fresh_shardings,
                "flatten + unflatten only": floor,
            },
            calls * 20,
            rounds,
        )
        print(f"{'wrapper alone':<28}{'us/call':>10}{'min':>8}")
        for name, values in w.items():
            print(f"  {name:<26}{statistics.median(values):>10.1f}{min(values):>8.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--mesh", choices=("auto", "explicit", "both"), default="both")
    args = parser.parse_args()
    kinds = {"auto": [AxisType.Auto], "explicit": [AxisType.Explicit]}.get(
        args.mesh, [AxisType.Auto, AxisType.Explicit]
    )
    size = tw.SIZES["small"]  # the example's default
    print(f"jax {jax.__version__}, {len(jax.devices())} devices, size {size}")
    for kind in kinds:
        run(size, kind, args.calls, args.rounds)


if __name__ == "__main__":
    main()
