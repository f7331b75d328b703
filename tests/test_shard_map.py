"""shard_map by name and logical-name collectives: local sizes, oracles against plain jax.numpy,
output assembly by name, compiled collectives, errors, on Auto and Explicit meshes."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import shard_shapes, spec_of
from jax.sharding import PartitionSpec as P

import namedaxes as na
from namedaxes import Axis

A = jnp.arange(8 * 12, dtype=jnp.float32).reshape(8, 12)  # (batch, embed)
RULES = {"batch": "data", "embed": "model"}


def test_body_sees_local_sizes_and_collectives_match_jnp(mesh_2x4):
    seen = {}

    def body(x):
        seen["x"] = x.axes
        total = na.psum(x.sum("embed"), "embed")  # per-batch sum over the whole embed axis
        mean = na.pmean(x.mean(("batch", "embed")), ("batch", "embed"))
        biggest = na.pmax(x.max("batch"), "batch")
        smallest = na.pmin(x.min("batch"), "batch")
        full = na.all_gather(x, "batch")
        return total, mean, biggest, smallest, full

    with jax.set_mesh(mesh_2x4), na.axis_mapping(RULES):
        x = na.shard(na.named(A, ("batch", "embed")))
        total, mean, biggest, smallest, full = jax.jit(na.shard_map(body))(x)
    assert seen["x"] == (Axis("batch", 4), Axis("embed", 3))
    np.testing.assert_allclose(total.array, A.sum(1))
    np.testing.assert_allclose(mean.item(), A.mean())
    np.testing.assert_array_equal(biggest.array, A.max(0))
    np.testing.assert_array_equal(smallest.array, A.min(0))
    np.testing.assert_array_equal(full.array, A)
    # Assembled by name: batch keeps 'data' where it has the argument's local size; embed keeps
    # 'model'; the all-gathered batch axis (full local size) is replicated.
    assert total.axes == (Axis("batch", 8),) and spec_of(total) == P("data")
    assert spec_of(biggest) == P("model") and spec_of(full) == P(None, "model")
    assert mean.axes == ()


def test_ring_shift_psum_scatter_axis_index(mesh_2x4):
    def body(x):
        shifted = na.ppermute(x, "embed", shift=1)  # block i goes to block i + 1
        back = na.ppermute(shifted, "embed", perm=[(i, (i - 1) % 4) for i in range(4)])
        scattered = na.psum_scatter(na.all_gather(x, "batch"), "batch")  # gather, then sum back
        where = x * 0 + na.axis_index("embed").astype(jnp.float32)
        return shifted, back, scattered, where, x * na.shard_count("embed")

    with jax.set_mesh(mesh_2x4), na.axis_mapping(RULES):
        x = na.shard(na.named(A, ("batch", "embed")))
        f = jax.jit(na.shard_map(body))
        shifted, back, scattered, where, scaled = f(x)
        hlo = f.lower(x).compile().as_text()
    np.testing.assert_array_equal(shifted.array, jnp.roll(A, 3, axis=1))
    np.testing.assert_array_equal(back.array, A)
    np.testing.assert_array_equal(scattered.array, 2 * A)  # two data shards each contributed A
    np.testing.assert_array_equal(
        where.array, jnp.repeat(jnp.arange(4.0), 3)[None, :] * jnp.ones((8, 1))
    )
    np.testing.assert_array_equal(scaled.array, 4 * A)
    assert "collective-permute" in hlo and "all-gather" in hlo and "reduce-scatter" in hlo
    assert spec_of(shifted) == P("data", "model")


def test_all_to_all_transposes_blocks_between_devices(mesh_2x4):
    """all_to_all over 'embed' (model=4): block j of device i's split axis lands on device j as
    block i of its concat axis, as jax.lax.all_to_all; the same axis for both keeps its size."""

    def body(x):
        copies = jnp.broadcast_to(x.array[:, :, None], (*x.array.shape, 4))
        tagged = na.named(copies, ("batch", "embed", "dest"))  # 4 copies of the local block
        gathered = na.all_to_all(tagged, "embed", split="dest", concat="embed")
        back = na.all_to_all(gathered, "embed", split="embed", concat="dest")
        same = na.all_to_all(tagged, "embed", split="dest", concat="dest")
        return gathered, back, same

    with jax.set_mesh(mesh_2x4), na.axis_mapping(RULES):
        x = na.shard(na.named(A, ("batch", "embed")))
        specs = (P("data"), P("data", "model"), P("data"))
        f = jax.jit(na.shard_map(body, out_specs=specs, check_vma=False))
        gathered, back, same = f(x)
        hlo = f.lower(x).compile().as_text()
        with pytest.raises(
            na.AxisSizeError,
            match=r"all_to_all\(\): axis 'embed' of NamedArray\(batch=4, embed=3\) does not "
            r"split into 2 blocks \(one per device of 'batch'\)",
        ):
            na.shard_map(lambda y: na.all_to_all(y, "batch", split="embed", concat="embed"))(x)
    # Device j got block j of every device's copies: each device's embed block, in order.
    assert gathered.axes == (Axis("batch", 8), Axis("embed", 12), Axis("dest", 1))
    np.testing.assert_array_equal(gathered.array[..., 0], A)
    np.testing.assert_array_equal(back.array, jnp.broadcast_to(A[..., None], (8, 12, 4)))
    # split == concat: block i of the result came from device i (its embed block i).
    assert same.axes == (Axis("batch", 8), Axis("embed", 3), Axis("dest", 4))
    np.testing.assert_array_equal(same.array, A.reshape(8, 4, 3).transpose(0, 2, 1))
    assert "all-to-all" in hlo


def test_eager_plain_arguments_and_static_values(mesh_2x4):
    def body(x, bias, scale):
        return x * scale + bias  # bias is a replicated plain array, scale a Python float

    with jax.set_mesh(mesh_2x4):
        x = na.named(A, ("batch", "embed"))
        out = na.shard_map(body, mapping=RULES)(x, jnp.float32(1.0), 2.0)
    np.testing.assert_array_equal(out.array, A * 2.0 + 1.0)
    assert spec_of(out) == P("data", "model")


def test_mapping_and_spec_overrides(mesh_2x4):
    with jax.set_mesh(mesh_2x4):
        x = na.named(A, ("batch", "embed"))
        # batch only: embed is whole on every device.
        shapes = {}

        def body(x):
            shapes["x"] = x.shape
            return x

        out = jax.jit(na.shard_map(body, mapping={"batch": ("data", "model")}))(x)
        assert shapes["x"] == {"batch": 1, "embed": 12}
        assert spec_of(out) == P(("data", "model"))
        out = jax.jit(
            na.shard_map(lambda x: x, in_specs=(P(None, "model"),), out_specs=P(None, "model"))
        )(x)
        assert spec_of(out) == P(None, "model")
    np.testing.assert_array_equal(out.array, A)


def test_errors(mesh_2x4):
    x = na.named(A, ("batch", "embed"))
    with pytest.raises(
        na.MeshError, match=r"shard_map\(\) needs a mesh: pass mesh=, or call it under"
    ):
        na.shard_map(lambda x: x, mapping=RULES)(x)
    with jax.set_mesh(mesh_2x4):
        with pytest.raises(
            na.ShardingError,
            match=r"shard_map\(\) needs a mapping to split its NamedArray arguments",
        ):
            na.shard_map(lambda x: x)(x)
        with na.axis_mapping(RULES):
            with pytest.raises(
                na.AxisError,
                match=r"psum\(\): logical axis 'heads' is not an axis of any shard_map argument.*Known axes: 'batch', 'embed'",
            ):
                na.shard_map(lambda x: na.psum(x, "heads"))(x)
            with pytest.raises(
                na.ShardingError,
                match=r"shard_map\(\): an output is assembled as replicated over some mesh axes, but its value may differ",
            ):
                jax.jit(na.shard_map(lambda x: x.sum("embed")))(x)  # forgot the psum
            with pytest.raises(
                na.NamedTypeError,
                match=r"ppermute\(\) takes exactly one of perm= \(src, dst\) pairs and shift=",
            ):
                na.shard_map(lambda x: na.ppermute(x, "embed"))(x)
            with pytest.raises(
                na.AxisError, match=r"ppermute\(\): pairs \[\(0, 9\)\] are outside the 4 blocks"
            ):
                na.shard_map(lambda x: na.ppermute(x, "embed", perm=[(0, 9)]))(x)
            with pytest.raises(
                na.AxisNotFoundError, match=r"Axis 'batch' not found in NamedArray\(embed=3\)"
            ):
                na.shard_map(lambda x: na.all_gather(x["batch", 0], "batch"))(x)
    with pytest.raises(
        na.ShardingError,
        match=r"psum\(\) by logical axis name only works inside namedaxes\.shard_map",
    ):
        na.psum(x, "batch")


def test_repeated_calls_reuse_one_trace(mesh_2x4):
    traces = []

    def body(x, scale):
        traces.append(scale)
        return x * scale

    with jax.set_mesh(mesh_2x4), na.axis_mapping(RULES):
        f = na.shard_map(body)
        x = na.shard(na.named(A, ("batch", "embed")))
        first = f(x, 2.0)
        f(x, 2.0)
        assert len(traces) == 2  # one probe trace for the output axes, one real trace
        third = f(x, 3.0)  # another static value is another signature
    assert len(traces) == 4
    np.testing.assert_array_equal(first.array, 2 * A)
    np.testing.assert_array_equal(third.array, 3 * A)


class _Linear(eqx.Module):
    weight: jax.Array = na.field(axis_names=("embed", "mlp"))
    bias: jax.Array  # no names: enters replicated
    scale: float = 2.0  # a Python value: passed through


W = jnp.arange(4 * 8, dtype=jnp.float32).reshape(4, 8)  # (embed, mlp)
FIELD_RULES = {"embed": "data", "mlp": "model"}


def test_field_arrays_are_split_and_assembled_by_name(mesh_2x4):
    """A module's field(axis_names=...) array goes through the one plan, as a NamedArray does: the
    body sees its block, and it comes back placed as pspec_for says."""
    seen = {}

    def body(m):
        seen["weight"], seen["bias"] = m.weight.shape, m.bias.shape
        return m

    with jax.set_mesh(mesh_2x4):
        module = _Linear(W, jnp.ones(3))
        out = na.shard_map(body, mapping=FIELD_RULES)(module)
        planned = na.pspec_for(module, FIELD_RULES).weight
    assert seen == {"weight": (2, 2), "bias": (3,)}
    assert spec_of(out.weight) == planned == P("data", "model")
    assert shard_shapes(out.weight) == [(2, 2)] and spec_of(out.bias) == P()
    np.testing.assert_array_equal(out.weight, W)
    assert out.scale == 2.0


def test_collectives_by_field_axis_names(mesh_2x4):
    """psum over a field's axis sums over the mesh axes that axis is placed on; an output
    NamedArray axis with a field's local size is assembled as that field."""

    def body(x, m):
        partial = x.array @ m.weight  # this device's embed block of the contraction
        y = na.psum(na.named(partial, ("rows", "mlp")), "embed")
        return y, na.psum(m.weight.sum(), ("embed", "mlp")), na.shard_count("mlp")

    x = na.named(jnp.arange(12, dtype=jnp.float32).reshape(3, 4), ("rows", "embed"))
    with jax.set_mesh(mesh_2x4), na.axis_mapping(FIELD_RULES):
        y, total, count = jax.jit(na.shard_map(body))(x, _Linear(W, jnp.ones(3)))
    np.testing.assert_allclose(y.array, x.array @ W)
    assert y.axes == (Axis("rows", 3), Axis("mlp", 8)) and spec_of(y) == P(None, "model")
    np.testing.assert_allclose(total, W.sum())
    assert count == 4


def test_mapping_mesh_axis_typo_is_an_error_without_named_arguments(mesh_2x4):
    with jax.set_mesh(mesh_2x4):
        with pytest.raises(
            na.ShardingError,
            match=r"The axis mapping names mesh axis 'dta' \(used by logical axis 'batch'\), but "
            r"Mesh\(data=2, model=4\) has axes 'data', 'model'",
        ):
            na.shard_map(lambda a: a * 2, mapping={"batch": "dta"})(jnp.ones(8))


@pytest.mark.parametrize("entry", [("data", "model"), ("model", "data")])
def test_ppermute_numbers_blocks_as_axis_index_does(mesh_2x4, entry):
    """A name over two mesh axes in either listed order: shift=1 moves block i (as axis_index and
    the spec number it, first listed axis major) to block i + 1."""
    x = na.named(jnp.arange(8.0), "batch")
    with jax.set_mesh(mesh_2x4), na.axis_mapping({"batch": entry}):

        def body(x):
            return na.ppermute(x, "batch", shift=1), x * 0 + na.axis_index("batch").astype(x.dtype)

        shifted, index = na.shard_map(body)(na.shard(x))
    np.testing.assert_array_equal(np.asarray(index.array), np.arange(8.0))
    np.testing.assert_array_equal(np.asarray(shifted.array), np.roll(np.arange(8.0), 1))
