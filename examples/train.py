"""Train a small MLP with named axes, sharded FSDP-style over 8 simulated CPU devices.

Run from the repository root:

    python examples/train.py

The main example (``examples/train_lm.py``) trains a language model from ``namedaxes.models``;
this one is the same machinery with nothing else around it: your own equinox module with
NamedArray parameters, two mappings and ``na.fsdp``, in a few seconds.

What it shows:
  * parameters and data as NamedArrays inside an equinox Module;
  * one axis mapping for compute, one for parameter storage, said once;
  * a memory plan (bytes per device) before anything runs;
  * a jitted training step whose parameters stay sharded 1/8 per device.
"""

import argparse
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax

jax.config.update("jax_num_cpu_devices", 8)

import equinox as eqx

import namedaxes as na

Batch = na.Axis("batch", 64)
Embed = na.Axis("embed", 32)
Mlp = na.Axis("mlp", 128)

# Where each logical axis lives. Parameters are stored sharded over `data` (FSDP); the batch is
# split over `data` during compute, and the hidden `mlp` axis over `model` in both.
PARAMS = {"embed": "data", "mlp": "model"}
COMPUTE = {"batch": "data", "mlp": "model"}


class Mlp2(eqx.Module):
    """Two dense layers: embed -> mlp -> embed, with a residual connection."""

    w_in: na.NamedArray
    w_out: na.NamedArray

    def __init__(self, key: jax.Array):
        k1, k2 = jax.random.split(key)
        self.w_in = na.random.normal(k1, (Embed, Mlp)) * Embed.size**-0.5
        self.w_out = na.random.normal(k2, (Mlp, Embed)) * Mlp.size**-0.5

    def __call__(self, x: na.NamedArray) -> na.NamedArray:
        h = na.gelu(na.dot(x, self.w_in, axis="embed"))
        h = na.auto_sharded(h)  # batch -> data, mlp -> model under the compute mapping
        return x + na.dot(h, self.w_out, axis="mlp")


def loss_fn(model: Mlp2, x: na.NamedArray, y: na.NamedArray) -> jax.Array:
    err = model(x) - y
    return na.mean(err * err).scalar()


@na.fsdp(parameter_mapping=PARAMS, compute_mapping=COMPUTE)
def train_step(model: Mlp2, x: na.NamedArray, y: na.NamedArray, lr: float = 0.1):
    loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
    model = jax.tree.map(lambda p, g: p - lr * g, model, grads)
    return model, loss


def main(argv: list[str] | None = None) -> None:
    # No settings: the parser gives --help (which would otherwise train) and refuses unknown flags.
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args(argv)
    mesh = na.mesh.create_mesh((2, 4), ("data", "model"))
    print(f"mesh: {dict(mesh.shape)} on {mesh.devices.size} devices")

    with jax.set_mesh(mesh):
        # Plan before allocating: the same analysis works on eval_shape trees of any size.
        abstract = eqx.filter_eval_shape(Mlp2, jax.random.key(0))
        print(na.analysis.memory_report(abstract, PARAMS, mesh))

        model = na.shard(Mlp2(jax.random.key(0)), PARAMS)
        kx, ky = jax.random.split(jax.random.key(1))
        x = na.random.normal(kx, (Batch, Embed))
        target = na.tanh(x * 2.0)

        for step in range(20):
            model, loss = train_step(model, x, target)
            if step % 5 == 0 or step == 19:
                print(f"step {step:2d}  loss {float(loss):.4f}")

    w = model.w_in.array
    print(
        f"w_in spec {w.sharding.spec}, per-device shape {w.addressable_shards[0].data.shape} "
        f"of {w.shape}"
    )


if __name__ == "__main__":
    main()
