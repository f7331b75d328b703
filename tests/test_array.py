"""NamedArray: invariants, properties, repr, and behaviour under JAX and equinox transforms."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from namedaxes import (
    Axis,
    AxisError,
    AxisNotFoundError,
    DuplicateAxisError,
    NamedArray,
    NamedTypeError,
    is_named_array,
    named,
)


def _x():
    return named(jnp.arange(6, dtype=jnp.float32).reshape(2, 3), ("batch", "embed"))


def test_properties():
    x = _x()
    assert x.axes == (Axis("batch", 2), Axis("embed", 3))
    assert x.axis_names == ("batch", "embed")
    assert x.shape == {"batch": 2, "embed": 3}
    assert x.dtype == jnp.float32
    assert (x.ndim, x.size, x.nbytes) == (2, 6, 24)
    assert x.axis_size("embed") == 3
    assert x.resolve_axis("batch") == Axis("batch", 2)
    assert x.axis_index(Axis("embed", 3)) == 1
    assert x.has_axis("embed") and not x.has_axis("mlp")
    np.testing.assert_array_equal(x.array, np.arange(6).reshape(2, 3))


def test_repr():
    assert repr(_x()) == "NamedArray(float32, batch=2, embed=3)"
    assert repr(named(jnp.int32(3), ())) == "NamedArray(int32)"


def test_named_accepts_axis_objects_names_and_numpy():
    x = named(np.ones((2, 3)), (Axis("a", 2), "b"))
    assert isinstance(x.array, jax.Array)
    assert x.axes == (Axis("a", 2), Axis("b", 3))
    assert named(jnp.ones(4), "a").axes == (Axis("a", 4),)


def test_wrong_number_of_axes_is_refused():
    with pytest.raises(
        AxisError,
        match=r"Got 1 axis name\(s\) \('batch'\) for an array of shape \(2, 3\) with 2 dimension\(s\)",
    ):
        named(jnp.ones((2, 3)), ("batch",))


def test_wrong_axis_size_is_refused():
    with pytest.raises(AxisError, match=r"Axis 'embed' was given size 4, but dimension 1 .* size 3"):
        NamedArray(jnp.ones((2, 3)), (Axis("batch", 2), Axis("embed", 4)))


def test_duplicate_names_are_refused():
    with pytest.raises(DuplicateAxisError, match=r"Duplicate axis names 'a'"):
        named(jnp.ones((2, 2)), ("a", "a"))


def test_bad_axis_entries_are_refused():
    with pytest.raises(NamedTypeError, match=r"Axis 1 must be a name \(str\) or an Axis, got 3"):
        named(jnp.ones((2, 2)), ("a", 3))
    with pytest.raises(NamedTypeError, match="Cannot wrap a NamedArray in a NamedArray"):
        NamedArray(_x(), ("a", "b"))


def test_unknown_axis_lists_available():
    with pytest.raises(
        AxisNotFoundError,
        match=r"Axis 'embd' not found in NamedArray\(batch=2, embed=3\)\. Available axes: 'batch', 'embed'\.",
    ):
        _x().axis_size("embd")


def test_ambiguous_protocols_raise():
    x = _x()
    with pytest.raises(NamedTypeError, match="use namedaxes.dot"):
        x @ x
    with pytest.raises(NamedTypeError, match="unbind"):
        iter(x)
    with pytest.raises(NamedTypeError, match="axis_size"):
        len(x)


def test_scalar_and_item():
    s = named(jnp.float32(2.5), ())
    assert s.item() == 2.5
    assert s.scalar().shape == ()
    with pytest.raises(AxisError, match=r"scalar\(\) needs an array with no axes"):
        _x().scalar()


def test_tree_util_flattens_to_one_leaf_with_key_path():
    x = _x()
    leaves, treedef = jax.tree_util.tree_flatten(x)
    assert len(leaves) == 1 and leaves[0] is x.array
    (path, _), = jax.tree_util.tree_flatten_with_path(x)[0]
    assert jax.tree_util.keystr(path) == ".array"
    back = jax.tree_util.tree_unflatten(treedef, leaves)
    assert back.axes == x.axes
    assert jax.tree_util.tree_map(lambda a: a * 2, x).axes == x.axes
    assert is_named_array(x) and not is_named_array(x.array)


def test_placeholder_leaves_survive_unflatten():
    """JAX and equinox put None and sentinels in leaves; rebuilding must not validate them."""
    x = _x()
    _, treedef = jax.tree_util.tree_flatten(x)
    for placeholder in (None, object(), 0):
        rebuilt = jax.tree_util.tree_unflatten(treedef, [placeholder])
        assert rebuilt.axes == x.axes and rebuilt.array is placeholder


def test_jit_and_grad():
    x = _x()

    @jax.jit
    def double(x):
        return NamedArray(x.array * 2, x.axes)

    y = double(x)
    assert y.axes == x.axes
    np.testing.assert_allclose(y.array, x.array * 2)

    g = jax.grad(lambda x: jnp.sum(x.array**2))(x)
    assert isinstance(g, NamedArray) and g.axes == x.axes
    np.testing.assert_allclose(g.array, 2 * x.array)


def test_eval_shape_gives_named_shape_dtype_struct():
    out = jax.eval_shape(lambda x: NamedArray(x.array.astype(jnp.bfloat16), x.axes), _x())
    assert isinstance(out.array, jax.ShapeDtypeStruct)
    assert out.shape == {"batch": 2, "embed": 3}
    assert out.dtype == jnp.bfloat16
    assert out.nbytes == 12
    # A NamedArray can also be built directly around a ShapeDtypeStruct, and is checked.
    spec = jax.ShapeDtypeStruct((4, 5), jnp.float32)
    assert NamedArray(spec, ("a", "b")).shape == {"a": 4, "b": 5}
    with pytest.raises(AxisError, match="Got 1 axis name"):
        NamedArray(spec, ("a",))


def test_vmap_with_named_arrays_inside_and_unmapped():
    w = named(jnp.arange(3.0), ("embed",))
    rows = jnp.arange(6.0).reshape(2, 3)

    def per_row(w, row):
        r = named(row, ("embed",))  # built inside the mapped function: per-example shape
        return jnp.sum(NamedArray(r.array * w.array, r.axes).array)

    out = jax.vmap(per_row, in_axes=(None, 0))(w, rows)
    np.testing.assert_allclose(out, rows @ np.arange(3.0))


class Linear(eqx.Module):
    weight: NamedArray
    bias: NamedArray
    name: str = eqx.field(static=True, default="linear")


def _linear():
    return Linear(
        named(jnp.ones((3, 4)), ("embed", "mlp")),
        named(jnp.zeros(4), ("mlp",)),
    )


def test_inside_equinox_modules_with_filter_jit_and_filter_grad():
    model = _linear()
    x = jnp.arange(3.0)

    @eqx.filter_jit
    def apply(model, x):
        return x @ model.weight.array + model.bias.array

    np.testing.assert_allclose(apply(model, x), np.full(4, 3.0))

    grads = eqx.filter_grad(lambda m, x: jnp.sum(apply(m, x)))(model, x)
    assert isinstance(grads.weight, NamedArray)
    assert grads.weight.axes == model.weight.axes
    np.testing.assert_allclose(grads.weight.array, np.repeat(np.arange(3.0)[:, None], 4, 1))
    np.testing.assert_allclose(grads.bias.array, np.ones(4))


def test_equinox_partition_and_combine():
    model = _linear()
    params, static = eqx.partition(model, eqx.is_inexact_array)
    assert isinstance(params.weight, NamedArray)
    nones, _ = eqx.partition(model, lambda leaf: False)
    assert nones.weight.array is None and nones.weight.axes == model.weight.axes
    back = eqx.combine(params, static)
    assert back.weight.axes == model.weight.axes


def test_filter_eval_shape_on_module():
    shapes = eqx.filter_eval_shape(_linear)
    assert isinstance(shapes.weight.array, jax.ShapeDtypeStruct)
    assert shapes.weight.shape == {"embed": 3, "mlp": 4}
