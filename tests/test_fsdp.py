"""fsdp: parameters held sharded by the parameter mapping, computed under the compute mapping."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _collectives import gathered, partitioned_hlo
from _helpers import spec_of
from _meshes import make_mesh
from jax.sharding import PartitionSpec as P

import namedaxes as na
from namedaxes import NamedTypeError, ShardingError, named

PARAMS = {"embed": "data"}
COMPUTE = {"batch": "data"}


def loss_fn(w, x):
    h = jnp.einsum("be,em->bm", x.array, w.array)
    return jnp.mean(h**2)


@na.fsdp(parameter_mapping=PARAMS, compute_mapping=COMPUTE)
def train_step(w, x):
    x = na.auto_sharded(x)  # batch over 'data' (compute mapping)
    w_full = na.auto_sharded(w)  # the FSDP all-gather: 'embed' is replicated under compute
    loss, grad = jax.value_and_grad(loss_fn)(w_full, x)
    new_w = named(w.array - 0.1 * grad.array, w.axes)
    return new_w, grad, loss


def test_fsdp_weight_and_gradient_stay_sharded(axis_type):
    mesh = make_mesh((8,), ("data",), axis_type)
    w0 = np.linspace(-1, 1, 16 * 4, dtype=np.float32).reshape(16, 4)
    x0 = np.linspace(0, 2, 8 * 16, dtype=np.float32).reshape(8, 16)
    w = na.shard(named(jnp.asarray(w0), ("embed", "mlp")), PARAMS, mesh)
    x = named(jnp.asarray(x0), ("batch", "embed"))
    assert [s.data.shape for s in w.array.addressable_shards] == [(2, 4)] * 8  # 1/8 per device

    with jax.set_mesh(mesh):
        new_w, grad, loss = train_step(w, x)

    for arr in (new_w, grad):
        assert arr.axes == w.axes
        assert arr.array.sharding.spec[0] == "data"
        assert [s.data.shape for s in arr.array.addressable_shards] == [(2, 4)] * 8
    # Oracle: the same step in plain JAX on one device.
    ref_loss, ref_grad = jax.value_and_grad(lambda w: jnp.mean((x0 @ w) ** 2))(jnp.asarray(w0))
    np.testing.assert_allclose(np.asarray(grad.array), np.asarray(ref_grad), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(new_w.array), w0 - 0.1 * np.asarray(ref_grad), rtol=1e-5)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)


def test_fsdp_gathers_parameters_in_the_compute_dtype(axis_type):
    """A layer casts its float32 weight to bfloat16 before the compute mapping gathers it, so the
    FSDP all-gather moves bfloat16, on both mesh kinds (on Auto meshes XLA used to carry the
    gather's placement back into the cast and gather float32). The step's loss and gradient are
    those of the same step on one device, within bfloat16's rounding (XLA:CPU skips some bfloat16
    roundings, differently in the two programs)."""
    mesh = make_mesh((8,), ("data",), axis_type)
    lin = na.nn.Linear(na.Axis("embed", 16), {"mlp": 64}, key=jax.random.key(0), use_bias=False)
    x = na.random.normal(jax.random.key(1), {"batch": 8, "embed": 16})

    @na.nn.precision("params=float32,compute=bfloat16")
    def loss(lin, x):
        return lin(x).astype(jnp.float32).sum().scalar()

    step = na.fsdp(jax.value_and_grad(loss), parameter_mapping=PARAMS, compute_mapping=COMPUTE)
    want, want_grad = jax.jit(jax.value_and_grad(loss))(lin, x)
    with jax.set_mesh(mesh):
        moved = gathered(partitioned_hlo(step.lower(lin, x)))
        got, grad = step(lin, x)
    assert moved == {("bf16", 16 * 64)}
    assert spec_of(grad.weight) == P("data") and grad.weight.dtype == jnp.float32
    np.testing.assert_allclose(float(got), float(want), rtol=2e-2)
    np.testing.assert_allclose(grad.weight.array, want_grad.weight.array, rtol=1e-2, atol=1e-2)


def test_fsdp_forms_and_errors():
    def f(w):
        return w

    a = na.fsdp(f, PARAMS, COMPUTE)
    b = na.fsdp(PARAMS, COMPUTE)(f)
    w = named(jnp.ones(8), "embed")
    with pytest.raises(ShardingError, match=r"fsdp needs a device mesh.* Wrap"):
        a(w)
    with jax.set_mesh(jax.make_mesh((8,), ("data",))):
        assert a(w).axes == b(w).axes == w.axes
        assert a(w).array.sharding.spec == P("data")
    with pytest.raises(NamedTypeError, match=r"fsdp needs parameter_mapping and compute_mapping"):
        na.fsdp(f, PARAMS)


def test_fsdp_places_the_batch_by_the_compute_mapping(axis_type):
    """A batch must be compiled sharded by the compute mapping (the parameter mapping
    has no rule for 'batch'); only the first argument is placed by the parameter mapping."""
    mesh = make_mesh((2, 4), ("data", "model"), axis_type)

    @na.fsdp(parameter_mapping={"embed": "model"}, compute_mapping={"batch": "data"})
    def step(w, x):
        return w, jnp.sum(x.array)

    w = named(jnp.ones((8, 4)), ("embed", "mlp"))
    x = named(jnp.ones((8, 8)), ("batch", "embed"))
    with jax.set_mesh(mesh):
        w_spec, x_spec = [s.spec for s in step.lower(w, x).compile().input_shardings[0]]
        new_w, _ = step(w, x)
    assert tuple(x_spec)[:1] == ("data",)  # each device holds 1/2 of the batch, not all of it
    assert tuple(w_spec)[:1] == ("model",)
    assert new_w.array.sharding.spec[0] == "model"  # parameters by the parameter mapping


def test_fsdp_cached_calls_take_the_fast_path(axis_type):
    mesh = make_mesh((2, 4), ("data", "model"), axis_type)
    traces = []

    @na.fsdp(parameter_mapping={"embed": "model"}, compute_mapping={"batch": "data"})
    def step(w, x, scale):
        traces.append(1)
        return named(w.array * scale, w.axes)

    w = named(jnp.ones((8, 4)), ("embed", "mlp"))
    x = named(jnp.ones((8, 8)), ("batch", "embed"))
    with jax.set_mesh(mesh):
        for _ in range(3):
            step(w, x, 2.0)  # a static leaf (the Python float) too
        step(w, x, 3.0)
        step(w, x, 3.0)
    assert len(traces) == 2
    assert len(step._fast) == 1  # one fast entry, keyed further by the static value


def test_fsdp_refuses_placement_options():
    with pytest.raises(NamedTypeError, match=r"fsdp sets in_axis_resources itself"):
        na.fsdp(lambda w: w, PARAMS, COMPUTE, in_axis_resources={"a": "data"})
    with pytest.raises(NamedTypeError, match=r"named_jit got unknown option 'fooo'"):
        na.fsdp(lambda w: w, PARAMS, COMPUTE, fooo=1)


def test_fsdp_leaves_other_arguments_already_on_the_mesh_where_they_are(axis_type):
    """Optimizer state held by the parameter mapping (a second argument) is not moved to the
    compute mapping; only arguments not yet on the mesh are placed by it."""
    mesh = make_mesh((2, 4), ("data", "model"), axis_type)
    params, compute = {"embed": "data"}, {"batch": "data"}

    @na.fsdp(parameter_mapping=params, compute_mapping=compute)
    def step(w, state, x):
        return w, state, jnp.sum(x.array)

    w = na.shard(named(jnp.ones((8, 4)), ("embed", "mlp")), params, mesh)
    state = na.shard(named(jnp.zeros((8, 4)), ("embed", "mlp")), params, mesh)
    x = named(jnp.ones((8, 8)), ("batch", "embed"))
    with jax.set_mesh(mesh):
        shardings = step.lower(w, state, x).compile().input_shardings[0]
        step(w, state, x)
    w_spec, state_spec, x_spec = [tuple(s.spec) for s in shardings]
    assert state_spec[:1] == ("data",)  # stayed where the parameter mapping put it
    assert x_spec[:1] == ("data",)  # not on the mesh yet: placed by the compute mapping
    assert state.array.sharding.spec[0] == "data"


# -- outputs: parameters by the parameter mapping, activations by the compute mapping ------------


def _twin_collectives(hlo):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import _twin

    return {op: sorted(shapes) for op, shapes in _twin.collectives(hlo).items()}


def test_fsdp_places_returned_activations_by_the_compute_mapping(axis_type):
    """With ``parameter_mapping={"embed": "data"}`` every output was placed by it, so returned
    logits (no rule for ``batch`` there) came back replicated: the global batch gathered onto every
    device after each step. Outputs shaped like the first argument (the model, its gradients,
    optax's mu/nu) keep the parameter layout; the rest follows the compute mapping."""
    import optax
    from jax.sharding import NamedSharding

    mesh = make_mesh((2, 4), ("data", "model"), axis_type)
    explicit = axis_type == jax.sharding.AxisType.Explicit
    opt = optax.adam(0.1)
    w0 = np.linspace(-1, 1, 16 * 4, dtype=np.float32).reshape(16, 4)
    x0 = np.linspace(0, 2, 8 * 16, dtype=np.float32).reshape(8, 16)

    def loss_fn(w, x):
        logits = na.dot(x, na.auto_sharded(w), axis="embed")  # (batch, mlp); w gathered
        per_token = (logits**2).mean("mlp")
        return per_token.mean().array, (logits, per_token)

    @na.fsdp(parameter_mapping={"embed": "data"}, compute_mapping={"batch": "data"})
    def step(w, opt_state, x):
        (loss, (logits, per_token)), grads = jax.value_and_grad(loss_fn, has_aux=True)(w, x)
        with jax.numpy_dtype_promotion("standard"):  # optax mixes Python floats and int counts
            updates, opt_state = opt.update(grads, opt_state)
        return optax.apply_updates(w, updates), opt_state, grads, logits, per_token, loss

    with jax.set_mesh(mesh):
        w = na.shard(named(jnp.asarray(w0), ("embed", "mlp")), {"embed": "data"})
        with jax.numpy_dtype_promotion("standard"):
            opt_state = opt.init(w)
        x = na.shard(named(jnp.asarray(x0), ("batch", "embed")), {"batch": "data"})
        new_w, new_state, grads, logits, per_token, loss = step(w, opt_state, x)
        named_hlo = step.lower(w, opt_state, x).compile().as_text()

    # The parameter layout: the model, its gradients and adam's mu/nu (structure of `w`).
    for leaf in (new_w, grads, new_state[0].mu, new_state[0].nu):
        assert leaf.axes == w.axes and leaf.sharding.spec[0] == "data"
        assert [s.data.shape for s in leaf.array.addressable_shards] == [(8, 4)] * 8
    # Activations by the compute mapping: 'batch' stays on 'data'.
    assert logits.axis_names == ("batch", "mlp") and logits.sharding.spec[0] == "data"
    assert [s.data.shape for s in logits.array.addressable_shards] == [(4, 4)] * 8
    assert per_token.sharding.spec == P("data")
    ref_logits = x0 @ w0
    np.testing.assert_allclose(np.asarray(logits.array), ref_logits, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(loss), float(np.mean(ref_logits**2)), rtol=1e-5)

    # No collective beyond what the same step in plain JAX, laid out by hand, compiles to.
    def spec(*entries):
        return NamedSharding(mesh, P(*entries))

    gather = jax.sharding.reshard if explicit else jax.lax.with_sharding_constraint

    def plain_loss(w, x):
        logits = x @ gather(w, spec())
        per_token = jnp.mean(logits**2, axis=1)
        return jnp.mean(per_token), (logits, per_token)

    @jax.jit
    def plain_step(w, opt_state, x):
        (loss, (logits, per_token)), grads = jax.value_and_grad(plain_loss, has_aux=True)(w, x)
        with jax.numpy_dtype_promotion("standard"):
            updates, opt_state = opt.update(grads, opt_state)
        keep = spec("data")
        new_w, grads = gather(optax.apply_updates(w, updates), keep), gather(grads, keep)
        opt_state = jax.tree.map(lambda a: gather(a, keep) if a.ndim == 2 else a, opt_state)
        return new_w, opt_state, grads, gather(logits, keep), gather(per_token, keep), loss

    with jax.set_mesh(mesh):
        pw = jax.device_put(jnp.asarray(w0), spec("data"))
        with jax.numpy_dtype_promotion("standard"):
            p_state = opt.init(pw)
        px = jax.device_put(jnp.asarray(x0), spec("data"))
        plain_hlo = plain_step.lower(pw, p_state, px).compile().as_text()
    assert _twin_collectives(named_hlo) == _twin_collectives(plain_hlo)
    assert any(_twin_collectives(plain_hlo).values())  # the FSDP gathers are seen at all


def test_fsdp_resolves_each_output_only_by_the_mapping_that_places_it(axis_type):
    """A parameter output is placed by the parameter mapping alone and an activation by the compute
    mapping alone: a mapping that could not place the other kind of output is never asked to."""
    mesh = make_mesh((2, 4), ("data", "model"), axis_type)
    with jax.set_mesh(mesh):
        # vocab=3 cannot split over model=4: fine for the parameter, which the compute mapping
        # (which splits vocab) never places.
        w = na.shard(named(jnp.ones((4, 3)), ("embed", "vocab")), {"embed": "data"})
        b = named(jnp.ones((8, 8)), ("batch", "vocab"))
        step = na.fsdp(lambda w, b: (w, b), {"embed": "data"}, {"batch": "data", "vocab": "model"})
        new_w, new_b = step(w, b)
        assert spec_of(new_w) == P("data") and spec_of(new_b) == P("data", "model")
        # The other way round: the parameter mapping splits vocab, an activation's cannot split.
        w = na.shard(named(jnp.ones((4, 8)), ("embed", "vocab")), {"vocab": "model"})
        b = named(jnp.ones((8, 3)), ("batch", "vocab"))
        step = na.fsdp(lambda w, b: (w, b), {"vocab": "model"}, {"batch": "data", "vocab": None})
        new_w, new_b = step(w, b)
        assert spec_of(new_w) == P(None, "model") and spec_of(new_b) == P("data")


def _device_ids(x):
    return sorted(d.id for d in x.array.sharding.device_set)


def test_inputs_follow_the_mesh_in_force_to_other_devices(axis_type):
    """Two meshes of one shape on different devices: a cached program's input placement belongs
    to the mesh it was made on, so calling under the other one places inputs there (for fsdp and
    named_jit(in_axis_resources=...)), also a batch already sharded on the first mesh."""
    devices = jax.devices()
    first = jax.make_mesh((4,), ("data",), axis_types=(axis_type,), devices=devices[:4])
    second = jax.make_mesh((4,), ("data",), axis_types=(axis_type,), devices=devices[4:])
    step = na.fsdp(lambda w, b: (w * 2, b + 1), {"embed": "data"}, {"batch": "data"})
    placed = na.named_jit(lambda w, b: (w, b), in_axis_resources={"embed": "data", "batch": "data"})
    w, b = named(jnp.arange(8.0), "embed"), named(jnp.arange(8.0), "batch")
    for fn in (step, placed):
        with jax.set_mesh(first):
            fn(w, b)
            b_first = na.shard(b, {"batch": "data"})
        with jax.set_mesh(second):
            for batch in (b, b_first):
                new_w, new_b = fn(w, batch)
                assert _device_ids(new_w) == _device_ids(new_b) == [4, 5, 6, 7]
                assert new_b.sharding.spec == P("data")
    np.testing.assert_array_equal(np.asarray(new_b.array), np.arange(8.0))


class _FieldLinear(eqx.Module):
    w: jax.Array = na.field(axis_names=("embed", "mlp"))


def test_parameters_come_back_held_whatever_their_form_or_axis_order(axis_type):
    """Outputs shaped like the parameters stay held by the parameter mapping: also field-declared
    arrays, and a parameter returned with its axes in another order (names, not positions)."""
    mesh = make_mesh((2, 4), ("data", "model"), axis_type)
    batch = named(jnp.ones(8), "batch")
    keep = na.fsdp(lambda m, x: (m, x), {"embed": "data"}, {"batch": "data"})
    turn = na.fsdp(
        lambda p, x: {"w": (p["w"] * 2).rearrange(("mlp", "embed"))},
        {"embed": "data"},
        {"batch": "data"},
    )
    with jax.set_mesh(mesh):
        module, _ = keep(_FieldLinear(jnp.ones((4, 8))), batch)
        turned = turn({"w": named(jnp.ones((8, 4)), ("embed", "mlp"))}, batch)
    assert module.w.sharding.spec == P("data", None)
    assert [s.data.shape for s in module.w.addressable_shards] == [(2, 8)] * 8
    assert turned["w"].axis_names == ("mlp", "embed")
    assert turned["w"].sharding.spec == P(None, "data")


def test_grad_through_fsdp_with_an_unplaced_input(axis_type):
    # jax.grad outside jit: the unplaced batch is constrained on the abstract mesh (on Auto this
    # was JAX's "must be a NamedSharding" TypeError).
    mesh = make_mesh((8,), ("data",), axis_type)
    w0 = np.linspace(-1, 1, 16 * 4, dtype=np.float32).reshape(16, 4)
    x0 = np.linspace(0, 2, 8 * 16, dtype=np.float32).reshape(8, 16)
    step = na.fsdp(lambda w, x: loss_fn(w, x), PARAMS, COMPUTE)
    w, x = named(jnp.asarray(w0), ("embed", "mlp")), named(jnp.asarray(x0), ("batch", "embed"))
    expected = jax.grad(loss_fn)(w, x)
    with jax.set_mesh(mesh):
        grad = jax.grad(step)(w, x)
    np.testing.assert_allclose(np.asarray(grad.array), np.asarray(expected.array), rtol=1e-6)


def test_fsdp_parameters_passed_by_keyword(axis_type):
    # The parameters are fn's first parameter however they are passed: by keyword, the batch was
    # placed (and the loss constrained) by the parameter mapping.
    mesh = make_mesh((8,), ("data",), axis_type)
    seen = []

    def step(w, x):
        seen.append(jax.typeof(x.array).sharding.spec)
        return w * 2, (x * w).sum("embed")

    fsdp_step = na.fsdp(step, {"embed": "data"}, COMPUTE)
    w, x = named(jnp.ones(64), "embed"), named(jnp.ones((64, 64)), ("batch", "embed"))
    with jax.set_mesh(mesh):
        by_position = fsdp_step(w, x)
        by_keyword = fsdp_step(w=w, x=x)
        mixed = fsdp_step(w, x=x)
    for out in (by_position, by_keyword, mixed):
        assert spec_of(out[0]) == P("data") and spec_of(out[1]) == P("data")
    if axis_type == jax.sharding.AxisType.Explicit:
        assert seen == [P("data", None)] * 3


def test_fsdp_keyword_only_call_needs_a_nameable_first_parameter():
    step = na.fsdp(lambda w, x, /: w, PARAMS, COMPUTE)
    with pytest.raises(
        NamedTypeError,
        match=r"called with keyword arguments only \('x'\) and that parameter cannot be passed by "
        r"keyword .*Pass the parameters positionally: step\(params, \.\.\.\)\.",
    ):
        step(x=named(jnp.ones(8), "batch"))
