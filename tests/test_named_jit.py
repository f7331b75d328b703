"""named_jit: shardings of outputs, retrace counts, static leaves, in/out resources, donation."""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import shard_shapes, spec_of
from _meshes import make_mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import namedaxes as na
from namedaxes import NamedTypeError, axis_mapping, named


def data(rows=8, cols=12):
    return named(jnp.arange(rows * cols, dtype=jnp.float32).reshape(rows, cols), ("batch", "embed"))


def scale(x, by=2.0):
    return named(x.array * by, x.axes)


def test_outputs_placed_by_mapping_and_plain_outputs_keep_sharding(mesh):
    first = mesh.axis_names[0]
    plain = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P(first)))

    @na.named_jit
    def f(x, p):
        return {"x": scale(x), "p": p * 2, "tag": "ok", "n": 7}

    with jax.set_mesh(mesh), axis_mapping(batch=first):
        out = f(data(), plain)
    assert spec_of(out["x"]) == P(first)
    assert shard_shapes(out["x"]) == [(8 // mesh.shape[first], 12)]
    np.testing.assert_array_equal(np.asarray(out["x"].array), np.asarray(data().array) * 2)
    # The plain output is not forced to be replicated.
    assert spec_of(out["p"]) == P(first) and shard_shapes(out["p"]) == [(8 // mesh.shape[first],)]
    assert out["tag"] == "ok" and out["n"] == 7
    assert out["x"].axes == data().axes


def test_inside_and_outside_jit_agree(mesh):
    names = mesh.axis_names
    mapping = {"batch": names[0], "embed": names[-1] if len(names) > 1 else None}

    def body(x):
        return na.shard(scale(x), mapping)

    with jax.set_mesh(mesh):
        eager = body(data())
        jitted = na.named_jit(body)(data())
    assert spec_of(jitted) == spec_of(eager)
    assert shard_shapes(jitted) == shard_shapes(eager)
    np.testing.assert_array_equal(np.asarray(jitted.array), np.asarray(eager.array))


def test_one_trace_per_signature_mapping_and_mesh(mesh_2x4, axis_type):
    traces = []

    @na.named_jit
    def f(x):
        traces.append(na.current_axis_mapping())
        return scale(x)

    x = data()
    with jax.set_mesh(mesh_2x4):
        with axis_mapping(batch="data"):
            a = f(x)
            f(x)
        assert len(traces) == 1
        with axis_mapping(batch="model"):
            b = f(x)  # a different mapping: retraced, not the stale program
        with axis_mapping(batch="data"):
            f(x)  # back to the first: cached
    assert traces == [{"batch": "data"}, {"batch": "model"}]
    assert spec_of(a) == P("data") and spec_of(b) == P("model")
    other = make_mesh((4, 2), ("data", "model"), axis_type)
    with jax.set_mesh(other), axis_mapping(batch="data"):
        c = f(x)  # a different mesh: retraced
    assert len(traces) == 3
    assert shard_shapes(c) == [(2, 12)]


def test_own_mapping_traces_once_whatever_mapping_surrounds_the_call(mesh_2x4):
    """A named_jit with its own axis_resources, and an fsdp step, run the same program under any
    surrounding mapping: one trace, not one per mapping around the call."""
    traces = []

    def f(x):
        traces.append(na.current_axis_mapping())
        return scale(x)

    g = na.named_jit(f, axis_resources={"batch": "data"})
    step = na.fsdp(lambda w, x: (w, f(x)), {"embed": "data"}, {"batch": "data"})
    x, w = data(), na.named(jnp.ones((8, 4)), ("embed", "mlp"))
    with jax.set_mesh(mesh_2x4):
        for outer in (None, {"batch": "model"}, {"embed": None}):
            with axis_mapping(outer) if outer else contextlib.nullcontext():
                assert spec_of(g(x)) == P("data")
                assert spec_of(step(w, x)[1]) == P("data")
    assert len(traces) == 2  # one for g, one for the step


def test_static_leaves_hash_by_value():
    traces = []

    @na.named_jit
    def f(x, factor, label="a"):
        traces.append((factor, label))
        return scale(x, factor)

    x = data()
    f(x, 2.0)
    f(x, 2.0)
    f(x, 3.0)
    out = f(x, 3.0, label="b")
    assert traces == [(2.0, "a"), (3.0, "a"), (3.0, "b")]
    np.testing.assert_array_equal(np.asarray(out.array), np.asarray(x.array) * 3)


def test_axis_resources_in_force_while_tracing_and_out_resources(mesh_2x4):
    seen = []

    @na.named_jit(axis_resources={"batch": "model"}, out_axis_resources={"embed": "model"})
    def f(x):
        seen.append(na.current_axis_mapping())
        return na.shard(scale(x))  # by axis_resources, then re-placed by out_axis_resources

    with jax.set_mesh(mesh_2x4), axis_mapping(batch="data"):
        out = f(data())
    assert seen == [{"batch": "model"}]
    assert spec_of(out) == P(None, "model")


def test_in_axis_resources_moves_committed_arguments(mesh_2x4):
    # Committed on a different sharding: moved, not rejected.
    x = na.shard(data(), {"embed": "model"}, mesh_2x4)
    seen = []

    def f(x):
        seen.append(jax.typeof(x.array).sharding.spec)
        return scale(x)

    g = na.named_jit(f, in_axis_resources={"batch": "data"}, out_axis_resources={"batch": "data"})
    with jax.set_mesh(mesh_2x4):
        out = g(x)
    assert spec_of(out) == P("data")
    np.testing.assert_array_equal(np.asarray(out.array), np.asarray(data().array) * 2)
    if mesh_2x4.axis_types[0] == jax.sharding.AxisType.Explicit:
        assert seen == [P("data", None)]  # the traced input already had the new placement


def test_output_structure_that_depends_on_plain_input_shapes():
    @na.named_jit
    def f(v):
        return named(v * 2, ("a",))

    assert f(jnp.ones(3)).axes == (na.Axis("a", 3),)
    assert f(jnp.ones(5)).axes == (na.Axis("a", 5),)
    assert f(jnp.ones(3)).axes == (na.Axis("a", 3),)


def test_donation():
    x = data()
    f = na.named_jit(lambda x, y: scale(x), donate_args=(True, False))
    y = data()
    out = f(x, y)
    assert x.array.is_deleted() and not y.array.is_deleted()
    np.testing.assert_array_equal(np.asarray(out.array), np.asarray(y.array) * 2)
    g = na.named_jit(lambda x, *, y: scale(y), donate_kwargs={"y": True})
    z = data()
    g(data(), y=z)
    assert z.array.is_deleted()


def test_donation_predicate_is_asked_on_every_call():
    # The predicate depends on the leaves' dtypes, which the cache key (structure and leaf types)
    # does not tell apart: a bfloat16 argument it rejects is kept, a float32 one is donated, in
    # either order and on the cached path too.
    f = na.named_jit(lambda x: scale(x), donate_args=lambda a: a.dtype == jnp.float32)
    for _ in range(2):
        wide = data()
        narrow = named(wide.array.astype(jnp.bfloat16), wide.axes)
        out = f(narrow)
        assert not narrow.array.is_deleted() and out.array.dtype == jnp.bfloat16
        f(wide)
        assert wide.array.is_deleted()
        np.testing.assert_array_equal(
            np.asarray(f(narrow).array, np.float32), 2 * np.asarray(data().array)
        )
        assert not narrow.array.is_deleted()


def test_nested_in_jit_and_lower(mesh_2x4):
    inner = na.named_jit(scale, axis_resources={"batch": "data"})
    with jax.set_mesh(mesh_2x4):
        out = jax.jit(lambda x: inner(x))(data())
        lowered = inner.lower(data())
    assert spec_of(out) == P("data")
    assert isinstance(lowered, jax.stages.Lowered)
    assert "multiply" in lowered.as_text()


def test_lower_after_a_call_reuses_its_compiled_program(mesh_2x4):
    """Called under a mapping, then lowered and compiled (to read its HLO or memory), a program
    compiles once: the mapping a named_jit traces under leaves JAX's cache key with the trace, so
    the call's lowering is the one .lower() finds (it compiled twice, the call's lowering keyed by
    the surrounding mapping)."""
    compiles = []

    def listen(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)

    f = na.named_jit(lambda x: scale(x, 3.0))
    with jax.set_mesh(mesh_2x4), axis_mapping(batch="data"):
        x = na.shard(data())
        jax.monitoring.register_event_duration_secs_listener(listen)
        try:
            f(x)
            text = f.lower(x).compile().as_text()
            f(x)  # and the call again: cached
        finally:
            jax.monitoring.unregister_event_duration_listener(listen)
    assert len(compiles) == 1 and "multiply" in text


def test_lower_accepts_shape_structs(mesh_2x4):
    f = na.named_jit(scale, in_axis_resources={"batch": "data"})
    shapes = jax.eval_shape(data)
    with jax.set_mesh(mesh_2x4):
        text = f.lower(shapes).as_text()
    assert "sharding" in text


def test_method_and_decorator_forms():
    class Model:
        @na.named_jit
        def apply(self, x):
            return scale(x, 3.0)

    assert float(Model().apply(data()).array[0, 1]) == 3.0
    f = na.named_jit(axis_resources={"batch": None})(scale)
    assert float(f(data()).array[0, 1]) == 2.0
    assert f.__name__ == "scale"


def test_mesh_taken_from_arguments_without_set_mesh(mesh_2x4):
    x = na.shard(data(), {"batch": "data"}, mesh_2x4)
    f = na.named_jit(lambda x: na.shard(scale(x), {"embed": "model"}))
    out = f(x)
    assert spec_of(out) == P(None, "model")


def test_bad_input():
    with pytest.raises(
        NamedTypeError, match=r"named_jit expects a function, got \{'batch': 'data'\}"
    ):
        na.named_jit({"batch": "data"})
    with pytest.raises(NamedTypeError, match=r"named_jit expects a function, got 3 \(int\)"):
        na.named_jit(axis_resources={"batch": "data"})(3)
    with pytest.raises(NamedTypeError, match=r"named_jit manages static_argnums itself"):
        na.named_jit(scale, static_argnums=1)
    with pytest.raises(
        NamedTypeError, match=r"donate_args must be a pytree prefix of the positional"
    ):
        na.named_jit(scale, donate_args=(True, True, True))(data())
    with pytest.raises(na.MappingTypeError, match=r"Logical axis 'batch' is mapped to 1"):
        na.named_jit(scale, axis_resources={"batch": 1})


def test_cache_is_bounded():
    f = na.named_jit(lambda x, k: scale(x, k))
    f._cache_size = 3  # default 64; small here to keep compilations few
    x = data(2, 2)
    for k in (0, 1, 2, 0, 3):  # the call with 0 again makes 1 the least recently used
        assert float(f(x, float(k)).array[0, 1]) == k
    (layout,) = f._layouts.values()
    assert [key[0] for key in layout.by_key] == [(2.0,), (0.0,), (3.0,)]


# -- fail closed -------------------------------------------------------------------------------


def test_donate_args_must_be_bools():
    x, y = data(), data()
    with pytest.raises(
        NamedTypeError, match=r"donate_args entries must be True/False .* got 'no' \(str\)"
    ):
        na.named_jit(lambda a, b: a, donate_args="no")(x, y)
    with pytest.raises(
        NamedTypeError, match=r"got 0 \(int\) in donate_args=\(0, 1\).* not a list of positions"
    ):
        na.named_jit(lambda a, b: a, donate_args=(0, 1))(x, y)


def test_axis_resources_copied_when_decorating(mesh_2x4):
    mapping = {"batch": "data"}
    seen = []

    @na.named_jit(axis_resources=mapping)
    def f(x):
        seen.append(na.current_axis_mapping())
        return scale(x)

    mapping["batch"] = "model"  # mutating the caller's dict afterwards changes nothing
    with jax.set_mesh(mesh_2x4):
        out = f(data())
    assert seen == [{"batch": "data"}] and spec_of(out) == P("data")


def test_unhashable_static_argument_is_refused():
    class Box:  # non-array, unhashable (defines __eq__ only)
        def __init__(self, v):
            self.v = v

        def __eq__(self, other):
            return isinstance(other, Box) and other.v == self.v

        __hash__ = None

    f = na.named_jit(lambda x, box: scale(x, box.v))
    with pytest.raises(
        NamedTypeError, match=r"but args\[1\] is an unhashable Box .* Pass a hashable value"
    ):
        f(data(), Box(2.0))


def test_unknown_option_refused_when_decorating():
    with pytest.raises(NamedTypeError, match=r"named_jit got unknown option 'foo'"):
        na.named_jit(lambda x: x, foo=1)


def test_reusing_a_donated_argument_names_it():
    f = na.named_jit(lambda x, y: scale(x), donate_args=(True, False))
    x = na.named(jnp.ones((4, 4)) + 1, ("batch", "embed"))
    f(x, data())
    with pytest.raises(
        NamedTypeError, match=r"argument args\[0\]\.array was donated to an earlier call"
    ):
        f(x, data())
    z = na.named(jnp.ones((4, 4)) + 1, ("batch", "embed"))
    with pytest.raises(
        NamedTypeError, match=r"the same array is passed as args\[0\]\.array and args\[1\]\.array"
    ):
        f(z, z)


def test_first_calls_from_threads_trace_once_per_signature(mesh_2x4):
    import threading

    traces = []

    @na.named_jit
    def f(x):
        traces.append(x.array.shape)
        return scale(x)

    inputs = [data(rows) for rows in (2, 4, 6, 8)] * 2
    barrier = threading.Barrier(len(inputs), timeout=30)

    def run(x):
        barrier.wait()
        f(x)

    with jax.set_mesh(mesh_2x4), axis_mapping(batch="data"):
        threads = [threading.Thread(target=run, args=(x,)) for x in inputs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sorted(traces) == sorted({x.array.shape for x in inputs})


def test_empty_arrays_placed_like_shard(mesh_2x4):
    """A (batch=0, embed=8) output once came back replicated on Auto meshes."""
    x = na.named(jnp.zeros((0, 8)), ("batch", "embed"))
    mapping = {"batch": "data", "embed": "model"}
    with jax.set_mesh(mesh_2x4), axis_mapping(mapping):
        out = na.named_jit(lambda t: scale(t))(x)
        placed = na.shard(x)
    assert (
        out.array.sharding.spec
        == placed.array.sharding.spec
        == na.pspec_for(x, mapping, mesh=mesh_2x4)
        == P("data", "model")
    )


def test_clear_caches_empties_every_cache(mesh_2x4):
    traces = []

    @na.named_jit
    def f(x):
        traces.append(1)
        return scale(x)

    with jax.set_mesh(mesh_2x4), axis_mapping(batch="data"):
        f(data())
        f(data())
        assert len(traces) == 1
        na.clear_caches()
        f(data())  # traced again: its compiled programs were dropped
    assert len(traces) == 2
    assert na.resolve((na.Axis("batch", 8),), {"batch": "data"}, {"data": 2}) == P("data")


def test_mapping_typo_fails_on_plain_arrays_too(mesh_2x4):
    """named_jit(axis_resources=...) with a mesh-axis typo and only plain arrays."""
    f = na.named_jit(lambda x: x * 2, axis_resources={"batch": "dta"})
    with (
        jax.set_mesh(mesh_2x4),
        pytest.raises(
            na.ShardingError, match=r"names mesh axis 'dta' \(used by logical axis 'batch'\)"
        ),
    ):
        f(jnp.ones(8))
    with jax.set_mesh(mesh_2x4), pytest.raises(na.ShardingError, match=r"names mesh axis 'dta'"):
        na.shard({"w": jnp.ones(8)}, {"batch": "dta"})
    with pytest.raises(na.ShardingError, match=r"names mesh axis 'dta'"):
        na.pspec_for({"w": jnp.ones(8)}, {"batch": "dta"}, mesh=mesh_2x4)


def test_a_donated_argument_that_had_to_move_is_released(axis_type):
    """Donation frees the caller's buffer even when named_jit first moved the input onto the
    mapping's placement (the program consumed the moved copy); the stale array names itself when
    reused, as any donated array does."""
    mesh = make_mesh((8,), ("data",), axis_type)
    f = na.named_jit(lambda x: x * 2, in_axis_resources={"batch": "data"}, donate_args=(True,))
    with jax.set_mesh(mesh):
        for _ in range(2):  # the first call and the cached fast path
            x = named(jnp.arange(8.0), "batch")  # on one device: moved before the call
            y = f(x)
            assert x.array.is_deleted()
            np.testing.assert_array_equal(np.asarray(y.array), 2 * np.arange(8.0))
        with pytest.raises(NamedTypeError, match=r"was donated to an earlier call"):
            f(x)
        kept = na.shard(named(jnp.arange(8.0), "batch"), {"batch": "data"})
        f(kept)  # already placed: JAX donates it itself
        assert kept.array.is_deleted()


def test_grad_and_jvp_through_in_axis_resources_with_an_unplaced_input(axis_type):
    # Under jax.grad outside jit only the abstract mesh is known; the unplaced (single-device)
    # input is constrained by in_axis_resources there (on Auto this was JAX's "must be a
    # NamedSharding" TypeError).
    mesh = make_mesh((2, 4), ("data", "model"), axis_type)
    f = na.named_jit(lambda x: (x * x).sum().array, in_axis_resources={"batch": "data"})
    x = data()
    expected = 2 * np.asarray(x.array)
    with jax.set_mesh(mesh):
        grad = jax.grad(f)(x)
        tangent = jax.jvp(f, (x,), (x,))[1]
    np.testing.assert_allclose(np.asarray(grad.array), expected)
    np.testing.assert_allclose(float(tangent), float((expected * np.asarray(x.array)).sum()))


def test_unplaced_named_inputs_are_placed_by_the_mapping_in_force():
    # Without in_axis_resources, an unplaced (uncommitted) named input is placed by the mapping
    # in force, as resolve says, on both kinds: the body sees it sharded on Explicit (it came in
    # replicated), the compiled program takes it so, and it holds the same bytes on both kinds.
    mapping = {"batch": "data", "embed": "model"}
    x = data()
    expected = na.resolve(x.axes, mapping, {"data": 2, "model": 4})
    assert expected == P("data", "model")
    argument_bytes = []
    for axis_type in (jax.sharding.AxisType.Auto, jax.sharding.AxisType.Explicit):
        mesh = make_mesh((2, 4), ("data", "model"), axis_type)
        seen = []

        def body(x):
            seen.append(jax.typeof(x.array).sharding.spec)
            return scale(x)

        f = na.named_jit(body, axis_resources=mapping)
        with jax.set_mesh(mesh):
            compiled = f.lower(x).compile()
            argument_bytes.append(na.analysis.compiled_memory(f, x)["argument_bytes"])
            out = f(x)
        assert compiled.input_shardings[0][0] == NamedSharding(mesh, expected)
        if axis_type == jax.sharding.AxisType.Explicit:
            assert seen[0] == expected
        assert spec_of(out) == expected and shard_shapes(out) == [(4, 3)]
        np.testing.assert_array_equal(np.asarray(out.array), 2 * np.asarray(x.array))
    assert argument_bytes == [4 * 3 * 4] * 2


def test_placed_inputs_stay_where_they_are_under_the_mapping_in_force(mesh_2x4):
    seen = []

    @na.named_jit
    def f(x):
        seen.append(jax.typeof(x.array).sharding.spec)
        return scale(x)

    with jax.set_mesh(mesh_2x4), axis_mapping(batch="data"):
        placed = na.shard(data(), {"embed": "model"})
        out = f(placed)
        assert spec_of(placed) == P(None, "model")  # the caller's array was not moved
    assert spec_of(out) == P("data")
    if mesh_2x4.axis_types[0] == jax.sharding.AxisType.Explicit:
        assert seen == [P(None, "model")]


def test_input_committed_off_the_mesh_is_refused_naming_it(axis_type):
    mesh = make_mesh((2, 4), ("data", "model"), axis_type)
    other = make_mesh((8,), ("data",), axis_type)
    f = na.named_jit(lambda a, b: a + b, axis_resources={"batch": "data"})
    a = na.shard(data(), {"batch": "data"}, mesh)
    on_other = na.shard(data(), {"batch": "data"}, other)
    on_one = named(jax.device_put(data().array, jax.devices()[3]), ("batch", "embed"))
    fix = r"Pass in_axis_resources=\.\.\. to move it onto this mesh, or place it there before"
    with pytest.raises(
        na.ShardingError,
        match=r"named_jit: argument args\[1\]\.array is committed to another mesh, Mesh\(data=8\), "
        r"not to the mesh in force, Mesh\(data=2, model=4\)\. " + fix,
    ):
        f(a, on_other)  # the mesh is the first argument's
    with jax.set_mesh(mesh):
        with pytest.raises(
            na.ShardingError,
            match=r"argument args\[1\]\.array is committed to one device, CpuDevice\(id=3\), "
            r"not to the mesh in force, Mesh\(data=2, model=4\)\. " + fix,
        ):
            f(a, on_one)
        mapping = {"batch": "data"}
        g = na.named_jit(lambda a, b: a + b, mapping, in_axis_resources=mapping)
        moved = g(a, on_other)  # in_axis_resources moves it
    assert spec_of(moved) == P("data") and shard_shapes(moved) == [(4, 12)]


def test_input_on_the_one_device_of_a_one_device_mesh_stays(axis_type):
    """An array committed to the only device of a 1-device mesh (a model loaded without a
    mapping, a batch put on the device) is on the mesh: it is not refused as off the mesh."""
    mesh = jax.make_mesh((1,), ("data",), devices=jax.devices()[:1], axis_types=(axis_type,))
    f = na.named_jit(lambda x: x * 2)
    x = named(jax.device_put(jnp.ones((4, 3)), jax.devices()[0]), ("batch", "embed"))
    with jax.set_mesh(mesh), na.axis_mapping({"batch": "data"}):
        out = f(x)
    np.testing.assert_array_equal(out.array, np.full((4, 3), 2.0))


def test_an_unplaced_input_the_mapping_cannot_divide_names_named_jit_remedies(axis_type):
    """The advice names what a named_jit caller can do (resolve's generic advice named options
    named_jit does not have); the error keeps resolve's fields."""
    mesh = make_mesh((2, 4), ("data", "model"), axis_type)
    loss = na.named_jit(lambda x: x.array.sum())
    x = named(jnp.ones((3, 8)), ("batch", "embed"))  # made outside the mesh: unplaced
    with jax.set_mesh(mesh), axis_mapping({"batch": "data"}):
        with pytest.raises(
            na.UnsatisfiedAxisError,
            match=r"^named_jit cannot place argument args\[0\] by the mapping in force\. .*Cannot "
            r"shard axis 'batch' \(size 3\) .*Candidates: \(data=2\): 2 does not divide 3\. Place "
            r"it yourself before the call \(na\.shard\(x, mapping, mesh\) with a mapping that "
            r"divides it, or pad it\), or give 'batch' a fallback in a list mapping, e\.g\. "
            r"\[\.\.\., \('batch', 'data'\), \('batch', None\)\], which replicates it where no "
            r"earlier rule applies\.$",
        ) as caught:
            loss(x)
        assert caught.value.axis == "batch" and caught.value.candidates == (("data",),)
        fallback = [("batch", "data"), ("batch", None)]
        with axis_mapping(fallback):
            assert float(loss(x)) == 24.0
