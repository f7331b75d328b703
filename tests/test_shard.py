"""shard / auto_sharded / pspec_for / per-axis queries, on Auto and Explicit meshes."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import shard_shapes, spec_of
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import namedaxes as na
from namedaxes import Axis, ShardingError, axis_mapping, named
from namedaxes._errors import AxisError


def mapping_for(mesh):
    """batch over the first mesh axis; embed over the rest (split over their product)."""
    names = mesh.axis_names
    rest = names[1:]
    return {"batch": names[0], "embed": (rest[0] if len(rest) == 1 else rest) if rest else None}


def data():
    return named(jnp.arange(8 * 12, dtype=jnp.float32).reshape(8, 12), ("batch", "embed"))


def expected_shard_shape(mesh):
    sizes = dict(mesh.shape)
    names = mesh.axis_names
    rest = int(np.prod([sizes[n] for n in names[1:]])) if len(names) > 1 else 1
    return (8 // sizes[names[0]], 12 // rest)


# -- outside jit ---------------------------------------------------------------------------------


def test_shard_outside_jit(mesh):
    x = data()
    mapping = mapping_for(mesh)
    y = na.shard(x, mapping, mesh)
    assert y.array.sharding.spec == na.resolve(x.axes, mapping, mesh)
    assert shard_shapes(y) == [expected_shard_shape(mesh)]
    np.testing.assert_array_equal(np.asarray(y.array), np.asarray(x.array))
    assert y.axes == x.axes
    # Already placed: nothing is copied, the very same tree comes back.
    assert na.shard(y, mapping, mesh) is y
    tree = {"a": y, "b": [y]}
    again = na.shard(tree, mapping, mesh)
    assert again is tree


def test_shard_moves_only_what_needs_moving(mesh_2x4):
    placed = na.shard(data(), {"batch": "data"}, mesh_2x4)
    fresh = named(jnp.ones((8, 4)), ("batch", "mlp"))
    out = na.shard({"p": placed, "f": fresh}, {"batch": "data"}, mesh_2x4)
    assert out["p"].array is placed.array
    assert spec_of(out["f"]) == P("data")


def test_plain_arrays_and_other_leaves_untouched(mesh_2x4):
    plain = jnp.ones((8, 4))
    tree = {"x": data(), "plain": plain, "n": 3, "s": "hi", "none": None}
    out = na.shard(tree, {"batch": "data", "embed": "model"}, mesh_2x4)
    assert out["plain"] is plain and out["n"] == 3 and out["s"] == "hi" and out["none"] is None
    assert spec_of(out["x"]) == P("data", "model")


def test_context_mapping_and_set_mesh(mesh_2x4):
    with jax.set_mesh(mesh_2x4), axis_mapping(batch="model"):
        y = na.shard(data())
    assert spec_of(y) == P("model")


def test_numpy_leaf_is_placed(mesh_2x4):
    x = na.NamedArray(np.ones((8, 4), np.float32), ("batch", "embed"))
    y = na.shard(x, {"batch": "data"}, mesh_2x4)
    assert isinstance(y.array, jax.Array) and spec_of(y) == P("data")
    shapes = na.shard(jax.eval_shape(data), {"batch": "data"}, mesh_2x4)
    assert shapes.array.sharding == NamedSharding(mesh_2x4, P("data", None))


# -- inside jit ----------------------------------------------------------------------------------


def test_shard_inside_jit_matches_outside(mesh):
    x = data()
    mapping = mapping_for(mesh)
    outside = na.shard(named(x.array * 2, x.axes), mapping, mesh)
    with jax.set_mesh(mesh):
        inside = jax.jit(lambda t: na.shard(named(t.array * 2, t.axes), mapping))(x)
    assert spec_of(inside) == spec_of(outside)
    assert shard_shapes(inside) == shard_shapes(outside)
    np.testing.assert_array_equal(np.asarray(inside.array), np.asarray(outside.array))


def test_shard_inside_jit_with_mesh_argument(mesh_2x4):
    # No jax.set_mesh: the mesh comes from the argument. (An Explicit-axis result needs the jit's
    # devices to be the mesh's, hence the replicated input.)
    x = jax.device_put(data(), NamedSharding(mesh_2x4, P()))
    y = jax.jit(lambda t: na.shard(t, {"embed": "data"}, mesh_2x4))(x)
    assert spec_of(y) == P(None, "data")


def test_mixed_axis_types_inside_jit():
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit, AxisType.Auto))
    mapping = {"batch": ("data", "model"), "embed": None}
    with jax.set_mesh(mesh):
        y = jax.jit(lambda t: na.shard(t, mapping))(data())
        z = jax.jit(lambda t: na.shard(t, {"batch": "data", "embed": "model"}))(data())
    assert spec_of(y) == P(("data", "model"))
    assert shard_shapes(y) == [(1, 12)]
    assert spec_of(z) == P("data", "model")
    assert shard_shapes(z) == [(4, 3)]


def test_auto_sharded(mesh_2x4):
    x = data()
    assert na.auto_sharded(x) is x  # no mapping
    with axis_mapping(batch="data"):
        assert na.auto_sharded(x) is x  # no mesh
        assert spec_of(na.auto_sharded(x, mesh_2x4)) == P("data")
        with jax.set_mesh(mesh_2x4):
            assert spec_of(na.auto_sharded(x)) == P("data")
            inside = jax.jit(na.auto_sharded)(x)
    assert spec_of(inside) == P("data")


# -- field metadata ------------------------------------------------------------------------------


class Linear(eqx.Module):
    weight: jax.Array = na.field(axis_names=("embed", "mlp"))
    bias: jax.Array
    name: str = eqx.field(static=True, default="lin")


def test_module_fields_are_sharded_by_name(mesh_2x4):
    lin = Linear(jnp.ones((8, 4)), jnp.zeros((4,)))
    out = na.shard(lin, {"embed": "data", "mlp": "model"}, mesh_2x4)
    assert spec_of(out.weight) == P("data", "model")
    assert out.bias is lin.bias
    specs = na.pspec_for(lin, {"embed": "data", "mlp": "model"}, mesh=mesh_2x4)
    assert specs.weight == P("data", "model") and specs.bias is None


def test_field_rank_mismatch(mesh_2x4):
    bad = Linear(jnp.ones((8,)), jnp.zeros((4,)))
    with pytest.raises(
        AxisError, match=r"Field Linear.weight is declared with axis_names \('embed', 'mlp'\)"
    ):
        na.shard(bad, {"embed": "data"}, mesh_2x4)


class _Placeholder(eqx.Module):
    weight: object = na.field(axis_names=("embed", "mlp"))


def test_field_placed_after_a_placeholder_of_the_same_structure(mesh_2x4):
    # The tree walk is cached per structure: a first tree holding a Python number in the declared
    # field must not make a later one holding an array (the same treedef) lose its names.
    mapping = {"embed": "data", "mlp": "model"}
    assert na.pspec_for(_Placeholder(1.0), mapping, mesh=mesh_2x4).weight == P()
    out = na.shard(_Placeholder(jnp.ones((8, 4))), mapping, mesh_2x4)
    assert spec_of(out.weight) == P("data", "model")
    assert shard_shapes(out.weight) == [(4, 1)]


class _Listed(eqx.Module):
    weights: list = na.field(axis_names=("embed",))


def test_field_holding_a_container_is_refused(mesh_2x4):
    layer = _Listed([jnp.ones(8), jnp.ones(8)])
    with pytest.raises(
        AxisError,
        match=r"Field _Listed\.weights is declared with axis_names \('embed'\) but holds a list "
        r"\(2 leaves\), and axis_names name the dimensions of one array\. Declare the names on "
        r"each array's own field, or hold NamedArrays in it",
    ):
        na.shard(layer, {"embed": "model"}, mesh_2x4)


# -- pspec_for / infer_resource_partitions -------------------------------------------------------


def test_pspec_for_concrete_tracer_and_shape_struct(mesh_2x4):
    mapping = {"batch": "data", "embed": "model"}
    placed_plain = jax.device_put(jnp.ones((4, 4)), NamedSharding(mesh_2x4, P("model", None)))
    tree = {"x": data(), "s": 1.5, "z": jnp.float32(2), "plain": placed_plain, "np": np.ones(3)}
    expected = {"x": P("data", "model"), "s": P(), "z": P(), "plain": P("model", None), "np": None}
    assert na.pspec_for(tree, mapping, mesh=mesh_2x4) == expected
    assert na.pspec_for(tree, mapping, mesh={"data": 2, "model": 4}) == expected
    shapes = jax.eval_shape(lambda: data())
    assert isinstance(shapes.array, jax.ShapeDtypeStruct)
    assert na.pspec_for(shapes, mapping, mesh=mesh_2x4) == P("data", "model")
    seen = []

    def f(t):
        seen.append(na.pspec_for(t, mapping))
        return t

    with jax.set_mesh(mesh_2x4):
        jax.jit(f)(data())
    assert seen == [P("data", "model")]


def test_pspec_for_as_jit_shardings(mesh_2x4):
    x = data()
    specs = na.pspec_for({"x": x}, {"batch": "data"}, mesh=mesh_2x4)
    with jax.set_mesh(mesh_2x4):
        y = jax.jit(lambda t: t, out_shardings=specs)({"x": x})
    assert spec_of(y["x"]) == P("data")


def test_infer_resource_partitions(mesh_2x4):
    tree = {"x": data(), "n": 2.0, "plain": jnp.ones(3)}
    out = na.infer_resource_partitions(tree, {"batch": "data"}, mesh_2x4)
    assert out["x"] == NamedSharding(mesh_2x4, P("data", None))
    assert out["n"] == NamedSharding(mesh_2x4, P())
    assert out["plain"] == tree["plain"].sharding


# -- per-axis queries ----------------------------------------------------------------------------


def test_physical_axis_queries(mesh_2x4):
    m = {"batch": ("data", "model"), "embed": "model", "head": None}
    assert na.physical_axis_name("batch", m) == ("data", "model")
    assert na.physical_axis_name(Axis("embed", 4), m, mesh_2x4) == "model"
    assert na.physical_axis_name("other", m) is None
    assert na.physical_axis_size("batch", m, mesh_2x4) == 8
    assert na.physical_axis_size("embed", m, {"data": 2, "model": 4}) == 4
    assert na.physical_axis_size("head", m) == 1  # replicated: no mesh needed
    assert na.physical_axis_size("other", m) == 1
    with jax.set_mesh(mesh_2x4), axis_mapping(m):
        assert na.physical_axis_size("batch") == 8
        assert na.round_axis_for_partitioning(Axis("embed", 10)) == Axis("embed", 12)
    assert na.round_axis_for_partitioning(Axis("embed", 12), m, mesh_2x4) == Axis("embed", 12)
    s = na.sharding_for_axis(Axis("batch", 16), m, mesh_2x4)
    assert s == NamedSharding(mesh_2x4, P(("data", "model")))
    s2 = na.sharding_for_axis(
        (Axis("batch", 16), Axis("embed", 4)), {"batch": "data", "embed": "model"}, mesh_2x4
    )
    assert s2.spec == P("data", "model")


def test_physical_axis_name_of_an_axis_needs_no_mesh_when_the_rules_decide(mesh_2x4):
    """``physical_axis_name(Axis("batch", 8), {"batch": "data"})`` raised ``NoMeshError`` although
    the one rule decides without sizes (and the bare name needed no mesh)."""
    assert na.physical_axis_name(Axis("batch", 8), {"batch": "data"}) == "data"
    assert na.physical_axis_name(Axis("batch", 8), {"batch": ("data", "model")}) == (
        "data",
        "model",
    )
    assert na.physical_axis_name(Axis("batch", 8), {"batch": None}) is None
    # a mesh, given or set, checks the answer: divisibility and the mesh axes
    assert na.physical_axis_name(Axis("batch", 8), {"batch": "data"}, mesh_2x4) == "data"
    with jax.set_mesh(mesh_2x4):
        with pytest.raises(ShardingError, match=r"Cannot shard axis 'batch' \(size 3\)"):
            na.physical_axis_name(Axis("batch", 3), {"batch": "data"})
        with pytest.raises(ShardingError, match=r"'tensor'"):
            na.physical_axis_name(Axis("batch", 8), {"batch": "tensor"})
    # fallback rules: the size and a mesh decide
    rules = na.AxisRules([("embed", "model"), ("embed", "data")])
    with pytest.raises(na.NoMeshError, match=r"physical_axis_name needs a device mesh"):
        na.physical_axis_name(Axis("embed", 6), rules)


def test_physical_axis_queries_agree_with_resolve(mesh_2x4):
    """With fallback rules the size decides, exactly as resolve decides."""
    rules = na.AxisRules([("embed", "model"), ("embed", "data")])
    for size in (4, 6, 8, 3):
        spec = na.resolve((Axis("embed", size),), rules, mesh_2x4, unsatisfied="replicate")
        if size == 3:
            with pytest.raises(ShardingError, match=r"Cannot shard axis 'embed' \(size 3\)"):
                na.physical_axis_size(Axis("embed", size), rules, mesh_2x4)
            continue
        assert na.physical_axis_name(Axis("embed", size), rules, mesh_2x4) == spec[0]
        assert (
            na.physical_axis_size(Axis("embed", size), rules, mesh_2x4)
            == {"model": 4, "data": 2}[spec[0]]
        )
    assert (
        na.physical_axis_size(Axis("embed", 6), rules, mesh_2x4) == 2
    )  # not 4: 4 does not divide 6
    with pytest.raises(
        ShardingError, match=r"needs an Axis with its size for 'embed': it has 2 rules"
    ):
        na.physical_axis_name("embed", rules)
    # round_axis_for_partitioning gives a size resolve places on the first rule's mesh axes.
    padded = na.round_axis_for_partitioning(Axis("embed", 6), rules, mesh_2x4)
    assert padded == Axis("embed", 8) and na.resolve((padded,), rules, mesh_2x4) == P("model")
    with pytest.raises(
        na.NamedTypeError, match=r"sharding_for_axis needs an Axis or a sequence of Axis"
    ):
        na.sharding_for_axis("batch", {"batch": "data"}, mesh_2x4)


# -- errors --------------------------------------------------------------------------------------


def test_shard_without_mesh():
    with pytest.raises(
        ShardingError, match=r"shard needs a device mesh, but none was given and none is set"
    ):
        na.shard(data(), {"batch": "data"})


def test_shard_without_mapping(mesh_2x4):
    with pytest.raises(
        ShardingError, match=r"shard\(\) got no mapping and no axis_mapping is in force"
    ):
        na.shard(data(), mesh=mesh_2x4)


def test_shard_bad_mesh_axis(mesh_2x4):
    with pytest.raises(ShardingError, match=r"names mesh axis 'dat' .* has axes 'data', 'model'"):
        na.shard(data(), {"batch": "dat"}, mesh_2x4)


def test_shard_indivisible(mesh_2x4):
    x = named(jnp.ones((6, 3)), ("batch", "embed"))
    with pytest.raises(
        ShardingError,
        match=r"Cannot shard axis 'embed' \(size 3\).*\(model=4\): 4 does not divide 3",
    ):
        na.shard(x, {"batch": "data", "embed": "model"}, mesh_2x4)


def test_pspec_for_needs_mesh_and_mapping():
    with pytest.raises(ShardingError, match=r"pspec_for needs a device mesh"):
        na.pspec_for(data(), {"batch": "data"})
    with pytest.raises(ShardingError, match=r"pspec_for\(\) got no mapping"):
        na.pspec_for(data())
    assert na.pspec_for({"n": 1}, {"batch": "data"}) == {"n": P()}  # nothing named: no mesh needed


def test_placing_a_constant_inside_an_eagerly_traced_body(axis_type):
    """Under a concrete mesh, the body of an eager jax.lax.scan is traced with only the abstract
    mesh: a concrete array it closes over is constrained there like a traced one (it was refused
    as 'an AbstractMesh outside jit', which made eager model calls under a mapping fail)."""
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(axis_type,) * 2)
    pos = na.arange({"position": 8})

    def body(total, _):
        placed = na.auto_sharded(pos)
        return total + placed.array.sum(), None

    with jax.set_mesh(mesh), na.axis_mapping({"position": "model"}):
        total, _ = jax.lax.scan(body, jnp.int32(0), None, length=2)
    assert int(total) == 2 * sum(range(8))


def test_abstract_mesh_outside_jit_refuses_a_tree_mixing_arrays_and_shape_structs(mesh_2x4):
    """One ShapeDtypeStruct leaf does not let the tree's concrete arrays through: they have no
    devices to go to on an AbstractMesh (they met JAX's own errors, or stayed unplaced on Auto)."""
    abstract = mesh_2x4.abstract_mesh
    refused = (
        r"shard was given an AbstractMesh outside jit, but placing arrays needs devices\. "
        r"Pass the concrete jax\.sharding\.Mesh"
    )
    struct = jax.ShapeDtypeStruct((8,), jnp.float32)
    tree = {"w": data(), "s": named(struct, ("batch",))}
    with pytest.raises(ShardingError, match=refused):
        na.shard(tree, {"batch": "data"}, abstract)
    with pytest.raises(ShardingError, match=rf"AutoShardingRule\.{refused}"):
        na.rules.AutoShardingRule().shard({"w": jnp.ones((8, 16)), "s": struct}, abstract)
    # the shape structs alone take the sharding
    alone = na.shard({"s": named(struct, ("batch",))}, {"batch": "data"}, abstract)
    assert alone["s"].array.sharding.spec == P("data")
