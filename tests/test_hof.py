"""vmap / scan / fold over named axes, checked against jax.vmap and jax.lax.scan."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import namedaxes as na
from namedaxes import (
    Axis,
    AxisNotFoundError,
    AxisSizeError,
    DuplicateAxisError,
    NamedTypeError,
    named,
)

A = jnp.arange(24.0).reshape(2, 3, 4) / 10


def close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)


# -- vmap -------------------------------------------------------------------------------------


def test_vmap_maps_named_axis_wherever_it_is():
    x = named(A, ("seq", "batch", "embed"))  # batch in the middle
    w = named(jnp.arange(4.0), ("embed",))  # no batch axis: broadcast
    seen = []

    def f(x, w, scale, plain):
        seen.append((x.axis_names, w.axis_names))
        return named(jnp.sum(x.array * w.array[None], axis=-1) * scale + plain, ("seq",))

    out = na.vmap(f, "batch")(x, w, 2.0, jnp.ones(2))
    expected = jax.vmap(
        lambda a: jnp.sum(a * jnp.arange(4.0)[None], axis=-1) * 2.0 + jnp.ones(2), in_axes=1
    )(A)
    assert seen[0] == (("seq", "embed"), ("embed",))
    assert out.axis_names == ("batch", "seq")
    close(out.array, expected)


def test_vmap_pytrees_kwargs_and_plain_outputs():
    x = named(A, ("batch", "seq", "embed"))
    y = named(jnp.transpose(A, (2, 0, 1)), ("embed", "batch", "seq"))

    def f(tree, *, bias):
        a, b = tree["a"], tree["b"]
        assert b.axis_names == ("embed", "seq")
        total = a.array + b.array.T + bias.array
        return {"named": named(total, ("seq", "embed")), "plain": total.sum(), "none": None}

    bias = named(jnp.ones((3, 4)), ("seq", "embed"))
    out = na.vmap(f, Axis("batch", 2))({"a": x, "b": y}, bias=bias)
    assert out["named"].axis_names == ("batch", "seq", "embed")
    close(out["named"].array, 2 * A + 1)
    assert out["plain"].shape == (2,)  # plain outputs get the axis as dimension 0
    close(out["plain"], (2 * A + 1).sum(axis=(1, 2)))
    assert out["none"] is None


def test_vmap_axis_object_without_inputs():
    out = na.vmap(lambda c: named(jnp.full((3,), c), ("k",)), Axis("rep", 2))(1.5)
    assert out.shape == {"rep": 2, "k": 3}
    close(out.array, jnp.full((2, 3), 1.5))


def test_vmap_under_jit_and_grad():
    x = named(A, ("batch", "seq", "embed"))

    def loss(a):
        y = na.vmap(lambda r: named(jnp.tanh(r.array).sum(axis=0), ("embed",)), "batch")(
            named(a, x.axes)
        )
        return (y.array**2).sum()

    def ref(a):
        return (jax.vmap(lambda r: jnp.tanh(r).sum(axis=0))(a) ** 2).sum()

    close(jax.jit(loss)(A), ref(A))
    close(jax.jit(jax.grad(loss))(A), jax.grad(ref)(A))


def test_vmap_errors():
    x = named(A, ("batch", "seq", "embed"))
    z = named(jnp.zeros((3, 4)), ("batch", "embed"))
    with pytest.raises(
        AxisNotFoundError,
        match=r"vmap\(\) over axis 'time': no NamedArray in the arguments has that axis \(args/0: \(batch=2, seq=3, embed=4\)\)",
    ):
        na.vmap(lambda x: x, "time")(x)
    with pytest.raises(
        AxisSizeError,
        match=r"vmap\(\) over axis 'batch': the axis has different sizes in the arguments \(args/0: 2, kwargs/z/w: 3\)",
    ):
        na.vmap(lambda x, z: x, "batch")(x, z={"w": z})
    with pytest.raises(AxisSizeError, match=r"args/0: 2, requested Axis: 5"):
        na.vmap(lambda x: x, Axis("batch", 5))(x)
    with pytest.raises(
        DuplicateAxisError, match=r"vmap\(\) over axis 'batch': output already has an axis 'batch'"
    ):
        na.vmap(lambda x: named(x.array, ("batch", "embed")), "batch")(x)
    with pytest.raises(NamedTypeError, match=r"vmap\(\) needs a callable"):
        na.vmap("f", "batch")


# -- scan / fold ------------------------------------------------------------------------------


def step(carry, x):
    """carry (embed,) ; x (seq, embed) -> new carry, y (seq,)."""
    c = named(jnp.tanh(carry.array + x.array.sum(axis=0)), ("embed",))
    y = named(x.array @ c.array, ("seq",))
    return c, {"y": y, "plain": c.array.sum()}


def ref_step(c, a):  # a: (seq, embed)
    c = jnp.tanh(c + a.sum(axis=0))
    return c, {"y": a @ c, "plain": c.sum()}


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_matches_lax_scan(reverse):
    xs = named(A, ("seq", "time", "embed"))  # scanned axis in the middle
    init = named(jnp.zeros(4), ("embed",))
    carry, ys = na.scan(step, "time", reverse=reverse, unroll=2)(init, xs)
    ref_c, ref_ys = jax.lax.scan(ref_step, jnp.zeros(4), jnp.moveaxis(A, 1, 0), reverse=reverse)
    assert carry.axis_names == ("embed",)
    close(carry.array, ref_c)
    assert ys["y"].axis_names == ("time", "seq")
    close(ys["y"].array, ref_ys["y"])
    close(ys["plain"], ref_ys["plain"])


def test_scan_broadcasts_leaves_without_the_axis():
    xs = {
        "a": named(A, ("time", "seq", "embed")),
        "w": named(jnp.arange(4.0), ("embed",)),
        "k": 3.0,
    }

    def f(c, x):
        assert x["w"].axis_names == ("embed",)
        return named(c.array + x["a"].array @ x["w"].array * x["k"], ("seq",)), None

    carry, ys = na.scan(f, "time")(named(jnp.zeros(3), ("seq",)), xs)
    close(carry.array, (A @ jnp.arange(4.0)).sum(axis=0) * 3.0)
    assert ys is None


def test_scan_and_fold_under_jit_and_grad():
    def loss(a):
        xs = named(a, ("time", "seq", "embed"))
        c = na.fold(lambda c, x: step(c, x)[0], "time")(named(jnp.ones(4), ("embed",)), xs)
        return c.array.sum()

    def ref(a):
        return jax.lax.scan(lambda c, x: (ref_step(c, x)[0], None), jnp.ones(4), a)[0].sum()

    close(jax.jit(loss)(A), ref(A))
    close(jax.jit(jax.grad(loss))(A), jax.grad(ref)(A))


def test_scan_errors():
    xs = named(A, ("time", "seq", "embed"))
    init = named(jnp.zeros(4), ("embed",))
    with pytest.raises(
        AxisNotFoundError,
        match=r"scan\(\) over axis 'layer': no NamedArray in xs has that axis \(xs: \(time=2, seq=3, embed=4\)\)",
    ):
        na.scan(step, "layer")(init, xs)
    with pytest.raises(
        AxisNotFoundError,
        match=r"fold\(\) over axis 'layer': no NamedArray in xs has that axis \(no NamedArrays at all\)",
    ):
        na.fold(lambda c, x: c, "layer")(init, {"a": A})
    bad = {"a": xs, "b": named(jnp.zeros((3, 4)), ("time", "embed"))}
    with pytest.raises(
        AxisSizeError,
        match=r"scan\(\) over axis 'time': the axis has different sizes in xs \(xs/a: 2, xs/b: 3\)",
    ):
        na.scan(step, "time")(init, bad)
    with pytest.raises(
        NamedTypeError,
        match=r"scan\(\) over axis 'time': fn must return a \(carry, y\) pair, got NamedArray",
    ):
        na.scan(lambda c, x: c, "time")(init, xs)
    with pytest.raises(
        NamedTypeError,
        match=r"fold\(\) over axis 'time': fn must return a carry with the same structure and axes as init. At <root>: init is NamedArray\(embed=4\), fn returned NamedArray\(seq=3\)",
    ):
        na.fold(lambda c, x: named(x.array.sum(axis=1), ("seq",)), "time")(init, xs)
    with pytest.raises(NamedTypeError, match=r"init has structure PyTreeDef"):
        na.fold(lambda c, x: (c, c), "time")(init, xs)
    with pytest.raises(
        DuplicateAxisError, match=r"scan\(\) over axis 'time': y already has an axis 'time'"
    ):
        na.scan(lambda c, x: (c, named(jnp.zeros(1), ("time",))), "time")(init, xs)


def test_carry_returned_in_another_axis_order_is_transposed_back():
    """A carry with init's axes in another order (as dot returns it) is the same carry by name."""
    ws = named(jnp.arange(2 * 3 * 3.0).reshape(2, 3, 3) / 10, ("layer", "embed", "out"))
    init = named(jnp.arange(4 * 3.0).reshape(4, 3), ("batch", "embed"))

    def layer(h, w):  # dot gives (out, batch) here; rename out -> embed
        return na.rename(na.dot(w, h, axis="embed"), {"out": "embed"})

    out = na.fold(layer, "layer")(init, ws)
    ref = init.array
    for w in ws.array:
        ref = ref @ w
    assert out.axis_names == ("batch", "embed")
    close(out.array, ref)
    carry, ys = na.scan(lambda c, x: (na.rearrange(c + x, ("embed", "batch")), c), "layer")(
        init, named(jnp.ones((2, 3)), ("layer", "embed"))
    )
    assert carry.axis_names == ("batch", "embed") and ys.axis_names == ("layer", "batch", "embed")
    close(carry.array, init.array + 2.0)


def test_carry_that_changes_dtype_or_axis_sizes_is_refused_by_leaf():
    init = {"h": named(jnp.zeros((2, 3)), ("batch", "embed"))}
    xs = named(jnp.ones((4, 3)), ("layer", "embed"))
    with pytest.raises(
        NamedTypeError,
        match=r"fold\(\) over axis 'layer': the carry's dtype must stay the same\. At h: init is "
        r"float32, fn returned bfloat16\. Cast it inside fn, e.g\. \.astype\('float32'\)",
    ):
        na.fold(lambda c, x: {"h": (c["h"] + x).astype(jnp.bfloat16)}, "layer")(init, xs)
    with pytest.raises(
        NamedTypeError,
        match=r"fold\(\) over axis 'layer': fn must return a carry with the same structure and axes "
        r"as init\. At h: init is NamedArray\(batch=2, embed=3\), fn returned "
        r"NamedArray\(embed=3, batch=1\)",
    ):
        na.fold(
            lambda c, x: {"h": na.rearrange(c["h"], ("embed", "batch"))["batch", 0:1]}, "layer"
        )(init, xs)
    # A weakly typed init (a Python scalar) is promoted by lax.scan, as before.
    total = na.fold(lambda c, x: c + x.array.sum(), "layer")(0.0, xs)
    close(total, 12.0)


# -- stacked layers (the use scan/fold exist for) ----------------------------------------------


class Layer(eqx.Module):
    w1: na.NamedArray  # (embed, hidden)
    w2: na.NamedArray  # (hidden, embed)
    act: callable = eqx.field(static=True)

    def __call__(self, h):
        a = self.act(h.array @ self.w1.array)
        return named(h.array + a @ self.w2.array, h.axes)


def make_stack(n_layers):
    rng = np.random.default_rng(0)
    w1 = jnp.asarray(rng.normal(size=(n_layers, 4, 5)) * 0.3, jnp.float32)
    w2 = jnp.asarray(rng.normal(size=(n_layers, 5, 4)) * 0.3, jnp.float32)
    # Stored with the layer axis *not* first, to check it is found by name.
    return Layer(
        w1=named(jnp.moveaxis(w1, 0, 1), ("embed", "layer", "hidden")),
        w2=named(w2, ("layer", "hidden", "embed")),
        act=jax.nn.relu,
    ), (w1, w2)


def test_fold_over_stacked_layers_matches_python_loop():
    stack, (w1, w2) = make_stack(3)
    h0 = named(jnp.linspace(-1, 1, 8).reshape(2, 4), ("batch", "embed"))

    def apply(stack, h):
        return na.fold(lambda h, layer: layer(h), "layer")(h, stack)

    def ref(w1, w2, h):
        for i in range(3):
            h = h + jax.nn.relu(h @ w1[i]) @ w2[i]
        return h

    out = eqx.filter_jit(apply)(stack, h0)
    assert out.axis_names == ("batch", "embed")
    close(out.array, ref(w1, w2, h0.array))

    # Gradients w.r.t. the stacked weights come back with the stacked axes.
    grads = eqx.filter_jit(eqx.filter_grad(lambda s, h: apply(s, h).array.sum()))(stack, h0)
    rw1, rw2 = jax.jit(jax.grad(lambda a, b: ref(a, b, h0.array).sum(), argnums=(0, 1)))(w1, w2)
    assert grads.w1.axis_names == ("embed", "layer", "hidden")
    close(grads.w1.array, jnp.moveaxis(rw1, 0, 1))
    close(grads.w2.array, rw2)

    # scan collects per-layer activations with the layer axis first.
    _, hs = eqx.filter_jit(na.scan(lambda h, layer: (layer(h), layer(h)), "layer"))(h0, stack)
    assert hs.shape == {"layer": 3, "batch": 2, "embed": 4}
    close(hs.array[-1], out.array)


# -- sharded inputs (Auto and Explicit meshes) -----------------------------------------------------


def test_vmap_and_scan_over_sharded_axes(mesh_2x4):
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    explicit = mesh_2x4.axis_types[0] == AxisType.Explicit
    B = jnp.arange(4 * 2 * 8.0).reshape(4, 2, 8) / 10
    x = named(
        jax.device_put(B, NamedSharding(mesh_2x4, P("data", None, "model"))),
        ("batch", "seq", "embed"),
    )

    @jax.jit
    def f(x):
        rows = na.vmap(lambda r: named(jnp.tanh(r.array), r.axes), "batch")(x)

        # Scan over the sharded batch axis, carrying a per-embed sum (replicated carry).
        def step(c, r):
            total = named(c.array + jax.sharding.reshard(r.array.sum(axis=0), P()), c.axes)
            return total, named(r.array[0], ("embed",))

        carry, ys = na.scan(step, "batch")(named(jnp.zeros(8), ("embed",)), x)
        return rows, carry, ys

    with jax.set_mesh(mesh_2x4):
        rows, carry, ys = f(x)
    same_rows = jax.vmap(jnp.tanh)(B)
    close(rows.array, same_rows)
    assert rows.axis_names == ("batch", "seq", "embed")
    close(carry.array, B.sum(axis=(0, 1)))
    close(ys.array, B[:, 0])
    assert ys.axis_names == ("batch", "embed")
    if explicit:
        assert rows.sharding.spec == P("data", None, "model")
        assert ys.sharding.spec == P(None, "model")


def test_carry_is_placed_where_the_body_puts_it(mesh_2x4):
    """A replicated ``zeros`` init plus a batch-sharded slice each step: on Explicit meshes the
    carry's type changed and ``lax.scan`` refused it in its own terms; Auto meshes ran it."""
    from jax.sharding import AxisType
    from jax.sharding import PartitionSpec as P

    explicit = mesh_2x4.axis_types[0] == AxisType.Explicit
    B = jnp.arange(4 * 3 * 8.0).reshape(4, 3, 8) / 10
    with jax.set_mesh(mesh_2x4), na.axis_mapping({"batch": "data"}):
        xs = na.shard(named(B, ("batch", "seq", "embed")))
        init = na.zeros({"batch": 4, "embed": 8})
        total = na.fold(lambda c, t: c + t, "seq")(init, xs)
        carry, ys = jax.jit(na.scan(lambda c, t: (c + t, c), "seq"))(init, xs)
    close(total.array, B.sum(axis=1))
    close(carry.array, B.sum(axis=1))
    close(ys.array, jnp.moveaxis(jnp.cumsum(B, axis=1) - B, 1, 0))
    assert ys.axis_names == ("seq", "batch", "embed")
    if explicit:
        assert total.sharding.spec == P("data", None)
        assert carry.sharding.spec == P("data", None)
        assert ys.sharding.spec == P(None, "data", None)


def test_carry_that_never_settles_on_a_sharding_is_refused(mesh_2x4):
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    init = named(
        jax.device_put(jnp.ones((4, 4)), NamedSharding(mesh_2x4, P("data", None))), ("a", "b")
    )

    def flip(c, _):  # the transpose moves 'data' to the other axis at every step
        return named(c.array.T, c.axes)

    with jax.set_mesh(mesh_2x4):
        if mesh_2x4.axis_types[0] == AxisType.Explicit:
            with pytest.raises(
                na.ShardingError,
                match=r"^fold\(\) over axis 'step': fn keeps moving the carry between mesh axes, "
                r"so it has no one sharding that every step keeps\. carry: a step takes it as "
                r"P\(None, 'data'\) and returns it as P\('data', None\)\. Place it once: .*"
                r"jax\.sharding\.reshard\(c, P\(None, 'data'\)\)",
            ):
                na.fold(flip, Axis("step", 3))(init, jnp.ones(3))
        else:  # Auto meshes: shardings are not in the types, XLA places the carry
            out = na.fold(flip, Axis("step", 3))(init, jnp.ones(3))
            close(out.array, jnp.ones((4, 4)))


# -- plain arrays, several axes, static outputs, extra arguments, checkpointing -------------------


def test_vmap_maps_plain_arrays_when_asked_split_keys():
    keys = jax.random.split(jax.random.key(0), 3)

    def init(key, scale):
        return {"w": named(jax.random.normal(key, (4,)) * scale, "embed"), "n": 4, "act": jnp.tanh}

    out = na.vmap(init, Axis("layer", 3), map_plain=True)(keys, 2.0)
    ref = jax.vmap(lambda k: jax.random.normal(k, (4,)) * 2.0)(keys)
    assert out["w"].axis_names == ("layer", "embed")
    close(out["w"].array, ref)
    assert out["n"] == 4 and out["act"] is jnp.tanh  # non-array leaves come back unchanged
    # By name: the size comes from the plain arrays; a NamedArray with the axis is mapped alongside.
    bias = named(jnp.arange(3.0), "layer")
    out = na.vmap(
        lambda k, b: named(jax.random.normal(k, (2,)) + b.array, "embed"), "layer", map_plain=True
    )(keys, bias)
    close(out.array, jax.vmap(lambda k, b: jax.random.normal(k, (2,)) + b)(keys, jnp.arange(3.0)))
    # Without map_plain, plain arrays are passed whole (the old behaviour).
    whole = na.vmap(lambda k, b: named(jnp.full((), k.shape[0], jnp.float32), ()), "layer")(
        keys, bias
    )
    close(whole.array, jnp.full(3, 3.0))
    with pytest.raises(
        AxisSizeError,
        match=r"vmap\(\) over axis 'layer': the axis has different sizes in the arguments \(args/0 \(leading dimension\): 3, args/1: 4\)\. Every mapped array must agree on its size\. Plain arrays are mapped over their leading dimension",
    ):
        na.vmap(lambda k, b: b, "layer", map_plain=True)(keys, named(jnp.zeros(4), "layer"))


def test_vmap_several_axes_at_once():
    x = named(A, ("batch", "seq", "embed"))
    w = named(jnp.arange(4.0), "embed")
    seen = []

    def f(r, w):
        seen.append(r.axis_names)
        return {
            "y": named(r.array * w.array, r.axes),
            "s": r.array.sum(),
            "flag": True,
            "ax": Axis("k", 1),
        }

    out = na.vmap(f, ("seq", "batch"))(x, w)
    assert seen[-1] == ("embed",)
    assert out["y"].axis_names == ("seq", "batch", "embed")
    ref = jax.vmap(jax.vmap(lambda r: (r * jnp.arange(4.0), r.sum())), in_axes=1)(A)
    close(out["y"].array, ref[0])
    close(out["s"], ref[1])  # plain outputs: (seq, batch)
    assert out["flag"] is True and out["ax"] == Axis("k", 1)
    with pytest.raises(
        NamedTypeError,
        match=r"vmap\(\) needs an axis name, an Axis, or a non-empty sequence of them, got \(\)",
    ):
        na.vmap(f, ())
    with pytest.raises(DuplicateAxisError, match=r"Duplicate axis names 'batch'"):
        na.vmap(f, ("batch", Axis("batch", 2)))


def test_scan_and_fold_take_extra_arguments_broadcast_to_every_step():
    xs = named(A, ("time", "seq", "embed"))
    mask = named(jnp.array([1.0, 0.0, 1.0, 1.0]), "embed")
    seen = []

    def f(c, x, mask, *, scale):
        seen.append(mask.axis_names)
        c = named(c.array + (x.array * mask.array[None]).sum(axis=0) * scale, c.axes)
        return c, c

    carry, ys = na.scan(f, "time")(named(jnp.zeros(4), "embed"), xs, mask, scale=2.0)
    ref_c, ref_ys = jax.lax.scan(
        lambda c, a: ((c + (a * mask.array[None]).sum(axis=0) * 2.0),) * 2, jnp.zeros(4), A
    )
    assert seen[-1] == ("embed",)  # not scanned, even though it is a NamedArray
    close(carry.array, ref_c)
    close(ys.array, ref_ys)
    folded = na.fold(lambda c, x, mask, *, scale: f(c, x, mask, scale=scale)[0], "time")
    close(folded(named(jnp.zeros(4), "embed"), xs, mask, scale=2.0).array, ref_c)


def test_scan_over_plain_arrays_with_an_axis():
    plain = jnp.arange(12.0).reshape(3, 4)
    xs = {"p": plain, "n": named(jnp.arange(3.0), "step"), "c": 2.0, "z": jnp.asarray(5.0)}

    def f(c, x):
        assert (
            x["p"].shape == (4,)
            and x["n"].axis_names == ()
            and x["c"] == 2.0
            and x["z"].shape == ()
        )
        c = c + x["p"] * x["n"].array + x["z"]
        return c, {"c": c, "tag": "step", "flag": False}

    carry, ys = na.scan(f, Axis("step", 3))(jnp.zeros(4), xs)
    ref_c, ref_ys = jax.lax.scan(
        lambda c, a: ((c + a[0] * a[1] + 5.0),) * 2, jnp.zeros(4), (plain, jnp.arange(3.0))
    )
    close(carry, ref_c)
    close(ys["c"], ref_ys)
    assert ys["tag"] == "step" and ys["flag"] is False
    # fold with an Axis over plain arrays only, and reverse.
    out = na.fold(lambda c, x: c * 2 + x, Axis("step", 3), reverse=True)(jnp.zeros(4), plain)
    close(out, jax.lax.scan(lambda c, x: (c * 2 + x, None), jnp.zeros(4), plain, reverse=True)[0])
    with pytest.raises(
        AxisSizeError,
        match=r"fold\(\) over axis 'step': the axis has different sizes in xs \(xs/a \(leading dimension\): 4, requested Axis: 3\)",
    ):
        na.fold(lambda c, x: c, Axis("step", 3))(jnp.zeros(4), {"a": jnp.zeros((4, 2))})


def _remat_ref(a, policy):
    body = jax.checkpoint(lambda c, x: (jnp.sin(c * x), None), policy=policy, prevent_cse=False)
    return jax.lax.scan(body, jnp.ones(3), a)[0].sum()


@pytest.mark.parametrize(
    "remat,policy",
    [
        ("nothing_saveable", jax.checkpoint_policies.nothing_saveable),
        (True, None),
        (jax.checkpoint_policies.dots_saveable, jax.checkpoint_policies.dots_saveable),
    ],  # fmt: skip
)
def test_fold_and_scan_with_a_checkpoint_policy(remat, policy):
    a = jnp.linspace(0.1, 1.0, 12).reshape(4, 3)

    def loss(a):
        f = na.fold(lambda c, x: named(jnp.sin(c.array * x.array), c.axes), "time", remat=remat)
        return f(named(jnp.ones(3), "k"), named(a, ("time", "k"))).array.sum()

    close(loss(a), _remat_ref(a, policy))
    close(jax.grad(loss)(a), jax.grad(_remat_ref)(a, policy))
    text = str(jax.make_jaxpr(jax.grad(loss))(a))
    assert "checkpoint" in text or "remat" in text
    plain = str(
        jax.make_jaxpr(
            jax.grad(
                lambda a: na.fold(lambda c, x: c * x, "time")(
                    named(jnp.ones(3), "k"), named(a, ("time", "k"))
                ).array.sum()
            )
        )(a)
    )
    assert "checkpoint" not in plain and "remat" not in plain
    _, ys = na.scan(lambda c, x: (c, x), "time", remat=remat)(
        jnp.zeros(()), named(a, ("time", "k"))
    )
    close(ys.array, a)


def test_remat_bad_inputs():
    with pytest.raises(
        NamedTypeError,
        match=r"fold\(\): remat='nothing_savable' is not a jax.checkpoint_policies policy\. Policies by name: .*'nothing_saveable'",
    ):
        na.fold(lambda c, x: c, "time", remat="nothing_savable")
    with pytest.raises(
        NamedTypeError,
        match=r"scan\(\): remat='save_only_these_names' is not a jax.checkpoint_policies policy\. jax.checkpoint_policies.save_only_these_names builds a policy: call it",
    ):
        na.scan(lambda c, x: (c, x), "time", remat="save_only_these_names")
    with pytest.raises(
        NamedTypeError,
        match=r"scan\(\): remat must be a bool, a jax.checkpoint_policies name such as 'nothing_saveable', or a policy callable, got 3 \(int\)",
    ):
        na.scan(lambda c, x: (c, x), "time", remat=3)
    with pytest.raises(
        NamedTypeError, match=r"scan\(\) needs an axis name or an Axis, got \['time'\]"
    ):
        na.scan(lambda c, x: (c, x), ["time"])


def test_remat_callables_must_be_policies():
    """A policy builder passed uncalled, or any other callable, was taken and failed inside
    jax.grad with a TypeError about a 'name' keyword."""
    policies = jax.checkpoint_policies
    for builder in (policies.save_only_these_names, policies.save_from_both_policies):
        with pytest.raises(
            NamedTypeError,
            match=rf"fold\(\): remat=<function {builder.__name__} .*> is not a checkpoint policy "
            r"\(a callable taking \(primitive, \*args, \*\*params\) .*\)\. "
            rf"jax.checkpoint_policies.{builder.__name__} builds a policy: call it and pass the "
            rf"result, e.g. remat=jax.checkpoint_policies.{builder.__name__}\(\.\.\.\)\.",
        ):
            na.fold(lambda c, x: c, "time", remat=builder)
    for other in (print, lambda prim: True):
        with pytest.raises(
            NamedTypeError,
            match=r"scan\(\): remat=.* is not a checkpoint policy .* Pass a "
            r"jax.checkpoint_policies policy or its name: .*'nothing_saveable'",
        ):
            na.scan(lambda c, x: (c, x), "time", remat=other)
    built = na.fold(lambda c, x: c * x, "time", remat=policies.save_only_these_names("h"))
    a = named(jnp.arange(1.0, 4.0), "time")
    close(jax.grad(lambda a: built(named(jnp.ones(()), ()), a).array)(a).array, [6.0, 3.0, 2.0])


def test_vmap_passes_spmd_axis_name_for_a_sharded_axis(mesh_2x4):
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    explicit = mesh_2x4.axis_types[0] == AxisType.Explicit
    B = jnp.arange(8 * 4.0).reshape(8, 4)

    def inner(r):  # constrains the per-example array; the batch dimension is vmap's business
        if explicit:
            return named(jax.sharding.reshard(r.array * 2, P("model")), r.axes)
        return named(jax.lax.with_sharding_constraint(r.array * 2, P("model")), r.axes)

    def run(spec, mapping):
        x = named(jax.device_put(B, NamedSharding(mesh_2x4, spec)), ("batch", "embed"))
        f = jax.jit(
            lambda x: na.vmap(inner, "batch")(x)
        )  # a fresh trace: mappings are read when tracing
        with jax.set_mesh(mesh_2x4), na.axis_mapping(mapping):
            out = f(x)
        close(out.array, B * 2)
        return out.sharding.spec

    if explicit:  # the arguments' types say where batch lives
        assert run(P("data", None), {"batch": "data"}) == P("data", "model")
        assert run(P(), {"batch": "data"}) == P(None, "model")
    else:  # only the mapping says it: a replicated batch is sharded by the constraint under vmap
        assert run(P(), {"batch": "data"}) == P("data", "model")
        assert run(P(), {}) == P(None, "model")


def test_vmap_reconciles_the_mapped_axis_sharding_across_arguments(mesh_2x4):
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    explicit = mesh_2x4.axis_types[0] == AxisType.Explicit
    B = jnp.arange(8 * 4.0).reshape(8, 4)
    put = lambda a, *spec: jax.device_put(a, NamedSharding(mesh_2x4, P(*spec)))  # noqa: E731
    with jax.set_mesh(mesh_2x4):
        x = named(put(B, "data", None), ("batch", "embed"))  # batch-sharded activation
        s = named(put(jnp.arange(8.0)), "batch")  # a replicated per-batch scale
        keys = jax.random.split(jax.random.key(0), 8)  # the map_plain keys idiom
        out = na.vmap(lambda a, b: a * b, "batch")(x, s)
        noisy = jax.jit(
            na.vmap(lambda a, k: a + jax.random.normal(k, ()), "batch", map_plain=True)
        )(x, keys)
        close(out.array, B * np.arange(8.0)[:, None])
        assert noisy.axis_names == ("batch", "embed")
        if explicit:  # the replicated argument is split like the sharded one
            assert out.sharding.spec == P("data", None)
            assert noisy.sharding.spec == P("data", None)
        s_model = named(put(jnp.arange(8.0), "model"), "batch")
        f = na.vmap(lambda a, b: a * b, "batch")
        if explicit:  # two shardings of batch: the mapping in force decides, else a typed error
            with pytest.raises(
                na.ShardingError,
                match=r"vmap\(\): axis 'batch' is sharded over different mesh axes in different "
                r"arguments on an Explicit mesh \(args/0: data; args/1: model\)",
            ):
                f(x, s_model)
            with na.axis_mapping({"batch": "model"}):
                out = jax.jit(f)(x, s_model)
            assert out.sharding.spec == P("model", None)
        else:
            out = f(x, s_model)
        close(out.array, B * np.arange(8.0)[:, None])


def test_nested_scans_trace_each_body_once(mesh_2x4):
    """A carry that stays where it is costs no extra trace of the body, at any nesting depth
    (an abstract trace per scan to learn the carry's placement made nested scans 2**depth)."""
    traces = []

    def inner(c, t):
        traces.append("inner")
        return c + t, None

    def middle(c, t):
        return na.scan(inner, "k")(c, t)[0], None

    def outer(c, t):
        return na.scan(middle, "j")(c, t)[0], None

    x = na.ones({"i": 2, "j": 2, "k": 2, "batch": 4})
    with jax.set_mesh(mesh_2x4), na.axis_mapping({"batch": "data"}):
        x = na.shard(x)
        init = na.shard(na.zeros({"batch": 4}))
        carry = jax.jit(na.scan(outer, "i"))(init, x)[0]
    close(carry.array, jnp.full(4, 8.0))
    assert traces == ["inner"]
