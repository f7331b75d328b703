"""namedaxes.nn layers: values against the plain-JAX computation with the same parameters, and errors."""

import functools
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import namedaxes as na
from namedaxes import Axis, named

KEY = jax.random.key(0)
B, T, E = Axis("batch", 2), Axis("position", 5), Axis("embed", 8)


def close(a, b, tol=1e-5):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


def data(*axes, key=1):
    return na.random.normal(jax.random.key(key), axes)


# -- Linear -------------------------------------------------------------------------------------


def test_linear_several_axes_matches_einsum():
    In, Out = (E, Axis("k", 2)), (Axis("heads", 2), Axis("head_dim", 3))
    lin = na.nn.Linear(In, Out, key=KEY)
    lin = eqx.tree_at(lambda m: m.bias, lin, data(*Out, key=3))
    x = data(B, E, T, Axis("k", 2))

    @eqx.filter_jit
    def run(lin, x):
        ref = jnp.einsum("betk,ekhd->bthd", x.array, lin.weight.array) + lin.bias.array[None, None]
        return lin(x), ref

    y, ref = run(lin, x)
    assert y.axis_names == ("batch", "position", "heads", "head_dim")
    close(y.array, ref)


def test_linear_init_scale_and_no_bias():
    lin = na.nn.Linear({"embed": 256}, {"mlp": 64}, key=KEY, use_bias=False, init_scale=2.0)
    assert lin.bias is None and lin.weight.axis_names == ("embed", "mlp")
    assert abs(float(jnp.std(lin.weight.array)) - 2.0 / 16) < 0.01
    assert na.nn.Linear(E, {"mlp": 4}, key=KEY, dtype=jnp.bfloat16).weight.dtype == jnp.bfloat16


def test_linear_errors():
    lin = na.nn.Linear(E, {"mlp": 4}, key=KEY)
    with pytest.raises(
        na.AxisNotFoundError,
        match=r"Linear works over axis 'embed', but `x` is NamedArray\(batch=2, hidden=8\)\. Available axes: 'batch', 'hidden'",
    ):
        lin(na.ones({"batch": 2, "hidden": 8}))
    with pytest.raises(
        na.AxisSizeError, match=r"Linear expects axis 'embed' of size 8, but `x` has size 3"
    ):
        lin(na.ones({"embed": 3}))
    with pytest.raises(
        na.DuplicateAxisError, match=r"already has axis 'mlp', which is an output axis"
    ):
        lin(na.ones({"embed": 8, "mlp": 4}))
    with pytest.raises(
        na.DuplicateAxisError, match=r"axis 'embed' is both an input and an output axis"
    ):
        na.nn.Linear(E, E, key=KEY)
    with pytest.raises(
        na.NamedTypeError, match=r"needs a NamedArray for `x`, got a plain array of shape \(8,\)"
    ):
        lin(jnp.ones(8))
    with pytest.raises(na.NamedTypeError, match=r"parameters need a floating dtype, got int32"):
        na.nn.Linear(E, {"mlp": 4}, key=KEY, dtype=jnp.int32)


# -- Embedding ----------------------------------------------------------------------------------


def test_embedding_lookup_and_tied_unembed():
    V = Axis("vocab", 11)
    emb = na.nn.Embedding(V, E, key=KEY)
    ids = named(jnp.array([[1, 2, 3, 0, 10], [4, 4, 5, 6, 7]]), (B, T))
    h = emb(ids)
    assert h.axis_names == ("batch", "position", "embed")
    close(h.array, emb.weight.array[ids.array])
    logits = emb.unembed(h)
    assert logits.axis_names == ("batch", "position", "vocab")
    close(logits.array, jnp.einsum("bte,ve->btv", h.array, emb.weight.array))
    assert (
        abs(
            float(jnp.std(na.nn.Embedding({"vocab": 512}, {"embed": 64}, key=KEY).weight.array))
            - 0.125
        )
        < 0.01
    )


def test_embedding_ids_outside_the_vocabulary_raise_or_read_nan():
    """A wrong id never reads another token's vector: concrete ids outside [0, vocab) (negative
    ones too: no counting from the end) raise naming them; under jit their vectors are NaN and
    every other vector is the table's row, exactly. Tied unembed is unchanged."""
    V = Axis("vocab", 11)
    emb = na.nn.Embedding(V, E, key=KEY)
    ids = named(jnp.array([[1, 600, 3, 0, 10], [-1, 4, 5, -100, 7]]), (B, T))
    with pytest.raises(
        na.AxisIndexError,
        match=r"Embedding: token id\(s\) -100, -1, 600 outside the vocabulary: 'vocab' has 11 "
        r"entries, so ids must be in \[0, 11\) \(first at batch=0, position=1\)\. Negative ids "
        r"do not count from the end here\. Use the tokenizer that matches the model",
    ):
        emb(ids)
    h = eqx.filter_jit(lambda emb, ids: emb(ids))(emb, ids).array
    bad = np.array([[0, 1, 0, 0, 0], [1, 0, 0, 1, 0]], bool)
    assert np.isnan(h[bad]).all() and not np.isnan(h[~bad]).any()
    np.testing.assert_array_equal(
        h[~bad], np.asarray(emb.weight.array)[np.asarray(ids.array)[~bad]]
    )
    good = named(jnp.array([[1, 2, 3, 0, 10]]), ("batch", "position"))
    np.testing.assert_array_equal(emb(good).array, emb.weight.array[good.array])
    x = data(B, E)
    np.testing.assert_array_equal(emb.unembed(x).array, x.array @ emb.weight.array.T)


def test_embedding_errors():
    emb = na.nn.Embedding(Axis("vocab", 4), E, key=KEY)
    with pytest.raises(
        na.NamedTypeError,
        match=r"Embedding needs an integer NamedArray of ids, got NamedArray\(float32, batch=2\)",
    ):
        emb(na.ones({"batch": 2}))
    with pytest.raises(na.DuplicateAxisError, match=r"already has axis 'embed'"):
        emb(named(jnp.zeros((2, 8), jnp.int32), ("batch", "embed")))
    with pytest.raises(
        na.NamedTypeError, match=r"got a plain array of shape \(2,\)\. Pass e\.g\. named\(tokens"
    ):
        emb(jnp.zeros(2, jnp.int32))
    with pytest.raises(na.AxisNotFoundError, match=r"Embedding.unembed works over axis 'embed'"):
        emb.unembed(na.ones({"batch": 2}))
    with pytest.raises(na.NamedTypeError, match=r"Embedding Vocab must be one Axis"):
        na.nn.Embedding({"vocab": 4, "x": 2}, E, key=KEY)


# -- norms --------------------------------------------------------------------------------------


def test_layer_norm_matches_formula_and_keeps_layout():
    ln = na.nn.LayerNorm(E, eps=1e-5)
    ln = eqx.tree_at(lambda m: (m.weight, m.bias), ln, (data(E, key=2), data(E, key=3)))
    x = data(E, B, T)  # normalized axis first: the layout must not change
    y = ln(x)
    assert y.axis_names == ("embed", "batch", "position")
    a = x.array
    mu = a.mean(0, keepdims=True)
    var = ((a - mu) ** 2).mean(0, keepdims=True)
    ref = (a - mu) / jnp.sqrt(var + 1e-5) * ln.weight.array[:, None, None] + ln.bias.array[
        :, None, None
    ]
    close(y.array, ref)
    plain = na.nn.LayerNorm(E, use_weight=False, use_bias=False)
    assert plain.weight is None and plain.bias is None
    close(plain(x).array, (a - mu) / jnp.sqrt(var + 1e-5))


def test_parameters_are_not_weakly_typed():
    """A weakly typed parameter comes back strongly typed from an update, and jit retraces (and
    recompiles) the second step: every layer's parameters are created strongly typed."""
    layers = [
        na.nn.RmsNorm(E),
        na.nn.RmsNorm(E, weight_offset=1.0),
        na.nn.LayerNorm(E),
        na.nn.Linear(E, {"mlp": 8}, key=KEY),
        na.nn.Embedding({"vocab": 8}, E, key=KEY),
    ]
    weak = [
        (type(layer).__name__, path)
        for layer in layers
        for path, leaf in jax.tree_util.tree_leaves_with_path(layer)
        if leaf.weak_type
    ]
    assert weak == []
    assert na.nn.RmsNorm(E).weight.dtype == jnp.float32


def test_rms_norm_matches_formula_over_two_axes():
    H, D = Axis("heads", 2), Axis("head_dim", 4)
    norm = na.nn.RmsNorm((H, D), eps=1e-6, use_bias=True)
    norm = eqx.tree_at(lambda m: (m.weight, m.bias), norm, (data(H, D, key=2), data(H, D, key=3)))
    x = data(B, H, T, D)
    a = x.array
    ref = a / jnp.sqrt((a * a).mean((1, 3), keepdims=True) + 1e-6)
    ref = ref * norm.weight.array[None, :, None, :] + norm.bias.array[None, :, None, :]
    y = norm(x)
    assert y.axis_names == x.axis_names
    close(y.array, ref)
    with pytest.raises(na.AxisNotFoundError, match=r"RmsNorm works over axis 'heads'"):
        norm(na.ones({"head_dim": 4}))


# -- Dropout ------------------------------------------------------------------------------------


def test_dropout_matches_bernoulli_mask():
    x = data(B, T, E)
    k = jax.random.key(7)
    y = na.nn.Dropout(0.25)(x, key=k)
    keep = jax.random.bernoulli(k, 0.75, (2, 8, 5)).transpose(
        0, 2, 1
    )  # drawn (batch, embed, position)
    close(y.array, jnp.where(keep, x.array / 0.75, 0.0))
    # One mask shared along `position`.
    y = na.nn.Dropout(0.25, broadcast_axes="position")(x, key=k)
    keep = jax.random.bernoulli(k, 0.75, (2, 8))[:, None, :]
    assert y.axis_names == x.axis_names
    close(y.array, jnp.where(keep, x.array / 0.75, 0.0))


def test_dropout_mask_follows_names_not_layout():
    x = data(B, T, E)
    drop, k = na.nn.Dropout(0.5), jax.random.key(0)
    y = drop(x, key=k)
    for order in (("embed", "batch", "position"), ("position", "embed", "batch")):
        y2 = drop(x.rearrange(order), key=k)
        assert y2.axis_names == order
        np.testing.assert_array_equal(y2.rearrange(y.axis_names).array, y.array)


def test_dropout_inference_and_errors():
    x = data(B, E)
    drop = na.nn.Dropout(0.5)
    assert drop(x, inference=True) is x
    assert eqx.nn.inference_mode(drop)(x) is x
    assert na.nn.Dropout(0.0)(x) is x
    with pytest.raises(na.NamedTypeError, match=r"Dropout needs key= when training"):
        drop(x)
    with pytest.raises(na.LayerError, match=r"Dropout rate must be a number in \[0, 1\), got 1.0"):
        na.nn.Dropout(1.0)
    with pytest.raises(na.AxisNotFoundError, match=r"'position' not found"):
        na.nn.Dropout(0.5, broadcast_axes="position")(x, key=KEY)


# -- MLP ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("gated", [False, True])
def test_mlp_matches_plain(gated):
    mlp = na.nn.MLP(E, {"mlp": 16}, key=KEY, gated=gated, activation=na.silu if gated else na.gelu)
    x = data(B, T, E)

    def lin(m, a):
        return jnp.einsum("bti,io->bto", a, m.weight.array) + m.bias.array[None, None]

    @eqx.filter_jit
    def run(mlp, x):
        up = lin(mlp.up, x.array)
        h = jax.nn.silu(lin(mlp.gate, x.array)) * up if gated else jax.nn.gelu(up)
        return mlp(x), lin(mlp.down, h)

    y, ref = run(mlp, x)
    assert y.axis_names == ("batch", "position", "embed")
    close(y.array, ref)


# -- attention ----------------------------------------------------------------------------------


def plain_attention(q, k, v, mask):
    """q (b, t, n, d), k/v (b, s, m, d) with n a multiple of m; mask broadcastable to (b, n, t, s)."""
    b, t, n, d = q.shape
    m = k.shape[2]
    q = q.reshape(b, t, m, n // m, d) * d**-0.5
    s = jnp.einsum("btmgd,bsmd->bmgts", q, k).reshape(b, n, t, -1)
    s = jnp.where(mask, s, jnp.finfo(s.dtype).min)
    w = jax.nn.softmax(s, axis=-1).reshape(b, m, n // m, t, -1)
    return jnp.einsum("bmgts,bsmd->btmgd", w, v).reshape(b, t, n, d)


def test_dot_product_attention_causal_and_padding_vs_jax():
    H, D, S = Axis("heads", 3), Axis("head_dim", 4), Axis("key_position", 5)
    q, k, v = data(B, T, H, D, key=1), data(B, S, H, D, key=2), data(B, S, H, D, key=3)
    lengths = jnp.array([5, 3])
    padding = named(jnp.arange(5)[None, :] < lengths[:, None], (B, S))
    mask = na.nn.causal_mask(T, S) & padding

    @jax.jit
    def run(q, k, v, mask):
        out = na.nn.dot_product_attention(q, k, v, mask=mask)
        ref = jax.nn.dot_product_attention(
            q.array, k.array, v.array, is_causal=True, key_value_seq_lengths=lengths
        )
        plain_mask = mask.rearrange(("batch", "position", "key_position")).array[:, None]
        return out, ref, plain_attention(q.array, k.array, v.array, plain_mask)

    out, ref, ref2 = run(q, k, v, mask)
    assert out.axis_names == ("batch", "position", "heads", "head_dim")
    close(out.array, ref)
    close(out.array, ref2)


def test_grouped_query_attention_matches_repeated_kv_heads():
    KV, G, D, S = (
        Axis("kv_heads", 2),
        Axis("q_per_kv", 3),
        Axis("head_dim", 4),
        Axis("key_position", 5),
    )
    q, k, v = data(B, T, KV, G, D, key=1), data(B, S, KV, D, key=2), data(B, S, KV, D, key=3)

    @jax.jit
    def run(q, k, v):
        out = na.nn.dot_product_attention(q, k, v, mask=na.nn.causal_mask(T, S))
        ref = jax.nn.dot_product_attention(
            q.array.reshape(2, 5, 6, 4), k.array, v.array, is_causal=True
        )
        return out, ref

    out, ref = run(q, k, v)
    assert out.axis_names == ("batch", "position", "kv_heads", "q_per_kv", "head_dim")
    close(out.array.reshape(2, 5, 6, 4), ref)


def test_causal_mask_with_longer_keys():
    m = na.nn.causal_mask(Axis("position", 2), Axis("key_position", 4))
    np.testing.assert_array_equal(m.array, [[1, 1, 1, 0], [1, 1, 1, 1]])
    assert m.axis_names == ("position", "key_position")


def test_dot_product_attention_errors():
    q = na.ones({"position": 3, "head_dim": 4})
    k = na.ones({"key_position": 3, "head_dim": 4})
    with pytest.raises(
        na.DuplicateAxisError,
        match=r"already has axis 'key_position', which names the key positions",
    ):
        na.nn.dot_product_attention(k, k, k)
    with pytest.raises(na.AxisNotFoundError, match=r"'key_position' not found"):
        na.nn.dot_product_attention(q, q, q)
    with pytest.raises(
        na.AxisNotFoundError, match=r"mask NamedArray\(batch=2\) has axis 'batch' that the scores"
    ):
        na.nn.dot_product_attention(q, k, k, mask=named(jnp.ones(2, bool), "batch"))
    with pytest.raises(na.NamedTypeError, match=r"mask must be a boolean NamedArray"):
        na.nn.dot_product_attention(q, k, k, mask=na.ones({"position": 3}))
    with pytest.raises(na.AxisSizeError, match=r"needs axis 'key_position' of size 3"):
        na.nn.dot_product_attention(q, k, na.ones({"key_position": 2, "head_dim": 4}))


def rope_oracle(x, positions, inv_freq, factor=1.0):
    """RoPE as complex rotations: feature i and i + d/2 are the real and imaginary parts of one
    number, multiplied by exp(1j * position * inv_freq[i]) (x: (..., t, heads, d); positions (t,))."""
    d = x.shape[-1]
    z = x[..., : d // 2] + 1j * x[..., d // 2 :]
    angles = np.asarray(positions, np.float64)[:, None] * np.asarray(inv_freq, np.float64)
    z = z * np.exp(1j * angles)[:, None, :] * factor
    return np.concatenate([z.real, z.imag], axis=-1)


def attention_oracle(attn, x, pad=None, positions=None):
    """The Attention layer in plain JAX on (b, t, e) arrays with the layer's own parameters:
    keys/values repeated per query head (head h uses key/value head h // group)."""

    def proj(lin, a, spec):
        y = jnp.einsum(spec, a, lin.weight.array)
        return y if lin.bias is None else y + jnp.broadcast_to(lin.bias.array, y.shape)

    def rms(norm, a):
        axes = tuple(range(a.ndim - len(norm.axis), a.ndim))
        w = jnp.broadcast_to(norm.weight.array, a.shape)
        return a / jnp.sqrt((a * a).mean(axes, keepdims=True) + norm.eps) * w

    b, t, _ = x.shape
    q = proj(attn.q_proj, x, "bte,end->btnd")
    k = proj(attn.k_proj, x, "bte,emd->btmd")
    v = proj(attn.v_proj, x, "bte,emd->btmd")
    if attn.q_norm is not None:
        q, k = rms(attn.q_norm, q), rms(attn.k_norm, k)
    if attn.rotary is not None:
        inv = np.asarray(attn.rotary.inverse_frequencies())
        pos = np.arange(t) if positions is None else positions
        q = jnp.asarray(rope_oracle(np.asarray(q), pos, inv), jnp.float32)
        k = jnp.asarray(rope_oracle(np.asarray(k), pos, inv), jnp.float32)
    group = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
    i, j = jnp.arange(t)[:, None], jnp.arange(t)[None, :]
    mask = (j <= i)[None, None]
    if attn.sliding_window is not None:
        mask = mask & (i - j < attn.sliding_window)[None, None]
    if pad is not None:
        mask = mask & pad[:, None, None, :]
    scale = q.shape[-1] ** -0.5 if attn.scale is None else attn.scale
    s = jnp.einsum("btnd,bsnd->bnts", q * scale, k)
    w = jax.nn.softmax(jnp.where(mask, s, jnp.finfo(s.dtype).min), axis=-1)
    o = jnp.einsum("bnts,bsnd->btnd", w, v)
    return proj(attn.o_proj, o, "btnd,nde->bte")


H4, KV2, D4 = Axis("heads", 4), Axis("kv_heads", 2), Axis("head_dim", 4)
ATTENTION_KINDS = {
    "mha": dict(),
    "gqa_head_norm_bias": dict(KVHeads=KV2, qk_norm=True, use_bias=True),
    "gqa_projection_norm_rope_window": dict(
        KVHeads=KV2,
        qk_norm="projection",
        use_bias=True,
        out_bias=False,
        sliding_window=2,
        rotary=na.nn.RotaryEmbedding(D4, theta=100.0),
        scale=0.3,
    ),
    "mqa_rope": dict(KVHeads=Axis("kv_heads", 1), rotary=na.nn.RotaryEmbedding(D4)),
}


@pytest.mark.parametrize(
    "kind, padding",
    [*((k, "key_mask") for k in ATTENTION_KINDS), ("gqa_projection_norm_rope_window", "mask")],
)
def test_attention_layer_matches_plain(kind, padding):
    """Every option against the plain oracle, left padding as key_mask= (or as a general mask=),
    compared at the real query positions (a query that sees no key is unspecified)."""
    kw = ATTENTION_KINDS[kind]
    attn = na.nn.Attention(E, H4, D4, key=KEY, **kw)
    kv = kw.get("KVHeads", H4).name
    assert attn.q_proj.weight.axis_names == ("embed", "heads", "head_dim")
    assert attn.o_proj.weight.axis_names == ("heads", "head_dim", "embed")
    assert attn.k_proj.weight.axis_names == ("embed", kv, "head_dim")
    assert (attn.o_proj.bias is None) == (not kw.get("use_bias") or kw.get("out_bias") is False)
    if kw.get("qk_norm") == "projection":
        assert attn.q_norm.weight.axis_names == ("heads", "head_dim")
        assert attn.k_norm.weight.axis_names == (kv, "head_dim")
    elif kw.get("qk_norm"):
        assert attn.q_norm.weight.axis_names == ("head_dim",)
    # Non-trivial norm weights and biases, so that a skipped one changes the output.
    attn = jax.tree.map(
        lambda a: (
            a + 0.3 * na.random.normal(jax.random.key(a.size), a.axes)
            if a.ndim <= 2 and a.size < 64
            else a
        ),
        attn,
        is_leaf=lambda a: isinstance(a, na.NamedArray),
    )
    x = data(B, T, E)
    pad = jnp.arange(5)[None, :] >= jnp.array([[0], [2]])
    run = eqx.filter_jit(
        lambda attn, x, pad: attn(x, **{padding: named(pad, (B.name, "key_position"))})
    )
    y = run(attn, x, pad)
    assert y.axis_names == ("batch", "position", "embed")
    real = pad[:, :, None]
    close(
        jnp.where(real, y.array, 0.0),
        jnp.where(real, attention_oracle(attn, x.array, pad), 0.0),
        tol=1e-4,
    )


def test_attention_positions_per_row():
    """Position ids per batch row: each row matches the oracle at its own positions."""
    attn = na.nn.Attention(E, H4, D4, KVHeads=KV2, key=KEY, rotary=na.nn.RotaryEmbedding(D4))
    x = data(B, T, E)
    rows = np.array([[0, 1, 2, 3, 4], [0, 2, 4, 6, 8]])
    y = eqx.filter_jit(lambda a, x, p: a(x, positions=p))(attn, x, named(rows, (B, T)))
    for r in range(2):
        want = attention_oracle(attn, x.array[r : r + 1], positions=rows[r])
        close(y.array[r : r + 1], want, tol=1e-4)
    y0 = eqx.filter_jit(lambda a, x: a(x))(attn, x)
    close(y0.array[0], y.array[0], tol=1e-5)
    assert not np.allclose(y0.array[1], y.array[1], atol=1e-3)


def test_grouped_query_heads_use_kv_head_h_over_group():
    """Query head h attends with key/value head h // (heads / kv_heads), as jax.nn does."""
    attn = na.nn.Attention(E, H4, D4, KVHeads=KV2, key=KEY, causal=False)
    x = data(B, T, E)

    @eqx.filter_jit
    def run(attn, x):
        q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
        plain = jax.nn.dot_product_attention(
            q.rearrange(("batch", "position", "heads", "head_dim")).array,
            k.rearrange(("batch", "position", "kv_heads", "head_dim")).array,
            v.rearrange(("batch", "position", "kv_heads", "head_dim")).array,
        )
        out = attn.o_proj(named(plain, ("batch", "position", "heads", "head_dim")))
        return attn(x), out

    y, ref = run(attn, x)
    close(y.array, ref.array, tol=1e-5)


def test_attention_errors():
    with pytest.raises(na.AxisSizeError, match=r"KVHeads kv_heads=3 must divide Heads heads=4"):
        na.nn.Attention(
            E, Axis("heads", 4), Axis("head_dim", 2), KVHeads=Axis("kv_heads", 3), key=KEY
        )
    with pytest.raises(na.LayerError, match=r"KVHeads and Heads are both named 'heads'"):
        na.nn.Attention(E, H4, D4, KVHeads=Axis("heads", 2), key=KEY)
    with pytest.raises(na.LayerError, match=r"qk_norm must be one of .*, got 'rms'"):
        na.nn.Attention(E, H4, D4, qk_norm="rms", key=KEY)
    with pytest.raises(na.LayerError, match=r"sliding_window must be a positive number"):
        na.nn.Attention(E, H4, D4, sliding_window=0, key=KEY)
    with pytest.raises(na.LayerError, match=r"sliding_window=2 is a causal window .* causal=True"):
        na.nn.Attention(E, H4, D4, sliding_window=2, causal=False, key=KEY)
    with pytest.raises(na.LayerError, match=r"rotary must be a RotaryEmbedding over Axis"):
        na.nn.Attention(E, H4, D4, rotary=na.nn.RotaryEmbedding(Axis("head_dim", 2)), key=KEY)
    with pytest.raises(na.NamedTypeError, match=r"Attention Heads must be an Axis, got 4"):
        na.nn.Attention(E, 4, Axis("head_dim", 2), key=KEY)
    attn = na.nn.Attention(E, Axis("heads", 2), Axis("head_dim", 2), key=KEY)
    with pytest.raises(na.AxisNotFoundError, match=r"'position' not found"):
        attn(na.ones({"batch": 2, "seq": 3, "embed": 8}))


def test_kv_cache_key_mask_must_mark_the_new_keys():
    """A key_mask written into the cache is checked against the new keys: 3 marks for 4 keys left
    key 3 never attended, 6 marked unwritten slots real, 0.5 became True, 'position' failed
    inside updated_slice()."""
    heads, head_dim = Axis("heads", 2), Axis("head_dim", 4)
    attn = na.nn.Attention(E, heads, head_dim, key=KEY)
    cache = na.nn.KVCache.zeros({"batch": 1}, heads, head_dim, 6)
    x = data(Axis("batch", 1), Axis("position", 4), E)
    mask = lambda *a: named(jnp.ones([1] * (len(a) - 1) + [4], bool), a)
    where = r"KVCache.update \(Attention's key_mask with cache=\): key_mask "
    for n in (3, 6):
        with pytest.raises(
            na.AxisSizeError,
            match=where + rf"NamedArray\(batch=1, key_position={n}\) has key_position={n}, but "
            r"the 4 new keys need key_position=4",
        ):
            attn(x, cache=cache, key_mask=named(jnp.ones((1, n), bool), ("batch", "key_position")))
    with pytest.raises(na.AxisSizeError, match=r"has batch=2, but the 4 new keys need batch=1"):
        attn(x, cache=cache, key_mask=named(jnp.ones((2, 4), bool), ("batch", "key_position")))
    with pytest.raises(
        na.NamedTypeError,
        match=where + r"must be a boolean NamedArray\(batch=1, key_position=4\), True at the new "
        r"real keys, got NamedArray\(float32, key_position=4\)",
    ):
        attn(x, cache=cache, key_mask=named(jnp.array([1.0, 0.5, 1, 1]), "key_position"))
    with pytest.raises(
        na.AxisNotFoundError,
        match=where + r"NamedArray\(batch=1, position=4\) must mark the 4 new keys over "
        r"\(batch=1, key_position=4\).* Rename or drop 'position'",
    ):
        attn(x, cache=cache, key_mask=mask("batch", "position"))
    with pytest.raises(na.NamedTypeError, match=r"got a plain array of shape \(4,\)"):
        cache.update(*[cache.read()[0]["key_position", :4]] * 2, jnp.ones(4, bool))
    # A mask without the batch axes is the same for every row.
    real = named(jnp.array([True, False, True, True]), "key_position")
    _, out = attn(x, cache=cache, key_mask=real)
    assert out.mask.array.tolist() == [[True, False, True, True, False, False]]
    assert out.index == 4


# -- Stacked ------------------------------------------------------------------------------------


class Block(eqx.Module):
    norm: na.nn.RmsNorm
    mlp: na.nn.MLP
    drop: na.nn.Dropout

    def __init__(self, key):
        self.norm = na.nn.RmsNorm(E)
        self.mlp = na.nn.MLP(E, {"mlp": 16}, key=key)
        self.drop = na.nn.Dropout(0.5)

    def __call__(self, x, scale, key=None):
        h = self.drop(self.mlp(self.norm(x)), key=key, inference=key is None)
        return na.rearrange(x + h * scale, ("embed", ...))  # a layout change the stack undoes


def test_stacked_init_uses_one_key_per_layer_and_folds_in_order():
    L = Axis("layer", 3)
    stack = na.nn.Stacked(L, Block, key=KEY)
    assert stack.stacked.mlp.up.weight.axis_names == ("layer", "embed", "mlp")
    layers = stack.unstacked()
    for layer, k in zip(layers, jax.random.split(KEY, 3)):
        close(layer.mlp.up.weight.array, Block(k).mlp.up.weight.array, tol=0)
    x = data(B, T, E)
    scale = named(jnp.array(0.5), ())

    @eqx.filter_jit
    def run(stack, x, scale, key):
        ref, ref_keyed = x, x
        for layer, k in zip(stack.unstacked(), jax.random.split(key, 3)):
            ref = layer(ref, scale).rearrange(x.axis_names)
            ref_keyed = layer(ref_keyed, scale, key=k).rearrange(x.axis_names)
        # With a key, the stack splits it into one key per layer.
        return stack(x, scale), ref, stack(x, scale, key=key), ref_keyed

    y, ref, y_keyed, ref_keyed = run(stack, x, scale, jax.random.key(5))
    assert y.axis_names == x.axis_names
    close(y.array, ref.array)
    close(y_keyed.array, ref_keyed.array)


def test_stacked_checkpointing_gives_the_same_gradients_and_scan_stacks_outputs():
    L = Axis("layer", 2)
    x = data(B, E)

    def loss(stack):
        return na.sum(stack(x, 1.0) ** 2).scalar()

    plain = na.nn.Stacked(L, Block, key=KEY)
    remat = na.nn.Stacked(L, Block, key=KEY, gradient_checkpointing=True)
    g1, g2 = (
        eqx.filter_jit(eqx.filter_grad(loss))(plain),
        eqx.filter_jit(eqx.filter_grad(loss))(remat),
    )
    close(g1.stacked.mlp.up.weight.array, g2.stacked.mlp.up.weight.array)
    assert "remat" in str(jax.make_jaxpr(loss)(remat))
    assert "remat" not in str(jax.make_jaxpr(loss)(plain))

    class Tap(eqx.Module):
        w: na.NamedArray

        def __call__(self, h):
            h = h * self.w
            return h, h.sum("embed")

    taps = na.nn.Stacked(L, lambda k: Tap(na.random.normal(k, (E,))), key=KEY)
    h, ys = eqx.filter_jit(lambda t, x: t.scan(x))(taps, x)
    w = taps.stacked.w.array[:, None, :]
    assert ys.axis_names == ("layer", "batch")
    close(ys.array, jnp.stack([(x.array * w[0]).sum(-1), (x.array * w[0] * w[1]).sum(-1)]))
    close(h.array, x.array * w[0] * w[1])
    with pytest.raises(na.NamedTypeError, match=r"Stacked.scan needs layers that return \(x, y\)"):
        plain.scan(x, 1.0)
    with pytest.raises(na.NamedTypeError, match=r"Stacked needs an Axis for Layer"):
        na.nn.Stacked(3, Block, key=KEY)


class Residual(eqx.Module):
    norm: na.nn.RmsNorm
    mlp: na.nn.MLP

    def __init__(self, key):
        self.norm, self.mlp = na.nn.RmsNorm(E), na.nn.MLP(E, {"mlp": 16}, key=key)

    def __call__(self, x):
        return x + self.mlp(self.norm(x))


# What each policy keeps from the scan over 3 layers, (batch=2, embed=8) carries, mlp=16.
SCAN_RESIDUALS = {
    "dots": ["f32[3,2,16]", "f32[3,2,8]"],  # the up and down projections' outputs
    "carry": ["f32[3,2,8]"],  # each layer's input
    "offload": ["f32<host>[3,2,8]"],  # the same, in host memory
    "full": [],  # nothing: only the stack's input is kept
}


def _remat_loss(stack, x):
    return na.sum(stack(x) ** 2).scalar()


@functools.cache
def _remat_grads(policy):
    stack = na.nn.Stacked(Axis("layer", 3), Residual, key=KEY, gradient_checkpointing=policy)
    return stack, jax.jit(jax.grad(_remat_loss, argnums=(0, 1)))(stack, data(B, E))


@pytest.mark.parametrize("policy", ["none", *SCAN_RESIDUALS])
def test_stacked_remat_policies_give_the_same_gradients_and_keep_what_they_say(policy, capsys):
    x = data(B, E)
    stack, got = _remat_grads(policy)
    _, want = _remat_grads(False)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        close(a, b, tol=1e-6)
    capsys.readouterr()
    jax.ad_checkpoint.print_saved_residuals(_remat_loss, stack, x)
    lines = capsys.readouterr().out.splitlines()
    from_scan = [line.split()[0] for line in lines if "output of scan" in line]
    if policy == "none":
        assert len(from_scan) > 6  # every intermediate of every layer
    else:
        assert from_scan == SCAN_RESIDUALS[policy]
    assert any("from the argument x" in line for line in lines) == (policy == "full")


def test_stacked_remat_policy_errors():
    with pytest.raises(
        na.NamedTypeError,
        match=r"Stacked\(\): gradient_checkpointing='dots_only' is not one of 'none', 'dots', "
        r"'carry', 'offload', 'full' or a jax.checkpoint_policies policy",
    ):
        na.nn.Stacked(Axis("layer", 2), Residual, key=KEY, gradient_checkpointing="dots_only")
    stack = na.nn.Stacked(
        Axis("layer", 2), Residual, key=KEY, gradient_checkpointing="dots_saveable"
    )
    assert stack(data(B, E)).axes == (B, E)
    # A policy builder passed uncalled failed inside jax.grad with a TypeError.
    with pytest.raises(
        na.NamedTypeError,
        match=r"Stacked\(\): gradient_checkpointing=<function save_only_these_names .*> is not a "
        r"checkpoint policy .* call it and pass the result, e.g. gradient_checkpointing="
        r"jax.checkpoint_policies.save_only_these_names\(\.\.\.\)",
    ):
        stack.with_pipeline(gradient_checkpointing=jax.checkpoint_policies.save_only_these_names)


# -- losses -------------------------------------------------------------------------------------


def test_one_hot():
    ids = named(jnp.array([[0, 3], [2, 1]]), (B, Axis("position", 2)))
    oh = na.nn.one_hot(ids, Axis("vocab", 4))
    assert oh.axis_names == ("batch", "position", "vocab")
    np.testing.assert_array_equal(oh.array, jax.nn.one_hot(ids.array, 4))
    with pytest.raises(na.NamedTypeError, match=r"one_hot needs an integer NamedArray"):
        na.nn.one_hot(na.ones({"batch": 2}), Axis("vocab", 4))
    with pytest.raises(na.DuplicateAxisError, match=r"already has axis 'batch'"):
        na.nn.one_hot(ids, Axis("batch", 4))


def test_cross_entropy_integer_and_soft_targets_with_padding():
    V = Axis("vocab", 7)
    logits = data(B, T, V)
    ids = na.random.randint(jax.random.key(3), (B, T), 0, 7)
    logp = jax.nn.log_softmax(logits.array, -1)
    nll = -jnp.take_along_axis(logp, ids.array[..., None], -1)[..., 0]
    close(na.nn.cross_entropy(logits, "vocab", ids).scalar(), nll.mean())
    close(na.nn.cross_entropy(logits, "vocab", ids, reduction="sum").scalar(), nll.sum())
    per = na.nn.cross_entropy(logits, "vocab", ids, reduction=None)
    assert per.axis_names == ("batch", "position")
    close(per.array, nll)
    pad = named(jnp.arange(5)[None, :] < jnp.array([[5], [2]]), (B, T))
    close(na.nn.cross_entropy(logits, "vocab", ids, where=pad).scalar(), nll[pad.array].mean())
    close(
        na.nn.cross_entropy(logits, "vocab", ids, where=pad, reduction=None).array,
        jnp.where(pad.array, nll, 0.0),
    )
    late = named(jnp.arange(5) >= 2, T)  # a mask over `position` only counts every batch row
    close(na.nn.cross_entropy(logits, "vocab", ids, where=late).scalar(), nll[:, 2:].mean())
    none = named(jnp.zeros((2, 5), bool), (B, T))
    assert na.nn.cross_entropy(logits, "vocab", ids, where=none).item() == 0.0
    soft = na.nn.one_hot(ids, V)
    close(na.nn.cross_entropy(logits, "vocab", soft).scalar(), nll.mean())


def test_cross_entropy_target_entry_values_gradients_and_program():
    """Integer targets pick their class's log-probability exactly as take(log_softmax) does, values
    and gradients (targets over some of the logits' axes; small integer dtypes), and the compiled
    gradient is elementwise: no gather, no scatter."""
    V = Axis("vocab", 7)
    logits = data(B, T, V)
    rng = np.random.default_rng(4)
    cases = [
        named(jnp.asarray(rng.integers(0, 7, size=(2, 5)), jnp.int32), (B, T)),
        named(jnp.asarray(rng.integers(0, 7, size=(2, 5)), jnp.int8), (B, T)),
        named(jnp.asarray(rng.integers(0, 7, size=(5,)), jnp.uint32), (T,)),
    ]

    def ours(x, ids):
        return na.nn.cross_entropy(named(x, logits.axis_names), "vocab", ids, reduction="sum").array

    def via_take(x, ids):
        logp = na.log_softmax(named(x, logits.axis_names), "vocab")
        return -na.take(logp, "vocab", ids).array.sum()

    for ids in cases:
        v, g = jax.value_and_grad(ours)(logits.array, ids)
        v_ref, g_ref = jax.value_and_grad(via_take)(logits.array, ids)
        np.testing.assert_array_equal(v, v_ref)
        np.testing.assert_array_equal(g, g_ref)
    hlo = jax.jit(jax.grad(ours)).lower(logits.array, cases[0]).as_text()
    assert "gather" not in hlo and "scatter" not in hlo


def test_cross_entropy_targets_outside_the_classes_raise_or_read_nan():
    """A wrong target never trains toward another class (-1 is not the last one, vocab + 3 is not
    clamped to it): concrete unmasked targets outside [0, vocab) raise naming them; under jit their
    loss and their logits' gradient are NaN and every other row is the log_softmax reference's,
    value and gradient. Masked targets (the -100 ignore convention) count for nothing, whatever
    their value, eagerly and under jit."""
    V = Axis("vocab", 7)
    logits = data(B, T, V)
    ids = named(jnp.array([[1, -1, 3, 0, 6], [10, 4, 5, -100, 2]]), (B, T))
    with pytest.raises(
        na.AxisIndexError,
        match=r"cross_entropy: target id\(s\) -100, -1, 10 outside the classes: 'vocab' has 7 "
        r"entries, so ids must be in \[0, 7\) \(first at batch=0, position=1\)\. Negative ids "
        r"do not count from the end here\. Leave padding or ignore targets out of the loss with "
        r"where=, e.g\. where=targets != -100",
    ):
        na.nn.cross_entropy(logits, "vocab", ids)
    not_3 = named(jnp.arange(5) != 3, T)  # a mask over fewer axes than the targets
    with pytest.raises(na.AxisIndexError, match=r"target id\(s\) -1, 10 outside .* position=1\)"):
        na.nn.cross_entropy(logits, "vocab", ids, where=not_3)
    col = named(jnp.array([1, 2, 9, 3, 4]), T)  # targets over fewer axes than the mask
    row0 = named(jnp.array([[1, 1, 0, 1, 1], [1, 1, 1, 1, 1]], bool), (B, T))
    with pytest.raises(na.AxisIndexError, match=r"target id\(s\) 9 .* batch=1, position=2\)"):
        na.nn.cross_entropy(logits, "vocab", col, where=row0)

    logp = jax.nn.log_softmax(logits.array, -1)
    keep = ids != -100
    bad = np.array([[0, 1, 0, 0, 0], [1, 0, 0, 0, 0]], bool)
    good = ~bad & np.asarray(keep.array)

    def reference(x, ids):  # the good entries' sum over the unmasked count, from log_softmax
        picked = jnp.take_along_axis(jax.nn.log_softmax(x, -1), jnp.clip(ids, 0, 6)[..., None], -1)
        return -jnp.where(good, picked[..., 0], 0.0).sum() / 9.0

    @jax.jit
    def run(x, ids, keep):
        def mean(x):
            return na.nn.cross_entropy(named(x, logits.axis_names), "vocab", ids, where=keep).array

        per = na.nn.cross_entropy(logits, "vocab", ids, where=keep, reduction=None).array
        return per, jax.value_and_grad(mean)(x)

    per, (loss, grad) = run(logits.array, ids, keep)
    assert np.isnan(per[bad]).all() and np.isnan(loss) and np.isnan(grad[bad]).all()
    nll = -np.take_along_axis(np.asarray(logp), np.clip(ids.array, 0, 6)[..., None], -1)[..., 0]
    close(per[good], nll[good])
    assert per[1, 3] == 0.0 and (grad[1, 3] == 0.0).all()  # the masked -100
    close(grad[good], jax.grad(reference)(logits.array, ids.array)[good])
    fixed = named(jnp.where(bad, 2, ids.array), (B, T))  # no unmasked target out of range
    nll[bad] = -np.asarray(logp)[bad][:, 2]
    good = np.asarray(keep.array)
    per, (loss, grad) = run(logits.array, fixed, keep)
    close(per, np.where(good, nll, 0.0))
    close(loss, nll[good].mean())
    close(grad, jax.grad(reference)(logits.array, fixed.array))
    close(na.nn.cross_entropy(logits, "vocab", fixed, where=keep).scalar(), loss)
    mean = na.nn.cross_entropy(logits, "vocab", fixed, where=not_3).scalar()
    close(mean, nll[:, not_3.array].mean())


def test_cross_entropy_errors():
    logits = na.ones({"batch": 2, "vocab": 3})
    ids = named(jnp.zeros(2, jnp.int32), "batch")
    with pytest.raises(na.AxisNotFoundError, match=r"'vocb' not found"):
        na.nn.cross_entropy(logits, "vocb", ids)
    with pytest.raises(
        na.AxisNotFoundError, match=r"targets NamedArray\(seq=2\) has axis 'seq' that the logits"
    ):
        na.nn.cross_entropy(logits, "vocab", named(jnp.zeros(2, jnp.int32), "seq"))
    with pytest.raises(
        na.NamedTypeError, match=r"reduction must be 'mean', 'sum' or None, got 'avg'"
    ):
        na.nn.cross_entropy(logits, "vocab", ids, reduction="avg")
    with pytest.raises(na.NamedTypeError, match=r"where= must be a boolean NamedArray"):
        na.nn.cross_entropy(logits, "vocab", ids, where=na.ones({"batch": 2}))
    with pytest.raises(na.NamedTypeError, match=r"cross_entropy needs NamedArray targets"):
        na.nn.cross_entropy(logits, "vocab", jnp.zeros(2, jnp.int32))


def test_cross_entropy_checks_the_class_axis_size_and_the_kind_of_targets():
    logits = data(Axis("batch", 2), Axis("vocab", 3))
    ids = named(jnp.array([0, 2]), "batch")
    close(
        na.nn.cross_entropy(logits, Axis("vocab", 3), ids).scalar(),
        na.nn.cross_entropy(logits, "vocab", ids).scalar(),
    )
    with pytest.raises(
        na.AxisSizeError,
        match=r"Axis 'vocab' has size 3 in NamedArray\(batch=2, vocab=3\), but size 99 was asked",
    ):
        na.nn.cross_entropy(logits, Axis("vocab", 99), ids)
    with pytest.raises(
        na.NamedTypeError,
        match=r"cross_entropy targets must be integer class ids or float probabilities over "
        r"'vocab', got a boolean NamedArray\(batch=2\)\. Cast class ids to an integer dtype, "
        r"e\.g\. targets\.astype\(jnp\.int32\); a boolean mask goes in where=\.",
    ):
        na.nn.cross_entropy(logits, "vocab", ids > 0)
    soft = na.nn.one_hot(ids, Axis("vocab", 5))
    with pytest.raises(
        na.AxisSizeError,
        match=r"cross_entropy: float targets are probabilities over the class axis 'vocab' of "
        r"size 3 \(the logits'\), but targets NamedArray\(batch=2, vocab=5\) have it of size 5\. "
        r"Pass integer class ids, or probabilities over Axis\('vocab', 3\), e\.g\. "
        r"one_hot\(ids, Axis\('vocab', 3\)\)\.",
    ):
        na.nn.cross_entropy(logits, "vocab", soft)
    with pytest.raises(
        na.AxisNotFoundError,
        match=r"targets NamedArray\(batch=2\) lack it\. Pass integer class ids",
    ):
        na.nn.cross_entropy(logits, "vocab", ids.astype(jnp.float32))


# -- RotaryEmbedding, RopeScaling, Gemma's norm, activations by name -----------------------------


def test_rotary_embedding_is_a_complex_rotation():
    """rope(x) against the complex-number form: features i and i + d/2 rotate by position * f_i."""
    D = Axis("head_dim", 8)
    rope = na.nn.RotaryEmbedding(D, theta=50.0)
    x = data(Axis("position", 5), Axis("heads", 3), D)
    pos = na.arange(Axis("position", 5), start=2)
    y = rope(x, pos)
    assert y.axis_names == ("position", "heads", "head_dim") and y.dtype == x.dtype
    inv = 50.0 ** -(np.arange(0, 8, 2) / 8)
    close(y.array, rope_oracle(np.asarray(x.array), np.arange(2, 7), inv))
    # axes in another order and a batch of position rows: the same rotation, by name
    xt = x.rearrange(("head_dim", "heads", "position"))
    yt = rope(xt, pos.broadcast_axis(Axis("batch", 2)))
    assert yt.axis_names == ("head_dim", "heads", "position", "batch")  # x's axes, then new ones
    close(yt.rearrange(("batch", "position", "heads", "head_dim")).array[1], y.array)


def test_rotary_embedding_with_head_dim_split_finer_than_its_halves(mesh_2x4):
    """head_dim=4 over model=4: the halves (2) do not divide into 4 shards; Auto gathers, and
    Explicit raised JAX's ShardingTypeError from the slice. Both rotate as unsharded, and the
    result keeps x's placement."""
    from jax.sharding import PartitionSpec as P

    D = Axis("head_dim", 4)
    rope = na.nn.RotaryEmbedding(D)
    x = data(Axis("batch", 2), Axis("position", 4), D)
    pos = na.arange(Axis("position", 4))
    mapping = {"batch": "data", "head_dim": "model"}
    with jax.set_mesh(mesh_2x4):
        y = na.named_jit(rope, axis_resources=mapping)(na.shard(x, mapping), pos)
    close(y.array, rope(x, pos).array)
    assert y.sharding.spec == P("data", None, "model")


def test_rope_scaling_frequencies():
    D = Axis("head_dim", 16)
    default = np.asarray(na.nn.RotaryEmbedding(D).inverse_frequencies())
    close(default, 10000.0 ** -(np.arange(0, 16, 2) / 16))

    def inv(kind, max_position=None, **kw):
        rope = na.nn.RotaryEmbedding(D, scaling=na.nn.RopeScaling(kind, **kw))
        return np.asarray(rope.inverse_frequencies(max_position)), rope.attention_factor

    close(inv("linear", factor=4.0)[0], default / 4)
    # dynamic: unchanged within the original context, a larger base beyond it
    close(inv("dynamic", 15, factor=2.0, original_max_position_embeddings=16)[0], default)
    grown = 10000.0 * (2.0 * 32 / 16 - 1) ** (16 / 14)
    close(
        inv("dynamic", 31, factor=2.0, original_max_position_embeddings=16)[0],
        grown ** -(np.arange(0, 16, 2) / 16),
    )
    # llama3: short wavelengths kept, long ones divided by the factor
    f, _ = inv("llama3", factor=8.0, original_max_position_embeddings=32, high_freq_factor=4.0)
    wavelen = 2 * np.pi / default
    close(f[wavelen < 8], default[wavelen < 8])
    close(f[wavelen > 32], default[wavelen > 32] / 8)
    assert np.all((f <= default + 1e-9) & (f >= default / 8 - 1e-9))
    # yarn: the same bounds, and cos/sin scaled by 0.1 ln(factor) + 1
    f, factor = inv("yarn", factor=4.0, original_max_position_embeddings=32)
    assert factor == pytest.approx(0.1 * np.log(4.0) + 1)
    close(f[0], default[0])
    close(f[-1], default[-1] / 4)


def test_rope_scaling_errors():
    with pytest.raises(na.LayerError, match=r"kind 'longrope' is not supported. Supported kinds"):
        na.nn.RopeScaling("longrope", factor=2.0)
    with pytest.raises(na.LayerError, match=r"'yarn' needs original_max_position_embeddings"):
        na.nn.RopeScaling("yarn", factor=2.0)
    with pytest.raises(na.LayerError, match=r"head_dim=3 must be even"):
        na.nn.RotaryEmbedding(Axis("head_dim", 3))
    rope = na.nn.RotaryEmbedding(Axis("head_dim", 4))
    with pytest.raises(na.NamedTypeError, match=r"positions as an integer NamedArray"):
        rope(na.ones({"position": 2, "head_dim": 4}), na.ones({"position": 2}))


def test_rotary_theta_and_norm_eps_must_be_finite_and_in_range():
    for theta in (0.0, 1.0, -1.0, float("nan"), float("inf"), "1e4", True):
        with pytest.raises(
            na.LayerError,
            match=rf"RotaryEmbedding theta must be a finite number > 1 \(the base of the "
            rf"frequencies, e.g. 10000.0\), got {re.escape(repr(theta))}\.",
        ):
            na.nn.RotaryEmbedding(Axis("head_dim", 4), theta=theta)
    for norm in (na.nn.LayerNorm, na.nn.RmsNorm):
        for eps in (-1.0, float("nan"), float("inf"), None):
            with pytest.raises(
                na.LayerError,
                match=rf"{norm.__name__} eps must be a finite number >= 0 \(added under the "
                rf"square root\), got {re.escape(repr(eps))}\.",
            ):
                norm(E, eps=eps)
        assert norm(E, eps=0).eps == 0.0
    with pytest.raises(na.LayerError, match=r"RmsNorm eps must be a finite number >= 0"):
        na.nn.Attention(E, H4, D4, key=KEY, qk_norm=True, norm_eps=-1e-6)


def test_rms_norm_weight_offset_scales_by_one_plus_weight():
    norm = na.nn.RmsNorm(E, eps=1e-6, weight_offset=1.0)
    assert np.all(np.asarray(norm.weight.array) == 0.0)
    w = data(E, key=4)
    norm = eqx.tree_at(lambda n: n.weight, norm, w)
    x = data(B, E, key=5)
    a = np.asarray(x.array)
    want = a / np.sqrt((a * a).mean(-1, keepdims=True) + 1e-6) * (1 + np.asarray(w.array))
    close(norm(x).array, want)


def test_activations_by_name():
    x = data(B, E)
    a = np.asarray(x.array, np.float64)
    erf = np.vectorize(__import__("math").erf)
    close(na.nn.activation("gelu")(x).array, 0.5 * a * (1 + erf(a / np.sqrt(2))))
    tanh = 0.5 * a * (1 + np.tanh(np.sqrt(2 / np.pi) * (a + 0.044715 * a**3)))
    for name in ("gelu_new", "gelu_pytorch_tanh"):
        close(na.nn.activation(name)(x).array, tanh)
    close(na.nn.activation("silu")(x).array, a / (1 + np.exp(-a)))
    mlp = na.nn.MLP(E, Axis("mlp", 4), key=KEY, activation="gelu_pytorch_tanh", gated=True)
    assert mlp.activation is na.nn.activation("gelu_new")
    with pytest.raises(na.LayerError, match=r"Unknown activation 'gelu_tanh'. Known: gelu, "):
        na.nn.activation("gelu_tanh")


# -- inputs and settings the layers refuse --------------------------------------------------------


def test_norms_rope_and_cross_entropy_refuse_integer_inputs():
    """An integer input was normalized or rotated and cast back to its integer dtype (LayerNorm of
    arange(4) gave [-1, 0, 0, 1]); integer logits are no scores. All refused, naming the fix."""
    ints = named(jnp.arange(8).reshape(2, 4), ("batch", "embed"))
    for layer in (na.nn.LayerNorm({"embed": 4}), na.nn.RmsNorm({"embed": 4})):
        with pytest.raises(
            na.NamedTypeError,
            match=rf"^{type(layer).__name__} needs a floating `x`, got NamedArray\(int32, "
            r"batch=2, embed=4\)\. Cast it first, e\.g\. x\.astype\(jnp\.float32\)\.$",
        ):
            layer(ints)
        close(layer(ints.astype(jnp.float32)).array, layer(ints.astype(jnp.float32)).array)
    rope = na.nn.RotaryEmbedding(Axis("embed", 4))
    with pytest.raises(na.NamedTypeError, match=r"^RotaryEmbedding needs a floating `x`, got "):
        rope(ints, na.arange(Axis("batch", 2)))
    with pytest.raises(
        na.NamedTypeError,
        match=r"^cross_entropy needs a floating `logits`, got NamedArray\(int32, batch=2, "
        r"embed=4\)\. Cast it first, e\.g\. logits\.astype\(jnp\.float32\)\.$",
    ):
        na.nn.cross_entropy(ints, "embed", named(jnp.array([0, 1]), "batch"))


def test_soft_targets_ignore_masked_classes_like_integer_targets():
    """A class whose logit is -inf (masked out) and whose probability is 0 adds 0: one-hot targets
    gave NaN (0 * -inf) where the class ids gave the loss. Loss and gradient now agree; a target
    with probability on a -inf class still costs inf."""
    logits = jnp.array([[1.0, 2.0, -jnp.inf], [0.5, -jnp.inf, 0.1]])
    ids = named(jnp.array([1, 0]), "batch")
    soft = na.nn.one_hot(ids, Axis("vocab", 3))

    def loss(array, targets):
        return na.nn.cross_entropy(named(array, ("batch", "vocab")), "vocab", targets).scalar()

    assert np.isfinite(loss(logits, soft))
    close(loss(logits, soft), loss(logits, ids))
    grad_soft, grad_ids = jax.grad(loss)(logits, soft), jax.grad(loss)(logits, ids)
    assert np.all(np.isfinite(grad_soft))
    close(grad_soft, grad_ids)
    half = named(jnp.array([[0.5, 0.0, 0.5], [1.0, 0.0, 0.0]]), ("batch", "vocab"))
    assert loss(logits, half) == np.inf


def test_rope_scaling_settings_are_checked_when_built():
    """Settings the formulas divide by or take the log of gave a ZeroDivisionError, a math domain
    error or silently wrong frequencies (factor=inf: all zero) when used; now a LayerError."""
    bad = [
        (
            dict(kind="linear", factor=float("inf")),
            r"'linear' needs factor as a finite number > 0, got inf",
        ),
        (dict(kind="linear", factor="2"), r"'linear' needs factor as a finite number > 0, got '2'"),
        (
            dict(kind="linear", factor=float("nan")),
            r"'linear' needs factor as a finite number > 0, got nan",
        ),
        (
            dict(kind="llama3", factor=8.0, original_max_position_embeddings=0),
            r"'llama3' needs original_max_position_embeddings as an int >= 1 \(the context "
            r"length the model was trained with, e\.g\. 4096\), got 0\.",
        ),
        (
            dict(kind="yarn", factor=4.0, original_max_position_embeddings=4096.0),
            r"'yarn' needs original_max_position_embeddings as an int >= 1 .*got 4096\.0\.",
        ),
        (
            dict(
                kind="llama3", factor=8.0, original_max_position_embeddings=64, low_freq_factor=0.0
            ),
            r"'llama3' needs low_freq_factor as a finite number > 0, got 0\.0\.",
        ),
        (
            dict(kind="yarn", factor=4.0, original_max_position_embeddings=64, beta_fast=0.0),
            r"'yarn' needs beta_fast as a finite number > 0, got 0\.0\.",
        ),
        (
            dict(
                kind="yarn",
                factor=4.0,
                original_max_position_embeddings=64,
                beta_fast=1.0,
                beta_slow=32.0,
            ),
            r"'yarn' needs beta_fast >= beta_slow .* got 1\.0 and 32\.0\. Swap them\.",
        ),
        (
            dict(kind="yarn", factor=4.0, original_max_position_embeddings=64, attention_factor=0),
            r"'yarn' needs attention_factor as a finite number > 0, got 0\.",
        ),
    ]
    for kw, message in bad:
        with pytest.raises(na.LayerError, match=rf"^RopeScaling {message}"):
            na.nn.RopeScaling(**kw)
    # What Hugging Face configs hold still builds (mscale_all_dim=0 means "not given").
    na.nn.RopeScaling(
        "yarn", factor=4.0, original_max_position_embeddings=64, mscale=0.707, mscale_all_dim=0
    )
    with pytest.raises(
        na.LayerError,
        match=r"^RotaryEmbedding: 'dynamic' scaling needs head_dim > 2 \(its base grows with the "
        r"power d / \(d - 2\)\), got head_dim=2\. Use 'linear' scaling for such heads\.$",
    ):
        na.nn.RotaryEmbedding(
            Axis("head_dim", 2),
            scaling=na.nn.RopeScaling("dynamic", factor=2.0, original_max_position_embeddings=4),
        )
    with pytest.raises(na.LayerError, match=r"head_dim=0 must be even and > 0\.$"):
        na.nn.RotaryEmbedding(Axis("head_dim", 0))


def test_rope_needs_x_to_share_an_axis_with_the_positions():
    """x broadcasts against the positions by name: a positions axis x lacks comes after x's axes,
    but an x with none of them (a misnamed sequence axis) would be an outer product: refused."""
    D = Axis("head_dim", 4)
    rope = na.nn.RotaryEmbedding(D)
    x = data(Axis("position", 3), D)
    pos = named(jnp.array([[0, 1, 2], [5, 6, 7]]), ("batch", "position"))
    y = rope(x, pos)
    assert set(y.axis_names) == {"batch", "position", "head_dim"}
    close(y["batch", 1].rearrange(x.axis_names).array, rope(x, pos["batch", 1]).array)
    scalar = rope(data(Axis("heads", 2), D), named(jnp.array(3), ()))  # one position for all
    assert scalar.axis_names == ("heads", "head_dim")
    with pytest.raises(
        na.AxisNotFoundError,
        match=r"^RotaryEmbedding: x NamedArray\(seq=3, head_dim=4\) has none of the axes of "
        r"positions NamedArray\(position=3\), so every position would rotate all of x",
    ):
        rope(x.rename({"position": "seq"}), na.arange(Axis("position", 3)))


def test_layer_settings_are_checked_when_built():
    """NumPy and 0-d JAX numbers are numbers (Dropout refused them); an Axis among broadcast_axes
    is read (it raised a bare TypeError) and its size checked; an activation that is not callable,
    an init_scale that is not a finite number and an input axis of size 0 (a ZeroDivisionError)
    are refused when the layer is built."""
    x = data(B, T, E)
    for rate in (np.float32(0.25), jnp.float32(0.25), np.float64(0.25)):
        close(na.nn.Dropout(rate)(x, key=KEY).array, na.nn.Dropout(0.25)(x, key=KEY).array)
    for rate in (True, "0.1", jnp.array([0.1]), float("nan")):
        with pytest.raises(na.LayerError, match=r"^Dropout rate must be a number in \[0, 1\)"):
            na.nn.Dropout(rate)
    shared = na.nn.Dropout(0.5, broadcast_axes=T)
    assert shared.broadcast_axes == ("position",)
    np.testing.assert_array_equal(
        shared(x, key=KEY).array, na.nn.Dropout(0.5, broadcast_axes="position")(x, key=KEY).array
    )
    with pytest.raises(
        na.AxisSizeError,
        match=r"^Dropout expects axis 'position' of size 7, but `x` has size 5 \(NamedArray\("
        r"batch=2, position=5, embed=8\)\)\. Build the layer with the input's size\.$",
    ):
        na.nn.Dropout(0.5, broadcast_axes=[Axis("position", 7)])(x, key=KEY)
    with pytest.raises(
        na.NamedTypeError,
        match=r"^MLP activation must be a function of a NamedArray or an activation name, got 3\. "
        r"Pass e\.g\. na\.silu or 'gelu_pytorch_tanh'\.$",
    ):
        na.nn.MLP(E, {"mlp": 4}, key=KEY, activation=3)
    for scale in (float("nan"), float("inf"), -1.0, "1"):
        with pytest.raises(
            na.LayerError,
            match=rf"^Linear init_scale must be a finite number >= 0 \(it multiplies the weight's "
            rf"standard deviation\), got {re.escape(repr(scale))}\.$",
        ):
            na.nn.Linear(E, {"mlp": 4}, key=KEY, init_scale=scale)
    assert not np.any(np.asarray(na.nn.Linear(E, {"mlp": 4}, key=KEY, init_scale=0).weight.array))
    with pytest.raises(
        na.LayerError,
        match=r"^Linear: input axis 'embed' has size 0, so the layer would contract nothing\. "
        r"Give every input axis a size >= 1\.$",
    ):
        na.nn.Linear({"embed": 0, "k": 2}, {"mlp": 3}, key=KEY)
