"""float8 for a mixture of experts' routed experts (``matmul="float8"``): each expert product within
its formats' rounding bound of the exact one (forward and both gradients, every dispatch's
product, tensor and row scaling); the experts chosen by the policy's rules like every layer; row
scaling the same on every dispatch; a sharded layer computing with the unsharded layer's scales
(expert and tensor parallelism, Auto and Explicit meshes); padding and dropped choices in no
scale."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_precision import E4M3, E5M2, float8_operands, rounding

import namedaxes as na
from namedaxes.kernels import grouped_matmul
from namedaxes.nn._fp8_experts import Float8, float8_product

SIZES = jnp.array([3, 0, 1, 6], jnp.int32)  # an empty group and a one-row group; 10 of 12 rows
PRODUCTS = {  # (product, rows, extra arguments): every dispatch's expert products
    "ragged_dot": (jax.lax.ragged_dot, (12, 16), (SIZES,)),
    "grouped": (functools.partial(grouped_matmul, implementation="pallas"), (12, 16), (SIZES,)),
    "dense into": (functools.partial(jnp.einsum, "th,ehi->tei"), (12, 16), ()),
    "dense out": (functools.partial(jnp.einsum, "tei,eih->teh"), (12, 4, 16), ()),
    "batched": (functools.partial(jnp.einsum, "erh,ehi->eri"), (4, 5, 16), ()),
}


def _bound(fn, extra, a, w, fa, fw):
    """The largest error of fn(a~, w~) against fn(a, w), elementwise, for a bilinear ``fn`` with
    rounding errors e_a, e_w: fn(e_a, |w|) + fn(|a|, e_w) + fn(e_a, e_w), plus float32
    accumulation (1e-6 of fn(|a|, |w|))."""
    ea, ew = rounding(a, fa), rounding(w, fw)
    f = lambda a, w: fn(a, w, *extra)  # noqa: E731
    return f(ea, abs(w)) + f(abs(a), ew) + f(ea, ew) + 1e-6 * f(abs(a), abs(w))


@pytest.mark.parametrize("scaling", ["tensor", "row"])
@pytest.mark.parametrize("kind", list(PRODUCTS))
def test_expert_products_within_the_formats_error(kind, scaling):
    """The output and both gradients (e4m3 rows and weights, e5m2 gradient) are within the
    rounding bound of the float32 products, elementwise, and did round; the gradient of the rows
    is bounded through the transposed product (the vjp of the bound's terms)."""
    fn, shape, extra = PRODUCTS[kind]
    # The exact products and bounds by ragged_dot where the kernel is the grouped matmul (equal to
    # it: tests/test_grouped_matmul.py), not by the kernel in Pallas interpret mode, eager (slow).
    ref = jax.lax.ragged_dot if kind == "grouped" else fn
    keys = jax.random.split(jax.random.key(0), 3)
    a = jax.random.normal(keys[0], shape)
    w = jax.random.normal(keys[1], (4, shape[-1], 24))
    cfg = Float8(scaling == "row")
    f = lambda a, w: ref(a, w, *extra)  # noqa: E731
    y, pull = jax.vjp(lambda a, w: float8_product(fn, cfg, a, w, *extra), a, w)
    g = jax.random.normal(keys[2], y.shape)
    da, dw = pull(g)

    def transposed(a, w, g, which):
        return jax.vjp(f, a, w)[1](g)[which]

    with jax.default_matmul_precision("highest"):
        exact, exact_pull = jax.vjp(f, a, w)
        da0, dw0 = exact_pull(g)
        eg = rounding(g, E5M2)
        ea, ew = rounding(a, E4M3), rounding(w, E4M3)
        cases = [
            (y, exact, _bound(ref, extra, a, w, E4M3, E4M3)),
            # da = g~ w~^T: errors of g (e5m2) and w (e4m3), bounded through |w| and |g|
            (da, da0, transposed(a, abs(w), eg, 0) + transposed(a, ew, abs(g), 0)
             + transposed(a, ew, eg, 0) + 1e-6 * transposed(a, abs(w), abs(g), 0)),
            (dw, dw0, transposed(abs(a), w, eg, 1) + transposed(ea, w, abs(g), 1)
             + transposed(ea, w, eg, 1) + 1e-6 * transposed(abs(a), w, abs(g), 1)),
        ]  # fmt: skip
    for got, want, bound in cases:
        assert got.shape == want.shape and got.dtype == jnp.float32
        err = abs(got - want)
        assert float((err / jnp.maximum(bound, 1e-30)).max()) <= 1.0
        assert float(err.max()) > 0  # it did round
    jaxpr = jax.make_jaxpr(lambda a, w: jax.vjp(
        lambda a, w: float8_product(fn, cfg, a, w, *extra), a, w)[1](g))(a, w)  # fmt: skip
    assert float8_operands(jaxpr.jaxpr) == {"float8_e4m3fn", "float8_e5m2"}


@pytest.mark.parametrize("scaling", ["tensor", "row"])
def test_float16_expert_products_keep_the_scales_in_float32(scaling):
    """float16 rows and weights: the scales stay float32 (float16 cannot hold them: a gradient
    of 1e-4 has an e5m2 scale of 2e-9, below its smallest number), so both gradients are the
    float32 ones within float8's rounding (they were NaN and zero), and all-zero rows give zeros
    (they gave NaN: 0 / 0)."""
    fn, shape, extra = PRODUCTS["dense into"]
    a = jax.random.normal(jax.random.key(0), shape)
    w = jax.random.normal(jax.random.key(1), (4, shape[-1], 24))
    cfg = Float8(scaling == "row")
    half = lambda x: x.astype(jnp.float16)  # noqa: E731
    y, pull = jax.vjp(lambda a, w: float8_product(fn, cfg, a, w), half(a), half(w))
    exact, exact_pull = jax.vjp(fn, a, w)
    g = jnp.full(y.shape, 1e-4)
    for got, want in zip((y, *pull(half(g))), (exact, *exact_pull(g))):
        assert got.dtype == jnp.float16
        err = abs(got.astype(jnp.float32) - want).max()
        assert float(err) <= 0.1 * float(abs(want).max())  # measured: 0.015-0.05
    zeros = float8_product(fn, cfg, jnp.zeros(shape, jnp.float16), half(w))
    assert not bool(jnp.isnan(zeros).any()) and float(abs(zeros).max()) == 0.0


Embed, Experts, Hidden = na.Axis("embed", 16), na.Axis("experts", 4), na.Axis("expert_mlp", 8)
_normal = jax.random.normal(jax.random.key(4), (4, 8, 16))
# Position 0 is padding (where=PAD) with a large norm: it must enter no scale.
X = na.named(_normal.at[:, 0].multiply(50.0), ("batch", "position", "embed"))
PAD = na.named(jnp.arange(8) != 0, "position")


def build(**options):
    return na.nn.MoE(Embed, Experts, Hidden, top_k=2, key=jax.random.key(3), **options)


def _loss(moe, x):
    y, stats = moe(x, where=PAD)
    return jnp.sum(jnp.sin(y.array)) + stats.load_balancing_loss(), y


_grad = eqx.filter_jit(eqx.filter_value_and_grad(_loss, has_aux=True))


def test_routed_experts_follow_the_float8_rules():
    """By default the experts' products (named like each expert's Linears: embed, expert_mlp)
    go to float8 and the router stays; {"expert_mlp": False} keeps the experts too."""

    def formats(policy):
        loss = na.nn.precision(policy)(lambda m, x: _loss(m, x)[0])
        return float8_operands(jax.make_jaxpr(jax.grad(loss))(build(dispatch="ragged"), X).jaxpr)

    assert formats("matmul=float8") == {"float8_e4m3fn", "float8_e5m2"}
    kept = na.nn.Precision(matmul="float8", matmul_rules={"expert_mlp": False})
    assert formats(kept) == formats("compute=float32") == set()


def _flat(tree):
    return np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree.leaves(tree)])


def test_row_scaling_is_the_same_on_every_dispatch():
    """Row scales are per token, per (token, expert) hidden row and per expert column: what each
    dispatch computes them over (sorted rows, every expert on every token, capacity slots) does
    not change them, so every dispatch gives the same loss and gradients, which are not those
    without float8. The padding (a large token) and the choices the capacity drops are rows of
    none of them (they entered the weight gradients' column scales of the ragged and dense
    dispatches: up to 0.42 off). One exception: the down projection's weight gradient scales the
    hidden rows per column, and the dense dispatch's hidden rows include the experts a token did
    not choose (a larger maximum in some columns): equal within the format's rounding there."""
    with na.nn.precision("matmul=float8,scaling=row"):
        results = {
            d: _grad(build(dispatch=d, capacity_factor=0.5), X)
            for d in ("ragged", "grouped", "dense", "capacity")
        }
    plain = _grad(build(dispatch="ragged", capacity_factor=0.5), X)
    (loss, y), grads = results["ragged"]
    down = lambda g: g.experts.down.weight.array  # noqa: E731
    for d, ((loss_d, y_d), grads_d) in results.items():
        np.testing.assert_allclose(loss_d, loss, rtol=1e-5)
        np.testing.assert_allclose(y_d.array, y.array, atol=1e-5)
        others = lambda g: eqx.tree_at(down, g, None)  # noqa: E731
        np.testing.assert_allclose(_flat(others(grads_d)), _flat(others(grads)), atol=1e-5)
        tol = 1e-5 if d != "dense" else 2**-3 * float(abs(down(grads)).max())
        np.testing.assert_allclose(down(grads_d), down(grads), atol=tol)
    assert float(abs(y.array - plain[0][1].array).max()) > 1e-3


MAPPINGS = {  # experts over the 4 model devices (tokens the same on them), or over data with
    # each expert's hidden axis over model (the down product's contraction split)
    "ep4": {"batch": "data", "experts": "model"},
    "ep2+tp": {"batch": "data", "experts": "data", "expert_mlp": "model"},
}


@pytest.mark.parametrize(
    "dispatch,scaling,ep,factor",
    [("ragged", "tensor", "ep2+tp", None), ("ragged", "row", "ep2+tp", None),
     ("ragged", "row", "ep4", None), ("ragged", "tensor", "ep4", 0.5),
     ("capacity", "tensor", "ep4", 4.0), ("dense", "row", "ep2+tp", None)],
)  # fmt: skip
def test_sharded_experts_compute_with_the_unsharded_scales(dispatch, scaling, ep, factor, mesh_2x4):
    """Under expert (and tensor) parallelism each scale's absolute maximum is taken over the
    devices that split what it reduces: the loss, output and gradients of the unsharded layer.
    The padding and the dropped choices (factor 0.5), which the exchange does not send, enter
    no scale of the unsharded layer either (they did: 0.21 off on the real tokens)."""
    moe = build(dispatch=dispatch, capacity_factor=factor)
    policy = f"matmul=float8,scaling={scaling}"
    with na.nn.precision(policy):
        (loss, y), grads = _grad(moe, X)
    with jax.set_mesh(mesh_2x4), na.axis_mapping(MAPPINGS[ep]), na.nn.precision(policy):
        sharded, x = na.shard((moe, X))
        f = na.named_jit(jax.value_and_grad(_loss, has_aux=True))
        (loss_s, y_s), grads_s = f(sharded, x)
    np.testing.assert_allclose(loss_s, loss, rtol=1e-5)
    np.testing.assert_allclose(y_s.array, y.array, atol=1e-5)
    np.testing.assert_allclose(_flat(grads_s), _flat(grads), atol=1e-5)


@pytest.mark.parametrize("dispatch", ["dense", "ragged", "capacity"])
def test_padding_changes_no_real_token(dispatch):
    """Tensor scaling takes one maximum over a whole product: a padding token 100 times larger
    leaves every real token's output as it was (it changed them by 0.19-0.21)."""
    moe = build(dispatch=dispatch, capacity_factor=2.0 if dispatch == "capacity" else None)
    run = eqx.filter_jit(lambda moe, x: moe(x, where=PAD)[0].array)
    with na.nn.precision("matmul=float8"):
        y = run(moe, X)
        y_large = run(moe, na.named(X.array.at[:, 0].multiply(100.0), X.axes))
    np.testing.assert_array_equal(y_large[:, 1:], y[:, 1:])
