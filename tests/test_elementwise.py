"""Elementwise ops: the lifted table against plain jax.numpy, by-name broadcasting, operators, errors."""

import operator

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np
import pytest

import namedaxes as na
from namedaxes import Axis
from namedaxes._ops.elementwise import ELEMENTWISE_OPS

RNG = np.random.default_rng(0)


def _data(domain, shape, name=""):
    if domain == "int":
        return jnp.asarray(RNG.integers(1, 6, size=shape), dtype=jnp.int32)
    if domain == "bool":
        return jnp.asarray(RNG.random(shape) > 0.5)
    x = RNG.uniform(0.2, 0.9, size=shape).astype(np.float32)
    if name == "arccosh":  # keep the oracle off NaN-only comparisons
        x = x + 1.0
    return jnp.asarray(x)


def _oracle(name):
    """The plain JAX function of the same name, looked up independently of the table."""
    if name == "rsqrt":
        return jax.lax.rsqrt
    for ns in (jnp, jax.nn, jsp):
        if hasattr(ns, name):
            return getattr(ns, name)
    raise AssertionError(f"no plain JAX function named {name!r}")


UNARY = sorted(n for n, (_, arity, _) in ELEMENTWISE_OPS.items() if arity == 1)
BINARY = sorted(n for n, (_, arity, _) in ELEMENTWISE_OPS.items() if arity == 2)


def test_table_covers_what_models_use():
    wanted = {
        "exp", "log", "log1p", "log2", "log10", "expm1", "sqrt", "rsqrt", "square", "abs", "sign",
        "tanh", "sin", "cos", "tan", "arcsin", "sinh", "cosh", "sigmoid", "relu", "gelu", "silu",
        "softplus", "floor", "ceil", "round", "trunc", "maximum", "minimum", "where", "isnan",
        "isfinite", "isinf", "logical_and", "logical_or", "logical_not", "logical_xor",
        "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "power", "arctan2",
        "nan_to_num", "real", "imag", "conj",
    }  # fmt: skip
    assert wanted <= set(ELEMENTWISE_OPS)
    for name in [*ELEMENTWISE_OPS, "clip", "astype"]:
        assert callable(getattr(na, name)), name


# Every op of the table runs inside one jit per arity (one compilation instead of ~100), next to
# its plain-JAX oracle on the same data; the parametrized tests then compare per op.
UNARY_DATA = {n: _data(ELEMENTWISE_OPS[n][2], (2, 3), n) for n in UNARY}
BINARY_DATA = {
    n: (_data(ELEMENTWISE_OPS[n][2], (2, 3)), _data(ELEMENTWISE_OPS[n][2], (4, 3))) for n in BINARY
}


@pytest.fixture(scope="module")
def unary_results():
    @jax.jit
    def run(data):
        return {
            n: (getattr(na, n)(na.named(raw, ("batch", "embed"))), _oracle(n)(raw))
            for n, raw in data.items()
        }

    return run(UNARY_DATA)


@pytest.fixture(scope="module")
def binary_results():
    @jax.jit
    def run(data):
        out = {}
        for n, (a, b) in data.items():
            x = na.named(a, ("batch", "embed"))
            y = na.named(b, ("mlp", "embed"))  # shares `embed`, at another position
            out[n] = (getattr(na, n)(x, y), _oracle(n)(a[:, :, None], b.T[None, :, :]))
        return out

    return run(BINARY_DATA)


@pytest.mark.parametrize("name", UNARY)
def test_unary_matches_jnp(name, unary_results):
    out, expected = unary_results[name]
    assert out.axis_names == ("batch", "embed")
    assert out.dtype == expected.dtype
    np.testing.assert_allclose(out.array, expected, rtol=1e-5, equal_nan=True)


@pytest.mark.parametrize("name", BINARY)
def test_binary_broadcasts_by_name_and_matches_jnp(name, binary_results):
    out, expected = binary_results[name]
    assert out.shape == {"batch": 2, "embed": 3, "mlp": 4}
    assert out.dtype == expected.dtype
    np.testing.assert_allclose(out.array, expected, rtol=1e-5, equal_nan=True)
    # With the operands swapped the other operand's axes come first (shapes only: no compile).
    x = na.named(jax.ShapeDtypeStruct((2, 3), jnp.float32), ("batch", "embed"))
    y = na.named(jax.ShapeDtypeStruct((4, 3), jnp.float32), ("mlp", "embed"))
    if ELEMENTWISE_OPS[name][2] == "real":
        swapped = jax.eval_shape(getattr(na, name), y, x)
        assert swapped.axis_names == ("mlp", "embed", "batch")


def test_same_axes_in_another_order_are_matched_by_name():
    a, b = _data("real", (2, 3)), _data("real", (3, 2))
    out = na.named(a, ("batch", "embed")) - na.named(b, ("embed", "batch"))
    assert out.axis_names == ("batch", "embed")
    np.testing.assert_allclose(out.array, a - b.T)


def test_where_broadcasts_three_operands_by_name():
    cond, a, b = _data("bool", (3,)), _data("real", (2, 3)), _data("real", (4,))
    # `a` has every axis of the result, so the result keeps its order (not the mask's).
    out = na.where(na.named(cond, "embed"), na.named(a, ("batch", "embed")), -1.0)
    assert out.axis_names == ("batch", "embed")
    np.testing.assert_allclose(out.array, jnp.where(cond[None, :], a, -1.0))
    # No operand has every axis: the first operand's axes, then the others' new ones.
    out = na.where(na.named(cond, "embed"), na.named(a, ("batch", "embed")), na.named(b, "mlp"))
    assert out.axis_names == ("embed", "batch", "mlp")
    np.testing.assert_allclose(
        out.array, jnp.where(cond[:, None, None], a.T[:, :, None], b[None, None, :])
    )


def test_operand_with_every_axis_keeps_its_layout():
    q, k = Axis("q", 3), Axis("k", 4)
    scores = na.named(_data("real", (2, 5, 3, 4)), ("batch", "heads", "q", "k"))
    bias = na.named(_data("real", (4, 3)), ("k", "q"))
    mask = na.named(_data("bool", (3, 4)), (q, k))
    layout = ("batch", "heads", "q", "k")
    assert (mask.astype(jnp.float32) * scores).axis_names == layout  # the larger one on the right
    assert (bias + scores).axis_names == layout
    assert (scores + bias).axis_names == layout
    assert na.clip(mask.astype(jnp.float32), 0.0, scores).axis_names == layout
    # The first operand with every axis wins when several have them all.
    other = na.named(jnp.transpose(scores.array, (3, 2, 1, 0)), ("k", "q", "heads", "batch"))
    assert (bias + other + scores).axis_names == ("k", "q", "heads", "batch")
    assert (scores + other).axis_names == layout
    np.testing.assert_allclose((bias + scores).array, bias.array.T[None, None] + scores.array)


def _transposes(jaxpr):
    """The transpose equations of a jaxpr (recursing into sub-jaxprs such as pjit)."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "transpose":
            found.append(eqn)
        for param in eqn.params.values():
            sub = getattr(param, "jaxpr", param)  # a ClosedJaxpr holds a Jaxpr
            if hasattr(sub, "eqns"):
                found.extend(_transposes(sub))
    return found


def test_where_mask_scores_has_no_transpose_of_scores():
    m, s = _data("bool", (3, 4)), _data("real", (2, 5, 3, 4))

    def f(mask, scores):
        out = na.where(
            na.named(mask, ("q", "k")), na.named(scores, ("batch", "heads", "q", "k")), -1e9
        )
        return out.array

    jaxpr = jax.make_jaxpr(f)(m, s)
    assert _transposes(jaxpr.jaxpr) == []
    hlo = jax.jit(f).lower(m, s).compile().as_text()
    assert "transpose(" not in hlo
    np.testing.assert_array_equal(f(m, s), jnp.where(m[None, None], s, -1e9))
    # The mask's own order does not matter: a (k, q) mask is transposed, never the scores.
    g = lambda mask, scores: (
        na.where(  # noqa: E731
            na.named(mask, ("k", "q")), na.named(scores, ("batch", "heads", "q", "k")), -1e9
        ).array
    )
    eqns = _transposes(jax.make_jaxpr(g)(m.T, s).jaxpr)
    assert [e.invars[0].aval.shape for e in eqns] == [(4, 3)]
    np.testing.assert_array_equal(g(m.T, s), jnp.where(m[None, None], s, -1e9))


def test_clip_with_named_and_missing_bounds():
    a = jnp.array([[-2.0, 0.5, 3.0], [1.0, -1.0, 0.0]])
    x = na.named(a, ("batch", "embed"))
    hi = na.named(jnp.array([0.0, 1.0]), "batch")
    np.testing.assert_allclose(
        na.clip(x, -1.0, hi).array, jnp.clip(a, -1.0, jnp.array([[0.0], [1.0]]))
    )
    np.testing.assert_allclose(na.clip(x, max=0.5).array, jnp.clip(a, max=0.5))
    np.testing.assert_allclose(na.clip(x, min=0.0).array, jnp.clip(a, min=0.0))


def test_keywords_pass_through():
    a = jnp.array([1.234, -2.567, jnp.nan])
    x = na.named(a, "embed")
    np.testing.assert_allclose(na.round(x, decimals=1).array, jnp.round(a, decimals=1))
    np.testing.assert_allclose(na.nan_to_num(x, nan=7.0).array, jnp.nan_to_num(a, nan=7.0))
    np.testing.assert_allclose(
        na.gelu(x, approximate=False).array, jax.nn.gelu(a, approximate=False), equal_nan=True
    )


BINARY_OPERATORS = [
    (operator.add, jnp.add, "real"),
    (operator.sub, jnp.subtract, "real"),
    (operator.mul, jnp.multiply, "real"),
    (operator.truediv, jnp.true_divide, "real"),
    (operator.floordiv, jnp.floor_divide, "real"),
    (operator.mod, jnp.mod, "real"),
    (operator.pow, jnp.power, "real"),
    (operator.and_, jnp.bitwise_and, "int"),
    (operator.or_, jnp.bitwise_or, "int"),
    (operator.xor, jnp.bitwise_xor, "int"),
    (operator.and_, jnp.logical_and, "bool"),
    (operator.lshift, jnp.left_shift, "int"),
    (operator.rshift, jnp.right_shift, "int"),
    (operator.eq, jnp.equal, "real"),
    (operator.ne, jnp.not_equal, "real"),
    (operator.lt, jnp.less, "real"),
    (operator.le, jnp.less_equal, "real"),
    (operator.gt, jnp.greater, "real"),
    (operator.ge, jnp.greater_equal, "real"),
]


OPERATOR_DATA = [(_data(d, (2, 3)), _data(d, (3,))) for _, _, d in BINARY_OPERATORS]


@pytest.fixture(scope="module")
def operator_results():
    @jax.jit
    def run(data):
        results = []
        for (op, ref, domain), (a, b) in zip(BINARY_OPERATORS, data):
            s = {"real": 2.0, "int": 2, "bool": True}[domain]
            x, y = na.named(a, ("batch", "embed")), na.named(b, "embed")
            named_results = [op(x, y), op(y, x), op(x, s), op(s, x), op(x, jnp.asarray(s))]
            # op(y, x): x has every axis, so the result keeps x's (batch, embed) order.
            oracles = [
                ref(a, b[None, :]),
                ref(b[None, :], a),
                ref(a, s),
                ref(s, a),
                ref(a, jnp.asarray(s)),
            ]
            results.append((named_results, oracles))
        return results

    return run(OPERATOR_DATA)


@pytest.mark.parametrize(
    "i",
    range(len(BINARY_OPERATORS)),
    ids=[f"{o.__name__}-{r.__name__}" for o, r, _ in BINARY_OPERATORS],
)
def test_operators_match_jnp_with_arrays_and_scalars(i, operator_results):
    named_results, oracles = operator_results[i]
    assert [r.axis_names for r in named_results] == [("batch", "embed")] * 5
    for got, want in zip(named_results, oracles):  # with arrays; swapped; scalar right/left; 0-d
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got.array, want)


@pytest.mark.parametrize(
    "op,ref,domain",
    [
        (operator.neg, jnp.negative, "real"),
        (operator.pos, jnp.positive, "real"),
        (operator.abs, jnp.abs, "real"),
        (operator.invert, jnp.invert, "int"),
        (operator.invert, jnp.logical_not, "bool"),
    ],  # fmt: skip
)
def test_unary_operators(op, ref, domain):
    a = _data(domain, (2, 3))
    if domain == "real":
        a = a - 0.5  # both signs
    out = op(na.named(a, ("batch", "embed")))
    assert out.axis_names == ("batch", "embed")
    np.testing.assert_array_equal(out.array, ref(a))


def test_round_builtin():
    x = na.named(jnp.array([1.26, 2.71]), "embed")
    np.testing.assert_allclose(round(x, 1).array, jnp.array([1.3, 2.7]))
    np.testing.assert_allclose(round(x).array, jnp.array([1.0, 3.0]))


def test_scalars_numpy_and_zero_d_mix_freely():
    a = _data("real", (2, 3))
    x = na.named(a, ("batch", "embed"))
    np.testing.assert_allclose((np.float32(2) * x).array, 2 * a)
    np.testing.assert_allclose((np.array(3.0) + x).array, a + 3)  # numpy 0-d defers to __radd__
    z = na.named(jnp.float32(5.0), ())  # a NamedArray with no axes
    out = z * x
    assert out.axis_names == ("batch", "embed")
    np.testing.assert_allclose(out.array, 5 * a)
    assert na.exp(1.0).axis_names == () and na.exp(1.0).item() == pytest.approx(np.e)


def test_weak_scalars_keep_the_array_dtype():
    x = na.named(jnp.ones(3, jnp.bfloat16), "embed")
    assert (x * 2.0 + 1).dtype == jnp.bfloat16
    assert (2 ** na.named(jnp.arange(3), "embed")).dtype == jnp.int32


def test_eq_is_elementwise_and_unknown_types_fall_back():
    x = na.named(jnp.array([1.0, 2.0]), "embed")
    assert (x == 2.0).array.tolist() == [False, True]
    assert (x == "two") is False  # Python falls back to identity for types we do not handle
    assert (x != None) is True  # noqa: E711
    with pytest.raises(TypeError):
        hash(x)


def test_astype_function_and_method():
    x = na.named(jnp.array([1.7, -2.2]), "embed")
    assert x.astype(jnp.int32).array.tolist() == [1, -2]
    assert na.astype(x, "bfloat16").dtype == jnp.bfloat16
    assert na.astype(x, jnp.float16).axis_names == ("embed",)
    with pytest.raises(na.NamedTypeError, match=r"astype\(\): 'flaot32' is not a dtype"):
        x.astype("flaot32")


def test_astype_refuses_none_and_dtypes_jax_cannot_hold():
    x = na.named(jnp.array([1, 2], jnp.int32), "embed")
    with pytest.raises(
        na.NamedTypeError,
        match=r"astype\(\) needs a dtype, got None\. Pass the type to cast NamedArray\(embed=2\) "
        r"to, such as jnp\.float32",
    ):
        x.astype(None)  # used to cast to float32 silently
    for bad in (str, object):
        with pytest.raises(
            na.NamedTypeError, match=r"astype\(\): .* is not a numeric or bool dtype"
        ):
            na.astype(x, bad)
    assert x.astype(bool).dtype == jnp.bool_
    with pytest.raises(
        na.NamedTypeError,
        match=r"astype\(\) needs a NamedArray for `x`, got ArrayImpl of shape \(2,\)",
    ):
        na.astype(jnp.ones(2), jnp.int32)


def test_size_disagreement_names_both_sizes():
    x = na.named(jnp.ones((2, 3)), ("batch", "embed"))
    y = na.named(jnp.ones(4), "embed")
    msg = r"add\(\): Cannot broadcast axis 'embed': size 3 in \(batch=2, embed=3\) but size 4 in \(embed=4\)"
    with pytest.raises(na.AxisSizeError, match=msg):
        x + y
    with pytest.raises(na.AxisSizeError, match=r"where\(\): .*'embed': size 3 .* size 4"):
        na.where(x > 0, x, y)


def test_plain_array_with_dimensions_is_refused():
    x = na.named(jnp.ones((2, 3)), ("batch", "embed"))
    msg = (
        r"multiply\(\) got a plain array of shape \(3,\) for x2; plain arrays have no axis names "
        r"to broadcast by\. Wrap it first, e\.g\. named\(x, \('axis0',\)\)"
    )
    with pytest.raises(na.NamedTypeError, match=msg):
        x * jnp.ones(3)
    with pytest.raises(
        na.NamedTypeError, match=r"add\(\) got a plain array of shape \(2, 3\) for x1"
    ):
        jnp.ones((2, 3)) + x  # jax defers to our __radd__
    with pytest.raises(
        na.NamedTypeError, match=r"add\(\) got a plain array of shape \(3,\) for x1"
    ):
        np.ones(3) + x  # numpy defers too (__array_priority__)
    with pytest.raises(
        na.NamedTypeError, match=r"maximum\(\) needs a NamedArray or a scalar for x2, got \[1, 2\]"
    ):
        na.maximum(x, [1, 2])
    with pytest.raises(
        na.NamedTypeError, match=r"clip\(\) got a plain array of shape \(3,\) for max"
    ):
        na.clip(x, 0.0, jnp.ones(3))


def test_wrong_operand_count():
    x = na.named(jnp.ones(2), "embed")
    with pytest.raises(na.NamedTypeError, match=r"add\(\) takes 2 operand\(s\) \(x1, x2\), got 1"):
        na.add(x)
    with pytest.raises(
        na.NamedTypeError, match=r"where\(\) takes 3 operand\(s\) \(condition, x, y\), got 1"
    ):
        na.where(x > 0)


def test_jit_and_grad():
    a, b = _data("real", (2, 3)), _data("real", (3,))

    @jax.jit
    def f(x, y):
        return na.sum(na.tanh(x * y) + na.maximum(x, 0.5) ** 2)

    x, y = na.named(a, ("batch", "embed")), na.named(b, "embed")
    expected = jnp.sum(jnp.tanh(a * b[None]) + jnp.maximum(a, 0.5) ** 2)
    np.testing.assert_allclose(f(x, y).array, expected, rtol=1e-6)
    g = jax.grad(lambda x: f(x, y).array)(x)
    assert isinstance(g, na.NamedArray) and g.axis_names == ("batch", "embed")
    g_ref = jax.grad(lambda a: jnp.sum(jnp.tanh(a * b[None]) + jnp.maximum(a, 0.5) ** 2))(a)
    np.testing.assert_allclose(g.array, g_ref, rtol=1e-6)


def test_generated_docstrings_and_names():
    assert na.exp.__name__ == "exp"
    assert "``jnp.exp``" in na.exp.__doc__ and "Example:" in na.exp.__doc__
    assert "``jax.nn.gelu``" in na.gelu.__doc__
    assert "``jax.lax.rsqrt``" in na.rsqrt.__doc__
    assert "broadcasting by name" in na.add.__doc__


def _spec(x):
    spec = tuple(x.sharding.spec)
    return spec + (None,) * (x.ndim - len(spec))


def test_sharded_operands_broadcast_by_name(mesh_2x4):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    a = jnp.arange(8 * 12, dtype=jnp.float32).reshape(8, 12)
    b = jnp.arange(12, dtype=jnp.float32)
    with jax.set_mesh(mesh_2x4):
        x = na.named(
            jax.device_put(a, NamedSharding(mesh_2x4, P("data", "model"))), ("batch", "embed")
        )
        y = na.named(jax.device_put(b, NamedSharding(mesh_2x4, P("model"))), "embed")
        out = na.where(x > 50.0, y * x, -y)
    np.testing.assert_allclose(out.array, jnp.where(a > 50.0, b[None] * a, -b[None]))
    assert _spec(out) == ("data", "model")
    assert {s.data.shape for s in out.array.addressable_shards} == {(4, 3)}


def test_conflicting_explicit_shardings_follow_the_mapping_in_force(mesh_2x4):
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    explicit = mesh_2x4.axis_types[0] == AxisType.Explicit
    a = _data("real", (4, 2, 8))
    b = _data("real", (8,))
    put = lambda v, *spec: jax.device_put(v, NamedSharding(mesh_2x4, P(*spec)))  # noqa: E731
    x = na.named(put(a, "data"), ("batch", "seq", "embed"))  # an activation, batch on data
    bias = na.named(put(b, "data"), ("embed",))  # a parameter stored FSDP-style, embed on data
    scale = na.named(put(b, "model"), ("embed",))  # the same axis on another mesh axis
    f = lambda x, bias, scale: na.where(x > 0.5, x * scale + bias, 0.0)  # noqa: E731
    expected = jnp.where(a > 0.5, a * b[None, None] + b[None, None], 0.0)
    with jax.set_mesh(mesh_2x4):
        with na.axis_mapping({"batch": "data", "embed": "model"}):
            out = jax.jit(f)(x, bias, scale)
        np.testing.assert_allclose(out.array, expected, rtol=1e-6)
        assert out.axis_names == ("batch", "seq", "embed")
        if explicit:  # resharded by the mapping: batch on data, embed on model
            assert _spec(out) == ("data", None, "model")
            with pytest.raises(
                na.ShardingError,
                match=r"add\(\): the operands' shardings conflict on an Explicit mesh: mesh axis 'data' "
                r"shards 'batch' in x1 and 'embed' in x2, but one mesh axis can shard only one axis of the "
                r"result \(x1: NamedArray\(batch=4@data, seq=2, embed=8\); x2: NamedArray\(embed=8@data\)\)\. "
                r"Put the mapping to compute with in force, e.g. `with na.axis_mapping",
            ):
                x + bias  # no mapping in force: fail closed with our error, not JAX's
            with pytest.raises(
                na.ShardingError,
                match=r"multiply\(\): .*axis 'embed' is sharded over \('data',\) in x1 but over \('model',\) in x2",
            ):
                bias * scale
        else:  # Auto: nothing conflicts in the types; the same code runs without a mapping
            np.testing.assert_allclose(jax.jit(f)(x, bias, scale).array, expected, rtol=1e-6)
    # Operands that agree are left alone (no mapping needed), e.g. sharded meets unsharded.
    with jax.set_mesh(mesh_2x4):
        same_axes = x + na.named(put(b, None), ("embed",))
    assert _spec(same_axes)[:1] == ("data",)


def test_where_keeps_sharded_scores_layout(mesh_2x4):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    m, s = _data("bool", (3, 4)), _data("real", (2, 4, 3, 4))
    scores = na.named(
        jax.device_put(s, NamedSharding(mesh_2x4, P("data", "model"))), ("batch", "heads", "q", "k")
    )
    mask = na.named(jnp.asarray(m.T), ("k", "q"))  # the mask in its own order
    f = jax.jit(lambda mask, scores: na.where(mask, scores, -1e9))
    with jax.set_mesh(mesh_2x4):
        out = f(mask, scores)
        hlo = f.lower(mask, scores).compile().as_text()
    assert out.axis_names == ("batch", "heads", "q", "k")
    assert _spec(out) == ("data", "model", None, None)
    np.testing.assert_array_equal(out.array, jnp.where(m[None, None], s, -1e9))
    # Only the small mask may be transposed; the scores never are.
    for line in hlo.splitlines():
        if " transpose(" in line:
            assert "[4,3]" in line or "[3,4]" in line, line


def test_keywords_that_are_named_arrays_are_refused_by_the_op():
    """A NamedArray keyword reached JAX as it was: ``leaky_relu`` named ``multiply()`` in its error,
    ``isclose`` and ``nan_to_num`` raised JAX's own TypeErrors."""
    x = na.named(jnp.array([[-1.0, jnp.nan], [2.0, -3.0]]), ("batch", "embed"))
    slope = na.named(jnp.array([0.1, 0.2]), "batch")
    calls = {
        ("leaky_relu", "negative_slope"): lambda: na.leaky_relu(x, negative_slope=slope),
        ("nan_to_num", "nan"): lambda: na.nan_to_num(x, nan=slope),
        ("isclose", "atol"): lambda: na.isclose(x, x, atol=slope),
        ("allclose", "atol"): lambda: na.allclose(x, x, atol=slope),
    }
    for (op, key), call in calls.items():
        with pytest.raises(
            na.NamedTypeError,
            match=rf"^{op}\(\): keyword {key}= got NamedArray\(batch=2\); keywords are passed to "
            rf"JAX as they are, with no axis names to broadcast by\. Pass a scalar for {key}=, or "
            r"compute the result with named ops, which broadcast by name\.$",
        ):
            call()
    # A 0-d NamedArray is a scalar: it is passed on as one.
    got = na.leaky_relu(x, negative_slope=na.named(jnp.float32(0.5), ()))
    np.testing.assert_array_equal(got.array, jax.nn.leaky_relu(x.array, negative_slope=0.5))
