"""namedaxes.nn on (data=2, model=4) meshes, Auto and Explicit: parameters stored FSDP-sharded by one
mapping, layers run under another, values equal to the unsharded run, outputs placed by name."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from _helpers import shard_shapes, spec_of
from jax.sharding import PartitionSpec as P

import namedaxes as na
from namedaxes import Axis, named

KEY = jax.random.key(0)
B, T, E = Axis("batch", 4), Axis("position", 6), Axis("embed", 8)
H, D, M, V = Axis("heads", 4), Axis("head_dim", 2), Axis("mlp", 16), Axis("vocab", 12)
TP = {"heads": "model", "mlp": "model"}
PARAMS = {"embed": "data", **TP}
COMPUTE = {"batch": "data", **TP}


def close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


def run_sharded(mesh, fn, params, *inputs):
    """``fn(params, *inputs)`` jitted with params stored by PARAMS and the body under COMPUTE."""
    with jax.set_mesh(mesh), na.axis_mapping(COMPUTE):
        params = na.shard(params, PARAMS)
        inputs = na.shard(inputs, COMPUTE)
        return params, eqx.filter_jit(fn)(params, *inputs)


def test_linear_and_mlp(mesh_2x4):
    lin = na.nn.Linear(E, (H, D), key=KEY)
    mlp = na.nn.MLP(E, M, key=jax.random.key(1))
    x = na.random.normal(jax.random.key(2), (B, T, E))

    def fn(layers, x):
        lin, mlp = layers
        return lin(x), mlp(x)

    expected = eqx.filter_jit(fn)((lin, mlp), x)
    (lin_s, mlp_s), (y, z) = run_sharded(mesh_2x4, fn, (lin, mlp), x)
    assert spec_of(lin_s.weight) == P("data", "model") and shard_shapes(lin_s.weight) == [(4, 1, 2)]
    assert spec_of(mlp_s.down.weight) == P("model", "data")
    close(y.array, expected[0].array)
    close(z.array, expected[1].array)
    assert spec_of(y) == P("data", None, "model")  # (batch, position, heads, head_dim)
    assert shard_shapes(y) == [(2, 6, 1, 2)]
    assert spec_of(z) == P("data")  # (batch, position, embed): embed gathered for compute


def test_embedding_norms_dropout_and_loss(mesh_2x4):
    emb = na.nn.Embedding(V, E, key=KEY)
    ln, rms, drop = na.nn.LayerNorm(E), na.nn.RmsNorm(E), na.nn.Dropout(0.25)
    ids = na.random.randint(jax.random.key(1), (B, T), 0, V.size)
    pad = named(jnp.arange(T.size) < 4, T)

    def fn(layers, ids, key):
        emb, ln, rms, drop = layers
        h = drop(rms(ln(emb(ids))), key=key)
        logits = emb.unembed(h)
        soft = na.nn.cross_entropy(logits, "vocab", na.nn.one_hot(ids, V), reduction=None)
        return h, logits, na.nn.cross_entropy(logits, "vocab", ids, where=pad), soft

    params = (emb, ln, rms, drop)
    expected = eqx.filter_jit(fn)(params, ids, jax.random.key(3))
    (emb_s, ln_s, *_), (h, logits, loss, soft) = run_sharded(
        mesh_2x4, fn, params, ids, jax.random.key(3)
    )
    assert spec_of(emb_s.weight) == P(None, "data") and spec_of(ln_s.weight) == P("data")
    for got, want in zip((h, logits, loss, soft), expected):
        close(got.array, want.array)
    assert soft.axis_names == ("batch", "position") and spec_of(soft) == P("data")
    assert spec_of(h) == P("data") and shard_shapes(h) == [(2, 6, 8)]
    assert spec_of(logits) == P("data") and shard_shapes(logits) == [(2, 6, 12)]


def test_vocab_split_lookup_of_ids_outside_the_vocabulary_reads_nan(mesh_2x4):
    """With `vocab` split over `model`, each device holds a slice of the table: an id outside the
    vocabulary (past its end, or negative) still reads NaN, not another row, and the other rows
    are the table's, exactly. So does cross_entropy's loss over the split vocabulary for such a
    target; the other positions' losses are the plain log_softmax's."""
    emb = na.nn.Embedding(V, E, key=KEY)
    ids = named(jnp.array([[1, 12, 3, 11, 0, -1]] * 4), (B, T))
    clean = named(jnp.array([[1, 2, 3, 11, 0, 5]] * 4), (B, T))
    mapping = {"batch": "data", "vocab": "model"}

    def run(emb, ids, clean):
        loss = na.nn.cross_entropy(emb.unembed(emb(clean)), "vocab", ids, reduction=None)
        return emb(ids), loss

    with jax.set_mesh(mesh_2x4), na.axis_mapping(mapping):
        emb_s, ids_s, clean_s = na.shard((emb, ids, clean), mapping)
        h, loss = eqx.filter_jit(run)(emb_s, ids_s, clean_s)
    assert spec_of(emb_s.weight) == P("model")
    h, loss, table = np.asarray(h.array), np.asarray(loss.array), np.asarray(emb.weight.array)
    assert np.isnan(h[:, [1, 5]]).all() and not np.isnan(h[:, [0, 2, 3, 4]]).any()
    np.testing.assert_array_equal(h[:, [0, 2, 3, 4]], table[[1, 3, 11, 0]][None].repeat(4, 0))
    logp = jax.nn.log_softmax(table[clean.array] @ table.T, -1)
    want = -np.take_along_axis(np.asarray(logp), np.asarray(clean.array)[..., None], -1)[..., 0]
    assert np.isnan(loss[:, [1, 5]]).all()
    close(loss[:, [0, 2, 3, 4]], want[:, [0, 2, 3, 4]])


def test_attention_with_qk_norm(mesh_2x4):
    attn = na.nn.Attention(E, H, D, key=KEY, qk_norm=True)
    x = na.random.normal(jax.random.key(2), (B, T, E))
    valid = named(
        jnp.arange(T.size)[None, :] < jnp.array([[6], [3], [6], [1]]), (B, Axis("key_position", 6))
    )

    def fn(attn, x, valid):
        return attn(x, mask=valid)

    expected = eqx.filter_jit(fn)(attn, x, valid)
    attn_s, y = run_sharded(mesh_2x4, fn, attn, x, valid)
    assert spec_of(attn_s.q_proj.weight) == P("data", "model")
    assert spec_of(attn_s.o_proj.weight) == P("model", None, "data")
    close(y.array, expected.array)
    assert y.axis_names == ("batch", "position", "embed")
    assert spec_of(y) == P("data") and shard_shapes(y) == [(2, 6, 8)]


class Block(eqx.Module):
    norm: na.nn.LayerNorm
    mlp: na.nn.MLP

    def __init__(self, key):
        self.norm = na.nn.LayerNorm(E)
        self.mlp = na.nn.MLP(E, M, key=key)

    def __call__(self, x):
        return x + self.mlp(self.norm(x))


def test_stacked_training_step_under_fsdp(mesh_2x4):
    """Stacked layers folded over `layer`; gradients come back in the parameter layout."""
    stack = na.nn.Stacked(Axis("layer", 3), Block, key=KEY, gradient_checkpointing=True)
    x = na.random.normal(jax.random.key(2), (B, T, E))

    def loss(stack, x):
        return na.mean(stack(x) ** 2).scalar()

    def step(stack, x):
        return eqx.filter_value_and_grad(loss)(stack, x)

    want_loss, want_grads = eqx.filter_jit(step)(stack, x)
    with jax.set_mesh(mesh_2x4):
        stack_s = na.shard(stack, PARAMS)
        got_loss, grads = na.fsdp(step, PARAMS, COMPUTE)(stack_s, x)
    close(got_loss, want_loss)
    w = grads.stacked.mlp.up.weight
    close(w.array, want_grads.stacked.mlp.up.weight.array)
    assert w.axis_names == ("layer", "embed", "mlp")
    assert spec_of(w) == P(None, "data", "model") and shard_shapes(w) == [(3, 4, 4)]


def test_grouped_query_attention_shards_by_heads(mesh_2x4, monkeypatch):
    """{"heads": "model"} shards grouped-query attention as it shards multi-head attention, with 2
    key/value heads on model=4: the query and output projections by `heads`, and the attention
    itself (each device attends its one query head with the one key/value head it uses); keys and
    values (kv_heads, not mapped) stay whole on `model`. Values and gradients as unsharded."""
    KV = Axis("kv_heads", 2)
    attn = na.nn.Attention(
        E, H, D, KVHeads=KV, key=KEY, qk_norm=True, rotary=na.nn.RotaryEmbedding(D)
    )
    x = na.random.normal(jax.random.key(2), (B, T, E))
    real = named(jnp.arange(T.size)[None, :] >= jnp.array([[0], [2], [0], [5]]), (B, T))

    def fn(attn, x, real):
        def loss(attn):
            y = attn(x, key_mask=real.rename({"position": "key_position"}))
            return na.sum(na.where(real, y, 0.0) ** 2).scalar(), y

        return eqx.filter_value_and_grad(loss, has_aux=True)(attn)

    (want_loss, expected), want_grads = eqx.filter_jit(fn)(attn, x, real)
    calls = []
    run = na.nn._attention_kernels.run
    monkeypatch.setattr(
        na.nn._attention_kernels, "run", lambda impl, c: calls.append(c) or run(impl, c)
    )
    attn_s, ((loss, y), grads) = run_sharded(mesh_2x4, fn, attn, x, real)
    (call,) = calls  # one kernel, traced once inside one shard_map
    assert call.q.shape == (2, 6, 1, 2) and call.k.shape == (2, 6, 1, 2)  # per device
    assert spec_of(attn_s.q_proj.weight) == P("data", "model")
    assert spec_of(attn_s.o_proj.weight) == P("model", None, "data")
    assert spec_of(attn_s.k_proj.weight) == P("data")
    close(loss, want_loss)
    close(y.array, expected.array)
    assert spec_of(y) == P("data") and shard_shapes(y) == [(2, 6, 8)]
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        close(getattr(grads, name).weight.array, getattr(want_grads, name).weight.array)
    close(grads.k_norm.weight.array, want_grads.k_norm.weight.array)


def test_vocab_split_lookup_and_loss_gather_nothing_whole(mesh_2x4):
    """With `vocab` on `model`, a tied embedding's lookup and the integer cross-entropy reduce the
    split vocabulary where it lies, on Auto and Explicit meshes alike: the compiled training step
    all-reduces per-device pieces (looked-up vectors, picked log-probabilities, gradient shards)
    and gathers neither the table nor the (batch, position, vocab) log-probabilities."""
    import re

    emb = na.nn.Embedding(V, E, key=KEY)
    ids = na.random.randint(jax.random.key(1), (B, T), 0, V.size)
    mapping = {"batch": "data", "vocab": "model"}

    def step(emb, ids):
        def loss(emb):
            return na.nn.cross_entropy(emb.unembed(emb(ids)), "vocab", ids).scalar()

        return eqx.filter_value_and_grad(loss)(emb)

    want_loss, want_grads = eqx.filter_jit(step)(emb, ids)
    with jax.set_mesh(mesh_2x4), na.axis_mapping(mapping):
        emb_s, ids_s = na.shard((emb, ids), mapping)
        jitted = jax.jit(step)  # every leaf is an array
        loss, grads = jitted(emb_s, ids_s)
        hlo = jitted.lower(emb_s, ids_s).compile().as_text()
    close(loss, want_loss)
    close(grads.weight.array, want_grads.weight.array)
    assert spec_of(emb_s.weight) == P("model") and spec_of(grads.weight) == P("model")
    assert not re.search(r"all-gather(-start)?\(", hlo)
    reduced = {
        tuple(int(d) for d in dims.split(",") if d)
        for shapes in re.findall(r"= (\(.*?\)|\S+) all-reduce(?:-start)?\(", hlo)
        for dims in re.findall(r"f32\[([\d,]*)\]", shapes)
    }
    # (batch/2, position, embed), (batch/2, position), (vocab/4, embed), scalars
    assert reduced <= {(2, 6, 8), (2, 6), (3, 8), ()}, reduced
    assert (2, 6, 8) in reduced and (3, 8) in reduced
