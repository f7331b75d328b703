"""First-run and second-run cost of the main example's text pipeline (examples/text_data.py).

Run: ``python benchmarks/text_data.py [--data PATH] [--vocab-size N]``. Builds the corpus (default:
this Python's standard library) in a fresh temporary cache, timing each stage (discovery, tokenizer
training, encoding + writing), then loads it again from the cache, then times batch assembly on 8
CPU devices. Needs the ``examples`` extra (``tokenizers``).
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax

jax.config.update("jax_num_cpu_devices", 8)

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

import text_data as td  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=None, help="a folder or text file (default: stdlib)")
    parser.add_argument("--vocab-size", type=int, default=4096)
    args = parser.parse_args()

    stages: dict[str, float] = {}

    def timed(name, fn):
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                stages[name] = stages.get(name, 0.0) + time.perf_counter() - t

        return wrapper

    # Wrap the stages load_text calls (module globals, so the wrappers are what it finds).
    td.discover = timed("corpus discovery", td.discover)
    td._train_tokenizer = timed("tokenizer training", td._train_tokenizer)
    td._encode_split = timed("encoding both splits (written to disk)", td._encode_split)

    with tempfile.TemporaryDirectory() as cache:
        t = time.perf_counter()
        text = td.load_text(args.data, vocab_size=args.vocab_size, cache_dir=cache)
        cold = time.perf_counter() - t
        first = dict(stages)
        t = time.perf_counter()
        again = td.load_text(args.data, vocab_size=args.vocab_size, cache_dir=cache)
        warm = time.perf_counter() - t
        assert not text.from_cache and again.from_cache
        print(again.summary())
        print("first run:")
        for name, seconds in first.items():
            print(f"  {name:40s} {seconds:7.2f} s")
        print(f"  {'load_text in all':40s} {cold:7.2f} s")
        print(f"second run (cache hit, discovery included): {warm * 1e3:.0f} ms")

        mesh = jax.make_mesh((2, 4), ("data", "model"))
        for batch in (32, 256):
            build = lambda step: again.train_batch(  # noqa: E731
                step, batch=batch, length=129, mapping={"batch": "data"}, mesh=mesh
            )
            jax.block_until_ready(build(0).array)
            t = time.perf_counter()
            for step in range(1, 21):
                x = build(step)
            jax.block_until_ready(x.array)
            ms = (time.perf_counter() - t) / 20 * 1e3
            print(f"train_batch (batch={batch}, position=129) on {dict(mesh.shape)}: {ms:.2f} ms")


if __name__ == "__main__":
    main()
