"""One GPT-style language model written twice: with ``namedaxes.nn`` and in plain JAX.

Imported by ``benchmarks/model_step.py`` (speed and compiled collectives) and by
``tests/test_model_twin.py`` (loss agreement and identical collectives on a tiny config). Nothing
here sets up devices: the caller does (8 simulated CPU devices, a (data=2, model=4) mesh).

The plain twin is what a careful JAX user writes for the same FSDP + tensor-parallel layout: a dict
of arrays with hand-written ``PartitionSpec``s for storage (``PARAM_SPECS``), the weights gathered
to their compute layout where they are used, activations constrained, ``out_sharding=`` where an
Explicit mesh needs it, ``jax.jit`` with ``in_shardings``/``out_shardings``. It starts from the
named model's own arrays, so both runs start from the same values.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import namedaxes as na

# The model is the main example's (examples/train_lm.py): the benchmark measures what users run.
_EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
if str(_EXAMPLES) not in sys.path:
    sys.path.insert(0, str(_EXAMPLES))

import train_lm  # noqa: E402

TENSOR_PARALLEL = train_lm.TENSOR_PARALLEL
PARAMS = train_lm.PARAMS
COMPUTE = train_lm.COMPUTE
Block = train_lm.Block
GPT = train_lm.GPT
named_loss = train_lm.loss_fn


@dataclass(frozen=True)
class Config(train_lm.Config):
    lr: float = 3e-3


TINY = Config(vocab=8, seq=8, embed=16, heads=4, head_dim=4, mlp=32, layers=2, batch=4)


def optimizer(cfg: Config) -> optax.GradientTransformation:
    return optax.adamw(cfg.lr, weight_decay=0.01)


def batches(cfg: Config, n: int, seed: int = 1) -> list[jax.Array]:
    """``n`` copy-task batches (int32 ``(batch, seq)``): random first half, the same again."""
    out = []
    key = jax.random.key(seed)
    for _ in range(n):
        key, k = jax.random.split(key)
        half = jax.random.randint(k, (cfg.batch, cfg.seq // 2), 0, cfg.vocab)
        out.append(jnp.concatenate([half, half], axis=1))
    return out


# -- namedaxes ------------------------------------------------------------------------------------


def named_step(cfg: Config, counter: Counter | None = None) -> Any:
    """The training step as a namedaxes user writes it: ``na.fsdp`` with the two mappings."""
    opt = optimizer(cfg)

    @na.fsdp(parameter_mapping=PARAMS, compute_mapping=COMPUTE)
    def step(model: GPT, opt_state: Any, batch: na.NamedArray) -> Any:
        if counter is not None:
            counter["named"] += 1  # runs once per trace
        loss, grads = eqx.filter_value_and_grad(named_loss)(model, batch)
        with jax.numpy_dtype_promotion("standard"):  # optax mixes Python floats and int counts
            updates, opt_state = opt.update(grads, opt_state, model)
        return eqx.apply_updates(model, updates), opt_state, loss

    return step


def named_init(cfg: Config, mesh: Any) -> tuple[GPT, Any]:
    """The model and optimizer state, stored by ``PARAMS`` on ``mesh``."""
    with jax.set_mesh(mesh):
        init = na.named_jit(lambda k: GPT(cfg, key=k), out_axis_resources=PARAMS)
        model = init(jax.random.key(0))
        opt_state = na.named_jit(optimizer(cfg).init, out_axis_resources=PARAMS)(model)
    return model, opt_state


def named_batch(tokens: jax.Array) -> na.NamedArray:
    return na.named(tokens, ("batch", "position"))


# -- plain JAX ------------------------------------------------------------------------------------

# Storage: the hand-written FSDP + TP layout (embed over data, heads/mlp over model).
PARAM_SPECS: dict[str, P] = {
    "tok": P(None, "data"),
    "pos": P(None, "data"),
    "ln1_w": P(None, "data"),
    "ln1_b": P(None, "data"),
    "q": P(None, "data", "model", None),
    "k": P(None, "data", "model", None),
    "v": P(None, "data", "model", None),
    "o": P(None, "model", None, "data"),
    "ln2_w": P(None, "data"),
    "ln2_b": P(None, "data"),
    "up_w": P(None, "data", "model"),
    "up_b": P(None, "model"),
    "down_w": P(None, "model", "data"),
    "down_b": P(None, "data"),
    "lnf_w": P("data"),
    "lnf_b": P("data"),
}
BATCH_SPEC = P("data", None)
STACKED = (
    "ln1_w",
    "ln1_b",
    "q",
    "k",
    "v",
    "o",
    "ln2_w",
    "ln2_b",
    "up_w",
    "up_b",
    "down_w",
    "down_b",
)


def plain_params(model: GPT) -> dict[str, jax.Array]:
    """The named model's arrays under plain names (same values, same layouts)."""
    b = model.blocks.stacked
    return {
        "tok": model.tokens.weight.array,
        "pos": model.positions.array,
        "ln1_w": b.ln1.weight.array,
        "ln1_b": b.ln1.bias.array,
        "q": b.attn.q_proj.weight.array,
        "k": b.attn.k_proj.weight.array,
        "v": b.attn.v_proj.weight.array,
        "o": b.attn.o_proj.weight.array,
        "ln2_w": b.ln2.weight.array,
        "ln2_b": b.ln2.bias.array,
        "up_w": b.mlp.up.weight.array,
        "up_b": b.mlp.up.bias.array,
        "down_w": b.mlp.down.weight.array,
        "down_b": b.mlp.down.bias.array,
        "lnf_w": model.ln_f.weight.array,
        "lnf_b": model.ln_f.bias.array,
    }


def _explicit(mesh: Any) -> bool:
    return all(t == AxisType.Explicit for t in mesh.axis_types)


def plain_forward(params: dict[str, jax.Array], tokens: jax.Array, explicit: bool) -> jax.Array:
    """Logits ``(batch, seq, vocab)``. Weights are gathered to their compute layout where used."""

    def put(x: jax.Array, *spec: Any) -> jax.Array:
        if explicit:
            return jax.sharding.reshard(x, P(*spec))
        return jax.lax.with_sharding_constraint(x, P(*spec))

    def dense(
        eq: str,
        x: jax.Array,
        w: jax.Array,
        w_spec: tuple,
        out_spec: tuple,
        b: Any = None,
        b_spec: tuple = (),
        contracts_sharded: bool = False,
    ) -> jax.Array:
        """A linear layer: weight gathered to its compute layout, bias, output constrained."""
        w = put(w, *w_spec)
        if explicit and contracts_sharded:  # Explicit meshes ask for the result's sharding
            y = jnp.einsum(eq, x, w, out_sharding=P(*out_spec))
        else:
            y = jnp.einsum(eq, x, w)
        if b is not None:
            y = y + put(b, *b_spec)[None, None]
        return put(y, *out_spec)

    def layer_norm(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
        centered = x - jnp.mean(x, -1, keepdims=True)
        y = centered * jax.lax.rsqrt(jnp.mean(centered * centered, -1, keepdims=True) + 1e-5)
        return y * put(w, None)[None, None] + put(b, None)[None, None]

    act = ("data", None, None)
    heads = ("data", None, "model", None)

    def block(h: jax.Array, p: dict[str, jax.Array]) -> tuple[jax.Array, None]:
        x = layer_norm(h, p["ln1_w"], p["ln1_b"])
        q = dense("bte,ehd->bthd", x, p["q"], (None, "model", None), heads)
        k = dense("bte,ehd->bthd", x, p["k"], (None, "model", None), heads)
        v = dense("bte,ehd->bthd", x, p["v"], (None, "model", None), heads)
        scores = jnp.einsum("bthd,bshd->bths", q * q.shape[-1] ** -0.5, k)
        t = scores.shape[1]
        causal = jnp.arange(t)[:, None] >= jnp.arange(t)[None, :]
        scores = jnp.where(causal[None, :, None, :], scores, float(jnp.finfo(scores.dtype).min))
        o = jnp.einsum("bths,bshd->bthd", jax.nn.softmax(scores, axis=-1), v)
        o = dense("bthd,hde->bte", o, p["o"], ("model", None, None), act, contracts_sharded=True)
        h = h + put(o, *act)
        x = layer_norm(h, p["ln2_w"], p["ln2_b"])
        u = dense(
            "bte,em->btm",
            x,
            p["up_w"],
            (None, "model"),
            ("data", None, "model"),
            p["up_b"],
            ("model",),
        )
        d = dense(
            "btm,me->bte",
            jax.nn.gelu(u),
            p["down_w"],
            ("model", None),
            act,
            p["down_b"],
            (None,),
            contracts_sharded=True,
        )
        return h + d, None

    tok = put(params["tok"], None, None)
    if explicit:  # a gather with sharded indices needs its output sharding on Explicit meshes
        looked_up = tok.at[tokens].get(out_sharding=P(*act))
    else:
        looked_up = jnp.take(tok, tokens, axis=0)
    h = put(looked_up, *act) + put(params["pos"], None, None)[None]
    h, _ = jax.lax.scan(block, h, {name: params[name] for name in STACKED})
    h = layer_norm(h, params["lnf_w"], params["lnf_b"])
    return put(jnp.einsum("bte,ve->btv", h, tok), *act)


def plain_loss(params: dict[str, jax.Array], tokens: jax.Array, explicit: bool) -> jax.Array:
    logits = plain_forward(params, tokens, explicit)[:, :-1]
    targets = tokens[:, 1:]
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    t = nll.shape[1]
    copied = jnp.arange(1, t + 1) >= (t + 1) // 2
    total = jnp.sum(nll, where=jnp.broadcast_to(copied[None, :], nll.shape))
    count = jnp.sum(copied.astype(nll.dtype)) * float(nll.shape[0])
    return total / jnp.maximum(count, 1.0)


def _state_shardings(state: Any, mesh: Any) -> Any:
    """Optimizer-state shardings: a leaf under a parameter's name gets that parameter's spec."""

    def spec(path: Any, leaf: Any) -> NamedSharding:
        names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
        return NamedSharding(mesh, PARAM_SPECS[names[-1]] if names else P())

    return jax.tree_util.tree_map_with_path(spec, state)


def plain_step(cfg: Config, mesh: Any, counter: Counter | None = None) -> tuple[Any, Any]:
    """``(init, step)``: ``init(params) -> (params, opt_state)`` placed by ``PARAM_SPECS``, and the
    jitted step ``(params, opt_state, tokens) -> (params, opt_state, loss)``."""
    opt = optimizer(cfg)
    explicit = _explicit(mesh)
    param_sh = {name: NamedSharding(mesh, spec) for name, spec in PARAM_SPECS.items()}
    abstract_state = jax.eval_shape(opt.init, {n: jnp.zeros(()) for n in PARAM_SPECS})
    state_sh = _state_shardings(abstract_state, mesh)

    def init(params: dict[str, jax.Array]) -> tuple[Any, Any]:
        params = jax.device_put(params, param_sh)
        return params, jax.jit(opt.init, out_shardings=state_sh)(params)

    def step(params: Any, opt_state: Any, tokens: jax.Array) -> Any:
        if counter is not None:
            counter["plain"] += 1
        loss, grads = jax.value_and_grad(plain_loss)(params, tokens, explicit)
        with jax.numpy_dtype_promotion("standard"):  # optax mixes Python floats and int counts
            updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    jitted = jax.jit(
        step,
        in_shardings=(param_sh, state_sh, NamedSharding(mesh, BATCH_SPEC)),
        out_shardings=(param_sh, state_sh, NamedSharding(mesh, P())),
    )
    return init, jitted


# -- compiled programs ----------------------------------------------------------------------------

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
_OP = re.compile(
    r"=\s*(?P<shape>\S+(?:\s*\{[^}]*\})?|\([^=]*?\))\s+"
    r"(?P<op>" + "|".join(COLLECTIVES) + r")(?:-start)?\("
)


def collectives(hlo_text: str) -> dict[str, list[str]]:
    """``{op: [result shapes]}`` of the collectives in a compiled HLO module (async pairs once)."""
    found: dict[str, list[str]] = {op: [] for op in COLLECTIVES}
    hlo_text = re.sub(r"/\*.*?\*/", "", hlo_text)  # long tuples carry /*index=5*/ comments
    for m in _OP.finditer(hlo_text):
        shape = re.sub(r"\{[^}]*\}", "", m.group("shape"))
        if shape.startswith("("):  # a combined collective: its operands' order is XLA's choice
            shape = "(" + ", ".join(sorted(re.findall(r"\w+\[[^\]]*\]", shape))) + ")"
        found[m.group("op")].append(shape)
    return found


def counts(found: dict[str, list[str]]) -> dict[str, int]:
    return {op: len(shapes) for op, shapes in found.items()}
