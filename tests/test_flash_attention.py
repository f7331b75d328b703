"""namedaxes.kernels.flash_attention in Pallas interpret mode: the forward pass (output and
log-sum-exp) and the backward pass given another softmax's log-sum-exp and delta (the ring's)
against the ring's XLA blocks (nn._ring._block_forward / _block_backward), for causal queries at
offsets 0, positive and negative (rows that see no key), a sliding window, grouped-query heads,
lengths that are not whole tiles, and no mask; the differentiable function against its reference
through both outputs; the kernels lower to Triton for GPUs. (dot_product_attention's
implementation="pallas": tests/test_attention.py and tests/test_context_parallel.py.)"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _triton import verified_triton_modules

import namedaxes as na
from namedaxes.kernels import _flash_attention as flash
from namedaxes.kernels import flash_attention, flash_attention_reference
from namedaxes.nn import _attention_kernels as kernels
from namedaxes.nn import _ring

B, T, S, N, K, H = 1, 24, 40, 4, 2, 16  # 2 x 3 tiles of 16, both lengths padded
BLOCKS = (16, 16)
# (options, offsets): the offset is an argument, so each option compiles once
CASES = {
    "causal": (dict(causal=True), [0, 8, -12, 30]),  # -12: rows 0-11 see no key
    "window": (dict(causal=True, window=7), [3, -5]),
    "full": (dict(causal=False), [0]),
}
LOWEST = float(jnp.finfo(jnp.float32).min)


def operands(seed=0):
    ks = jax.random.split(jax.random.key(seed), 6)
    q = jax.random.normal(ks[0], (B, T, N, H))
    k, v = (jax.random.normal(x, (B, S, K, H)) for x in ks[1:3])
    do = jax.random.normal(ks[3], (B, T, K, N // K, H))
    other = jax.random.normal(ks[4], (B, K, N // K, T))  # another block's log-sum-exp
    delta = jax.random.normal(ks[5], (B, K, N // K, T))
    return q, k, v, do, other, delta


@functools.cache
def block(impl, case):
    """Compiled: forward (out, lse) of one ring block, then its backward (dq, dk, dv) given the
    log-sum-exp of a softmax that also spans another block, and a delta."""
    options = CASES[case][0]

    def f(q, k, v, offset, do, other, delta):
        call = kernels.KernelCall(
            q=q, k=k, v=v, scale=0.3, offset=offset, padding=None, mask=None,
            window=options.get("window"), causal=options["causal"],
        )  # fmt: skip
        out, lse = _ring._block_forward(call, impl)
        whole = jnp.logaddexp(lse, other)
        return out, lse, _ring._block_backward(call, impl, do, whole, delta)

    return jax.jit(f)


def close(a, b, what=""):
    a, b = np.asarray(a), np.asarray(b)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(b).max(), err_msg=str(what))


@pytest.mark.parametrize("case", list(CASES))
def test_ring_block_forward_and_backward_equal_the_xla_block(case, monkeypatch):
    monkeypatch.setattr(flash, "GPU_BLOCKS", BLOCKS)
    q, k, v, do, other, delta = operands()
    options, offsets = CASES[case]
    for offset in offsets:
        args = (q, k, v, jnp.int32(offset), do, other, delta)
        (out, lse, grads), (want, want_lse, want_grads) = (
            block(i, case)(*args) for i in ("pallas", "xla")
        )
        at = np.arange(T)[:, None] + offset
        key = np.arange(S)[None, :]
        ok = key <= at if options["causal"] else np.ones((T, S), bool)
        if "window" in options:
            ok &= key > at - options["window"]
        seen = ok.any(axis=1)
        assert out.dtype == lse.dtype == jnp.float32
        close(out[:, seen], want[:, seen], (case, offset, "out"))
        assert not np.asarray(out[:, ~seen]).any()  # a query that sees no key: 0
        close(lse, want_lse, (case, offset, "lse"))
        assert (np.asarray(lse)[..., ~seen] == LOWEST).all()  # as the ring's initial state
        for name, a, b in zip(("dq", "dk", "dv"), grads, want_grads):
            close(a, b, (case, offset, name))


@functools.cache
def loss_and_grads(how):
    fn = {
        "kernel": functools.partial(flash_attention, blocks=BLOCKS),
        "reference": flash_attention_reference,
    }[how]

    def loss(q, k, v, offset, c):
        out, lse = fn(q, k, v, causal=True, window=20, offset=offset)
        return jnp.sum(out * c) + jnp.sum(jnp.where(lse > LOWEST, lse, 0.0) * 0.7)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def test_the_differentiable_kernel_equals_its_reference_through_both_outputs():
    """The output's and the log-sum-exp's cotangents both reach the gradients (the latter as
    ``delta - d lse``); rows that see no key (offset -6) give 0 and no gradient."""
    q, k, v, _, _, _ = operands(1)
    c = jax.random.normal(jax.random.key(2), q.shape)
    value, grads = loss_and_grads("kernel")(q, k, v, jnp.int32(-6), c)
    want, want_grads = loss_and_grads("reference")(q, k, v, jnp.int32(-6), c)
    np.testing.assert_allclose(value, want, rtol=1e-5)
    for a, b in zip(grads, want_grads):
        close(a, b)
    assert not np.asarray(grads[0][:, :6]).any()


def test_the_kernels_lower_to_valid_triton_for_gpus(monkeypatch):
    """Lowered for CUDA (no GPU needed): forward and the two backward kernels are Triton kernels,
    with a traced offset and a window (loop bounds known at run time) and without a mask, and
    each module passes MLIR's verifier, as a GPU's compile requires."""
    q, k = jnp.ones((1, 64, 4, 64), jnp.bfloat16), jnp.ones((1, 96, 2, 64), jnp.bfloat16)

    def loss(q, k, v, offset, **kw):
        out, lse = flash_attention(q, k, v, offset=offset, interpret=False, **kw)
        return jnp.sum(out.astype(jnp.float32)) + jnp.sum(lse)

    for kw in (dict(causal=True, window=40), dict(causal=False)):
        grad = jax.jit(jax.grad(functools.partial(loss, **kw), argnums=(0, 1, 2)))
        lowered = grad.trace(q, k, k, jnp.int32(3)).lower(lowering_platforms=("cuda",))
        assert lowered.as_text().count("xla.gpu.triton") == 3, kw
        assert verified_triton_modules(monkeypatch, grad, q, k, k, jnp.int32(3)) == (3, []), kw


def test_errors():
    q, k, v, *_ = operands()
    with pytest.raises(na.KernelError, match=r"key/value heads K dividing query heads N; got q"):
        flash_attention(q, k[:, :, :1].repeat(3, axis=2), v[:, :, :1].repeat(3, axis=2))
    with pytest.raises(na.KernelError, match=r"needs q, k and v of one dtype"):
        flash_attention(q.astype(jnp.bfloat16), k, v)
    with pytest.raises(
        na.KernelError, match=r"blocks of two powers of 2 of at least 16, got \(16, 24\)"
    ):
        flash_attention(q, k, v, blocks=(16, 24))
    with pytest.raises(na.KernelError, match=r"positive int window, got 0"):
        flash_attention(q, k, v, window=0)


def test_settings_are_integers_of_the_documented_kinds():
    """A bool or float window, a float or non-scalar offset, and blocks that are not a pair are
    refused by the kernel and its reference alike (no truncation, no JAX error); NumPy integers
    are integers."""
    q, k, v, *_ = operands()
    bad = {
        "window": [(dict(window=True), r"positive int window, got True"),
                   (dict(window=2.0), r"positive int window, got 2.0")],
        "offset": [(dict(causal=True, offset=1.7), r"integer offset .* got 1.7; pass the key"),
                   (dict(causal=True, offset=jnp.array([1, 2])), r"integer offset .* got Array"),
                   (dict(causal=True, offset=jnp.float32(2)), r"integer offset .* got Array")],
    }  # fmt: skip
    for fn in (flash_attention, flash_attention_reference):
        for kw, match in bad["window"] + bad["offset"]:
            with pytest.raises(na.KernelError, match=match):
                fn(q, k, v, **kw)
    for blocks in (16, (16, 16, 16), (32, True), [16, 16]):
        with pytest.raises(na.KernelError, match=r"blocks of two powers of 2 .*\(queries, keys\)"):
            flash_attention(q, k, v, blocks=blocks)
    with pytest.raises(na.KernelError, match=r"at least one key/value head"):
        flash_attention(q[:, :, :0], k[:, :, :0], v[:, :, :0])
    kw = dict(window=np.int64(5), offset=np.int32(3), blocks=(np.int64(16), 16))
    out, lse = flash_attention(q, k, v, **kw)
    want, want_lse = flash_attention_reference(q, k, v, window=5, offset=3)
    close(out, want)
    close(lse, want_lse)


@pytest.mark.parametrize("t, s", [(0, S), (T, 0), (0, 0)], ids=["no queries", "no keys", "none"])
def test_no_queries_or_no_keys_give_what_the_reference_gives(t, s):
    """Zero-length queries or keys run no kernel: the reference's empty output, or with no keys
    every query's 0 and float32's lowest log-sum-exp, and zero gradients."""
    q, k, v, *_ = operands()
    q, k, v = q[:, :t], k[:, :s], v[:, :s]

    def loss(fn):
        def f(q, k, v):
            out, lse = fn(q, k, v, causal=True, offset=2)
            return jnp.sum(out) + jnp.sum(jnp.where(lse > LOWEST, lse, 0.0))

        return jax.value_and_grad(f, argnums=(0, 1, 2))

    out, lse = flash_attention(q, k, v, causal=True, offset=2)
    want, want_lse = flash_attention_reference(q, k, v, causal=True, offset=2)
    assert out.shape == want.shape == (B, t, N, H) and lse.shape == want_lse.shape == (B, N, t)
    assert not np.asarray(out).any() and (np.asarray(lse) == LOWEST).all()
    np.testing.assert_array_equal(want_lse, lse)
    (value, grads), (want_value, want_grads) = (
        loss(fn)(q, k, v) for fn in (flash_attention, flash_attention_reference)
    )
    assert value == want_value == 0
    for a, b in zip(grads, want_grads):
        assert a.shape == b.shape and not np.asarray(a).any() and not np.asarray(b).any()
