"""einsum's output-only and unordered forms, dot(out_axes=...), dot(axis=None): oracles, errors,
Auto/Explicit sharding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import spec_of
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import namedaxes as na

RNG = np.random.default_rng(3)
X = jnp.asarray(RNG.normal(size=(2, 3, 4)).astype(np.float32))  # (batch, seq, embed)
W = jnp.asarray(RNG.normal(size=(4, 5)).astype(np.float32))  # (embed, mlp)


AXES = {
    "out_only": ("mlp", "batch"),
    "out_only_t": ("batch", "mlp"),
    "out_only_keep": ("mlp", "batch", "seq", "embed"),
    "unordered": ("batch", "seq", "mlp"),
    "unordered_out": ("mlp", "batch"),
    "unordered_dots": ("mlp", "batch", "seq"),
    "dot_out_axes": ("mlp", "batch", "seq"),
    "dot_out_axes_full": ("seq", "mlp", "batch"),
    "dot_none": ("batch", "seq", "embed", "mlp"),
}


@pytest.fixture(scope="module")
def results():
    @jax.jit
    def run(a, w):
        x = na.named(a, ("batch", "seq", "embed"))
        xt = na.named(jnp.transpose(a, (2, 0, 1)), ("embed", "batch", "seq"))
        k = na.named(w, ("embed", "mlp"))
        return {
            "out_only": (na.einsum("-> mlp batch", x, k), jnp.einsum("bse,em->mb", a, w)),
            "out_only_t": (na.einsum("-> batch mlp", xt, k), jnp.einsum("bse,em->bm", a, w)),
            "out_only_keep": (na.einsum("-> mlp ...", x, k), jnp.einsum("bse,em->mbse", a, w)),
            "unordered": (na.einsum("{embed} -> ", x, k), jnp.einsum("bse,em->bsm", a, w)),
            "unordered_out": (
                na.einsum("{embed seq mlp} -> mlp", xt, k),
                jnp.einsum("bse,em->mb", a, w),
            ),
            "unordered_dots": (
                na.einsum("{embed} -> mlp ... ", x, k),
                jnp.einsum("bse,em->mbs", a, w),
            ),
            "dot_out_axes": (
                na.dot(x, k, axis="embed", out_axes=("mlp", ...)),
                jnp.einsum("bse,em->mbs", a, w),
            ),
            "dot_out_axes_full": (
                na.dot(xt, k, axis="embed", out_axes=("seq", "mlp", "batch")),
                jnp.einsum("bse,em->smb", a, w),
            ),
            "dot_none": (na.dot(x, k, axis=None), jnp.einsum("bse,em->bsem", a, w)),
        }

    return run(X, W)


@pytest.mark.parametrize("name", ["out_only", "out_only_t", "out_only_keep", "unordered", "unordered_out",
                                  "unordered_dots", "dot_out_axes", "dot_out_axes_full", "dot_none"])  # fmt: skip
def test_matches_jnp_einsum(results, name):
    got, expected = results[name]
    assert got.axis_names == AXES[name]
    np.testing.assert_allclose(np.asarray(got.array), np.asarray(expected), rtol=1e-5, atol=1e-5)


def test_errors():
    x = na.named(X, ("batch", "seq", "embed"))
    k = na.named(W, ("embed", "mlp"))
    with pytest.raises(
        na.AxisNotFoundError,
        match=r"einsum\(\) equation '\{embd\} -> mlp' names axis 'embd', which no operand has\. Available axes: 'batch', 'seq', 'embed', 'mlp'",
    ):
        na.einsum("{embd} -> mlp", x, k)
    with pytest.raises(na.AxisError, match=r"the unordered form lists axes in one pair of braces"):
        na.einsum("{embed}, {mlp} -> batch", x, k)
    with pytest.raises(na.AxisError, match=r"'\.\.\.' has no meaning inside braces"):
        na.einsum("{embed ...} -> batch", x, k)
    with pytest.raises(
        na.AxisNotFoundError,
        match=r"einsum\(\) result spec 'zz' names axis 'zz', which no operand has",
    ):
        na.einsum("-> zz", x, k)
    with pytest.raises(
        na.AxisError,
        match=r"dot\(\): out_axes \('mlp'\) misses result axes 'batch', 'seq'; list them or add \.\.\.",
    ):
        na.dot(x, k, axis="embed", out_axes=("mlp",))
    with pytest.raises(
        na.AxisNotFoundError,
        match=r"dot\(\): out_axes names 'embed', which the result does not have \(it is contracted\)",
    ):
        na.dot(x, k, axis="embed", out_axes=("embed", ...))
    with pytest.raises(na.AxisError, match=r"dot\(\): out_axes has more than one '\.\.\.'"):
        na.dot(x, k, axis="embed", out_axes=(..., "mlp", ...))
    with pytest.raises(na.DuplicateAxisError, match="Duplicate axis names 'mlp'"):
        na.dot(x, k, axis="embed", out_axes=("mlp", "mlp", ...))


def test_sharded(mesh_2x4):
    a = jax.device_put(X, NamedSharding(mesh_2x4, P("data", None, "model")))
    w = jax.device_put(W, NamedSharding(mesh_2x4, P("model", None)))
    with jax.set_mesh(mesh_2x4):

        @jax.jit
        def run(a, w):
            x = na.named(a, ("batch", "seq", "embed"))
            k = na.named(w, ("embed", "mlp"))
            return na.einsum("-> mlp batch", x, k), na.dot(
                x, k, axis="embed", out_axes=("mlp", ...)
            )

        e, d = run(a, w)
    # The contracted, sharded embed axis is summed over 'model'; batch keeps 'data' wherever it goes.
    assert spec_of(e) == P(None, "data")
    assert spec_of(d) == P(None, "data")
    np.testing.assert_allclose(e.array, jnp.einsum("bse,em->mb", X, W), rtol=1e-5, atol=1e-5)
