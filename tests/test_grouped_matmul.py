"""namedaxes.kernels.grouped_matmul in Pallas interpret mode against jax.lax.ragged_dot and a dense
product: values and both gradients (rows, per-group weights) for group sizes with empty and
single-row groups, rows past the groups and no rows at all, in float32 and bfloat16. The work list
visits only the tiles each group has rows in; the kernels lower to Triton for GPUs; megablox (the
TPU path) in interpret mode agrees too."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _triton import verified_triton_modules

import namedaxes as na
from namedaxes.kernels import grouped_matmul, grouped_matmul_reference
from namedaxes.kernels._grouped_matmul import _bounds, _work, scaled_grouped_matmul

M, K, N, G = 45, 24, 40, 6
TILING = (16, 16, 16)  # several tiles each way, K and N padded
SIZES = {
    "empty and single-row groups, rows past them": [5, 0, 1, 20, 0, 13],
    "one group of every row": [0, 0, 0, 45, 0, 0],
    "random, every row": (
        np.random.default_rng(0).multinomial(44, [1 / G] * G) + np.eye(G, dtype=int)[2]
    ).tolist(),
    "nothing routed": [0] * G,
}
# Largest error allowed, relative to the reference's largest magnitude: float32 rounding, or
# bfloat16's (8 bits) for the results rounded to bfloat16 from float32 sums.
TOL = {jnp.float32: 1e-5, jnp.bfloat16: 1e-2}


def dense(lhs, rhs, sizes):
    """Each row times its group's matrix as one dense product with the one-hot groups."""
    group = jnp.searchsorted(jnp.cumsum(sizes), jnp.arange(lhs.shape[0]), side="right")
    onehot = (group[:, None] == jnp.arange(rhs.shape[0])[None, :]).astype(jnp.float32)
    return jnp.einsum(
        "mg,mk,gkn->mn", onehot, lhs.astype(jnp.float32), rhs.astype(jnp.float32),
        precision=jax.lax.Precision.HIGHEST,
    )  # fmt: skip


@functools.cache
def value_and_grads(how):
    """A compiled (output, d lhs, d rhs) of ``sum(out * cot)``, one per product and dtype (the
    sizes are an argument: every case reuses it)."""
    products = {
        "kernel": lambda a, b, s: grouped_matmul(a, b, s, tiling=TILING, interpret=True),
        "megablox": lambda a, b, s: grouped_matmul(a, b, s, implementation="megablox"),
        "ragged_dot": grouped_matmul_reference,
        "dense": dense,
    }

    def f(lhs, rhs, sizes, cot):
        out, vjp = jax.vjp(lambda a, b: products[how](a, b, sizes), lhs, rhs)
        return (out, *vjp(cot.astype(out.dtype)))

    return jax.jit(f)


def operands(dtype):
    keys = jax.random.split(jax.random.key(0), 3)
    lhs = jax.random.normal(keys[0], (M, K), dtype)
    rhs = jax.random.normal(keys[1], (G, K, N), dtype)
    return lhs, rhs, jax.random.normal(keys[2], (M, N), jnp.float32)


def close(a, b, dtype, what=""):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    atol = TOL[dtype] * max(1.0, float(np.abs(b).max()))
    np.testing.assert_allclose(a, b, rtol=0, atol=atol, err_msg=str(what))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_values_and_gradients_equal_ragged_dot_and_dense(dtype):
    lhs, rhs, cot = operands(dtype)
    for case, sizes in SIZES.items():
        sizes = jnp.asarray(sizes, jnp.int32)
        got = value_and_grads("kernel")(lhs, rhs, sizes, cot)
        assert [g.dtype for g in got] == [dtype] * 3, case
        for how in ("ragged_dot", "dense"):
            want = value_and_grads(how)(lhs, rhs, sizes, cot)
            for name, a, b in zip(("output", "d lhs", "d rhs"), got, want):
                close(a, b, dtype, (case, how, name))
        past = int(sizes.sum())
        assert not np.asarray(got[0][past:], np.float32).any()  # rows past the groups: 0
        assert not np.asarray(got[1][past:], np.float32).any()
        empty = np.flatnonzero(np.asarray(sizes) == 0)
        assert not np.asarray(got[2][empty], np.float32).any()  # empty groups: no gradient


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("narrow", [jnp.int8, jnp.float8_e4m3fn], ids=["int8", "float8"])
def test_narrow_weights_with_scales_equal_ragged_dot_of_the_dequantized(dtype, narrow, monkeypatch):
    """scaled_grouped_matmul (a quantized mixture of experts' product): rows times each group's
    narrow values, converted inside the kernel, times the group's per-column scales, equals
    ragged_dot of the dequantized weights for every case of group sizes (rows past the groups 0),
    and so does the rows' gradient; it lowers to a verified Triton module."""
    lhs, _, cot = operands(dtype)
    keys = jax.random.split(jax.random.key(1))
    values = (8 * jax.random.normal(keys[0], (G, K, N))).astype(narrow)
    scale = jax.random.uniform(keys[1], (G, N), minval=0.5, maxval=2.0)
    weight = values.astype(jnp.float32) * scale[:, None, :]

    @jax.jit
    def got(lhs, sizes):
        f = lambda a: scaled_grouped_matmul(a, values, sizes, scale, tiling=TILING)  # noqa: E731
        out, vjp = jax.vjp(f, lhs)
        return out, *vjp(cot.astype(out.dtype))

    for case, sizes in SIZES.items():
        sizes = jnp.asarray(sizes, jnp.int32)
        out, d_lhs = got(lhs, sizes)
        assert out.dtype == d_lhs.dtype == dtype
        want = value_and_grads("ragged_dot")(lhs.astype(jnp.float32), weight, sizes, cot)
        close(out, want[0], dtype, (case, "output"))
        close(d_lhs, want[1], dtype, (case, "d lhs"))
        assert not np.asarray(out[int(sizes.sum()) :], np.float32).any()
    sizes = jnp.asarray(SIZES["random, every row"], jnp.int32)
    f = lambda a, v: scaled_grouped_matmul(a, v, sizes, scale, interpret=False)  # noqa: E731
    assert verified_triton_modules(monkeypatch, f, lhs, values) == (1, [])


def test_megablox_in_interpret_mode_equals_ragged_dot():
    """The TPU path (megablox gmm/tgmm, which leaves rows past the groups unwritten), here in
    interpret mode: values and gradients, rows past the groups 0."""
    lhs, rhs, cot = operands(jnp.float32)
    sizes = jnp.asarray(SIZES["empty and single-row groups, rows past them"], jnp.int32)
    got = value_and_grads("megablox")(lhs, rhs, sizes, cot)
    want = value_and_grads("ragged_dot")(lhs, rhs, sizes, cot)
    for a, b in zip(got, want):
        close(a, b, jnp.float32)


def test_the_work_list_visits_only_the_tiles_each_group_has_rows_in():
    """Rows 0-4 group 0, 5 group 2, 6-25 group 3, 26-38 group 5, 39-47 past the groups, in tiles
    of 16 rows: one item per (group, tile) pair that shares a row, none for empty groups; the
    unused items (tiles + groups in all) go to the last, empty group."""
    sizes = jnp.asarray(SIZES["empty and single-row groups, rows past them"], jnp.int32)
    group, tile = jax.jit(lambda s: _work(*_bounds(s, M, 48), 16, 3))(sizes)
    pairs = [(int(g), int(t)) for g, t in zip(group, tile)]
    visited = [(0, 0), (2, 0), (3, 0), (3, 1), (5, 1), (5, 2), (6, 2)]
    assert pairs == visited + [(7, 0)] * 2


def test_the_kernels_lower_to_valid_triton_for_gpus(monkeypatch):
    """Lowered for CUDA (no GPU needed): the forward product and both backward products are
    Triton kernels, and each module passes MLIR's verifier, as a GPU's compile requires (an H100
    once refused all three: a loop bound Pallas had typed i1)."""
    lhs, rhs, _ = operands(jnp.bfloat16)
    sizes = jnp.asarray(SIZES["random, every row"], jnp.int32)

    def loss(a, b):
        out = grouped_matmul(a, b, sizes, interpret=False, implementation="pallas")
        return jnp.sum(out.astype(jnp.float32))

    lowered = jax.jit(jax.grad(loss, (0, 1))).trace(lhs, rhs).lower(lowering_platforms=("cuda",))
    assert lowered.as_text().count("xla.gpu.triton") == 3
    assert verified_triton_modules(monkeypatch, jax.grad(loss, (0, 1)), lhs, rhs) == (3, [])


@pytest.mark.parametrize(
    "lhs,rhs,sizes",
    [((4, 0), (2, 0, 3), [2, 2]), ((4, 3), (0, 3, 2), []), ((0, 3), (2, 3, 2), [0, 0])],
)
def test_empty_contraction_or_no_groups_give_zeros_as_ragged_dot(lhs, rhs, sizes):
    """K = 0 or G = 0: ragged_dot gives zeros; the kernel raised JAX's TypeError from its tiles."""
    a, b, g = jnp.ones(lhs), jnp.ones(rhs), jnp.array(sizes, jnp.int32)
    got = grouped_matmul(a, b, g)
    np.testing.assert_array_equal(got, jax.lax.ragged_dot(a, b, g))
    da, db = jax.grad(lambda a, b: grouped_matmul(a, b, g).sum(), argnums=(0, 1))(a, b)
    assert da.shape == a.shape and db.shape == b.shape


def test_errors():
    lhs, rhs, _ = operands(jnp.float32)
    sizes = jnp.zeros(G, jnp.int32)
    with pytest.raises(na.KernelError, match=r"needs lhs and rhs of one floating dtype .* got lhs"):
        grouped_matmul(lhs.astype(jnp.bfloat16), rhs, sizes)
    with pytest.raises(na.KernelError, match=r"one group size per matrix of rhs; got .* \(5,\)"):
        grouped_matmul(lhs, rhs, sizes[:5])
    with pytest.raises(na.KernelError, match=r"tiling=\(16, 24, 16\) must be three powers of 2"):
        grouped_matmul(lhs, rhs, sizes, tiling=(16, 24, 16))
    with pytest.raises(na.KernelError, match=r"implementation='triton' is not one of 'pallas'"):
        grouped_matmul(lhs, rhs, sizes, implementation="triton")


def test_known_negative_group_sizes_are_refused_by_both_products():
    """Concrete negative sizes (which ragged_dot and the kernel read differently) are a
    KernelError naming them; traced ones cannot be read (the docstring says so)."""
    lhs, rhs, _ = operands(jnp.float32)
    sizes = jnp.asarray([5, -1, 20, 0, 0, 13], jnp.int32)
    scale = jnp.ones((G, N))
    with pytest.raises(
        na.KernelError, match=r"^grouped_matmul needs group sizes of at least 0 \(rows per group\), "
        r"not \[5, -1, 20, 0, 0, 13\]; got lhs"
    ):  # fmt: skip
        grouped_matmul(lhs, rhs, sizes)
    with pytest.raises(na.KernelError, match=r"scaled_grouped_matmul needs group sizes .*, not "):
        scaled_grouped_matmul(lhs, rhs.astype(jnp.int8), np.asarray(sizes), scale)


def test_scaled_grouped_matmul_checks_its_operands():
    """The quantized product shares grouped_matmul's check, plus col_scale (G, N): mismatched
    contraction, a group size short, scales of the wrong width and integer rows are refused."""
    lhs, rhs, _ = operands(jnp.float32)
    values, sizes, scale = rhs.astype(jnp.int8), jnp.zeros(G, jnp.int32), jnp.ones((G, N))
    cases = [
        ((lhs[:, :-1], values, sizes, scale), r"needs lhs's K to be rhs's K .* lhs \(45, 23\)"),
        (
            (lhs, values, sizes[:-1], scale),
            r"needs .* one group size per matrix .* group_sizes \(5,\)",
        ),
        ((lhs, values, sizes, scale[:, :-1]), r"needs col_scale \(G, N\).* col_scale \(6, 39\)"),
        ((lhs.astype(jnp.int32), values, sizes, scale), r"needs floating lhs and col_scale"),
        ((lhs, values, sizes.astype(jnp.float32), scale), r"needs integer group_sizes"),
    ]
    for args, match in cases:
        with pytest.raises(na.KernelError, match=r"^scaled_grouped_matmul " + match):
            scaled_grouped_matmul(*args)
    with pytest.raises(na.KernelError, match=r"scaled_grouped_matmul: tiling=\(16, 24, 16\)"):
        scaled_grouped_matmul(lhs, values, sizes, scale, tiling=(16, 24, 16))


def test_mosaic_fails_closed_off_hopper_gpus():
    lhs, rhs, _ = operands(jnp.bfloat16)
    with pytest.raises(
        na.KernelError, match=r"'mosaic' runs on Hopper GPUs only .*implementation='pallas'"
    ):
        grouped_matmul(lhs, rhs, jnp.zeros(G, jnp.int32), implementation="mosaic")


class FakeMosaic:
    """Stands in for JAX's Mosaic GPU modules with their contract: blocks must divide the
    contraction and the columns (forward) or the output (transposed), and the forward product
    leaves rows past the groups unwritten (NaN here)."""

    @staticmethod
    def ragged_dot(
        lhs, rhs, *, group_sizes, transpose_rhs, block_m, block_n, block_k, grid_block_n, **_
    ):
        k = lhs.shape[1]
        n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
        assert k % block_k == 0 and n % block_n == 0 and lhs.shape[0] % block_m == 0
        assert (n // block_n) % grid_block_n == 0
        out = jax.lax.ragged_dot(lhs, rhs.swapaxes(1, 2) if transpose_rhs else rhs, group_sizes)
        past = (jnp.arange(lhs.shape[0]) >= jnp.sum(group_sizes))[:, None]
        return jnp.where(past, jnp.nan, out).astype(lhs.dtype)

    @staticmethod
    def transposed_ragged_dot(lhs, rhs, *, group_sizes, block_m, block_n, grid_block_n, **_):
        assert lhs.shape[1] % block_m == 0 and rhs.shape[1] % block_n == 0
        assert (rhs.shape[1] // block_n) % grid_block_n == 0
        dims = jax.lax.RaggedDotDimensionNumbers((((0,), (0,)), ((), ())), [0], [])
        return jax.lax.ragged_dot_general(lhs, rhs, group_sizes, dims).astype(lhs.dtype)


def test_mosaic_wrapper_pads_blocks_and_zeroes_the_rows_it_leaves_unwritten(monkeypatch):
    """The Mosaic GPU path (Hopper only, so faked here with its contract): operands padded to
    whole blocks, rows past the groups 0, and the three products equal ragged_dot's."""
    from namedaxes.kernels import _grouped_matmul as gm

    monkeypatch.setattr(gm, "_hopper", lambda: True)
    monkeypatch.setattr(gm, "_mosaic", lambda: (FakeMosaic, FakeMosaic))
    lhs, rhs, cot = operands(jnp.bfloat16)
    sizes = jnp.asarray(SIZES["empty and single-row groups, rows past them"], jnp.int32)

    def f(lhs, rhs, cot):  # implementation=None picks mosaic on (this faked) Hopper
        out, vjp = jax.vjp(lambda a, b: grouped_matmul(a, b, sizes), lhs, rhs)
        return (out, *vjp(cot.astype(out.dtype)))

    got = jax.jit(f)(lhs, rhs, cot)
    want = value_and_grads("ragged_dot")(lhs, rhs, sizes, cot)
    for name, a, b in zip(("output", "d lhs", "d rhs"), got, want):
        close(a, b, jnp.bfloat16, name)
    assert not np.asarray(got[0][int(sizes.sum()) :], np.float32).any()
    with pytest.raises(na.KernelError, match=r"needs bfloat16 or float16 operands, got float32"):
        grouped_matmul(lhs.astype(jnp.float32), rhs.astype(jnp.float32), sizes,
                       implementation="mosaic")  # fmt: skip
    with pytest.raises(na.KernelError, match=r"tiles that are multiples of 64, got \(64, 32, 64\)"):
        grouped_matmul(lhs, rhs, sizes, implementation="mosaic", tiling=(64, 32, 64))


def test_mosaic_column_sweep_divides_the_column_blocks():
    """The sweep (grid_block_n) is the largest up to MOSAIC_PIPELINE's that divides the column
    blocks, so a width of 384 (3 blocks of 128) is not padded to a sweep of 8 blocks."""
    from namedaxes.kernels import _grouped_matmul as gm

    sweeps = {n: gm._mosaic_blocks((128, 64, 128), n)["grid_block_n"] for n in (40, 384, 2048)}
    assert sweeps == {40: 1, 384: 3, 2048: min(8, gm.MOSAIC_PIPELINE[1])}
