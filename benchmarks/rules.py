"""Time each sharding rule and ``estimate_memory_usage`` on a pytree of 10,000 leaves.

Run: ``python benchmarks/rules.py [--leaves 10000] [--devices 256]``. The mesh is an ``AbstractMesh``
(no devices needed); the tree is abstract (``ShapeDtypeStruct``s, half of them in NamedArrays), so
nothing is allocated. Shapes repeat as in real models (a few hundred distinct shapes over many
layers) and a fraction of specs shard unevenly to exercise the exact per-device path. Reports the
median and the best of ``--repeat`` runs per operation, with the garbage collector on as in real
use: the median includes what collections cost, the best is closer to the work itself.

Targets on 10,000 leaves and a 16x16 mesh, medians on a quiet machine: ShapeBasedShardingRule
< 14 ms, estimate_memory_usage < 45 ms, validate_partition_specs < 11 ms.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

import namedaxes as na


def build_tree(n_leaves: int, seed: int = 0) -> dict[str, Any]:
    """``{layer_i: {...}}`` with ``n_leaves`` array leaves of model-like shapes."""
    rng = np.random.default_rng(seed)
    dims = [64, 128, 256, 512, 1024, 4096, 96, 100, 7]
    tree: dict[str, Any] = {}
    for i in range(n_leaves):
        rank = int(rng.integers(1, 4))
        shape = tuple(int(rng.choice(dims)) for _ in range(rank))
        leaf = jax.ShapeDtypeStruct(shape, "bfloat16" if i % 3 else "float32")
        if i % 2:
            names = ("embed", "mlp", "heads")[:rank]
            leaf = na.named(leaf, names)
        tree.setdefault(f"layer_{i // 10}", {})[f"p{i % 10}"] = leaf
    return tree


def timings(fn: Callable[[], Any], repeat: int) -> tuple[float, float]:
    """``(median, best)`` seconds over ``repeat`` calls (garbage collector on)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times)


def report(label: str, fn: Callable[[], Any], repeat: int) -> None:
    median, best = timings(fn, repeat)
    print(f"  {label:<36} {median * 1e3:8.1f} ms {best * 1e3:8.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leaves", type=int, default=10_000)
    parser.add_argument("--devices", type=int, default=256, choices=[8, 64, 256])
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()

    side = int(math.isqrt(args.devices))
    mesh = AbstractMesh((side, args.devices // side), ("data", "model"))
    tree = build_tree(args.leaves)
    mapping = {"embed": "data", "mlp": "model", "heads": "model"}
    rules = {
        "LogicalAxisRule": na.rules.LogicalAxisRule(mapping, mesh, unsatisfied="replicate"),
        "AutoShardingRule": na.rules.AutoShardingRule(mesh),
        "ShapeBasedShardingRule": na.rules.ShapeBasedShardingRule(
            [((None, 4096), P(None, "model")), ((4096, None), P("model"))], mesh=mesh
        ),
        "PathRegexRule": na.rules.PathRegexRule(
            [(r"p[02468]$", P()), (r"p[13579]$", na.AxisRules({"embed": "data"}, "replicate"))],
            mesh=mesh,
        ),
        "CompositeShardingRule": na.rules.CompositeShardingRule(
            na.rules.LogicalAxisRule(mapping, mesh, unsatisfied="replicate"),
            na.rules.AutoShardingRule(mesh),
        ),
        "MemoryConstrainedShardingRule": na.rules.MemoryConstrainedShardingRule(
            64 * 1024, mesh, on_unfit="warn"
        ),
        "MeshPartitionHelper": na.rules.MeshPartitionHelper(mesh),
    }
    print(
        f"{args.leaves} leaves, AbstractMesh(data={side}, model={args.devices // side}), "
        f"{args.repeat} runs each"
    )
    print(f"  {'':<36} {'median':>11} {'best':>11}")

    specs = None
    for name, rule in rules.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", na.rules.MemoryBudgetWarning)
            report(name, lambda: rule.apply(tree), args.repeat)
        if name == "AutoShardingRule":
            specs = rule.apply(tree)

    analyzer = na.analysis.ShardingAnalyzer(mesh)
    # A layout with uneven shards too (100 and 7 over 16 ways): the exact per-device path.
    uneven = jax.tree.map(
        lambda x: P(*(["model"] + [None] * (x.ndim - 1))), tree, is_leaf=na.is_named_array
    )
    for label, s in (
        ("estimate_memory_usage (Auto specs)", specs),
        ("estimate_memory_usage (uneven)", uneven),
    ):
        report(label, lambda: analyzer.estimate_memory_usage(tree, s), args.repeat)
    report(
        "validate_partition_specs",
        lambda: analyzer.validate_partition_specs(tree, specs),
        args.repeat,
    )
    relaxed = na.AxisRules(mapping, unsatisfied="replicate")
    report("memory_report", lambda: na.analysis.memory_report(tree, relaxed, mesh), args.repeat)


if __name__ == "__main__":
    main()
