"""Load time and peak host memory of namedaxes.models.from_hf for a checkpoint of about 1 GB.

Run: ``python benchmarks/hf_load.py [--dir DIR] [--layers 12]``. A Llama-shaped float32 model
(vocab 32000, hidden 1024, 16 heads / 4 key-value heads, MLP 4096, untied head; 12 layers give
about 0.98 GB) is written once with ``save_hf``. Then each way of loading it runs in a fresh process
on 8 simulated CPU devices, and reports its wall time and its peak resident memory
(``resource.getrusage(...).ru_maxrss``) against the memory the process had before loading (JAX
imported, mesh made):

- ``from_hf`` with the mapping ``{"embed": "data", "heads": "model", "mlp": "model", "vocab":
  "model"}`` on a (data=2, model=4) mesh: each parameter made in its sharding from the blocks its
  devices hold;
- ``from_hf`` with no mapping and no mesh (the whole model on one device);
- for comparison, the usual route: ``safetensors.numpy.load_file`` of the whole file, then
  ``na.shard`` by the same mapping.

On CPU the "devices" are host memory, so what the 8 devices hold (printed as ``on devices``) is
part of the process's memory: the figure to compare with the file size is ``peak - before -
on devices``, the transient host memory of the load. Timings are wall clock with a warm page cache
(the file was just written); on a busy machine they are indicative only.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MAPPING = {"embed": "data", "heads": "model", "mlp": "model", "vocab": "model"}


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def make(folder: str, layers: int) -> None:
    import jax

    from namedaxes import models

    cfg = models.TransformerConfig(
        "llama",
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=4096,
        num_layers=layers,
        num_heads=16,
        num_kv_heads=4,
        head_dim=64,
    )
    models.save_hf(models.Transformer(cfg, key=jax.random.key(0)), folder)


def load(folder: str, how: str) -> dict:
    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    import namedaxes as na
    from namedaxes import models

    mesh = na.mesh.create_mesh((2, 4), ("data", "model"))
    jax.block_until_ready(jax.device_put(0.0))  # runtime up
    before = _rss_mb()
    start = time.perf_counter()
    if how == "from_hf sharded":
        model = models.from_hf(folder, mapping=MAPPING, mesh=mesh)
    elif how == "from_hf one device":
        model = models.from_hf(folder)
    else:
        from safetensors.numpy import load_file

        model = {k: v for k, v in load_file(Path(folder) / "model.safetensors").items()}
        axes = {
            "lm_head.weight": ("vocab", "embed"),
            "model.embed_tokens.weight": ("vocab", "embed"),
        }
        model = {
            k: na.named(v, axes.get(k, ("mlp", "embed") if v.ndim == 2 else ("embed",)))
            for k, v in model.items()
        }
        model = na.shard(model, {**MAPPING, "mlp": "model"}, mesh=mesh)
    jax.block_until_ready(model)
    seconds = time.perf_counter() - start
    held = sum(
        s.data.nbytes for x in jax.tree.leaves(model) for s in getattr(x, "addressable_shards", [])
    )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": seconds, "before_mb": before, "peak_mb": peak, "held_mb": held / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(load(*args.child)))
        return
    folder = args.dir or tempfile.mkdtemp(prefix="hf_load_")
    if not (Path(folder) / "config.json").exists():
        subprocess.run(
            [
                sys.executable,
                "-c",
                f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
                f"import hf_load; hf_load.make({folder!r}, {args.layers})",
            ],
            check=True,
        )
    size = sum(p.stat().st_size for p in Path(folder).glob("*.safetensors")) / 2**20
    print(f"checkpoint: {folder}, {size:.0f} MiB of safetensors")
    print(
        f"{'load':22s} {'time':>7s} {'before':>8s} {'peak':>8s} {'on devices':>11s} {'transient':>10s}"
    )
    for how in ("from_hf sharded", "from_hf one device", "load_file + shard"):
        out = subprocess.run(
            [sys.executable, __file__, "--child", folder, how],
            check=True,
            capture_output=True,
            text=True,
        )
        r = json.loads(out.stdout.strip().splitlines()[-1])
        transient = r["peak_mb"] - r["before_mb"] - r["held_mb"]
        print(
            f"{how:22s} {r['seconds']:6.2f}s {r['before_mb']:7.0f}M {r['peak_mb']:7.0f}M "
            f"{r['held_mb']:10.0f}M {transient:9.0f}M"
        )


if __name__ == "__main__":
    main()
