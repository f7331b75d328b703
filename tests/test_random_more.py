"""The table-driven samplers, ball and choice against jax.random with the same key; parameters
broadcast by name; categorical depends on axis names, not layout; errors; sharding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import namedaxes as na
from namedaxes import Axis
from namedaxes.random import SAMPLERS

KEY = jax.random.key(7)
AXES = {"batch": 2, "embed": 3}
PARAMS = {"lam": 3.0, "a": 2.0, "b": 3.0, "df": 4.0, "scale": 1.0, "concentration": 1.5}


@pytest.fixture(scope="module")
def samples():
    @jax.jit
    def run(key):
        out = {}
        for name, (fn, params, _) in SAMPLERS.items():
            args = [PARAMS[p] for p in params]
            out[name] = (
                getattr(na.random, name)(key, AXES, *args).array,
                fn(key, *args, shape=(2, 3)),
            )
        # A parameter that varies along one named axis broadcasts by name.
        lam = na.named(jnp.array([1.0, 10.0, 100.0]), "embed")
        out["poisson_named"] = (
            na.random.poisson(key, AXES, lam).array,
            jax.random.poisson(key, lam.array[None, :], (2, 3)),
        )
        out["ball"] = (
            na.random.ball(key, {"batch": 4}, {"coord": 3}).array,
            jax.random.ball(key, 3, 2, (4,)),
        )
        out["choice_int"] = (
            na.random.choice(key, {"vocab": 10}, {"sample": 4}).array,
            jax.random.choice(key, 10, (4,)),
        )
        table = jnp.arange(30.0).reshape(3, 10)  # (embed, vocab)
        p = jnp.linspace(0.0, 1.0, 10) / jnp.linspace(0.0, 1.0, 10).sum()
        out["choice_rows"] = (
            na.random.choice(key, na.named(table, ("embed", "vocab")), {"sample": 4}, axis="vocab", replace=False,
                             p=na.named(p, "vocab")).array,
            jax.random.choice(key, table, (4,), replace=False, p=p, axis=1),
        )  # fmt: skip
        return out

    return run(KEY)


@pytest.mark.parametrize("name", [*SAMPLERS, "poisson_named", "ball", "choice_int", "choice_rows"])
def test_same_values_as_jax_random(samples, name):
    got, expected = samples[name]
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


def test_samplers_take_jax_random_keyword_parameters_and_have_real_signatures():
    """``na.random.poisson(key, axes, lam=3.0)`` said "poisson() takes (key, axes, lam), got 0
    parameter(s) after axes", and every table sampler's signature was ``(*args, **kwargs)``."""
    import inspect

    for name, (fn, params, _) in SAMPLERS.items():
        sampler = getattr(na.random, name)
        jax_params = [p for p in inspect.signature(fn).parameters if p not in ("key", "shape")]
        ours = list(inspect.signature(sampler).parameters)
        assert ours[:2] == ["key", "axes"] and ours[2 : 2 + len(params)] == list(params)
        # every parameter and option jax.random's namesake takes (but its sharding) is ours too
        assert set(jax_params) - {"out_sharding"} <= set(ours), name
        by_keyword = sampler(KEY, AXES, **{p: PARAMS[p] for p in params}).array
        by_position = sampler(KEY, AXES, *[PARAMS[p] for p in params]).array
        expected = fn(KEY, *[PARAMS[p] for p in params], shape=(2, 3))
        np.testing.assert_array_equal(np.asarray(by_keyword), np.asarray(expected))
        np.testing.assert_array_equal(np.asarray(by_position), np.asarray(expected))
    assert na.random.beta(KEY, AXES, b=3.0, a=2.0, dtype=jnp.float16).dtype == jnp.float16
    lam = na.named(jnp.array([1.0, 10.0, 100.0]), "embed")
    np.testing.assert_array_equal(
        na.random.poisson(KEY, AXES, lam=lam).array, na.random.poisson(KEY, AXES, lam).array
    )
    with pytest.raises(TypeError, match=r"poisson\(\) got an unexpected keyword argument 'rate'"):
        na.random.poisson(KEY, AXES, rate=3.0)


def test_gumbel_mode_is_checked():
    """A mode JAX does not know was JAX's bare ValueError."""
    high = na.random.gumbel(KEY, AXES, mode="highest")
    np.testing.assert_array_equal(high.array, jax.random.gumbel(KEY, (2, 3), mode="highest"))
    with pytest.raises(
        na.AxisError,
        match=r"^gumbel\(\) mode must be one of 'low', 'high', 'highest' or None \(JAX's "
        r"default\), got 'med'\.$",
    ):
        na.random.gumbel(KEY, AXES, mode="med")


def test_axes_and_dtypes():
    def check(key):
        assert na.random.gamma(key, {"a": 2}, 1.0, dtype=jnp.float16).dtype == jnp.float16
        assert na.random.rademacher(key, Axis("a", 3)).axes == (Axis("a", 3),)
        assert na.random.gumbel(key, AXES, mode="low").axis_names == ("batch", "embed")
        assert na.random.ball(key, AXES, Axis("coord", 2)).axis_names == ("batch", "embed", "coord")
        table = na.named(jnp.zeros((3, 10)), ("embed", "vocab"))
        assert na.random.choice(key, table, {"s": 2, "t": 2}, axis="vocab").axis_names == (
            "embed",
            "s",
            "t",
        )
        return key

    jax.eval_shape(check, KEY)


def test_categorical_depends_on_names_not_layout():
    logits = jax.random.normal(KEY, (3, 4, 5))  # (batch, seq, vocab)
    a = na.named(logits, ("batch", "seq", "vocab"))
    b = na.named(jnp.transpose(logits, (2, 1, 0)), ("vocab", "seq", "batch"))
    sa = na.random.categorical(KEY, a, "vocab")
    sb = na.random.categorical(KEY, b, "vocab")
    assert sa.axis_names == ("batch", "seq") and sb.axis_names == ("seq", "batch")
    np.testing.assert_array_equal(sa.array, sb.array.T)
    # Asking for the result in another order does not change the draws either.
    sc = na.random.categorical(KEY, a, "vocab", axes={"seq": 4, "batch": 3})
    np.testing.assert_array_equal(sa.array, sc.array.T)


def test_errors():
    with pytest.raises(TypeError, match=r"gamma\(\) missing 1 required positional argument: 'a'"):
        na.random.gamma(KEY, AXES)
    with pytest.raises(
        na.AxisError,
        match=r"poisson\(\): lam NamedArray\(vocab=3\) has axes 'vocab' that NamedArray\(batch=2, embed=3\) lacks",
    ):
        na.random.poisson(KEY, AXES, na.named(jnp.ones(3), "vocab"))
    with pytest.raises(na.NamedTypeError, match=r"laplace\(\): 'flot' is not a dtype"):
        na.random.laplace(KEY, AXES, dtype="flot")
    with pytest.raises(na.DuplicateAxisError, match="Duplicate axis names 'batch'"):
        na.random.ball(KEY, AXES, {"batch": 2})
    with pytest.raises(
        na.AxisError, match=r"choice\(\): 12 draws without replacement from 'vocab' of size 10"
    ):
        na.random.choice(KEY, {"vocab": 10}, {"s": 12}, replace=False)
    with pytest.raises(
        na.AxisError,
        match=r"choice\(\): p must be a NamedArray over \(vocab=10\) alone, got NamedArray\(embed=10\)",
    ):
        na.random.choice(KEY, {"vocab": 10}, {"s": 2}, p=na.named(jnp.ones(10) / 10, "embed"))
    with pytest.raises(
        na.AxisError, match=r"choice\(\) needs axis= to draw from NamedArray\(embed=3, vocab=10\)"
    ):
        na.random.choice(KEY, na.named(jnp.zeros((3, 10)), ("embed", "vocab")), {"s": 2})
    with pytest.raises(na.DuplicateAxisError, match="Duplicate axis names 'embed'"):
        na.random.choice(
            KEY, na.named(jnp.zeros((3, 10)), ("embed", "vocab")), {"embed": 2}, axis="vocab"
        )


def test_sharded_choice_and_parameters(mesh_2x4):
    table = jax.device_put(
        jnp.arange(40.0).reshape(4, 10), NamedSharding(mesh_2x4, P("model", "data"))
    )
    lam = jax.device_put(jnp.arange(1.0, 9.0), NamedSharding(mesh_2x4, P("model")))
    with jax.set_mesh(mesh_2x4):

        @jax.jit
        def run(key, table, lam):
            t = na.named(table, ("embed", "vocab"))
            return (na.random.choice(key, t, {"s": 3}, axis="vocab"),
                    na.random.pareto(key, {"batch": 2, "embed": 8}, na.named(lam, "embed")))  # fmt: skip

        c, p = run(KEY, table, lam)
    np.testing.assert_array_equal(
        c.array, jax.random.choice(KEY, jnp.arange(40.0).reshape(4, 10), (3,), axis=1)
    )
    np.testing.assert_allclose(
        p.array, jax.random.pareto(KEY, jnp.arange(1.0, 9.0)[None, :], (2, 8)), rtol=1e-6
    )
    assert c.axis_names == ("embed", "s")


def test_choice_with_probabilities_sharded_over_the_mesh(mesh_2x4):
    """p split over a mesh axis is gathered for the draw (a running sum over all of p)."""
    logits = jnp.arange(8.0) / 4
    p = jax.device_put(jax.nn.softmax(logits), NamedSharding(mesh_2x4, P("data")))
    table = jax.device_put(
        jnp.arange(32.0).reshape(8, 4), NamedSharding(mesh_2x4, P("data", "model"))
    )
    with jax.set_mesh(mesh_2x4):
        probs = na.named(p, "vocab")
        ids = na.random.choice(KEY, Axis("vocab", 8), {"n": 3}, p=probs)
        rows = jax.jit(
            lambda t, q: na.random.choice(
                KEY, na.named(t, ("vocab", "embed")), {"n": 3}, axis="vocab", p=q
            )
        )(table, probs)
    expected = jax.random.choice(KEY, 8, (3,), p=jax.nn.softmax(logits))
    np.testing.assert_array_equal(ids.array, expected)
    np.testing.assert_array_equal(rows.array, jnp.arange(32.0).reshape(8, 4)[expected])
    assert rows.axis_names == ("n", "embed")


def test_bounds_sharded_on_one_mesh_axis_over_different_axes(mesh_2x4):
    """minval over batch and maxval over embed, both split on `model`: on Explicit meshes uniform,
    randint and truncated_normal raised JAX's ShardingTypeError (the result would be sharded twice
    over `model`); the bounds are replicated first, as the table samplers do."""
    on_model = NamedSharding(mesh_2x4, P("model"))
    lo, hi = jnp.zeros(4), jnp.arange(1.0, 5.0)
    ilo, ihi = jnp.zeros(4, jnp.int32), jnp.arange(1, 5, dtype=jnp.int32)
    lo_n, hi_n, ilo_n, ihi_n = (
        na.named(jax.device_put(v, on_model), n)
        for v, n in ((lo, "batch"), (hi, "embed"), (ilo, "batch"), (ihi, "embed"))
    )
    axes = {"batch": 4, "embed": 4}

    @jax.jit  # one compile for the four samplers
    def draw(lo_n, hi_n, ilo_n, ihi_n):
        return {
            "uniform": na.random.uniform(KEY, axes, minval=lo_n, maxval=hi_n),
            "randint": na.random.randint(KEY, axes, ilo_n, ihi_n),
            "truncated_normal": na.random.truncated_normal(KEY, axes, lo_n - 1.0, hi_n),
            "bernoulli": na.random.bernoulli(KEY, axes, hi_n / 8.0),
        }

    with jax.set_mesh(mesh_2x4):
        got = draw(lo_n, hi_n, ilo_n, ihi_n)
    col, row = (slice(None), None), (None, slice(None))
    expected = {
        "uniform": jax.random.uniform(KEY, (4, 4), minval=lo[col], maxval=hi[row]),
        "randint": jax.random.randint(KEY, (4, 4), ilo[col], ihi[row]),
        "truncated_normal": jax.random.truncated_normal(KEY, lo[col] - 1.0, hi[row], (4, 4)),
        "bernoulli": jax.random.bernoulli(KEY, hi[row] / 8.0, (4, 4)),
    }
    for name, out in got.items():
        assert out.axis_names == ("batch", "embed"), name
        np.testing.assert_array_equal(np.asarray(out.array), np.asarray(expected[name]), name)


def test_rademacher_needs_a_dtype_that_holds_minus_one():
    """uint8 gave 255 for -1 and bool gave all True."""
    for dtype in (jnp.int8, jnp.float32, jnp.complex64):
        out = na.random.rademacher(KEY, AXES, dtype=dtype)
        assert out.dtype == dtype
        assert set(np.asarray(out.array).real.ravel().tolist()) <= {-1, 1}
    for dtype, name in ((jnp.uint8, "uint8"), (bool, "bool")):
        with pytest.raises(
            na.NamedTypeError,
            match=rf"^rademacher\(\): dtype {name} is not a signed integer, floating-point or "
            r"complex dtype\. Pass a signed integer, floating-point or complex dtype such as "
            r"jnp\.int32 or jnp\.float32",
        ):
            na.random.rademacher(KEY, AXES, dtype=dtype)


def test_bernoulli_and_categorical_need_floating_point():
    """An int or bool p or logits reached JAX's TypeError ("dtype argument to gumbel must be a
    float dtype" for categorical, a function the user never called)."""
    fix = r"Pass a float \(p=1\.0\), or cast it with \.astype\(jnp\.float32\)\.$"
    with pytest.raises(
        na.NamedTypeError,
        match=r"^bernoulli\(\): p must be a floating-point probability, got 1 \(int\)\. " + fix,
    ):
        na.random.bernoulli(KEY, AXES, p=1)
    with pytest.raises(na.NamedTypeError, match=r"got True \(bool\)\. " + fix):
        na.random.bernoulli(KEY, AXES, p=True)
    with pytest.raises(na.NamedTypeError, match=r"got NamedArray\(int32, embed=3\)\. " + fix):
        na.random.bernoulli(KEY, AXES, p=na.named(jnp.ones(3, jnp.int32), "embed"))
    assert na.random.bernoulli(KEY, AXES, p=1.0).array.all()
    for dtype in (jnp.int32, bool):
        logits = na.named(jnp.zeros((2, 5), dtype), ("batch", "vocab"))
        with pytest.raises(
            na.NamedTypeError,
            match=rf"^categorical\(\): logits must be floating-point, got NamedArray\("
            rf"{jnp.dtype(dtype)}, batch=2, vocab=5\)\. Cast them first: "
            r"logits\.astype\(jnp\.float32\)\.$",
        ):
            na.random.categorical(KEY, logits, "vocab")
