"""Named ops fail closed: bad input gets a typed error naming the offender and a fix, never a silent
result or an error from JAX/NumPy internals. ``x`` is ``NamedArray(batch=2, seq=3)``."""

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import namedaxes as na
from namedaxes._errors import (
    AxisError,
    AxisIndexError,
    AxisSizeError,
    DuplicateAxisError,
    NamedTypeError,
)

KEY = jax.random.key(0)


@pytest.fixture
def x():
    return na.named(jnp.arange(6.0).reshape(2, 3), ("batch", "seq"))


# -- field(axis_names=...) ----------------------------------------------------------------------


def test_field_refuses_duplicate_axis_names():
    with pytest.raises(
        DuplicateAxisError,
        match=r"field\(axis_names=\('embed', 'embed'\)\) names 'embed' more than once; each "
        r"dimension of the array needs its own axis name .* Rename one, e.g. 'embed' -> 'embed_out'",
    ):
        na.field(axis_names=("embed", "embed"))
    with pytest.raises(
        NamedTypeError, match=r"needs a tuple of axis names \(non-empty strings\), got 3"
    ):
        na.field(axis_names=3)

    class Ok(eqx.Module):
        w: jax.Array = na.field(axis_names=("embed", "mlp"))

    assert Ok.__dataclass_fields__["w"].metadata["namedaxes_axis_names"] == ("embed", "mlp")


# -- random -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sample, dtype, kind",
    [
        (lambda dt: na.random.normal(KEY, {"a": 3}, dt), jnp.int32, "floating-point or complex"),
        (lambda dt: na.random.uniform(KEY, {"a": 3}, dt), jnp.int32, "floating-point"),
        (
            lambda dt: na.random.truncated_normal(KEY, {"a": 3}, -1.0, 1.0, dt),
            jnp.int32,
            "floating-point",
        ),
        (lambda dt: na.random.exponential(KEY, {"a": 3}, dtype=dt), jnp.int32, "floating-point"),
        (lambda dt: na.random.ball(KEY, {"a": 3}, {"d": 2}, dtype=dt), jnp.int32, "floating-point"),
        (lambda dt: na.random.randint(KEY, {"a": 3}, 0, 5, dt), jnp.float32, "integer"),
        (lambda dt: na.random.poisson(KEY, {"a": 3}, 2.0, dtype=dt), jnp.float32, "integer"),
    ],
)
def test_random_refuses_a_dtype_of_the_wrong_kind(sample, dtype, kind):
    name = np.dtype(dtype).name
    with pytest.raises(
        NamedTypeError, match=rf"\(\): dtype {name} is not a {kind} dtype. Pass a {kind} dtype"
    ):
        sample(dtype)


def test_random_dtype_kinds_that_jax_accepts_still_work():
    assert na.random.normal(KEY, {"a": 3}, jnp.complex64).dtype == jnp.complex64
    assert na.random.rademacher(KEY, {"a": 3}, dtype=jnp.float32).dtype == jnp.float32
    assert na.random.randint(KEY, {"a": 3}, 0, 5, jnp.int8).dtype == jnp.int8
    with pytest.raises(NamedTypeError, match=r"normal\(\): 'flot32' is not a dtype"):
        na.random.normal(KEY, {"a": 3}, "flot32")


@pytest.mark.parametrize(
    "bad, shown",
    [
        (3, r"3 \(int\)"),
        (1.5, r"1.5 \(float\)"),
        (jnp.ones(2), r"ArrayImpl of shape \(2,\) of dtype float32"),
        (jnp.zeros(3, jnp.uint32), r"ArrayImpl of shape \(3,\) of dtype uint32"),
    ],
)
def test_random_refuses_a_first_argument_that_is_not_a_key(bad, shown):
    for sample in (
        lambda k: na.random.normal(k, {"a": 3}),
        lambda k: na.random.bernoulli(k, {"a": 3}),
        lambda k: na.random.gamma(k, {"a": 3}, 2.0),
        lambda k: na.random.permutation(k, {"a": 3}),
    ):
        with pytest.raises(
            NamedTypeError,
            match=rf"needs a PRNG key as its first argument, got {shown}. Make one with "
            r"jax.random.key\(seed\)",
        ):
            sample(bad)


def test_random_keys_that_work():
    legacy = jax.random.PRNGKey(0)
    np.testing.assert_array_equal(
        na.random.normal(legacy, {"a": 3}).array, jax.random.normal(legacy, (3,))
    )
    # Traced keys (under jit and vmap) are keys too.
    keys = jax.random.split(KEY, 2)
    out = jax.jit(jax.vmap(lambda k: na.random.uniform(k, {"a": 3}).array))(keys)
    assert out.shape == (2, 3)
    with pytest.raises(
        NamedTypeError, match=r"normal\(\) takes one PRNG key, got a key array of shape \(2,\)"
    ):
        na.random.normal(keys, {"a": 3})


def test_categorical_and_choice_refuse_a_size_0_axis():
    logits = na.named(jnp.zeros((2, 0)), ("batch", "vocab"))
    with pytest.raises(
        AxisError,
        match=r"categorical\(\) over axis 'vocab' of size 0 in NamedArray\(batch=2, vocab=0\) has "
        r"no result: there is no element to pick. Sample from an axis with at least one category",
    ):
        na.random.categorical(KEY, logits, "vocab")
    with pytest.raises(
        AxisError, match=r"choice\(\): cannot draw 4 entries from 'vocab' of size 0"
    ):
        na.random.choice(KEY, {"vocab": 0}, {"sample": 4})


# -- indexing -----------------------------------------------------------------------------------

_RANGE = r"Index {i} is out of range for axis 'seq' of size 3 in NamedArray\(batch=2, seq=3\). Valid indices are -3..2."


@pytest.mark.parametrize(
    "index, bad",
    [
        (lambda x: x["seq", [0, 5]], 5),
        (lambda x: x["seq", np.array([0, 5])], 5),
        (lambda x: x[{"seq": (1, -4)}], -4),
        (lambda x: x["seq", 7], 7),
        (lambda x: x["seq", np.int64(-4)], -4),
        (lambda x: na.take(x, "seq", [9]), 9),
        (lambda x: x["batch", 0, "seq", [3]], 3),
        (lambda x: x.at["seq", [5]].set(1.0), 5),
        (lambda x: x.at["seq", 3].add(1.0), 3),
        (lambda x: x.at["seq", [0, 4]].get(), 4),
    ],
)
def test_static_indices_out_of_range_raise_an_index_error(x, index, bad):
    with pytest.raises(AxisIndexError, match=_RANGE.format(i=bad)) as info:
        index(x)
    assert isinstance(info.value, IndexError) and isinstance(info.value, AxisSizeError)


def test_static_indices_in_range_keep_numpy_meaning(x):
    np.testing.assert_array_equal(x["seq", [-1, 0]].array, x.array[:, [-1, 0]])
    np.testing.assert_array_equal(x["seq", np.array([2, -3])].array, x.array[:, [2, -3]])
    np.testing.assert_array_equal(x["seq", -3].array, x.array[:, -3])
    np.testing.assert_array_equal(na.take(x, "seq", (2, 2)).array, x.array[:, [2, 2]])
    np.testing.assert_array_equal(x.at["seq", [-1]].set(9.0).array, x.array.at[:, [-1]].set(9.0))
    assert x["seq", []].shape == {"batch": 2, "seq": 0}


@pytest.mark.parametrize(
    "index, match",
    [
        (
            [0.5, 1.7],
            r"Index for axis 'seq' must be integer positions, got floats \[0.5, 1.7\]. Round or cast",
        ),
        (np.array([0.0, 2.0]), r"must be integer positions, got floats \[0.0, 2.0\]"),
        (["a"], r"must be integer positions, got values of dtype <U1 \['a'\]"),
        (
            [True, False, True],
            r"Index for axis 'seq' is a boolean list/array \[True, False, True\]: boolean masks are "
            r"not supported as positions .* na.where\(mask, x, 0\), or turn the mask into positions "
            r"first, e.g. np.nonzero\(mask\)\[0\]",
        ),
        (np.array([True, False, True]), r"boolean masks are not supported as positions"),
        (
            jnp.array([True, False, True]),
            r"dtype bool. Boolean masks give data-dependent shapes and are not supported as positions; use where\(\) to mask, or np.nonzero",
        ),
    ],
)
def test_float_and_bool_index_lists_are_refused(x, index, match):
    with pytest.raises(NamedTypeError, match=match):
        x["seq", index]
    with pytest.raises(NamedTypeError, match=match):
        x.at["seq", index].set(0.0)


def test_an_explicit_jax_mode_handles_static_out_of_range_indices(x):
    got = x.at["seq", [0, 5]].get(mode="fill", fill_value=-1.0)
    np.testing.assert_array_equal(got.array, [[0.0, -1.0], [3.0, -1.0]])
    dropped = x.at["seq", [0, 5]].set(9.0, mode="drop")
    np.testing.assert_array_equal(dropped.array, x.array.at[:, [0, 5]].set(9.0, mode="drop"))
    np.testing.assert_array_equal(x.at["seq", 7].get(mode="clip").array, x.array[:, 2])
    # A huge static index stays out of range (it is not wrapped into range by an int32 cast).
    huge = x.at["seq", [2**40]].get(mode="fill", fill_value=-1.0)
    np.testing.assert_array_equal(huge.array, [[-1.0], [-1.0]])


def test_traced_indices_keep_jax_semantics(x):
    # Documented: JAX arrays are dynamic, so out-of-range entries are clamped when reading and
    # dropped when updating, exactly as jnp does.
    idx = jnp.array([0, 5])
    read = jax.jit(lambda x, i: x["seq", i])(x, idx)
    np.testing.assert_array_equal(read.array, x.array[:, idx])
    np.testing.assert_array_equal(read.array, x.array[:, [0, 2]])
    written = jax.jit(lambda x, i: x.at["seq", i].set(9.0))(x, idx)
    np.testing.assert_array_equal(written.array, x.array.at[:, idx].set(9.0))
    np.testing.assert_array_equal(written.array[:, 1:], x.array[:, 1:])


# -- reductions and softmax ---------------------------------------------------------------------

_REDUCTIONS = [
    "sum",
    "prod",
    "mean",
    "max",
    "min",
    "var",
    "std",
    "any",
    "all",
    "logsumexp",
    "nansum",
    "nanmax",
]


@pytest.mark.parametrize("op", _REDUCTIONS)
@pytest.mark.parametrize("empty", [(), []])
def test_reductions_refuse_an_empty_selection(x, op, empty):
    with pytest.raises(
        AxisError,
        match=rf"^{op}\(\): axis={re.escape(repr(empty))} selects no axes, so there is nothing to "
        rf"reduce over. An empty selection is refused because it is almost always a bug; name the "
        rf"axes to reduce over, e.g. {op}\(x, 'batch'\) or axis=None for all of them.$",
    ):
        getattr(na, op)(x, empty)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_refuses_an_empty_selection(x, op):
    with pytest.raises(
        AxisError,
        match=rf"^{op}\(\): axis=\(\) selects no axes, so there is nothing to normalize over. .* "
        rf"name the axes to normalize over, e.g. {op}\(x, 'seq'\).$",
    ):
        getattr(na, op)(x, ())
    np.testing.assert_allclose(
        getattr(na, op)(x, "seq").array, getattr(jax.nn, op)(x.array, axis=1)
    )


def test_reductions_over_none_and_names_still_work(x):
    np.testing.assert_array_equal(na.sum(x).array, jnp.sum(x.array))
    np.testing.assert_array_equal(na.sum(x, ["seq"]).array, jnp.sum(x.array, axis=1))
    scalar = na.named(jnp.array(3.0), ())
    assert na.sum(scalar).item() == 3.0  # nothing to reduce, but nothing was asked for either


_X = r"NamedArray\(batch=2, seq=3\)"


@pytest.mark.parametrize(
    "call, op, shown, suggest",
    [
        (
            lambda x: na.sum(x, 0),
            "sum",
            "0",
            rf"In {_X}, position 0 is 'batch': pass axis='batch'.",
        ),
        (
            lambda x: na.mean(x, ("batch", 1)),
            "mean",
            r"\('batch', 1\)",
            rf"In {_X}, position 1 is 'seq': pass axis=\('batch', 'seq'\).",
        ),
        (
            lambda x: na.std(x, [1, 0]),
            "std",
            r"\[1, 0\]",
            rf"In {_X}, position 1 is 'seq', 0 is 'batch': pass axis=\('seq', 'batch'\).",
        ),
        (lambda x: x.sum(-1), "sum", "-1", rf"In {_X}, position -1 is 'seq': pass axis='seq'."),
        (lambda x: na.softmax(x, 1), "softmax", "1", "pass axis='seq'."),
        (lambda x: na.argmax(x, np.int64(1)), "argmax", "1", "pass axis='seq'."),
        (lambda x: na.cumsum(x, 0), "cumsum", "0", "pass axis='batch'."),
        (lambda x: na.sum(x, 5), "sum", "5", rf"{_X} has axes 'batch', 'seq'."),
    ],
)
def test_axes_given_by_position_are_refused(x, call, op, shown, suggest):
    with pytest.raises(
        NamedTypeError,
        match=rf"^{op}\(\): axes are chosen by name, not by position; got axis={shown}. .*{suggest}$",
    ):
        call(x)
    with pytest.raises(
        NamedTypeError,
        match=r"sum\(\): axis must be an axis name, an Axis, a sequence of them or None, got 1.5 \(float\)",
    ):
        na.sum(x, 1.5)


def test_dot_refuses_axes_given_by_position(x):
    with pytest.raises(
        NamedTypeError,
        match=rf"^dot\(\): axes are chosen by name, not by position; got axis=0. In operand 1 "
        rf"{_X}, position 0 is 'batch': pass axis='batch'.$",
    ):
        na.dot(x, x, axis=0)
    with pytest.raises(
        NamedTypeError,
        match=r"dot\(\): axes are chosen by name, not by position; got axis=\('seq', 1\)",
    ):
        na.dot(x, x, axis=("seq", 1))
    with pytest.raises(
        NamedTypeError,
        match=r"dot\(\): axis must be an axis name, an Axis, a sequence of them or None, got 1.5",
    ):
        na.dot(x, x, axis=1.5)
    np.testing.assert_array_equal(
        na.dot(x, x, axis="seq").array, jnp.einsum("bs,bs->b", x.array, x.array)
    )


def test_misspelt_dtype_strings_are_refused(x):
    with pytest.raises(
        NamedTypeError,
        match=r"^dot\(\): 'flot32' is not a dtype. Pass a dtype such as jnp.float32, jnp.int32 or 'bfloat16'.$",
    ):
        na.dot(x, x, axis="seq", preferred_element_type="flot32")
    with pytest.raises(NamedTypeError, match=r"^einsum\(\): 'flot32' is not a dtype"):
        na.einsum("batch seq, batch seq -> batch", x, x, preferred_element_type="flot32")
    with pytest.raises(NamedTypeError, match=r"^astype\(\): 'flot32' is not a dtype"):
        x.astype("flot32")
    with pytest.raises(NamedTypeError, match=r"^sum\(\): 'flot32' is not a dtype"):
        na.sum(x, "seq", dtype="flot32")
    out = na.dot(x, x, axis="seq", preferred_element_type="float32")
    assert out.dtype == jnp.float32


@pytest.mark.parametrize("op", ["max", "min", "nanmax", "argmax", "argmin", "nanargmin"])
def test_max_and_argmax_refuse_a_size_0_axis(op):
    e = na.named(jnp.zeros((2, 0)), ("batch", "seq"))
    fix = (
        r"Give the axis at least one element \(pad or slice it first\)."
        if "arg" in op
        else rf"Pass initial=, the result for an empty axis \(e.g. initial={'-' if 'max' in op else ''}jnp.inf\)."
    )
    with pytest.raises(
        AxisError,
        match=rf"^{op}\(\) over axis 'seq' of size 0 in NamedArray\(batch=2, seq=0\) has no result: "
        rf"there is no element to pick. {fix}$",
    ):
        getattr(na, op)(e, "seq")


def test_size_0_reductions_with_an_identity_still_work():
    e = na.named(jnp.zeros((2, 0)), ("batch", "seq"))
    np.testing.assert_array_equal(na.sum(e, "seq").array, jnp.zeros(2))
    np.testing.assert_array_equal(na.max(e, "seq", initial=-1.0).array, jnp.full(2, -1.0))
    assert na.max(e, "batch").shape == {"seq": 0}  # the reduced axis is not empty


@pytest.mark.parametrize(
    "call, op",
    [
        (lambda x, m: na.max(x, "seq", where=m, initial=0.0), "max"),
        (lambda x, m: na.sum(x, "seq", where=m), "sum"),
        (lambda x, m: na.nanmean(x, "seq", where=m), "nanmean"),
        (lambda x, m: na.softmax(x, "seq", where=m), "softmax"),
        (lambda x, m: x.mean("seq", where=m), "mean"),
    ],
)
def test_where_masks_must_be_boolean(x, call, op):
    mask = na.named(jnp.array([1, 0, 1], jnp.int32), ("seq",))
    with pytest.raises(
        NamedTypeError,
        match=rf"^{op}\(\): where= must be a boolean mask, got NamedArray\(seq=3\) of dtype int32. "
        r"Make one with a comparison \(e.g. where=mask > 0\) or cast it with .astype\(bool\).$",
    ):
        call(x, mask)
    with pytest.raises(
        NamedTypeError, match=rf"^{op}\(\): where= must be a boolean mask, got 1 \(int\)"
    ):
        call(x, 1)
    good = call(x, mask > 0)
    assert good.ndim >= 1


def test_where_mask_values_match_jnp(x):
    mask = na.named(jnp.array([True, False, True]), ("seq",))
    np.testing.assert_array_equal(
        na.sum(x, "seq", where=mask).array, jnp.sum(x.array, axis=1, where=mask.array[None, :])
    )
    np.testing.assert_array_equal(na.sum(x, "seq", where=True).array, jnp.sum(x.array, axis=1))


# -- check_axes ---------------------------------------------------------------------------------


def test_check_axes_refuses_what_is_not_a_function():
    with pytest.raises(
        NamedTypeError,
        match=r"^check_axes\(\) decorates a function, got 3 \(int\). Put @na.check_axes above a "
        r"def, or wrap one: na.check_axes\(my_function\).$",
    ):
        na.check_axes(3)
    with pytest.raises(
        NamedTypeError, match=r"check_axes\(\) decorates a function, got 'f' \(str\)"
    ):
        na.check_axes("f")
    with pytest.raises(
        NamedTypeError, match=r"check_axes\(\) cannot read the signature of <class 'int'>"
    ):
        na.check_axes(int)

    @na.check_axes
    def f(a: na.NamedArray["batch seq"]) -> na.NamedArray["batch"]:
        return a.sum("seq")

    assert f(na.named(jnp.ones((2, 3)), ("batch", "seq"))).axis_names == ("batch",)


def test_index_lists_with_traced_entries_are_dynamic(x):
    read = jax.jit(lambda x, i: x["seq", [i, 0]])(x, 5)  # clamped by JAX, as documented
    np.testing.assert_array_equal(read.array, x.array[:, jnp.array([5, 0])])
    with pytest.raises(
        NamedTypeError, match=r"Index for axis 'seq' must be integer positions, got floats"
    ):
        jax.jit(lambda x, i: x["seq", [i, 0.5]])(x, 1)


def test_static_index_checks_on_sharded_arrays(mesh_2x4):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    data = jnp.arange(32.0).reshape(4, 8)
    x = na.named(
        jax.device_put(data, NamedSharding(mesh_2x4, P("data", "model"))), ("batch", "seq")
    )
    with pytest.raises(
        AxisIndexError,
        match=r"Index 9 is out of range for axis 'seq' of size 8 in NamedArray\(batch=4, seq=8\)",
    ):
        x["seq", [0, 9]]
    with pytest.raises(AxisIndexError, match=r"Index -9 is out of range for axis 'seq' of size 8"):
        jax.jit(lambda x: x.at["seq", [-9]].set(0.0))(x)
    got = jax.jit(lambda x: x["seq", [7, -1, 0]])(x)
    np.testing.assert_array_equal(got.array, data[:, [7, -1, 0]])
    dropped = jax.jit(lambda x: x.at["seq", [1, 9]].set(-1.0, mode="drop"))(x)
    np.testing.assert_array_equal(dropped.array, data.at[:, 1].set(-1.0))
    assert dropped.array.sharding.spec == P("data", "model")
