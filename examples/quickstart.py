"""Quickstart: build named arrays and compute with them on 8 simulated CPU devices."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax

jax.config.update("jax_num_cpu_devices", 8)

import jax.numpy as jnp

import namedaxes as na


def main() -> None:
    x = na.named(jnp.arange(8 * 4, dtype=jnp.float32).reshape(8, 4), ("batch", "embed"))
    print("x:", x)
    print("devices:", len(jax.devices()))


if __name__ == "__main__":
    main()
