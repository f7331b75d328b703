"""namedaxes.random against jax.random with the same key; by-name parameters; errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import namedaxes as na
from namedaxes import Axis

KEY = jax.random.key(42)
AXES = {"batch": 2, "embed": 3}


def test_normal_and_dtype():
    out = na.random.normal(KEY, AXES)
    assert out.axes == (Axis("batch", 2), Axis("embed", 3))
    np.testing.assert_array_equal(out.array, jax.random.normal(KEY, (2, 3)))
    half = na.random.normal(KEY, [Axis("embed", 3)], dtype=jnp.bfloat16)
    np.testing.assert_array_equal(half.array, jax.random.normal(KEY, (3,), jnp.bfloat16))


def test_uniform_with_named_bounds_broadcast_by_name():
    hi = na.named(jnp.array([1.0, 10.0, 100.0]), "embed")
    lo = na.named(jnp.array([-1.0, 0.0]), "batch")
    out = na.random.uniform(KEY, AXES, minval=lo, maxval=hi)
    expected = jax.random.uniform(KEY, (2, 3), minval=lo.array[:, None], maxval=hi.array[None, :])
    np.testing.assert_array_equal(out.array, expected)
    assert bool((out.array[:, 0] < 1.0).all()) and bool((out.array[1] >= 0.0).all())


def test_bernoulli():
    p = na.named(jnp.array([0.0, 1.0, 0.5]), "embed")
    out = na.random.bernoulli(KEY, {"batch": 2, "embed": 3}, p)
    assert out.axis_names == ("batch", "embed") and out.dtype == jnp.bool_
    np.testing.assert_array_equal(out.array, jax.random.bernoulli(KEY, p.array[None, :], (2, 3)))
    assert out.array[:, 0].tolist() == [False, False] and out.array[:, 1].tolist() == [True, True]


def test_randint_and_truncated_normal():
    hi = na.named(jnp.array([5, 50, 500]), "embed")
    out = na.random.randint(KEY, AXES, 0, hi, dtype=jnp.int16)
    np.testing.assert_array_equal(
        out.array, jax.random.randint(KEY, (2, 3), 0, hi.array[None, :], jnp.int16)
    )
    assert out.dtype == jnp.int16
    t = na.random.truncated_normal(KEY, {"embed": 2, "mlp": 3}, -0.5, 0.5)
    np.testing.assert_array_equal(t.array, jax.random.truncated_normal(KEY, -0.5, 0.5, (2, 3)))
    assert float(jnp.abs(t.array).max()) <= 0.5


def test_categorical_drops_the_sampled_axis():
    logits = na.named(jax.random.normal(KEY, (2, 3, 2)), ("batch", "vocab", "seq"))
    out = na.random.categorical(KEY, logits, "vocab")
    assert out.axis_names == ("batch", "seq")
    expected = jax.random.categorical(KEY, jnp.moveaxis(logits.array, 1, -1), axis=-1)
    np.testing.assert_array_equal(out.array, expected)
    # Decisive logits: the sample is the argmax, whatever the key.
    sharp = na.named(jnp.array([[0.0, 80.0, 0.0], [80.0, 0.0, 0.0]]), ("batch", "vocab"))
    assert na.random.categorical(KEY, sharp, "vocab").array.tolist() == [1, 0]


def test_categorical_with_extra_sample_axes():
    sharp = na.named(jnp.array([[0.0, 80.0, 0.0], [0.0, 0.0, 80.0]]), ("batch", "vocab"))
    out = na.random.categorical(KEY, sharp, "vocab", axes={"batch": 2, "sample": 4})
    assert out.axis_names == ("batch", "sample")
    assert out.array.tolist() == [[1] * 4, [2] * 4]


def test_permutation_of_an_axis_and_of_an_array():
    perm = na.random.permutation(KEY, {"batch": 4})
    assert perm.axes == (Axis("batch", 4),)
    np.testing.assert_array_equal(perm.array, jax.random.permutation(KEY, 4))
    x = na.named(jnp.arange(12).reshape(3, 4), ("embed", "batch"))
    out = na.random.permutation(KEY, x, "batch")
    assert out.axes == x.axes
    np.testing.assert_array_equal(out.array, jax.random.permutation(KEY, x.array, axis=1))
    v = na.named(jnp.arange(4), "batch")
    np.testing.assert_array_equal(
        na.random.permutation(KEY, v).array, jax.random.permutation(KEY, v.array)
    )


def test_samplers_under_jit():
    @jax.jit
    def sample(key, scale):
        return na.random.normal(key, AXES) * scale + na.random.uniform(key, {"embed": 3})

    out = sample(KEY, 2.0)
    assert out.axis_names == ("batch", "embed")
    expected = jax.random.normal(KEY, (2, 3)) * 2.0 + jax.random.uniform(KEY, (3,))[None, :]
    np.testing.assert_allclose(out.array, expected, rtol=1e-6)


def test_bad_axes_and_dtype():
    with pytest.raises(
        na.NamedTypeError, match=r"axes must be Axis objects or a \{name: size\} dict, got 'batch'"
    ):
        na.random.normal(KEY, ("batch",))
    with pytest.raises(na.NamedTypeError, match=r"uniform\(\): 'flaot' is not a dtype"):
        na.random.uniform(KEY, AXES, dtype="flaot")
    with pytest.raises(na.DuplicateAxisError, match=r"Duplicate axis names 'batch'"):
        na.random.normal(KEY, [Axis("batch", 2), Axis("batch", 2)])


def test_bad_parameters():
    with pytest.raises(
        na.AxisError,
        match=r"uniform\(\): maxval NamedArray\(vocab=7\) has axes 'vocab' that NamedArray\(batch=2, embed=3\) lacks; it may only use 'batch', 'embed'",
    ):
        na.random.uniform(KEY, AXES, maxval=na.named(jnp.ones(7), "vocab"))
    with pytest.raises(
        na.AxisSizeError,
        match=r"bernoulli\(\): p axis 'embed' has size 4, but the result's 'embed' has size 3",
    ):
        na.random.bernoulli(KEY, AXES, na.named(jnp.ones(4), "embed"))
    with pytest.raises(
        na.NamedTypeError, match=r"randint\(\) got a plain array of shape \(3,\) for maxval"
    ):
        na.random.randint(KEY, AXES, 0, jnp.ones(3, jnp.int32))


def test_bad_categorical_and_permutation():
    logits = na.named(jnp.zeros((2, 5)), ("batch", "vocab"))
    with pytest.raises(
        na.AxisNotFoundError,
        match=r"Axis 'vocb' not found in NamedArray\(batch=2, vocab=5\)\. Available axes: 'batch', 'vocab'\.",
    ):
        na.random.categorical(KEY, logits, "vocb")
    with pytest.raises(
        na.AxisError,
        match=r"categorical\(\) result axes \(sample=3\) miss the logits' axes 'batch'; include every logits axis except 'vocab'",
    ):
        na.random.categorical(KEY, logits, "vocab", axes={"sample": 3})
    with pytest.raises(
        na.AxisError,
        match=r"categorical\(\) samples over 'vocab', so the result axes \(batch=2, vocab=5\) cannot contain it",
    ):
        na.random.categorical(KEY, logits, "vocab", axes={"batch": 2, "vocab": 5})
    with pytest.raises(
        na.NamedTypeError, match=r"categorical\(\) needs logits as a NamedArray, got ArrayImpl"
    ):
        na.random.categorical(KEY, jnp.zeros(3), "vocab")
    with pytest.raises(
        na.AxisError,
        match=r"permutation\(\) needs axis= to shuffle NamedArray\(batch=2, vocab=5\); pass one of 'batch', 'vocab'",
    ):
        na.random.permutation(KEY, logits)
    with pytest.raises(
        na.AxisError, match=r"permutation\(\) of Axis\('batch', 4\) takes no axis= argument"
    ):
        na.random.permutation(KEY, Axis("batch", 4), "batch")
    with pytest.raises(
        na.NamedTypeError,
        match=r"permutation\(\) needs an Axis or a one-entry \{name: size\} dict, got 8 \(int\)",
    ):
        na.random.permutation(KEY, 8)


def test_permutation_along_a_sharded_axis(mesh_2x4):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    a = jnp.arange(8 * 4).reshape(8, 4)
    with jax.set_mesh(mesh_2x4):
        x = na.named(
            jax.device_put(a, NamedSharding(mesh_2x4, P("data", "model"))), ("batch", "embed")
        )
        out = na.random.permutation(KEY, x, "batch")
    np.testing.assert_array_equal(out.array, jax.random.permutation(KEY, a, axis=0))
    assert tuple(out.sharding.spec)[1:2] == ("model",)
