"""einops-style rearrange patterns by name: reshape/transpose oracles, layout independence, errors,
Auto/Explicit sharding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import spec_of
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import namedaxes as na
from namedaxes import Axis

A = jnp.arange(2 * 12 * 3, dtype=jnp.float32).reshape(2, 12, 3)  # (b, e, s)


@pytest.fixture(scope="module")
def results():
    @jax.jit
    def run(a):
        x = na.named(a, ("b", "e", "s"))
        xt = na.named(jnp.transpose(a, (2, 0, 1)), ("s", "b", "e"))  # other layout: same answers
        split = a.reshape(2, 4, 3, 3)  # e -> (h=4, d=3)
        return {
            "split": (
                na.rearrange(x, "b (h d) s -> b h s d", h=4).array,
                split.transpose(0, 1, 3, 2),
            ),
            "split_t": (
                na.rearrange(xt, "b (h d) s -> b h s d", h=4).array,
                split.transpose(0, 1, 3, 2),
            ),
            "split_labelled": (
                na.rearrange(x, "s b (e: h d) -> d b h s", d=3).array,
                split.transpose(2, 0, 1, 3),
            ),
            "merge": (
                na.rearrange(x, "b e s -> (bs: b s) e").array,
                a.transpose(0, 2, 1).reshape(6, 12),
            ),
            "roundtrip": (
                na.rearrange(
                    na.rearrange(x, "b (e: h d) s -> s h b d", h=2), "s h b d -> b (e: h d) s"
                ).array,
                a,
            ),
            "ellipsis": (na.rearrange(xt, "s ... -> ... s").array, a),
            "ellipsis_group": (na.rearrange(x, "... s -> (rest: ...) s").array, a.reshape(24, 3)),
            "pull_from_ellipsis": (na.rearrange(x, "... -> s ...").array, a.transpose(2, 0, 1)),
            "relabel_same_parts": (
                na.rearrange(x, "b (e: h d) s -> b s (h d)", h=6).array,
                a.transpose(0, 2, 1),
            ),
        }

    return run(A)


@pytest.mark.parametrize("name", ["split", "split_t", "split_labelled", "merge", "roundtrip", "ellipsis",
                                  "ellipsis_group", "pull_from_ellipsis", "relabel_same_parts"])  # fmt: skip
def test_matches_reshape_transpose(results, name):
    got, expected = results[name]
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


def test_result_axes():
    def check(a):
        x = na.named(a, ("b", "e", "s"))
        assert na.rearrange(x, "b (h d) s -> b h s d", h=4).axes == (
            Axis("b", 2), Axis("h", 4), Axis("s", 3), Axis("d", 3))  # fmt: skip
        assert na.rearrange(x, "b (e: h d) s -> b s (e: h d)", d=2).axis_names == ("b", "s", "e")
        assert na.rearrange(x, "b (e: h d) s -> b s (h d)", d=2).axis_names == ("b", "s", "e")
        assert na.rearrange(x, ("s", ...)).axis_names == (
            "s",
            "b",
            "e",
        )  # the tuple form still works
        return a

    jax.eval_shape(check, A)


BAD = [
    (
        "b (h d) s -> b h s",
        {"h": 4},
        na.AxisError,
        r"rearrange\('b \(h d\) s -> b h s'\): the right side drops 'd'",
    ),
    (
        "b (h d) s -> b h s d",
        {},
        na.AxisSizeError,
        r"give the sizes of all but one of 'h', 'd' \(splitting 'e' of size 12\)",
    ),
    (
        "b (h d) s -> b h s d",
        {"h": 5},
        na.AxisSizeError,
        r"axis 'e' of size 12 cannot be split into h=5 and 'd': 5 does not divide 12",
    ),
    (
        "b (h d) s -> b h s d",
        {"h": 4, "d": 4},
        na.AxisSizeError,
        r"parts \(h=4, d=4\) multiply to 16, but axis 'e' has size 12",
    ),
    (
        "b (h d) -> b h d",
        {"h": 2},
        na.AxisError,
        r"cannot tell which axis of NamedArray\(b=2, e=12, s=3\) the group '\(h d\)' splits \(candidates: 'e', 's'\)\. Label it",
    ),
    (
        "b e s -> b (e s)",
        {},
        na.AxisError,
        r"name the merged axis '\(e s\)' with a label, e\.g\. '\(e_s: e s\)'",
    ),
    ("b e s -> b e s q", {}, na.AxisNotFoundError, r"right-side axis 'q' is not on the left side"),
    (
        "b e s x -> b e s",
        {},
        na.AxisNotFoundError,
        r"axis 'x' not found in NamedArray\(b=2, e=12, s=3\)\. Available axes: 'b', 'e', 's'",
    ),
    (
        "b e -> b e",
        {},
        na.AxisError,
        r"axes 's' of NamedArray\(b=2, e=12, s=3\) are not on the left side\. Name them, or add '\.\.\.'",
    ),
    ("b (e 1) s -> b e s", {}, na.AxisError, r"'1' is not an axis name"),
    (
        "b e s -> b e s",
        {"q": 2},
        na.AxisError,
        r"sizes were given for 'q', which no left-side group splits",
    ),
    ("b e s -> b e s s", {}, na.DuplicateAxisError, r"axis 's' appears twice on the right side"),
    ("b b e s -> b e s", {}, na.DuplicateAxisError, r"axis 'b' appears twice on the left side"),
    ("b e (s -> b e s", {}, na.AxisError, r"unclosed '\(' on the left side"),
    (
        "b e s -> ... (m: ...)",
        {},
        na.AxisError,
        r"'\.\.\.' appears more than once on the right side",
    ),
    ("... b ... -> b", {}, na.AxisError, r"'\.\.\.' appears more than once on the left side"),
    ("b e s -> b -> e", {}, na.AxisError, r"a pattern needs exactly one '->'"),
    ("b () e s -> b e s", {}, na.AxisError, r"an empty group '\(\)' has no axes"),
    ("b (e: (h d)) s -> b h d s", {}, na.AxisError, r"nested parentheses on the left side"),
    ("b e s", {}, na.AxisError, r"rearrange\(\): 'b e s' looks like a pattern but has no '->'"),
    (
        "b e s -> b e s ...",
        {},
        na.AxisError,
        r"rearrange\('b e s -> b e s \.\.\.'\): '\.\.\.' is on the right side but not on the left; "
        r"add '\.\.\.' to the left side to cover the axes it stands for, or remove it from the right\.",
    ),
    (
        "b e s -> b (m: e s ...)",
        {},
        na.AxisError,
        r"'\.\.\.' is on the right side but not on the left",
    ),
    # Sizes are ints (NumPy's too), checked once, whichever axis they are for.
    (
        "b (h d) s -> b h s d",
        {"h": "4"},
        na.NamedTypeError,
        r"rearrange\('b \(h d\) s -> b h s d'\): size h='4' \(str\) is not an int\. Pass an int "
        r"size, e\.g\. h=2\.",
    ),
    ("b (h d) s -> b h s d", {"h": "4", "d": 3}, na.NamedTypeError, r"size h='4' \(str\)"),
    ("b (h d) s -> b h s d", {"h": 4, "b": 2.0}, na.NamedTypeError, r"size b=2\.0 \(float\)"),
    ("b (h d) s -> b h s d", {"h": True}, na.NamedTypeError, r"size h=True \(bool\) is not an int"),
    (
        "b (h d) s -> b h s d",
        {"h": -4},
        na.AxisSizeError,
        r"size h=-4 is negative\. Pass a size of at least 0, or leave one part of a group out",
    ),
]


@pytest.mark.parametrize("pat,sizes,err,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_patterns(pat, sizes, err, msg):
    x = na.named(A, ("b", "e", "s"))
    with pytest.raises(err, match=msg):
        na.rearrange(x, pat, **sizes)


def test_numpy_int_sizes_are_sizes():
    x = na.named(A, ("b", "e", "s"))
    out = na.rearrange(x, "b (h d) s -> b h s d", h=np.int64(4), b=np.int32(2))
    assert out.shape == {"b": 2, "h": 4, "s": 3, "d": 3}
    np.testing.assert_array_equal(out.array, A.reshape(2, 4, 3, 3).transpose(0, 1, 3, 2))


def test_sizes_without_pattern_are_refused():
    with pytest.raises(na.AxisError, match=r"sizes \(h\) only go with a pattern"):
        na.rearrange(na.named(A, ("b", "e", "s")), ("s", ...), h=2)


def test_sharded(mesh_2x4):
    a = jax.device_put(A, NamedSharding(mesh_2x4, P("data", "model")))  # b on data, e on model
    with jax.set_mesh(mesh_2x4):

        @jax.jit
        def run(a):
            x = na.named(a, ("b", "e", "s"))
            return na.rearrange(x, "b (h d) s -> b h s d", h=4), na.rearrange(x, "b e s -> s b e")

        split, moved = run(a)
    # The batch axis keeps its mesh axis; the split axis' outer part keeps 'model' (4 divides h=4).
    assert tuple(spec_of(split))[:2] == ("data", "model")
    assert spec_of(moved) == P(None, "data", "model")
    np.testing.assert_array_equal(split.array, A.reshape(2, 4, 3, 3).transpose(0, 1, 3, 2))
