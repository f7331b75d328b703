"""Quickstart: named arrays sharded by name on a (data=2, model=4) mesh of 8 simulated CPU devices."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax

jax.config.update("jax_num_cpu_devices", 8)

import jax.numpy as jnp

import namedaxes as na


def main() -> None:
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    x = na.named(jnp.arange(8 * 16, dtype=jnp.float32).reshape(8, 16), ("batch", "embed"))
    w = na.named(jnp.ones((16, 4)), ("embed", "mlp"))

    @na.named_jit
    def layer(x: na.NamedArray, w: na.NamedArray) -> na.NamedArray:
        h = jnp.einsum("be,em->bm", x.array, w.array)
        return na.named(jax.nn.relu(h), ("batch", "mlp"))

    with jax.set_mesh(mesh), na.axis_mapping({"batch": "data", "mlp": "model"}):
        x, w = na.shard((x, w))
        h = layer(x, w)

    print("mesh:", dict(mesh.shape))
    for name, arr in (("x", x), ("w", w), ("h", h)):
        shards = {s.data.shape for s in arr.array.addressable_shards}
        print(f"{name}: {arr}  spec={arr.array.sharding.spec}  per-device shape={shards.pop()}")


if __name__ == "__main__":
    main()
