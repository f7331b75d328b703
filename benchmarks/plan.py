"""``plan`` and ``plan_search`` on an abstract Llama-3-70B-shaped training state.

Run: ``python benchmarks/plan.py [--small] [--no-compile]``.

The model (80 stacked layers, embed 8192, mlp 28672, 64 heads, 8 kv heads, head size 128, vocab
128256) is built with ``jax.eval_shape``: bf16 parameters, an fp32 master copy and AdamW moments
(optax) on the master copy, all ``ShapeDtypeStruct``s in NamedArrays, so nothing is allocated.

It reports: the parameter count (70,553,706,496), the state bytes per device for several layouts
on ``{data: 32, model: 8}``; with compiling on (default), XLA's ``argument_size_in_bytes`` for the
same layouts on 256 simulated CPU devices (a ``"cpu:data=32,model=8"`` target: one subprocess per
layout) and whether they agree to the byte; and the time ``plan_search`` takes to find a layout
whose state fits 16 GiB per device. ``--small`` uses a tiny model and ``cpu:data=4,model=2``.

``--train-step`` instead plans a real train step (forward with GQA attention and SwiGLU, loss, grad,
AdamW on the fp32 master copy) of a Llama-3.2-1B-shaped model (1,498,482,688 parameters) on
``"cpu:data=16,model=4"`` with a batch of 16 x 2048 tokens: XLA's temporaries, collectives and a
verdict against 16 GiB.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
import optax

import namedaxes as na


@dataclasses.dataclass(frozen=True)
class Config:
    layers: int = 80
    embed: int = 8192
    mlp: int = 28672
    heads: int = 64
    kv_heads: int = 8
    head_dim: int = 128
    vocab: int = 128256


LLAMA3_70B = Config()
SMALL = Config(layers=2, embed=64, mlp=128, heads=4, kv_heads=2, head_dim=16, vocab=256)
# Llama-3.2-1B-shaped (1,498,482,688 parameters, untied head): the train-step check.
LLAMA_1B = Config(layers=16, embed=2048, mlp=8192, heads=32, kv_heads=8, head_dim=64, vocab=128256)


def init_params(key: jax.Array, cfg: Config, dtype: Any = jnp.bfloat16) -> dict[str, Any]:
    """Llama-style parameters as NamedArrays (use under ``jax.eval_shape``)."""
    keys = iter(jax.random.split(key, 16))

    def w(shape: tuple[int, ...], axes: tuple[str, ...]) -> na.NamedArray:
        return na.named(jax.random.normal(next(keys), shape, dtype), axes)

    L, E, M, H, K, D, V = (
        cfg.layers,
        cfg.embed,
        cfg.mlp,
        cfg.heads,
        cfg.kv_heads,
        cfg.head_dim,
        cfg.vocab,
    )
    return {
        "embed": w((V, E), ("vocab", "embed")),
        "layers": {
            "attn_norm": w((L, E), ("layers", "embed")),
            "q": w((L, E, H, D), ("layers", "embed", "heads", "head_dim")),
            "k": w((L, E, K, D), ("layers", "embed", "kv_heads", "head_dim")),
            "v": w((L, E, K, D), ("layers", "embed", "kv_heads", "head_dim")),
            "o": w((L, H, D, E), ("layers", "heads", "head_dim", "embed")),
            "mlp_norm": w((L, E), ("layers", "embed")),
            "gate": w((L, E, M), ("layers", "embed", "mlp")),
            "up": w((L, E, M), ("layers", "embed", "mlp")),
            "down": w((L, M, E), ("layers", "mlp", "embed")),
        },
        "final_norm": w((E,), ("embed",)),
        "lm_head": w((E, V), ("embed", "vocab")),
    }


def abstract_state(cfg: Config) -> dict[str, Any]:
    """``{"params": bf16, "master": fp32, "opt_state": AdamW(master)}``, all abstract."""

    def build(key: jax.Array) -> dict[str, Any]:
        params = init_params(key, cfg)
        master = jax.tree.map(lambda x: x.astype(jnp.float32), params)
        return {"params": params, "master": master, "opt_state": optax.adamw(1e-4).init(master)}

    return jax.eval_shape(build, jax.random.key(0))


def llama3_70b() -> dict[str, Any]:
    """The 70B state, for ``python -m namedaxes plan plan:llama3_70b --mesh ...`` from here."""
    return abstract_state(LLAMA3_70B)


def take_state(state: Any) -> None:
    """A step that only receives the state: XLA's argument bytes are the state's bytes."""
    return None


def _rms(x: jax.Array, scale: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-5)).astype(
        x.dtype
    ) * scale


def _layer(x: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
    """One decoder layer (GQA causal attention, SwiGLU MLP) on plain arrays; x is (batch, seq, embed)."""
    h = _rms(x, p["attn_norm"])
    q = jnp.einsum("bse,ehd->bshd", h, p["q"])
    k = jnp.einsum("bse,ekd->bskd", h, p["k"])
    v = jnp.einsum("bse,ekd->bskd", h, p["v"])
    groups = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
    att = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    x = x + jnp.einsum("bshd,hde->bse", att, p["o"])
    h = _rms(x, p["mlp_norm"])
    up = jax.nn.silu(jnp.einsum("bse,em->bsm", h, p["gate"])) * jnp.einsum(
        "bse,em->bsm", h, p["up"]
    )
    return x + jnp.einsum("bsm,me->bse", up, p["down"])


def _loss(params: dict[str, Any], tokens: jax.Array) -> jax.Array:
    plain = jax.tree.map(lambda a: a.array, params, is_leaf=lambda a: isinstance(a, na.NamedArray))
    x = plain["embed"][tokens]

    def body(x: jax.Array, layer: dict[str, jax.Array]) -> tuple[jax.Array, None]:
        return jax.checkpoint(_layer)(x, layer), None

    x, _ = jax.lax.scan(body, x, plain["layers"])
    logits = (_rms(x, plain["final_norm"]) @ plain["lm_head"]).astype(jnp.float32)
    targets = jnp.roll(tokens, -1, axis=1)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1))


def train_step(state: dict[str, Any], tokens: na.NamedArray) -> tuple[dict[str, Any], jax.Array]:
    """Forward, loss, grad (bf16 params), AdamW on the fp32 master copy, bf16 params refreshed."""
    loss, grads = jax.value_and_grad(_loss)(state["params"], tokens.array)
    grads = jax.tree.map(lambda g: g.astype(jnp.float32), grads)
    updates, opt_state = optax.adamw(1e-4).update(grads, state["opt_state"], state["master"])
    master = optax.apply_updates(state["master"], updates)
    params = jax.tree.map(lambda m: m.astype(jnp.bfloat16), master)
    return {"params": params, "master": master, "opt_state": opt_state}, loss


LAYOUTS = {
    "fsdp+tp": {
        "embed": "data",
        "mlp": "model",
        "heads": "model",
        "kv_heads": "model",
        "vocab": "model",
    },
    "fsdp over all": {"embed": ("data", "model")},
    "tp only": {"mlp": "model", "heads": "model", "kv_heads": "model", "vocab": "model"},
    "layers+fsdp": {"layers": "model", "embed": "data"},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", action="store_true", help="tiny model on cpu:data=4,model=2")
    parser.add_argument("--no-compile", action="store_true", help="skip the XLA comparison")
    parser.add_argument(
        "--train-step",
        action="store_true",
        help="only: plan a train step of the ~1B model on cpu:data=16,model=4 (batch 16 x 2048)",
    )
    opts = parser.parse_args()
    if opts.train_step:
        return train_step_check(opts.small)
    cfg, mesh, target, budget = (
        (SMALL, {"data": 4, "model": 2}, "cpu:data=4,model=2", "256KiB")
        if opts.small
        else (LLAMA3_70B, {"data": 32, "model": 8}, "cpu:data=32,model=8", "16GiB")
    )
    t0 = time.perf_counter()
    state = abstract_state(cfg)
    print(f"abstract state built in {time.perf_counter() - t0:.2f} s")

    for name, rules in LAYOUTS.items():
        t0 = time.perf_counter()
        p = na.analysis.plan(state, mesh, na.AxisRules(rules, unsatisfied="replicate"))
        ms = (time.perf_counter() - t0) * 1e3
        line = (
            f"{name:<14} params {p.param_count:,d}  state/device {p.state_bytes_per_device:,d} B "
            f"({p.state_bytes_per_device / 2**30:.2f} GiB)  plan {ms:.1f} ms"
        )
        if not opts.no_compile:
            t0 = time.perf_counter()
            c = na.analysis.plan(
                state, target, na.AxisRules(rules, unsatisfied="replicate"), step="plan:take_state"
            )
            arg = c.compiled["argument_bytes"] if c.compiled else None
            verdict = "EQUAL" if arg == p.state_bytes_per_device else "DIFFERENT"
            line += f"  XLA arguments {arg:,d} B -> {verdict} (compile {time.perf_counter() - t0:.1f} s)"
        print(line, flush=True)

    t0 = time.perf_counter()
    found = na.analysis.plan_search(state, mesh, budget=budget, top=3)
    elapsed = time.perf_counter() - t0
    best = found[0]
    print(
        f"plan_search: {found.candidates} mappings in {elapsed:.2f} s; best {best.rules} -> "
        f"{best.state_bytes_per_device / 2**30:.2f} GiB per device, fits {best.fits} "
        f"(budget {budget}); dropped {found.counts}"
    )


def train_step_check(small: bool) -> None:
    """XLA's temporaries and a verdict for a real train step on a simulated 64-device mesh."""
    cfg, target, batch, seq = (
        (SMALL, "cpu:data=4,model=2", 8, 32)
        if small
        else (LLAMA_1B, "cpu:data=16,model=4", 16, 2048)
    )
    state = abstract_state(cfg)
    tokens = na.named(jax.ShapeDtypeStruct((batch, seq), "int32"), ("batch", "seq"))
    rules = na.AxisRules(
        {
            "batch": "data",
            "embed": "data",
            "mlp": "model",
            "heads": "model",
            "kv_heads": "model",
            "vocab": "model",
        },
        unsatisfied="replicate",
    )
    t0 = time.perf_counter()
    p = na.analysis.plan(
        state, target, rules, step="plan:train_step", args=(state, tokens), budget="16GiB"
    )
    print(p)
    print(f"train-step plan on {target} in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
