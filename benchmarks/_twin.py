"""The main example's language model written twice: ``namedaxes.models`` and plain JAX.

Imported by ``benchmarks/model_step.py`` and ``benchmarks/accelerator.py`` (speed, compiled
collectives) and by ``tests/test_model_twin.py`` (loss agreement and identical collectives on a
tiny config). Nothing here sets up devices: the caller does (8 simulated CPU devices, a (data=2,
model=4) mesh, or one accelerator).

The named side is ``examples/train_lm.py`` itself: its Llama-style ``Transformer`` config, loss,
optimizer and ``na.fsdp`` training step. The plain twin is what a careful JAX user writes for the
same FSDP + tensor-parallel layout: a dict of arrays with hand-written ``PartitionSpec``\\s for
storage (``PARAM_SPECS``), the weights gathered to their compute layout where they are used
(``COMPUTE_SPECS``), activations constrained, ``out_sharding=`` where an Explicit mesh needs it,
the embedding lookup from the vocabulary-split table left to XLA's partitioner (under
``jax.sharding.auto_axes`` on Explicit meshes), the target's log-probability as a masked sum,
attention per shard (``jax.shard_map`` around ``jax.nn.dot_product_attention``, each device
keeping the one key/value head its query heads use when the key/value heads are fewer than the
devices of ``model``), and ``jax.jit`` with ``in_shardings``/``out_shardings``. It starts from the
named model's own arrays, so both runs start from the same values.
"""

from __future__ import annotations

import re
import sys
from collections import Counter, OrderedDict
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import namedaxes as na

# The model is the main example's (examples/train_lm.py): the benchmarks measure what users run.
_EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
if str(_EXAMPLES) not in sys.path:
    sys.path.insert(0, str(_EXAMPLES))

import train_lm  # noqa: E402

Size = train_lm.Size
TENSOR_PARALLEL = train_lm.TENSOR_PARALLEL
PARAMS = train_lm.PARAMS
COMPUTE = train_lm.COMPUTE
SIZES = train_lm.SIZES
model_config = train_lm.model_config
flops_per_token = train_lm.flops_per_token

TINY = Size(hidden=16, layers=2, heads=4, kv_heads=2, head_dim=4, mlp=32, vocab=128, seq=8,
            batch=4, steps=20, lr=3e-3, eval_every=10)  # fmt: skip


def one_device_mesh() -> jax.sharding.Mesh:
    """The example's (data, model) mesh on the first device: its mappings name both axes."""
    return na.mesh.parse_mesh_from_string("data:1,model:1", ("data", "model"), num_devices=1)


def optimizer(size: Size, counter: Counter | None = None, key: str = "") -> Any:
    """The example's optimizer; ``counter[key]`` counts the traces of a step that uses it."""
    opt = train_lm.make_optimizer(size)

    def update(grads: Any, state: Any, params: Any = None) -> Any:
        if counter is not None:
            counter[key] += 1  # runs once per trace of the step
        with jax.numpy_dtype_promotion("standard"):  # optax mixes Python floats and int counts
            return opt.update(grads, state, params)

    return optax.GradientTransformation(opt.init, update)


def batches(size: Size, n: int, seed: int = 1) -> list[jax.Array]:
    """``n`` batches of random token ids, int32 ``(batch, seq + 1)``."""
    keys = jax.random.split(jax.random.key(seed), n)
    vocab = model_config(size, size.vocab).vocab_size
    return [jax.random.randint(k, (size.batch, size.seq + 1), 0, vocab) for k in keys]


# -- namedaxes ------------------------------------------------------------------------------------


def named_step(size: Size, counter: Counter | None = None) -> Any:
    """The example's training step (``na.fsdp`` with its two mappings)."""
    return train_lm.make_steps(optimizer(size, counter, "named"), None)[0]


def named_init(size: Size, mesh: Any) -> tuple[Any, Any]:
    """The example's model and optimizer state, stored by ``PARAMS`` on ``mesh``."""
    cfg = model_config(size, size.vocab)
    with jax.set_mesh(mesh):
        state = train_lm.init_state(cfg, size, optimizer(size), seed=0)
    return state["model"], state["opt_state"]


def named_batch(tokens: jax.Array) -> na.NamedArray:
    return na.named(tokens, ("batch", "position"))


# -- plain JAX ------------------------------------------------------------------------------------

# Storage: the hand-written FSDP + TP layout (embed over data; heads, mlp and vocab over model).
PARAM_SPECS: dict[str, P] = OrderedDict(
    {
        "embed": P("model", "data"),  # (vocab, embed), also the output head
        "attn_norm": P(None, "data"),  # (layer, embed)
        "q": P(None, "data", "model", None),  # (layer, embed, heads, head_dim)
        "k": P(None, "data", None, None),  # (layer, embed, kv_heads, head_dim)
        "v": P(None, "data", None, None),
        "o": P(None, "model", None, "data"),  # (layer, heads, head_dim, embed)
        "mlp_norm": P(None, "data"),
        "up": P(None, "data", "model"),  # (layer, embed, mlp)
        "down": P(None, "model", "data"),  # (layer, mlp, embed)
        "gate": P(None, "data", "model"),
        "final_norm": P("data"),  # (embed,)
    }
)
# Compute: the same weights with `embed` gathered (one layer of the stacked ones).
COMPUTE_SPECS: dict[str, tuple] = {
    "embed": ("model", None),
    "norm": (None,),
    "q": (None, "model", None),
    "kv": (None, None, None),
    "o": ("model", None, None),
    "up": (None, "model"),
    "down": ("model", None),
}
BATCH_SPEC = P("data", None)
STACKED = ("attn_norm", "q", "k", "v", "o", "mlp_norm", "gate", "up", "down")


def plain_params(model: Any) -> dict[str, jax.Array]:
    """The named model's arrays under plain names (same values, same layouts)."""
    layer = model.layers.stacked
    arrays = {
        "embed": model.embed.weight.array,
        "attn_norm": layer.attn_norm.weight.array,
        "q": layer.attn.q_proj.weight.array,
        "k": layer.attn.k_proj.weight.array,
        "v": layer.attn.v_proj.weight.array,
        "o": layer.attn.o_proj.weight.array,
        "mlp_norm": layer.mlp_norm.weight.array,
        "gate": layer.mlp.gate.weight.array,
        "up": layer.mlp.up.weight.array,
        "down": layer.mlp.down.weight.array,
        "final_norm": model.final_norm.weight.array,
    }
    return OrderedDict((name, arrays[name]) for name in PARAM_SPECS)


def _explicit(mesh: Any) -> bool:
    return all(t == AxisType.Explicit for t in mesh.axis_types)


def rms_norm(x: jax.Array, w: jax.Array, eps: float) -> jax.Array:
    """In float32 at least, then back in ``x``'s dtype (as ``transformers``' Llama)."""
    xf = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + eps)
    return (y * w.astype(xf.dtype)[None, None]).astype(x.dtype)


def rotary(x: jax.Array, theta: float) -> jax.Array:
    """RoPE on ``(batch, seq, heads, head_dim)``: halves rotated, tables in float32."""
    t, d = x.shape[1], x.shape[-1]
    inv = 1.0 / theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d)
    angles = jnp.arange(t, dtype=jnp.float32)[:, None] * inv[None, :]
    angles = jnp.concatenate([angles, angles], axis=-1)[None, :, None, :]
    cos, sin = jnp.cos(angles).astype(x.dtype), jnp.sin(angles).astype(x.dtype)
    first, second = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + jnp.concatenate([-second, first], axis=-1) * sin


def attention(
    q: jax.Array, k: jax.Array, v: jax.Array, mesh: Any, implementation: str | None = None
) -> jax.Array:
    """Causal grouped-query attention, per shard: batch over ``data``, query heads over ``model``.

    Key/value heads that the devices of ``model`` divide are split with the query heads; fewer
    key/value heads stay whole on each device, which keeps the one its query heads use.
    """
    split = 1 if mesh is None else mesh.shape["model"]
    kv = k.shape[2]

    def local(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        if split > 1 and kv % split and kv > 1:
            i = jax.lax.axis_index("model") // (split // kv)
            k = jax.lax.dynamic_slice_in_dim(k, i, 1, axis=2)
            v = jax.lax.dynamic_slice_in_dim(v, i, 1, axis=2)
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=implementation)

    if mesh is None or mesh.size == 1:
        return local(q, k, v)
    q_spec = P("data", None, "model", None)
    kv_spec = P("data", None, "model" if kv % split == 0 else None, None)
    return jax.shard_map(
        local, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec), out_specs=q_spec, check_vma=False
    )(q, k, v)


# nn.Stacked's policies: what jax.checkpoint keeps of each layer (None: its input only).
REMAT = {"carry": None, "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}


def plain_forward(
    params: dict[str, jax.Array],
    tokens: jax.Array,
    cfg: Any,
    mesh: Any = None,
    *,
    compute: Any = None,
    remat: str = "none",
    implementation: str | None = None,
) -> jax.Array:
    """Logits ``(batch, seq, vocab)``. Weights are gathered to their compute layout where used.

    ``compute`` casts the weights where they are used (the residual stream follows), norms and the
    RoPE tables stay in float32; ``remat`` checkpoints each layer (``"carry"``: keep its input,
    ``"dots"``: and its matmuls' outputs); ``implementation`` goes to
    ``jax.nn.dot_product_attention`` (``"cudnn"`` on GPUs). Without a mesh (or on one device)
    nothing is constrained.
    """
    sharded = mesh is not None and mesh.size > 1
    explicit = sharded and _explicit(mesh)

    def put(x: jax.Array, *spec: Any) -> jax.Array:
        if not sharded:
            return x
        if explicit:
            return jax.sharding.reshard(x, P(*spec))
        return jax.lax.with_sharding_constraint(x, P(*spec))

    def cast(w: jax.Array) -> jax.Array:  # before the gather, so that it moves the compute dtype
        return w if compute is None else w.astype(compute)

    def dense(eq: str, x: jax.Array, w: jax.Array, w_spec: str, out: tuple) -> jax.Array:
        """A linear layer: weight gathered to its compute layout, output constrained."""
        w = put(cast(w), *COMPUTE_SPECS[w_spec])
        kw = {"out_sharding": P(*out)} if explicit else {}  # Explicit meshes ask for the result's
        return put(jnp.einsum(eq, x, w, **kw), *out)

    def norm(x: jax.Array, w: jax.Array) -> jax.Array:
        return put(rms_norm(x, put(w, *COMPUTE_SPECS["norm"]), cfg.norm_eps), *act)

    act = ("data", None, None)
    heads = ("data", None, "model", None)
    kv_heads = ("data", None, None, None)

    def layer(h: jax.Array, p: dict[str, jax.Array]) -> tuple[jax.Array, None]:
        x = norm(h, p["attn_norm"])
        q = rotary(dense("bte,ehd->bthd", x, p["q"], "q", heads), cfg.rope_theta)
        k = rotary(dense("bte,ehd->bthd", x, p["k"], "kv", kv_heads), cfg.rope_theta)
        v = dense("bte,ehd->bthd", x, p["v"], "kv", kv_heads)
        o = attention(q, k, v, mesh if sharded else None, implementation)
        h = h + dense("bthd,hde->bte", o, p["o"], "o", act)
        x = norm(h, p["mlp_norm"])
        g = dense("bte,em->btm", x, p["gate"], "up", ("data", None, "model"))
        u = dense("bte,em->btm", x, p["up"], "up", ("data", None, "model"))
        return h + dense("btm,me->bte", jax.nn.silu(g) * u, p["down"], "down", act), None

    if remat != "none":
        layer = jax.checkpoint(layer, policy=REMAT[remat], prevent_cse=False)
    table = put(cast(params["embed"]), *COMPUTE_SPECS["embed"])
    if explicit:  # the table stays split over `model`: XLA partitions the gather, as on Auto
        lookup = jax.sharding.auto_axes(lambda t, i: t[i], out_sharding=P(*act))
        looked_up = lookup(table, tokens)
    else:
        looked_up = table[tokens]
    h = put(looked_up, *act)
    h, _ = jax.lax.scan(layer, h, {name: params[name] for name in STACKED})
    h = norm(h, params["final_norm"])
    return dense("bte,ve->btv", h, params["embed"], "embed", ("data", None, "model"))


def plain_loss(
    params: dict[str, jax.Array], tokens: jax.Array, cfg: Any, mesh: Any = None, **options: Any
) -> jax.Array:
    """Mean next-token cross-entropy in float32 (``options`` go to ``plain_forward``)."""
    logits = plain_forward(params, tokens[:, :-1], cfg, mesh, **options)
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    # Per position, the log-probability of its target: a masked sum over the vocabulary, which is
    # reduced where it lies (split over `model`) like the logsumexp, with one small all-reduce.
    hit = jnp.arange(logp.shape[-1])[None, None, :] == tokens[:, 1:, None]
    picked = jnp.sum(logp, axis=-1, where=hit)
    return -jnp.mean(picked)


def _state_shardings(state: Any, mesh: Any) -> Any:
    """Optimizer-state shardings: a leaf under a parameter's name gets that parameter's spec."""

    def spec(path: Any, leaf: Any) -> NamedSharding:
        names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
        return NamedSharding(mesh, PARAM_SPECS[names[-1]] if names else P())

    return jax.tree_util.tree_map_with_path(spec, state)


def plain_step(size: Size, mesh: Any, counter: Counter | None = None) -> tuple[Any, Any]:
    """``(init, step)``: ``init(params) -> (params, opt_state)`` placed by ``PARAM_SPECS``, and the
    jitted step ``(params, opt_state, tokens) -> (params, opt_state, loss)``."""
    opt = optimizer(size, counter, "plain")
    cfg = model_config(size, size.vocab)
    param_sh = OrderedDict((name, NamedSharding(mesh, spec)) for name, spec in PARAM_SPECS.items())
    abstract_state = jax.eval_shape(opt.init, OrderedDict((n, jnp.zeros(())) for n in PARAM_SPECS))
    state_sh = _state_shardings(abstract_state, mesh)

    def init(params: dict[str, jax.Array]) -> tuple[Any, Any]:
        # Copies: the named step donates the arrays these come from.
        params = jax.jit(lambda p: jax.tree.map(jnp.copy, p), out_shardings=param_sh)(params)
        return params, jax.jit(opt.init, out_shardings=state_sh)(params)

    def step(params: Any, opt_state: Any, tokens: jax.Array) -> Any:
        with jax.numpy_dtype_promotion("standard"):  # jax.nn.dot_product_attention's backward
            loss, grads = jax.value_and_grad(plain_loss)(params, tokens, cfg, mesh)
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
