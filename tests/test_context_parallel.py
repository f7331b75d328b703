"""Context parallelism: attention and a whole model with `position` mapped to a mesh axis.

The sharded results are compared with plain jax.numpy attention (the functions) and with the same
model run unsharded (the Transformer), values and gradients in float32; the compiled programs are
checked for the exchange each strategy costs and for the absence of full-sequence gathers.
"""

import functools
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import spec_of
from _meshes import make_mesh
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

import namedaxes as na
from namedaxes import named
from namedaxes.models import Transformer, TransformerConfig
from namedaxes.nn import _attention_kernels as kernels
from namedaxes.nn._ring import Ring, work

STRATEGIES = ["all_gather", "ring"]
# Code generation without LLVM's optimizations compiles these programs about 40% faster; XLA
# chooses the collectives before code generation, and float32 results agree to the tolerances.
FAST = {"compiler_options": {"xla_backend_optimization_level": 0}}


def reference(q, k, v, allowed, scale):
    """Plain attention: q (b, t, n, d), k/v (b, s, m, d), allowed broadcastable to (b, n, t, s)."""
    n, m = q.shape[2], k.shape[2]
    k, v = jnp.repeat(k, n // m, axis=2), jnp.repeat(v, n // m, axis=2)
    s = jnp.einsum("btnd,bsnd->bnts", q, k) * scale
    s = jnp.where(allowed, s, jnp.finfo(jnp.float32).min)
    return jnp.einsum("bnts,bsnd->btnd", jax.nn.softmax(s, axis=-1), v)


def qkv(b, t, s, n, m, d, seed=0):
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    kv_name = "heads" if n == m else "kv_heads"
    q = na.random.normal(kq, {"batch": b, "position": t, "heads": n, "head_dim": d})
    k = na.random.normal(kk, {"batch": b, "key_position": s, kv_name: m, "head_dim": d})
    v = na.random.normal(kv, {"batch": b, "key_position": s, kv_name: m, "head_dim": d})
    return q, k, v


def cases(t, s):
    """``{name: (keyword arguments, allowed (b, 1, t, s))}`` over 2 rows, queries last of s keys."""
    qi, ki = jnp.arange(t)[:, None] + (s - t), jnp.arange(s)[None, :]
    causal = ki <= qi
    starts = jnp.array([0, 5])
    left = ki >= starts[:, None]  # (b, s)
    lengths = jnp.array([s, s - 7])
    right = ki < lengths[:, None]
    window = causal & (ki > qi - 5)
    general = (ki + qi) % 3 != 0  # any pattern, every row sees some key
    return {
        "causal": (dict(causal=True), causal[None, None]),
        "left_padded": (
            dict(causal=True, key_mask=named(left, ("batch", "key_position"))),
            causal[None, None] & left[:, None, None, :],
        ),
        "window_lengths": (
            dict(sliding_window=5, key_lengths=named(lengths, "batch")),
            window[None, None] & right[:, None, None, :],
        ),
        "mask": (dict(mask=named(general, ("position", "key_position"))), general[None, None]),
    }


def _seen(allowed, t):
    return jnp.broadcast_to(allowed, (2, 1, t, allowed.shape[-1])).any(-1)[:, 0, :, None, None]


# -- the function ---------------------------------------------------------------------------------


# Each strategy on one axis type here; the model tests run each on both.
@pytest.mark.parametrize(
    "strategy, axis_type",
    [("all_gather", AxisType.Auto), ("ring", AxisType.Explicit)],
    ids=["all_gather-auto", "ring-explicit"],
)
def test_attention_split_over_context_equals_plain_attention(strategy, axis_type):
    """The options, grouped-query heads, and queries at an offset (8 queries, the last of 16
    keys), on (data=2, context=4): values, gradients and the output's placement; one compile.
    (Plain causal attention is the model tests' case.)"""
    mesh = make_mesh((2, 4), ("data", "context"), axis_type)
    mapping = {"batch": "data", "position": "context", "key_position": "context"}
    shapes = {"self": (16, 16), "offset": (8, 16)}
    inputs = {
        name: qkv(2, t, s, 4, 2, 8, seed=i) for i, (name, (t, s)) in enumerate(shapes.items())
    }
    chosen = [("self", "window_lengths"), ("self", "mask"), ("offset", "left_padded")]
    runs = [(name, c, *cases(*shapes[name])[c]) for name, c in chosen]

    def named_losses(inputs):
        losses, outs = [], []
        for name, _, kw, allowed in runs:
            q, k, v = inputs[name]
            out = na.nn.dot_product_attention(q, k, v, context_strategy=strategy, **kw)
            losses.append(
                jnp.sum(jnp.where(_seen(allowed, q.axis_size("position")), out.array, 0) ** 2)
            )
            outs.append(out)
        return sum(losses), outs

    def plain_losses(inputs):
        total = 0.0
        for name, _, _, allowed in runs:
            q, k, v = (x.array for x in inputs[name])
            out = reference(q, k, v, allowed, 8**-0.5)
            total = total + jnp.sum(jnp.where(_seen(allowed, q.shape[1]), out, 0) ** 2)
        return total

    step = na.named_jit(
        jax.value_and_grad(named_losses, has_aux=True), axis_resources=mapping, **FAST
    )
    with jax.set_mesh(mesh):
        (value, outs), grads = step(na.shard(inputs, mapping))
    want, want_grads = jax.jit(jax.value_and_grad(plain_losses), **FAST)(inputs)
    np.testing.assert_allclose(value, want, rtol=1e-5)
    for got, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-5)
    for out in outs:
        assert spec_of(out) == P("data", "context")  # the output stays split like the queries


# (strategy, context options, case): the zig-zag balanced ring (the default for a causal ring;
# sliding window at 2 shards, causal at 4, where the test above has the window), Ulysses, and
# inputs laid out zig-zag by name (nn.zigzag) for the all-gather and Ulysses (the model tests lay
# out the ring's).
BALANCED_RUNS = {
    2: [("ring", {}, "window_lengths")],
    4: [("ring", {}, "causal")],
}
OTHER_RUNS = [
    ("ulysses", {}, "causal"),
    ("ulysses", {}, "mask"),
    ("all_gather", {"context_layout": "zigzag"}, "window_lengths"),
    ("ulysses", {"context_layout": "zigzag"}, "left_padded"),
]


@pytest.mark.parametrize(
    "shards, axis_type",
    [(2, AxisType.Auto), (4, AxisType.Explicit)],
    ids=["cp2-auto", "cp4-explicit"],
)
def test_balanced_ring_and_ulysses_equal_plain_attention(shards, axis_type):
    """Grouped-query heads (4 query, 2 key/value heads: at 4 shards Ulysses repeats them);
    values and gradients; the output in order and split like the queries. Inputs laid out by
    nn.zigzag come back in order through nn.zigzag(inverse=True). One compile per mesh."""
    mesh = make_mesh((shards,), ("context",), axis_type)
    mapping = {"position": "context", "key_position": "context"}  # nn.zigzag lays out keys too
    t = 16
    inputs = qkv(2, t, t, 4, 2, 8)
    table = cases(t, t)
    runs = BALANCED_RUNS[shards] + OTHER_RUNS

    def named_losses(q, k, v):
        losses, outs = [], []
        for strategy, options, case in runs:
            kw, allowed = table[case]
            qi, ki, vi = q, k, v
            laid_out = options.get("context_layout") == "zigzag"
            if laid_out:
                qi, (ki, vi, kw) = na.nn.zigzag(q), na.nn.zigzag((k, v, kw), "key_position")
            out = na.nn.dot_product_attention(
                qi, ki, vi, context_strategy=strategy, **kw, **options
            )
            if laid_out:
                out = na.nn.zigzag(out, inverse=True)
            losses.append(jnp.sum(jnp.where(_seen(allowed, t), out.array, 0) ** 2))
            outs.append(out)
        return sum(losses), outs

    def plain_losses(q, k, v):
        total = 0.0
        for *_, case in runs:
            allowed = table[case][1]
            out = reference(q, k, v, allowed, 8**-0.5)
            total = total + jnp.sum(jnp.where(_seen(allowed, t), out, 0) ** 2)
        return total

    grad = jax.value_and_grad(named_losses, argnums=(0, 1, 2), has_aux=True)
    step = na.named_jit(grad, axis_resources=mapping, **FAST)
    with jax.set_mesh(mesh):
        (value, outs), grads = step(*na.shard(inputs, mapping))
    plain = jax.value_and_grad(plain_losses, argnums=(0, 1, 2))
    want, want_grads = jax.jit(plain, **FAST)(*(x.array for x in inputs))
    np.testing.assert_allclose(value, want, rtol=1e-5)
    for got, w in zip(grads, want_grads):
        np.testing.assert_allclose(got.array, w, rtol=1e-5, atol=1e-5)
    for out in outs:
        assert spec_of(out) == P(None, "context")


# (axis type, runs): the balanced causal ring (the default zig-zag); in order, where the blocks sit
# at offsets before and after the queries, causal and with a sliding window.
PALLAS_RUNS = {
    AxisType.Auto: [{"causal": True}],
    AxisType.Explicit: [
        {"causal": True, "context_balance": None},
        {"sliding_window": 5, "context_balance": None},
    ],
}


@pytest.mark.parametrize("axis_type", list(PALLAS_RUNS), ids=["auto", "explicit"])
def test_ring_with_the_pallas_kernel_equals_plain_attention(axis_type, monkeypatch):
    """implementation="pallas": every ring block is the Pallas flash-attention kernel (interpret
    mode), forward and backward, grouped-query heads, at 2 shards: values and gradients as plain
    attention; padding is a typed error. One compile per mesh kind."""
    from namedaxes.kernels import _flash_attention as flash

    mesh = make_mesh((2,), ("context",), axis_type)
    mapping = {"position": "context", "key_position": "context"}
    t = 16
    inputs = qkv(1, t, t, 4, 2, 8)
    causal = jnp.arange(t)[None, :] <= jnp.arange(t)[:, None]
    window = causal & (jnp.arange(t)[None, :] > jnp.arange(t)[:, None] - 5)
    runs = [(kw, window if "sliding_window" in kw else causal) for kw in PALLAS_RUNS[axis_type]]
    used = []
    for name in ("forward", "backward"):
        real = getattr(flash, name)
        monkeypatch.setattr(flash, name, lambda *a, r=real, n=name: used.append(n) or r(*a))

    def named_loss(q, k, v):
        outs = [
            na.nn.dot_product_attention(
                q, k, v, implementation="pallas", context_strategy="ring", **kw
            ).array
            for kw, _ in runs
        ]
        return sum(jnp.sum(o**2) for o in outs)

    def plain_loss(q, k, v):
        return sum(jnp.sum(reference(q, k, v, a[None, None], 8**-0.5) ** 2) for _, a in runs)

    step = na.named_jit(jax.value_and_grad(named_loss, argnums=(0, 1, 2)), mapping, **FAST)
    with jax.set_mesh(mesh):
        value, grads = step(*na.shard(inputs, mapping))
    assert {"forward", "backward"} <= set(used)
    plain = jax.jit(jax.value_and_grad(plain_loss, argnums=(0, 1, 2)), **FAST)
    want, want_grads = plain(*(x.array for x in inputs))
    np.testing.assert_allclose(value, want, rtol=1e-5)
    for got, w in zip(grads, want_grads):
        np.testing.assert_allclose(got.array, w, rtol=1e-5, atol=1e-5)
    q, k, v = inputs
    with pytest.raises(
        na.AttentionKernelError,
        match=r"implementation='pallas'\) cannot run here: the Pallas flash-attention kernel "
        r"takes causal, sliding-window and query offsets, not padding",
    ):
        with jax.set_mesh(mesh), na.axis_mapping(mapping):
            na.nn.dot_product_attention(
                q, k, v, causal=True, key_lengths=named(jnp.array([12]), "batch"),
                implementation="pallas", context_strategy="ring",
            )  # fmt: skip


def test_balanced_ring_gives_every_shard_the_same_work():
    """The key x query positions each shard computes (the calls the causal ring does not skip,
    counted by the test that skips them): in order shard i does i + 1 blocks, zig-zag every shard
    the same (at 8 shards 4.25 blocks, where the last shard did 8)."""
    block = 16 * 16
    for shards in (2, 4, 8):
        ring = functools.partial(Ring, None, shards, 1.0, True, None)
        assert work(ring(False), 16, 16) == [(i + 1) * block for i in range(shards)]
        balanced = work(ring(True), 16, 16)
        assert len(set(balanced)) == 1, balanced
        # the own block's two diagonals and one full quarter, then two quarters per other block
        assert balanced[0] == block * 3 // 4 + (shards - 1) * block // 2
    # a sliding window shorter than a block is about even either way
    assert work(Ring(None, 4, 1.0, True, 5, True), 16, 16) == [192, 256, 256, 256]


def test_ulysses_needs_query_heads_that_split_into_the_shards():
    q, k, v = qkv(1, 16, 16, 4, 2, 2)
    mapping = {"position": "context"}
    with pytest.raises(
        na.AttentionKernelError,
        match=r"context_strategy='ulysses'\): the query positions are split into 8 blocks over "
        r"mesh axes 'context', and Ulysses splits the query heads over them instead: the 4 query "
        r"heads \('heads'\) do not split into 8\. Pass context_strategy='ring' or 'all_gather', "
        r"or split 'position' over mesh axes whose size divides 4\.",
    ):
        with jax.set_mesh(make_mesh((8,), ("context",), AxisType.Explicit)):
            with na.axis_mapping(mapping):
                na.nn.dot_product_attention(q, k, v, context_strategy="ulysses")
    with pytest.raises(
        na.AttentionKernelError,
        match=r"the 2 query heads \(of 4, split by tensor parallelism\) \('heads'\) do not "
        r"split into 4",
    ):
        with jax.set_mesh(make_mesh((2, 4), ("model", "context"), AxisType.Auto)):
            with na.axis_mapping({**mapping, "heads": "model"}):
                na.nn.dot_product_attention(q, k, v, context_strategy="ulysses")
    with pytest.raises(
        na.AttentionKernelError,
        match=r"context_layout='zigzag'\): the query positions are split into 4 blocks over mesh "
        r"axes 'context'; the zig-zag layout cuts the 12 query and 12 key positions into 8 equal",
    ):
        q, k, v = qkv(1, 12, 12, 4, 2, 2)
        with jax.set_mesh(make_mesh((4,), ("context",), AxisType.Explicit)):
            with na.axis_mapping(mapping):
                na.nn.dot_product_attention(q, k, v, context_layout="zigzag")


def test_ring_never_reads_the_blocks_no_query_sees():
    """A causal ring skips the key blocks that lie after every query of a shard: with NaN values
    in the last block, only the shard holding the last queries sees NaN (all-gather, which
    multiplies masked weights by the values, gets NaN everywhere). (Values, not placement: one
    axis type.)"""
    mesh = make_mesh((4,), ("context",), AxisType.Explicit)
    q, k, finite = qkv(2, 16, 16, 2, 2, 4)
    v = named(finite.array.at[:, 12:].set(jnp.nan), finite.axes)
    mapping = {"position": "context", "key_position": "context"}
    out = {}
    with jax.set_mesh(mesh):
        for strategy in STRATEGIES:
            f = na.named_jit(
                lambda q, k, v, s=strategy: na.nn.dot_product_attention(
                    q, k, v, causal=True, context_strategy=s
                ),
                axis_resources=mapping,
                **FAST,
            )
            out[strategy] = np.asarray(f(*na.shard((q, k, v), mapping)).array)
    causal = jnp.arange(16)[None, :] <= jnp.arange(16)[:, None]
    want = reference(q.array, k.array, finite.array, causal[None, None], 0.5)
    np.testing.assert_allclose(out["ring"][:, :12], want[:, :12], rtol=1e-5, atol=1e-6)
    assert np.isnan(out["ring"][:, 12:]).all()
    assert np.isnan(out["all_gather"]).all()


def test_each_shard_runs_the_kernel_on_its_queries(emulate, monkeypatch):
    """All-gather: one kernel call per shard with its block of queries and every key; cuDNN takes
    it without a causal mask, refuses the causal one (the shard's queries start at a position
    known only at run time) and the ring (no log-sum-exp); the fastest kernel then falls back.
    Ulysses gives cuDNN every query from the first key: it runs causal, and is the default."""
    mesh = make_mesh((2, 4), ("data", "context"), AxisType.Explicit)
    mapping = {"batch": "data", "position": "context", "key_position": "context"}
    q, k, v = qkv(2, 16, 16, 4, 2, 8)
    calls = []
    run = kernels.run
    monkeypatch.setattr(kernels, "run", lambda impl, c: calls.append((impl, c)) or run(impl, c))

    def attend(**kw):
        f = na.named_jit(
            lambda q, k, v: na.nn.dot_product_attention(q, k, v, **kw), mapping, **FAST
        )
        with jax.set_mesh(mesh):
            return f(*na.shard((q, k, v), mapping))

    out = attend(implementation="cudnn", context_strategy="all_gather")
    np.testing.assert_allclose(
        out.array, reference(q.array, k.array, v.array, True, 8**-0.5), rtol=1e-5, atol=1e-5
    )
    # per shard: 1 of 2 rows, 4 of 16 queries, every key
    assert {(i, c.q.shape, c.k.shape) for i, c in calls} == {("cudnn", (1, 4, 4, 8), (1, 16, 2, 8))}
    with pytest.raises(
        na.AttentionKernelError,
        match=r"implementation='cudnn'\) cannot run here: cuDNN's causal mask puts query 0 at key "
        r"0, and these queries start at a key position known only when the program runs",
    ):
        attend(implementation="cudnn", causal=True, context_strategy="all_gather")
    with pytest.raises(
        na.AttentionKernelError, match=r"the ring merges its blocks by their log-sum"
    ):
        attend(implementation="cudnn", context_strategy="ring")
    monkeypatch.setattr(kernels, "platform", lambda: "gpu")
    calls.clear()
    out = attend(causal=True, context_strategy="all_gather")  # cuDNN refuses: XLA runs
    assert list(dict.fromkeys(i for i, _ in calls)) == ["cudnn", "xla"]
    # Ulysses runs cuDNN causal (every query, from the first key) on the shard's heads: by
    # default, where cuDNN runs and the query heads split into the shards
    calls.clear()
    out = attend(causal=True)
    causal = jnp.arange(16)[None, :] <= jnp.arange(16)[:, None]
    want = reference(q.array, k.array, v.array, causal[None, None], 8**-0.5)
    np.testing.assert_allclose(out.array, want, rtol=1e-5, atol=1e-5)
    # per shard: 1 of 2 rows, every query, 1 of 4 query heads, its key/value head (repeated)
    one = (1, 16, 1, 8)
    assert {(i, c.q.shape, c.k.shape, c.causal, c.offset) for i, c in calls} == {
        ("cudnn", one, one, True, 0)
    }


@pytest.fixture
def emulate(monkeypatch):
    monkeypatch.setattr(kernels, "_EMULATE", True)


def test_default_strategy_by_key_length_per_shard(caplog):
    """Ring from 4096 key positions per shard on, all-gather below; a ring needs equal blocks.
    (On a CPU: Ulysses is the default where a fused kernel runs, see the kernel test.) A causal
    ring whose positions do not cut into 2 x shards chunks runs unbalanced, and says so once."""
    mesh = make_mesh((2,), ("context",), AxisType.Explicit)
    mapping = {"position": "context", "key_position": "context"}

    def program(t, **kw):
        q, k, v = qkv(1, t, t, 1, 1, 2)
        f = lambda q, k, v: na.nn.dot_product_attention(q, k, v, causal=True, **kw)  # noqa: E731
        with jax.set_mesh(mesh), na.axis_mapping(mapping):
            return str(jax.make_jaxpr(f)(*na.shard((q, k, v), mapping)))

    long, short = program(8192), program(8190)  # 4096 and 4095 key positions per shard
    assert "ppermute" in long and "all_gather" not in long
    assert "all_gather" in short and "ppermute" not in short
    assert "ppermute" in program(16, context_strategy="ring")
    with caplog.at_level("WARNING", logger="namedaxes"):
        program(18, context_strategy="ring")
    assert (
        "causal ring runs unbalanced (the shard with the last queries does the most work): the "
        "query positions are split into 2 blocks over mesh axes 'context', and the zig-zag "
        "layout needs the 18 query and 18 key positions in 4 equal chunks" in caplog.text
    )

    q, _, _ = qkv(1, 8, 8, 1, 1, 2)
    _, k, v = qkv(1, 9, 9, 1, 1, 2)
    with pytest.raises(
        na.AttentionKernelError,
        match=r"context_strategy='ring'\): the query positions are split into 2 blocks over mesh "
        r"axes 'context', but the 9 key positions \('key_position'\) do not split into 2 equal",
    ):
        with jax.set_mesh(mesh), na.axis_mapping({"position": "context"}):
            na.nn.dot_product_attention(q, k, v, context_strategy="ring")
    with jax.set_mesh(mesh), na.axis_mapping({"position": "context"}):  # keys whole on each shard
        out = na.nn.dot_product_attention(q, k, v, causal=True)
    allowed = jnp.arange(9)[None, :] <= jnp.arange(8)[:, None] + 1
    want = reference(q.array, k.array, v.array, allowed[None, None], 2**-0.5)
    np.testing.assert_allclose(out.array, want, rtol=1e-5, atol=1e-6)


def test_unknown_strategy_is_refused():
    q, k, v = qkv(1, 4, 4, 1, 1, 2)
    with pytest.raises(
        na.AttentionKernelError,
        match=r"unknown context_strategy='zigzag'. Choose None \(by sizes\), 'all_gather', "
        "'ring', 'ulysses'",
    ):
        na.nn.dot_product_attention(q, k, v, context_strategy="zigzag")
    with pytest.raises(
        na.AttentionKernelError,
        match=r"unknown context_balance='striped'. Choose None \(the sequence in order\) or "
        "'zigzag'",
    ):
        na.nn.dot_product_attention(q, k, v, context_balance="striped")
    with pytest.raises(na.AttentionKernelError, match=r"unknown context_layout='zig'"):
        na.nn.dot_product_attention(q, k, v, context_layout="zig")
    with pytest.raises(
        na.AttentionKernelError,
        match=r"mask= takes query and key positions in order, and context_layout='zigzag' says",
    ):
        mask = na.nn.causal_mask(na.Axis("position", 4), na.Axis("key_position", 4))
        na.nn.dot_product_attention(q, k, v, mask=mask, context_layout="zigzag")
    with pytest.raises(na.LayerError, match="Attention context_balance must be one of 'zigzag'"):
        na.nn.Attention(
            na.Axis("embed", 4), na.Axis("heads", 1), na.Axis("head_dim", 4),
            key=jax.random.key(0), context_balance="zig",
        )  # fmt: skip
    with pytest.raises(na.ModelConfigError, match="TransformerConfig.context_balance must be"):
        CONFIG.replace(context_balance=True)
    with pytest.raises(na.LayerError, match="Attention context_strategy must be one of"):
        na.nn.Attention(
            na.Axis("embed", 4), na.Axis("heads", 1), na.Axis("head_dim", 4),
            key=jax.random.key(0), context_strategy="rings",
        )  # fmt: skip
    with pytest.raises(na.ModelConfigError, match="TransformerConfig.context_strategy must be"):
        CONFIG.replace(context_strategy="gather")


# -- the model ------------------------------------------------------------------------------------

CONFIG = TransformerConfig(
    "llama", vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=2, num_heads=4,
    num_kv_heads=2, head_dim=4,
)  # fmt: skip
SEQ = 24  # no other size of the model is 24: a collective with a dimension of 24 is a full sequence

# (mesh shape, mesh axes, mapping, strategy, axis type): context 8, 4 and 2, each with both
# strategies and both axis types across the list, with data and tensor parallelism.
TP = {"heads": "model", "kv_heads": "model", "mlp": "model"}
MODEL_CASES = [
    pytest.param((8,), ("context",), {}, "ring", AxisType.Auto, id="cp8-ring-auto"),
    pytest.param((8,), ("context",), {}, "all_gather", AxisType.Explicit, id="cp8-gather-explicit"),
    pytest.param(
        (2, 4), ("data", "context"), {}, "ring", AxisType.Explicit, id="dp2-cp4-ring-explicit"
    ),  # fmt: skip
    pytest.param(
        (2, 4), ("data", "context"), {}, "all_gather", AxisType.Auto, id="dp2-cp4-gather-auto"
    ),  # fmt: skip
    pytest.param(
        (2, 2, 2),
        ("data", "context", "model"),
        TP,
        "ring",
        AxisType.Auto,
        id="dp2-cp2-tp2-ring-auto",
    ),  # fmt: skip
    pytest.param(
        (2, 2, 2),
        ("data", "context", "model"),
        TP,
        "all_gather",
        AxisType.Explicit,
        id="dp2-cp2-tp2-gather-explicit",
    ),  # fmt: skip
    # Ulysses after tensor parallelism: 2 query heads and 1 key/value head per shard of `model`,
    # the key/value head repeated to split over `context` (the function tests take both kinds)
    pytest.param(
        (2, 2, 2),
        ("data", "context", "model"),
        TP,
        "ulysses",
        AxisType.Explicit,
        id="dp2-cp2-tp2-ulysses-explicit",
    ),  # fmt: skip
]

_REFERENCE = {}


def _loss(model, ids, labels):
    logits = model(ids)
    return na.nn.cross_entropy(logits, "vocab", labels).array, logits


def _batch():
    ids = jax.random.randint(jax.random.key(1), (2, SEQ), 0, 64)
    labels = jax.random.randint(jax.random.key(2), (2, SEQ), 0, 64)
    return named(ids, ("batch", "position")), named(labels, ("batch", "position"))


def _reference():
    if not _REFERENCE:
        model = Transformer(CONFIG, key=jax.random.key(0))
        step = na.named_jit(eqx.filter_value_and_grad(_loss, has_aux=True), **FAST)
        _REFERENCE["run"] = step(model, *_batch())
    return _REFERENCE["run"]


_OP = re.compile(
    r"=\s*(?P<shape>\([^=]*?\)|\S+)\s+"
    r"(?P<op>all-gather|reduce-scatter|all-reduce|all-to-all|collective-permute)(?:-start)?\("
)


def collectives(hlo):
    """``{op: [[dims of each result array], ...]}`` of the collectives in a compiled program."""
    found = {}
    for m in _OP.finditer(re.sub(r"/\*.*?\*/", "", hlo)):
        arrays = re.findall(r"\w+\[([\d,]*)\]", m["shape"])
        found.setdefault(m["op"], []).append([[int(d) for d in a.split(",") if d] for a in arrays])
    return found


@pytest.mark.parametrize("shape, names, extra, strategy, kind", MODEL_CASES)
def test_transformer_split_over_context_equals_unsharded(shape, names, extra, strategy, kind):
    """Logits and every gradient as unsharded; the compiled step exchanges keys and values only
    (all-gather + reduce-scatter of key/value blocks, collective-permutes of them, or Ulysses'
    all-to-alls of the shards' blocks of some heads), reduces the gradients, and moves no other
    array with a full-sequence dimension. A balanced causal ring (the default, where the
    sequence cuts into 2 x shards chunks) lays out the ids, the positions and the hidden states
    once for the whole model, not per layer."""
    (want_loss, want_logits), want_grads = _reference()
    mesh = make_mesh(shape, names, kind)
    mapping = {"position": "context", **({"batch": "data"} if "data" in names else {}), **extra}
    model = Transformer(CONFIG.replace(context_strategy=strategy), key=jax.random.key(0))
    step = na.named_jit(
        eqx.filter_value_and_grad(_loss, has_aux=True), axis_resources=mapping, **FAST
    )
    with jax.set_mesh(mesh):
        batch = na.shard(_batch(), mapping)
        (loss, logits), grads = step(model, *batch)
        found = collectives(step.lower(model, *batch).compile().as_text())
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    np.testing.assert_allclose(logits.array, want_logits.array, rtol=1e-5, atol=1e-5)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert spec_of(logits)[:2] == (("data", "context") if "data" in names else (None, "context"))

    sizes = dict(zip(names, shape))
    block = [2 // sizes.get("data", 1), SEQ // sizes["context"], 2 // sizes.get("model", 1), 4]
    kv_whole = [block[0], SEQ, *block[2:]]  # one shard's keys or values, every position
    exchange = {"ring": "collective-permute", "all_gather": "all-gather", "ulysses": "all-to-all"}
    assert found.get(exchange[strategy])
    assert strategy == "all_gather" or "all-gather" not in found
    assert strategy == "ring" or "collective-permute" not in found
    # the zig-zag layout's exchanges: half a block of the ids and of the positions (forward), of
    # the hidden states (forward and backward)
    half = SEQ // sizes["context"] // 2
    layout = {(block[0], half), (half,), (block[0], half, CONFIG.hidden_size)}
    laid_out = 0
    for op, results in found.items():
        for arrays in results:
            if op == "all-gather":  # the all-gather strategy's keys and values, nothing else
                assert any(SEQ in a for a in arrays), arrays
                assert {np.prod(a) for a in arrays} <= {np.prod(kv_whole), np.prod(block)}, arrays
            elif op == "collective-permute" and all(tuple(a) in layout for a in arrays):
                laid_out += len(arrays)
            elif op in ("collective-permute", "reduce-scatter"):  # the blocks (and their grads)
                assert all(np.prod(a) == np.prod(block) and SEQ not in a for a in arrays), arrays
            elif op == "all-to-all":  # Ulysses: the shard's positions of some heads
                assert all(a[:2] == block[:2] and SEQ not in a for a in arrays), arrays
            else:  # gradient and tensor-parallel reductions
                assert all(SEQ not in a for a in arrays), (op, arrays)
    balanced = strategy == "ring" and SEQ % (2 * sizes["context"]) == 0
    assert laid_out == (8 if balanced else 0)  # once, whatever the number of layers


def _plain_causal(q, k, v):
    s = jnp.einsum("btnd,bsnd->bnts", q, k) * q.shape[-1] ** -0.5
    t = q.shape[1]
    s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -jnp.inf)
    return jnp.einsum("bnts,bsnd->btnd", jax.nn.softmax(s, -1), v)


@pytest.mark.parametrize("balance", [None, "zigzag"], ids=["in-order", "zigzag"])
def test_context_over_mesh_axes_listed_out_of_mesh_order(axis_type, balance):
    """position over ("model", "data") on a (data, model) mesh: blocks are numbered with the
    first listed axis major, and the ring's sends must follow that numbering (jax.lax.ppermute
    reads its pairs in mesh order: the ring sent blocks to the wrong shards, and the zig-zag
    layout permuted positions wrongly)."""
    mesh = make_mesh((2, 4), ("data", "model"), axis_type)
    ks = jax.random.split(jax.random.key(0), 3)
    shape = {"batch": 1, "position": 32, "heads": 2, "head_dim": 8}
    q = na.random.normal(ks[0], shape)
    k, v = (na.random.normal(key, shape).rename({"position": "key_position"}) for key in ks[1:])
    want = _plain_causal(q.array, k.array, v.array)
    entry = ("model", "data")
    with jax.set_mesh(mesh), na.axis_mapping({"position": entry, "key_position": entry}):
        q, k, v = na.shard((q, k, v))
        attend = functools.partial(
            na.nn.dot_product_attention, causal=True, context_strategy="ring",
            context_balance=balance,
        )  # fmt: skip
        got = jax.jit(attend)(q, k, v)
    assert got.sharding.spec[got.axis_names.index("position")] == entry
    np.testing.assert_allclose(np.asarray(got.array), np.asarray(want), atol=2e-6)


def test_model_laid_out_by_its_ids_split_without_a_mapping(axis_type):
    """No mapping in force, ids split over `position` by their own sharding (Explicit): the model
    lays out ids, positions and mask alike (the default positions are replicated, and were left in
    order while the ids were permuted: wrong logits)."""
    cfg = TransformerConfig(
        "llama", vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=2, num_heads=4,
        num_kv_heads=2, head_dim=4, context_strategy="ring",
    )  # fmt: skip
    model = Transformer(cfg, key=jax.random.key(0))
    ids = named(jax.random.randint(jax.random.key(1), (2, 16), 0, 64), ("batch", "position"))
    mask = named(jnp.arange(16)[None, :] >= jnp.array([[0], [3]]), ("batch", "position"))
    want = model(ids, mask).array
    mesh = make_mesh((2, 4), ("data", "context"), axis_type)
    with jax.set_mesh(mesh):
        m, i, k = na.shard((model, ids, mask), {"batch": "data", "position": "context"})
        got = jax.jit(lambda m, i, k: m(i, k))(m, i, k).array
    keep = np.asarray(mask.array)[..., None]
    np.testing.assert_allclose(np.where(keep, got, 0), np.where(keep, want, 0), atol=1e-5)


# -- the zig-zag layout is read over the query's split ---------------------------------------------


def test_model_lays_out_by_the_split_its_queries_have():
    """Heads and position share `model`, heads first: the query's positions are not split
    (`position` falls back to None), though the ids' are. The model laid out its ids over the
    ids' 2 shards while attention ran unsplit on the permuted positions (wrong logits); it lays
    out by the query's split, here none. (Values: one axis type; the refusal below takes both.)"""
    cfg = CONFIG.replace(context_strategy="ring", context_balance="zigzag")
    model = Transformer(cfg, key=jax.random.key(0))
    ids = named(jax.random.randint(jax.random.key(1), (2, 16), 0, 64), ("batch", "position"))
    want = model(ids).array
    mapping = [(n, "model") for n in ("heads", "kv_heads", "mlp", "position")]
    with jax.set_mesh(make_mesh((4, 2), ("data", "model"), AxisType.Auto)):
        with na.axis_mapping(mapping + [("position", None)]):
            got = jax.jit(lambda m, i: m(i), **FAST)(*na.shard((model, ids))).array
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_a_layout_over_unsplit_query_positions_is_refused(axis_type):
    """context_layout="zigzag" with the query's positions not split (heads take the mesh axis
    position's rule names) raised nothing and read a permuted sequence in order. With no mesh
    the layout is over one shard: the identity, allowed."""
    q, k, v = qkv(1, 16, 16, 2, 2, 4)
    no_split = r"the query NamedArray\(batch=1, position=16, heads=2, head_dim=4\) does not have "
    fix = r"Lay the inputs out by the query's split, namedaxes.nn.zigzag\(x, like=query\)"
    mapping = [("heads", "model"), ("position", "model"), ("position", None)]
    with jax.set_mesh(make_mesh((4, 2), ("data", "model"), axis_type)), na.axis_mapping(mapping):
        with pytest.raises(
            na.AttentionKernelError,
            match=r"context_layout='zigzag'\): " + no_split + r"'position' split here \(it runs "
            r"as P\(None, None, 'model', None\)\), so there are no context shards to "
            r"read the layout over\. " + fix,
        ):
            na.nn.dot_product_attention(q, k, v, causal=True, context_layout="zigzag")
    # with no mesh, zigzag() is the identity and the layout reads the inputs in order
    in_order = na.nn.dot_product_attention(q, k, v, causal=True)
    laid = na.nn.dot_product_attention(na.nn.zigzag(q), k, v, causal=True, context_layout="zigzag")
    np.testing.assert_array_equal(laid.array, in_order.array)


def test_attention_lays_out_its_default_positions_like_its_input(axis_type):
    """nn.Attention(context_layout="zigzag") without positions: rotary took the laid-out tokens
    at positions 0 .. n-1 in order (wrong values); the default positions follow the layout."""
    E, H, D = na.Axis("embed", 8), na.Axis("heads", 2), na.Axis("head_dim", 4)
    attn = na.nn.Attention(E, H, D, key=jax.random.key(0), rotary=na.nn.RotaryEmbedding(D))
    x = na.random.normal(jax.random.key(1), {"batch": 1, "position": 16, "embed": 8})
    want = attn(x).array
    mapping = {"position": "context"}
    with jax.set_mesh(make_mesh((2, 4), ("data", "context"), axis_type)):
        with na.axis_mapping(mapping):
            a, xs = na.shard((attn, x))
            out = jax.jit(lambda a, x: a(na.nn.zigzag(x), context_layout="zigzag"), **FAST)(a, xs)
            got = na.nn.zigzag(out, inverse=True)
    np.testing.assert_allclose(got.array, want, atol=1e-5)


def test_keys_laid_out_by_the_queries_split():
    """Under the documented mapping (no rule for key_position) keys have no split of their own:
    zigzag((k, v), "key_position") left them in order, and like=q found no key_position on q and
    left them too; attention then read keys in order as zig-zag (wrong values). like_axis takes
    the query's split of position; a like without the axis is refused. (Values, not placement:
    one axis type.)"""
    q, k, v = qkv(1, 16, 16, 2, 2, 4)
    causal = jnp.arange(16)[None, :] <= jnp.arange(16)[:, None]
    want = reference(q.array, k.array, v.array, causal[None, None], 0.5)
    with jax.set_mesh(make_mesh((2, 4), ("data", "context"), AxisType.Explicit)):
        with na.axis_mapping({"position": "context"}):
            q, k, v = na.shard((q, k, v))
            with pytest.raises(
                na.AxisNotFoundError,
                match=r"zigzag: like NamedArray\(batch=1, position=16, heads=2, head_dim=4\) has "
                r"no axis 'key_position' whose split would lay out 'key_position'\. Available "
                r"axes: 'batch', 'position', 'heads', 'head_dim'\. Name the axis to take the "
                r"split from, e.g\. like_axis='position'",
            ):
                na.nn.zigzag((k, v), "key_position", like=q)
            zk, zv = na.nn.zigzag((k, v), "key_position", like=q, like_axis="position")
            out = na.nn.dot_product_attention(
                na.nn.zigzag(q), zk, zv, causal=True, context_layout="zigzag"
            )
            got = na.nn.zigzag(out, inverse=True)
    np.testing.assert_allclose(got.array, want, atol=1e-5)


def test_general_path_refuses_context_parallelism():
    """A value with another head size runs by named ops, which neither read a laid-out sequence
    (a causal mask in order: wrong values) nor run a ring (silently not ringed)."""
    q, k, _ = qkv(1, 16, 16, 2, 2, 4)
    v = na.random.normal(jax.random.key(5), {"batch": 1, "key_position": 16, "heads": 2, "v": 6})
    general = (
        r"the value NamedArray\(batch=1, key_position=16, heads=2, v=6\) has other axes than "
        r"the key NamedArray\(batch=1, key_position=16, heads=2, head_dim=4\), so attention runs "
        r"by named ops, and only the kernel path does context parallelism\. Give the value the "
        r"key's axes"
    )
    mapping = {"position": "context", "key_position": "context"}
    with jax.set_mesh(make_mesh((2, 4), ("data", "context"), AxisType.Explicit)):
        with na.axis_mapping(mapping):
            q, k, v = na.shard((q, k, v))
            with pytest.raises(na.AttentionKernelError, match=r"\(context_layout='zigzag'\): "):
                na.nn.dot_product_attention(q, k, v, causal=True, context_layout="zigzag")
            with pytest.raises(
                na.AttentionKernelError, match=r"\(context_strategy='ring'\): " + general
            ):
                na.nn.dot_product_attention(q, k, v, causal=True, context_strategy="ring")
            out = na.nn.dot_product_attention(q, k, v, causal=True)  # placed by XLA
    assert out.axis_names == ("batch", "position", "heads", "v")
