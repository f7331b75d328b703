"""unique family, bincount, nonzero, one-argument where, allclose, array_equal: oracles, errors,
sharding; and the nan* reductions built from the reductions' helpers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import spec_of
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import namedaxes as na
from namedaxes import Axis

I = jnp.array([[3, 1, 0, 3], [2, 2, 0, 5]], dtype=jnp.int32)  # (batch, seq)
F = jnp.array([[1.0, jnp.nan, 3.0, -1.0], [jnp.nan, 2.0, 0.5, 4.0]], dtype=jnp.float32)


@pytest.fixture(scope="module")
def results():
    @jax.jit
    def run(i, f):
        x = na.named(i, ("batch", "seq"))
        v, first, inv, cnt = na.unique_all(x, Axis("value", 6), fill_value=-1)
        ev, eidx, einv, ecnt = jnp.unique(
            i, return_index=True, return_inverse=True, return_counts=True, size=6, fill_value=-1
        )
        rows = na.unique(x, {"u": 2}, axis="batch", return_inverse=True, return_counts=True)
        erows = jnp.unique(i, axis=0, size=2, return_inverse=True, return_counts=True)
        nz = na.nonzero(x, size=Axis("hit", 8))
        enz = jnp.nonzero(i, size=8)
        w = na.named(f.T, ("seq", "batch"))  # weights in another layout
        return {
            "unique": (v.array, ev),
            "unique_index": (x[first].array, i.ravel()[eidx]),
            "unique_inverse": (inv.array, jnp.reshape(einv, i.shape)),
            "unique_counts": (cnt.array, ecnt),
            "unique_values": (na.unique_values(x, {"value": 6}, fill_value=-1).array, ev),
            "unique_rows": (rows[0].array, erows[0]),
            "unique_rows_inv": (rows[1].array, jnp.ravel(erows[1])),
            "unique_rows_cnt": (rows[2].array, erows[2]),
            "nonzero_b": (nz["batch"].array, enz[0]),
            "nonzero_s": (nz["seq"].array, enz[1]),
            "where1": (na.where(x > 2, size={"hit": 3})["seq"].array, jnp.where(i > 2, size=3)[1]),
            "bincount": (na.bincount(x, {"bin": 7}).array, jnp.bincount(i.ravel(), length=7)),
            "bincount_w": (
                na.bincount(x, {"bin": 7}, weights=na.nan_to_num(w)).array,
                jnp.bincount(i.ravel(), weights=jnp.nan_to_num(f).ravel(), length=7),
            ),
            "allclose": (
                na.allclose(na.named(f, ("batch", "seq")), w, equal_nan=True).array,
                jnp.array(True),
            ),
            "allclose_no": (
                na.allclose(na.named(f, ("batch", "seq")), w + 1e-3).array,
                jnp.array(False),
            ),
            "array_equal": (
                na.array_equal(na.named(f, ("batch", "seq")), w, equal_nan=True).array,
                jnp.array(True),
            ),
            "array_equal_axes": (na.array_equal(x, na.named(i[0], "seq")).array, jnp.array(False)),
            "nansum": (
                na.nansum(na.named(f, ("batch", "seq")), "seq").array,
                jnp.nansum(f, axis=1),
            ),
            "nanmean": (na.nanmean(w, "seq").array, jnp.nanmean(f, axis=1)),
            "nanmax": (na.nanmax(w).array, jnp.nanmax(f)),
            "nanmin": (na.nanmin(w, "batch").array, jnp.nanmin(f, axis=0)),
            "nanprod": (na.nanprod(w, ("seq", "batch")).array, jnp.nanprod(f)),
            "nanstd": (na.nanstd(w, "seq", ddof=1).array, jnp.nanstd(f, axis=1, ddof=1)),
            "nanvar": (na.nanvar(w, "seq").array, jnp.nanvar(f, axis=1)),
            "nanvar_where": (
                na.nanvar(
                    w, "seq", where=na.named(jnp.array([True, True, False, True]), "seq")
                ).array,
                jnp.nanvar(f, axis=1, where=jnp.array([True, True, False, True])[None, :]),
            ),
            "nanargmax": (na.nanargmax(w, "seq").array, jnp.nanargmax(f, axis=1)),
            "nanargmin": (na.nanargmin(w, "batch").array, jnp.nanargmin(f, axis=0)),
            "nancumsum": (
                na.nancumsum(na.named(f, ("batch", "seq")), "seq").array,
                jnp.nancumsum(f, axis=1),
            ),
            "nancumprod": (
                na.nancumprod(na.named(f, ("batch", "seq")), "seq").array,
                jnp.nancumprod(f, axis=1),
            ),
        }

    return run(I, F)


@pytest.mark.parametrize(
    "name",
    [
        "unique",
        "unique_index",
        "unique_inverse",
        "unique_counts",
        "unique_values",
        "unique_rows",
        "unique_rows_inv",
        "unique_rows_cnt",
        "nonzero_b",
        "nonzero_s",
        "where1",
        "bincount",
        "bincount_w",
        "allclose",
        "allclose_no",
        "array_equal",
        "array_equal_axes",
        "nansum",
        "nanmean",
        "nanmax",
        "nanmin",
        "nanprod",
        "nanstd",
        "nanvar",
        "nanvar_where",
        "nanargmax",
        "nanargmin",
        "nancumsum",
        "nancumprod",
    ],  # fmt: skip
)
def test_matches_jnp(results, name):
    got, expected = results[name]
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-6)


def test_result_axes_and_forms():
    jax.eval_shape(_check_forms, I)  # shapes only: nothing to compile


def _check_forms(i):
    x = na.named(i, ("batch", "seq"))
    v, inv = na.unique_inverse(x, {"value": 5})
    assert v.axes == (Axis("value", 5),) and inv.axes == x.axes
    vals, counts = na.unique_counts(x, {"value": 5})
    assert counts.axes == (Axis("value", 5),)
    assert na.unique(x, {"u": 2}, axis="batch").axes == (Axis("u", 2), Axis("seq", 4))
    hits = na.nonzero(x, size=Axis("hit", 3))
    assert list(hits) == ["batch", "seq"] and hits["batch"].axes == (Axis("hit", 3),)
    assert na.where(x > 0, x, 0).axes == x.axes  # the three-argument form is unchanged
    assert na.nansum(x.astype(jnp.float32)).axes == ()
    return i


def test_errors():
    x = na.named(I, ("batch", "seq"))
    with pytest.raises(
        na.NamedTypeError,
        match=r"unique\(\) needs size= as an Axis \(the result's axis name and length\), got 4",
    ):
        na.unique(x, 4)
    with pytest.raises(
        na.DuplicateAxisError,
        match=r"nonzero\(\): result axis 'seq' is already an axis of NamedArray\(batch=2, seq=4\)",
    ):
        na.nonzero(x, size=Axis("seq", 2))
    with pytest.raises(
        na.NamedTypeError,
        match=r"where\(\) takes 3 operand\(s\) \(condition, x, y\), got 1\. The one-argument form needs size=",
    ):
        na.where(x > 0)
    with pytest.raises(
        na.NamedTypeError, match=r"where\(\) takes 3 operand\(s\) \(condition, x, y\), got 2"
    ):
        na.where(x > 0, x)
    with pytest.raises(
        na.NamedTypeError, match=r"bincount\(\) needs integer values, got dtype float32"
    ):
        na.bincount(x.astype(jnp.float32), {"bin": 3})
    with pytest.raises(
        na.AxisError,
        match=r"bincount\(\): weights NamedArray\(seq=4\) must have exactly the axes of x",
    ):
        na.bincount(x, {"bin": 3}, weights=na.named(jnp.ones(4), "seq"))
    with pytest.raises(na.AxisSizeError, match=r"allclose\(\): Cannot broadcast axis 'seq'"):
        na.allclose(x, na.named(jnp.ones(3), "seq"))
    with pytest.raises(na.NamedTypeError, match=r"array_equal\(\) needs a NamedArray for `b`"):
        na.array_equal(x, I)
    with pytest.raises(na.NamedTypeError, match=r"nansum\(\) got unexpected keyword\(s\) 'ddof'"):
        na.nansum(x, "seq", ddof=1)
    with pytest.raises(
        na.AxisNotFoundError, match=r"Axis 'sq' not found in NamedArray\(batch=2, seq=4\)"
    ):
        na.nanmean(x, "sq")
    with pytest.raises(
        na.AxisError, match=r"nanargmax\(\) needs one axis for NamedArray\(batch=2, seq=4\)"
    ):
        na.nanargmax(x)


def test_sharded(mesh_2x4):
    f = jax.device_put(jnp.nan_to_num(F), NamedSharding(mesh_2x4, P("data", "model")))
    i = jax.device_put(I, NamedSharding(mesh_2x4, P("data", "model")))
    with jax.set_mesh(mesh_2x4):

        @jax.jit
        def run(f, i):
            x = na.named(i, ("batch", "seq"))
            y = na.named(f, ("batch", "seq"))
            return (na.unique(x, {"value": 5}), na.bincount(x, {"bin": 6}), na.nonzero(x, size={"hit": 8}),
                    na.nansum(y, "seq"), na.allclose(y, y), na.array_equal(y, y),
                    na.unique_counts(x, {"value": 5})[1], na.where(x > 2, size={"hit": 2}))  # fmt: skip

        u, b, nz, s, close, equal, counts, hits = run(f, i)
    assert bool(equal)
    np.testing.assert_array_equal(counts.array, jnp.unique_counts(I, size=5)[1])
    np.testing.assert_array_equal(hits["seq"].array, jnp.where(I > 2, size=2)[1])
    np.testing.assert_array_equal(u.array, jnp.unique(I, size=5))
    np.testing.assert_array_equal(b.array, jnp.bincount(I.ravel(), length=6))
    np.testing.assert_array_equal(nz["seq"].array, jnp.nonzero(I, size=8)[1])
    assert spec_of(s) == P("data")  # a reduction keeps the other axis' mesh axis
    assert bool(close)


def test_unique_slices_do_not_depend_on_layout():
    """Slices are compared flattened over the other axes in sorted-name order, whatever x's layout."""
    s0, s1, s2 = [[0, 1], [0, 0]], [[0, 0], [1, 0]], [[1, 0], [0, 0]]  # (a, b)
    data = np.array([s0, s1, s0, s2])  # (seq, a, b): three unique slices, s0 twice
    y = na.named(jnp.asarray(data), ("seq", "a", "b"))
    # The oracle: NumPy's unique over slices laid out (a, b), the sorted order of the other axes.
    ev, eidx, einv, ecnt = np.unique(
        data, axis=0, return_index=True, return_inverse=True, return_counts=True
    )
    for perm in [("seq", "a", "b"), ("b", "seq", "a")]:
        x = na.rearrange(y, perm)
        v, idx, inv, cnt = na.unique(
            x, Axis("u", 3), axis="seq", return_index=True, return_inverse=True, return_counts=True
        )
        # seq is replaced in place by u; the other axes keep x's layout.
        assert v.axis_names == tuple("u" if n == "seq" else n for n in perm)
        np.testing.assert_array_equal(na.rearrange(v, ("u", "a", "b")).array, ev)
        np.testing.assert_array_equal(idx.array, eidx)
        np.testing.assert_array_equal(inv.array, np.ravel(einv))
        np.testing.assert_array_equal(cnt.array, ecnt)


def test_bincount_drops_negative_values():
    labels = na.named(jnp.array([[-1, 0, 2], [-1, 5, 1]], jnp.int8), ("batch", "seq"))  # -1: ignore
    np.testing.assert_array_equal(na.bincount(labels, Axis("bin", 3)).array, [1, 1, 1])
    w = na.named(jnp.arange(6.0).reshape(3, 2), ("seq", "batch"))  # weights in another layout
    np.testing.assert_array_equal(na.bincount(labels, {"bin": 3}, weights=w).array, [2.0, 5.0, 4.0])
    # More bins than int8 can count to: -1 is still dropped, not sent to a bin.
    wide = na.bincount(labels, {"bin": 200})
    assert int(wide.array.sum()) == 4 and wide.array.dtype == jnp.int32


def test_array_equal_reconciles_shardings_by_name(mesh_2x4):
    from jax.sharding import AxisType

    explicit = mesh_2x4.axis_types[0] == AxisType.Explicit
    f = jnp.arange(64.0).reshape(8, 8)
    with jax.set_mesh(mesh_2x4):
        a = na.named(
            jax.device_put(f, NamedSharding(mesh_2x4, P("data", "model"))), ("batch", "seq")
        )
        b = na.named(
            jax.device_put(f, NamedSharding(mesh_2x4, P("model", "data"))), ("batch", "seq")
        )
        bt = na.named(
            jax.device_put(f.T, NamedSharding(mesh_2x4, P("model", "data"))), ("seq", "batch")
        )
        with na.axis_mapping({"batch": "data", "seq": "model"}):
            assert bool(na.array_equal(a, b))
            assert not bool(na.array_equal(a, b + 1.0))
        assert bool(na.array_equal(a, bt))  # the same shardings by name, in another layout
        if explicit:
            with pytest.raises(
                na.ShardingError,
                match=r"array_equal\(\): the operands' shardings conflict on an Explicit mesh: axis "
                r"'batch' is sharded over \('data',\) in a but over \('model',\) in b",
            ):
                na.array_equal(a, b)
