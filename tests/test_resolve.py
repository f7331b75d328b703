"""resolve() and AxisRules: the single logical-to-mesh decision."""

import pickle

import pytest
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from namedaxes import Axis, AxisRules, DuplicateAxisError, MappingTypeError, ShardingError, resolve
from namedaxes._errors import MeshError, NamedTypeError
from namedaxes._logical._rules import as_rules, merge_rules

B8, E6, M4 = Axis("batch", 8), Axis("embed", 6), Axis("mlp", 4)
MESH = {"data": 2, "model": 4}


def test_mapping_basic_and_replicated():
    assert resolve((B8, E6), {"batch": "data"}, MESH) == P("data", None)
    assert resolve((B8, M4), {"batch": "data", "mlp": "model"}, MESH) == P("data", "model")
    assert resolve((B8,), {"batch": None}, MESH) == P(None)
    assert resolve((), {"batch": "data"}, MESH) == P()


def test_multi_axis_entry_is_a_tuple_single_is_a_name():
    assert resolve((B8,), {"batch": ("data", "model")}, MESH) == P(("data", "model"))
    assert resolve((B8,), {"batch": ("data",)}, MESH) == P("data")
    assert resolve((B8,), {"batch": ()}, MESH) == P(None)


def test_accepts_mesh_abstract_mesh_and_mapping(mesh):
    names = mesh.axis_names
    spec = resolve((B8,), {"batch": names[0]}, mesh)
    assert spec == P(names[0])
    assert resolve((B8,), {"batch": names[0]}, mesh.abstract_mesh) == spec
    assert resolve((B8,), {"batch": names[0]}, dict(mesh.shape)) == spec


def test_plans_for_a_mesh_that_does_not_exist():
    mesh = {"data": 64, "model": 4}
    axes = (Axis("batch", 256), Axis("embed", 4096), Axis("heads", 32))
    rules = {"batch": "data", "embed": "model", "heads": "model"}
    # heads falls back to nothing: its only rule's mesh axis is taken by embed.
    assert resolve(axes, rules, mesh, unsatisfied="replicate") == P("data", "model", None)
    abstract = AbstractMesh((64, 4), ("data", "model"))
    assert resolve(axes, rules, abstract, unsatisfied="replicate") == P("data", "model", None)


def test_fallback_rules_in_order():
    rules = AxisRules([("embed", "model"), ("embed", "data"), ("embed", None)])
    assert resolve((Axis("embed", 8),), rules, MESH) == P("model")
    assert resolve((Axis("embed", 6),), rules, MESH) == P("data")  # 4 does not divide 6
    assert resolve((Axis("embed", 3),), rules, MESH) == P(None)  # explicit replicate fallback


def test_mesh_axis_used_once_per_array_with_fallback():
    rules = AxisRules([("batch", "data"), ("seq", "data"), ("seq", "model")])
    spec = resolve((Axis("batch", 4), Axis("seq", 8)), rules, MESH)
    assert spec == P("data", "model")
    # Rule order, not the array's axis order, decides who gets 'data' first.
    assert resolve((Axis("seq", 8), Axis("batch", 4)), rules, MESH) == P("model", "data")


def test_rule_order_is_priority_not_axis_order():
    """Batch's first rule must not steal 'model' from embed's earlier rule."""
    rules = AxisRules([("embed", "model"), ("batch", "model"), ("batch", "data")])
    be = resolve((Axis("batch", 8), Axis("embed", 8)), rules, MESH)
    eb = resolve((Axis("embed", 8), Axis("batch", 8)), rules, MESH)
    assert be == P("data", "model") and eb == P("model", "data")


def _permuted_spec(spec, perm):
    return P(*(spec[i] for i in perm))


@pytest.mark.parametrize(
    "rules",
    [
        AxisRules([("embed", "model"), ("batch", "model"), ("batch", "data"), ("mlp", "data")]),
        AxisRules(
            [("batch", ("data", "model")), ("batch", "data"), ("mlp", "model"), ("embed", "data")]
        ),
        AxisRules(
            [("mlp", "model"), ("embed", "model"), ("embed", None), ("batch", "data")],
            unsatisfied="replicate",
        ),
        [("heads", "model"), ("mlp", "model"), ("batch", "data"), ("mlp", "data")],
    ],
)
def test_permuting_axes_permutes_the_spec(rules):
    import itertools

    axes = (Axis("batch", 8), Axis("embed", 12), Axis("mlp", 16), Axis("heads", 4))
    for sizes in [(8, 12, 16, 4), (2, 8, 6, 8), (4, 4, 4, 2)]:
        sized = tuple(a.resize(n) for a, n in zip(axes, sizes))
        try:
            base = resolve(sized, rules, MESH, unsatisfied="replicate")
        except ShardingError:
            base = None
        for perm in itertools.permutations(range(len(sized))):
            permuted = tuple(sized[i] for i in perm)
            got = resolve(permuted, rules, MESH, unsatisfied="replicate")
            assert got == _permuted_spec(base, perm), (permuted, got, base)


def test_duplicate_axis_names_are_refused():
    with pytest.raises(DuplicateAxisError, match=r"Duplicate axis names 'a' in \('a', 'a'\)"):
        resolve((Axis("a", 4), Axis("a", 4)), {"a": "data"}, MESH)


def test_rules_as_a_list_of_pairs():
    pairs = [("embed", "model"), ("embed", "data")]
    assert resolve((Axis("embed", 6),), pairs, MESH) == P("data")
    assert resolve((Axis("embed", 6),), tuple(pairs), MESH) == P("data")
    with pytest.raises(
        MappingTypeError, match=r"Each rule must be a \(logical_name, mesh_axes\) pair"
    ):
        resolve((E6,), [("embed",)], MESH)


def test_none_rule_stops_fallbacks():
    rules = AxisRules([("batch", None), ("batch", "data")])
    assert resolve((B8,), rules, MESH) == P(None)


def test_size_one_and_zero_axes():
    assert resolve((Axis("batch", 0),), {"batch": "data"}, MESH) == P("data")
    assert resolve((B8,), {"batch": "one"}, {"one": 1, "data": 2}) == P("one")


def test_unknown_mesh_axis_is_an_error_listing_mesh_axes():
    with pytest.raises(
        ShardingError,
        match=r"names mesh axis 'dta' \(used by logical axis 'batch'\), but Mesh\(data=2, "
        r"model=4\) has axes 'data', 'model'\. Fix",
    ):
        resolve((E6,), {"batch": "dta"}, MESH)  # even though this array has no 'batch' axis


def test_same_mesh_axis_twice_without_fallback():
    with pytest.raises(
        ShardingError,
        match=r"Cannot shard axis 'embed' \(size 6\) of an array with axes \(batch=8, embed=6\) on "
        r"Mesh\(data=2, model=4\): no rule applies\. Candidates: \(data=2\): 'data' already used by "
        r"axis 'batch'\. Pad the axis with round_axis_for_partitioning, add a fallback rule",
    ):
        resolve((B8, E6), {"batch": "data", "embed": "data"}, MESH)


def test_indivisible_size():
    with pytest.raises(
        ShardingError,
        match=r"Cannot shard axis 'embed' \(size 6\).*Candidates: \(model=4\): 4 does not divide 6",
    ):
        resolve((E6,), {"embed": "model"}, MESH)
    with pytest.raises(ShardingError, match=r"\(data=2 x model=4\): 8 does not divide 6"):
        resolve((E6,), {"embed": ("data", "model")}, MESH)


def test_unsatisfied_error_names_the_same_axis_whatever_the_axis_order():
    # Both axes are unsatisfiable: the error names the first in rule order ('a'), for either
    # order of the array's axes (only the array's own layout, as listed, differs).
    a6, b6 = Axis("a", 6), Axis("b", 6)
    messages = []
    for axes in ((a6, b6), (b6, a6)):
        with pytest.raises(ShardingError, match=r"Cannot shard axis 'a' \(size 6\)") as err:
            resolve(axes, {"a": "data", "b": "model"}, {"data": 4, "model": 4})
        messages.append(str(err.value).replace("a=6, b=6", "AXES").replace("b=6, a=6", "AXES"))
    assert messages[0] == messages[1]


def test_policy_precedence():
    rules = AxisRules({"embed": "model"}, unsatisfied="replicate")
    assert resolve((E6,), rules, MESH) == P(None)
    with pytest.raises(ShardingError, match="no rule applies"):
        resolve((E6,), rules, MESH, unsatisfied="error")
    assert resolve((E6,), {"embed": "model"}, MESH, unsatisfied="replicate") == P(None)
    with pytest.raises(ShardingError, match=r"unsatisfied must be one of 'error', 'replicate'"):
        resolve((E6,), rules, MESH, unsatisfied="ignore")


def test_unknown_logical_name_is_not_an_error():
    assert resolve((B8,), {"not_in_this_model": "data"}, MESH) == P(None)


def test_bad_inputs_are_typed_errors():
    with pytest.raises(MappingTypeError, match=r"Logical axis 'batch' is mapped to 3 \(int\)"):
        resolve((B8,), {"batch": 3}, MESH)
    with pytest.raises(NamedTypeError, match=r"resolve needs Axis objects .* got 'batch'"):
        resolve(("batch",), {"batch": "data"}, MESH)
    with pytest.raises(MeshError, match=r"positive int sizes, got 'data': 0"):
        resolve((B8,), {"batch": "data"}, {"data": 0})
    with pytest.raises(NamedTypeError, match=r"Expected a jax.sharding.Mesh, AbstractMesh"):
        resolve((B8,), {"batch": "data"}, [("data", 2)])


def test_mesh_checks_are_the_shared_ones():
    # One check for every entry point: a wrongly typed size is both a MeshError and a TypeError,
    # and a mesh without devices is refused here as it is by the rules.
    with pytest.raises(
        MeshError, match=r"needs str axis names and positive int sizes, got 'data': '2'"
    ) as info:
        resolve((B8,), {"batch": "data"}, {"data": "2"})
    assert isinstance(info.value, NamedTypeError)
    with pytest.raises(MeshError, match=r"The mesh Mesh\(data=0\) has no devices"):
        resolve((B8,), {"batch": "data"}, AbstractMesh((0,), ("data",)))
    with pytest.raises(MeshError, match=r"The mesh Mesh\(\) has no devices: it has no axes"):
        resolve((B8,), {}, {})


def test_deterministic():
    a = resolve((B8, M4), {"batch": "data", "mlp": "model"}, MESH)
    b = resolve((B8, M4), {"mlp": "model", "batch": "data"}, dict(reversed(MESH.items())))
    assert a == b == P("data", "model")
    assert resolve((B8, M4), {"batch": "data", "mlp": "model"}, MESH) is a  # cached: same object


# -- AxisRules ---------------------------------------------------------------------------------


def test_axis_rules_value_semantics():
    r1 = AxisRules([("batch", "data"), ("batch", None)])
    r2 = AxisRules([("batch", ("data",)), ("batch", ())])
    assert r1 == r2 and hash(r1) == hash(r2)
    assert AxisRules([("batch", "data")]) != AxisRules([("batch", "data")], unsatisfied="replicate")
    assert {r1: 1}[r2] == 1
    assert pickle.loads(pickle.dumps(r1)) == r1
    assert r1.candidates("batch") == (("data",), None)
    assert r1.first("batch") == "data" and r1.first("nope") is None
    assert "batch" in r1 and len(r1) == 2
    assert AxisRules({"a": ("x", "y")}).mesh_axes == ("x", "y")


def test_axis_rules_immutable_and_repr():
    r = AxisRules([("batch", ("replica", "data")), ("embed", None)], unsatisfied="replicate")
    with pytest.raises(AttributeError, match="immutable"):
        r.foo = 1  # type: ignore[attr-defined]
    assert repr(r) == (
        "AxisRules([('batch', ('replica', 'data')), ('embed', None)], unsatisfied='replicate')"
    )
    assert eval(repr(r)) == r


def test_axis_rules_validation():
    with pytest.raises(MappingTypeError, match=r"Logical axis 'embed' is mapped to 4 \(int\)"):
        AxisRules([("embed", 4)])
    with pytest.raises(TypeError, match=r"contains 3 \(int\)"):  # MappingTypeError is a TypeError
        AxisRules({"embed": ("data", 3)})
    with pytest.raises(ShardingError, match=r"names a mesh axis twice"):
        AxisRules({"embed": ("data", "data")})
    with pytest.raises(
        MappingTypeError, match=r"must be a \(logical_name, mesh_axes\) pair, got 'ab'"
    ):
        AxisRules(["ab"])
    with pytest.raises(
        MappingTypeError, match=r"logical axis name must be a non-empty string, got 3"
    ):
        AxisRules([(3, "data")])
    with pytest.raises(
        ShardingError, match=r"unsatisfied must be one of 'error', 'replicate', got 'x'"
    ):
        AxisRules([], unsatisfied="x")  # type: ignore[arg-type]
    # A list is read as flax-style pairs, so a list of bare names is refused pair by pair.
    with pytest.raises(
        MappingTypeError, match=r"Each rule must be a \(logical_name, mesh_axes\) pair, got 'batch'"
    ):
        as_rules(["batch"])  # type: ignore[arg-type]
    with pytest.raises(
        MappingTypeError, match=r"Expected axis rules: a dict .* got 'batch' \(str\)"
    ):
        as_rules("batch")  # type: ignore[arg-type]


def test_replace_and_merge():
    r = AxisRules([("batch", "data"), ("batch", None), ("embed", "model")])
    assert r.replace({"batch": "model"}).pairs == (("embed", "model"), ("batch", "model"))
    assert merge_rules({"batch": "model"}, {"batch": "data", "e": None}) == {
        "batch": "model",
        "e": None,
    }
    merged = merge_rules(
        {"batch": "model"}, AxisRules([("batch", "data")], unsatisfied="replicate")
    )
    assert merged == AxisRules([("batch", "model"), ("batch", "data")], unsatisfied="replicate")
    # Inner wins, outer stays as a fallback.
    assert resolve((Axis("batch", 6),), merged, MESH) == P("data")


@pytest.mark.parametrize("axes", ["batch", Axis("batch", 8)])
def test_resolve_refuses_one_axis_for_a_sequence(axes):
    with pytest.raises(
        NamedTypeError, match=r"resolve needs a sequence of Axis objects, got .*batch"
    ):
        resolve(axes, {"batch": "data"}, {"data": 2})


def test_single_axis_helpers_check_the_whole_mapping_against_a_known_mesh():
    """Asking about an unmapped name must not hide a typo elsewhere in the mapping."""
    import namedaxes as na

    typo = {"batch": "dta"}
    with pytest.raises(ShardingError, match=r"mesh axis 'dta' \(used by logical axis 'batch'\)"):
        na.physical_axis_name("embed", typo, {"data": 2})
    with pytest.raises(ShardingError, match=r"mesh axis 'dta' \(used by logical axis 'batch'\)"):
        na.round_axis_for_partitioning(Axis("vocab", 5), typo, {"data": 2})
    assert na.physical_axis_name("embed", typo) is None  # no mesh known: nothing to check against
