"""dot and einsum against jnp.einsum; axis order, batch axes, ellipsis, and error messages."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import namedaxes as na
from namedaxes import Axis

RNG = np.random.default_rng(2)


def _r(*shape):
    return jnp.asarray(RNG.normal(size=shape).astype(np.float32))


X = _r(2, 3)  # (batch, embed)
W = _r(4, 3)  # (mlp, embed)
x = na.named(X, ("batch", "embed"))
w = na.named(W, ("mlp", "embed"))


def test_dot_contracts_by_name_whatever_the_positions():
    out = na.dot(x, w, axis="embed")
    assert out.axis_names == ("batch", "mlp")
    np.testing.assert_allclose(out.array, X @ W.T, rtol=1e-5)
    assert na.dot(w, x, axis=Axis("embed", 3)).axis_names == ("mlp", "batch")


def test_dot_keeps_shared_uncontracted_axes_once():
    q = na.named(_r(2, 4, 5, 3), ("batch", "heads", "seq", "dim"))
    k = na.named(_r(2, 6, 4, 3), ("batch", "key", "heads", "dim"))
    out = na.dot(q, k, axis="dim")
    assert out.axis_names == ("batch", "heads", "seq", "key")
    np.testing.assert_allclose(
        out.array, jnp.einsum("bhsd,bkhd->bhsk", q.array, k.array), rtol=1e-5
    )


def test_dot_over_several_axes_and_several_operands():
    a = na.named(_r(2, 3, 4), ("batch", "seq", "embed"))
    b = na.named(_r(4, 3), ("embed", "seq"))
    c = na.named(_r(2, 5), ("batch", "out"))
    out = na.dot(a, b, c, axis=("seq", "embed"))
    assert out.axis_names == ("batch", "out")
    np.testing.assert_allclose(
        out.array, jnp.einsum("bse,es,bo->bo", a.array, b.array, c.array), rtol=1e-5
    )
    total = na.dot(a, b, axis=None)
    assert total.axis_names == ("batch", "seq", "embed")  # elementwise over shared axes
    np.testing.assert_allclose(total.array, a.array * b.array.T[None], rtol=1e-6)


def test_dot_axis_none_is_an_outer_product():
    u = na.named(_r(2), "a")
    v = na.named(_r(3), "b")
    out = na.dot(u, v, axis=None)
    assert out.axis_names == ("a", "b")
    np.testing.assert_allclose(out.array, jnp.outer(u.array, v.array), rtol=1e-6)
    assert na.dot(u, v, axis=()).axis_names == ("a", "b")


def test_dot_axis_in_one_operand_is_summed_and_all_axes_gives_a_scalar():
    out = na.dot(x, w, axis=("embed", "mlp"))
    assert out.axis_names == ("batch",)
    np.testing.assert_allclose(out.array, (X @ W.T).sum(axis=1), rtol=1e-5)
    full = na.dot(x, w, axis=("batch", "embed", "mlp"))
    assert full.axes == () and full.item() == pytest.approx(float((X @ W.T).sum()), rel=1e-5)


def test_dot_preferred_element_type_and_precision():
    a = na.named(jnp.full((2, 3), 100, jnp.int8), ("batch", "embed"))
    b = na.named(jnp.full((3,), 100, jnp.int8), "embed")
    out = na.dot(a, b, axis="embed", preferred_element_type=jnp.int32)
    assert out.dtype == jnp.int32 and out.array.tolist() == [30000, 30000]
    hi = na.dot(x, w, axis="embed", precision=jax.lax.Precision.HIGHEST)
    np.testing.assert_allclose(hi.array, X @ W.T, rtol=1e-6)


def test_einsum_matches_jnp():
    out = na.einsum("batch embed, mlp embed -> batch mlp", x, w)
    np.testing.assert_allclose(out.array, jnp.einsum("be,me->bm", X, W), rtol=1e-5)
    # Specs name axes in any order; the right side fixes the result's order.
    out = na.einsum("embed batch, embed mlp -> mlp batch", x, w)
    assert out.axis_names == ("mlp", "batch")
    np.testing.assert_allclose(out.array, jnp.einsum("be,me->mb", X, W), rtol=1e-5)
    trace = na.einsum("batch embed ->", x)
    assert trace.axes == () and trace.item() == pytest.approx(float(X.sum()), rel=1e-5)


def test_einsum_ellipsis():
    a = na.named(_r(2, 5, 3), ("batch", "seq", "embed"))
    out = na.einsum("... embed, mlp embed -> ... mlp", a, w)
    assert out.axis_names == ("batch", "seq", "mlp")
    np.testing.assert_allclose(out.array, jnp.einsum("bse,me->bsm", a.array, W), rtol=1e-5)
    front = na.einsum("embed ..., mlp embed -> mlp ...", a, w)
    assert front.axis_names == ("mlp", "batch", "seq")
    summed = na.einsum("... embed, mlp embed -> mlp", a, w)  # '...' axes not kept: summed
    np.testing.assert_allclose(summed.array, jnp.einsum("bse,me->m", a.array, W), rtol=1e-4)
    named_too = na.einsum("... embed, mlp embed -> seq ... mlp", a, w)
    assert named_too.axis_names == ("seq", "batch", "mlp")


def test_einsum_with_a_scalar_operand():
    s = na.named(jnp.float32(2.0), ())
    out = na.einsum(", batch embed -> embed", s, x)
    np.testing.assert_allclose(out.array, 2 * X.sum(axis=0), rtol=1e-5)


def test_jit_and_grad():
    def loss(x, w):
        return na.sum(
            na.einsum("batch embed, mlp embed -> batch mlp", x, w) ** 2 + na.dot(x, w, axis="embed")
        ).array

    def loss_ref(X, W):
        return jnp.sum((X @ W.T) ** 2 + X @ W.T)

    np.testing.assert_allclose(jax.jit(loss)(x, w), loss_ref(X, W), rtol=1e-5)
    gx, gw = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w)
    rx, rw = jax.grad(loss_ref, argnums=(0, 1))(X, W)
    assert gx.axes == x.axes and gw.axes == w.axes
    np.testing.assert_allclose(gx.array, rx, rtol=1e-5)
    np.testing.assert_allclose(gw.array, rw, rtol=1e-5)


def test_dot_errors():
    with pytest.raises(
        na.AxisNotFoundError,
        match=r"dot\(\) cannot contract axis 'embd': no operand has it\. Available axes: 'batch', 'embed', 'mlp'\.",
    ):
        na.dot(x, w, axis="embd")
    with pytest.raises(
        na.AxisSizeError,
        match=r"dot\(\): axis 'embed' has size 3 in operand 1 NamedArray\(batch=2, embed=3\) but size 5 in operand 2 NamedArray\(embed=5\)\. One name must have one size",
    ):
        na.dot(x, na.named(_r(5), "embed"), axis="embed")
    with pytest.raises(
        na.AxisSizeError,
        match=r"dot\(\) was asked to contract Axis\('embed', 4\), but the operands' 'embed' has size 3",
    ):
        na.dot(x, w, axis=Axis("embed", 4))
    with pytest.raises(
        na.NamedTypeError,
        match=r"dot\(\) operand 2 must be a NamedArray, got ArrayImpl of shape \(3, 4\); wrap it with named\(x, \(\.\.\.\)\) first",
    ):
        na.dot(x, jnp.ones((3, 4)), axis="embed")
    with pytest.raises(
        na.NamedTypeError,
        match=r"dot\(\) operand 1 must be a NamedArray, got float; multiply by a scalar",
    ):
        na.dot(2.0, x, axis=None)
    with pytest.raises(na.NamedTypeError, match=r"dot\(\) needs at least one NamedArray operand"):
        na.dot(axis="embed")
    with pytest.raises(na.DuplicateAxisError, match=r"Duplicate axis names 'embed'"):
        na.dot(x, w, axis=("embed", "embed"))
    with pytest.raises(TypeError, match=r"missing 1 required keyword-only argument: 'axis'"):
        na.dot(x, w)


def test_einsum_errors():
    with pytest.raises(
        na.AxisError,
        match=r"einsum\(\) needs an equation with exactly one '->', got 'batch embed, mlp embed'",
    ):
        na.einsum("batch embed, mlp embed", x, w)
    with pytest.raises(
        na.AxisError,
        match=r"einsum\(\) equation 'batch embed -> batch' has 1 operand spec\(s\) but 2 array\(s\) were given",
    ):
        na.einsum("batch embed -> batch", x, w)
    with pytest.raises(
        na.AxisNotFoundError,
        match=r"einsum\(\) operand 2 spec 'mlp embd' names axis 'embd', which NamedArray\(mlp=4, embed=3\) does not have\. Available axes: 'mlp', 'embed'\.",
    ):
        na.einsum("batch embed, mlp embd -> batch", x, w)
    with pytest.raises(
        na.AxisError,
        match=r"einsum\(\) operand 1 NamedArray\(batch=2, embed=3\) has axes 'embed' that its spec 'batch' does not name\. Name them, or add '\.\.\.'",
    ):
        na.einsum("batch, mlp embed -> batch", x, w)
    with pytest.raises(
        na.AxisNotFoundError,
        match=r"einsum\(\) result spec 'batch heads' names axis 'heads', which no operand has\. Available axes: 'batch', 'embed', 'mlp'\.",
    ):
        na.einsum("batch embed, mlp embed -> batch heads", x, w)
    with pytest.raises(
        na.AxisError,
        match=r"einsum\(\): operand 1 spec '\.\.\. batch \.\.\.' has more than one '\.\.\.'",
    ):
        na.einsum("... batch ..., mlp embed -> batch", x, w)
    with pytest.raises(na.DuplicateAxisError, match=r"Duplicate axis names 'batch'"):
        na.einsum("batch embed, mlp embed -> batch batch", x, w)
    with pytest.raises(
        na.AxisSizeError,
        match=r"einsum\(\): axis 'embed' has size 3 in operand 1 .* but size 5 in operand 2",
    ):
        na.einsum("batch embed, embed -> batch", x, na.named(_r(5), "embed"))


def test_dot_over_a_sharded_axis_keeps_the_other_axes_sharding(mesh_2x4):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    a, b = _r(8, 12), _r(12, 4)
    with jax.set_mesh(mesh_2x4):
        x = na.named(
            jax.device_put(a, NamedSharding(mesh_2x4, P("data", "model"))), ("batch", "embed")
        )
        y = na.named(jax.device_put(b, NamedSharding(mesh_2x4, P("model", None))), ("embed", "mlp"))
        out = na.dot(x, y, axis="embed")  # Explicit: JAX needs an out_sharding; we give it by name
        via_einsum = na.einsum("batch embed, embed mlp -> mlp batch", x, y)
        chosen = na.dot(x, y, axis="embed", out_sharding=NamedSharding(mesh_2x4, P(None, None)))
    np.testing.assert_allclose(out.array, a @ b, rtol=1e-4)
    np.testing.assert_allclose(via_einsum.array, (a @ b).T, rtol=1e-4)
    spec = tuple(out.sharding.spec) + (None,) * 2
    assert spec[:2] == ("data", None)
    assert {s.data.shape for s in out.array.addressable_shards} == {(4, 4)}
    if mesh_2x4.axis_types[0] == jax.sharding.AxisType.Explicit:  # JAX honours it on Explicit axes
        assert {s.data.shape for s in chosen.array.addressable_shards} == {(8, 4)}


def test_conflicting_explicit_shardings_in_dot_follow_the_mapping_in_force(mesh_2x4):
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    explicit = mesh_2x4.axis_types[0] == AxisType.Explicit
    a, b, c = _r(8, 12), _r(12, 8), _r(8, 12)
    put = lambda v, *spec: jax.device_put(v, NamedSharding(mesh_2x4, P(*spec)))  # noqa: E731
    x = na.named(put(a, "data"), ("batch", "embed"))
    w_wrong = na.named(put(b, None, "data"), ("embed", "mlp"))  # data would shard batch and mlp
    y = na.named(put(c, "model"), ("batch", "embed"))  # batch on model here, on data in x
    with jax.set_mesh(mesh_2x4):
        with na.axis_mapping({"batch": "data", "mlp": "model"}):
            out = jax.jit(lambda x, w: na.dot(x, w, axis="embed"))(x, w_wrong)
            rows = jax.jit(lambda x, y: na.dot(x, y, axis="embed"))(x, y)
        if explicit:
            with pytest.raises(
                na.ShardingError,
                match=r"dot\(\): the operands' shardings conflict on an Explicit mesh: mesh axis 'data' shards 'batch' in operand 1 and 'mlp' in operand 2",
            ):
                na.dot(x, w_wrong, axis="embed")
            with pytest.raises(
                na.ShardingError,
                match=r"einsum\(\): .*axis 'batch' is sharded over \('data',\) in operand 1 but over \('model',\) in operand 2",
            ):
                na.einsum("batch embed, batch embed -> batch", x, y)
    np.testing.assert_allclose(out.array, a @ b, rtol=1e-4)
    np.testing.assert_allclose(rows.array, (a * c).sum(axis=1), rtol=1e-4)
    if explicit:
        assert tuple(out.sharding.spec) == ("data", "model")
        assert tuple(rows.sharding.spec) == ("data",)


def test_fsdp_stored_weights_run_unchanged_on_auto_and_explicit(mesh_2x4):
    """A layer whose parameters are stored by a parameter mapping (embed on data) and computed
    under the compute mapping (batch on data, mlp on model): the Levanter habit."""

    params_mapping = {"embed": "data", "mlp": "model"}
    compute_mapping = {"batch": "data", "mlp": "model"}
    X, W1, B1, W2 = _r(8, 4, 16), _r(16, 8), _r(16), _r(8, 16)
    with jax.set_mesh(mesh_2x4):
        params = na.shard(
            {
                "w1": na.named(W1, ("embed", "mlp")),
                "b1": na.named(B1, "embed"),
                "w2": na.named(W2, ("mlp", "embed")),
            },
            params_mapping,
        )
        x = na.shard(na.named(X, ("batch", "seq", "embed")), compute_mapping)

        @jax.jit
        def layer(params, x):
            with na.axis_mapping(compute_mapping):
                h = x + params["b1"]  # (batch@data) + (embed@data)
                h = na.relu(na.dot(h, params["w1"], axis="embed"))
                mask = na.arange({"seq": 4}) < 3
                h = na.where(mask, h, 0.0)
                return na.dot(h, params["w2"], axis="mlp")

        out = layer(params, x)
    h = jnp.maximum(jnp.einsum("bse,em->bsm", X + B1[None, None], W1), 0.0)
    h = jnp.where((jnp.arange(4) < 3)[None, :, None], h, 0.0)
    np.testing.assert_allclose(out.array, jnp.einsum("bsm,me->bse", h, W2), rtol=1e-4, atol=1e-5)
    assert out.axis_names == ("batch", "seq", "embed")
    assert tuple(out.sharding.spec)[:1] == ("data",)


def test_explicit_result_sharding_is_by_name_not_result_order():
    """With a sharded contracted axis, a contraction's result sharding comes from resolve
    over the operands' shardings, so each result axis keeps its mesh axes whatever the order."""
    P = jax.sharding.PartitionSpec
    mesh = jax.make_mesh(
        (2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Explicit,) * 2
    )
    with jax.set_mesh(mesh):
        x = jax.device_put(jnp.ones((4, 8)), jax.sharding.NamedSharding(mesh, P("data", "model")))
        w = jax.device_put(jnp.ones((8, 6)), jax.sharding.NamedSharding(mesh, P("model", None)))
        x, w = na.named(x, ("batch", "embed")), na.named(w, ("embed", "mlp"))
        bm = na.einsum("batch embed, embed mlp -> batch mlp", x, w)
        mb = na.einsum("batch embed, embed mlp -> mlp batch", x, w)
    assert tuple(bm.array.sharding.spec) == ("data", None)
    assert tuple(mb.array.sharding.spec) == (None, "data")
    np.testing.assert_allclose(np.asarray(mb.array), np.full((6, 4), 8.0))


def test_contractions_keep_the_layout_of_an_operand_with_every_result_axis():
    """DESIGN's layout rule, as for `s * x`: the first operand with every result axis gives the
    result's order; otherwise first-appearance order. Orders the user writes never change."""
    A, S = _r(2, 3, 4), _r(3, 2)
    big = na.named(A, ("batch", "seq", "embed"))
    small = na.named(S, ("seq", "batch"))
    outer = na.dot(small, big, axis=None)
    assert outer.axis_names == (small * big).axis_names == ("batch", "seq", "embed")
    np.testing.assert_allclose(outer.array, S.T[:, :, None] * A, rtol=1e-6)
    summed = na.dot(small, big, axis="embed")  # both have (seq, batch): the first one's order
    assert summed.axis_names == ("seq", "batch")
    np.testing.assert_allclose(summed.array, jnp.einsum("sb,bse->sb", S, A), rtol=1e-5)
    assert na.dot(big, small, axis="embed").axis_names == ("batch", "seq")
    assert na.einsum("-> ...", small, big).axis_names == ("batch", "seq", "embed")
    assert na.einsum("{embed} ->", small, big).axis_names == ("seq", "batch")
    assert na.einsum("-> embed ...", small, big).axis_names == ("embed", "batch", "seq")
    assert na.einsum("..., ... -> ...", small, big).axis_names == ("batch", "seq", "embed")
    assert na.dot(small, big, axis=None, out_axes=("embed", ...)).axis_names == (
        "embed",
        "batch",
        "seq",
    )
    # No operand has every result axis: first-appearance order, as before.
    assert na.dot(small, na.named(_r(4, 5), ("embed", "mlp")), axis=None).axis_names == (
        "seq",
        "batch",
        "embed",
        "mlp",
    )
    # Written orders are the user's.
    written = na.einsum("seq batch, batch seq embed -> seq batch embed", small, big)
    assert written.axis_names == ("seq", "batch", "embed")
    assert na.einsum("-> seq batch embed", small, big).axis_names == ("seq", "batch", "embed")


def test_dot_out_axes_is_checked():
    assert na.dot(x, w, axis="embed", out_axes=(Axis("mlp", 4), ...)).axis_names == (
        "mlp",
        "batch",
    )
    with pytest.raises(
        na.AxisSizeError,
        match=r"dot\(\): out_axes asks for Axis\('mlp', 99\), but the result's 'mlp' has size 4\. "
        r"Give the size it has, or the name alone: out_axes=\('mlp', \.\.\.\)\.",
    ):
        na.dot(x, w, axis="embed", out_axes=(Axis("mlp", 99), ...))
    for bad, shown in [
        ({"mlp", "batch"}, r"\{'\w+', '\w+'\}"),
        (0, "0"),
        ((0, ...), r"\(0, Ellipsis\)"),
    ]:
        with pytest.raises(
            na.NamedTypeError,
            match=r"dot\(\): out_axes gives the result's axis order: axis names or Axis objects in "
            rf"a tuple or list, with at most one \.\.\., got {shown}; e\.g\. out_axes=\('mlp', \.\.\.\)\.",
        ):
            na.dot(x, w, axis="embed", out_axes=bad)


def test_einsum_ellipsis_glued_to_a_name_says_to_add_a_space():
    with pytest.raises(
        na.AxisError,
        match=r"einsum\(\): operand 1 spec '\.\.\.embed' has '\.\.\.embed'; separate '\.\.\.' "
        r"from axis names with spaces: '\.\.\. embed'\.",
    ):
        na.einsum("...embed, mlp embed -> ... mlp", x, w)
    with pytest.raises(
        na.AxisError, match=r"result spec 'mlp\.\.\.' has 'mlp\.\.\.'.*'mlp \.\.\.'"
    ):
        na.einsum("-> mlp...", x, w)


def test_dot_refuses_an_array_that_jax_vmap_relabelled():
    """dot/einsum check their operands' layout as the other named ops do."""
    x = na.named(jnp.arange(6.0).reshape(2, 3), ("batch", "embed"))
    relabelled = jax.vmap(lambda t: jax.tree.map(lambda v: v * 1, t), in_axes=1)(x)
    with pytest.raises(na.AxisError, match=r"do not match its array's shape \(3, 2\)"):
        na.dot(relabelled, x, axis="embed")
