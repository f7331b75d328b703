"""Creation ops: zeros/ones/full (and *_like), arange, linspace against jax.numpy; bad specs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import namedaxes as na
from namedaxes import Axis

AXES_FORMS = {
    "dict": {"batch": 2, "embed": 3},
    "tuple": (Axis("batch", 2), Axis("embed", 3)),
    "list": [Axis("batch", 2), Axis("embed", 3)],
}


@pytest.mark.parametrize("form", list(AXES_FORMS))
def test_zeros_ones_full_match_jnp(form):
    axes = AXES_FORMS[form]
    for got, want in [
        (na.zeros(axes), jnp.zeros((2, 3))),
        (na.ones(axes, dtype=jnp.int32), jnp.ones((2, 3), jnp.int32)),
        (na.full(axes, 7.5), jnp.full((2, 3), 7.5)),
        (na.full(axes, 3, dtype=jnp.bfloat16), jnp.full((2, 3), 3, jnp.bfloat16)),
    ]:
        assert got.axes == (Axis("batch", 2), Axis("embed", 3))
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got.array, want)


def test_single_axis_and_no_axes():
    assert na.zeros(Axis("embed", 4)).shape == {"embed": 4}
    scalar = na.full({}, 2.0)
    assert scalar.axes == () and scalar.item() == 2.0


def test_full_broadcasts_a_named_fill_value_by_name():
    bias = na.named(jnp.array([1.0, 2.0, 3.0]), "embed")
    out = na.full({"embed": 3, "batch": 2}, bias)
    assert out.axis_names == ("embed", "batch")
    np.testing.assert_array_equal(out.array, jnp.array([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]))
    like = na.full_like(na.zeros({"batch": 2, "embed": 3}), bias)
    np.testing.assert_array_equal(like.array, jnp.broadcast_to(bias.array, (2, 3)))


def test_full_refuses_an_int_fill_the_integer_dtype_cannot_hold():
    """jnp.full wraps 300 into int8 (44); NumPy refuses, and so does full()."""
    with pytest.raises(OverflowError, match=r"full\(\): fill_value 300 does not fit int8"):
        na.full({"batch": 2}, 300, dtype=jnp.int8)
    with pytest.raises(OverflowError, match=r"full_like\(\): fill_value -1 does not fit uint8"):
        na.full_like(na.zeros({"batch": 2}, jnp.uint8), -1)
    np.testing.assert_array_equal(na.full({"batch": 2}, -128, dtype=jnp.int8).array, [-128, -128])


def test_full_refuses_a_numpy_int_fill_the_integer_dtype_cannot_hold():
    """The guard looked at Python ints only: ``np.int64(300)`` into int8 gave 44."""
    with pytest.raises(
        OverflowError,
        match=r"^full\(\): fill_value 300 does not fit int8 \(-128\.\.127\)\. Pass a value in that "
        r"range or a wider dtype\.$",
    ):
        na.full({"batch": 2}, np.int64(300), dtype=jnp.int8)
    with pytest.raises(OverflowError, match=r"full_like\(\): fill_value 300 does not fit int8"):
        na.full_like(na.zeros({"batch": 2}, jnp.int8), np.int16(300))
    np.testing.assert_array_equal(
        na.full({"b": 2}, np.int64(-128), dtype=jnp.int8).array, [-128] * 2
    )


def test_arange_of_bools_holds_false_and_true_only():
    """``dtype=bool`` cast 0, 1, 2 to ``[False True True]``; jnp refuses, NumPy allows two."""
    with pytest.raises(
        na.NamedTypeError,
        match=r"^arange\(\): the values run from 0 to 2, which bool cannot hold \(0\.\.1\)\. Pass a "
        r"dtype that can, e\.g\. dtype=jnp\.int32\.$",
    ):
        na.arange({"p": 3}, dtype=bool)
    np.testing.assert_array_equal(na.arange({"p": 2}, dtype=bool).array, np.arange(2, dtype=bool))
    np.testing.assert_array_equal(na.arange({"p": 2}, 1, -1, dtype=bool).array, [True, False])


def test_like_functions_copy_axes_and_dtype():
    x = na.named(jnp.arange(6, dtype=jnp.int32).reshape(3, 2), ("embed", "batch"))
    for got, want in [
        (na.zeros_like(x), jnp.zeros_like(x.array)),
        (na.ones_like(x), jnp.ones_like(x.array)),
        (na.full_like(x, 9), jnp.full_like(x.array, 9)),
        (na.ones_like(x, dtype=jnp.float16), jnp.ones_like(x.array, jnp.float16)),
        (na.full_like(x, 0.5, dtype=jnp.float32), jnp.full_like(x.array, 0.5, jnp.float32)),
    ]:
        assert got.axes == x.axes
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got.array, want)


@pytest.mark.parametrize(
    "kwargs,expected",
    [
        ({}, np.arange(5)),
        ({"start": 3}, np.arange(3, 8)),
        ({"start": 10, "step": -2}, np.arange(10, 0, -2)),
        ({"start": 0.5, "step": 0.1}, 0.5 + 0.1 * np.arange(5)),
        ({"dtype": jnp.float32}, np.arange(5, dtype=np.float32)),
    ],
)
def test_arange_is_start_plus_step_times_position(kwargs, expected):
    out = na.arange({"position": 5}, **kwargs)
    assert out.axes == (Axis("position", 5),)
    np.testing.assert_allclose(out.array, expected, rtol=1e-6)
    if "dtype" in kwargs:
        assert out.dtype == kwargs["dtype"]
    elif isinstance(kwargs.get("step", 1), int) and isinstance(kwargs.get("start", 0), int):
        assert jnp.issubdtype(out.dtype, jnp.integer)


def test_linspace_matches_jnp():
    for endpoint in (True, False):
        out = na.linspace(Axis("t", 7), -1.0, 2.0, endpoint=endpoint)
        np.testing.assert_allclose(out.array, jnp.linspace(-1.0, 2.0, 7, endpoint=endpoint))
        assert out.axis_names == ("t",)
    assert na.linspace({"t": 3}, 0, 1, dtype=jnp.bfloat16).dtype == jnp.bfloat16


def test_arange_and_linspace_take_one_number_per_parameter():
    row = na.named(jnp.array([1, 2]), "b")
    hint = (
        r"To vary start along other axes, broadcast by name: na\.arange\(axis\) \* step \+ start\."
    )
    with pytest.raises(
        na.NamedTypeError,
        match=r"arange\(\) makes one 1-axis array, so start must be one number; got "
        r"NamedArray\(b=2\)\. " + hint,
    ):
        na.arange({"p": 3}, row)
    with pytest.raises(
        na.NamedTypeError,
        match=r"arange\(\) makes one 1-axis array, so start must be one number; got a plain "
        r"array of shape \(2,\)\. " + hint,
    ):
        na.arange({"p": 3}, jnp.array([1, 2]))
    for bad in ("a", None):
        with pytest.raises(
            na.NamedTypeError,
            match=rf"arange\(\) needs a number for step, got {bad!r} \({type(bad).__name__}\)\. "
            r"Pass an int or a float, e.g\. step=0\.",
        ):
            na.arange({"p": 3}, 0, bad)
    with pytest.raises(
        na.NamedTypeError,
        match=r"linspace\(\) makes one 1-axis array, so start must be one number; got a plain "
        r"array of shape \(2,\)\. To vary start along other axes, broadcast by name: "
        r"start \+ \(stop - start\) \* na\.linspace\(axis, 0\.0, 1\.0\)\.",
    ):
        na.linspace({"t": 3}, jnp.array([0.0, 1.0]), 2.0)
    with pytest.raises(na.NamedTypeError, match=r"linspace\(\) needs a number for stop, got 'x'"):
        na.linspace({"t": 3}, 0.0, "x")
    # One number in any form: 0-d arrays and NamedArrays with no axes.
    one = na.named(jnp.int32(5), ())
    np.testing.assert_array_equal(na.arange({"p": 3}, one, np.int32(2)).array, [5, 7, 9])
    half = na.named(jnp.float32(5.0), ())
    np.testing.assert_allclose(na.linspace({"t": 3}, half, np.float32(6.0)).array, [5.0, 5.5, 6.0])
    # The suggested rewrite gives a start per entry of b.
    out = na.arange({"p": 3}) * 1 + row
    np.testing.assert_array_equal(out.rearrange(("b", "p")).array, [[1, 2, 3], [2, 3, 4]])


def test_arange_computes_in_at_least_int32_and_refuses_values_its_dtype_cannot_hold():
    # An np.int8 step used to make the positions themselves int8, wrapping them past 127.
    out = na.arange({"p": 300}, 0, np.int8(1), dtype=jnp.int32)
    np.testing.assert_array_equal(out.array, np.arange(300))
    assert na.arange({"p": 100}, 0, np.int8(1)).dtype == jnp.int8  # the dtype still follows step
    with pytest.raises(
        na.NamedTypeError,
        match=r"arange\(\): the values run from 0 to 299, which int8 cannot hold \(-128\.\.127\)\. "
        r"Pass a dtype that can, e.g\. dtype=jnp\.int32\.",
    ):
        na.arange({"p": 300}, 0, np.int8(1))
    with pytest.raises(na.NamedTypeError, match=r"from 0 to 299, which uint8 cannot hold"):
        na.arange({"p": 300}, dtype=jnp.uint8)
    with pytest.raises(
        na.NamedTypeError,
        match=r"the values run from 2147483648 to 2147483649, which int32 cannot hold .* "
        r"e\.g\. dtype=jnp\.float32\.",
    ):
        na.arange({"p": 2}, 2**31)  # used to be JAX's OverflowError
    np.testing.assert_array_equal(
        na.arange({"p": 2}, 2**31, dtype=jnp.float32).array,
        np.array([2**31, 2**31 + 1], np.float32),
    )
    # bfloat16 positions are computed in float32, then rounded once.
    got = na.arange({"p": 5}, 0.0, 0.1, dtype=jnp.bfloat16).array
    np.testing.assert_array_equal(
        got, (np.arange(5, dtype=np.float32) * np.float32(0.1)).astype(jnp.bfloat16)
    )


def test_creation_under_jit():
    @jax.jit
    def f(scale):
        return na.arange({"position": 4}, dtype=jnp.float32) * scale + na.ones({"batch": 2})

    out = f(2.0)
    assert out.axis_names == ("position", "batch")
    np.testing.assert_allclose(out.array, np.arange(4)[:, None] * 2.0 + np.ones((1, 2)))


def test_bad_axes_spec():
    with pytest.raises(
        na.NamedTypeError, match=r"axes must be Axis objects or a \{name: size\} dict, got 'batch'"
    ):
        na.zeros(("batch", "embed"))
    with pytest.raises(
        na.NamedTypeError, match=r"axes must be a sequence of Axis or a \{name: size\} dict, got 5"
    ):
        na.ones(5)
    with pytest.raises(na.AxisError, match=r"Axis 'batch' size must be >= 0, got -1"):
        na.zeros({"batch": -1})
    with pytest.raises(na.AxisError, match=r"Axis 'batch' size must be an int, got 2.5"):
        na.full({"batch": 2.5}, 0.0)
    with pytest.raises(na.DuplicateAxisError, match=r"Duplicate axis names 'batch'"):
        na.zeros([Axis("batch", 2), Axis("batch", 3)])


def test_bad_dtype():
    with pytest.raises(
        na.NamedTypeError,
        match=r"zeros\(\): 'flot32' is not a dtype\. Pass a dtype such as jnp\.float32",
    ):
        na.zeros({"batch": 2}, dtype="flot32")
    with pytest.raises(na.NamedTypeError, match=r"full_like\(\): 3 is not a dtype"):
        na.full_like(na.zeros({"batch": 2}), 1.0, dtype=3)
    with pytest.raises(na.NamedTypeError, match=r"arange\(\): 'nope' is not a dtype"):
        na.arange({"p": 2}, dtype="nope")
    # NumPy dtypes JAX arrays cannot hold used to reach JAX's own TypeError.
    for bad, shown in ((str, "<U0"), (object, "object"), ("datetime64[s]", "datetime64\\[s\\]")):
        with pytest.raises(
            na.NamedTypeError,
            match=rf"zeros\(\): .* \({shown}\) is not a numeric or bool dtype, which JAX arrays "
            r"hold\. Pass a dtype such as jnp\.float32",
        ):
            na.zeros({"batch": 2}, dtype=bad)


def test_bad_single_axis_for_arange_and_linspace():
    with pytest.raises(
        na.AxisError,
        match=r"arange\(\) makes a 1-axis array, so its axis must be one Axis or a one-entry \{name: size\} dict; got 2 entries \(a=2, b=3\)",
    ):
        na.arange({"a": 2, "b": 3})
    with pytest.raises(
        na.NamedTypeError,
        match=r"linspace\(\) needs an Axis or a one-entry \{name: size\} dict, got 'position' \(str\)\. Give the size too",
    ):
        na.linspace("position", 0.0, 1.0)


def test_bad_fill_values():
    for fill in (
        lambda: na.full({"embed": 3}, None),
        lambda: na.full_like(na.zeros({"a": 2}), None),
    ):
        with pytest.raises(
            na.NamedTypeError,
            match=r"full(_like)?\(\) needs a fill_value, got None\. Pass a number",
        ):
            fill()  # used to be JAX's "full requires ndarray or scalar arguments"
    with pytest.raises(
        na.NamedTypeError, match=r"full\(\) got a plain array of shape \(3,\) for fill_value"
    ):
        na.full({"embed": 3}, jnp.ones(3))
    bias = na.named(jnp.ones(4), "mlp")
    with pytest.raises(
        na.AxisError,
        match=r"full\(\): fill_value NamedArray\(mlp=4\) has axes 'mlp' that NamedArray\(embed=3\) lacks; it may only use 'embed'",
    ):
        na.full({"embed": 3}, bias)
    with pytest.raises(
        na.AxisSizeError,
        match=r"full\(\): fill_value axis 'embed' has size 4, but the result's 'embed' has size 3",
    ):
        na.full({"embed": 3}, na.named(jnp.ones(4), "embed"))
    with pytest.raises(
        na.NamedTypeError,
        match=r"zeros_like\(\) needs a NamedArray to copy axes from, got ArrayImpl\. For a plain array use zeros\(axes\)",
    ):
        na.zeros_like(jnp.ones(3))


def test_like_functions_keep_the_sharding(mesh_2x4):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    with jax.set_mesh(mesh_2x4):
        x = na.named(
            jax.device_put(jnp.ones((4, 8)), NamedSharding(mesh_2x4, P("data", "model"))),
            ("batch", "embed"),
        )
        bias = na.named(jnp.arange(8.0), "embed")
        outs = [
            na.zeros_like(x),
            na.ones_like(x, jnp.int32),
            na.full_like(x, 2.0),
            na.full_like(x, bias),
        ]
    for out in outs:
        assert tuple(out.sharding.spec) == ("data", "model")
        assert {s.data.shape for s in out.array.addressable_shards} == {(2, 2)}
    np.testing.assert_array_equal(outs[3].array, jnp.broadcast_to(jnp.arange(8.0), (4, 8)))
