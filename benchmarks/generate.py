"""Generation speed: ``namedaxes.models.generate`` against a plain-JAX decode loop and recomputation.

Run from the repository root:

    python benchmarks/generate.py                 # CPU: a small model; GPU/TPU: ~100M parameters
    python benchmarks/generate.py --budget 120 --rounds 5 --batches 1,16 --new-tokens 256
    python benchmarks/generate.py --dtype bfloat16 --batches 1 --rounds 2   # the CPU, in bfloat16
    python benchmarks/generate.py --weights bfloat16,int8,float8 --only-weights   # quantized weights

One Llama-style :class:`namedaxes.models.Transformer` with random weights (on an accelerator ~101M
parameters: vocabulary 32768, hidden 768, 12 layers, 12 heads of 64 with 4 key/value heads, MLP
2048, tied head, bfloat16 weights; on a CPU ~5M parameters and fewer tokens, so that the run takes a
minute or two: only ratios mean anything there), a prompt of random tokens, greedy decoding without
eos (every row runs every step). For each batch size:

* ``cached``: the compiled decode loop of :func:`namedaxes.models.generate` (its KV cache and
  ``lax.while_loop``), timed without the prefill (the prefill runs before each round);
* ``plain`` and ``plain A/A``: the same model written in plain JAX from the same arrays (a cache per
  layer stacked into one ``(layer, batch, slot, kv_heads, head_dim)`` buffer, written with
  ``jax.lax.dynamic_update_slice``, a ``lax.scan`` over the layers and its own ``lax.while_loop``),
  compiled twice so that the A/A ratio shows the noise; the three timed interleaved, the order
  rotating between rounds; the table gives medians per token and the ratios cached / plain and
  plain A/A;
* ``recompute``: no cache, one compiled ``while_loop`` in which every step runs the model over the
  whole (prompt + new tokens) buffer and reads the logits of the last filled position: the cost of
  recomputing the prefix; the speedup column is recompute / cached per token;
* ``generate``: end-to-end calls of ``generate`` (prefill + decode + host work) in tokens/s;
* the check that both compute the same thing, where it means something: on a float32 copy of
  the model with float32 matmuls (not TF32). In bfloat16 the logits of random weights are nearly
  flat, so a rounding difference flips a near-tie and every later token follows (an H100 run
  agreed on 0.27 of the tokens, which tells a bug from rounding no better than a coin).
  ``f32 agree`` is the share of equal greedy tokens (1.000 expected) and ``f32 logits`` the
  largest difference of the first step's logits (within ``LOGITS_TOL``); a line after the table
  says whether both hold for every batch size;
* log records of the ``namedaxes`` logger during the calls (none expected: decoding asks for the
  XLA kernel itself).

``--weights bfloat16,int8,float8`` adds a table of the decode loop with the weights as they are
and quantized (``models.quantize``: int8 or float8 values, per-channel scales, dequantized where
used) at each batch size: ms per token and tokens/s, interleaved; the speedup over the first
format; the share of the first format's greedy tokens each gives (random weights: a near-tie
flipped by rounding changes every later token, so a share below 1 is not a bug by itself); and the
largest difference of the first step's logits from the first format's, over their largest value.
``--model 8b-wide`` runs it on an 8B model's width at 8 layers (hidden 4096, MLP 14336, 32/8
heads of 128: ~3.8 GB of bfloat16 weights read per token, so that decoding is bandwidth-bound
as in a real 8B model, where the ~101M model is bound by kernel launches); ``--model
mixtral-wide`` on a mixture of experts of Mixtral's width at 4 layers (8 experts of 14336, top-2,
the grouped dispatch, whose kernel reads the quantized experts' narrow values where
``NAMEDAXES_NARROW_EXPERTS=1`` on GPUs; weights table only).

Each section stops when the time budget is spent (checked between rounds) and prints what it has.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # namedaxes without an install; _timing

from _timing import Budget, clock  # noqa: E402

import namedaxes as na  # noqa: E402
from namedaxes import models  # noqa: E402
from namedaxes.models import _generate as gen  # noqa: E402
from namedaxes.nn._moe_dispatch import narrow_experts_available  # noqa: E402

ACCEL = dict(vocab_size=32768, hidden_size=768, intermediate_size=2048, num_layers=12,
             num_heads=12, num_kv_heads=4, head_dim=64)  # fmt: skip
# An 8B model's width (hidden 4096, MLP 14336, 32 query / 8 key-value heads of 128) at 8 layers:
# decoding reads ~3.8 GB of bfloat16 weights per token, enough to be bandwidth-bound.
WIDE = dict(vocab_size=32768, hidden_size=4096, intermediate_size=14336, num_layers=8,
            num_heads=32, num_kv_heads=8, head_dim=128)  # fmt: skip
CPU = dict(vocab_size=4096, hidden_size=256, intermediate_size=688, num_layers=4, num_heads=4,
           num_kv_heads=2, head_dim=64)  # fmt: skip
# Mixtral's width (8 experts of 14336, top-2, hidden 4096, 32/8 heads of 128) at 4 layers: ~11 GB
# of bfloat16 expert weights, of which a token's two experts read ~2.8 GB a step.
MOE_WIDE = dict(WIDE, num_layers=4, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                moe_dispatch="grouped")  # fmt: skip
MOE_CPU = dict(CPU, intermediate_size=344, num_experts=8, num_experts_per_tok=2,
               norm_topk_prob=True, moe_dispatch="grouped")  # fmt: skip
# The first step's logits of the two float32 runs differ by summation order only.
LOGITS_TOL = 1e-3


def on_accelerator() -> bool:
    return jax.default_backend() in ("gpu", "tpu")


# -- the plain twin ------------------------------------------------------------------------------


def plain_params(model: models.Transformer) -> dict[str, jax.Array]:
    """The named model's arrays in a fixed axis order (no copies of the values)."""
    s = model.layers.stacked

    def a(x: na.NamedArray, names: str) -> jax.Array:
        return na.rearrange(x, tuple(names.split())).array

    return {
        "embed": a(model.embed.weight, "vocab embed"),
        "attn_norm": a(s.attn_norm.weight, "layer embed"),
        "wq": a(s.attn.q_proj.weight, "layer embed heads head_dim"),
        "wk": a(s.attn.k_proj.weight, "layer embed kv_heads head_dim"),
        "wv": a(s.attn.v_proj.weight, "layer embed kv_heads head_dim"),
        "wo": a(s.attn.o_proj.weight, "layer heads head_dim embed"),
        "mlp_norm": a(s.mlp_norm.weight, "layer embed"),
        "gate": a(s.mlp.gate.weight, "layer embed mlp"),
        "up": a(s.mlp.up.weight, "layer embed mlp"),
        "down": a(s.mlp.down.weight, "layer mlp embed"),
        "final_norm": a(model.final_norm.weight, "embed"),
    }


def plain_decoder(cfg: models.TransformerConfig) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """``(prefill, decode)`` in plain JAX: the Transformer's math for a tied Llama config."""
    eps, theta, hd = cfg.norm_eps, cfg.rope_theta, cfg.head_dim
    f32 = jnp.float32

    def rms(x: jax.Array, w: jax.Array) -> jax.Array:
        xf = x.astype(f32)
        y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
        return (y * w.astype(f32)).astype(x.dtype)

    def rope(x: jax.Array, pos: jax.Array) -> jax.Array:  # x (B, T, heads, H), pos (B, T)
        inv = 1.0 / theta ** (jnp.arange(0, hd, 2, dtype=f32) / hd)
        ang = pos.astype(f32)[..., None] * inv
        ang = jnp.concatenate([ang, ang], axis=-1)[:, :, None, :]
        cos, sin = jnp.cos(ang).astype(x.dtype), jnp.sin(ang).astype(x.dtype)
        half = hd // 2
        rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos + rotated * sin

    def forward(p: dict, tokens: jax.Array, pos: jax.Array, ck: jax.Array, cv: jax.Array,
                index: Any) -> tuple[jax.Array, jax.Array, jax.Array]:  # fmt: skip
        """Hidden state of the last position, and the caches with ``tokens`` written at ``index``."""
        x = p["embed"][tokens]
        b, t = tokens.shape
        s, kv = ck.shape[2], ck.shape[3]
        allowed = jnp.arange(s)[None, :] <= jnp.arange(t)[:, None] + index  # (T, S)

        def layer(carry: Any, xs: Any) -> Any:
            x, ck, cv = carry
            w, i = xs
            h = rms(x, w["attn_norm"])
            q = rope(jnp.einsum("bte,enh->btnh", h, w["wq"]), pos)
            k = rope(jnp.einsum("bte,ekh->btkh", h, w["wk"]), pos)
            v = jnp.einsum("bte,ekh->btkh", h, w["wv"])
            ck = jax.lax.dynamic_update_slice(ck, k[None].astype(ck.dtype), (i, 0, index, 0, 0))
            cv = jax.lax.dynamic_update_slice(cv, v[None].astype(cv.dtype), (i, 0, index, 0, 0))
            keys, values = ck[i], cv[i]
            g = q.shape[2] // kv
            scores = jnp.einsum("btkgh,bskh->bkgts", q.reshape(b, t, kv, g, hd), keys,
                                preferred_element_type=f32) * jnp.asarray(hd**-0.5, f32)  # fmt: skip
            scores = jnp.where(allowed, scores, jnp.finfo(f32).min)
            weights = jax.nn.softmax(scores, axis=-1).astype(values.dtype)
            out = jnp.einsum("bkgts,bskh->btkgh", weights, values).reshape(b, t, kv * g, hd)
            x = x + jnp.einsum("btnh,nhe->bte", out, w["wo"])
            h = rms(x, w["mlp_norm"])
            gate = jnp.einsum("bte,em->btm", h, w["gate"])
            up = jnp.einsum("bte,em->btm", h, w["up"])
            x = x + jnp.einsum("btm,me->bte", jax.nn.silu(gate) * up, w["down"])
            return (x, ck, cv), None

        per_layer = {k: v for k, v in p.items() if k not in ("embed", "final_norm")}
        xs = (per_layer, jnp.arange(cfg.num_layers))
        (x, ck, cv), _ = jax.lax.scan(layer, (x, ck, cv), xs)
        return rms(x[:, -1], p["final_norm"]), ck, cv

    def logits(p: dict, h: jax.Array) -> jax.Array:
        return jnp.einsum("be,ve->bv", h, p["embed"]).astype(f32)

    def prefill(p: dict, tokens: jax.Array, length: int) -> tuple[Any, ...]:
        b, t = tokens.shape
        shape = (cfg.num_layers, b, length, cfg.num_kv_heads, hd)
        ck = jnp.zeros(shape, p["embed"].dtype)
        cv = jnp.zeros(shape, p["embed"].dtype)
        pos = jnp.broadcast_to(jnp.arange(t), (b, t))
        h, ck, cv = forward(p, tokens, pos, ck, cv, 0)
        return logits(p, h), ck, cv

    def decode(p: dict, first: jax.Array, ck: jax.Array, cv: jax.Array, start: int,
               steps: int) -> tuple[jax.Array, jax.Array, jax.Array]:  # fmt: skip
        b = first.shape[0]
        token = jnp.argmax(first, axis=-1).astype(jnp.int32)
        out = jnp.zeros((b, steps), jnp.int32).at[:, 0].set(token)

        def body(c: Any) -> Any:
            step, out, ck, cv, last = c
            index = start + step - 1
            pos = jnp.full((b, 1), index, jnp.int32)
            h, ck, cv = forward(p, last[:, None], pos, ck, cv, index)
            token = jnp.argmax(logits(p, h), axis=-1).astype(jnp.int32)
            out = jax.lax.dynamic_update_slice(out, token[:, None], (0, step))
            return step + 1, out, ck, cv, token

        init = (jnp.asarray(1, jnp.int32), out, ck, cv, token)
        _, out, ck, cv, _ = jax.lax.while_loop(lambda c: c[0] < steps, body, init)
        return out, ck, cv

    return prefill, decode


# -- recomputation -------------------------------------------------------------------------------


@na.named_jit
def recompute(model: models.Transformer, prompt: na.NamedArray, *, steps: int) -> na.NamedArray:
    """Greedy tokens without a cache: each step runs the model over the whole buffer."""
    n = prompt.axis_size("position")
    buf = na.pad(prompt, {"position": (0, steps)})

    def body(c: Any) -> Any:
        step, buf = c
        hidden = model.hidden_states(buf)
        last = hidden["position", na.ds(n + step - 1, 1)]
        token = na.argmax(model.logits(last), "vocab").astype(buf.dtype)
        return step + 1, na.updated_slice(buf, {"position": n + step}, token)

    return jax.lax.while_loop(lambda c: c[0] < steps, body, (jnp.asarray(0, jnp.int32), buf))[1]


# -- one batch size ------------------------------------------------------------------------------


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def cached_decoder(model: models.Transformer, tokens: jax.Array, new: int) -> Callable[[], Any]:
    """generate's programs: each call runs the prefill, then the decode loop timed; it returns
    ``(seconds of the decode, tokens (batch, new), the first step's logits)``."""
    prompt_len = tokens.shape[1]
    bucket = gen._bucket(prompt_len)
    prompt = na.named(tokens, ("batch", "position"))
    bucket_ids = na.pad(prompt, {"position": (bucket - prompt_len, 0)})
    bucket_mask = na.pad(na.full(prompt.axes, True), {"position": (bucket - prompt_len, 0)})
    length = bucket + new - 1
    policy = na.nn.current_precision()
    options = dict(steps=new, top_k=None, top_p=False, policy=policy, sample=False)
    dynamic = (jnp.float32(1), jnp.float32(0), jax.random.key(0), jnp.asarray([-1], jnp.int32),
               jnp.asarray(0, jnp.int32))  # fmt: skip

    def cached() -> Any:
        logits, cache, nxt = gen._prefill(model, bucket_ids, bucket_mask, length=length,
                                          policy=policy)  # fmt: skip
        jax.block_until_ready(cache)
        start = time.perf_counter()
        out, _ = gen._decode(model, cache, logits, nxt, dynamic, **options)
        jax.block_until_ready(out)
        logits = na.rearrange(logits, ("batch", "vocab")).array
        return time.perf_counter() - start, out.array, logits

    return cached


def decoders(model: models.Transformer, tokens: jax.Array, new: int) -> dict[str, Any]:
    """``cached``, ``plain`` and ``plain A/A``: each runs its prefill, then its decode loop timed;
    a call returns ``(seconds of the decode, tokens (batch, new), the first step's logits)``."""
    cfg = model.config
    prompt_len = tokens.shape[1]
    p = plain_params(model)
    plain_prefill, plain_decode = plain_decoder(cfg)
    pre = jax.jit(plain_prefill, static_argnums=2)
    plain_len = prompt_len + new - 1

    def plain() -> Callable[[], Any]:
        dec = jax.jit(lambda *a: plain_decode(*a), static_argnums=(4, 5), donate_argnums=(2, 3))

        def run() -> Any:
            first, ck, cv = pre(p, tokens, plain_len)
            jax.block_until_ready(ck)
            start = time.perf_counter()
            out, _, _ = dec(p, first, ck, cv, prompt_len, new)
            jax.block_until_ready(out)
            return time.perf_counter() - start, out, first

        return run

    return {"cached": cached_decoder(model, tokens, new), "plain": plain(), "plain A/A": plain()}


def float32_check(model: models.Transformer, tokens: jax.Array, new: int) -> tuple[float, float]:
    """``(share of equal tokens, max |first-step logits difference|)`` of ``cached`` and ``plain``
    on a float32 copy of the model, with float32 matmuls (not TF32, a GPU's default for float32)."""

    def f32(x: Any) -> Any:
        return x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) else x

    with jax.default_matmul_precision("highest"):
        runs = decoders(jax.tree.map(f32, model), tokens, new)
        (_, a, logits_a), (_, b, logits_b) = runs["cached"](), runs["plain"]()
    return float(jnp.mean(a == b)), float(jnp.max(jnp.abs(logits_a - logits_b)))


def row(model: models.Transformer, batch: int, prompt_len: int, new: int, rounds: int,
        budget: Budget, log: Records) -> tuple[list[str], bool]:  # fmt: skip
    """The table's row for ``batch``, and whether the float32 check holds."""
    cfg = model.config
    tokens = jax.random.randint(jax.random.key(batch), (batch, prompt_len), 3, cfg.vocab_size)
    tokens = tokens.astype(jnp.int32)
    prompt = na.named(tokens, ("batch", "position"))
    slots = decoders(model, tokens, new)
    first_call = {}
    for name, fn in slots.items():  # compile (first calls, not timed as decode)
        start = time.perf_counter()
        fn()
        first_call[name] = time.perf_counter() - start
    times: dict[str, list[float]] = {n: [] for n in slots}
    names = list(slots)
    for r in range(rounds):
        if r >= 2 and budget.left() <= 0:
            break
        for n in names[r % 3 :] + names[: r % 3]:
            times[n].append(slots[n]()[0])
    med = {n: statistics.median(t) for n, t in times.items()}
    per_token = {n: med[n] / (new - 1) for n in med}
    agree, delta = float32_check(model, tokens, new)

    # Recompute the prefix (no cache), and end-to-end generate.
    recompute(model, prompt, steps=new)  # compile
    rec = []
    e2e = []
    for r in range(max(2, rounds // 2)):
        if r >= 1 and budget.left() <= 0:
            break
        rec.append(clock(lambda: recompute(model, prompt, steps=new)))
        e2e.append(clock(lambda: models.generate(model, prompt, max_new_tokens=new)))
    rec_token = statistics.median(rec) / new
    e2e_s = statistics.median(e2e)
    cells = [
        f"{batch}",
        f"{per_token['cached'] * 1e3:.3f}",
        f"{per_token['plain'] * 1e3:.3f}",
        f"{med['cached'] / med['plain']:.3f}",
        f"{med['plain A/A'] / med['plain']:.3f}",
        f"{batch / per_token['cached']:.0f}",
        f"{rec_token * 1e3:.3f}",
        f"{rec_token / per_token['cached']:.1f}",
        f"{batch * new / e2e_s:.0f}",
        f"{agree:.3f}",
        f"{delta:.1e}",
        f"{first_call['cached']:.1f} / {first_call['plain']:.1f}",
        f"{len(times['cached'])}",
        f"{len(log.messages)}",
    ]
    return cells, agree == 1.0 and delta <= LOGITS_TOL


def weights_rows(model: models.Transformer, formats: list[str], batch: int, prompt_len: int,
                 new: int, rounds: int, budget: Budget) -> list[list[str]]:  # fmt: skip
    """One row per weight format at ``batch``: the cached decode loop's time per token (median,
    interleaved), tokens/s, the speedup over the first format and the share of its tokens."""
    cfg = model.config
    tokens = jax.random.randint(jax.random.key(batch), (batch, prompt_len), 3, cfg.vocab_size)
    tokens = tokens.astype(jnp.int32)
    slots = {}
    for fmt in formats:
        weights = models.quantize(model, fmt) if fmt in ("int8", "float8") else model
        slots[fmt] = cached_decoder(weights, tokens, new)
    first = {fmt: fn() for fmt, fn in slots.items()}  # compile
    times: dict[str, list[float]] = {f: [] for f in formats}
    for r in range(rounds):
        if r >= 2 and budget.left() <= 0:
            break
        for f in formats[r % len(formats) :] + formats[: r % len(formats)]:
            times[f].append(slots[f]()[0])
    per_token = {f: statistics.median(t) / (new - 1) for f, t in times.items()}
    base = formats[0]
    scale = float(jnp.max(jnp.abs(first[base][2])))
    return [
        [
            f"{batch}",
            f,
            f"{per_token[f] * 1e3:.3f}",
            f"{batch / per_token[f]:.0f}",
            f"{per_token[base] / per_token[f]:.2f}",
            f"{float(jnp.mean(first[f][1] == first[base][1])):.3f}",
            f"{float(jnp.max(jnp.abs(first[f][2] - first[base][2])) / scale):.4f}",
            f"{len(times[f])}",
        ]
        for f in formats
    ]


def table(title: str, header: list[str], rows: list[list[str]]) -> None:
    rows = [r + [""] * (len(header) - len(r)) for r in rows]
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    line = "  ".join("-" * w for w in widths)
    print(f"\n{title}\n{line}")
    print("  ".join(h.rjust(w) for h, w in zip(header, widths)))
    print(line)
    for r in rows:
        print("  ".join(str(c).rjust(w) for c, w in zip(r, widths)))
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    accel = on_accelerator()
    parser.add_argument("--batches", default="1,16", help="comma-separated batch sizes")
    parser.add_argument("--prompt", type=int, default=128 if accel else 32, help="prompt tokens")
    parser.add_argument("--new-tokens", type=int, default=256 if accel else 64)
    parser.add_argument("--rounds", type=int, default=7 if accel else 5)
    parser.add_argument("--budget", type=float, default=300.0 if accel else 100.0,
                        help="total seconds (checked between rounds)")  # fmt: skip
    parser.add_argument("--dtype", choices=("bfloat16", "float32"),
                        default="bfloat16" if accel else "float32",
                        help="the timed model's parameters (the check is float32)")  # fmt: skip
    parser.add_argument("--weights", default=None,
                        help="comma-separated weight formats to compare in the decode loop: the "
                        "model's dtype, int8, float8 (e.g. bfloat16,int8,float8)")  # fmt: skip
    parser.add_argument("--only-weights", action="store_true",
                        help="with --weights: skip the main table")  # fmt: skip
    parser.add_argument(
        "--model",
        choices=("100m", "8b-wide", "mixtral-wide"),
        default="100m",
        help="on an accelerator: the ~101M model, an 8B-width one (8 layers) or a Mixtral-width "
        "mixture of experts (4 layers, grouped dispatch; with --weights --only-weights)",
    )
    args = parser.parse_args()
    moe = args.model == "mixtral-wide"
    if moe and not (args.weights and args.only_weights):
        parser.error("--model mixtral-wide times the weight formats only: add --weights ... "
                     "--only-weights (the plain twin is a dense model)")  # fmt: skip
    budget = Budget(args.budget)
    sizes = {"8b-wide": WIDE, "mixtral-wide": MOE_WIDE}.get(args.model, ACCEL) if accel else CPU
    if moe and not accel:
        sizes = MOE_CPU
    dtype = jnp.dtype(args.dtype).type
    cfg = models.TransformerConfig("mixtral" if moe else "llama", tie_word_embeddings=True,
                                   max_position_embeddings=4096, **sizes)  # fmt: skip
    model = models.Transformer(cfg, key=jax.random.key(0), dtype=dtype)
    params = sum(x.size for x in jax.tree.leaves(model) if hasattr(x, "size"))
    device = jax.devices()[0]
    print(f"device: {device.device_kind} ({jax.default_backend()}), jax {jax.__version__}, "
          f"namedaxes {na.__version__}; model {params / 1e6:.1f}M parameters ({dtype.__name__}), "
          f"prompt {args.prompt}, {args.new_tokens} new tokens, greedy"
          + (f"; quantized experts read narrow: {narrow_experts_available(jnp.int8)} (int8), "
             f"{narrow_experts_available(jnp.float8_e4m3fn)} (float8)" if moe else ""))  # fmt: skip
    log = Records()
    logging.getLogger("namedaxes").addHandler(log)
    header = ["batch", "cached ms/tok", "plain ms/tok", "cached/plain", "A/A", "cached tok/s",
              "recompute ms/tok", "recompute/cached", "generate tok/s", "f32 agree",
              "f32 logits", "first call s cached/plain", "rounds", "log records"]  # fmt: skip
    rows = []
    checks = []
    batches = [int(x) for x in args.batches.split(",")]
    if args.weights:
        formats = args.weights.split(",")
        unknown = [f for f in formats if f not in (args.dtype, "int8", "float8")]
        if unknown:
            parser.error(f"--weights: unknown {unknown}; use {args.dtype}, int8, float8")
        share = Budget(budget.left() / (1 if args.only_weights else 2))
        w_rows = []
        for i, b in enumerate(batches):
            part = Budget(share.left() / (len(batches) - i))
            try:
                w_rows += weights_rows(model, formats, b, args.prompt, args.new_tokens,
                                       args.rounds, part)  # fmt: skip
            except Exception as e:  # noqa: BLE001 - one batch size failing must not lose the others
                w_rows.append([f"{b}", f"{type(e).__name__}: {str(e)[:100]}"])
        table("decode per token by weight format (models.quantize: weight-only, per-channel "
              "scales; median, interleaved)", ["batch", "weights", "ms/tok", "tok/s",
              f"speedup vs {formats[0]}", f"tokens = {formats[0]}'s", "first logits diff / max",
              "rounds"], w_rows)  # fmt: skip
        if args.only_weights:
            return 0
    for i, b in enumerate(batches):
        share = Budget(budget.left() / (len(batches) - i))
        if share.left() <= 0:
            rows.append([f"{b}", "skipped (budget)"])
            continue
        try:
            cells, ok = row(model, b, args.prompt, args.new_tokens, args.rounds, share, log)
            rows.append(cells)
            checks.append(ok)
        except Exception as e:  # noqa: BLE001 - one batch size failing must not lose the others
            rows.append([f"{b}", f"{type(e).__name__}: {str(e)[:100]}"])
        print(f"batch {b}: " + ", ".join(f"{h} {c}" for h, c in zip(header[1:], rows[-1][1:])),
              flush=True)  # fmt: skip
    table("generation: decode per token (median, interleaved) of namedaxes generate vs plain JAX "
          "and vs recomputing the prefix (no cache)", header, rows)  # fmt: skip
    verdict = "holds" if checks and all(checks) else "FAILS"
    print(f"\nfloat32 check (tokens all equal, first-step logits within {LOGITS_TOL:g}): "
          f"{verdict} ({sum(checks)} of {len(checks)} batch sizes run)")  # fmt: skip
    for m in sorted(set(log.messages)):
        print(f"log: {m}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
