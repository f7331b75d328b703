"""nn.Precision: layers compute in the policy's dtypes; norms, softmax and loss stay in float32."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import namedaxes as na
from namedaxes import Axis

KEY = jax.random.key(0)
Vocab, Embed = Axis("vocab", 32), Axis("embed", 16)
Heads, HeadDim = Axis("heads", 4), Axis("head_dim", 4)
MIXED = "params=float32,compute=bfloat16,output=float32"


class Block(eqx.Module):
    ln1: na.nn.RmsNorm
    attn: na.nn.Attention
    ln2: na.nn.LayerNorm
    mlp: na.nn.MLP

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.ln1, self.ln2 = na.nn.RmsNorm(Embed), na.nn.LayerNorm(Embed)
        self.attn = na.nn.Attention(Embed, Heads, HeadDim, KVHeads=Axis("kv_heads", 2), key=k1)
        self.mlp = na.nn.MLP(Embed, {"mlp": 32}, gated=True, activation=na.silu, key=k2)

    def __call__(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class LM(eqx.Module):
    emb: na.nn.Embedding
    blocks: na.nn.Stacked
    ln_f: na.nn.RmsNorm

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.emb = na.nn.Embedding(Vocab, Embed, key=k1)
        self.blocks = na.nn.Stacked(Axis("layer", 2), Block, key=k2)
        self.ln_f = na.nn.RmsNorm(Embed)

    def __call__(self, ids):
        return self.emb.unembed(self.ln_f(self.blocks(self.emb(ids))))


def loss_fn(model, ids):
    logits = model(ids)
    return na.nn.cross_entropy(logits["position", :-1], "vocab", ids["position", 1:]).scalar()


IDS = na.random.randint(jax.random.key(1), {"batch": 2, "position": 6}, 0, Vocab.size)


def equations(jaxpr):
    """Every equation of a jaxpr, nested ones (scan bodies, remat, custom rules) included."""
    for eqn in jaxpr.eqns:
        yield eqn
        for p in eqn.params.values():
            for sub in p if isinstance(p, (tuple, list)) else (p,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from equations(inner)


def dtypes_of(jaxpr, primitive):
    return {
        str(v.aval.dtype)
        for e in equations(jaxpr)
        if e.primitive.name == primitive
        for v in e.invars
    }


def test_policy_parse_and_errors():
    p = na.nn.Precision.parse(MIXED)
    assert p == na.nn.Precision(param=jnp.float32, compute=jnp.bfloat16, output=jnp.float32)
    assert na.nn.Precision.parse("p=f32, c=bf16") == na.nn.Precision("float32", "bfloat16")
    assert repr(p) == f"Precision({MIXED!r})"
    with pytest.raises(na.NamedTypeError, match=r"'compute=bf16' is repeated"):
        na.nn.Precision.parse("compute=f32,compute=bf16")
    with pytest.raises(
        na.NamedTypeError, match=r"'gradients=f32' is not key=dtype with a known key"
    ):
        na.nn.Precision.parse("gradients=f32")
    with pytest.raises(
        na.NamedTypeError, match=r"Precision compute must be a floating dtype, got int32"
    ):
        na.nn.Precision(compute=jnp.int32)
    with pytest.raises(na.NamedTypeError, match=r"precision\(\) needs a Precision or a string"):
        with na.nn.precision(3):
            pass


def test_parameters_are_created_in_the_param_dtype():
    with na.nn.precision("params=bfloat16"):
        lin = na.nn.Linear(Embed, Heads, key=KEY)
        norm = na.nn.RmsNorm(Embed)
    assert lin.weight.dtype == lin.bias.dtype == norm.weight.dtype == jnp.bfloat16
    assert na.nn.Linear(Embed, Heads, key=KEY, dtype=jnp.float32).weight.dtype == jnp.float32


def test_mixed_precision_dtypes_in_the_program_and_gradients():
    model = LM(KEY)

    @na.nn.precision(MIXED)
    def loss(model, ids):
        return loss_fn(model, ids)

    jaxpr = jax.make_jaxpr(jax.value_and_grad(loss))(model, IDS).jaxpr
    # Every matmul, forward and backward, takes bfloat16 operands (the attention backward takes the
    # float32 gradient of its float32 scores with a bfloat16 operand, as JAX's attention does).
    dots = [e for e in equations(jaxpr) if e.primitive.name == "dot_general"]
    assert len(dots) > 10
    assert all("bfloat16" in {str(v.aval.dtype) for v in e.invars} for e in dots)
    assert dtypes_of(jaxpr, "rsqrt") == {"float32"}  # norms
    assert dtypes_of(jaxpr, "exp") == {"float32"}  # attention softmax and the loss' log_softmax
    value, grads = jax.jit(jax.value_and_grad(loss))(model, IDS)
    assert value.dtype == jnp.float32
    leaves = jax.tree.leaves(eqx.filter(grads, eqx.is_inexact_array))
    assert leaves and {g.dtype for g in leaves} == {jnp.dtype(jnp.float32)}

    # Values: the bfloat16 computation stays within bfloat16 accuracy of the float32 one.
    ref_value, ref_grads = jax.jit(jax.value_and_grad(loss_fn))(model, IDS)
    np.testing.assert_allclose(value, ref_value, rtol=2e-2)
    with na.nn.precision(MIXED):
        logits = jax.jit(lambda m, i: m(i))(model, IDS)
    assert logits.dtype == jnp.float32
    ref_logits = model(IDS).array
    np.testing.assert_allclose(logits.array, ref_logits, atol=3e-2 * float(abs(ref_logits).max()))
    g, r = ref_grads.emb.weight.array, grads.emb.weight.array
    assert float(jnp.linalg.norm(g - r) / jnp.linalg.norm(g)) < 3e-2


def test_bfloat16_stream_and_float32_numerics_without_a_policy():
    """A bfloat16 model: the stream stays bfloat16, norms and the loss still run in float32."""
    with na.nn.precision("params=bfloat16"):
        model = LM(KEY)
    jaxpr = jax.make_jaxpr(loss_fn)(model, IDS).jaxpr
    assert dtypes_of(jaxpr, "rsqrt") == {"float32"}
    assert dtypes_of(jaxpr, "exp") == {"float32"}
    assert model(IDS).dtype == jnp.bfloat16
    assert loss_fn(model, IDS).dtype == jnp.float32


def test_output_dtype_sets_the_stream():
    model = LM(KEY)
    with na.nn.precision("params=float32,compute=bfloat16,output=bfloat16"):
        h = jax.jit(lambda m, i: m.blocks(m.emb(i)))(model, IDS)
        logits = jax.jit(lambda m, i: m(i))(model, IDS)
    assert h.dtype == logits.dtype == jnp.bfloat16


def test_jax_jit_traces_again_under_another_policy():
    """A plain ``jax.jit`` (or ``eqx.filter_jit``) function whose layers read the policy is traced
    once per policy, and each call computes in its own policy's dtype."""
    lin = na.nn.Linear(Embed, {"mlp": 8}, key=KEY)
    x = na.ones({"batch": 2, "embed": Embed.size})
    traces = []

    def apply(lin, x):
        traces.append(na.nn.current_precision())
        return lin(x)

    policies = ["compute=bfloat16", "compute=float16", "compute=bfloat16", None]
    for jit in (jax.jit, eqx.filter_jit):
        traces.clear()
        f = jit(apply)
        dtypes = []
        for policy in policies:
            with na.nn.precision(policy):
                dtypes.append(f(lin, x).dtype)
        assert dtypes == [jnp.bfloat16, jnp.float16, jnp.bfloat16, jnp.float32]
        # bfloat16 again: its trace
        assert traces == [na.nn.Precision.parse(p) for p in policies[:2]] + [na.nn.Precision()]
