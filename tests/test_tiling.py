"""repeat, tile, roll, pad, ravel, tril/triu, diagonal, trace by name: oracles, errors, sharding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import spec_of
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import namedaxes as na
from namedaxes import Axis

A = jnp.arange(4 * 8 * 6, dtype=jnp.float32).reshape(4, 8, 6)  # (batch, q, k)
AXES = ("batch", "q", "k")


@pytest.fixture(scope="module")
def results():
    @jax.jit
    def run(a, shift):
        x = na.named(a, AXES)
        xt = na.named(jnp.transpose(a, (2, 0, 1)), ("k", "batch", "q"))  # same data, other layout
        reps = na.named(jnp.array([1, 0, 2, 1, 1, 1, 1, 1]), "q")
        back = lambda y: na.rearrange(y, AXES).array  # noqa: E731 - compare in a's layout
        return {
            "repeat": (na.repeat(x, "k", 2).array, jnp.repeat(a, 2, axis=2)),
            "repeat_each": (
                na.repeat(x, "q", reps, total_repeat_length=9).array,
                jnp.repeat(a, jnp.array([1, 0, 2, 1, 1, 1, 1, 1]), axis=1, total_repeat_length=9),
            ),
            "tile": (back(na.tile(xt, {"q": 2, "batch": 1})), jnp.tile(a, (1, 2, 1))),
            "roll": (na.roll(x, shift, "q").array, jnp.roll(a, shift, axis=1)),
            "roll_many": (back(na.roll(xt, {"q": 1, "k": -2})), jnp.roll(a, (1, -2), axis=(1, 2))),
            "pad": (back(na.pad(xt, {"q": (1, 2), "k": 1})), jnp.pad(a, ((0, 0), (1, 2), (1, 1)))),
            "pad_edge": (
                na.pad(x, {"k": 2}, mode="edge").array,
                jnp.pad(a, ((0, 0), (0, 0), (2, 2)), mode="edge"),
            ),
            "ravel": (na.ravel(x, "flat").array, jnp.ravel(a)),
            "ravel_order": (na.ravel(xt, "flat", order=AXES).array, jnp.ravel(a)),
            "tril": (na.tril(x, ("q", "k")).array, jnp.tril(a)),
            "tril_t": (back(na.tril(xt, ("q", "k"), k=1)), jnp.tril(a, 1)),
            "triu": (na.triu(x, ("q", "k"), k=-1).array, jnp.triu(a, -1)),
            "diagonal": (na.diagonal(x, ("q", "k")).array, jnp.diagonal(a, axis1=1, axis2=2)),
            "diagonal_off": (
                na.rearrange(na.diagonal(xt, ("q", "k"), offset=2), ("batch", "q")).array,
                jnp.diagonal(a, 2, axis1=1, axis2=2),
            ),
            "diagonal_neg": (
                na.diagonal(x, ("q", "k"), offset=-3).array,
                jnp.diagonal(a, -3, axis1=1, axis2=2),
            ),
            "trace": (na.trace(xt, ("q", "k")).array, jnp.trace(a, axis1=1, axis2=2)),
            "trace_off": (
                na.trace(x, ("k", "q"), offset=1).array,
                jnp.trace(a, 1, axis1=2, axis2=1),
            ),
        }

    return run(A, 3)


CASES = ["repeat", "repeat_each", "tile", "roll", "roll_many", "pad", "pad_edge", "ravel", "ravel_order",
         "tril", "tril_t", "triu", "diagonal", "diagonal_off", "diagonal_neg", "trace", "trace_off"]  # fmt: skip


@pytest.mark.parametrize("name", CASES)
def test_matches_jnp(results, name):
    got, expected = results[name]
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


def test_result_axes():
    x = na.named(A, AXES)
    assert na.repeat(x, "k", 3).axes == (Axis("batch", 4), Axis("q", 8), Axis("k", 18))
    assert na.tile(x, {"batch": 2}).shape == {"batch": 8, "q": 8, "k": 6}
    assert na.pad(x, {"q": (1, 0)}).shape == {"batch": 4, "q": 9, "k": 6}
    assert na.ravel(x, Axis("flat", 192)).axes == (Axis("flat", 192),)
    assert na.ravel(na.named(jnp.float32(2.0), ()), "one").axes == (Axis("one", 1),)
    assert na.diagonal(x, ("q", "k")).axes == (Axis("batch", 4), Axis("q", 6))
    assert na.diagonal(x, ("k", "q"), new_axis="d", offset=1).axes == (
        Axis("batch", 4),
        Axis("d", 6),
    )
    assert na.trace(x, ("q", "k")).axes == (Axis("batch", 4),)
    assert na.tril(x, ("q", "k")).axes == x.axes


def test_errors():
    x = na.named(A, AXES)
    with pytest.raises(na.AxisSizeError, match=r"repeat\(\): repeats must be >= 0, got -1"):
        na.repeat(x, "k", -1)
    with pytest.raises(na.AxisError, match=r"per-entry repeats need total_repeat_length="):
        na.repeat(x, "q", na.named(jnp.ones(8, jnp.int32), "q"))
    with pytest.raises(
        na.AxisError, match=r"per-entry repeats must be a NamedArray over \(q=8\) alone"
    ):
        na.repeat(x, "q", na.named(jnp.ones(6, jnp.int32), "k"), total_repeat_length=8)
    with pytest.raises(
        na.NamedTypeError, match=r"tile\(\) takes reps as a \{axis: value\} dict, got \(1, 2\)"
    ):
        na.tile(x, (1, 2))
    with pytest.raises(
        na.AxisNotFoundError, match=r"Axis 'kk' not found in NamedArray\(batch=4, q=8, k=6\)"
    ):
        na.tile(x, {"kk": 2})
    with pytest.raises(na.AxisError, match=r"roll\(\) needs the axis to roll along"):
        na.roll(x, 1)
    with pytest.raises(na.AxisError, match=r"roll\(\): 2 shift\(s\) for 1 axis\(es\)"):
        na.roll(x, (1, 2), "q")
    with pytest.raises(
        na.NamedTypeError,
        match=r"roll\(\): axes are chosen by name, not by position; got axis=1\. In "
        r"NamedArray\(batch=4, q=8, k=6\), position 1 is 'q': pass axis='q'",
    ):
        na.roll(x, 1, 1)
    with pytest.raises(
        na.NamedTypeError,
        match=r"roll\(\): shift for axis 'q' must be one integer, got NamedArray\(batch=4\)\. For "
        r"one value per batch entry use na\.vmap\(lambda r, s: na\.roll\(r, s, 'q'\), 'batch'\)",
    ):
        na.roll(x, na.named(jnp.ones(4, jnp.int32), "batch"), "q")
    with pytest.raises(
        na.NamedTypeError,
        match=r"roll\(\): shift for axis 'q' must be an int or a 0-d integer array, got 1\.5 \(float\)",
    ):
        na.roll(x, {"q": 1.5})
    with pytest.raises(
        na.AxisSizeError,
        match=r"pad\(\): the width for axis 'q' must be an int >= 0 or a \(before, after\) pair of them, got -1",
    ):
        na.pad(x, {"q": -1})
    with pytest.raises(na.AxisError, match=r"ravel\(\): order \('q', 'k'\) must list every axis"):
        na.ravel(x, "flat", order=("q", "k"))
    with pytest.raises(
        na.AxisError, match=r"tril\(\) works over two named axes \(rows, columns\), got 'q'"
    ):
        na.tril(x, "q")
    with pytest.raises(
        na.DuplicateAxisError, match=r"triu\(\) needs two different axes, got 'q' twice"
    ):
        na.triu(x, ("q", "q"))
    with pytest.raises(
        na.DuplicateAxisError, match=r"diagonal\(\): new axis 'batch' is already an axis"
    ):
        na.diagonal(x, ("q", "k"), new_axis="batch")
    with pytest.raises(
        na.NamedTypeError,
        match=r"trace\(\): offset= \(the diagonal offset\) must be a static int, got 1.5",
    ):
        na.trace(x, ("q", "k"), offset=1.5)


def test_roll_takes_a_0d_named_shift():
    x = na.named(A, AXES)
    shift = na.argmax(na.named(jnp.array([0.0, 3.0, 1.0]), "c"))  # a 0-d NamedArray: 1
    np.testing.assert_array_equal(na.roll(x, shift, "q").array, jnp.roll(A, 1, axis=1))
    out = jax.jit(lambda x, s: na.roll(x, {"k": s}))(x, shift)
    np.testing.assert_array_equal(out.array, jnp.roll(A, 1, axis=2))


def test_sharded(mesh_2x4):
    a = jax.device_put(A, NamedSharding(mesh_2x4, P("data", "model")))
    explicit = mesh_2x4.axis_types[0] == AxisType.Explicit
    with jax.set_mesh(mesh_2x4):

        @jax.jit
        def run(a):
            x = na.named(a, AXES)
            return [na.tril(x, ("q", "k")), na.repeat(x, "q", 2), na.roll(x, 1, "q"), na.pad(x, {"q": 1}),
                    na.ravel(x, "flat"), na.trace(x, ("q", "k")), na.tile(x, {"q": 2}),
                    na.triu(x, ("q", "k"), k=1), na.diagonal(x, ("q", "k"), offset=1)]  # fmt: skip

        tril, rep, rol, pad, rav, tr, til, triu, diag = run(a)
    assert spec_of(triu) == P("data", "model") and spec_of(diag)[0] == "data"
    np.testing.assert_array_equal(triu.array, jnp.triu(A, 1))
    np.testing.assert_array_equal(diag.array, jnp.diagonal(A, 1, axis1=1, axis2=2))
    # Untouched axes keep their mesh axes; tril keeps everything (a mask, no data movement).
    assert spec_of(tril) == P("data", "model")
    for y in (rep, rol, pad, til, rav):
        assert spec_of(y)[0] == "data"
    if explicit:  # the touched axis is gathered first
        assert spec_of(rep) == spec_of(pad) == spec_of(til) == P("data")
    np.testing.assert_array_equal(tril.array, jnp.tril(A))
    np.testing.assert_array_equal(rol.array, jnp.roll(A, 1, axis=1))
    np.testing.assert_array_equal(rep.array, jnp.repeat(A, 2, axis=1))
    np.testing.assert_array_equal(rav.array, jnp.ravel(A))
    np.testing.assert_array_equal(tr.array, jnp.trace(A, axis1=1, axis2=2))


PAD_MODES = ["edge", "mean", "maximum", "minimum", "median", "linear_ramp", "empty", "reflect"]


def test_pad_every_mode_keeps_unpadded_axes_sharded(mesh_2x4):
    """Modes that slice or reduce the padded axis used to crash on Explicit meshes when another
    axis was sharded; now each keeps that axis' sharding."""
    a = jax.device_put(A, NamedSharding(mesh_2x4, P("data", "model")))
    explicit = mesh_2x4.axis_types[0] == AxisType.Explicit
    with jax.set_mesh(mesh_2x4):
        outs = jax.jit(
            lambda a: [na.pad(na.named(a, AXES), {"k": (2, 1)}, mode=m) for m in PAD_MODES]
        )(a)
    for mode, out in zip(PAD_MODES, outs):
        assert out.shape == {"batch": 4, "q": 8, "k": 9}
        if explicit:
            assert spec_of(out) == P("data", "model"), mode
        if mode != "empty":
            want = jnp.pad(A, ((0, 0), (0, 0), (2, 1)), mode=mode)
            np.testing.assert_allclose(out.array, want, rtol=1e-6, err_msg=mode)


def test_pad_values_by_axis_name_not_position():
    """Per-side values go by axis name, and axes are padded in pad_width's order (the last fills
    the corners), so a transposed layout gives the same result."""
    x = na.named(jnp.arange(6.0).reshape(2, 3), ("a", "b"))
    xt = na.named(x.array.T, ("b", "a"))
    ab = lambda y: na.rearrange(y, ("a", "b")).array  # noqa: E731
    want = jnp.pad(x.array, ((1, 1), (2, 2)), constant_values=((7, 8), (9, 10)))  # a, then b
    for y in (x, xt):
        out = na.pad(y, {"a": 1, "b": 2}, constant_values={"a": (7, 8), "b": (9, 10)})
        np.testing.assert_array_equal(ab(out), want)
        # A pair applies to every padded axis; stat_length by name.
        out = na.pad(y, {"a": 1, "b": 1}, constant_values=(7, 8))
        np.testing.assert_array_equal(ab(out), jnp.pad(x.array, 1, constant_values=(7, 8)))
        out = na.pad(y, {"a": 1, "b": 1}, mode="maximum", stat_length={"a": 1, "b": (3, 3)})
        np.testing.assert_array_equal(
            ab(out), jnp.pad(x.array, 1, mode="maximum", stat_length=((1, 1), (3, 3)))
        )
    with pytest.raises(
        na.NamedTypeError,
        match=r"pad\(\): constant_values= for axis 'a' must be a scalar or a \(before, after\) "
        r"pair, got \(\(7, 8\), \(9, 10\)\)\. Give constant_values= as a scalar",
    ):
        na.pad(x, {"a": 1}, constant_values=((7, 8), (9, 10)))
    with pytest.raises(na.AxisError, match=r"pad\(\): end_values= names axes \['b'\] that"):
        na.pad(x, {"a": 1}, mode="linear_ramp", end_values={"b": 1})
    with pytest.raises(
        na.AxisError, match=r"pad\(\): unknown mode 'bogus'; use one of 'constant', 'edge'"
    ):
        na.pad(x, {"a": 1}, mode="bogus")


def test_repeat_per_entry_counts_must_be_nonnegative_integers():
    x = na.named(jnp.arange(3), "s")
    counts = lambda *c: na.named(jnp.array(c), "s")  # noqa: E731
    with pytest.raises(
        na.NamedTypeError,
        match=r"repeat\(\): per-entry repeats must be integers, got dtype float32",
    ):
        na.repeat(x, "s", counts(1.5, 1.0, 1.0), total_repeat_length=4)
    with pytest.raises(na.AxisSizeError, match=r"repeat\(\): per-entry repeats must be >= 0"):
        na.repeat(x, "s", counts(-1, 2, 2), total_repeat_length=4)
    # Under jit the counts are not known: a negative count repeats 0 times.
    out = jax.jit(lambda r: na.repeat(x, "s", r, total_repeat_length=4))(counts(-1, 2, 2))
    np.testing.assert_array_equal(out.array, [1, 1, 2, 2])


def test_diagonal_axis_goes_where_the_first_of_its_two_axes_was():
    """The docs said "at the rows axis' position"; it is the first of the two axes in ``x``."""
    a = jnp.arange(3 * 2 * 3).reshape(3, 2, 3)
    x = na.named(a, ("k", "b", "q"))
    rows_last = na.diagonal(x, ("q", "k"))  # rows 'q' come after 'k' in x
    assert rows_last.axes == (Axis("q", 3), Axis("b", 2))
    np.testing.assert_array_equal(rows_last.array, jnp.diagonal(a, axis1=2, axis2=0).T)
    assert na.diagonal(x, ("k", "q"), new_axis="d").axis_names == ("d", "b")


def test_ravel_checks_the_sizes_of_axes_in_order():
    """``order=(Axis("a", 99), "b")`` was accepted for ``a=2``: the size was dropped."""
    x = na.named(jnp.zeros((2, 3)), ("a", "b"))
    with pytest.raises(
        na.AxisSizeError,
        match=r"^Axis 'a' has size 2 in NamedArray\(a=2, b=3\), but size 99 was asked for",
    ):
        na.ravel(x, "f", order=(Axis("a", 99), "b"))
    assert na.ravel(x, "f", order=(Axis("b", 3), Axis("a", 2))).axes == (Axis("f", 6),)


@pytest.mark.parametrize("total", [0, 4, 6, 8])
def test_repeat_total_length_cuts_or_pads_as_jnp_does(total):
    """An int ``repeats`` ignored ``total_repeat_length=``: ``[1 1 2 2 3 3]`` where jnp gives
    ``[1 1 2 2]``."""
    a = jnp.array([[1, 2, 3], [4, 5, 6]])
    x = na.named(a, ("b", "s"))
    each = na.named(jnp.array([1, 2, 1]), "s")
    for reps, plain in ((2, 2), (each, each.array)):
        out = na.repeat(x, "s", reps, total_repeat_length=total)
        assert out.shape == {"b": 2, "s": total}
        np.testing.assert_array_equal(
            out.array, jnp.repeat(a, plain, axis=1, total_repeat_length=total)
        )
    for bad in (-1, 2.0):
        with pytest.raises(
            na.AxisSizeError,
            match=rf"^repeat\(\): total_repeat_length must be a static int >= 0 \(the new size of "
            rf"'s'\), got {bad}\.$",
        ):
            na.repeat(x, "s", 2, total_repeat_length=bad)
