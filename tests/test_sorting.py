"""sort, argsort, top_k and searchsorted by name: jax.numpy oracles, errors, Auto/Explicit sharding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import spec_of
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import namedaxes as na
from namedaxes import Axis

RNG = np.random.default_rng(0)
A = jnp.asarray(RNG.normal(size=(4, 8)).astype(np.float32))  # (batch, seq)


@pytest.fixture(scope="module")
def results():
    @jax.jit
    def run(a):
        x = na.named(a, ("batch", "seq"))
        xt = na.named(a.T, ("seq", "batch"))  # same data, other layout
        v, i = na.top_k(x, "seq", Axis("best", 3))
        edges = na.sort(x, "seq")
        queries = na.named(a[:, :2] * 0.5, ("batch", "q"))
        return {
            "sort": (na.sort(x, "seq").array, jnp.sort(a, axis=1)),
            "sort_desc": (
                na.sort(xt, "seq", descending=True).array,
                jnp.sort(a, axis=1, descending=True).T,
            ),
            "argsort": (na.argsort(x, "batch").array, jnp.argsort(a, axis=0)),
            "top_k_v": (v.array, jax.lax.top_k(a, 3)[0]),
            "top_k_i": (i.array, jax.lax.top_k(a, 3)[1]),
            "top_k_t": (na.top_k(xt, "seq", 3)[0].array, jax.lax.top_k(a, 3)[0].T),
            "searchsorted": (
                na.searchsorted(edges, queries, "seq").array,
                jax.vmap(jnp.searchsorted)(jnp.sort(a, axis=1), a[:, :2] * 0.5),
            ),
            "searchsorted_right": (
                na.searchsorted(
                    na.named(jnp.array([0.0, 1.0, 1.0]), "e"),
                    na.named(jnp.array([1.0, 2.0]), "q"),
                    side="right",
                ).array,
                jnp.searchsorted(jnp.array([0.0, 1.0, 1.0]), jnp.array([1.0, 2.0]), side="right"),
            ),
        }

    return run(A)


@pytest.mark.parametrize(
    "name",
    [
        "sort",
        "sort_desc",
        "argsort",
        "top_k_v",
        "top_k_i",
        "top_k_t",
        "searchsorted",
        "searchsorted_right",
    ],
)
def test_matches_jnp(results, name):
    got, expected = results[name]
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


def test_axes_of_results():
    x = na.named(A, ("batch", "seq"))
    assert na.sort(x, "seq").axes == x.axes
    v, i = na.top_k(x, "seq", 2)
    assert v.axes == i.axes == (Axis("batch", 4), Axis("seq", 2))
    assert na.top_k(x, "batch", Axis("best", 1))[0].axis_names == ("best", "seq")
    q = na.named(jnp.zeros((3, 4)), ("q", "batch"))
    assert na.searchsorted(x, q, "seq").axes == q.axes  # values' axes, values' order


def test_errors():
    x = na.named(A, ("batch", "seq"))
    with pytest.raises(
        na.AxisError,
        match=r"sort\(\) needs axis= for NamedArray\(batch=4, seq=8\); pass one of 'batch', 'seq'",
    ):
        na.sort(x)
    with pytest.raises(
        na.AxisNotFoundError, match=r"Axis 'sq' not found in NamedArray\(batch=4, seq=8\)"
    ):
        na.argsort(x, "sq")
    with pytest.raises(na.NamedTypeError, match=r"sort\(\) works along exactly one axis"):
        na.sort(x, ("batch", "seq"))
    with pytest.raises(na.AxisSizeError, match=r"top_k\(\): k=9 does not fit axis 'seq' of size 8"):
        na.top_k(x, "seq", 9)
    with pytest.raises(na.DuplicateAxisError, match="Duplicate axis names 'batch'"):
        na.top_k(x, "seq", Axis("batch", 2))
    with pytest.raises(
        na.AxisError,
        match=r"searchsorted\(\): values NamedArray\(q=2\) lacks the batch axes 'batch'",
    ):
        na.searchsorted(x, na.named(jnp.zeros(2), "q"), "seq")
    with pytest.raises(na.AxisError, match=r"values NamedArray\(seq=2\) has the sorted axis 'seq'"):
        na.searchsorted(na.named(jnp.zeros(3), "seq"), na.named(jnp.zeros(2), "seq"))
    with pytest.raises(na.AxisError, match=r"side must be 'left' or 'right', got 'up'"):
        na.searchsorted(na.named(jnp.zeros(3), "e"), 1.0, side="up")
    with pytest.raises(na.NamedTypeError, match=r"sort\(\) needs a NamedArray for `x`"):
        na.sort(A, "seq")


def test_sharded_sort_family(mesh_2x4):
    a = jax.device_put(A, NamedSharding(mesh_2x4, P("data", "model")))
    with jax.set_mesh(mesh_2x4):

        @jax.jit
        def run(a):
            x = na.named(a, ("batch", "seq"))
            queries = na.rename(x["seq", 0:3], {"seq": "q"})
            found = na.searchsorted(na.sort(x, "seq"), queries, "seq")
            return na.sort(x, "seq"), na.top_k(x, "seq", 2)[0], na.argsort(x, "batch"), found

        s, t, g, found = run(a)
    np.testing.assert_array_equal(
        found.array, jax.vmap(jnp.searchsorted)(jnp.sort(A, axis=1), A[:, :3])
    )
    # The other axis keeps its mesh axis; on Explicit meshes the sorted axis is gathered first.
    assert spec_of(s)[0] == "data" and spec_of(t) == P("data") and spec_of(g)[1] == "model"
    if mesh_2x4.axis_types[0] == AxisType.Explicit:
        assert spec_of(s) == P("data") and spec_of(g) == P(None, "model")
    np.testing.assert_array_equal(s.array, jnp.sort(A, axis=1))
    np.testing.assert_array_equal(t.array, jax.lax.top_k(A, 2)[0])
    np.testing.assert_array_equal(g.array, jnp.argsort(A, axis=0))


def test_top_k_takes_numpy_ints():
    x = na.named(A, ("batch", "seq"))
    v, i = na.top_k(x, "seq", np.int64(2))
    assert v.axes == (Axis("batch", 4), Axis("seq", 2))
    np.testing.assert_array_equal(i.array, jax.lax.top_k(A, 2)[1])
    with pytest.raises(na.NamedTypeError, match=r"top_k\(\): k must be an int or an Axis"):
        na.top_k(x, "seq", np.bool_(True))
