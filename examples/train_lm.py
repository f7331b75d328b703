"""Train a small GPT-style language model with namedaxes.nn on 8 simulated CPU devices.

Run from the repository root (the README's first command does):

    python examples/train_lm.py              # Auto mesh axes
    python examples/train_lm.py --explicit   # the same code on an Explicit mesh

The task: each sequence is 8 random tokens followed by the same 8 tokens. The first half cannot be
predicted, so the loss counts only the second half (`cross_entropy(..., where=...)`); a model that
learns to copy drives it from ln(16) ~ 2.8 towards 0.

What it shows:
  * a transformer written with named axes from `namedaxes.nn` (Embedding with a tied head,
    LayerNorm, Attention, MLP, Stacked layers folded over a `layer` axis);
  * FSDP + tensor parallelism said once: parameters are stored with `embed` split over `data`,
    computation splits `batch` over `data`, and `heads`/`mlp` live on `model` in both;
  * a memory report before anything is allocated, optax AdamW, and the per-device shapes at the end.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax

jax.config.update("jax_num_cpu_devices", 8)

import argparse
import time
from dataclasses import dataclass

import equinox as eqx
import optax
from jax.sharding import AxisType
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

import namedaxes as na

# Where each logical axis lives, said once. Tensor parallelism: attention heads and MLP hidden units
# on `model`. FSDP: parameters keep their `embed` axis split over `data`; during compute the batch
# takes `data` instead, so each layer's weights are gathered when it runs.
TENSOR_PARALLEL = {"heads": "model", "mlp": "model"}
PARAMS = {"embed": "data", **TENSOR_PARALLEL}
COMPUTE = {"batch": "data", **TENSOR_PARALLEL}


@dataclass(frozen=True)
class Config:
    vocab: int = 16
    seq: int = 16  # 8 random tokens, then the same 8 again
    embed: int = 64
    heads: int = 4
    head_dim: int = 16
    mlp: int = 256
    layers: int = 2
    batch: int = 32
    remat: bool | str = False  # Stacked's gradient_checkpointing: False, "dots", "carry", ...

    @property
    def axes(self):
        return (
            na.Axis("vocab", self.vocab),
            na.Axis("position", self.seq),
            na.Axis("embed", self.embed),
            na.Axis("heads", self.heads),
            na.Axis("head_dim", self.head_dim),
            na.Axis("mlp", self.mlp),
        )


class Block(eqx.Module):
    """Pre-norm transformer block: x + attention(norm(x)), then x + mlp(norm(x))."""

    ln1: na.nn.LayerNorm
    attn: na.nn.Attention
    ln2: na.nn.LayerNorm
    mlp: na.nn.MLP

    def __init__(self, cfg: Config, *, key):
        _, _, Embed, Heads, HeadDim, Mlp = cfg.axes
        k_attn, k_mlp = jax.random.split(key)
        self.ln1 = na.nn.LayerNorm(Embed)
        self.attn = na.nn.Attention(Embed, Heads, HeadDim, key=k_attn)
        self.ln2 = na.nn.LayerNorm(Embed)
        self.mlp = na.nn.MLP(Embed, Mlp, key=k_mlp)

    def __call__(self, x: na.NamedArray) -> na.NamedArray:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(eqx.Module):
    """Token and position embeddings, blocks stacked on a `layer` axis, a tied output head."""

    tokens: na.nn.Embedding
    positions: na.NamedArray  # (position, embed)
    blocks: na.nn.Stacked[Block]
    ln_f: na.nn.LayerNorm

    def __init__(self, cfg: Config, *, key):
        Vocab, Pos, Embed, *_ = cfg.axes
        k_tok, k_pos, k_blocks = jax.random.split(key, 3)
        self.tokens = na.nn.Embedding(Vocab, Embed, key=k_tok)
        self.positions = na.random.normal(k_pos, (Pos, Embed)) * Embed.size**-0.5
        Layer = na.Axis("layer", cfg.layers)
        self.blocks = na.nn.Stacked(
            Layer, lambda k: Block(cfg, key=k), key=k_blocks, gradient_checkpointing=cfg.remat
        )
        self.ln_f = na.nn.LayerNorm(Embed)

    def __call__(self, ids: na.NamedArray) -> na.NamedArray:
        """Logits (batch, position, vocab) for token ids (batch, position)."""
        positions = na.nn.current_precision().cast_to_compute(self.positions)  # no-op without one
        h = self.tokens(ids) + na.auto_sharded(positions)
        h = self.blocks(h)
        return self.tokens.unembed(self.ln_f(h))


def loss_fn(model: GPT, batch: na.NamedArray) -> jax.Array:
    """Next-token cross-entropy, counted only where the target is a copy (it was seen before)."""
    logits = model(batch)["position", :-1]  # the prediction for token t + 1 ...
    targets = batch["position", 1:]  # ... is compared with token t + 1
    Pos = targets.resolve_axis("position")
    copied = na.arange(Pos, start=1) >= (Pos.size + 1) // 2  # target index >= seq / 2
    return na.nn.cross_entropy(logits, "vocab", targets, where=copied).scalar()


def make_optimizer() -> optax.GradientTransformation:
    return optax.adamw(3e-3, weight_decay=0.01)


OPTIMIZER = make_optimizer()


@na.fsdp(parameter_mapping=PARAMS, compute_mapping=COMPUTE)
def train_step(model: GPT, opt_state, batch: na.NamedArray):
    loss, grads = eqx.filter_value_and_grad(loss_fn)(model, batch)
    updates, opt_state = OPTIMIZER.update(grads, opt_state, model)
    return eqx.apply_updates(model, updates), opt_state, loss


def make_batch(key: jax.Array, cfg: Config) -> na.NamedArray:
    half = na.random.randint(key, {"batch": cfg.batch, "position": cfg.seq // 2}, 0, cfg.vocab)
    return na.concatenate("position", [half, half])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--explicit", action="store_true", help="use an Explicit mesh (sharding in types)"
    )
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument(
        "--checkpoint-dir",
        default=None,
        help="save model and optimizer state there and resume from its latest step "
        "(needs the [checkpoint] extra)",
    )
    parser.add_argument("--checkpoint-every", type=int, default=100)
    args = parser.parse_args()

    console = Console(width=120)
    kind = AxisType.Explicit if args.explicit else AxisType.Auto
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(kind,) * 2)
    cfg = Config()
    console.print(f"mesh: {dict(mesh.shape)} ({kind.name} axes) on {mesh.devices.size} devices")
    console.print(f"parameters stored by {PARAMS}\ncomputed under     {COMPUTE}")

    with jax.set_mesh(mesh):
        # Plan before allocating: the report works on the abstract model.
        abstract = eqx.filter_eval_shape(GPT, cfg, key=jax.random.key(0))
        console.print(
            str(na.analysis.memory_report(abstract, PARAMS, mesh, top=6)), highlight=False
        )

        # Initialise directly in the parameter layout (no device ever holds the whole model).
        init = na.named_jit(lambda key: GPT(cfg, key=key), out_axis_resources=PARAMS)
        model = init(jax.random.key(0))
        opt_state = na.named_jit(OPTIMIZER.init, out_axis_resources=PARAMS)(model)

        start, manager = 0, None
        if args.checkpoint_dir:
            from namedaxes.checkpoint import CheckpointManager

            manager = CheckpointManager(args.checkpoint_dir, max_to_keep=3)
            last_step = manager.latest_step()
            if last_step is not None:
                # Restored straight into the parameter layout of this run's mesh, whatever the
                # mesh or mapping it was saved from.
                state = manager.restore({"model": model, "opt_state": opt_state}, mapping=PARAMS)
                model, opt_state, start = state["model"], state["opt_state"], last_step + 1
                console.print(f"resumed from step {last_step} in {args.checkpoint_dir}")
        key = jax.random.fold_in(jax.random.key(1), start)
        columns = (
            TextColumn("[bold]train"),
            BarColumn(),
            TextColumn("step {task.completed}/{task.total}"),
            TextColumn("loss {task.fields[loss]:.4f}"),
            TextColumn("{task.fields[ms]:.1f} ms/step"),
            TimeElapsedColumn(),
        )
        first = last = None
        with Progress(*columns, console=console) as progress:
            task = progress.add_task(
                "train", total=args.steps, completed=start, loss=float("nan"), ms=0.0
            )
            for step in range(start, args.steps):
                key, k = jax.random.split(key)
                batch = make_batch(k, cfg)
                t0 = time.perf_counter()
                model, opt_state, loss = train_step(model, opt_state, batch)
                loss = float(loss)  # waits for the step
                ms = (time.perf_counter() - t0) * 1e3
                first = loss if first is None else first
                last = loss
                progress.update(task, advance=1, loss=loss, ms=ms)
                if manager is not None and (
                    (step + 1) % args.checkpoint_every == 0 or step + 1 == args.steps
                ):
                    manager.save(step, {"model": model, "opt_state": opt_state})  # asynchronous
        if manager is not None:
            manager.close()  # waits for the last save

    if first is None:
        console.print(f"nothing to do: the checkpoint is already at step {args.steps}")
        return
    console.print(f"loss {first:.4f} -> {last:.4f}")
    console.print("final parameters (global shape -> shape held by each device):")
    for name, w in (
        ("tokens.weight", model.tokens.weight),
        ("blocks.stacked.attn.q_proj.weight", model.blocks.stacked.attn.q_proj.weight),
        ("blocks.stacked.mlp.up.weight", model.blocks.stacked.mlp.up.weight),
        ("blocks.stacked.mlp.down.weight", model.blocks.stacked.mlp.down.weight),
    ):
        shard = w.array.addressable_shards[0].data.shape
        axes = ", ".join(f"{a.name}={a.size}" for a in w.axes)
        line = f"  {name:34s} ({axes}) -> {shard}  {w.array.sharding.spec}"
        console.print(line, highlight=False, soft_wrap=True)


if __name__ == "__main__":
    main()
