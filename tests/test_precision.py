"""nn.Precision: layers compute in the policy's dtypes; norms, softmax and loss stay in float32."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _collectives import gathered, partitioned_hlo
from _helpers import equations, spec_of

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

    traced = jax.jit(jax.value_and_grad(loss)).trace(model, IDS)  # checked, then run
    jaxpr = traced.jaxpr.jaxpr
    # Every matmul, forward and backward, takes bfloat16 operands (the attention backward takes the
    # float32 gradient of its float32 scores with a bfloat16 operand, as JAX's attention does).
    dots = [e for e in equations(jaxpr) if e.primitive.name == "dot_general"]
    assert len(dots) > 10
    assert all("bfloat16" in {str(v.aval.dtype) for v in e.invars} for e in dots)
    assert dtypes_of(jaxpr, "rsqrt") == {"float32"}  # norms
    assert dtypes_of(jaxpr, "exp") == {"float32"}  # attention softmax and the loss' log_softmax
    value, grads = traced.lower().compile()(model, IDS)
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
    closed = jax.make_jaxpr(loss_fn)(model, IDS)
    assert dtypes_of(closed.jaxpr, "rsqrt") == {"float32"}
    assert dtypes_of(closed.jaxpr, "exp") == {"float32"}
    assert jax.eval_shape(lambda m, i: m(i), model, IDS).dtype == jnp.bfloat16
    assert [a.dtype for a in closed.out_avals] == [jnp.float32]  # the loss


def test_output_dtype_sets_the_stream():
    model = LM(KEY)
    with na.nn.precision("params=float32,compute=bfloat16,output=bfloat16"):
        h = jax.jit(lambda m, i: m.blocks(m.emb(i)))(model, IDS)
        logits = jax.jit(lambda m, i: m(i))(model, IDS)
    assert h.dtype == logits.dtype == jnp.bfloat16


def test_a_stack_carries_the_dtype_its_layers_return():
    """A float32 input into a stack of MLPs under compute=bfloat16 (no residual: each layer returns
    bfloat16): the stack runs as the layers applied one after another, which pass bfloat16 on;
    JAX's scan used to refuse the loop (its carry changed dtype). Values equal that loop's."""
    stack = na.nn.Stacked(Axis("layer", 3), lambda k: na.nn.MLP(Embed, {"mlp": 32}, key=k), key=KEY)
    x = na.random.normal(jax.random.key(1), {"batch": 2, "embed": Embed.size})

    @jax.jit
    @na.nn.precision("params=float32,compute=bfloat16")
    def both(stack, x):
        h = x
        for i in range(3):
            layer = jax.tree.map(
                lambda a: a["layer", i] if isinstance(a, na.NamedArray) else a,
                stack.stacked, is_leaf=lambda a: isinstance(a, na.NamedArray),
            )  # fmt: skip
            h = layer(h)
        return stack(x), h

    got, want = both(stack, x)
    assert got.dtype == want.dtype == jnp.bfloat16
    np.testing.assert_array_equal(
        np.asarray(got.array, np.float32), np.asarray(want.array, np.float32)
    )


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


# -- float8 matmuls ---------------------------------------------------------------------------------

FP8 = "params=float32,compute=bfloat16,matmul=float8"
E4M3, E5M2 = jnp.dtype(jnp.float8_e4m3fn), jnp.dtype(jnp.float8_e5m2)
# Rounding to a float8 format changes a value v scaled into it by at most u |v| (u: half the
# relative spacing, 2^-4 for e4m3's 3 mantissa bits, 2^-3 for e5m2's 2) in the normal range, and
# by at most half the smallest subnormal (2^-10 for e4m3, 2^-17 for e5m2) times the scale in the
# subnormal range: |v~ - v| <= u |v| + sub * scale, the scale at most amax / largest finite value.
ROUNDING = {E4M3: (2.0**-4, 2.0**-10), E5M2: (2.0**-3, 2.0**-17)}


def rounding(x, fmt):
    u, sub = ROUNDING[fmt]
    return abs(x) * u + abs(x).max() / float(jnp.finfo(fmt).max) * sub


def product_bound(a, b, axis, fa, fb):
    """The largest error of sum_k a~_k b~_k against sum_k a_k b_k, elementwise: sum_k (e_a |b| +
    |a| e_b + e_a e_b), plus float32 accumulation (1e-6 of sum |a| |b|)."""
    ea, eb = rounding(a, fa), rounding(b, fb)
    exact = na.dot(abs(a), abs(b), axis=axis)
    return (
        na.dot(ea, abs(b), axis=axis)
        + na.dot(abs(a), eb, axis=axis)
        + na.dot(ea, eb, axis=axis)
        + 1e-6 * exact
    )


def float8_operands(jaxpr):
    """The float8 formats the matmuls read: a dot's float8 operands, or float8 values converted
    up for a dot (nn._fp8.TENSOR_FORM="operands", where XLA takes the conversion into the GEMM)."""
    return {
        str(v.aval.dtype)
        for e in equations(jaxpr)
        if e.primitive.name in ("dot_general", "convert_element_type")
        for v in e.invars
        if "float8" in str(v.aval.dtype)
    }


@pytest.mark.parametrize(
    "scaling,form", [("tensor", "output"), ("tensor", "operands"), ("row", "output")]
)
def test_float8_matmul_within_the_formats_error(scaling, form, monkeypatch):
    """A Linear under matmul=float8 (compute float32 here, so that float8 is the only rounding):
    the output and both gradients are within the rounding bound of their formats (e4m3 input and
    weight, e5m2 gradient) of the float32 products, elementwise; the program multiplies float8.
    Tensor scaling in both of the forms XLA recognizes (nn._fp8.TENSOR_FORM)."""
    monkeypatch.setattr(na.nn._fp8, "TENSOR_FORM", form)
    lin = na.nn.Linear(Embed, {"mlp": 48}, key=KEY, use_bias=False)
    x = na.random.normal(jax.random.key(1), {"batch": 4, "position": 8, "embed": Embed.size})
    g = na.random.normal(jax.random.key(2), {"batch": 4, "position": 8, "mlp": 48})
    policy = na.nn.Precision(matmul="float8", scaling=scaling)

    def grads(x, w):
        with na.nn.precision(policy):
            y, vjp = jax.vjp(lambda x, w: eqx.tree_at(lambda m: m.weight, lin, w)(x), x, w)
        return (y, *vjp(g))

    @jax.jit
    def check(x, w):
        """(worst error / bound, largest error, result axes and dtype) per product."""
        y, dx, dw = grads(x, w)
        tokens = ("batch", "position")
        cases = [
            (y, na.dot(x, w, axis="embed"), product_bound(x, w, "embed", E4M3, E4M3)),
            (dx, na.dot(g, w, axis="mlp"), product_bound(g, w, "mlp", E5M2, E4M3)),
            (dw, na.dot(x, g, axis=tokens), product_bound(x, g, tokens, E4M3, E5M2)),
        ]
        return [((abs(a - b) / c).max().array, abs(a - b).max().array) for a, b, c in cases]

    with jax.default_matmul_precision("highest"):
        results = check(x, lin.weight)
        y, dx, dw = jax.eval_shape(grads, x, lin.weight)
    assert [(r.axes, r.dtype) for r in (y, dx, dw)] == [
        (a, jnp.float32) for a in ((*x.axes[:2], Axis("mlp", 48)), x.axes, lin.weight.axes)
    ]
    for ratio, largest in results:
        assert float(ratio) <= 1.0 and float(largest) > 0  # within the bound, and it did round
    assert float8_operands(jax.make_jaxpr(grads)(x, lin.weight).jaxpr) == {
        "float8_e4m3fn",
        "float8_e5m2",
    }


def test_operands_form_scales_are_values_of_the_compute_dtype(monkeypatch):
    """The "operands" form multiplies each float8 operand by its scale in the compute dtype
    (bfloat16 here), which XLA's GEMM rewriter takes as the float8 GEMM's operand scale: the scale
    is a bfloat16 value, so the GEMM scales by exactly the scale the operand was quantized with (a
    float32 scale rounded to bfloat16 would scale the whole product by up to 2^-9). Emulated (on a
    CPU) the dequantized operand is that product rounded to bfloat16. The largest value still
    fits e4m3."""
    monkeypatch.setattr(na.nn._fp8, "TENSOR_FORM", "operands")
    x = na.random.normal(jax.random.key(1), {"batch": 8, "embed": 16}).astype(jnp.bfloat16)
    q, scale = (a.array for a in na.nn._fp8._quantized(x, ("embed",), False, E4M3, jnp.bfloat16))
    assert scale.dtype == jnp.float32 and float(scale) == float(scale.astype(jnp.bfloat16))
    in_compute = q.astype(jnp.bfloat16) * scale.astype(jnp.bfloat16)
    exact = q.astype(jnp.float32) * scale
    np.testing.assert_allclose(in_compute.astype(jnp.float32), exact, rtol=2**-8, atol=0)
    assert float(abs(q.astype(jnp.float32)).max()) <= 448.0


def test_row_scaling_scales_each_token_and_channel():
    """One token 10^5 times larger than the others: one scale for the tensor pushes the others
    into float8's subnormals (errors of tens of percent), one scale per token keeps them within
    e4m3's rounding."""
    lin = na.nn.Linear(Embed, {"mlp": 8}, key=KEY, use_bias=False)
    x = na.random.normal(jax.random.key(1), {"position": 4, "embed": Embed.size})
    x = x * na.named(jnp.array([1e5, 1.0, 1.0, 1.0]), "position")

    @jax.jit
    def errors(lin, x):
        want = lin(x)["position", 1:]
        err = {}
        for scaling in ("tensor", "row"):
            with na.nn.precision(na.nn.Precision(matmul="float8", scaling=scaling)):
                got = lin(x)["position", 1:]
            err[scaling] = (abs(got - want).max() / abs(want).max()).array
        return err

    err = {k: float(v) for k, v in errors(lin, x).items()}
    assert err["row"] < 0.07 < 0.1 < err["tensor"], err


def test_float8_under_float16_keeps_the_scales_in_float32():
    """float16 cannot hold the scales of small tensors: a gradient of 1e-4 has a scale of 2e-9
    in e5m2, below float16's smallest number (6e-8). They stay float32 (the product in the
    "output" form), so under compute=float16 the weight's gradient is the float32 one within
    float8's rounding (it was zero), an all-zero input gives zeros (it gave NaN: 0 / 0), and the
    matmuls still read float8."""
    lin = na.nn.Linear(Embed, {"mlp": 8}, key=KEY, use_bias=False)
    x = na.random.normal(jax.random.key(1), {"batch": 4, "embed": Embed.size})
    policy = "compute=float16,matmul=float8"

    def grad(policy, lin):
        @na.nn.precision(policy)
        def loss(lin):
            return (lin(x).astype(jnp.float32).sum() * 1e-4).scalar()

        return jax.grad(loss)(lin).weight

    @jax.jit
    def run(lin):
        with na.nn.precision(policy):
            zeros = lin(x * 0.0)
        return grad(policy, lin), grad("compute=float32", lin), zeros

    got, want, zeros = run(lin)
    jaxpr = jax.make_jaxpr(functools.partial(grad, policy))(lin).jaxpr
    assert got.dtype == jnp.float32 and float8_operands(jaxpr) == {"float8_e4m3fn", "float8_e5m2"}
    assert float(abs(got - want).max().array) <= 0.1 * float(abs(want).max().array)  # 0.03
    assert zeros.dtype == jnp.float16 and not bool(jnp.isnan(zeros.array).any())
    assert float(abs(zeros.array).max()) == 0.0


def test_float8_is_chosen_by_the_names_of_a_layers_axes():
    """By default the MLP-like layer goes to float8 and the output head (a vocab Linear, or the
    tied embedding) and a router stay in the compute dtype; matmul_rules move them either way."""
    mlp = na.nn.Linear(Embed, {"mlp": 32}, key=KEY)
    head = na.nn.Linear(Embed, Vocab, key=KEY, use_bias=False)
    router = na.nn.Linear(Embed, {"experts": 4}, key=KEY, use_bias=False)
    emb = na.nn.Embedding(Vocab, Embed, key=KEY)
    x = na.ones({"batch": 2, "embed": Embed.size})

    def formats(policy, layer, call=lambda layer, x: layer(x)):
        @na.nn.precision(policy)
        def loss(layer, x):
            return call(layer, x).astype(jnp.float32).sum().scalar()

        return float8_operands(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(layer, x).jaxpr)

    both = {"float8_e4m3fn", "float8_e5m2"}
    unembed = lambda e, x: e.unembed(x)  # noqa: E731
    assert formats(FP8, mlp) == both
    assert formats(FP8, head) == formats(FP8, router) == formats(FP8, emb, unembed) == set()
    assert formats("params=float32,compute=bfloat16", mlp) == set()
    vocab = na.nn.Precision("float32", "bfloat16", matmul="float8", matmul_rules={"vocab": True})
    assert formats(vocab, head) == formats(vocab, emb, unembed) == both
    only_heads = na.nn.Precision(compute="bfloat16", matmul="fp8",
                                 matmul_rules=[("heads", True), ("*", False)])  # fmt: skip
    assert formats(only_heads, na.nn.Linear(Embed, Heads, key=KEY)) == both
    all_but_mlps = na.nn.Precision(compute="bfloat16", matmul="fp8",
                                   matmul_rules=[("mlp", False), ("*", True)])  # fmt: skip
    assert formats(all_but_mlps, mlp) == set()


def test_a_float8_rule_that_names_no_layers_axis_is_refused_when_the_block_ends():
    """A typo in matmul_rules would pick nothing: the block under the policy refuses, when it
    ends, a rule naming no axis of the layers that asked the policy in it (as models.quantize
    does for its rules), with the closest name; "*" is every layer, and a block in which no
    layer ran checks nothing."""
    head = na.nn.Linear(Embed, Vocab, key=KEY, use_bias=False)
    mlp = na.nn.Linear(Embed, {"mlp": 32}, key=KEY)
    x = na.ones({"batch": 2, "embed": Embed.size})

    def both(x):
        return head(x), mlp(x)

    typo = na.nn.Precision(compute="bfloat16", matmul="float8", matmul_rules={"vocabb": True})
    with pytest.raises(
        na.AxisNotFoundError,
        match=r"^Precision matmul_rules: the rule 'vocabb' -> True \(did you mean 'vocab'\?\) "
        r"names no axis of the layers that ran under the policy, whose matmuls' axes are "
        r"'embed', 'mlp', 'vocab', so it picked nothing. Name an axis the layers have",
    ):
        with na.nn.precision(typo):
            jax.eval_shape(both, x)
    loss = jax.jit(na.nn.precision(typo)(lambda layer, x: layer(x).sum().scalar()))
    with pytest.raises(na.AxisNotFoundError, match=r"the rule 'vocabb' -> True \(did you mean"):
        loss.trace(head, x)  # refused where the policy is read: at trace time
    fine = na.nn.Precision(compute="bfloat16", matmul="float8",
                           matmul_rules=[("vocab", True), ("*", False)])  # fmt: skip
    with na.nn.precision(fine):
        assert [y.dtype for y in jax.eval_shape(both, x)] == [jnp.bfloat16] * 2
    with na.nn.precision(typo):
        pass  # no layer asked: nothing to check


def test_float8_rules_are_checked_against_every_layer_that_asked_the_policy():
    """No rule that did pick a layer is refused: (a) a function decorated with the policy, called
    in a block of the same policy, leaves the check to that block, which counts its layers (the
    head's 'vocab' was counted in the inner block only, and the inner block alone refused 'mlp');
    (b) a jitted function whose trace a later block reuses asks nothing there, but its layers
    asked when it was traced (a layer run eagerly beside it made the block refuse 'vocab'); (c) a
    quantized layer asks the policy too (its narrow weight is not made float8), so 'mlp' -> False
    names the quantized MLP. A rule naming no layer's axis is still refused."""
    head = na.nn.Linear(Embed, Vocab, key=KEY, use_bias=False)
    mlp = na.nn.Linear(Embed, {"mlp": 32}, key=KEY, use_bias=False)
    x = na.ones({"batch": 2, "embed": Embed.size})
    # policies of their own (the policies a check counts layers of are process-wide)
    nested = na.nn.Precision(compute="float32", matmul="float8",
                             matmul_rules=[("vocab", True), ("mlp", False)])  # fmt: skip
    logits = na.nn.precision(nested)(lambda x: head(x))
    with na.nn.precision(nested):  # (traced only: eval_shape)
        jax.eval_shape(logits, x)  # the head alone: its block is inside one of the same policy
        jax.eval_shape(mlp, x)

    reused = na.nn.Precision(compute="float32", matmul="float8", matmul_rules={"vocab": True})
    traces = []
    step = jax.jit(lambda x: traces.append(1) or head(x))
    with na.nn.precision(reused):
        step(x)
    with na.nn.precision(reused):
        step(x)  # the trace reused
        jax.eval_shape(mlp, x)
    assert len(traces) == 1

    quantized = eqx.tree_at(
        lambda m: m.weight, mlp, na.nn.QuantizedArray.of(mlp.weight, "int8", contracted="embed")
    )
    kept = na.nn.Precision(compute="float32", matmul="float8", matmul_rules={"mlp": False})
    both = lambda x: (quantized(x), head(x))  # noqa: E731
    with na.nn.precision(kept):
        jax.eval_shape(both, x)
    typo = na.nn.Precision(compute="float32", matmul="float8", matmul_rules={"mpl": False})
    with pytest.raises(na.AxisNotFoundError, match=r"the rule 'mpl' -> False \(did you mean"):
        with na.nn.precision(typo):
            jax.eval_shape(both, x)


def test_float8_policy_parse_and_errors():
    p = na.nn.Precision.parse(f"{FP8},scaling=row")
    assert p == na.nn.Precision("float32", "bfloat16", matmul="float8", scaling="row")
    assert repr(p) == f"Precision('{FP8},scaling=row')"
    assert na.nn.Precision.parse(FP8).scaling == "tensor"
    assert repr(na.nn.Precision(matmul="fp8", matmul_rules={"vocab": True})) == (
        "Precision('matmul=float8', matmul_rules=(('vocab', True),))"
    )
    with pytest.raises(na.NamedTypeError, match=r"Precision matmul='int4' is not a matmul format"):
        na.nn.Precision.parse("matmul=int4")
    with pytest.raises(na.NamedTypeError, match=r"Precision scaling='block' is not a scaling"):
        na.nn.Precision(matmul="float8", scaling="block")
    with pytest.raises(
        na.NamedTypeError,
        match=r"Precision matmul_rules: \('vocab', 'yes'\) is not an \(axis name, True/False\) rule",
    ):
        na.nn.Precision(matmul="float8", matmul_rules=[("vocab", "yes")])


def test_policy_dtypes_are_ones_layers_compute_in_and_float8_options_need_matmul():
    """float8/float4 are not dtypes to keep or compute in (matmul="float8" is), float64 needs
    x64, and scaling / matmul_rules without a matmul format would do nothing: all refused."""
    for spec in ("c=float8_e4m3fn", "compute=float4_e2m1fn", "o=float8_e5m2"):
        field = {"c": "compute", "o": "output"}.get(spec.split("=")[0], "compute")
        with pytest.raises(
            na.NamedTypeError,
            match=rf"Precision {field}=float[48]_\w+ is not a dtype layers keep or compute in: use "
            r"float32, bfloat16 or float16 \(float64 with jax_enable_x64\). For float8 matmuls "
            r"pass matmul='float8'",
        ):
            na.nn.precision(spec).__enter__()
    with pytest.raises(
        na.NamedTypeError,
        match=r"Precision param=float64 needs 64-bit floats, which are off here. Turn them on",
    ):
        na.nn.Precision.parse("p=float64")
    with jax.enable_x64():
        assert na.nn.Precision.parse("p=float64").param == jnp.float64
    for given, policy in (
        ("scaling='row'", dict(scaling="row")),
        ("matmul_rules", dict(matmul_rules={"vocab": True})),
    ):
        with pytest.raises(
            na.NamedTypeError,
            match=rf"Precision {given} sets how low-precision matmuls run, but matmul is None: it "
            rf"would do nothing. Pass matmul='float8' too, or drop {given.split('=')[0]}.",
        ):
            na.nn.Precision(compute="bfloat16", **policy)
    assert na.nn.Precision().scaling is None and repr(na.nn.Precision()) == "Precision('')"
    assert na.nn.Precision(matmul="fp8", scaling="tensor") == na.nn.Precision(matmul="float8")


def test_layer_dtypes_are_checked_as_the_policy_checks_its_dtypes():
    """A layer's dtype= took float8 (Linear failed at its first call with JAX's promotion error,
    Embedding rounded its table silently) and float64 with x64 off (a warning, then float32
    parameters), which Precision refuses: the same check now refuses them when the layer is built."""
    layers = {
        "Linear": lambda dtype: na.nn.Linear(Embed, {"mlp": 4}, key=KEY, dtype=dtype),
        "Embedding": lambda dtype: na.nn.Embedding(Vocab, Embed, key=KEY, dtype=dtype),
        "RmsNorm": lambda dtype: na.nn.RmsNorm(Embed, dtype=dtype),
    }
    for name, make in layers.items():
        for dtype in (jnp.float8_e4m3fn, "float8_e5m2"):
            with pytest.raises(
                na.NamedTypeError,
                match=rf"^{name} dtype=float8_e\w+ is not a dtype layers keep or compute in: use "
                r"float32, bfloat16 or float16 \(float64 with jax_enable_x64\)\. For float8 matmuls "
                r"pass matmul='float8' in the precision policy",
            ):
                make(dtype)
        with pytest.raises(
            na.NamedTypeError,
            match=rf"^{name} dtype=float64 needs 64-bit floats, which are off here\. Turn them on "
            r"\(jax\.config\.update\('jax_enable_x64', True\)\) or use float32\.$",
        ):
            make(jnp.float64)
        assert make(jnp.bfloat16).weight.dtype == jnp.bfloat16
        with jax.enable_x64():
            assert make(jnp.float64).weight.dtype == jnp.float64


class BigramLM(eqx.Module):
    """A token's next-token logits from its own embedding, through a gated MLP (float8 by the
    default rules) and the tied head (not)."""

    emb: na.nn.Embedding
    mlp: na.nn.MLP
    norm: na.nn.RmsNorm

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.emb = na.nn.Embedding(Axis("vocab", 64), Embed, key=k1)
        self.mlp = na.nn.MLP(Embed, {"mlp": 64}, gated=True, activation="silu", key=k2)
        self.norm = na.nn.RmsNorm(Embed)

    def __call__(self, ids):
        x = self.emb(ids)
        return self.emb.unembed(self.norm(x + self.mlp(x)))


def test_float8_training_tracks_bfloat16():
    """40 steps of SGD on a next-token task (each token's successor is it plus 3 to 6, mod 64):
    the float8 run's losses stay within 2% of the bfloat16 run's at every step (measured: within
    0.07%, also with row scaling), and the model learns (the loss falls by a quarter)."""
    steps = 40
    rng = np.random.default_rng(0)
    data = rng.integers(0, 64, (steps, 16, 1)) + np.cumsum(rng.integers(3, 7, (steps, 16, 33)), -1)
    data = jnp.asarray(data % 64, jnp.int32)
    model = BigramLM(KEY)

    def losses(policy):
        @na.nn.precision(policy)
        def loss(m, ids):
            logits = m(ids["position", :-1])
            return na.nn.cross_entropy(logits, "vocab", ids["position", 1:]).mean().scalar()

        def step(m, batch):
            v, g = jax.value_and_grad(loss)(m, na.named(batch, ("batch", "position")))
            return jax.tree.map(lambda p, d: p - 0.5 * d, m, g), v

        return np.asarray(jax.jit(lambda m, d: jax.lax.scan(step, m, d)[1])(model, data))

    base = losses("params=float32,compute=bfloat16")
    assert base[-1] < 0.75 * base[0]
    np.testing.assert_allclose(losses(FP8), base, rtol=0.02)


@pytest.mark.parametrize("scaling", ["tensor", "row"])
def test_float8_fsdp_gathers_move_float8_bytes(axis_type, scaling):
    """Under fsdp with the weights split over 'data', a float8 layer's weight is quantized where
    it is held and gathered as float8 (1 byte an element, torchao's float8 all-gather), for the
    forward and, by the row recipe's other scales, for the backward; no gather moves it in the
    parameter or compute dtype. Loss and gradients equal the same step on one device."""
    mesh = jax.make_mesh((8,), ("data",), axis_types=(axis_type,))
    # float32 compute: the sharded step matches to float32 rounding (sums in another order)
    policy = na.nn.Precision("float32", "float32", matmul="float8", scaling=scaling)
    lin = na.nn.Linear(Embed, {"mlp": 64}, key=KEY, use_bias=False)
    x = na.random.normal(jax.random.key(1), {"batch": 8, "embed": Embed.size})

    def loss(lin, x):
        with na.nn.precision(policy):
            return lin(x).astype(jnp.float32).sum().scalar()

    step = na.fsdp(
        jax.value_and_grad(loss), parameter_mapping={"embed": "data"},
        compute_mapping={"batch": "data"},
    )  # fmt: skip
    want, want_grad = jax.jit(jax.value_and_grad(loss))(lin, x)
    with jax.set_mesh(mesh):
        moved = gathered(partitioned_hlo(step.lower(lin, x)))
        got, grad = step(lin, x)
    weight = Embed.size * 64
    assert ("f8e4m3fn", weight) in moved, moved
    assert not {(t, n) for t, n in moved if n == weight and t in ("bf16", "f32")}, moved
    assert spec_of(grad.weight) == jax.P("data")
    np.testing.assert_allclose(float(got), float(want), rtol=1e-5)
    np.testing.assert_allclose(grad.weight.array, want_grad.weight.array, rtol=1e-5, atol=1e-6)
