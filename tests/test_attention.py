"""nn.dot_product_attention: every kernel against a plain jax.numpy attention, sharded and not.

cuDNN and splash cannot run on a CPU. Their *mappings* (rotation of left-padded rows, key lengths,
causal/window arguments, segment ids, per-head kernels) are checked here by running them with
``_attention_kernels._EMULATE``: the cuDNN call goes to JAX's XLA implementation of the same
arguments (JAX defines them identically for both), splash runs Pallas in interpret mode. The
cuDNN kernel itself is checked on a GPU by ``benchmarks/accelerator.py --check``.
"""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import spec_of
from jax.sharding import PartitionSpec as P

import namedaxes as na
from namedaxes import named
from namedaxes.nn import _attention_kernels as kernels

TOL = {jnp.float32: 1e-5, jnp.bfloat16: 2e-2}


def reference(q, k, v, allowed, scale):
    """Plain attention: q (b, t, n, d), k/v (b, s, m, d), allowed broadcastable to (b, n, t, s).

    Key/value head ``h // (n // m)`` serves query head ``h`` (the kv heads are repeated here).
    """
    n, m = q.shape[2], k.shape[2]
    k, v = jnp.repeat(k, n // m, axis=2), jnp.repeat(v, n // m, axis=2)
    f32 = jnp.float32
    s = jnp.einsum("btnd,bsnd->bnts", q.astype(f32), k.astype(f32)) * scale
    s = jnp.where(allowed, s, jnp.finfo(f32).min)
    return jnp.einsum("bnts,bsnd->btnd", jax.nn.softmax(s, axis=-1), v.astype(f32))


def qkv(b, t, s, n, m, d, dtype=jnp.float32, seed=0):
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    kv_name = "heads" if n == m else "kv_heads"
    q = na.random.normal(kq, {"batch": b, "position": t, "heads": n, "head_dim": d})
    k = na.random.normal(kk, {"batch": b, "key_position": s, kv_name: m, "head_dim": d})
    v = na.random.normal(kv, {"batch": b, "key_position": s, kv_name: m, "head_dim": d})
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)


def case(name, t):
    """``(keyword arguments, allowed (b, 1, t, s))`` for a named case over 2 rows of length t."""
    i = jnp.arange(t)
    causal = i[None, :] <= i[:, None]
    if name == "causal":
        return dict(causal=True), causal[None, None]
    if name == "left_padded":
        starts = jnp.array([0, t // 3])
        real = i[None, :] >= starts[:, None]
        kw = dict(causal=True, key_mask=named(real, ("batch", "key_position")))
        return kw, causal[None, None] & real[:, None, None, :]
    if name == "sliding_window":  # also right padding, by lengths
        w, lengths = t // 4 + 1, jnp.array([t, t - 3])
        window = causal & (i[None, :] > i[:, None] - w)
        real = i[None, :] < lengths[:, None]
        kw = dict(sliding_window=w, key_lengths=named(lengths, ("batch",)))
        return kw, window[None, None] & real[:, None, None, :]
    if name == "padded_not_causal":  # every query sees the real keys of its row
        starts, ends = jnp.array([1, 0]), jnp.array([t - 2, t])
        real = (i[None, :] >= starts[:, None]) & (i[None, :] < ends[:, None])
        return dict(key_mask=named(real, ("batch", "key_position"))), real[:, None, None, :]
    raise AssertionError(name)


def check(out, ref, allowed, dtype):
    """Compare the rows that see at least one key (the others are unspecified)."""
    seen = jnp.broadcast_to(allowed, (ref.shape[0], ref.shape[2]) + allowed.shape[2:]).any(-1)
    rows = jnp.moveaxis(seen, 1, 2)[..., None]  # (b, t, n, 1)
    got = np.asarray(jnp.where(rows, out.astype(jnp.float32), 0.0))
    want = np.asarray(jnp.where(rows, ref, 0.0))
    np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.fixture
def emulate(monkeypatch):
    monkeypatch.setattr(kernels, "_EMULATE", True)


CASES = ["causal", "left_padded", "sliding_window", "padded_not_causal"]


# XLA in both dtypes; cuDNN's mapping (which does not depend on the dtype) in float32, and bfloat16
# once (the kernel itself only runs bfloat16/float16 on a GPU).
F32, BF16 = jnp.float32, jnp.bfloat16
KERNEL_CASES = [
    *(pytest.param("xla", n, d, id=f"xla-{n}-{d.__name__}") for n in CASES for d in (F32, BF16)),
    *(pytest.param("cudnn", n, F32, id=f"cudnn-{n}-float32") for n in CASES),
    pytest.param("cudnn", "left_padded", BF16, id="cudnn-left_padded-bfloat16"),
]


@pytest.mark.parametrize("impl, name, dtype", KERNEL_CASES)
def test_kernels_agree_with_plain_attention(impl, name, dtype, emulate):
    q, k, v = qkv(2, 9, 9, 6, 2, 8, dtype)  # grouped-query: 6 query heads, 2 key/value heads
    kw, allowed = case(name, 9)
    run = jax.jit(lambda q, k, v: na.nn.dot_product_attention(q, k, v, implementation=impl, **kw))
    out = run(q, k, v)
    assert out.axes == q.axes and out.dtype == dtype
    check(out.array, reference(q.array, k.array, v.array, allowed, 8**-0.5), allowed, dtype)


@pytest.mark.parametrize(
    "name, dtype",
    [("causal", jnp.bfloat16), ("left_padded", jnp.float32), ("sliding_window", jnp.float32)],
)
def test_splash_agrees_with_plain_attention(name, dtype, emulate):
    q, k, v = qkv(2, 128, 128, 4, 2, 16, dtype)
    kw, allowed = case(name, 128)
    out = na.nn.dot_product_attention(q, k, v, implementation="splash", **kw)
    check(out.array, reference(q.array, k.array, v.array, allowed, 16**-0.5), allowed, dtype)


def test_multi_head_attention_and_several_batch_axes(emulate):
    """Two batch-like axes are flattened into the kernel's batch; MHA shares `heads`."""
    q, k, v = qkv(6, 5, 5, 2, 2, 4)
    split = lambda x: x.unflatten_axis("batch", {"replica": 2, "batch": 3})  # noqa: E731
    q, k, v = split(q), split(k), split(v)
    flat = lambda x: x.rearrange(("replica", "batch", ...)).array.reshape((6,) + x.array.shape[2:])  # noqa: E731
    i = jnp.arange(5)
    allowed = (i[None, :] <= i[:, None])[None, None]
    ref = reference(flat(q), flat(k), flat(v), allowed, 0.5)
    for impl in ("xla", "cudnn"):
        out = na.nn.dot_product_attention(q, k, v, causal=True, implementation=impl)
        assert out.axes == q.axes
        check(flat(out), ref, allowed, jnp.float32)


def test_decoding_queries_at_an_offset(emulate):
    """Queries that are the last positions of the key axis, and a traced offset (a cache)."""
    q, k, v = qkv(2, 3, 8, 4, 2, 4)
    t, s = jnp.arange(3), jnp.arange(8)
    starts = jnp.array([0, 2])
    real = s[None, :] >= starts[:, None]
    key_mask = named(real, ("batch", "key_position"))
    at_end = (s[None, :] <= t[:, None] + 5)[None, None] & real[:, None, None, :]
    out = na.nn.dot_product_attention(q, k, v, causal=True, key_mask=key_mask)
    check(out.array, reference(q.array, k.array, v.array, at_end, 0.5), at_end, jnp.float32)

    @jax.jit
    def step(q, k, v, offset):
        return na.nn.dot_product_attention(q, k, v, sliding_window=3, query_offset=offset)

    q1 = q["position", 0:1]
    window = (s[None, :] <= 4) & (s[None, :] > 1)
    out = step(q1, k, v, jnp.int32(4))
    check(
        out.array,
        reference(q1.array, k.array, v.array, window[None, None], 0.5),
        window[None, None],
        jnp.float32,
    )
    with pytest.raises(na.AttentionKernelError, match=r"queries at an offset \(decoding"):
        na.nn.dot_product_attention(q, k, v, causal=True, implementation="cudnn")


def test_value_with_another_head_size_takes_the_named_path():
    q, k, _ = qkv(2, 4, 4, 2, 2, 4)
    v = na.random.normal(
        jax.random.key(3), {"batch": 2, "key_position": 4, "heads": 2, "head_dim": 3}
    )
    i = jnp.arange(4)
    allowed = (i[None, :] <= i[:, None])[None, None]
    out = na.nn.dot_product_attention(q, k, v, causal=True)
    s = jnp.einsum("btnd,bsnd->bnts", q.array, k.array) * 0.5
    w = jax.nn.softmax(jnp.where(allowed, s, -jnp.inf), axis=-1)
    ref = jnp.einsum("bnts,bsnd->btnd", w, v.array)
    np.testing.assert_allclose(
        out.rearrange(("batch", "position", "heads", "head_dim")).array, ref, rtol=1e-5, atol=1e-5
    )
    with pytest.raises(na.AttentionKernelError, match=r"has other axes than the key"):
        na.nn.dot_product_attention(q, k, v, implementation="cudnn")


def test_no_repeated_key_value_heads_in_the_xla_program():
    """Grouped-query attention never builds keys or values with one copy per query head."""
    q, k, v = qkv(2, 5, 10, 6, 2, 4)  # no array may have both the key length 10 and 6 heads

    def shapes(jaxpr):
        for eqn in jaxpr.eqns:
            for var in eqn.outvars:
                yield tuple(getattr(var.aval, "shape", ()))
            for p in eqn.params.values():
                for sub in p if isinstance(p, (tuple, list)) else (p,):
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        yield from shapes(inner)

    def loss(q, k, v):
        out = na.nn.dot_product_attention(q, k, v, causal=True, implementation="xla")
        return out.array.sum()

    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(1, 2)))(q, k, v).jaxpr
    seen = list(shapes(jaxpr))
    assert any(10 in s for s in seen) and any(6 in s for s in seen)  # the walk sees the program
    assert not [s for s in seen if 10 in s and 6 in s]


@pytest.mark.parametrize("impl", ["xla", "cudnn"])
@pytest.mark.parametrize("kv_heads", [4, 2], ids=["kv_split", "kv_whole"])
def test_sharded_batch_and_heads(mesh_2x4, impl, kv_heads, emulate, monkeypatch):
    """Under a mapping the kernel runs per shard: values, gradients and output specs.

    One case holds all the options: grouped-query heads, left padding, a sliding window (causal).
    With 4 key/value heads they are split over `model` as the query heads are; with 2 (fewer than
    the 4 devices of `model`, and not mapped) each device keeps the key/value head its 2 query
    heads use, and the query heads stay split.
    """
    q, k, v = qkv(4, 8, 8, 8, kv_heads, 4)
    i = jnp.arange(8)
    real = i[None, :] >= jnp.array([0, 3, 1, 5])[:, None]
    window = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - 3)
    allowed = window[None, None] & real[:, None, None, :]
    seen = allowed.any(-1)[:, 0, :, None, None]

    def loss(q, k, v, key_mask):
        out = na.nn.dot_product_attention(
            q, k, v, sliding_window=3, key_mask=key_mask, implementation=impl
        )
        return jnp.sum(jnp.where(seen, out.array, 0.0) ** 2), out

    def ref_loss(q, k, v):
        out = reference(q, k, v, allowed, 0.5)
        return jnp.sum(jnp.where(seen, out, 0.0) ** 2)

    mapping = {"batch": "data", "heads": "model"}
    if kv_heads == 4:
        mapping["kv_heads"] = "model"
    calls = []
    run = kernels.run
    monkeypatch.setattr(kernels, "run", lambda impl, c: calls.append(c) or run(impl, c))
    step = na.named_jit(
        jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True), axis_resources=mapping
    )
    key_mask = named(real, ("batch", "key_position"))
    with jax.set_mesh(mesh_2x4):
        (value, out), grads = step(q, k, v, key_mask)
        with na.axis_mapping(mapping):  # the kernel runs inside one shard_map
            assert str(jax.make_jaxpr(loss)(q, k, v, key_mask)).count("shard_map[") == 1
    want, want_grads = jax.value_and_grad(ref_loss, argnums=(0, 1, 2))(q.array, k.array, v.array)
    # per device: 2 of 4 batch rows, 2 of 8 query heads, and 1 key/value head
    assert calls and {(c.q.shape, c.k.shape) for c in calls} == {((2, 8, 2, 4), (2, 8, 1, 4))}
    assert out.array.sharding.spec[:3] == ("data", None, "model")
    assert spec_of(grads[1]) == (P("data", None, "model") if kv_heads == 4 else P("data"))
    np.testing.assert_allclose(value, want, rtol=1e-5)
    for g, w in zip(grads, want_grads):
        np.testing.assert_allclose(g.array, w, rtol=1e-4, atol=1e-5)


def test_named_kernel_that_cannot_run_raises():
    q, k, v = qkv(1, 4, 4, 2, 2, 8, jnp.bfloat16)
    with pytest.raises(
        na.AttentionKernelError,
        match=r"dot_product_attention\(implementation='cudnn'\) cannot run here: cuDNN attention "
        r"runs on NVIDIA GPUs; this backend is cpu",
    ):
        na.nn.dot_product_attention(q, k, v, implementation="cudnn")
    with pytest.raises(na.AttentionKernelError, match=r"splash attention runs on TPUs"):
        na.nn.dot_product_attention(q, k, v, implementation="splash")
    with pytest.raises(na.AttentionKernelError, match=r"unknown implementation='flash'"):
        na.nn.dot_product_attention(q, k, v, implementation="flash")


def test_splash_refuses_what_it_cannot_take(emulate):
    q, k, v = qkv(1, 4, 4, 2, 2, 8)
    with pytest.raises(na.AttentionKernelError, match=r"multiples of 128, got 4 and 4"):
        na.nn.dot_product_attention(q, k, v, implementation="splash")
    mask = na.ones({"position": 4, "key_position": 4}, dtype=bool)
    with pytest.raises(na.AttentionKernelError, match=r"not a general mask="):
        na.nn.dot_product_attention(q, k, v, mask=mask, implementation="splash")


def test_fastest_kernel_falls_back_with_one_note(monkeypatch, caplog):
    """None tries the platform's kernel; when it cannot take the inputs, XLA, noted once."""
    monkeypatch.setattr(kernels, "preferred", lambda: "cudnn")  # a GPU's choice, on a CPU
    kernels.note_once.cache_clear()
    q, k, v = qkv(1, 4, 4, 2, 2, 8)
    with caplog.at_level(logging.WARNING, logger="namedaxes"):
        out = na.nn.dot_product_attention(q, k, v, causal=True)
        na.nn.dot_product_attention(q, k, v, causal=True)
    notes = [r.getMessage() for r in caplog.records]
    assert notes == [
        "namedaxes: dot_product_attention uses XLA instead of cudnn: cuDNN attention runs on "
        "NVIDIA GPUs; this backend is cpu."
    ]
    expected = na.nn.dot_product_attention(q, k, v, causal=True, implementation="xla")
    np.testing.assert_array_equal(out.array, expected.array)


def test_option_errors():
    q, k, v = qkv(2, 4, 4, 2, 2, 8)
    km = named(jnp.ones((2, 4), bool), ("batch", "key_position"))
    with pytest.raises(na.NamedTypeError, match=r"pass key_mask= or key_lengths=, not both"):
        na.nn.dot_product_attention(
            q, k, v, key_mask=km, key_lengths=named(jnp.ones(2, int), "batch")
        )
    match = (
        r"key_mask NamedArray\(heads=2, key_position=4\) has axis 'heads'; padding is per batch "
        r"row, so it may only have 'batch', 'key_position' \(axes the query, key and value share, "
        r"besides 'heads'\)"
    )
    with pytest.raises(na.AxisNotFoundError, match=match):
        na.nn.dot_product_attention(
            q, k, v, key_mask=named(jnp.ones((2, 4), bool), ("heads", "key_position"))
        )
    with pytest.raises(na.NamedTypeError, match=r"sliding_window must be a positive int, got 0"):
        na.nn.dot_product_attention(q, k, v, sliding_window=0)
    with pytest.raises(na.NamedTypeError, match=r"must share a dtype, got float32, bfloat16"):
        na.nn.dot_product_attention(q, k.astype(jnp.bfloat16), v)
    kv3 = na.ones({"batch": 2, "key_position": 4, "kv_heads": 3, "head_dim": 8})
    with pytest.raises(
        na.AxisSizeError,
        match=r"key/value heads \(kv_heads=3\) must divide the query heads \(heads=2\)",
    ):
        na.nn.dot_product_attention(q, kv3, kv3)


def test_dot_product_attention_runs_the_kernel_by_name():
    """implementation="pallas" without context parallelism: one call at the query offset (the
    queries the last of the keys by default), values and gradients as XLA's; padding and mask=
    are typed errors naming the kernel and the fix."""
    ks = jax.random.split(jax.random.key(3), 3)
    q = na.random.normal(ks[0], {"batch": 1, "position": 8, "heads": 4, "head_dim": 16})
    k, v = (na.random.normal(x, {"batch": 1, "key_position": 24, "kv_heads": 2, "head_dim": 16})
            for x in ks[1:])  # fmt: skip

    def loss(impl):
        def f(q, k, v):
            out = na.nn.dot_product_attention(q, k, v, sliding_window=12, implementation=impl)
            return jnp.sum(out.array**2)

        return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))

    (value, grads), (want, want_grads) = loss("pallas")(q, k, v), loss("xla")(q, k, v)
    np.testing.assert_allclose(value, want, rtol=1e-5)
    for a, b in zip(grads, want_grads):
        np.testing.assert_allclose(a.array, b.array, rtol=1e-5, atol=1e-5)
    lengths = na.named(jnp.array([20]), "batch")
    with pytest.raises(
        na.AttentionKernelError,
        match=r"implementation='pallas'\) cannot run here: the Pallas flash-attention kernel takes "
        r"causal, sliding-window and query offsets, not padding \(key_mask= or key_lengths=\); "
        r"use implementation='xla' \(or None\)",
    ):
        na.nn.dot_product_attention(q, k, v, key_lengths=lengths, implementation="pallas")
    mask = na.named(jnp.ones((8, 24), bool), ("position", "key_position"))
    with pytest.raises(na.AttentionKernelError, match=r"kernel takes .* offsets, not mask="):
        na.nn.dot_product_attention(q, k, v, mask=mask, implementation="pallas")
    with pytest.raises(na.AttentionKernelError, match=r"takes float32, bfloat16 or float16, got"):
        with jax.enable_x64():
            x = na.named(jnp.ones((2, 16), jnp.float64), ("position", "head_dim"))
            y = na.named(jnp.ones((2, 16), jnp.float64), ("key_position", "head_dim"))
            na.nn.dot_product_attention(x, y, y, implementation="pallas")


def test_heads_pair_by_name_not_by_layout():
    """Several query-only (or key-only) heads axes would pair with the key/value heads in the order
    they are laid out: that is an error; one heads axis, or the key/value heads shared by name,
    give one result whatever the layout."""
    ks = jax.random.split(jax.random.key(5), 2)
    q = na.random.normal(ks[0], {"position": 3, "a": 2, "c": 2, "head_dim": 8})
    k = na.random.normal(ks[1], {"key_position": 3, "kv": 2, "head_dim": 8})
    match = (
        r"the query has several heads axes \(a=2, c=2\), which flatten into heads that pair with "
        r"the other side's \(kv=2\) by position, so the pairing would follow the order of those "
        r"axes in the array. Flatten them into one axis \(flatten_axes\(query, \('a', 'c'\), "
        r"'heads'\)\)"
    )
    for query in (q, q.rearrange(("position", "c", "a", "head_dim"))):
        with pytest.raises(na.AxisSizeError, match=match):
            na.nn.dot_product_attention(query, k, k)
    k2 = k.rename({"kv": "g1"}).broadcast_axis(na.Axis("g2", 2))
    with pytest.raises(na.AxisSizeError, match=r"the key has several heads axes \(g1=2, g2=2\)"):
        na.nn.dot_product_attention(na.flatten_axes(q, ("a", "c"), "heads"), k2, k2)
    # By name: 'kv' shared (a batch axis of the kernel), or a single key/value head.
    named_q = q.rename({"a": "kv"})
    flipped = named_q.rearrange(("c", "position", "head_dim", "kv"))
    want = na.nn.dot_product_attention(named_q, k, k)
    got = na.nn.dot_product_attention(flipped, k, k).rearrange(want.axis_names)
    np.testing.assert_allclose(got.array, want.array, rtol=1e-6)
    k1 = k["kv", 0:1]
    want = na.nn.dot_product_attention(q, k1, k1)
    got = na.nn.dot_product_attention(q.rearrange(("c", "a", "head_dim", "position")), k1, k1)
    np.testing.assert_allclose(got.rearrange(want.axis_names).array, want.array, rtol=1e-6)


def test_causal_must_be_a_bool():
    q, k, v = qkv(1, 2, 2, 2, 2, 4)
    with pytest.raises(na.NamedTypeError, match=r"causal must be True, False or None, got 'no'"):
        na.nn.dot_product_attention(q, k, v, causal="no")
    E, H, D = na.Axis("embed", 8), na.Axis("heads", 2), na.Axis("head_dim", 4)
    with pytest.raises(na.NamedTypeError, match=r"Attention causal must be True or False, got 1"):
        na.nn.Attention(E, H, D, key=jax.random.key(0), causal=1)


def test_grouped_query_heads_on_the_named_path_pair_like_the_kernel():
    """A value with another head size runs by named ops; query head h uses kv head h // 2."""
    q, k, _ = qkv(2, 3, 5, 4, 2, 8)
    v = na.random.normal(
        jax.random.key(3), {"batch": 2, "key_position": 5, "kv_heads": 2, "head_dim": 6}
    )
    heads = jax.random.bernoulli(jax.random.key(4), 0.6, (4, 5)).at[:, -1].set(True)
    mask = named(heads, ("heads", "key_position"))
    i, j = jnp.arange(3)[:, None] + 2, jnp.arange(5)[None, :]
    allowed = (j <= i)[None, None] & heads[None, :, None, :]
    want = reference(q.array, k.array, v.array, allowed, 8**-0.5)
    order = ("head_dim", "heads", "position", "batch")  # names, not positions
    out = na.nn.dot_product_attention(q.rearrange(order), k, v, causal=True, mask=mask)
    assert out.axes == (
        na.Axis("head_dim", 6), na.Axis("heads", 4), na.Axis("position", 3), na.Axis("batch", 2)
    )  # fmt: skip
    got = out.rearrange(("batch", "position", "heads", "head_dim")).array
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "where, axes, match",
    [
        ("key", {"batch": 3, "key_position": 5, "heads": 4, "head_dim": 8},
         r"axis 'batch' has size 2 in the query .* but size 3 in the key"),
        ("key", {"batch": 2, "key_position": 5, "heads": 2, "head_dim": 8},
         r"axis 'heads' has size 4 in the query .* but size 2 in the key"),
        ("mask", {"position": 1, "key_position": 5},
         r"axis 'position' has size 3 in the query .* but size 1 in the mask .* One name must "
         r"have one size: give the mask size 3 along 'position'"),
        ("key_mask", {"batch": 3, "key_position": 5},
         r"axis 'batch' has size 2 in the query .* but size 3 in the key_mask"),
        ("key_lengths", {"batch": 3}, r"size 3 in the key_lengths"),
    ],
)  # fmt: skip
def test_one_name_has_one_size_across_the_inputs(where, axes, match):
    q, k, v = qkv(2, 3, 5, 4, 4, 8)
    kw = {}
    if where == "key":
        k = v = na.ones(axes)
    elif where == "key_lengths":
        kw[where] = na.full(axes, 2)
    else:
        kw[where] = na.full(axes, True)
    with pytest.raises(na.AxisSizeError, match=match):
        na.nn.dot_product_attention(q, k, v, **kw)


def test_integer_inputs_are_refused():
    q, k, v = (x.astype(jnp.int32) for x in qkv(1, 3, 3, 2, 2, 4))
    with pytest.raises(na.NamedTypeError, match=r"must be floating point .* got int32"):
        na.nn.dot_product_attention(q, k, v)


def test_scale_must_be_a_static_real_number():
    q, k, v = qkv(1, 3, 3, 2, 2, 4)
    with pytest.raises(na.NamedTypeError, match=r"scale must be a real number .* got 'a'"):
        na.nn.dot_product_attention(q, k, v, scale="a")
    with pytest.raises(na.NamedTypeError, match=r"scale must be a static number, got a traced"):
        jax.jit(lambda s: na.nn.dot_product_attention(q, k, v, scale=s))(0.5)
    a = na.nn.dot_product_attention(q, k, v, scale=jnp.float32(0.25))
    b = na.nn.dot_product_attention(q, k, v, scale=0.25)
    np.testing.assert_array_equal(a.array, b.array)


def test_a_sliding_window_is_causal_and_refuses_causal_false():
    q, k, v = qkv(1, 4, 4, 2, 2, 4)
    a = na.nn.dot_product_attention(q, k, v, sliding_window=2)
    b = na.nn.dot_product_attention(q, k, v, sliding_window=2, causal=True)
    np.testing.assert_array_equal(a.array, b.array)
    with pytest.raises(na.LayerError, match=r"sliding_window=2 is a causal window"):
        na.nn.dot_product_attention(q, k, v, sliding_window=2, causal=False)
