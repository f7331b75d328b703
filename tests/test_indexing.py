"""Indexing by name, checked against positional jax.numpy indexing on the same data."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import same

import namedaxes as na
from namedaxes import (
    Axis,
    AxisNotFoundError,
    AxisSizeError,
    DuplicateAxisError,
    NamedTypeError,
    named,
)

A = jnp.arange(24.0).reshape(2, 3, 4)


@pytest.fixture
def x():
    return named(A, ("batch", "seq", "embed"))


# -- basic indexing ---------------------------------------------------------------------------


def test_int_and_slice_forms(x):
    same(x["seq", 1], A[:, 1], ("batch", "embed"))
    same(x["batch", -1, "embed", 1:4:2], A[-1, :, 1:4:2], ("seq", "embed"))
    same(x[{"seq": slice(0, 2), "embed": 3}], A[:, 0:2, 3], ("batch", "seq"))
    same(x[{Axis("embed", 4): slice(None, None, -1)}], A[:, :, ::-1], ("batch", "seq", "embed"))
    assert x["seq", 0:2].shape == {"batch": 2, "seq": 2, "embed": 4}
    assert x["batch", 0, "seq", 1, "embed", 2].item() == A[0, 1, 2]
    same(x[{}], A, ("batch", "seq", "embed"))


def test_traced_int_index(x):
    f = jax.jit(lambda x, i: x["seq", i])
    same(f(x, 2), A[:, 2], ("batch", "embed"))
    same(f(x, jnp.int32(1)), A[:, 1], ("batch", "embed"))


def test_indexing_errors(x):
    with pytest.raises(
        AxisNotFoundError,
        match=r"Axis 'sq' not found in NamedArray\(batch=2, seq=3, embed=4\). Available axes: 'batch', 'seq', 'embed'",
    ):
        x["sq", 0]
    with pytest.raises(
        NamedTypeError, match=r"cannot be indexed by position \(0\).*x\['batch', 3\]"
    ):
        x[0]
    with pytest.raises(NamedTypeError, match=r"cannot be indexed by position"):
        x[0, 1]
    with pytest.raises(NamedTypeError, match=r"Missing index for axis 'seq'"):
        x["batch", 0, "seq"]
    with pytest.raises(DuplicateAxisError, match=r"Axis 'seq' is indexed twice"):
        x["seq", 0, Axis("seq", 3), 1]
    with pytest.raises(
        AxisSizeError,
        match=r"Index 3 is out of range for axis 'seq' of size 3 in NamedArray\(batch=2, seq=3, embed=4\). Valid indices are -3..2",
    ):
        x["seq", 3]
    with pytest.raises(
        NamedTypeError,
        match=r"Slice slice\(.*\) for axis 'seq' must have static integer bounds.*namedaxes.slice_axis\(x, 'seq', start, length\)",
    ):
        jax.jit(lambda x, i: x["seq", i : i + 2])(x, 0)
    with pytest.raises(
        NamedTypeError,
        match=r"Index for axis 'seq' must be integers, got an array of shape \(2,\) of dtype float32",
    ):
        x["seq", jnp.array([0.0, 1.0])]
    with pytest.raises(
        NamedTypeError, match=r"dtype bool. Boolean masks give data-dependent shapes"
    ):
        x["seq", named(jnp.array([True, False, True]), ("seq",))]
    with pytest.raises(
        NamedTypeError,
        match=r"Index for axis 'seq' is a plain array of shape \(2, 2\); its dimensions need names.*named\(idx, \('axis0', 'axis1'\)\)",
    ):
        x["seq", jnp.zeros((2, 2), jnp.int32)]


# -- gathers by name --------------------------------------------------------------------------


def test_gather_replaces_axis_in_place(x):
    idx = jnp.array([[2, 0], [1, 1], [0, 2]])  # (k=3, m=2)
    ids = named(idx, ("k", "m"))
    same(x["seq", ids], A[:, idx], ("batch", "k", "m", "embed"))
    same(x["embed", ids], A[:, :, idx], ("batch", "seq", "k", "m"))
    same(x["batch", named(jnp.array([1, 0]), ("k",))], A[jnp.array([1, 0])], ("k", "seq", "embed"))


def test_gather_plain_1d_keeps_name(x):
    same(x["seq", jnp.array([2, 0])], A[:, jnp.array([2, 0])], ("batch", "seq", "embed"))
    same(x["embed", [3, 3, 1]], A[:, :, jnp.array([3, 3, 1])], ("batch", "seq", "embed"))
    assert x["embed", [3, 3, 1]].axis_size("embed") == 3


def test_gather_shared_axis_is_pointwise(x):
    # ids has the batch axis too: batch is matched pointwise, like take_along_axis.
    idx = jnp.array([[0, 2, 2, 1], [1, 1, 0, 0]])  # (batch=2, k=4)
    out = x["seq", named(idx, ("batch", "k"))]
    expected = jnp.take_along_axis(A, idx[:, :, None], axis=1)  # (batch, k, embed)
    same(out, expected, ("batch", "k", "embed"))
    # Index axes in another order give the same result.
    out2 = x["seq", named(idx.T, ("k", "batch"))]
    same(out2, expected, ("batch", "k", "embed"))
    # Shared axis after the gathered one, and a sliced batch axis.
    idx_e = jnp.array([[3, 0], [1, 1], [2, 0]])  # (seq=3, k=2)
    out3 = x[{"batch": slice(1, 2), "embed": named(idx_e, ("seq", "k"))}]
    expected3 = jnp.take_along_axis(A[1:2], idx_e[None], axis=2)
    same(out3, expected3, ("batch", "seq", "k"))


def test_gather_two_index_arrays_and_int(x):
    i = jnp.array([1, 0, 1])
    j = jnp.array([3, 2, 0])
    # Non-adjacent advanced indices (NumPy puts them first); we keep them at batch's place.
    out = x[{"batch": named(i, ("k",)), "embed": named(j, ("k",))}]
    same(out, A[i, :, j], ("k", "seq"))
    assert A[i, :, j].shape == (3, 3)
    # An int next to a gather, and a separated one.
    same(x["batch", 1, "seq", named(i, ("k",))], A[1, i], ("k", "embed"))
    same(x["batch", 1, "embed", named(j, ("k",))], A[1, :, j].T, ("seq", "k"))


def test_gather_errors(x):
    with pytest.raises(
        AxisSizeError,
        match=r"Index arrays share axis 'batch' \(size 3\) with the indexed array, where it has size 2",
    ):
        x["seq", named(jnp.zeros((3,), jnp.int32), ("batch",))]
    with pytest.raises(AxisSizeError, match=r"Cannot broadcast axis 'k'"):
        x[
            "seq",
            named(jnp.zeros(2, jnp.int32), ("k",)),
            "embed",
            named(jnp.zeros(3, jnp.int32), ("k",)),
        ]


def test_gather_grad(x):
    ids = named(jnp.array([0, 0, 2]), ("k",))
    g = jax.grad(lambda a: x.__class__(a, x.axes)["seq", ids].array.sum())(A)
    expected = jax.grad(lambda a: a[:, jnp.array([0, 0, 2])].sum())(A)
    np.testing.assert_array_equal(g, expected)


# -- take -------------------------------------------------------------------------------------


def test_take_matches_jnp_take(x):
    idx = jnp.array([[1, 2], [0, 0]])
    same(
        na.take(x, "seq", named(idx, ("k", "m"))),
        jnp.take(A, idx, axis=1),
        ("batch", "k", "m", "embed"),
    )
    same(na.take(x, "embed", 2), jnp.take(A, 2, axis=2), ("batch", "seq"))
    same(
        x.take("embed", jnp.array([3, 1])),
        jnp.take(A, jnp.array([3, 1]), axis=2),
        ("batch", "seq", "embed"),
    )


def test_take_embedding_lookup():
    emb = jnp.arange(50.0).reshape(10, 5)
    ids = jnp.array([[1, 9, 3], [0, 0, 4]])
    out = na.take(named(emb, ("vocab", "embed")), "vocab", named(ids, ("batch", "seq")))
    same(out, emb[ids], ("batch", "seq", "embed"))


def _gathers(jaxpr):
    """The gather equations of a jaxpr, recursing into sub-jaxprs (pjit, custom_jvp, ...)."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "gather":
            found.append(eqn)
        for param in eqn.params.values():
            sub = getattr(param, "jaxpr", param)
            if hasattr(sub, "eqns"):
                found.extend(_gathers(sub))
    return found


def test_take_with_shared_axes_is_a_batched_gather_like_take_along_axis():
    rng = np.random.default_rng(3)
    logp = jnp.asarray(rng.normal(size=(2, 3, 7)), jnp.float32)
    targets = jnp.asarray(rng.integers(-7, 7, size=(2, 3)), jnp.int32)  # negatives wrap, as in JAX
    oracle = jnp.take_along_axis(logp, (targets % 7)[..., None], axis=-1)[..., 0]

    def f(lp, t):
        return na.take(named(lp, ("batch", "seq", "vocab")), "vocab", named(t, ("batch", "seq")))

    same(f(logp, targets), oracle, ("batch", "seq"))
    # Index axes in any order, and a (seq, batch) source: the source is never transposed.
    same(
        na.take(
            named(logp, ("batch", "seq", "vocab")), "vocab", named(targets.T, ("seq", "batch"))
        ),
        oracle,
        ("batch", "seq"),
    )
    src_t = named(jnp.transpose(logp, (1, 2, 0)), ("seq", "vocab", "batch"))
    same(na.take(src_t, "vocab", named(targets, ("batch", "seq"))), oracle.T, ("seq", "batch"))
    # One gather with the batch axes as batching dimensions and a single index component.
    (eqn,) = _gathers(jax.make_jaxpr(f)(logp, targets).jaxpr)
    dn = eqn.params["dimension_numbers"]
    assert (dn.operand_batching_dims, dn.start_indices_batching_dims, dn.start_index_map) == (
        (0, 1),
        (0, 1),
        (2,),
    )
    assert eqn.invars[0].aval.shape == (2, 3, 7) and eqn.invars[1].aval.shape == (2, 3, 1)
    assert [e.primitive.name for e in jax.make_jaxpr(f)(logp, targets).jaxpr.eqns].count(
        "transpose"
    ) == 0
    # Same values under jit and the same gradient as take_along_axis.
    np.testing.assert_array_equal(jax.jit(f)(logp, targets).array, oracle)
    g = jax.grad(lambda lp: f(lp, targets).array.sum())(logp)
    g_ref = jax.grad(lambda lp: jnp.take_along_axis(lp, (targets % 7)[..., None], axis=-1).sum())(
        logp
    )
    np.testing.assert_array_equal(g, g_ref)


def test_batched_gather_with_new_axes_kept_axes_and_slices():
    rng = np.random.default_rng(4)
    src = jnp.asarray(rng.normal(size=(2, 5, 6, 3)), jnp.float32)  # (batch, seq, vocab, embed)
    x = named(src, ("batch", "seq", "vocab", "embed"))
    ids = jnp.asarray(rng.integers(0, 6, size=(4, 2)), jnp.int32)  # (k, batch)
    out = na.take(x, "vocab", named(ids, ("k", "batch")))
    # batch matched pointwise, k replaces vocab in place, seq and embed kept (take_along_axis).
    expected = jnp.take_along_axis(src[:, :, None], ids.T[:, None, :, None, None], axis=3)[
        :, :, :, 0
    ]
    same(out, expected, ("batch", "seq", "k", "embed"))
    # With a slice next to the gather, and mode / fill_value passed to JAX.
    sliced = x[{"seq": slice(1, 4), "vocab": named(ids, ("k", "batch"))}]
    same(sliced, expected[:, 1:4], ("batch", "seq", "k", "embed"))
    far = named(jnp.full((2,), 9, jnp.int32), ("batch",))
    filled = x.at[{"vocab": far}].get(mode="fill", fill_value=-1.0)
    same(filled, jnp.full((2, 5, 3), -1.0), ("batch", "seq", "embed"))
    same(x[{"vocab": far}], src[:, :, 5], ("batch", "seq", "embed"))  # clamped, as x[9] in JAX
    with pytest.raises(
        NamedTypeError,
        match=r"Unexpected keyword argument\(s\) 'moed' for a gather; accepted: 'mode'",
    ):
        x.at[{"vocab": far}].get(moed="fill")


def test_batched_gather_reads_a_slice_of_its_batch_axis(mesh_2x4):
    """A slice on a batch axis (matched pointwise with the index) selects the rows read, as
    take_along_axis on the sliced array does."""
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    src = jnp.arange(8 * 8.0).reshape(8, 8)  # (batch, vocab)
    ids = jnp.asarray(np.random.default_rng(6).integers(0, 6, size=(8, 2)), jnp.int32)
    starts = jnp.array([1, 0, 3, 2], jnp.int32)
    with jax.set_mesh(mesh_2x4):
        x = named(
            jax.device_put(src, NamedSharding(mesh_2x4, P("data", "model"))), ("batch", "vocab")
        )
        rev = x[{"batch": slice(None, None, -1), "vocab": named(ids, ("batch", "k"))}]
        part = x[{"batch": slice(2, 6), "vocab": named(ids[:4], ("batch", "k"))}]
        window = x[{"batch": slice(1, 8, 2), "vocab": na.ds(named(starts, "batch"), 2)}]
    same(rev, jnp.take_along_axis(src[::-1], ids, 1), ("batch", "k"))
    same(part, jnp.take_along_axis(src[2:6], ids[:4], 1), ("batch", "k"))
    expected = jnp.take_along_axis(src[1::2], starts[:, None] + jnp.arange(2)[None], 1)
    same(window, expected, ("batch", "vocab"))
    if mesh_2x4.axis_types[0] == AxisType.Explicit:  # a sliced axis is replicated first
        assert part.sharding.spec == P(None, None)


_COLLECTIVES = ("all-gather", "all-reduce", "collective-permute", "all-to-all", "reduce-scatter")


def _collectives(text):
    import re

    return {k: len(re.findall(rf"\b{k}(?:-start)?\(", text)) for k in _COLLECTIVES}


@pytest.mark.parametrize("vocab_spec", [None, "model"])
def test_take_loss_compiles_to_the_collectives_of_take_along_axis(mesh_2x4, vocab_spec):
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    explicit = mesh_2x4.axis_types[0] == AxisType.Explicit
    rng = np.random.default_rng(5)
    lp = jax.device_put(
        jnp.asarray(rng.normal(size=(8, 6, 16)), jnp.float32),
        NamedSharding(mesh_2x4, P("data", None, vocab_spec)),
    )
    t = jax.device_put(
        jnp.asarray(rng.integers(0, 16, size=(8, 6)), jnp.int32),
        NamedSharding(mesh_2x4, P("data", None)),
    )

    def plain(lp, t):
        def pick(lp, t):
            return jnp.take_along_axis(lp, t[..., None], axis=-1)[..., 0]

        if explicit:  # the gathered dimension may be split: XLA partitions it, as on Auto meshes
            pick = jax.sharding.auto_axes(pick, out_sharding=P("data", None))
        return -jnp.mean(pick(lp, t))

    def named_loss(lp, t):
        picked = na.take(named(lp, ("batch", "seq", "vocab")), "vocab", named(t, ("batch", "seq")))
        return -jnp.mean(picked.array)

    with jax.set_mesh(mesh_2x4):  # loss and gradient, as in a training step
        ref = jax.jit(jax.value_and_grad(plain)).lower(lp, t).compile()
        ours = jax.jit(jax.value_and_grad(named_loss)).lower(lp, t).compile()
        (v, g), (v_ref, g_ref) = ours(lp, t), ref(lp, t)
    assert _collectives(ours.as_text()) == _collectives(ref.as_text())
    # A split vocabulary is reduced where it lies (one all-reduce of the picked entries), never
    # gathered whole, on either mesh kind.
    assert _collectives(ours.as_text())["all-gather"] == 0
    np.testing.assert_allclose(v, v_ref, rtol=1e-6)
    np.testing.assert_allclose(g, g_ref, rtol=1e-6)


def test_take_errors(x):
    with pytest.raises(
        NamedTypeError,
        match=r"take\(\) needs integer indices for axis 'seq', got slice\(0, 2, None\)",
    ):
        na.take(x, "seq", slice(0, 2))
    with pytest.raises(AxisNotFoundError, match="Axis 'vocab' not found"):
        na.take(x, "vocab", 0)
    with pytest.raises(
        NamedTypeError,
        match=r"take\(\) needs a NamedArray for `x`, got ArrayImpl of shape \(2, 3, 4\)",
    ):
        na.take(A, "seq", 0)


# -- dynamic slice ----------------------------------------------------------------------------


def test_slice_matches_dynamic_slice(x):
    same(
        na.slice_axis(x, "embed", 1, 2),
        jax.lax.dynamic_slice_in_dim(A, 1, 2, axis=2),
        ("batch", "seq", "embed"),
    )
    f = jax.jit(lambda x, s: na.slice_axis(x, "seq", s, 2))
    for s in (0, 1):
        out = f(x, s)
        same(out, jax.lax.dynamic_slice(A, (0, s, 0), (2, 2, 4)), ("batch", "seq", "embed"))
        assert out.shape == {"batch": 2, "seq": 2, "embed": 4}
    # A traced start past the end is clamped, as in JAX.
    same(f(x, 5), A[:, 1:3], ("batch", "seq", "embed"))


def test_slice_grad(x):
    g = jax.grad(lambda a, s: na.slice_axis(named(a, x.axes), "seq", s, 2).array.sum())(A, 1)
    np.testing.assert_array_equal(g, jnp.zeros_like(A).at[:, 1:3].set(1.0))


def test_slice_errors(x):
    with pytest.raises(
        AxisSizeError,
        match=r"slice_axis\(\): start 2 with length 2 runs outside axis 'seq' of size 3 in NamedArray\(batch=2, seq=3, embed=4\). Use a start between 0 and 1",
    ):
        na.slice_axis(x, "seq", 2, 2)
    with pytest.raises(AxisSizeError, match=r"length 5 does not fit axis 'embed' of size 4"):
        jax.jit(lambda s: na.slice_axis(x, "embed", s, 5))(0)
    with pytest.raises(AxisSizeError, match="start -1 with length 1 runs outside"):
        na.slice_axis(x, "seq", -1, 1)
    with pytest.raises(NamedTypeError, match="length must be a static int"):
        jax.jit(lambda n: na.slice_axis(x, "seq", 0, n))(2)
    with pytest.raises(AxisNotFoundError, match="Axis 'time' not found"):
        na.slice_axis(x, "time", 0, 1)
    starts = named(jnp.array([0, 1]), "batch")
    with pytest.raises(
        NamedTypeError,
        match=r"slice_axis\(\): start for axis 'seq' must be one integer, got NamedArray\(batch=2\)\. "
        r"For one value per batch entry use x\[\{'seq': na\.ds\(start, 2\)\}\]",
    ):
        na.slice_axis(x, "seq", starts, 2)
    with pytest.raises(
        NamedTypeError,
        match=r"slice_axis\(\): start for axis 'seq' must be an int or a 0-d integer array, got "
        r"an array of shape \(\) and dtype float32",
    ):
        na.slice_axis(x, "seq", jnp.float32(1), 2)


def test_slice_axis_takes_a_0d_named_start_like_ds(x):
    start = na.argmax(named(jnp.array([0.0, 3.0, 1.0]), "c"))  # a 0-d NamedArray
    same(na.slice_axis(x, "seq", start, 2), x["seq", na.ds(start, 2)].array, x.axis_names)
    same(na.slice_axis(x, "seq", start, 2), A[:, 1:3], x.axis_names)
    f = jax.jit(lambda x, s: na.slice_axis(x, "seq", s, 2))
    same(f(x, start), A[:, 1:3], x.axis_names)


# -- .at[...] ---------------------------------------------------------------------------------


def test_at_set_scalar_and_named(x):
    same(x.at["seq", 0].set(-1.0), A.at[:, 0].set(-1.0), ("batch", "seq", "embed"))
    v = named(jnp.arange(4.0) * 10, ("embed",))  # broadcast over batch
    same(x.at["seq", 1].set(v), A.at[:, 1].set(jnp.arange(4.0) * 10), ("batch", "seq", "embed"))
    # Values in another axis order are aligned by name.
    w = jnp.arange(8.0).reshape(4, 2)
    same(
        x.at[{"seq": 2}].add(named(w, ("embed", "batch"))),
        A.at[:, 2].add(w.T),
        ("batch", "seq", "embed"),
    )
    same(x.at["embed", 1:3].multiply(2.0), A.at[:, :, 1:3].multiply(2.0), ("batch", "seq", "embed"))
    same(x.at["batch", 0].min(5.0), A.at[0].min(5.0), ("batch", "seq", "embed"))
    same(x.at["batch", 0].max(5.0), A.at[0].max(5.0), ("batch", "seq", "embed"))
    same(x.at["seq", 0:2].get(), A[:, 0:2], ("batch", "seq", "embed"))


def test_at_with_gather_indices(x):
    i = jnp.array([2, 0])
    ids = named(i, ("k",))
    vals = jnp.arange(16.0).reshape(2, 2, 4)  # (batch, k, embed) in A[:, i] layout
    same(
        x.at["seq", ids].set(named(vals, ("batch", "k", "embed"))),
        A.at[:, i].set(vals),
        ("batch", "seq", "embed"),
    )
    # Non-adjacent: NumPy layout is (k, seq); values are given by name in any order.
    j = jnp.array([3, 1])
    k = named(jnp.array([1, 0]), ("k",))
    v2 = jnp.arange(6.0).reshape(3, 2)  # (seq, k)
    out = x.at[{"batch": k, "embed": named(j, ("k",))}].add(named(v2, ("seq", "k")))
    same(out, A.at[jnp.array([1, 0]), :, j].add(v2.T), ("batch", "seq", "embed"))
    # Pointwise batch axis: scatter-add per batch row.
    pb = named(jnp.array([[0, 0], [2, 1]]), ("batch", "k"))
    out = x.at["seq", pb].add(1.0)
    expected = A.at[jnp.array([[0], [1]]), jnp.array([[0, 0], [2, 1]])].add(1.0)
    same(out, expected, ("batch", "seq", "embed"))


def test_at_under_jit_and_grad(x):
    f = jax.jit(lambda x, v: x.at["seq", 0].set(v))
    same(f(x, named(jnp.ones(2), ("batch",))), A.at[:, 0].set(1.0), ("batch", "seq", "embed"))
    g = jax.grad(lambda v: x.at["seq", 0].multiply(v).array.sum())(2.0)
    np.testing.assert_allclose(g, A[:, 0].sum())


def test_at_errors(x):
    with pytest.raises(
        AxisSizeError,
        match=r"x.at\[...\].set\(\): values NamedArray\(seq=3\) has axes \(seq=3\) that the selected region \(batch=2, embed=4\) does not have.*available axes: 'batch', 'embed'",
    ):
        x.at["seq", 0].set(named(jnp.ones(3), ("seq",)))
    with pytest.raises(AxisSizeError, match=r"has axes \(embed=3\)"):
        x.at["seq", 0].set(named(jnp.ones(3), ("embed",)))
    with pytest.raises(
        NamedTypeError,
        match=r"x.at\[...\].add\(\) got a plain array of shape \(2, 4\); the selected region has axes \(batch=2, embed=4\). Pass a scalar or a NamedArray, e.g. named\(v, \('batch', 'embed'\)\)",
    ):
        x.at["seq", 0].add(jnp.ones((2, 4)))
    with pytest.raises(AxisNotFoundError, match="Axis 'sq' not found"):
        x.at["sq", 0]


def test_gather_separated_indices_after_a_sliced_axis():
    # 4-d: gathers on 'b' and 'd' are separated by 'c', and 'a' comes first; NumPy puts the gathered
    # dims in front of 'a', we keep them at b's place.
    B = jnp.arange(2 * 3 * 4 * 5.0).reshape(2, 3, 4, 5)
    y = named(B, ("a", "b", "c", "d"))
    i, j = jnp.array([2, 0, 1]), jnp.array([4, 4, 0])
    sel = {"b": named(i, ("k",)), "d": named(j, ("k",))}
    assert B[:, i, :, j].shape == (3, 2, 4)
    same(y[sel], jnp.transpose(B[:, i, :, j], (1, 0, 2)), ("a", "k", "c"))
    v = jnp.arange(24.0).reshape(2, 3, 4)  # (a, k, c)
    same(
        y.at[sel].set(named(v, ("a", "k", "c"))),
        B.at[:, i, :, j].set(jnp.transpose(v, (1, 0, 2))),
        ("a", "b", "c", "d"),
    )
    # Adjacent gathers after 'a' stay in place in NumPy too.
    sel2 = {"b": named(i, ("k",)), "c": named(j - 1, ("k",))}
    same(y[sel2], B[:, i, j - 1], ("a", "k", "d"))


# -- sharded inputs (Auto and Explicit meshes) -----------------------------------------------------

B = jnp.arange(4 * 4 * 8.0).reshape(4, 4, 8)


def test_indexing_on_sharded_arrays(mesh_2x4):
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    explicit = mesh_2x4.axis_types[0] == AxisType.Explicit
    x = named(
        jax.device_put(B, NamedSharding(mesh_2x4, P("data", None, "model"))),
        ("batch", "seq", "embed"),
    )
    ids_np = np.array([[0, 3], [2, 2], [1, 0], [3, 1]])  # (batch, k)
    ids = named(jax.device_put(ids_np, NamedSharding(mesh_2x4, P("data", None))), ("batch", "k"))
    tok_np = np.array([[1, 3], [0, 2]])  # (b, s) token ids into 'batch' (as a vocab)
    tok = named(jax.device_put(tok_np, NamedSharding(mesh_2x4, P("data", None))), ("b", "s"))

    @jax.jit
    def f(x, ids, tok, start):
        return {
            "int_sharded": x["batch", 1],
            "slice_sharded": x["embed", 0:2],
            "pointwise": x["seq", ids],
            "lookup": na.take(x, "batch", tok),
            "dyn": na.slice_axis(x, "embed", start, 2),
            "set": x.at["batch", 1].set(named(jnp.ones(4), ("seq",))),
            "add_gather": x.at["seq", ids].add(1.0),
        }

    with jax.set_mesh(mesh_2x4):
        out = f(x, ids, tok, 3)
    same(out["int_sharded"], B[1], ("seq", "embed"))
    same(out["slice_sharded"], B[:, :, 0:2], ("batch", "seq", "embed"))
    same(
        out["pointwise"],
        jnp.take_along_axis(B, jnp.asarray(ids_np)[:, :, None], axis=1),
        ("batch", "k", "embed"),
    )
    same(out["lookup"], B[jnp.asarray(tok_np)], ("b", "s", "seq", "embed"))
    same(out["dyn"], B[:, :, 3:5], ("batch", "seq", "embed"))
    same(out["set"], B.at[1].set(1.0), ("batch", "seq", "embed"))
    expected = B.at[jnp.arange(4)[:, None], jnp.asarray(ids_np)].add(1.0)
    same(out["add_gather"], expected, ("batch", "seq", "embed"))
    if explicit:  # each output axis keeps the mesh axes it had, in x or in the index array
        assert out["int_sharded"].sharding.spec == P(None, "model")
        assert out["pointwise"].sharding.spec == P("data", None, "model")
        assert out["lookup"].sharding.spec == P("data", None, None, "model")
        assert out["dyn"].sharding.spec == P("data", None, None)
        assert out["set"].sharding.spec == P("data", None, "model")
        assert out["add_gather"].sharding.spec == P("data", None, "model")


def test_update_of_a_replicated_array_at_sharded_dynamic_starts(mesh_2x4):
    """x replicated, per-batch starts sharded over 'data': JAX cannot infer the scatter's result
    sharding on Explicit meshes; the update keeps x's (replicated), as on Auto meshes."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    starts = np.array([1, 3, 5, 7])
    with jax.set_mesh(mesh_2x4):
        x = na.zeros({"batch": 4, "seq": 16})
        pos = named(jax.device_put(starts, NamedSharding(mesh_2x4, P("data"))), "batch")
        out = x.at[{"seq": na.ds(pos, 2)}].set(na.ones({"seq": 2, "batch": 4}))
    expected = np.zeros((4, 16))
    for b, s in enumerate(starts):
        expected[b, s : s + 2] = 1.0
    same(out, expected, ("batch", "seq"))
    assert out.sharding.spec in (P(), P(None, None))


def test_embedding_lookup_keeps_sharded_ids_on_explicit_meshes():
    """take(table(vocab, embed), "vocab", ids(batch@data, seq)) on an Explicit mesh keeps
    the ids split (no all-gather), as plain JAX's table.at[ids].get(out_sharding=P('data')) does."""
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    table = np.arange(16 * 8, dtype=np.float32).reshape(16, 8)
    ids = np.arange(4 * 6, dtype=np.int32).reshape(4, 6) % 16
    with jax.set_mesh(mesh):
        t = na.named(
            jax.device_put(table, NamedSharding(mesh, P(None, "model"))), ("vocab", "embed")
        )
        i = na.named(jax.device_put(ids, NamedSharding(mesh, P("data", None))), ("batch", "seq"))
        f = jax.jit(lambda t, i: na.take(t, "vocab", i).array)
        out = f(t, i)
        hlo = f.lower(t, i).compile().as_text()
    np.testing.assert_array_equal(np.asarray(out), table[ids])
    assert tuple(out.sharding.spec) == ("data", None, "model")
    assert not any(
        op in hlo for op in ("all-gather", "all-reduce", "all-to-all", "collective-permute")
    )
