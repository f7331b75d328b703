"""Generate text from a Hugging Face checkpoint folder with ``namedaxes.models``.

    python examples/generate.py PATH "1 2 3"            # token ids: no tokenizer needed
    python examples/generate.py PATH "Once upon a time" --max-new-tokens 64 --temperature 0.8

``PATH`` is a folder with ``config.json`` and safetensors weights (one of ``SUPPORTED_MODEL_TYPES``),
for example one downloaded with ``huggingface_hub.snapshot_download``. A prompt made only of
integers is read as token ids; any other prompt is encoded with the folder's ``tokenizer.json``,
read with Hugging Face's ``tokenizers`` package (``pip install tokenizers``). Generation stops at
the eos id of the folder's ``generation_config.json`` (or ``config.json``) unless ``--eos`` says
otherwise. The first call compiles the prefill and the decoding loop; the second call of the same
shapes runs them compiled, and its tokens per second are printed. Compiled programs are kept in
JAX's persistent compilation cache (``--compile-cache DIR``, default ``~/.cache/namedaxes/jax``;
``--no-compile-cache``), so running the script again with a prompt of the same bucket compiles
nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from caches import add_compile_cache_option, use_compile_cache  # noqa: E402

import namedaxes as na  # noqa: E402
from namedaxes import models  # noqa: E402


def tokenizer(folder: Path) -> Any:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise SystemExit(
            "A text prompt needs Hugging Face's tokenizers package: pip install tokenizers "
            '(or pass token ids, e.g. "1 2 3").'
        ) from None
    path = folder / "tokenizer.json"
    if not path.exists():
        raise SystemExit(f'No tokenizer.json in {folder}: pass token ids instead, e.g. "1 2 3".')
    return Tokenizer.from_file(str(path))


def eos_of(folder: Path) -> Any:
    for name in ("generation_config.json", "config.json"):
        path = folder / name
        if path.exists():
            eos = json.loads(path.read_text()).get("eos_token_id")
            if eos is not None:
                return eos
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path, help="checkpoint folder (config.json + safetensors)")
    parser.add_argument("prompt", help='token ids ("1 2 3") or text (needs tokenizer.json)')
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eos", type=int, default=None, help="default: the folder's eos id")
    parser.add_argument("--dtype", default=None, help="e.g. bfloat16 (default: as stored)")
    add_compile_cache_option(parser)
    args = parser.parse_args()
    use_compile_cache(args.compile_cache)

    pieces = args.prompt.split()
    tok = None
    if pieces and all(p.lstrip("-").isdigit() for p in pieces):
        ids = [int(p) for p in pieces]
    else:
        tok = tokenizer(args.path)
        ids = tok.encode(args.prompt).ids
    model = models.from_hf(args.path, dtype=args.dtype)
    prompt = na.named(jnp.asarray([ids], jnp.int32), ("batch", "position"))
    options = dict(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        key=jax.random.key(args.seed),
        eos_token_id=args.eos if args.eos is not None else eos_of(args.path),
    )
    start = time.perf_counter()
    out = jax.block_until_ready(models.generate(model, prompt, **options))
    first = time.perf_counter() - start
    start = time.perf_counter()
    out = jax.block_until_ready(models.generate(model, prompt, **options))
    took = time.perf_counter() - start
    new = [int(t) for t in out.array[0, len(ids) :]]
    print(f"{model.config.model_type}: {len(ids)} prompt tokens, {len(new)} new tokens")
    print("new ids:", " ".join(map(str, new)))
    if tok is not None:
        print("text:", tok.decode(list(ids) + new))
    print(f"first call (compiles) {first:.2f} s; compiled: {took:.3f} s, "
          f"{len(new) / took:.1f} tokens/s on {jax.devices()[0].device_kind}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
