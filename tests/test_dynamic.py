"""ds(start, size) in x[...] / x.at[...], updated_slice with traced and per-batch starts, .at[].mul:
jax.lax oracles, errors, Auto/Explicit sharding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import spec_of
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import namedaxes as na
from namedaxes import Axis

A = jnp.arange(4 * 8 * 3, dtype=jnp.float32).reshape(4, 8, 3)  # (batch, seq, embed)
AXES = ("batch", "seq", "embed")
POS = jnp.array([0, 6, 2, 7], dtype=jnp.int32)  # one start per batch entry; 6 and 7 get clamped


def _per_batch_slice(a, pos, size):
    return jax.vmap(lambda row, p: jax.lax.dynamic_slice_in_dim(row, p, size, axis=0))(a, pos)


def _per_batch_update(a, upd, pos):
    return jax.vmap(lambda row, u, p: jax.lax.dynamic_update_slice_in_dim(row, u, p, axis=0))(
        a, upd, pos
    )


@pytest.fixture(scope="module")
def results():
    upd = jnp.full((4, 2, 3), -1.0)

    @jax.jit
    def run(a, s, pos):
        x = na.named(a, AXES)
        xt = na.named(jnp.transpose(a, (2, 1, 0)), AXES[::-1])  # other layout
        p = na.named(pos, "batch")
        u = na.named(upd, AXES)
        ut = na.named(jnp.transpose(upd, (1, 0, 2)), ("seq", "batch", "embed"))
        return {
            "ds_traced": (
                x["seq", na.ds(s, 3)].array,
                jax.lax.dynamic_slice_in_dim(a, s, 3, axis=1),
            ),
            "ds_static": (x["seq", na.ds(2, 3), "embed", 1].array, a[:, 2:5, 1]),
            "ds_batch": (x["seq", na.ds(p, 2)].array, _per_batch_slice(a, pos, 2)),
            "ds_batch_t": (
                na.rearrange(xt["seq", na.ds(p, 2)], AXES).array,
                _per_batch_slice(a, pos, 2),
            ),
            "at_ds_set": (
                x.at["seq", na.ds(s, 2)].set(0.0).array,
                jax.lax.dynamic_update_slice_in_dim(a, jnp.zeros((4, 2, 3)), s, axis=1),
            ),
            "at_ds_batch_add": (
                x.at["seq", na.ds(p, 2)].add(1.0).array,
                _per_batch_update(a, _per_batch_slice(a, pos, 2) + 1.0, pos),
            ),
            "at_mul": (x.at["seq", 1].mul(2.0).array, a.at[:, 1].multiply(2.0)),
            "at_min": (x.at["embed", 0].min(5.0).array, a.at[:, :, 0].min(5.0)),
            "at_max": (x.at["embed", 0].max(5.0).array, a.at[:, :, 0].max(5.0)),
            "at_divide": (x.at["seq", 0].divide(2.0).array, a.at[:, 0].divide(2.0)),
            "us_static": (
                na.updated_slice(x, {"seq": 3}, u).array,
                jax.lax.dynamic_update_slice(a, upd, (0, 3, 0)),
            ),
            "us_traced": (
                na.updated_slice(x, {"seq": s}, ut).array,
                jax.lax.dynamic_update_slice(a, upd, (0, s, 0)),
            ),
            "us_batch": (na.updated_slice(x, {"seq": p}, u).array, _per_batch_update(a, upd, pos)),
            "us_batch_t": (
                na.rearrange(na.updated_slice(xt, {"seq": p}, ut), AXES).array,
                _per_batch_update(a, upd, pos),
            ),
            "us_broadcast": (
                na.updated_slice(x, {"seq": s}, na.named(jnp.full((2,), 9.0), "seq")).array,
                jax.lax.dynamic_update_slice(a, jnp.full((4, 2, 3), 9.0), (0, s, 0)),
            ),
        }

    return run(A, 5, POS)


CASES = ["ds_traced", "ds_static", "ds_batch", "ds_batch_t", "at_ds_set", "at_ds_batch_add", "at_mul",
         "at_min", "at_max", "at_divide", "us_static", "us_traced", "us_batch", "us_batch_t", "us_broadcast"]  # fmt: skip


@pytest.mark.parametrize("name", CASES)
def test_matches_lax(results, name):
    got, expected = results[name]
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


def test_result_axes():
    x = na.named(A, AXES)
    assert x["seq", na.ds(1, 4)].axes == (Axis("batch", 4), Axis("seq", 4), Axis("embed", 3))
    assert x["seq", na.ds(na.named(POS, "batch"), 2)].axes == (
        Axis("batch", 4),
        Axis("seq", 2),
        Axis("embed", 3),
    )
    assert (
        na.updated_slice(x, {"seq": 0}, na.named(jnp.zeros((1, 3)), ("seq", "embed"))).axes
        == x.axes
    )


def test_errors():
    x = na.named(A, AXES)
    with pytest.raises(
        na.AxisSizeError,
        match=r"ds\(\): start 7 with size 2 runs outside axis 'seq' of size 8\. Use a start between 0 and 6",
    ):
        x["seq", na.ds(7, 2)]
    with pytest.raises(na.AxisSizeError, match=r"ds\(\): size 9 does not fit axis 'seq' of size 8"):
        x["seq", na.ds(0, 9)]
    with pytest.raises(
        na.NamedTypeError, match=r"ds\(start, size\): size must be a static int >= 0, got 2\.5"
    ):
        na.ds(0, 2.5)
    with pytest.raises(
        na.AxisError, match=r"ds\(\): start NamedArray\(seq=8\) has the sliced axis 'seq'"
    ):
        x["seq", na.ds(na.named(jnp.zeros(8, jnp.int32), "seq"), 2)]
    with pytest.raises(
        na.NamedTypeError, match=r"ds\(\): start for axis 'seq' must be an int, a 0-d integer array"
    ):
        x["seq", na.ds(jnp.zeros(2, jnp.int32), 2)]
    u = na.named(jnp.zeros((4, 2, 3)), AXES)
    with pytest.raises(
        na.AxisSizeError,
        match=r"updated_slice\(\): update has 'seq'=2 but x has 'seq'=8 and no start was given for it",
    ):
        na.updated_slice(x, {}, u)
    with pytest.raises(
        na.AxisError,
        match=r"updated_slice\(\): update NamedArray\(k=2\) has axes 'k' that x NamedArray\(batch=4, seq=8, embed=3\) lacks",
    ):
        na.updated_slice(x, {"seq": 0}, na.named(jnp.zeros(2), "k"))
    with pytest.raises(
        na.AxisSizeError, match=r"updated_slice\(\): start 7 with size 2 runs outside axis 'seq'"
    ):
        na.updated_slice(x, {"seq": 7}, u)
    with pytest.raises(na.AxisNotFoundError, match=r"Axis 'sq' not found"):
        na.updated_slice(x, {"sq": 0}, u)
    with pytest.raises(
        na.NamedTypeError, match=r"updated_slice\(\) takes starts as a \{axis: start\} dict"
    ):
        na.updated_slice(x, 3, u)
    with pytest.raises(
        na.AxisError, match=r"the start for 'seq' varies over 'embed', which is itself sliced"
    ):
        na.updated_slice(x, {"seq": na.named(jnp.zeros(3, jnp.int32), "embed"), "embed": 0},
                         na.named(jnp.zeros((4, 2, 1)), AXES))  # fmt: skip


def test_sharded(mesh_2x4):
    a = jax.device_put(A, NamedSharding(mesh_2x4, P("data", "model")))
    pos = jax.device_put(POS, NamedSharding(mesh_2x4, P("data")))
    upd = na.named(jnp.ones((4, 2, 3)), AXES)
    with jax.set_mesh(mesh_2x4):

        @jax.jit
        def run(a, pos):
            x = na.named(a, AXES)
            p = na.named(pos, "batch")
            return (na.updated_slice(x, {"seq": p}, upd), x["seq", na.ds(p, 2)], x.at["seq", na.ds(p, 2)].set(0.0),
                    x.at["seq", 1].mul(3.0))  # fmt: skip

        us, got, setv, mul = run(a, pos)
    # Updates keep x's sharding; the window read keeps the batch axis' mesh axis.
    assert spec_of(us) == spec_of(setv) == spec_of(mul) == P("data", "model")
    assert spec_of(got)[0] == "data"
    np.testing.assert_array_equal(us.array, _per_batch_update(A, jnp.ones((4, 2, 3)), POS))
    np.testing.assert_array_equal(got.array, _per_batch_slice(A, POS, 2))


def test_sharded_update_into_replicated(mesh_2x4, axis_type):
    """A batch-sharded update written into a replicated array (a token into a fresh buffer): the
    values of the unsharded computation; on Explicit meshes the result stays replicated (JAX
    refused the mixed shardings before)."""
    upd = jax.device_put(jnp.ones((4, 2, 3)), NamedSharding(mesh_2x4, P("data")))
    with jax.set_mesh(mesh_2x4):

        @jax.jit
        def run(u):
            return na.updated_slice(na.named(A, AXES), {"seq": 5}, na.named(u, AXES))

        out = run(upd)
    if axis_type == jax.sharding.AxisType.Explicit:
        assert spec_of(out) == P()
    np.testing.assert_array_equal(
        out.array, jax.lax.dynamic_update_slice(A, jnp.ones((4, 2, 3)), (0, 5, 0))
    )


@pytest.mark.parametrize(
    "x_spec, pos_spec",
    [(P("data"), P()), (P("model"), P("data")), (P(), P("data"))],
    ids=["cache-data_pos-replicated", "cache-model_pos-data", "cache-replicated_pos-data"],
)
def test_per_entry_starts_sharded_unlike_x(mesh_2x4, x_spec, pos_spec):
    """A KV-cache write: the starts follow x's batch sharding, whatever their own (JAX's vmap
    refused batch axes sharded differently in x and the starts on Explicit meshes)."""
    a = jax.device_put(A, NamedSharding(mesh_2x4, x_spec))
    pos = jax.device_put(POS, NamedSharding(mesh_2x4, pos_spec))
    new = jnp.ones((4, 2, 3))
    with jax.set_mesh(mesh_2x4):

        @jax.jit
        def run(a, pos):
            return na.updated_slice(na.named(a, AXES), {"seq": na.named(pos, "batch")},
                                    na.named(new, AXES))  # fmt: skip

        out = run(a, pos)
    if mesh_2x4.axis_types[0] == jax.sharding.AxisType.Explicit:
        assert spec_of(out) == x_spec
    np.testing.assert_array_equal(out.array, _per_batch_update(A, new, POS))


def test_updated_slice_casts_only_dtypes_that_promote():
    """A float update into an int array was cast silently (1.7 -> 1), where
    ``lax.dynamic_update_slice`` and ``x.at[].set`` refuse it."""
    cache = na.named(jnp.zeros(4, jnp.int32), "seq")
    floats = na.named(jnp.zeros(3, jnp.float32), "seq")
    int8 = na.named(jnp.array([3], jnp.int8), "seq")
    bf16 = na.named(jnp.array([1.5], jnp.bfloat16), "seq")
    for mode in ("standard", "strict"):
        with jax.numpy_dtype_promotion(mode):
            with pytest.raises(
                na.NamedTypeError,
                match=r"^updated_slice\(\): update has dtype float32 and x has int32; .*, so "
                r"writing it would cast it silently\. Cast it on purpose: "
                r"update\.astype\('int32'\)\.$",
            ):
                na.updated_slice(cache, {"seq": 1}, na.named(jnp.array([1.7]), "seq"))
    with jax.numpy_dtype_promotion("standard"):  # lossless promotions are cast, as x.at[].set does
        narrow = na.updated_slice(cache, {"seq": 1}, int8)
        half = na.updated_slice(floats, {"seq": 2}, bf16)
        with pytest.raises(na.NamedTypeError, match=r"float32 does not promote to bfloat16"):
            na.updated_slice(floats.astype(jnp.bfloat16), {"seq": 0}, floats[{"seq": 0}])
    assert narrow.dtype == jnp.int32 and half.dtype == jnp.float32
    np.testing.assert_array_equal(narrow.array, [0, 3, 0, 0])
    np.testing.assert_array_equal(half.array, [0.0, 0.0, 1.5])
    with pytest.raises(  # the suite's mode: no implicit promotion, as x.at[].set refuses
        na.NamedTypeError,
        match=r"update has dtype int8 and x has int32; jax_numpy_dtype_promotion='strict' "
        r"promotes no dtype to another",
    ):
        na.updated_slice(cache, {"seq": 1}, int8)
