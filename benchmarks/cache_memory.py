"""Memory held per cached program: named_jit (one entry per mapping) vs jax.jit (one per static value).

Run: ``python benchmarks/cache_memory.py [N]``. Each side compiles N programs of the same small
function (named_jit: N distinct context mappings; jax.jit: N distinct static arguments) and reports
the growth of the process's resident memory per program, then named_jit's plateau: its cache is
bounded (64 entries per function), so memory stops growing once entries are evicted. Linux only
(reads /proc/self/statm). Run each side in its own process so one does not reuse the other's pages.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

MODES = ("jax.jit", "named_jit")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def run(mode: str, n: int) -> None:
    import gc

    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    import jax.numpy as jnp

    import namedaxes as na

    mesh = jax.make_mesh((2, 4), ("data", "model"))
    x = na.named(jnp.ones((8, 16)), ("batch", "embed"))
    f = na.named_jit(lambda t: na.named(t.array * 2 + 1, t.axes))
    j = jax.jit(lambda a, k: a * 2 + 1, static_argnums=1)
    gc.collect()
    base = rss_mb()
    marks = []
    with jax.set_mesh(mesh):
        for i in range(n):
            if mode == "named_jit":
                with na.axis_mapping({"batch": "data", f"extra{i}": "model"}):
                    f(x).array.block_until_ready()
            else:
                j(x.array, i).block_until_ready()
            if (i + 1) % (n // 4) == 0:
                gc.collect()
                marks.append(f"{i + 1}: {rss_mb() - base:.0f} MB")
    per = (rss_mb() - base) / n
    print(f"{mode:<10} {per:6.2f} MB per program over {n} programs; growth {', '.join(marks)}")


def main() -> None:
    argv = sys.argv[1:]
    if len(argv) == 2 and argv[0] in MODES:  # the private child form ``MODE N`` (see below)
        run(argv[0], int(argv[1]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "n", type=int, nargs="?", default=256, help="programs each side compiles (default 256)"
    )
    n = parser.parse_args(argv).n
    if n < 4:
        parser.error(f"n must be at least 4 (memory is sampled every n // 4 programs), got {n}")
    for mode in MODES:  # each side in a fresh process, so one does not reuse the other's pages
        subprocess.run([sys.executable, __file__, mode, str(n)], check=True)


if __name__ == "__main__":
    main()
