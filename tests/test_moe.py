"""nn.MoE against a per-token NumPy oracle (routing, capacity, padding, shared expert, statistics),
ragged and dense dispatch agreeing in values and gradients, and expert parallelism: a MoE
Transformer sharded with experts on 2 or 4 devices (with data and tensor parallelism, Auto and
Explicit meshes) equals the unsharded one in logits, load-balancing loss and gradients, with the
tokens exchanged by all-to-all and no gather of every expert's activations."""

import math
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import namedaxes as na
from namedaxes import Axis, models

Embed, Experts, Hidden = Axis("embed", 6), Axis("experts", 4), Axis("expert_mlp", 5)


def _silu(h):
    return h / (1 + np.exp(-h))


def oracle(moe, x, where=None):
    """The MoE output, token by token, in float64 (choices in (position, choice) order for the
    capacity of each sequence)."""
    f64 = lambda a: np.asarray(a.array, np.float64)  # noqa: E731
    xs = np.moveaxis(f64(x), x.axis_names.index("embed"), -1)
    lead = xs.shape[:-1]
    tokens = xs.reshape(-1, Embed.size)
    seq = x.axis_size("position")
    real = np.ones(len(tokens), bool)
    if where is not None:
        real = np.broadcast_to(np.asarray(where.array), lead).reshape(-1)
    logits = tokens @ f64(moe.router.weight)
    if moe.scoring == "softmax":
        scores = np.exp(logits - logits.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
        probs = scores
    else:
        scores = 1 / (1 + np.exp(-logits))
        probs = scores / scores.sum(-1, keepdims=True)
    gate = None if moe.experts.gate is None else f64(moe.experts.gate.weight)
    up, down = f64(moe.experts.up.weight), f64(moe.experts.down.weight)
    e_count = Experts.size
    capacity = None
    if moe.capacity_factor is not None:
        capacity = math.ceil(moe.capacity_factor * moe.top_k * seq / e_count)
    out = np.zeros_like(tokens)
    used, counts = {}, np.zeros(e_count)
    for t, row in enumerate(tokens):
        if not real[t]:
            continue
        chosen = np.argsort(-scores[t], kind="stable")[: moe.top_k]
        weights = scores[t, chosen]
        if moe.normalize:
            weights = weights / weights.sum()
        for e, w in zip(chosen, weights):
            counts[e] += 1
            slot = used.get((t // seq, e), 0)
            used[(t // seq, e)] = slot + 1
            if capacity is not None and slot >= capacity:
                continue
            h = row @ up[e]
            h = _silu(row @ gate[e]) * h if gate is not None else _silu(h)
            out[t] += w * (h @ down[e])
    if moe.shared is not None:
        s = _silu(tokens @ f64(moe.shared.gate.weight)) * (tokens @ f64(moe.shared.up.weight))
        s = s @ f64(moe.shared.down.weight)
        if moe.shared_gate is not None:
            s = s / (1 + np.exp(-(tokens @ f64(moe.shared_gate.weight))))
        out += s
    n = real.sum()
    aux = e_count * np.sum(counts / n * (probs * real[:, None]).sum(0) / n)
    return out.reshape(lead + (Embed.size,)), counts, aux


def build(**options):
    return na.nn.MoE(Embed, Experts, Hidden, top_k=2, key=jax.random.key(3), **options)


X = na.random.normal(jax.random.key(4), {"batch": 2, "position": 8, "embed": 6})


@eqx.filter_jit
def run(moe, x, where=None):
    return moe(x, where=where)


CASES = {
    "softmax": {},
    "normalized": dict(normalize=True),
    "sigmoid": dict(scoring="sigmoid", normalize=True),
    "ungated": dict(gated=False),
    "capacity": dict(capacity_factor=0.5),
    "shared": dict(SharedHidden={"shared_mlp": 7}, shared_gate=True),
}


@pytest.mark.parametrize("dispatch", ["dense", "ragged"])
@pytest.mark.parametrize("case", list(CASES))
def test_values_and_statistics_match_the_oracle(case, dispatch):
    moe = build(dispatch=dispatch, **CASES[case])
    y, stats = run(moe, X)
    want, counts, aux = oracle(moe, X)
    assert y.axes == X.axes
    np.testing.assert_allclose(y.array, want, atol=1e-5)
    np.testing.assert_array_equal(stats.counts.array, counts)
    assert stats.counts.axes == (Experts,) and int(stats.tokens.array) == 16
    np.testing.assert_allclose(stats.load_balancing_loss(), aux, rtol=1e-5)
    if case == "capacity":  # some choices were dropped: not the dropless result
        dropless, _, _ = oracle(build(dispatch=dispatch), X)
        assert np.abs(want - dropless).max() > 1e-2


def test_padding_skips_experts_statistics_and_capacity():
    """Tokens where `where` is False get nothing from the routed experts, leave the statistics,
    and take no capacity from later tokens of their sequence (left padding)."""
    where = na.named(jnp.arange(8) >= 3, "position")  # every row padded on the left by 3
    for dispatch in ("dense", "ragged"):
        moe = build(dispatch=dispatch, capacity_factor=0.5)
        y, stats = run(moe, X, where)
        want, counts, aux = oracle(moe, X, where)
        np.testing.assert_allclose(y.array, want, atol=1e-5)
        assert np.all(np.asarray(y.array)[:, :3] == 0)
        np.testing.assert_array_equal(stats.counts.array, counts)
        assert int(stats.tokens.array) == 10
        np.testing.assert_allclose(stats.load_balancing_loss(), aux, rtol=1e-5)


@pytest.mark.parametrize("dispatch", ["dense", "ragged", "capacity"])
def test_capacity_without_position_counts_tokens_by_name_not_layout(dispatch):
    """Without a position axis every token is one capacity group, first come first served in the
    row-major order of the token axes sorted by name: (batch, seq) in either layout."""
    moe = build(dispatch=dispatch, capacity_factor=0.5)
    x = X.rename({"position": "seq"})
    flipped = x.rearrange(("seq", "embed", "batch"))
    (y, stats), (y2, stats2) = run(moe, x), run(moe, flipped)
    assert y2.axis_names == ("seq", "embed", "batch")
    np.testing.assert_allclose(y2.rearrange(y.axis_names).array, y.array, atol=1e-6)
    np.testing.assert_array_equal(stats2.counts.array, stats.counts.array)
    want, counts, _ = oracle(moe, na.flatten_axes(x, ("batch", "seq"), "position"))
    np.testing.assert_allclose(y.array.reshape(want.shape), want, atol=1e-5)
    np.testing.assert_array_equal(stats.counts.array, counts)


def test_ragged_and_dense_have_the_same_gradients():
    def loss(moe, x):
        y, stats = moe(x)
        return jnp.sum(jnp.sin(y.array)) + stats.load_balancing_loss()

    grads = [
        eqx.filter_jit(eqx.filter_grad(loss))(build(dispatch=d, normalize=True), X)
        for d in ("dense", "ragged")
    ]
    for a, b in zip(jax.tree.leaves(grads[0]), jax.tree.leaves(grads[1])):
        np.testing.assert_allclose(a, b, atol=1e-5)
    router = grads[0].router.weight.array
    assert np.abs(router).max() > 1e-3  # the router learns through the weights and the loss


def test_statistics_pool_over_layers_as_transformers_does():
    """Two layers' statistics (a `layer` axis) give one loss over the pooled counts and
    probabilities, not the mean of the per-layer losses."""
    a, b = build(), build(scoring="sigmoid")
    (_, s1), (_, s2) = run(a, X), run(b, X)
    is_named = lambda v: isinstance(v, na.NamedArray)  # noqa: E731
    both = jax.tree.map(lambda u, v: na.stack("layer", [u, v]), s1, s2, is_leaf=is_named)
    assert both.counts.axis_names == ("layer", "experts")
    n = 32.0
    f = (s1.counts.array + s2.counts.array) / n
    p = (s1.probs.array + s2.probs.array) / n
    np.testing.assert_allclose(both.load_balancing_loss(), 4 * np.sum(f * p), rtol=1e-6)


def test_errors():
    with pytest.raises(na.LayerError, match=r"MoE: top_k=5 must be an int from 1 to the 4"):
        na.nn.MoE(Embed, Experts, Hidden, top_k=5, key=jax.random.key(0))
    with pytest.raises(na.LayerError, match=r"MoE: dispatch='sparse' is not one of 'auto', "):
        build(dispatch="sparse")
    with pytest.raises(na.LayerError, match=r"capacity_factor=0 must be a finite positive number"):
        build(capacity_factor=0)
    with pytest.raises(na.LayerError, match=r"dispatch=.capacity. runs the experts on \(experts, "):
        build(dispatch="capacity")
    with pytest.raises(na.LayerError, match=r"shared_gate=True needs a shared expert"):
        build(shared_gate=True)
    moe = build()
    with pytest.raises(na.AxisNotFoundError, match=r"MoE works over axis 'embed'"):
        moe(X.rename({"embed": "hidden"}))
    with pytest.raises(na.AxisNotFoundError, match=r"where NamedArray\(vocab=3\) has axis 'vocab'"):
        moe(X, where=na.named(jnp.ones(3, bool), "vocab"))
    with pytest.raises(na.NamedTypeError, match=r"where must be a boolean NamedArray"):
        moe(X, where=na.ones({"position": 8}))


def test_mapping_errors(mesh_2x4):
    """Placements the layer cannot run by are refused while tracing, naming the axes."""
    capacity = build(capacity_factor=1.0)
    even = na.nn.MoE(Embed, Experts, {"expert_mlp": 4}, top_k=2, key=jax.random.key(0))
    call = lambda moe: eqx.filter_eval_shape(lambda m, x: m(x), moe, X)  # noqa: E731
    with jax.set_mesh(mesh_2x4):
        with (
            na.axis_mapping({"position": "model"}),
            pytest.raises(
                na.ShardingError,
                match=r"capacity counts along 'position', but the mapping splits 'position' over "
                r"devices\. Keep the sequence whole",
            ),
        ):
            call(capacity)
        with (
            na.axis_mapping({"batch": "data", "expert_mlp": "data"}),
            pytest.raises(
                na.ShardingError,
                match=r"splits the tokens of NamedArray\(batch=2, position=8, embed=6\) and the "
                r"experts' hidden axes 'expert_mlp' over the same mesh axes 'data'",
            ),
        ):
            call(even)


def test_ragged_expert_parallel_with_capacity_and_padding(mesh_2x4):
    """Experts on `data` (which splits the batch): the choices travel by all-to-all in blocks
    that the capacity bounds (2 experts x 2 slots of one sequence: 4 rows, not all 16 choices),
    and the result is the oracle's."""
    moe = build(dispatch="ragged", capacity_factor=0.5)
    where = na.named(jnp.arange(8) >= 1, "position")
    want, counts, _ = oracle(moe, X, where)
    with jax.set_mesh(mesh_2x4), na.axis_mapping({"batch": "data", "experts": "data"}):
        sharded, x = na.shard((moe, X))
        f = na.named_jit(lambda m, x, w: m(x, where=w))
        y, stats = f(sharded, x, where)
        hlo = f.lower(sharded, x, where).compile().as_text()
    np.testing.assert_allclose(y.array, want, atol=1e-5)
    np.testing.assert_array_equal(stats.counts.array, counts)
    assert re.search(r"f32\[1,4,6\][^=]*all-to-all\(", hlo)


# -- expert parallelism in a model ----------------------------------------------------------

CONFIG = models.TransformerConfig(
    "mixtral", vocab_size=32, hidden_size=16, intermediate_size=8, num_layers=2, num_heads=4,
    num_kv_heads=4, head_dim=4, num_experts=12, num_experts_per_tok=2, norm_topk_prob=True,
    moe_dispatch="ragged",
)  # fmt: skip
# 12 experts (no other size is 12: the all-gathers of every expert stand out). Expert parallelism
# 4 (tokens the same on the 4 devices of a data row: each takes a quarter of its 14, padded),
# and 2 (over the data axis, which also splits the batch), with tensor parallelism in attention
# or inside the experts.
MAPPINGS = {
    "ep4": {"batch": "data", "experts": "model", "heads": "model", "vocab": "model"},
    "ep2": {"batch": "data", "experts": "data", "heads": "model", "expert_mlp": "model"},
}


def _loss(model, ids, mask, target):
    logits, aux = model(ids, attention_mask=mask, return_aux_loss=True)
    return jnp.sum(logits.array * target) + aux, (logits, aux)


def _inputs():
    ids = na.named(jax.random.randint(jax.random.key(5), (4, 7), 0, 32), ("batch", "position"))
    mask = na.named(
        jnp.arange(7)[None, :] >= jnp.array([[0], [2], [0], [1]]), ("batch", "position")
    )
    target = jax.random.normal(jax.random.key(6), (4, 7, 32))
    return ids, mask, target


def _all_gathers(hlo):
    """The result shapes of the all-gathers in a compiled program."""
    shapes = re.findall(r"= \(?[a-z0-9]+\[([0-9,]*)\][^=]*? all-gather(?:-start)?\(", hlo)
    return [tuple(int(d) for d in s.split(",") if d) for s in shapes]


@pytest.fixture(scope="module")
def unsharded():
    """The model, and its logits, loss and gradients on one device (computed once)."""
    model = models.Transformer(CONFIG, key=jax.random.key(7))
    out = eqx.filter_jit(jax.value_and_grad(_loss, has_aux=True))(model, *_inputs())
    return model, out


def close(a, b):
    """Equal to float32 rounding: within 1e-5 of the reference's largest magnitude."""
    b = np.asarray(b)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(b).max())))


@pytest.mark.parametrize("ep", list(MAPPINGS))
def test_expert_parallel_model_equals_unsharded(ep, mesh_2x4, unsharded):
    model, ((_, (logits, aux)), grads) = unsharded
    inputs = _inputs()
    with jax.set_mesh(mesh_2x4), na.axis_mapping(MAPPINGS[ep]):
        sharded = na.shard(model)
        up = sharded.layers.stacked.mlp.experts.up.weight
        assert up.array.sharding.spec[:2] == (None, "model" if ep == "ep4" else "data")
        f = na.named_jit(jax.value_and_grad(_loss, has_aux=True))
        (_, (logits_s, aux_s)), grads_s = f(sharded, *inputs)
        hlo = f.lower(sharded, *inputs).compile().as_text()
    close(logits_s.array, logits.array)
    close(aux_s, aux)
    for a, b in zip(jax.tree.leaves(grads_s), jax.tree.leaves(grads)):
        close(a, b)
    assert "all-to-all" in hlo
    # No all-gather of anything with every expert, except the small router weight.
    router = {(16, 12), (1, 16, 12), (2, 16, 12)}
    assert not [s for s in _all_gathers(hlo) if 12 in s and s not in router]


def test_dense_dispatch_under_expert_parallelism_needs_no_all_to_all(mesh_2x4):
    moe = build(dispatch="dense")
    want, _ = run(moe, X)
    with jax.set_mesh(mesh_2x4), na.axis_mapping({"batch": "data", "experts": "model"}):
        sharded, x = na.shard((moe, X))
        f = na.named_jit(lambda m, x: m(x))
        y, _ = f(sharded, x)
        hlo = f.lower(sharded, x).compile().as_text()
    np.testing.assert_allclose(y.array, want.array, atol=1e-5)
    assert y.array.sharding.spec[0] == "data"
    assert "all-to-all" not in hlo and "all-reduce" in hlo


# -- the grouped-matmul kernel and the batched capacity layout --------------------------------


def test_grouped_kernel_model_expert_parallel_equals_unsharded(mesh_2x4, unsharded):
    """dispatch='grouped' (namedaxes.kernels.grouped_matmul, Pallas interpret mode here) in a
    Mixtral-shaped model with 4-way expert parallelism: the logits and load-balancing loss of the
    unsharded model (ragged dispatch, which equals dense). Forward only, to keep the suite fast:
    the kernel's gradients are test_grouped_matmul's, and under expert parallelism
    test_ragged_all_to_all_exchange_on_an_emulation's."""
    model, ((_, (logits, aux)), _) = unsharded
    model = model.with_options(moe_dispatch="grouped")
    ids, mask, _ = _inputs()
    with jax.set_mesh(mesh_2x4), na.axis_mapping(MAPPINGS["ep4"]):
        f = na.named_jit(lambda m, ids, mask: m(ids, attention_mask=mask, return_aux_loss=True))
        logits_s, aux_s = f(na.shard(model), ids, mask)
    close(logits_s.array, logits.array)
    close(aux_s, aux)


def _sum_loss(moe, x, where):
    y, stats = moe(x, where=where)
    return jnp.sum(jnp.sin(y.array)) + stats.load_balancing_loss(), (y, stats.counts)


WHERE = na.named(jnp.arange(8) >= 1, "position")  # one padding token per row
_capacity_grad = eqx.filter_jit(eqx.filter_value_and_grad(_sum_loss, has_aux=True))


def test_capacity_dispatch_drops_what_the_others_drop():
    """dispatch='capacity' ((experts, capacity) slots, one batched matmul per projection) keeps
    the same choices as the other dispatches: the oracle's values and counts, with padding, and
    the dense dispatch's gradients."""
    got = _capacity_grad(build(dispatch="capacity", capacity_factor=0.5), X, WHERE)
    dense = _capacity_grad(build(dispatch="dense", capacity_factor=0.5), X, WHERE)
    (_, (y, counts)), grads = got
    want, want_counts, _ = oracle(build(capacity_factor=0.5), X, WHERE)
    np.testing.assert_allclose(y.array, want, atol=1e-5)
    np.testing.assert_array_equal(counts.array, want_counts)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(dense[1]), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_capacity_dispatch_expert_parallel(mesh_2x4):
    """8 experts on (data, model), the batch on data: each device's slots of another device's
    experts go there by all-to-all (blocks of 1 expert x 1 sequence x capacity 1), the tokens
    the same along model split into shares of whole sequences (one each: 3 of the 4 devices get
    an empty one); values and gradients are the unsharded ones."""
    moe = na.nn.MoE(
        Embed, Axis("experts", 8), Hidden, top_k=2, key=jax.random.key(3),
        capacity_factor=0.5, dispatch="capacity",
    )  # fmt: skip
    (_, (y, counts)), grads = _capacity_grad(moe, X, WHERE)
    with jax.set_mesh(mesh_2x4), na.axis_mapping({"batch": "data", "experts": ("data", "model")}):
        sharded, x = na.shard((moe, X))
        f = na.named_jit(eqx.filter_value_and_grad(_sum_loss, has_aux=True))
        (_, (y_s, counts_s)), grads_s = f(sharded, x, WHERE)
        hlo = f.lower(sharded, x, WHERE).compile().as_text()
    np.testing.assert_allclose(y_s.array, y.array, atol=1e-5)
    np.testing.assert_array_equal(counts_s.array, counts.array)
    for a, b in zip(jax.tree.leaves(grads_s), jax.tree.leaves(grads), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert re.search(r"f32\[1,1,1,1,6\][^=]*all-to-all\(", hlo)


# -- the exchange by ragged all-to-all (GPUs, TPUs), on an emulation of the collective ----------


def emulated_ragged_all_to_all(
    operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, *, axis_name
):
    """jax.lax.ragged_all_to_all as its documentation defines it, from all-gather and all-to-all
    (XLA:CPU has no kernel for it)."""
    per_device = input_offsets.shape[0] // jax.lax.axis_size(axis_name)
    sent = jax.lax.all_gather(operand, axis_name)
    src_at = jax.lax.all_to_all(input_offsets, axis_name, 0, 0, tiled=True)
    dst_at = jax.lax.all_to_all(output_offsets, axis_name, 0, 0, tiled=True)
    row = jnp.arange(output.shape[0])[:, None]
    inside = (row >= dst_at[None, :]) & (row < (dst_at + recv_sizes)[None, :])
    slot = jnp.argmax(inside, axis=1)
    index = jnp.clip(src_at[slot] + row[:, 0] - dst_at[slot], 0, operand.shape[0] - 1)
    return jnp.where(inside.any(axis=1)[:, None], sent[slot // per_device, index], output)


def test_ragged_all_to_all_exchange_on_an_emulation(mesh_2x4, monkeypatch):
    """Where the backend has ragged all-to-all (GPUs, TPUs), the choices travel as exactly their
    rows per expert: with the collective emulated, grouped dispatch (what runs there), 8 experts
    on (data, model) and the batch on data (shares along model, all-to-all over both), dropless,
    values, counts and gradients are the unsharded layer's (ragged dispatch)."""
    from namedaxes.nn import _moe_dispatch

    calls = []

    def collective(*args, **kwargs):
        calls.append(kwargs["axis_name"])
        return emulated_ragged_all_to_all(*args, **kwargs)

    monkeypatch.setattr(_moe_dispatch, "ragged_all_to_all_available", lambda: True)
    monkeypatch.setattr(_moe_dispatch, "_ragged_all_to_all", collective)
    moe = lambda dispatch: na.nn.MoE(  # noqa: E731  (the same parameters for each)
        Embed, Axis("experts", 8), Hidden, top_k=2, key=jax.random.key(3), dispatch=dispatch
    )
    (_, (y, counts)), grads = _capacity_grad(moe("ragged"), X, WHERE)
    with jax.set_mesh(mesh_2x4), na.axis_mapping({"batch": "data", "experts": ("data", "model")}):
        sharded, x = na.shard((moe("grouped"), X))
        f = na.named_jit(eqx.filter_value_and_grad(_sum_loss, has_aux=True))
        (_, (y_s, counts_s)), grads_s = f(sharded, x, WHERE)
    assert calls == [("data", "model")] * 2  # there and back
    np.testing.assert_allclose(y_s.array, y.array, atol=1e-5)
    np.testing.assert_array_equal(counts_s.array, counts.array)
    for a, b in zip(jax.tree.leaves(grads_s), jax.tree.leaves(grads), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_auto_dispatch_is_the_fastest_measured_for_the_backend(monkeypatch, caplog):
    """capacity with a capacity factor; else grouped on Hopper GPUs for 16-bit compute, dense on
    CPUs, ragged elsewhere with a note (benchmarks/moe_dispatch.py's table in docs/nn.md)."""
    from namedaxes.nn import _moe

    assert _moe.auto_dispatch(1.25, jnp.bfloat16) == "capacity"
    assert _moe.auto_dispatch(None, jnp.bfloat16) == "dense"  # this CPU
    monkeypatch.setattr(_moe.jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(_moe, "mosaic_runs", lambda dtype: jnp.dtype(dtype).itemsize == 2)
    assert _moe.auto_dispatch(None, jnp.bfloat16) == "grouped"
    with caplog.at_level("WARNING"):
        assert _moe.auto_dispatch(None, jnp.float32) == "ragged"
    assert "dispatch='auto' runs 'ragged'" in caplog.text and "got float32" in caplog.text


def test_a_huge_capacity_drops_nothing_and_is_capped():
    """A capacity past the group size cannot drop more, so it is capped there (1e10 reached JAX as
    an int32 overflow); an infinite factor is refused when the layer is built."""
    x = na.random.normal(jax.random.key(1), {"batch": 2, "position": 5, "embed": 8})

    def moe(cf, dispatch):
        return na.nn.MoE({"embed": 8}, Axis("experts", 4), {"expert_mlp": 16}, top_k=2,
                         key=jax.random.key(0), capacity_factor=cf, dispatch=dispatch)  # fmt: skip

    run = jax.jit(lambda m, x: m(x)[0].array)  # eagerly, op by op: 4 s
    want = run(moe(None, "dense"), x)
    for dispatch in ("dense", "ragged", "capacity"):
        got = run(moe(1e10, dispatch), x)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)
    with pytest.raises(na.LayerError, match=r"capacity_factor=inf must be a finite positive"):
        moe(float("inf"), "dense")


def test_router_stats_find_the_experts_axis_by_name():
    counts = jnp.array([[4.0, 0, 0, 0], [0, 4.0, 0, 0]])
    probs = jnp.array([[1.0, 0, 0, 0], [0, 1.0, 0, 0]])
    tokens = na.named(jnp.array([2.0, 2.0]), "layer")
    stats = [
        na.nn.RouterStats(na.named(c, names), na.named(p, names), tokens)
        for c, p, names in (
            (counts, probs, ("layer", "experts")),
            (counts.T, probs.T, ("experts", "layer")),
        )
    ]
    assert float(stats[0].load_balancing_loss()) == float(stats[1].load_balancing_loss()) == 2.0
    with pytest.raises(na.AxisNotFoundError, match=r"RouterStats: counts NamedArray"):
        na.nn.RouterStats(
            stats[0].counts, stats[0].probs, na.named(jnp.asarray(4.0), ())
        ).load_balancing_loss()
    # tokens over an axis the counts lack (the loss was a silent 0.5), or plain arrays
    # (AttributeError), are refused
    with pytest.raises(
        na.AxisNotFoundError,
        match=re.escape(
            "counts NamedArray(experts=4) must have the axes of tokens NamedArray(layer=2)"
        ),
    ):
        na.nn.RouterStats(
            na.named(jnp.full(4, 2.0), "experts"), na.named(jnp.full(4, 1.0), "experts"), tokens
        ).load_balancing_loss()
    with pytest.raises(
        na.NamedTypeError,
        match=re.escape("RouterStats: counts must be a NamedArray, got ArrayImpl of shape (4,)"),
    ):
        na.nn.RouterStats(
            jnp.full(4, 2.0), jnp.full(4, 1.0), jnp.asarray(4.0)
        ).load_balancing_loss()


@pytest.mark.parametrize("dispatch", ["dense", "ragged", "grouped", "capacity"])
def test_inputs_and_parameters_of_other_dtypes_promote_on_every_dispatch(dispatch):
    """Without a precision policy the experts compute in the input's and parameters' dtypes
    promoted, as Linear does: under JAX's standard promotion every dispatch gives float32 for a
    bfloat16 input and float32 parameters (and the reverse), the values of the input (or
    parameters) cast up first ("ragged" gave bfloat16 off by 0.015, "grouped" raised
    KernelError); under strict promotion (the tests') every dispatch refuses them as Linear
    does."""
    f32 = lambda tree: jax.tree.map(  # noqa: E731
        lambda a: a.astype(jnp.float32) if eqx.is_inexact_array(a) else a, tree
    )
    cf = 2.0 if dispatch == "capacity" else None
    moe = build(dispatch=dispatch, capacity_factor=cf)
    narrow_moe = build(dispatch=dispatch, capacity_factor=cf, dtype=jnp.bfloat16)
    narrow_x = X.astype(jnp.bfloat16)
    for (m, x), (wide_m, wide_x) in (
        ((moe, narrow_x), (moe, f32(narrow_x))),
        ((narrow_moe, X), (f32(narrow_moe), X)),
    ):
        with jax.numpy_dtype_promotion("standard"):
            y, _ = run(m, x)
        want, _ = run(wide_m, wide_x)
        assert y.dtype == want.dtype == jnp.float32
        np.testing.assert_allclose(y.array, want.array, atol=1e-6)
        with pytest.raises(jax.dtypes.TypePromotionError, match="bfloat16"):
            m(x)
