"""Reductions, softmax and cumulative ops against jax.numpy; axis selection, where= masks, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import namedaxes as na
from namedaxes import Axis

RNG = np.random.default_rng(1)
A = jnp.asarray(RNG.normal(size=(2, 3, 4)).astype(np.float32))  # axes (batch, seq, embed)
AXES = ("batch", "seq", "embed")
REDUCTIONS = {
    "sum": jnp.sum,
    "mean": jnp.mean,
    "prod": jnp.prod,
    "max": jnp.max,
    "min": jnp.min,
    "std": jnp.std,
    "var": jnp.var,
    "any": jnp.any,
    "all": jnp.all,
    "logsumexp": jax.nn.logsumexp,
}
# (named selection, positional axes for the oracle, remaining axes)
SELECTIONS = [
    ("seq", (1,), ("batch", "embed")),
    (Axis("embed", 4), (2,), ("batch", "seq")),
    (("embed", "batch"), (2, 0), ("seq",)),
    (None, (0, 1, 2), ()),
]
CASES = [(name, i) for name in REDUCTIONS for i in range(len(SELECTIONS))]


def _input(name):
    return A > 0 if name in ("any", "all") else A


@pytest.fixture(scope="module")
def reduction_results():
    @jax.jit
    def run(a):
        out = {}
        for name, i in CASES:
            sel, pos, _ = SELECTIONS[i]
            raw = a > 0 if name in ("any", "all") else a
            out[name, i] = (
                getattr(na, name)(na.named(raw, AXES), sel),
                REDUCTIONS[name](raw, axis=pos),
            )
        return out

    return run(A)


@pytest.mark.parametrize("name,i", CASES, ids=[f"{n}-{i}" for n, i in CASES])
def test_reduction_matches_jnp(name, i, reduction_results):
    out, expected = reduction_results[name, i]
    assert out.axis_names == SELECTIONS[i][2]
    assert out.dtype == expected.dtype
    np.testing.assert_allclose(out.array, expected, rtol=1e-5)


def test_methods_match_functions():
    x = na.named(A, AXES)
    for name in ("sum", "mean", "prod", "max", "min", "std", "var"):
        np.testing.assert_allclose(getattr(x, name)("seq").array, getattr(na, name)(x, "seq").array)
    assert x.sum().axis_names == ()
    assert (x > 0).any("batch").axis_names == ("seq", "embed")
    np.testing.assert_array_equal(x.argmax("embed").array, jnp.argmax(A, axis=2))
    np.testing.assert_allclose(x.cumsum("seq").array, jnp.cumsum(A, axis=1), rtol=1e-6)


def test_where_mask_broadcasts_by_name():
    mask_raw = jnp.array([[True, False], [True, True], [False, True]])  # laid out as (seq, batch)

    @jax.jit  # one compilation for all the pairs below
    def run(a, mask_raw):
        x = na.named(a, AXES)
        mask = na.named(mask_raw, ("seq", "batch"))
        dense = jnp.transpose(mask_raw)[:, :, None]  # laid out as (batch, seq, 1)
        return [
            (na.sum(x, "seq", where=mask), jnp.sum(a, axis=1, where=dense)),
            (na.mean(x, ("batch", "seq"), where=mask), jnp.mean(a, axis=(0, 1), where=dense)),
            (
                na.max(x, "seq", where=mask, initial=-jnp.inf),
                jnp.max(a, axis=1, where=dense, initial=-jnp.inf),
            ),
            (na.var(x, "embed", where=mask, ddof=1), jnp.var(a, axis=2, where=dense, ddof=1)),
            (na.logsumexp(x, "seq", where=mask), jax.nn.logsumexp(a, axis=1, where=dense)),
            (na.sum(x, where=False), jnp.zeros(())),  # scalar mask
        ]

    for got, want in run(A, mask_raw):
        np.testing.assert_allclose(got.array, want, rtol=1e-5)


def test_ddof():
    x = na.named(A, AXES)
    np.testing.assert_allclose(
        na.std(x, "embed", ddof=1).array, jnp.std(A, axis=2, ddof=1), rtol=1e-6
    )
    np.testing.assert_allclose(na.var(x, None, ddof=2).array, jnp.var(A, ddof=2), rtol=1e-6)


def test_sum_dtype():
    x = na.named(jnp.ones((2, 3), jnp.int8) * 100, ("batch", "embed"))
    out = na.sum(x, "embed", dtype=jnp.int32)
    assert out.dtype == jnp.int32 and out.array.tolist() == [300, 300]


def test_dtype_refuses_a_value():
    """A NamedArray or an array for dtype= is named as a value, not a dtype (it met the keyword
    error "Pass a scalar for dtype=", or JAX's own refusal)."""
    x = na.named(A, AXES)
    with pytest.raises(
        na.NamedTypeError,
        match=r"^sum\(\): dtype= needs a dtype, got NamedArray\(batch=2, seq=3, embed=4\)\. Pass a "
        r"dtype such as jnp\.float32, or that value's own: dtype=x\.dtype\.$",
    ):
        na.sum(x, "embed", dtype=x)
    with pytest.raises(na.NamedTypeError, match=r"^mean\(\): dtype= needs a dtype, got ArrayImpl"):
        na.mean(x, "embed", dtype=A)
    assert na.sum(x, "embed", dtype=x.dtype).dtype == jnp.float32  # the value's own dtype works


def test_argmax_argmin():
    x = na.named(A, AXES)
    for fn, ref in ((na.argmax, jnp.argmax), (na.argmin, jnp.argmin)):
        out = fn(x, "seq")
        assert out.axis_names == ("batch", "embed")
        np.testing.assert_array_equal(out.array, ref(A, axis=1))
        v = na.named(A[0, 0], "embed")
        assert fn(v).axis_names == () and fn(v).item() == int(ref(A[0, 0]))


def test_softmax_and_log_softmax():
    mask_raw = jnp.array([True, True, False, True])

    @jax.jit
    def run(a, mask_raw):
        x = na.named(a, AXES)
        return [
            (na.softmax(x, "embed"), jax.nn.softmax(a, axis=2)),
            (na.log_softmax(x, "seq"), jax.nn.log_softmax(a, axis=1)),
            (na.softmax(x, ("embed", "batch")), jax.nn.softmax(a, axis=(2, 0))),
            (
                na.softmax(x, "embed", where=na.named(mask_raw, "embed")),
                jax.nn.softmax(a, axis=2, where=mask_raw[None, None, :]),
            ),
        ]

    results = run(A, mask_raw)
    for got, want in results:
        assert got.axis_names == AXES
        np.testing.assert_allclose(got.array, want, rtol=1e-6)
    assert float(jnp.abs(results[-1][0].array[..., 2]).max()) == 0.0  # masked out: probability 0


def test_cumulative():
    x = na.named(A, AXES)
    out = na.cumsum(x, "seq")
    assert out.axes == x.axes
    np.testing.assert_allclose(out.array, jnp.cumsum(A, axis=1), rtol=1e-6)
    np.testing.assert_allclose(
        na.cumprod(x, Axis("embed", 4)).array, jnp.cumprod(A, axis=2), rtol=1e-6
    )
    ints = na.named(jnp.array([1, 2, 3], jnp.int8), "t")
    assert na.cumsum(ints, "t", dtype=jnp.int32).dtype == jnp.int32


def test_jit_and_grad():
    x = na.named(A, AXES)

    def loss(x):
        return na.mean(na.logsumexp(x, "embed") - na.max(x, "embed")).array

    def loss_ref(a):
        return jnp.mean(jax.nn.logsumexp(a, axis=2) - jnp.max(a, axis=2))

    np.testing.assert_allclose(jax.jit(loss)(x), jax.jit(loss_ref)(A), rtol=1e-6)
    g = jax.jit(jax.grad(loss))(x)
    assert isinstance(g, na.NamedArray) and g.axes == x.axes
    g_ref = jax.jit(jax.grad(loss_ref))(A)
    np.testing.assert_allclose(g.array, g_ref, rtol=1e-5)


def test_unknown_and_duplicate_axes():
    x = na.named(A, AXES)
    msg = r"Axis 'embd' not found in NamedArray\(batch=2, seq=3, embed=4\)\. Available axes: 'batch', 'seq', 'embed'\."
    for fn in (na.sum, na.mean, na.argmax, na.softmax, na.cumsum):
        with pytest.raises(na.AxisNotFoundError, match=msg):
            fn(x, "embd")
    with pytest.raises(na.AxisNotFoundError, match=msg):
        x.sum(("batch", "embd"))
    with pytest.raises(na.DuplicateAxisError, match=r"Duplicate axis names 'seq'"):
        na.sum(x, ("seq", "seq"))
    with pytest.raises(
        na.AxisSizeError,
        match=r"Axis 'embed' has size 4 in NamedArray\(batch=2, seq=3, embed=4\), but size 5 was asked for",
    ):
        na.sum(x, Axis("embed", 5))


def test_bad_masks():
    x = na.named(A, AXES)
    with pytest.raises(
        na.AxisError,
        match=r"sum\(\): where= NamedArray\(vocab=5\) has axes 'vocab' that NamedArray\(batch=2, seq=3, embed=4\) lacks; it may only use 'batch', 'seq', 'embed'",
    ):
        na.sum(x, "seq", where=na.named(jnp.ones(5, bool), "vocab"))
    with pytest.raises(
        na.AxisSizeError,
        match=r"mean\(\): where= axis 'seq' has size 2, but the result's 'seq' has size 3",
    ):
        na.mean(x, where=na.named(jnp.ones(2, bool), "seq"))
    with pytest.raises(
        na.NamedTypeError, match=r"softmax\(\) got a plain array of shape \(4,\) for where="
    ):
        na.softmax(x, "embed", where=jnp.ones(4, bool))
    with pytest.raises(
        na.AxisError,
        match=r"^max\(\) with where= needs initial=, the result where every element is masked out "
        r"\(e\.g\. initial=-jnp\.inf\)\.$",
    ):
        na.max(x, "seq", where=x > 0)
    with pytest.raises(
        na.AxisError, match=r"^min\(\) with where= needs initial=.*initial=jnp\.inf"
    ):
        x.min("seq", where=x > 0)


def test_bad_arguments():
    x = na.named(A, AXES)
    with pytest.raises(
        na.AxisError,
        match=r"argmax\(\) needs one axis for NamedArray\(batch=2, seq=3, embed=4\); axis=None only works on a 1-axis array\. Pass one of 'batch', 'seq', 'embed'",
    ):
        na.argmax(x)
    with pytest.raises(
        na.NamedTypeError, match=r"argmin\(\) reduces exactly one axis; got \('seq', 'embed'\)"
    ):
        na.argmin(x, ("seq", "embed"))
    with pytest.raises(na.NamedTypeError, match=r"softmax\(\) needs the axis to normalize over"):
        na.softmax(x, None)
    with pytest.raises(
        na.NamedTypeError,
        match=r"sum\(\) needs a NamedArray for `x`, got ArrayImpl of shape \(2, 3, 4\)\. Name its axes first",
    ):
        na.sum(A, "seq")


def test_sharded_reductions_and_cumsum(mesh_2x4):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    a = jnp.arange(8 * 12, dtype=jnp.float32).reshape(8, 12) / 10
    with jax.set_mesh(mesh_2x4):
        x = na.named(
            jax.device_put(a, NamedSharding(mesh_2x4, P("data", "model"))), ("batch", "embed")
        )
        total = na.sum(x, "embed")
        running = na.cumsum(x, "batch")  # along a sharded axis: replicated first on Explicit meshes
        probs = na.softmax(x, "embed")
    np.testing.assert_allclose(total.array, a.sum(axis=1), rtol=1e-5)
    assert tuple(total.sharding.spec)[:1] == ("data",)
    np.testing.assert_allclose(running.array, jnp.cumsum(a, axis=0), rtol=1e-5)
    assert {s.data.shape for s in running.array.addressable_shards} <= {(8, 3), (4, 3)}
    assert tuple(running.sharding.spec)[1:2] == ("model",)  # the other axis keeps its sharding
    np.testing.assert_allclose(probs.array, jax.nn.softmax(a, axis=1), rtol=1e-5)


def test_where_mask_sharded_unlike_x_is_reconciled_by_name(mesh_2x4):
    """A where= mask meets x elementwise: on Explicit meshes conflicting shardings are resharded by
    the mapping in force (else a ShardingError), as for x * mask; values as on Auto meshes."""
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    explicit = mesh_2x4.axis_types[0] == AxisType.Explicit
    a = jnp.arange(8 * 8, dtype=jnp.float32).reshape(8, 8) / 10
    keep = jnp.arange(8) % 3 != 0
    with jax.set_mesh(mesh_2x4):
        x = na.named(
            jax.device_put(a, NamedSharding(mesh_2x4, P("data", "model"))), ("batch", "embed")
        )
        m = na.named(jax.device_put(keep, NamedSharding(mesh_2x4, P("model"))), "embed")
        mb = na.named(jax.device_put(keep, NamedSharding(mesh_2x4, P("model"))), "batch")
        with na.axis_mapping({"batch": "data", "embed": "model"}):
            total = na.sum(x, "embed", where=mb)  # batch@data in x, batch@model in the mask
            probs = na.softmax(x, "embed", where=mb)
            top = na.max(x, "batch", where=mb, initial=-jnp.inf)
        agreeing = na.mean(x, "embed", where=m)  # embed@model in both: untouched, no mapping needed
        if explicit:
            with pytest.raises(
                na.ShardingError,
                match=r"sum\(\): the operands' shardings conflict on an Explicit mesh: axis 'batch' "
                r"is sharded over \('data',\) in x but over \('model',\) in where=",
            ):
                na.sum(x, "embed", where=mb)
    np.testing.assert_allclose(total.array, jnp.sum(a, axis=1, where=keep[:, None]), rtol=1e-6)
    expected = jax.nn.softmax(a, axis=1, where=keep[:, None])
    np.testing.assert_allclose(probs.array, expected, rtol=1e-6)
    np.testing.assert_allclose(top.array, jnp.max(a, axis=0, where=keep[:, None], initial=-jnp.inf))
    np.testing.assert_allclose(agreeing.array, jnp.mean(a, axis=1, where=keep), rtol=1e-6)
    if explicit:
        assert total.sharding.spec == P("data") and probs.sharding.spec == P("data", "model")
        assert agreeing.sharding.spec == P("data")


def test_initial_that_is_a_named_array_is_refused_with_the_named_way():
    """``initial=`` NamedArray reached ``jnp.max`` as it was and failed in JAX's terms."""
    x = na.named(A, AXES)
    per_batch = na.named(jnp.zeros(2), "batch")
    for op, combine in (("max", "maximum"), ("min", "minimum"), ("nanmax", "maximum")):
        with pytest.raises(
            na.NamedTypeError,
            match=rf"^{op}\(\): keyword initial= got NamedArray\(batch=2\); keywords are passed to "
            r"JAX as they are, with no axis names to broadcast by\. Pass a scalar for initial=, or "
            rf"combine by name after reducing: na\.{combine}\(na\.{op}\(x, axis\), v\)\.$",
        ):
            getattr(na, op)(x, "embed", initial=per_batch)
    got = na.max(x, "embed", initial=na.named(jnp.float32(0.0), ()))  # 0-d: a scalar
    np.testing.assert_array_equal(got.array, jnp.max(A, axis=2, initial=0.0))
