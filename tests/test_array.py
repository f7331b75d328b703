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
    AxisSizeError,
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
    with pytest.raises(
        AxisError, match=r"Axis 'embed' was given size 4, but dimension 1 .* size 3"
    ):
        NamedArray(jnp.ones((2, 3)), (Axis("batch", 2), Axis("embed", 4)))


def test_duplicate_names_are_refused():
    with pytest.raises(DuplicateAxisError, match=r"Duplicate axis names 'a'"):
        named(jnp.ones((2, 2)), ("a", "a"))


def test_bad_axis_entries_are_refused():
    with pytest.raises(NamedTypeError, match=r"Axis 1 must be a name \(str\) or an Axis, got 3"):
        named(jnp.ones((2, 2)), ("a", 3))
    with pytest.raises(NamedTypeError, match="Cannot wrap a NamedArray in a NamedArray"):
        NamedArray(_x(), ("a", "b"))


def test_named_refuses_named_arrays_and_lists_of_them():
    # named() used to hand these to jnp.asarray: NumPy's "setting an array element with a sequence".
    with pytest.raises(
        NamedTypeError,
        match=r"Cannot wrap a NamedArray in a NamedArray .*Use rename\(\) to change its axis names",
    ):
        named(_x(), ("a", "b"))
    row = named(jnp.arange(3.0), "embed")
    for build in (named, NamedArray):
        with pytest.raises(
            NamedTypeError,
            match=r"Cannot build a NamedArray from a list of NamedArrays\. Join them by name "
            r"instead: na\.stack\('batch', arrays\) for a new axis, or "
            r"na\.concatenate\('batch', arrays\) along an axis they have\.",
        ):
            build([row, row], ("batch", "embed"))
    with pytest.raises(NamedTypeError, match=r"from a tuple of NamedArrays"):
        named(((row,),), ("a", "b", "embed"))  # nested
    assert named([[1, 2]], ("a", "b")).shape == {"a": 1, "b": 2}  # plain lists still convert


def test_implicit_array_conversion_is_refused(tmp_path):
    # NumPy used to wrap a NamedArray in a 0-d object array (and np.save pickled it).
    x = _x()
    msg = (
        r"Cannot convert NamedArray\(batch=2, embed=3\) to an array implicitly: that would drop "
        r"its axis names\. Use x\.array \(axes in the order \('batch', 'embed'\)\), or "
        r"x\.rearrange\(\('embed', 'batch'\)\)\.array for another order\."
    )
    for convert in (
        np.asarray,
        np.array,
        lambda v: np.stack([v, v]),
        lambda v: np.save(tmp_path / "x.npy", v),
        jnp.asarray,
    ):
        with pytest.raises(NamedTypeError, match=msg):
            convert(x)
    with pytest.raises(NamedTypeError, match=r"Use x\.array \(axes in the order \('embed',\)\)\.$"):
        np.asarray(named(jnp.ones(3), "embed"))
    # Scalars on the left still defer to NamedArray's operators.
    for left in (np.float32(2.0), np.array(2.0), jnp.float32(2.0)):
        np.testing.assert_array_equal((left * x).array, 2.0 * x.array)
        assert (left < x).axis_names == ("batch", "embed")
    np.testing.assert_array_equal(np.asarray(x.array), np.arange(6.0).reshape(2, 3))


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
    assert named(jnp.ones((1, 1)), ("a", "b")).item() == 1.0


def test_item_of_several_elements_names_the_axes():
    with pytest.raises(
        AxisError,
        match=r"item\(\) needs a single-element array, got NamedArray\(batch=2, embed=3\) with 6 "
        r"elements\. Index or reduce its axes first, e.g\. x\.max\(\)\.item\(\)\.",
    ):
        _x().item()


def test_tree_util_flattens_to_one_leaf_with_key_path():
    x = _x()
    leaves, treedef = jax.tree_util.tree_flatten(x)
    assert len(leaves) == 1 and leaves[0] is x.array
    ((path, _),) = jax.tree_util.tree_flatten_with_path(x)[0]
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


def test_bool_needs_exactly_one_element():
    assert bool(named(jnp.ones((1, 1)), ("a", "b"))) is True
    assert bool(named(jnp.zeros(()), ())) is False
    with pytest.raises(
        AxisError,
        match=r"The truth value of NamedArray\(a=3\) with 3 elements is ambiguous\. "
        r"Reduce it first, e.g\. bool\(x\.any\(\)\) or bool\(x\.all\(\)\)\.",
    ):
        bool(named(jnp.ones(3), "a"))
    with pytest.raises(AxisError, match=r"NamedArray\(a=0\) with 0 elements"):
        bool(named(jnp.ones(0), "a"))


def test_list_input_is_checked_against_axis_sizes():
    with pytest.raises(
        AxisSizeError,
        match=r"Axis 'a' was given size 5, but dimension 0 of the array has size 3 \(array shape \(3,\)\)",
    ):
        NamedArray([1, 2, 3], (Axis("a", 5),))
    x = NamedArray([1, 2, 3], (Axis("a", 3),))
    assert isinstance(x.array, jax.Array) and x.dtype == jnp.int32
    np.testing.assert_array_equal(x.array, [1, 2, 3])
    assert NamedArray([[1.0], [2.0]], ("a", "b")).shape == {"a": 2, "b": 1}


def test_repr_and_nbytes_of_typed_prng_keys_and_shape_structs():
    keys = jax.random.split(jax.random.key(0), 4)
    layered = named(keys, "layer")
    assert repr(layered) == "NamedArray(key<fry>, layer=4)"
    assert layered.nbytes == keys.size * keys.dtype.itemsize
    assert repr(named(jax.random.key(0), ())) == "NamedArray(key<fry>)"
    spec = jax.ShapeDtypeStruct((4,), keys.dtype)
    assert repr(NamedArray(spec, ("layer",))) == "NamedArray(key<fry>, layer=4)"
    out = jax.eval_shape(lambda k: named(k, "layer"), keys)
    assert repr(out) == "NamedArray(key<fry>, layer=4)"
    assert (
        repr(NamedArray(jax.ShapeDtypeStruct((2,), jnp.bfloat16), ("a",)))
        == "NamedArray(bfloat16, a=2)"
    )


def test_named_places_numpy_input_without_compiling(caplog):
    import logging

    caplog.set_level(logging.WARNING)
    with jax.log_compiles():
        x = named(np.ones((3, 1, 13)), ("a", "b", "c"))  # shapes no other test uses
    assert isinstance(x.array, jax.Array) and x.dtype == jnp.float32  # canonicalised as by jnp
    assert caplog.records == []
    # The check can fail: jnp.asarray of a NumPy array of a new shape compiles.
    with jax.log_compiles():
        jnp.asarray(np.ones((3, 1, 17)))
    assert caplog.records


@pytest.mark.parametrize(
    "name",
    [
        "astype",
        "sum",
        "prod",
        "mean",
        "max",
        "min",
        "var",
        "std",
        "any",
        "all",
        "argmax",
        "argmin",
        "cumsum",
        "cumprod",
        "rearrange",
        "rename",
        "flatten_axes",
        "unflatten_axis",
        "unbind",
        "split",
        "broadcast_axis",
        "take",
    ],
)
def test_methods_take_the_same_arguments_as_their_functions(name):
    import inspect

    import namedaxes as na

    def params(fn):
        return [
            (p.name, p.kind, p.default) for p in list(inspect.signature(fn).parameters.values())[1:]
        ]

    assert params(getattr(NamedArray, name)) == params(getattr(na, name))


def test_methods_and_operators_match_the_functions():
    x = named(jnp.arange(6.0).reshape(2, 3), ("batch", "embed"))
    y = named(jnp.arange(3.0) + 1, "embed")
    assert (x + y).axes == x.axes and (y + x).axes == x.axes
    np.testing.assert_array_equal((2**y).array, 2 ** (jnp.arange(3.0) + 1))
    np.testing.assert_array_equal((x < 2).array, x.array < 2)
    np.testing.assert_array_equal(x.sum("embed").array, x.array.sum(1))
    np.testing.assert_array_equal(x["embed", 1].array, x.array[:, 1])
    np.testing.assert_array_equal(x.at["embed", 1].set(-1.0).array[:, 1], [-1.0, -1.0])
    assert x.rename({"embed": "hidden"}).axis_names == ("batch", "hidden")
    np.testing.assert_array_equal(round(x / 4, 1).array, jnp.round(x.array / 4, 1))
    with pytest.raises(TypeError, match="unsupported operand"):
        x + "a"  # not an operand: NotImplemented, then Python's own TypeError


def test_comparing_with_a_list_is_refused_not_identity():
    """``x == [1, 2, 3]`` fell back to identity: a silent ``False`` (and ``!=`` a ``True``)."""
    x = named(jnp.array([1, 2, 3]), "seq")
    for compare, op in ((lambda: x == [1, 2, 3], "equal"), (lambda: x != (1, 2, 3), "not_equal")):
        with pytest.raises(
            NamedTypeError,
            match=rf"^{op}\(\) needs a NamedArray or a scalar for x2, got .* \((list|tuple)\)",
        ):
            compare()
    assert (x == None) is False and (x != "seq") is True  # noqa: E711 - unrelated objects: identity
    np.testing.assert_array_equal((x == 2).array, [False, True, False])


_MAPPED = (
    r"NamedArray axes \(batch=2, embed=3\) do not match its array's shape \(3, 2\): was it mapped "
    r"by jax\.vmap or lax\.scan/lax\.map\? Map NamedArrays with na\.vmap / na\.scan, which keep names\."
)


def test_named_ops_refuse_an_array_that_jax_vmap_relabelled():
    import namedaxes as na

    x = _x()
    y = jax.vmap(lambda v: v, in_axes=1)(x)  # array (3, 2), axes still (batch=2, embed=3)
    with pytest.raises(AxisError, match=_MAPPED):
        y["batch", 0]
    with pytest.raises(AxisError, match=_MAPPED):
        y.sum("embed")
    with pytest.raises(AxisError, match=_MAPPED):
        y * 2
    with pytest.raises(AxisError, match=r"do not match its array's shape \(3,\)"):
        jax.vmap(lambda v: v.sum("batch"))(x)  # inside: the mapped dimension is gone
    # The named way keeps names (and a placeholder leaf, with no shape, is not checked).
    out = na.vmap(lambda v: v.sum("embed"), "batch")(x)
    assert out.axes == (Axis("batch", 2),)
    np.testing.assert_allclose(out.array, [3.0, 12.0])


def test_scalar_conversions_of_a_single_element_array():
    import operator

    one = named(jnp.full((1, 1), 2.5), ("a", "b"))
    assert float(one) == 2.5 and int(one) == 2 and complex(one) == 2.5 + 0j
    assert f"{one:.2f}" == "2.50"
    assert f"{one}" == str(one) == "NamedArray(float32, a=1, b=1)"
    assert [10, 20, 30][named(jnp.int32(1), ())] == 20
    assert operator.index(named(jnp.ones((1,), jnp.int32), "a")) == 1

    many = named(jnp.ones(3), "a")
    for convert, what in [
        (float, "float value"),
        (int, "int value"),
        (complex, "complex value"),
        (lambda v: f"{v:.2f}", "format '.2f'"),
    ]:
        with pytest.raises(
            AxisError, match=rf"The {what} of NamedArray\(a=3\) with 3 elements is ambiguous\."
        ):
            convert(many)
    with pytest.raises(
        NamedTypeError,
        match=r"NamedArray\(float32, a=1, b=1\) cannot be used as an index: only integer arrays "
        r"can\. Convert it first, e\.g\. x\.astype\(jnp\.int32\)\.",
    ):
        operator.index(one)
    with pytest.raises(AxisError, match=r"The index value of NamedArray\(a=3\) with 3 elements"):
        operator.index(named(jnp.ones(3, jnp.int32), "a"))


def test_named_array_is_immutable_and_copies_and_pickles():
    """Its names and array are checked together when it is made, so they cannot be set apart
    (x.axes = ... was accepted, and a sum then took the wrong dimension); copy, deepcopy and
    pickle still round-trip."""
    import copy
    import pickle

    x = named(jnp.arange(6.0).reshape(2, 3), ("batch", "embed"))
    with pytest.raises(NamedTypeError, match=r"^NamedArray is immutable: cannot set 'axes'"):
        x.axes = (Axis("embed", 2), Axis("batch", 3))
    with pytest.raises(NamedTypeError, match=r"^NamedArray is immutable: cannot set 'array'"):
        x.array = jnp.ones(7)
    with pytest.raises(NamedTypeError, match=r"^NamedArray is immutable: cannot delete"):
        del x.array
    for again in (copy.copy(x), copy.deepcopy(x), pickle.loads(pickle.dumps(x))):
        assert again.axes == x.axes
        np.testing.assert_array_equal(again.array, x.array)
    np.testing.assert_array_equal(x.sum("embed").array, [3.0, 12.0])
