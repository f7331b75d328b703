"""Shape ops by name, checked against the positional jax.numpy computation on the same data."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import same

import namedaxes as na
from namedaxes import (
    Axis,
    AxisError,
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


# -- rearrange / rename ---------------------------------------------------------------------


def test_rearrange_matches_transpose(x):
    same(
        na.rearrange(x, ("embed", "batch", "seq")),
        jnp.transpose(A, (2, 0, 1)),
        ("embed", "batch", "seq"),
    )
    same(
        x.rearrange(("seq", Axis("embed", 4), "batch")),
        jnp.transpose(A, (1, 2, 0)),
        ("seq", "embed", "batch"),
    )


def test_rearrange_ellipsis(x):
    same(na.rearrange(x, ("embed", ...)), jnp.transpose(A, (2, 0, 1)), ("embed", "batch", "seq"))
    same(na.rearrange(x, (..., "batch")), jnp.transpose(A, (1, 2, 0)), ("seq", "embed", "batch"))
    same(
        na.rearrange(x, ("embed", ..., "batch")),
        jnp.transpose(A, (2, 1, 0)),
        ("embed", "seq", "batch"),
    )
    assert na.rearrange(x, (...,)) is x


def test_rearrange_errors(x):
    with pytest.raises(
        AxisNotFoundError,
        match=r"Axis 'embd' not found in NamedArray\(batch=2, seq=3, embed=4\). Available axes: 'batch', 'seq', 'embed'",
    ):
        na.rearrange(x, ("embd", ...))
    with pytest.raises(
        AxisError,
        match=r"axes 'seq' of NamedArray\(batch=2, seq=3, embed=4\) are not in the new order \('embed', 'batch'\).*add \.\.\.",
    ):
        na.rearrange(x, ("embed", "batch"))
    with pytest.raises(DuplicateAxisError, match="Duplicate axis names 'batch'"):
        na.rearrange(x, ("batch", "batch", ...))
    with pytest.raises(DuplicateAxisError, match=r"'\.\.\.' appears 2 times"):
        na.rearrange(x, (..., "batch", ...))
    with pytest.raises(AxisSizeError, match="Axis 'seq' has size 3 .* but size 5 was asked for"):
        na.rearrange(x, (Axis("seq", 5), ...))
    with pytest.raises(
        NamedTypeError,
        match=r"rearrange\(\) needs a NamedArray for `x`, got ArrayImpl of shape \(2, 3, 4\)\. Name its axes first",
    ):
        na.rearrange(A, ("embed", ...))


def test_rename(x):
    y = na.rename(x, {"embed": "hidden", Axis("batch", 2): Axis("b", 2)})
    assert y.shape == {"b": 2, "seq": 3, "hidden": 4}
    assert y.array is x.array
    swapped = x.rename({"batch": "seq", "seq": "batch"})
    assert swapped.shape == {"seq": 2, "batch": 3, "embed": 4}


def test_rename_errors(x):
    with pytest.raises(
        DuplicateAxisError,
        match=r"renaming NamedArray\(batch=2, seq=3, embed=4\) with \{'embed': 'seq'\} gives axis name\(s\) 'seq' twice",
    ):
        na.rename(x, {"embed": "seq"})
    with pytest.raises(
        AxisNotFoundError,
        match="Axis 'hidden' not found .* Available axes: 'batch', 'seq', 'embed'",
    ):
        na.rename(x, {"hidden": "h"})
    with pytest.raises(
        AxisSizeError, match=r"cannot rename axis 'embed' \(size 4\) to 'h' with size 5"
    ):
        na.rename(x, {"embed": Axis("h", 5)})
    with pytest.raises(NamedTypeError, match=r"rename\(\) takes a \{old: new\} dict"):
        na.rename(x, [("embed", "h")])


# -- flatten / unflatten / split / unbind -----------------------------------------------------


def test_flatten_adjacent_matches_reshape(x):
    same(na.flatten_axes(x, ("batch", "seq"), "tokens"), A.reshape(6, 4), ("tokens", "embed"))
    y = x.flatten_axes(("seq", "embed"), Axis("feat", 12))
    same(y, A.reshape(2, 12), ("batch", "feat"))


def test_flatten_non_adjacent_moves_axes_to_first(x):
    # batch and embed are not adjacent; merged axis goes where batch was, embed fastest.
    y = na.flatten_axes(x, ("batch", "embed"), "be")
    same(y, jnp.transpose(A, (0, 2, 1)).reshape(8, 3), ("be", "seq"))
    # The order given decides the flattening order (embed slowest here).
    z = na.flatten_axes(x, ("embed", "batch"), "eb")
    same(z, jnp.transpose(A, (2, 0, 1)).reshape(8, 3), ("eb", "seq"))


def test_unflatten_inverts_flatten(x):
    flat = na.flatten_axes(x, ("batch", "seq"), "tokens")
    back = na.unflatten_axis(flat, "tokens", (Axis("batch", 2), Axis("seq", 3)))
    same(back, A, ("batch", "seq", "embed"))
    same(flat.unflatten_axis("embed", {"h": 2, "d": 2}), A.reshape(6, 2, 2), ("tokens", "h", "d"))
    # The split axis' own name may be reused.
    same(
        na.unflatten_axis(x, "embed", {"embed": 2, "d": 2}),
        A.reshape(2, 3, 2, 2),
        ("batch", "seq", "embed", "d"),
    )


def test_flatten_unflatten_errors(x):
    with pytest.raises(
        AxisSizeError, match=r"axis 'embed' has size 4, but the new axes \(h=3, d=2\) multiply to 6"
    ):
        na.unflatten_axis(x, "embed", {"h": 3, "d": 2})
    with pytest.raises(
        DuplicateAxisError,
        match=r"new axis name\(s\) 'seq' already exist in NamedArray\(batch=2, seq=3, embed=4\)",
    ):
        na.unflatten_axis(x, "embed", {"seq": 2, "d": 2})
    with pytest.raises(DuplicateAxisError, match=r"new axis name\(s\) 'embed' already exist"):
        na.flatten_axes(x, ("batch", "seq"), "embed")
    with pytest.raises(
        AxisSizeError,
        match=r"merging \(batch=2, seq=3\) gives size 6, but new axis 'bs' was given size 7",
    ):
        na.flatten_axes(x, ("batch", "seq"), Axis("bs", 7))
    with pytest.raises(AxisNotFoundError, match="Axis 'sq' not found"):
        na.flatten_axes(x, ("batch", "sq"), "bs")
    with pytest.raises(DuplicateAxisError, match="Duplicate axis names 'seq'"):
        na.flatten_axes(x, ("seq", "seq"), "ss")


def test_split_matches_jnp_split(x):
    q, k = na.split(x, "embed", (Axis("q", 1), Axis("k", 3)))
    ref = jnp.split(A, [1], axis=2)
    same(q, ref[0], ("batch", "seq", "q"))
    same(k, ref[1], ("batch", "seq", "k"))
    parts = x.split("seq", (1, 1, 1))
    for p, r in zip(parts, jnp.split(A, 3, axis=1)):
        same(p, r, ("batch", "seq", "embed"))
        assert p.axis_size("seq") == 1


def test_split_errors(x):
    with pytest.raises(
        AxisSizeError, match=r"chunk sizes \(q=1, k=2\) add up to 3, but axis 'embed' has size 4"
    ):
        na.split(x, "embed", (Axis("q", 1), Axis("k", 2)))
    with pytest.raises(DuplicateAxisError, match=r"new axis name\(s\) 'batch' already exist"):
        na.split(x, "embed", (Axis("batch", 2), Axis("k", 2)))
    with pytest.raises(NamedTypeError, match="split\\(\\) takes a sequence of Axis"):
        na.split(x, "embed", Axis("q", 4))


def test_split_takes_numpy_int_sizes_as_rearrange_does(x):
    q, k = na.split(x, "embed", (np.int64(1), np.int32(3)))
    same(q, A[:, :, :1], ("batch", "seq", "embed"))
    same(k, A[:, :, 1:], ("batch", "seq", "embed"))
    assert type(q.axis_size("embed")) is int
    with pytest.raises(
        NamedTypeError, match=r"split\(\): each chunk must be an Axis or an int size, got 1\.0"
    ):
        na.split(x, "embed", (1.0, 3))


def test_unbind_matches_indexing(x):
    parts = na.unbind(x, "seq")
    assert len(parts) == 3
    for i, p in enumerate(parts):
        same(p, A[:, i], ("batch", "embed"))
    assert len(x.unbind("batch")) == 2
    with pytest.raises(AxisNotFoundError, match="Axis 'layer' not found"):
        na.unbind(x, "layer")


# -- concatenate / stack ----------------------------------------------------------------------


def test_concatenate_reorders_to_first(x):
    other = jnp.arange(10.0).reshape(5, 2)  # (seq2, batch)
    y = named(other, ("seq", "batch"))
    out = na.concatenate("seq", [named(A[:, :, 0], ("batch", "seq")), y])
    same(out, jnp.concatenate([A[:, :, 0], other.T], axis=1), ("batch", "seq"))
    assert out.shape == {"batch": 2, "seq": 8}
    out2 = na.concatenate(Axis("embed", 8), [x, na.rearrange(x, ("embed", ...))])
    same(out2, jnp.concatenate([A, A], axis=2), ("batch", "seq", "embed"))


def test_concatenate_errors(x):
    y = named(jnp.zeros((2, 5, 5)), ("batch", "seq", "embed"))
    with pytest.raises(
        AxisSizeError,
        match=r"concatenate\(\) along 'seq': arrays\[1\] has axes \(batch=2, seq=5, embed=5\) but arrays\[0\] has \(batch=2, seq=3, embed=4\).*differ in 'embed'",
    ):
        na.concatenate("seq", [x, y])
    z = named(jnp.zeros((2, 5, 4)), ("batch", "seq", "hidden"))
    with pytest.raises(AxisSizeError, match=r"differ in 'embed', 'hidden'"):
        na.concatenate("seq", [x, z])
    with pytest.raises(
        AxisNotFoundError,
        match=r"Axis 'time' not found in concatenate\(\) arrays\[0\] NamedArray\(batch=2, seq=3, embed=4\)",
    ):
        na.concatenate("time", [x, x])
    with pytest.raises(
        AxisSizeError, match=r"sizes add up to 3 \+ 3 = 6, but Axis\('seq', 5\) was asked for"
    ):
        na.concatenate(Axis("seq", 5), [x, x])
    with pytest.raises(
        NamedTypeError,
        match=r"concatenate\(\) needs a NamedArray for `arrays\[1\]`, got ArrayImpl of shape \(2, 3, 4\)",
    ):
        na.concatenate("seq", [x, A])
    with pytest.raises(NamedTypeError, match="non-empty list"):
        na.concatenate("seq", [])


def test_stack_matches_jnp_stack(x):
    y = named(A + 100, ("batch", "seq", "embed")).rearrange(("embed", ...))  # other order
    out = na.stack("layer", [x, y])
    same(out, jnp.stack([A, A + 100]), ("layer", "batch", "seq", "embed"))
    assert na.stack(Axis("layer", 3), [x, x, x]).axis_size("layer") == 3


def test_stack_errors(x):
    with pytest.raises(
        DuplicateAxisError,
        match=r"stack\(\): the arrays already have an axis 'seq' \(NamedArray\(batch=2, seq=3, embed=4\)\)",
    ):
        na.stack("seq", [x, x])
    with pytest.raises(
        AxisSizeError, match=r"Axis\('layer', 3\) was asked for, but 2 arrays were given"
    ):
        na.stack(Axis("layer", 3), [x, x])
    with pytest.raises(AxisSizeError, match=r"arrays\[1\] has axes \(batch=2, seq=3\)"):
        na.stack("layer", [x, x["embed", 0]])


# -- broadcast --------------------------------------------------------------------------------


def test_broadcast_to_matches_jnp(x):
    v = named(jnp.arange(4.0), ("embed",))
    out = na.broadcast_to(v, {"batch": 2, "embed": 4})
    same(out, jnp.broadcast_to(jnp.arange(4.0), (2, 4)), ("batch", "embed"))
    # Reorders as well as adds.
    out = na.broadcast_to(x, (Axis("embed", 4), Axis("k", 2), Axis("seq", 3), Axis("batch", 2)))
    same(
        out,
        jnp.broadcast_to(jnp.transpose(A, (2, 1, 0))[:, None], (4, 2, 3, 2)),
        ("embed", "k", "seq", "batch"),
    )
    out = na.broadcast_to(x, (Axis("k", 2), ...))
    same(out, jnp.broadcast_to(A, (2, 2, 3, 4)), ("k", "batch", "seq", "embed"))
    same(na.broadcast_to(3.0, {"a": 2}), jnp.full((2,), 3.0), ("a",))


def test_broadcast_axis(x):
    out = na.broadcast_axis(x, Axis("k", 2))
    same(out, jnp.broadcast_to(A, (2, 2, 3, 4)), ("k", "batch", "seq", "embed"))
    assert x.broadcast_axis({"a": 1, "b": 2}).axis_names == ("a", "b", "batch", "seq", "embed")


def test_broadcast_errors(x):
    with pytest.raises(
        AxisError,
        match=r"NamedArray\(batch=2, seq=3, embed=4\) has axes 'seq', 'embed' that are not in the target \(batch=2\)\. List them in the target, or add \.\.\.",
    ):
        na.broadcast_to(x, {"batch": 2})
    with pytest.raises(
        AxisSizeError,
        match=r"axis 'batch' has size 2 in NamedArray\(batch=2, seq=3, embed=4\) but size 4 in the target",
    ):
        na.broadcast_to(x, (Axis("batch", 4), ...))
    with pytest.raises(DuplicateAxisError, match=r"already has axis\(es\) 'seq'"):
        na.broadcast_axis(x, Axis("seq", 3))
    with pytest.raises(
        NamedTypeError,
        match=r"broadcast_to\(\) needs a NamedArray for `x`, got ArrayImpl of shape \(2, 3, 4\)",
    ):
        na.broadcast_to(A, {"a": 2})
    with pytest.raises(NamedTypeError, match="Give sizes"):
        na.broadcast_to(x, ("batch", ...))


def test_shape_ops_trace_under_jit(x):
    @jax.jit
    def f(x):
        y = na.flatten_axes(x, ("batch", "embed"), "be")
        parts = na.split(y, "be", (5, 3))
        return na.concatenate("be", parts[::-1]).rearrange((..., "be"))

    out = f(x)
    flat = jnp.transpose(A, (0, 2, 1)).reshape(8, 3)
    same(out, jnp.concatenate([flat[5:], flat[:5]]).T, ("seq", "be"))


# -- sharded inputs (Auto and Explicit meshes) -----------------------------------------------------

B = jnp.arange(4 * 4 * 8.0).reshape(4, 4, 8)


def test_shape_ops_on_sharded_arrays(mesh_2x4):
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    explicit = mesh_2x4.axis_types[0] == AxisType.Explicit
    a = jax.device_put(B, NamedSharding(mesh_2x4, P("data", None, "model")))
    x = named(a, ("batch", "seq", "embed"))

    @jax.jit
    def f(x):
        return {
            "rearrange": na.rearrange(x, ("embed", ...)),
            "flatten_outer": na.flatten_axes(x, ("batch", "seq"), "bs"),
            "flatten_inner": na.flatten_axes(
                x, ("seq", "embed"), "se"
            ),  # sharded axis not outermost
            "unflatten": na.unflatten_axis(x, "embed", {"h": 4, "d": 2}),
            "split": na.split(x, "batch", (1, 3))[0],  # 1 row of a 2-way sharded axis
            "unbind": na.unbind(x, "batch")[3],
            "concat": na.concatenate("batch", [x, x]),
            "stack": na.stack("l", [x, x]),
        }

    with jax.set_mesh(mesh_2x4):
        out = f(x)
    same(out["rearrange"], jnp.transpose(B, (2, 0, 1)), ("embed", "batch", "seq"))
    same(out["flatten_outer"], B.reshape(16, 8), ("bs", "embed"))
    same(out["flatten_inner"], B.reshape(4, 32), ("batch", "se"))
    same(out["unflatten"], B.reshape(4, 4, 4, 2), ("batch", "seq", "h", "d"))
    same(out["split"], B[:1], ("batch", "seq", "embed"))
    same(out["unbind"], B[3], ("seq", "embed"))
    same(out["concat"], jnp.concatenate([B, B]), ("batch", "seq", "embed"))
    same(out["stack"], jnp.stack([B, B]), ("l", "batch", "seq", "embed"))
    if explicit:  # shardings are part of the type: each kept axis keeps its mesh axes
        assert out["rearrange"].sharding.spec == P("model", "data", None)
        assert out["flatten_outer"].sharding.spec == P("data", "model")
        assert out["flatten_inner"].sharding.spec == P("data", None)
        assert out["split"].sharding.spec == P(None, None, "model")
        assert out["unbind"].sharding.spec == P(None, "model")
        assert out["stack"].sharding.spec == P(None, "data", None, "model")


# -- reshapes of sharded axes: the output sharding by name (Auto and Explicit meshes) -------------

C = jnp.arange(4 * 8 * 4.0).reshape(4, 8, 4)


def _sharded_c(mesh, spec):
    from jax.sharding import NamedSharding

    return named(jax.device_put(C, NamedSharding(mesh, spec)), ("b", "e", "s"))


def test_split_of_a_sharded_axis_keeps_it_on_the_outermost_new_axis(mesh_2x4):
    from jax.sharding import AxisType
    from jax.sharding import PartitionSpec as P

    explicit = mesh_2x4.axis_types[0] == AxisType.Explicit
    x = _sharded_c(mesh_2x4, P("data", "model"))
    both = _sharded_c(mesh_2x4, P(None, ("data", "model")))  # e=8 over data x model
    with jax.set_mesh(mesh_2x4):
        outs = {
            "unflatten": na.unflatten_axis(x, "e", {"h": 4, "d": 2}),
            "pattern": na.rearrange(x, "b (e: h d) s -> b h s d", h=4),
            "tuple": na.unflatten_axis(both, "e", {"h": 2, "d": 4}),
            "merge_outer": na.flatten_axes(x, ("b", "e"), "be"),
            "merge_reordered": na.flatten_axes(x, ("e", "b"), "eb"),
            "merge_inner": na.flatten_axes(x, ("s", "e"), "se"),
            "ravel": na.ravel(x, "flat"),
            "round_trip": na.rearrange(x, "b (e: h d) s -> b (e: h d) s", h=4),
        }
    split = C.reshape(4, 4, 2, 4)
    same(outs["unflatten"], split, ("b", "h", "d", "s"))
    same(outs["pattern"], jnp.transpose(split, (0, 1, 3, 2)), ("b", "h", "s", "d"))
    same(outs["tuple"], C.reshape(4, 2, 4, 4), ("b", "h", "d", "s"))
    same(outs["merge_outer"], C.reshape(32, 4), ("be", "s"))
    same(outs["merge_reordered"], jnp.transpose(C, (1, 0, 2)).reshape(32, 4), ("eb", "s"))
    same(outs["merge_inner"], jnp.transpose(C, (0, 2, 1)).reshape(4, 32), ("b", "se"))
    same(outs["ravel"], C.reshape(-1), ("flat",))
    same(outs["round_trip"], C, ("b", "e", "s"))
    if explicit:  # the placement is in the type: the data stays where it was
        assert outs["unflatten"].sharding.spec == P("data", "model", None, None)
        assert outs["pattern"].sharding.spec == P("data", "model", None, None)
        assert outs["tuple"].sharding.spec == P(None, "data", "model", None)
        assert outs["merge_outer"].sharding.spec == P("data", None)
        assert outs["merge_reordered"].sharding.spec == P("model", None)
        assert outs["merge_inner"].sharding.spec == P("data", None)  # inner 'e' gathered
        assert outs["ravel"].sharding.spec == P("data")
        assert outs["round_trip"].sharding.spec == P("data", "model", None)


def test_split_that_cannot_keep_its_sharding_is_placed_by_the_mapping(mesh_2x4):
    """``rearrange("b (h d) s -> b h s d")`` with ``h=2`` of an axis sharded 4 ways: on Explicit
    meshes JAX leaked ``ShardingTypeError: This reshape is not supported``."""
    from jax.sharding import AxisType
    from jax.sharding import PartitionSpec as P

    explicit = mesh_2x4.axis_types[0] == AxisType.Explicit
    x = _sharded_c(mesh_2x4, P("data", "model"))
    expected = jnp.transpose(C.reshape(4, 2, 4, 4), (0, 1, 3, 2))
    with jax.set_mesh(mesh_2x4):
        if explicit:  # which new axis carries 'model' is the user's call: say so
            with pytest.raises(
                na.ShardingError,
                match=r"^rearrange\('b \(h d\) s -> b h s d'\): axis 'e' \(size 8\) is sharded "
                r"over model=4 on an Explicit mesh, and its new axes \(h=2, d=4\) cannot keep "
                r"that sharding without moving data: .* model=4 does not divide what is left of "
                r"h=2\. Say where the new axes go: put a mapping in force, e\.g\. "
                r"`with na\.axis_mapping\(\{'d': 'model'\}\):`",
            ):
                na.rearrange(x, "b (h d) s -> b h s d", h=2)
        else:
            same(na.rearrange(x, "b (h d) s -> b h s d", h=2), expected, ("b", "h", "s", "d"))
        with na.axis_mapping({"b": "data", "d": "model"}):
            placed = na.rearrange(x, "b (h d) s -> b h s d", h=2)
        with na.axis_mapping({"b": "data"}):  # the mapping says nothing of h, d: replicated
            replicated = na.unflatten_axis(x, "e", {"h": 2, "d": 4})
    same(placed, expected, ("b", "h", "s", "d"))
    same(replicated, C.reshape(4, 2, 4, 4), ("b", "h", "d", "s"))
    if explicit:
        assert placed.sharding.spec == P("data", None, None, "model")
        assert replicated.sharding.spec == P("data", None, None, None)


def test_reshapes_of_sharded_axes_under_jit_and_named_jit(mesh_2x4):
    from jax.sharding import AxisType
    from jax.sharding import PartitionSpec as P

    explicit = mesh_2x4.axis_types[0] == AxisType.Explicit
    x = _sharded_c(mesh_2x4, P("data", "model"))

    def heads(x):
        y = na.rearrange(x, "b (e: h d) s -> b h s d", h=2)
        return {"heads": y, "back": na.rearrange(y, "b h s d -> b (e: h d) s")}

    with jax.set_mesh(mesh_2x4), na.axis_mapping({"b": "data", "d": "model", "e": "model"}):
        jitted = jax.jit(heads)(x)
        named_jitted = na.named_jit(heads)(x)
    for out in (jitted, named_jitted):
        same(out["heads"], jnp.transpose(C.reshape(4, 2, 4, 4), (0, 1, 3, 2)), ("b", "h", "s", "d"))
        same(out["back"], C, ("b", "e", "s"))
    if explicit:
        assert jitted["heads"].sharding.spec == P("data", None, None, "model")
        assert named_jitted["back"].sharding.spec == P("data", "model", None)


def test_reshapes_of_empty_sharded_arrays(mesh_2x4):
    """An axis of size 0 in an Explicit-sharded array: the reshape pairing ran past the result
    axes and leaked a bare ``IndexError``. Nothing moves: kept axes keep their mesh axes."""
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    explicit = mesh_2x4.axis_types[0] == AxisType.Explicit
    e = jnp.zeros((4, 0, 8))
    x = named(jax.device_put(e, NamedSharding(mesh_2x4, P("data", None, "model"))), ("b", "s", "e"))
    with jax.set_mesh(mesh_2x4):
        outs = {
            "flatten": na.flatten_axes(x, ("s", "e"), "t"),
            "unflatten": na.unflatten_axis(x, "s", {"p": 0, "q": 5}),
            "ravel": na.ravel(x, "flat"),
            "pattern": na.rearrange(x, "b s (e: h d) -> b s h d", h=2),
        }
    # No values to compare (and JAX cannot read back a computed empty array sharded on Explicit
    # axes on CPU: its buffers keep the global shape), so the axes and the placement are the result.
    assert outs["flatten"].shape == {"b": 4, "t": 0}
    assert outs["unflatten"].shape == {"b": 4, "p": 0, "q": 5, "e": 8}
    assert outs["ravel"].shape == {"flat": 0}
    assert outs["pattern"].shape == {"b": 4, "s": 0, "h": 2, "d": 4}
    if explicit:
        assert outs["flatten"].sharding.spec == P("data", None)
        assert outs["unflatten"].sharding.spec == P("data", None, None, "model")
        assert outs["ravel"].sharding.spec == P(None)
        assert outs["pattern"].sharding.spec == P("data", None, None, None)


def test_stack_and_concatenate_of_differently_sharded_operands(mesh_2x4):
    """On Explicit meshes JAX refused ``All operands should have the same sharding``."""
    from jax.sharding import AxisType
    from jax.sharding import PartitionSpec as P

    explicit = mesh_2x4.axis_types[0] == AxisType.Explicit
    x = _sharded_c(mesh_2x4, P("data", "model"))
    y = _sharded_c(mesh_2x4, P())
    z = named(jnp.transpose(C, (2, 1, 0)), ("s", "e", "b"))  # another layout, on the mesh
    with jax.set_mesh(mesh_2x4):
        stacked = na.stack("l", [y, x, z])
        joined = na.concatenate("b", [y, x])
        odd = na.concatenate("b", [x, y["b", 1:]])  # 4 + 3 rows: 'b' cannot stay on data=2
        conflict = _sharded_c(mesh_2x4, P("model", "data"))
        if explicit:
            with pytest.raises(na.ShardingError, match=r"^stack\(\): the operands' shardings "):
                na.stack("l", [x, conflict])
        with na.axis_mapping({"b": "data", "e": "model"}):
            settled = na.stack("l", [x, conflict])
    same(stacked, jnp.stack([C, C, C]), ("l", "b", "e", "s"))
    same(joined, jnp.concatenate([C, C]), ("b", "e", "s"))
    same(odd, jnp.concatenate([C, C[1:]]), ("b", "e", "s"))
    same(settled, jnp.stack([C, C]), ("l", "b", "e", "s"))
    if explicit:
        assert stacked.sharding.spec == P(None, "data", "model", None)
        assert joined.sharding.spec == P("data", "model", None)
        assert odd.sharding.spec == P(None, "model", None)
        assert settled.sharding.spec == P(None, "data", "model", None)
