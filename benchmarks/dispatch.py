"""Per-call dispatch cost of named_jit vs jax.jit, and of shard vs jax.device_put (8 CPU devices).

Run: ``python benchmarks/dispatch.py``. Every number is a cached call (compiled / already placed);
ratios compare measurements taken in the same run, interleaved to share machine noise. The
times include executing the (tiny) computation, as a training step's dispatch would.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax

jax.config.update("jax_num_cpu_devices", 8)

import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax.numpy as jnp
from jax.sharding import NamedSharding

import namedaxes as na

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import per_call  # noqa: E402

MAPPING = {"batch": "data", "embed": "model"}
ROUNDS = int(os.environ.get("DISPATCH_ROUNDS", "30"))


def tree_of(n: int, mesh: Any) -> list[na.NamedArray]:
    leaves = [na.named(jnp.ones((8, 4)), ("batch", "embed")) for _ in range(n)]
    return na.shard(leaves, MAPPING, mesh)


def compare(
    a: Callable[[], Any], b: Callable[[], Any], calls: int, rounds: int = ROUNDS
) -> tuple[float, float, float]:
    """Best per-call times of ``a`` and ``b`` over alternating rounds, and the median of the
    per-round ratios. The minimum is the least noisy estimate of intrinsic cost; the paired median
    shows what a typical round looks like when both share the same machine noise."""
    a(), b()  # warm (compile/cache)
    ta, tb = [], []
    for _ in range(rounds):
        ta.append(per_call(a, calls))
        tb.append(per_call(b, calls))
    return min(ta), min(tb), statistics.median(x / y for x, y in zip(ta, tb))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.parse_args()  # no options: --help, and a typo is an error rather than a full run
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    print(f"jax {jax.__version__}, {len(jax.devices())} devices, mesh {dict(mesh.shape)}")
    print(f"{'case':<44}{'namedaxes us':>14}{'jax us':>10}{'ratio':>8}{'median ratio':>14}")
    with jax.set_mesh(mesh), na.axis_mapping(MAPPING):
        for n in (1, 200):
            tree = tree_of(n, mesh)
            shardings = [NamedSharding(mesh, na.resolve(x.axes, MAPPING, mesh)) for x in tree]

            def body(t: list[na.NamedArray]) -> list[na.NamedArray]:
                return [na.named(x.array + 1, x.axes) for x in t]

            nj = na.named_jit(body)
            jj = jax.jit(body, out_shardings=shardings)
            calls = 300 if n == 1 else 40
            t_a, t_b, med = compare(lambda: jj(tree), lambda: jj(tree), calls)
            print(
                f"{f'A/A: jax.jit vs itself, {n} leaves':<44}{t_a:>14.1f}{t_b:>10.1f}{t_a / t_b:>8.2f}{med:>14.2f}"
            )
            t_na, t_jax, med = compare(lambda: nj(tree), lambda: jj(tree), calls)
            print(
                f"{f'named_jit vs jax.jit, {n} leaves':<44}{t_na:>14.1f}{t_jax:>10.1f}{t_na / t_jax:>8.2f}{med:>14.2f}"
            )

        for n in (1, 200):
            # fsdp: parameters by one mapping (embed on data), batch and body by another.
            params_map = {"embed": "data"}
            compute_map = {"batch": "data"}
            params = na.shard(
                [na.named(jnp.ones((8, 4)), ("embed", "mlp")) for _ in range(n)], params_map, mesh
            )
            batch = na.shard(na.named(jnp.ones((8, 8)), ("batch", "embed")), compute_map, mesh)
            p_shardings = [x.array.sharding for x in params]

            def step(p: list[na.NamedArray], b: na.NamedArray) -> list[na.NamedArray]:
                return [na.named(w.array * 0.5, w.axes) for w in p]

            fs = na.fsdp(step, params_map, compute_map)
            jj = jax.jit(step, out_shardings=p_shardings)
            calls = 300 if n == 1 else 40
            t_na, t_jax, med = compare(lambda: fs(params, batch), lambda: jj(params, batch), calls)
            print(
                f"{f'fsdp vs jax.jit, {n} leaves':<44}{t_na:>14.1f}{t_jax:>10.1f}{t_na / t_jax:>8.2f}{med:>14.2f}"
            )

        for n in (1, 200):
            tree = tree_of(n, mesh)
            shardings = [NamedSharding(mesh, na.resolve(x.axes, MAPPING, mesh)) for x in tree]
            calls = 300 if n == 1 else 40
            t_na, t_jax, med = compare(
                lambda: na.shard(tree), lambda: jax.device_put(tree, shardings), calls
            )
            print(
                f"{f'shard vs device_put (placed), {n} leaves':<44}{t_na:>14.1f}{t_jax:>10.1f}{t_na / t_jax:>8.2f}{med:>14.2f}"
            )


if __name__ == "__main__":
    main()
