"""A grouped matmul that does only the routed work: ``out[r] = lhs[r] @ rhs[g]`` for the rows ``r``
of each group ``g`` (rows sorted by group, ``group_sizes[g]`` each; rows past the last group give 0),
with both backward products (the rows' gradient and each group's weight gradient).

Kernels: on GPUs a Pallas kernel (Triton lowering), or on Hopper GPUs JAX's own Mosaic GPU grouped
matmuls (``ragged_dot_mgpu``/``transposed_ragged_dot_mgpu``: wgmma, bulk tensor copies); on TPUs
JAX's own megablox ``gmm``/``tgmm`` where it imports; elsewhere the Pallas kernel in interpret mode
(slow: for tests). The reference, ``jax.lax.ragged_dot``, is beside it.

The Pallas kernel walks a list of work items, one per (group, row tile) pair that the group
touches, so a tile is computed once per group it holds rows of: the waste is at most one tile per
group boundary, and an empty group costs nothing. A tile's rows of other groups are masked out of
the stores (forward, row gradient) or out of the operands (weight gradient).
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from .._errors import KernelError, format_names
from ._tiles import pad_to, tile_size

__all__ = ["IMPLEMENTATIONS", "grouped_matmul", "grouped_matmul_reference"]

IMPLEMENTATIONS = ("pallas", "mosaic", "megablox")

F32 = jnp.float32
# (rows, contraction, columns) per tile on GPUs: powers of 2, as Triton needs. Untuned: the GPU
# session's benchmark (benchmarks/grouped_matmul.py, every implementation and tiling) decides.
GPU_TILING = (64, 64, 128)
TPU_TILING = (128, 128, 128)
# Mosaic GPU's (rows, contraction, columns) per block, then the pipeline depth and the column
# blocks per row-major sweep (``grid_block_n``). Blocks are multiples of 64, as wgmma needs.
MOSAIC_TILING = (128, 64, 128)
MOSAIC_PIPELINE = (4, 8)
_TRITON = plgpu.CompilerParams(num_warps=4, num_stages=3)


def grouped_matmul_reference(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """The plain-JAX reference of :func:`grouped_matmul`: ``jax.lax.ragged_dot``.

    Args:
        lhs: ``(M, K)`` rows sorted by group.
        rhs: ``(G, K, N)``, one matrix per group.
        group_sizes: ``(G,)`` int32 rows per group (summing to at most ``M``).

    Returns:
        ``(M, N)``: each row times its group's matrix; rows past the groups are 0.

    Example:
        >>> import jax.numpy as jnp
        >>> from namedaxes.kernels import grouped_matmul_reference
        >>> rhs = jnp.stack([jnp.eye(2), 2 * jnp.eye(2)])
        >>> grouped_matmul_reference(jnp.ones((3, 2)), rhs, jnp.array([1, 1], jnp.int32))
        Array([[1., 1.],
               [2., 2.],
               [0., 0.]], dtype=float32)
    """
    return jax.lax.ragged_dot(lhs, rhs, group_sizes)


def grouped_matmul(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    implementation: str | None = None,
    tiling: tuple[int, int, int] | None = None,
    interpret: bool | None = None,
) -> jax.Array:
    """``jax.lax.ragged_dot`` by a kernel that does only the routed work, forward and backward.

    Row ``r`` of group ``g`` (the rows sorted by group, ``group_sizes[g]`` of them, empty groups
    allowed) is multiplied by ``rhs[g]``; rows past the last group give 0. The gradients are two
    more grouped products: the rows' (``d_out[r] @ rhs[g].T``) and each group's weight gradient
    (``lhs[rows of g].T @ d_out[rows of g]``; 0 for an empty group). All three accumulate in
    float32 and return the operands' dtype.

    Implementations: ``"pallas"``, this module's Pallas kernel, lowered by Triton on GPUs (in
    interpret mode elsewhere: slow, for tests); ``"mosaic"``, JAX's Mosaic GPU grouped matmuls
    (``ragged_dot_mgpu``, and ``transposed_ragged_dot_mgpu`` for the weight gradient), for Hopper
    GPUs and 16-bit operands; ``"megablox"``, JAX's Pallas TPU grouped matmul (``gmm``, whose
    backward is ``gmm`` and ``tgmm``), for TPUs. The default is ``"megablox"`` on TPUs,
    ``GPU_DEFAULT`` on Hopper GPUs for 16-bit operands, and ``"pallas"`` elsewhere.

    Args:
        lhs: ``(M, K)`` rows sorted by group.
        rhs: ``(G, K, N)``, one matrix per group, the same dtype as ``lhs``.
        group_sizes: ``(G,)`` integer rows per group, at least 0 and summing to at most ``M``
            (negative sizes are refused where they are known, not inside ``jit``, where they
            are traced).
        implementation: ``"pallas"``, ``"mosaic"``, ``"megablox"`` or ``None`` (as above).
        tiling: ``(rows, contraction, columns)`` per tile, powers of 2 of at least 16 (clipped to
            small operands; multiples of 64 for ``"mosaic"``); default ``GPU_TILING``
            (``MOSAIC_TILING``, ``TPU_TILING``).
        interpret: Run the kernel in Pallas interpret mode; default: unless on the kernel's own
            platform (GPU for ``"pallas"``, TPU for ``"megablox"``). ``"mosaic"`` has none.

    Returns:
        ``(M, N)`` in the operands' dtype.

    Raises:
        KernelError: for operands of the wrong rank, mismatched shapes or dtypes, integer
            operands, known negative group sizes, an unknown implementation or one this JAX or
            device lacks, or a tiling that is not three powers of 2 of at least 16.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from namedaxes.kernels import grouped_matmul
        >>> lhs = jax.random.normal(jax.random.key(0), (5, 4))
        >>> rhs = jax.random.normal(jax.random.key(1), (3, 4, 2))
        >>> sizes = jnp.array([2, 0, 3], jnp.int32)  # the middle group is empty
        >>> out = grouped_matmul(lhs, rhs, sizes)  # interpret mode on a CPU
        >>> bool(jnp.allclose(out, jax.lax.ragged_dot(lhs, rhs, sizes), atol=1e-5))
        True
    """
    _check(lhs, rhs, group_sizes, tiling)
    if lhs.shape[1] == 0 or rhs.shape[0] == 0:  # nothing to contract, or no group: zeros, as
        return jnp.zeros((lhs.shape[0], rhs.shape[2]), lhs.dtype)  # ragged_dot gives (no tiles)
    sizes = group_sizes.astype(jnp.int32)
    backend = jax.default_backend()
    if implementation is None:
        implementation = _default_implementation(backend, lhs.dtype)
    if implementation not in IMPLEMENTATIONS:
        raise KernelError(
            f"grouped_matmul: implementation={implementation!r} is not one of "
            f"{format_names(IMPLEMENTATIONS)} (or None: by backend)."
        )
    own = {"megablox": "tpu", "mosaic": backend}.get(implementation, "gpu")  # mosaic: none
    interpret = backend != own if interpret is None else bool(interpret)
    if implementation == "megablox":
        _megablox()  # fails here, not in the backward pass, where it is missing
    if implementation == "mosaic":
        _mosaic_check(lhs.dtype, interpret, tiling)
    default = {"megablox": TPU_TILING, "mosaic": MOSAIC_TILING}.get(implementation, GPU_TILING)
    return _grouped((implementation, tiling or default, interpret), lhs, rhs, sizes)


# What ``implementation=None`` runs on a Hopper GPU for 16-bit operands: the faster of the two
# GPU kernels in benchmarks/moe_dispatch.py's kernel table.
GPU_DEFAULT = "mosaic"


def _default_implementation(backend: str, dtype: Any) -> str:
    if backend == "tpu":
        return "megablox"
    if mosaic_runs(dtype):
        return GPU_DEFAULT
    return "pallas"


def mosaic_runs(dtype: Any) -> bool:
    """Whether ``implementation="mosaic"`` runs here for operands of ``dtype``: a Hopper GPU and
    16-bit operands."""
    return _mosaic_fits(dtype) and _hopper()


def reads_narrow(dtype: Any) -> bool:
    """Whether :func:`scaled_grouped_matmul` runs here on weights of ``dtype``: int8 anywhere;
    float8 off GPUs (interpret mode) and on GPUs of compute capability 8.9 or later, the first
    whose conversion of float8 Triton compiles (checked for sm_80 and sm_90 with ``triton``)."""
    if not jnp.issubdtype(dtype, jnp.floating) or jnp.dtype(dtype).itemsize != 1:
        return jnp.dtype(dtype) == jnp.dtype(jnp.int8)
    if jax.default_backend() != "gpu":
        return True
    major, _, minor = str(getattr(jax.devices()[0], "compute_capability", "0.0")).partition(".")
    return (int(major or 0), int(minor or 0)) >= (8, 9)


def _hopper() -> bool:
    """Whether the default device is a Hopper GPU (compute capability 9.x), which Mosaic GPU's
    wgmma kernels need."""
    capability = getattr(jax.devices()[0], "compute_capability", "")
    return jax.default_backend() == "gpu" and str(capability).startswith("9")


def _mosaic_fits(dtype: Any) -> bool:
    return jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def _mosaic_check(dtype: Any, interpret: bool, tiling: Any) -> None:
    """Fails closed where Mosaic GPU cannot run: off Hopper GPUs, in interpret mode, for
    operands that are not 16-bit, or tiles that are not multiples of 64."""
    problem = None
    if interpret or not _hopper():
        problem = "runs on Hopper GPUs only (no interpret mode)"
    elif not _mosaic_fits(dtype):
        problem = f"needs bfloat16 or float16 operands, got {jnp.dtype(dtype).name}"
    elif tiling is not None and any(t % 64 for t in tiling):
        problem = f"needs tiles that are multiples of 64, got {tiling}"
    if problem:
        raise KernelError(
            f"grouped_matmul: implementation='mosaic' {problem}; use implementation='pallas' "
            "(or None: by backend and dtype)."
        )
    _mosaic()  # fails here, not in the backward pass, where it is missing


def _check(lhs: Any, rhs: Any, sizes: Any, tiling: Any, col_scale: Any = None) -> None:
    """Checks the operands of :func:`grouped_matmul`, or with ``col_scale`` those of
    :func:`scaled_grouped_matmul` (whose ``rhs`` may be narrow: any real dtype), and the tiling."""
    scaled = col_scale is not None
    caller = "scaled_grouped_matmul" if scaled else "grouped_matmul"
    shapes = f"lhs {lhs.shape} {lhs.dtype}, rhs {rhs.shape} {rhs.dtype}, group_sizes {sizes.shape}"
    if scaled:
        shapes += f", col_scale {col_scale.shape} {col_scale.dtype}"
    problem = None
    if lhs.ndim != 2 or rhs.ndim != 3 or sizes.ndim != 1 or (scaled and col_scale.ndim != 2):
        problem = "needs lhs (M, K), rhs (G, K, N) and group_sizes (G,)" + (
            ", col_scale (G, N)" if scaled else ""
        )
    elif lhs.shape[1] != rhs.shape[1] or rhs.shape[0] != sizes.shape[0]:
        problem = "needs lhs's K to be rhs's K and one group size per matrix of rhs"
    elif scaled and col_scale.shape != (rhs.shape[0], rhs.shape[2]):
        problem = "needs col_scale (G, N): one scale per matrix of rhs and column"
    elif not scaled and (lhs.dtype != rhs.dtype or not jnp.issubdtype(lhs.dtype, jnp.floating)):
        problem = "needs lhs and rhs of one floating dtype (cast one to the other)"
    elif scaled and not (
        jnp.issubdtype(lhs.dtype, jnp.floating)
        and jnp.issubdtype(col_scale.dtype, jnp.floating)
        and (jnp.issubdtype(rhs.dtype, jnp.floating) or jnp.issubdtype(rhs.dtype, jnp.integer))
    ):
        problem = "needs floating lhs and col_scale, and rhs of real numbers (int8, float8, ...)"
    elif not jnp.issubdtype(sizes.dtype, jnp.integer):
        problem = "needs integer group_sizes"
    elif (negative := _negative(sizes)) is not None:
        problem = f"needs group sizes of at least 0 (rows per group), not {negative}"
    if problem:
        raise KernelError(f"{caller} {problem}; got {shapes}.")
    if tiling is not None and not (
        isinstance(tiling, tuple)
        and len(tiling) == 3
        and all(isinstance(t, int) and t >= 16 and t & (t - 1) == 0 for t in tiling)
    ):
        raise KernelError(
            f"{caller}: tiling={tiling!r} must be three powers of 2 of at least 16, "
            f"(rows, contraction, columns), e.g. {GPU_TILING}."
        )


def _negative(sizes: Any) -> str | None:
    """The group sizes when some is negative and all are known here, else ``None``. Traced
    sizes (inside ``jit``) and sizes spread over processes cannot be read: they are the
    caller's to keep non-negative."""
    if isinstance(sizes, jax.core.Tracer) or not getattr(sizes, "is_fully_addressable", True):
        return None
    host = np.asarray(sizes)
    return str(host.tolist()) if (host < 0).any() else None


def _bounds(sizes: jax.Array, m: int, rows: int) -> tuple[jax.Array, jax.Array]:
    """First and past-last row of each group, then of the rows past the groups (up to ``rows``,
    the padded row count), then of an empty group for the unused work items."""
    ends = jnp.minimum(jnp.cumsum(sizes), m)
    starts = jnp.concatenate([jnp.zeros(1, jnp.int32), ends[:-1]])
    tail = ends[-1:] if ends.shape[0] else jnp.zeros(1, jnp.int32)
    zero = jnp.zeros(1, jnp.int32)
    return (
        jnp.concatenate([starts, tail, zero]),
        jnp.concatenate([ends, jnp.full(1, rows, jnp.int32), zero]),
    )


def _work(starts: jax.Array, ends: jax.Array, tm: int, tiles: int) -> tuple[jax.Array, jax.Array]:
    """The (group, row tile) of each work item: every tile each group touches, in row order.

    The groups and the tail partition the rows, so they touch at most ``tiles + groups`` tiles
    (one more per boundary inside a tile); unused items get the last, empty group."""
    n = starts.shape[0]  # groups + tail + empty
    first = starts // tm
    count = jnp.where(ends > starts, (ends - 1) // tm - first + 1, 0)
    done = jnp.cumsum(count)
    items = jnp.arange(tiles + n - 2, dtype=jnp.int32)
    group = jnp.minimum(jnp.searchsorted(done, items, side="right"), n - 1).astype(jnp.int32)
    tile = first[group] + items - (done - count)[group]
    return group, jnp.where(group == n - 1, 0, tile).astype(jnp.int32)


def _one_type(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Tiles of two dtypes in one (Pallas's Triton lowering multiplies one type): a narrow
    weight's (int8, float8) converted to the rows' float dtype, which holds its every value."""
    if a.dtype == b.dtype:
        return a, b
    return a, b.astype(a.dtype)


def _gmm_kernel(
    group_ref: Any, tile_ref: Any, start_ref: Any, end_ref: Any, lhs_ref: Any, rhs_ref: Any,
    *refs: Any, groups: int, k_tiles: int, tm: int, tk: int, tn: int, transpose_rhs: bool,
    scaled: bool,
) -> None:  # fmt: skip
    *scale, out_ref = refs
    w, j = pl.program_id(0), pl.program_id(1)
    g, t = group_ref[w], tile_ref[w]
    rows = pl.ds(pl.multiple_of(t * tm, tm), tm)
    cols = pl.ds(pl.multiple_of(j * tn, tn), tn)

    def step(k: jax.Array, acc: jax.Array) -> jax.Array:
        inner = pl.ds(pl.multiple_of(k * tk, tk), tk)
        a = lhs_ref[rows, inner]
        if transpose_rhs:  # rhs[g] is (N, K): contract both on their second axis
            b, dims = rhs_ref[g, cols, inner], (((1,), (1,)), ((), ()))
        else:
            b, dims = rhs_ref[g, inner, cols], (((1,), (0,)), ((), ()))
        a, b = _one_type(a, b)
        return acc + jax.lax.dot_general(a, b, dims, preferred_element_type=F32)

    # The tail (rows past the groups) and unused items multiply nothing: they store 0 or nothing.
    # Integer arithmetic, not a select of Python ints: Pallas's Triton lowering gives a weak
    # literal in select_n the predicate's type (i1), and scf.for then rejects its i1 bound.
    steps = (g < groups).astype(jnp.int32) * k_tiles
    acc = jax.lax.fori_loop(jnp.int32(0), steps, step, jnp.zeros((tm, tn), F32))
    if scaled:  # per group and column of rhs: on the float32 sums
        acc = acc * scale[0][g, cols][None, :]
    row = t * tm + jax.lax.broadcasted_iota(jnp.int32, (tm, tn), 0)
    mask = (row >= start_ref[g]) & (row < end_ref[g])
    plgpu.store(out_ref.at[rows, cols], acc.astype(out_ref.dtype), mask=mask)


def _gmm(
    lhs: jax.Array, rhs: jax.Array, sizes: jax.Array, tiling: tuple[int, int, int],
    interpret: bool, transpose_rhs: bool = False, col_scale: Any = None,
) -> jax.Array:  # fmt: skip
    """``lhs (M, K)`` times ``rhs[g]`` (``(K, N)``, or ``(N, K)`` transposed) per group (tiles of
    a narrow ``rhs`` converted to ``lhs``'s dtype); with ``col_scale (G, N)`` float32 each sum
    times its group's column's scale. In ``lhs``'s dtype."""
    m, k = lhs.shape
    groups = rhs.shape[0]
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    if m == 0 or n == 0:
        return jnp.zeros((m, n), lhs.dtype)
    tm, tk, tn = tile_size(m, tiling[0]), tile_size(k, tiling[1]), tile_size(n, tiling[2])
    lhs = pad_to(pad_to(lhs, 0, tm), 1, tk)
    rhs = pad_to(pad_to(rhs, 1, tn if transpose_rhs else tk), 2, tk if transpose_rhs else tn)
    rows = lhs.shape[0]
    starts, ends = _bounds(sizes, m, rows)
    group, tile = _work(starts, ends, tm, rows // tm)
    kernel = functools.partial(
        _gmm_kernel, groups=groups, k_tiles=lhs.shape[1] // tk, tm=tm, tk=tk, tn=tn,
        transpose_rhs=transpose_rhs, scaled=col_scale is not None,
    )  # fmt: skip
    extra = ()
    if col_scale is not None:  # whole tiles; the tail's and the empty group's rows: ones
        extra = (jnp.pad(pad_to(col_scale, 1, tn), ((0, 2), (0, 0)), constant_values=1),)
    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((rows, pl.cdiv(n, tn) * tn), lhs.dtype),
        grid=(group.shape[0], pl.cdiv(n, tn)),
        compiler_params=_TRITON,
        interpret=interpret,
    )(group, tile, starts, ends, lhs, rhs, *extra)
    return out[:m, :n]


def _tgmm_kernel(
    start_ref: Any, end_ref: Any, lhs_ref: Any, grad_ref: Any, out_ref: Any,
    *, tm: int, tk: int, tn: int,
) -> None:  # fmt: skip
    g, i, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    start, end = start_ref[g], end_ref[g]
    first = start // tm
    tiles = jnp.where(end > start, (end - 1) // tm - first + 1, 0)
    inner = pl.ds(pl.multiple_of(i * tk, tk), tk)
    cols = pl.ds(pl.multiple_of(j * tn, tn), tn)

    def step(s: jax.Array, acc: jax.Array) -> jax.Array:
        t = first + s
        rows = pl.ds(pl.multiple_of(t * tm, tm), tm)
        row = t * tm + jax.lax.broadcasted_iota(jnp.int32, (tm, 1), 0)
        mine = (row >= start) & (row < end)  # both operands: another group's rows may be inf
        a = jnp.where(mine, lhs_ref[rows, inner], 0)
        b = jnp.where(mine, grad_ref[rows, cols], 0)
        dims = (((0,), (0,)), ((), ()))
        return acc + jax.lax.dot_general(a, b, dims, preferred_element_type=F32)

    acc = jax.lax.fori_loop(jnp.int32(0), tiles.astype(jnp.int32), step, jnp.zeros((tk, tn), F32))
    out_ref[g, inner, cols] = acc.astype(out_ref.dtype)


def _tgmm(
    lhs: jax.Array, grad: jax.Array, sizes: jax.Array, tiling: tuple[int, int, int],
    interpret: bool,
) -> jax.Array:  # fmt: skip
    """Each group's ``lhs[rows].T @ grad[rows]``: ``(G, K, N)``, 0 for an empty group."""
    m, k = lhs.shape
    n, groups = grad.shape[1], sizes.shape[0]
    if m == 0 or k == 0 or n == 0:
        return jnp.zeros((groups, k, n), lhs.dtype)
    tm, tk, tn = tile_size(m, tiling[0]), tile_size(k, tiling[1]), tile_size(n, tiling[2])
    lhs = pad_to(pad_to(lhs, 0, tm), 1, tk)
    grad = pad_to(pad_to(grad, 0, tm), 1, tn)
    starts, ends = _bounds(sizes, m, lhs.shape[0])
    kernel = functools.partial(_tgmm_kernel, tm=tm, tk=tk, tn=tn)
    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((groups, lhs.shape[1], grad.shape[1]), lhs.dtype),
        grid=(groups, lhs.shape[1] // tk, grad.shape[1] // tn),
        compiler_params=_TRITON,
        interpret=interpret,
    )(starts, ends, lhs, grad)
    return out[:, :k, :n]


def scaled_grouped_matmul(
    lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, col_scale: jax.Array, *,
    tiling: tuple[int, int, int] | None = None, interpret: bool | None = None,
) -> jax.Array:  # fmt: skip
    """The grouped product of rows and narrow weights with per-channel scales, by the Pallas
    kernel: ``(lhs[r] @ rhs[g]) * col_scale[g]`` for the rows ``r`` of group ``g``, each weight
    tile converted to ``lhs``'s dtype inside the kernel (the narrow values are what it reads from
    memory) and the scales applied to the float32 sums; in ``lhs``'s dtype. A quantized mixture
    of experts' product (``nn.QuantizedArray`` weights, for inference); its rows' gradient is
    the transposed product of the dequantized weight.

    Args:
        lhs: ``(M, K)`` rows sorted by group, floating.
        rhs: ``(G, K, N)`` narrow values (int8, float8) or any real dtype.
        group_sizes: ``(G,)`` integer rows per group, as :func:`grouped_matmul`'s.
        col_scale: ``(G, N)`` floating, per group and output column.
        tiling: As :func:`grouped_matmul`'s.
        interpret: Pallas interpret mode; default: off GPUs.

    Raises:
        KernelError: as :func:`grouped_matmul` (one check), and for a ``col_scale`` that is not
            ``(G, N)`` floating.

    Example:
        >>> import jax.numpy as jnp
        >>> rhs = jnp.ones((2, 4, 5), jnp.int8)
        >>> out = scaled_grouped_matmul(jnp.ones((3, 4)), rhs, jnp.array([1, 2], jnp.int32),
        ...                             jnp.array([[0.5] * 5, [2.0] * 5]))
        >>> out[:, 0]
        Array([2., 8., 8.], dtype=float32)
    """
    _check(lhs, rhs, group_sizes, tiling, col_scale)
    return _scaled(lhs, rhs, group_sizes.astype(jnp.int32), col_scale, tiling, interpret)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _scaled(
    lhs: jax.Array, rhs: jax.Array, sizes: jax.Array, col_scale: jax.Array, tiling: Any,
    interpret: Any,
) -> jax.Array:  # fmt: skip
    interpret = jax.default_backend() != "gpu" if interpret is None else bool(interpret)
    return _gmm(lhs, rhs, sizes, tiling or GPU_TILING, interpret, False, col_scale.astype(F32))


def _scaled_fwd(
    lhs: jax.Array, rhs: jax.Array, sizes: jax.Array, col_scale: jax.Array, tiling: Any,
    interpret: Any,
) -> Any:  # fmt: skip
    return _scaled(lhs, rhs, sizes, col_scale, tiling, interpret), (rhs, sizes, col_scale)


def _scaled_bwd(tiling: Any, interpret: Any, res: Any, grad: jax.Array) -> Any:
    """The rows' gradient (the weights are not trained): ``grad`` times each group's
    dequantized weight, transposed."""
    rhs, sizes, col_scale = res
    weight = rhs.astype(grad.dtype) * col_scale[:, None, :].astype(grad.dtype)
    d_lhs = jax.lax.ragged_dot(grad, jnp.swapaxes(weight, 1, 2), sizes)
    return d_lhs, None, None, None


_scaled.defvjp(_scaled_fwd, _scaled_bwd)


def _product(
    how: tuple[str, tuple[int, int, int], bool], lhs: jax.Array, rhs: jax.Array,
    sizes: jax.Array, transpose_rhs: bool = False,
) -> jax.Array:  # fmt: skip
    """The forward or row-gradient product by ``how``'s implementation."""
    implementation, tiling, interpret = how
    if implementation == "pallas":
        return _gmm(lhs, rhs, sizes, tiling, interpret, transpose_rhs)
    if implementation == "mosaic":
        return _mosaic_gmm(lhs, rhs, sizes, tiling, transpose_rhs)
    m = lhs.shape[0]
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    lhs, rhs = _megablox_padded(lhs, tiling), _megablox_padded(rhs, tiling)
    with jax.numpy_dtype_promotion("standard"):  # megablox's metadata mixes bools and ints
        out = _megablox().gmm(
            lhs, rhs, sizes, lhs.dtype, tiling, transpose_rhs=transpose_rhs, interpret=interpret
        )
    past = (jnp.arange(m) >= jnp.sum(sizes))[:, None]  # megablox leaves these rows unwritten
    return jnp.where(past, jnp.zeros((), out.dtype), out[:m, :n])


def _weight_gradient(
    how: tuple[str, tuple[int, int, int], bool], lhs: jax.Array, grad: jax.Array,
    sizes: jax.Array,
) -> jax.Array:  # fmt: skip
    """Each group's ``lhs[rows].T @ grad[rows]`` by ``how``'s implementation."""
    implementation, tiling, interpret = how
    if implementation == "pallas":
        return _tgmm(lhs, grad, sizes, tiling, interpret)
    if implementation == "mosaic":
        return _mosaic_tgmm(lhs, grad, sizes, tiling)
    k, n = lhs.shape[1], grad.shape[1]
    lhs, grad = _megablox_padded(lhs, tiling), _megablox_padded(grad, tiling)
    with jax.numpy_dtype_promotion("standard"):
        out = _megablox().tgmm(
            lhs.swapaxes(0, 1), grad, sizes, lhs.dtype, tiling, interpret=interpret
        )
    return out[:, :k, :n]


def _megablox() -> Any:
    """JAX's Pallas TPU grouped matmul module (``gmm``, ``tgmm``), imported on first use: it
    costs a tenth of a second that nothing off TPUs needs."""
    try:  # the module, which the package's ``gmm`` (a function) shadows as an attribute
        return importlib.import_module("jax.experimental.pallas.ops.tpu.megablox.gmm")
    except ImportError as e:  # pragma: no cover - present in every JAX this library supports
        raise KernelError(
            "grouped_matmul: implementation='megablox' needs "
            "jax.experimental.pallas.ops.tpu.megablox, which this JAX lacks; use 'pallas'."
        ) from e


def _mosaic() -> tuple[Any, Any]:
    """JAX's Mosaic GPU grouped matmul modules (forward and transposed), imported on first use."""
    base = "jax.experimental.pallas.ops.gpu."
    try:
        return (
            importlib.import_module(base + "ragged_dot_mgpu"),
            importlib.import_module(base + "transposed_ragged_dot_mgpu"),
        )
    except ImportError as e:
        raise KernelError(
            "grouped_matmul: implementation='mosaic' needs jax.experimental.pallas.ops.gpu's "
            f"ragged_dot_mgpu and transposed_ragged_dot_mgpu, which this JAX lacks ({e}); "
            "use 'pallas'."
        ) from e


def _mosaic_blocks(tiling: tuple[int, int, int], columns: int) -> dict[str, int]:
    """Mosaic GPU's keywords for ``tiling``, ``MOSAIC_PIPELINE`` and an output of ``columns``:
    the column sweep is the largest up to ``MOSAIC_PIPELINE[1]`` that divides the column blocks
    (so that an odd width like 384 is not padded to a whole sweep)."""
    depth, sweep = MOSAIC_PIPELINE
    blocks = pl.cdiv(columns, tiling[2])
    sweep = max(d for d in range(1, sweep + 1) if blocks % d == 0)
    return dict(
        block_m=tiling[0], block_k=tiling[1], block_n=tiling[2], max_concurrent_steps=depth,
        grid_block_n=sweep,
    )  # fmt: skip


def _mosaic_gmm(
    lhs: jax.Array, rhs: jax.Array, sizes: jax.Array, tiling: tuple[int, int, int],
    transpose_rhs: bool,
) -> jax.Array:  # fmt: skip
    """The forward or row-gradient product by Mosaic GPU's ``ragged_dot``: whole blocks of the
    contraction and the columns (zero padding), and 0 in the rows past the groups, which it
    leaves unwritten."""
    m = lhs.shape[0]
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    blocks = _mosaic_blocks(tiling, n)
    lhs = pad_to(pad_to(lhs, 0, blocks["block_m"]), 1, blocks["block_k"])
    rhs = pad_to(rhs, 2 if transpose_rhs else 1, blocks["block_k"])
    rhs = pad_to(rhs, 1 if transpose_rhs else 2, blocks["block_n"])
    out = _mosaic()[0].ragged_dot(
        lhs, rhs, group_sizes=sizes, transpose_rhs=transpose_rhs, **blocks
    )
    past = (jnp.arange(m) >= jnp.sum(sizes))[:, None]
    return jnp.where(past, jnp.zeros((), out.dtype), out[:m, :n])


def _mosaic_tgmm(
    lhs: jax.Array, grad: jax.Array, sizes: jax.Array, tiling: tuple[int, int, int]
) -> jax.Array:
    """Each group's ``lhs[rows].T @ grad[rows]`` by Mosaic GPU's ``transposed_ragged_dot``
    (the rows are its contraction): whole blocks of the rows, ``K`` and ``N``."""
    k, n = lhs.shape[1], grad.shape[1]
    blocks = _mosaic_blocks(tiling, n)
    # Its blocks: the output rows (our K) by block_m, the rows (contracted) by block_k.
    lhs = pad_to(pad_to(lhs, 0, blocks["block_k"]), 1, blocks["block_m"])
    grad = pad_to(pad_to(grad, 0, blocks["block_k"]), 1, blocks["block_n"])
    out = _mosaic()[1].transposed_ragged_dot(lhs, grad, group_sizes=sizes, **blocks)
    return out[:, :k, :n]


def _megablox_padded(x: jax.Array, tiling: tuple[int, int, int]) -> jax.Array:
    """``x`` padded to megablox's whole tiles: rows to ``tiling[0]``, the other two dimensions
    (contracted in one product, not in another) to the larger of the others."""
    x = pad_to(x, x.ndim - 1, max(tiling[1:]))
    return pad_to(x, x.ndim - 2, tiling[0] if x.ndim == 2 else max(tiling[1:]))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _grouped(
    how: tuple[str, tuple[int, int, int], bool], lhs: jax.Array, rhs: jax.Array, sizes: jax.Array
) -> jax.Array:
    return _product(how, lhs, rhs, sizes)


def _grouped_fwd(
    how: tuple[str, tuple[int, int, int], bool], lhs: jax.Array, rhs: jax.Array, sizes: jax.Array
) -> tuple[jax.Array, tuple[jax.Array, jax.Array, jax.Array]]:
    return _product(how, lhs, rhs, sizes), (lhs, rhs, sizes)


def _grouped_bwd(
    how: tuple[str, tuple[int, int, int], bool], res: tuple[jax.Array, ...], grad: jax.Array
) -> tuple[jax.Array, jax.Array, None]:
    lhs, rhs, sizes = res
    d_lhs = _product(how, grad, rhs, sizes, transpose_rhs=True)
    return d_lhs, _weight_gradient(how, lhs, grad, sizes), None


_grouped.defvjp(_grouped_fwd, _grouped_bwd)
