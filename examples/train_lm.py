"""Train a llama-style language model on real text, on the hardware JAX finds.

Run from the repository root (the README's first command does):

    python examples/train_lm.py                    # the standard library's source, 8 CPU devices
    python examples/train_lm.py --explicit         # the same code on an Explicit mesh
    python examples/train_lm.py --size 1b          # presets small, 100m (GPU/TPU default), 1b
    python examples/train_lm.py --mesh data=2,model=4 --data ~/text --tokenizer tokenizer.json
    python examples/train_lm.py --checkpoint-dir ckpt   # save, and resume on any mesh
    python examples/train_lm.py --save-hf out           # a folder transformers loads
    python examples/train_lm.py --precision params=float32,compute=bfloat16,matmul=float8

The text is this Python's standard library source (or ``--data``), split into training and
held-out files, tokenized by a byte-level BPE trained on the training split and cached
(``examples/text_data.py``). The model is ``namedaxes.models.Transformer`` with a Llama config
(RMSNorm, rotary embeddings, SwiGLU, grouped-query attention), so what it trains is exported with
``save_hf`` and sampled with ``generate``. It must beat the unigram entropy of the held-out tokens
(the loss of the best model that ignores context); the last line is ``held-out loss: X.XXX``.

What it shows:
  * FSDP + tensor parallelism said once, as two mappings: parameters are stored with ``embed``
    split over ``data``; computation splits ``batch`` over ``data``; ``heads``, ``mlp`` and
    ``vocab`` live on ``model`` in both. ``na.fsdp`` compiles the step with them;
  * the hardware it finds: every accelerator JAX sees (parameters float32, compute bfloat16), or
    8 simulated CPU devices as (data=2, model=4);
  * a plan (bytes per device, parameter count) before anything is allocated;
  * batches each process reads only its rows of, fixed by (seed, step), so a run resumed from a
    checkpoint (on any mesh) sees the same data; optax AdamW; held-out loss as it trains;
  * a progress bar with loss, tokens/s and, on accelerators, model FLOPs utilization.

Without ``--size`` it trains the preset made for the hardware (``default_size``): ``small`` (656k
parameters, 400 steps) on CPUs, ``100m`` (101M parameters, 2000 steps of 16k tokens: a minute or
two on an H100) on GPUs and TPUs. Programs that take over a second to compile (the steps, the
initialization, ``generate``'s) are kept in JAX's persistent compilation cache (``--compile-cache``,
``examples/caches.py``), so a second run with the same shapes reads them back.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import text_data
from caches import add_compile_cache_option, use_compile_cache
from jax.sharding import AxisType
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

import namedaxes as na
from namedaxes import models

# Where each logical axis lives, said once. Tensor parallelism: attention heads, MLP hidden units
# and the vocabulary on `model`. FSDP: parameters keep their `embed` axis split over `data`; during
# compute the batch takes `data` instead, so each layer's weights are gathered when it runs.
# (Keys and values have `kv_heads`, fewer than the heads: unmapped, each device keeps them whole.)
TENSOR_PARALLEL = {"heads": "model", "mlp": "model", "vocab": "model"}
PARAMS = {"embed": "data", **TENSOR_PARALLEL}
COMPUTE = {"batch": "data", **TENSOR_PARALLEL}
# Pipeline parallelism, on a mesh with a `stage` axis (--mesh stage=2,...): the stacked layers are
# stored split into stages over it, and each step runs them as a pipeline of microbatches.
PIPELINE = {"layer": "stage"}


def mappings(mesh: jax.sharding.Mesh) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(PARAMS, COMPUTE)``, each with ``PIPELINE`` when ``mesh`` has more than one stage."""
    if mesh.shape.get("stage", 1) == 1:
        return PARAMS, COMPUTE
    return {**PARAMS, **PIPELINE}, {**COMPUTE, **PIPELINE}


SAMPLING = TENSOR_PARALLEL  # a few prompts: every device sees them all (decoding is not pipelined)
MIXED = na.nn.Precision(param=jnp.float32, compute=jnp.bfloat16)


@dataclass(frozen=True)
class Size:
    """A model and how long to train it."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    vocab: int  # of the BPE trained on the data (a given --tokenizer brings its own)
    seq: int  # tokens per row
    batch: int  # rows per step
    steps: int
    lr: float
    eval_every: int
    remat: str = "none"  # what the backward pass keeps of each layer (nn.Stacked's policies)


SIZES = {
    # The CPU default, 800k tokens: 1 to 2 minutes on 2 CPU cores as 8 simulated devices.
    "small": Size(hidden=128, layers=2, heads=4, kv_heads=2, head_dim=32, mlp=384, vocab=2048,
                  seq=128, batch=16, steps=400, lr=1e-2, eval_every=100),
    # For accelerators (parameters float32, compute bfloat16); 100m is their default.
    "100m": Size(hidden=768, layers=12, heads=12, kv_heads=4, head_dim=64, mlp=2048, vocab=32768,
                 seq=2048, batch=8, steps=2000, lr=1e-3, eval_every=250),
    "1b": Size(hidden=2048, layers=16, heads=32, kv_heads=8, head_dim=64, mlp=8192, vocab=32768,
               seq=2048, batch=4, steps=2000, lr=3e-4, eval_every=250, remat="dots"),
}  # fmt: skip


def default_size(platform: str) -> str:
    """The preset a run without ``--size`` trains on JAX's ``platform`` (``jax.default_backend()``):
    ``small`` on ``"cpu"`` (a minute or two on 2 cores), ``100m`` on GPUs and TPUs, where the small
    one would leave the device idle (0.3% MFU on an H100)."""
    return "small" if platform == "cpu" else "100m"


# Dense bfloat16 peak per device (vendor data sheets), for MFU; matched against device_kind.
PEAK_FLOPS = (("H100 PCIe", 756e12), ("H100", 989e12), ("H200", 989e12), ("A100", 312e12),
              ("L40S", 362e12), ("L4", 121e12), ("TPU v4", 275e12), ("TPU v5 lite", 197e12),
              ("TPU v5", 459e12), ("TPU v6 lite", 918e12))  # fmt: skip


def model_config(size: Size, vocab_size: int, stages: int = 1) -> models.TransformerConfig:
    """The Llama config of ``size`` for a tokenizer of ``vocab_size`` ids.

    The vocabulary is rounded up to a multiple of 128 so that it splits over any `model` axis
    (the extra ids never occur; their logits learn to be small). With ``stages`` > 1 the layers
    run as a GPipe pipeline of ``2 * stages`` microbatches (a bubble of (p - 1) / (3p - 1)).
    """
    return models.TransformerConfig(
        "llama",
        vocab_size=-(-vocab_size // 128) * 128,
        hidden_size=size.hidden,
        intermediate_size=size.mlp,
        num_layers=size.layers,
        num_heads=size.heads,
        num_kv_heads=size.kv_heads,
        head_dim=size.head_dim,
        max_position_embeddings=size.seq,
        tie_word_embeddings=True,
        pipeline_microbatches=2 * stages,
    )


def flops_per_token(cfg: models.TransformerConfig, seq: int) -> float:
    """Training FLOPs per token: 6 x (the matmuls' parameters) + causal attention's scores.

    The embedding lookup costs nothing; the tied output head counts once; recomputation under
    remat is not counted (MFU counts the model's FLOPs, not the hardware's).
    """
    e, q, kv = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    per_layer = e * (2 * q + 2 * kv) + 3 * e * cfg.intermediate_size
    matmuls = cfg.num_layers * per_layer + e * cfg.vocab_size
    attention = cfg.num_layers * 2 * q * seq  # scores and values, half of them masked
    return 6.0 * matmuls + 3.0 * attention


def peak_flops(device: Any) -> float | None:
    kind = getattr(device, "device_kind", "")
    return next((flops for name, flops in PEAK_FLOPS if name in kind), None)


# -- the model, the loss and the steps -------------------------------------------------------------


def loss_fn(model: models.Transformer, tokens: na.NamedArray) -> jax.Array:
    """Mean next-token cross-entropy: the logits at position t predict the token at t + 1."""
    logits = model(tokens["position", :-1])
    return na.nn.cross_entropy(logits, "vocab", tokens["position", 1:]).scalar()


def make_optimizer(size: Size) -> optax.GradientTransformation:
    """AdamW with a linear warmup and a cosine decay to a tenth over ``size.steps``, gradients
    clipped at norm 1 (weight decay on every parameter, norms included: short runs)."""
    warmup = max(1, min(100, size.steps // 10))
    end = max(size.steps, warmup + 1)
    lr = optax.warmup_cosine_decay_schedule(0.0, size.lr, warmup, end, size.lr / 10)
    return optax.chain(
        optax.clip_by_global_norm(1.0), optax.adamw(lr, b1=0.9, b2=0.95, weight_decay=0.1)
    )


def make_steps(
    optimizer: optax.GradientTransformation, policy: na.nn.Precision | None,
    params: Any = PARAMS, compute: Any = COMPUTE,
) -> Any:  # fmt: skip
    """The training step and the held-out loss, compiled with the two mappings by ``na.fsdp``."""

    @na.fsdp(parameter_mapping=params, compute_mapping=compute, donate_args=(True, True, False))
    def train_step(model, opt_state, tokens):
        with na.nn.precision(policy):  # read while tracing: compute in bfloat16 on accelerators
            loss, grads = eqx.filter_value_and_grad(loss_fn)(model, tokens)
        updates, opt_state = optimizer.update(grads, opt_state, model)
        return eqx.apply_updates(model, updates), opt_state, loss

    @na.fsdp(parameter_mapping=params, compute_mapping=compute)
    def eval_step(model, tokens):
        with na.nn.precision(policy):
            return loss_fn(model, tokens)

    return train_step, eval_step


def init_state(
    cfg: models.TransformerConfig, size: Size, optimizer: Any, seed: int, params: Any = PARAMS
) -> Any:
    """Model and optimizer state, created directly in the parameter layout (no device ever holds
    the whole model). Call under the mesh; ``jax.eval_shape`` of it is the plan's input."""

    def init(key: jax.Array) -> dict[str, Any]:
        model = models.Transformer(cfg, key=key, gradient_checkpointing=size.remat)
        return {"model": model, "opt_state": optimizer.init(model)}

    return na.named_jit(init, out_axis_resources=params)(jax.random.key(seed))


def heldout_loss(
    eval_step: Any, model: Any, text: Any, size: Size, batches: int, compute: Any = COMPUTE
) -> float:
    """The mean loss over the same ``batches`` held-out batches every time (windows spread evenly)."""
    losses = [
        eval_step(model, text.heldout_batch(k, batches=batches, batch=size.batch,
                                            length=size.seq + 1, mapping=compute))
        for k in range(batches)
    ]  # fmt: skip
    return float(np.mean([float(x) for x in losses]))


# -- the hardware -----------------------------------------------------------------------------------


def setup_devices() -> None:
    """Simulate 8 devices on the CPU, for machines without an accelerator.

    Call before JAX starts its backends (before the first ``jax.devices()``); the setting only
    concerns the CPU backend, so GPUs and TPUs, when present, are used as they are.
    """
    jax.config.update("jax_num_cpu_devices", 8)


def make_mesh(spec: str | None, explicit: bool) -> jax.sharding.Mesh:
    """The (data, model) mesh: ``spec`` (``data=2,model=4``; with a stage axis
    ``stage=2,data=2,model=2``, axes it leaves out have size 1), else every accelerator on
    ``data``, else the 8 simulated CPU devices as (data=2, model=4)."""
    if spec is None:
        n = jax.device_count()
        spec = "data:2,model:4" if jax.default_backend() == "cpu" and n == 8 else f"data:{n}"
    kind = AxisType.Explicit if explicit else AxisType.Auto
    names = ("stage", "data", "model") if "stage" in spec else ("data", "model")
    return na.mesh.parse_mesh_from_string(spec, names, axis_types=kind)  # errors quote `spec`


# -- training -----------------------------------------------------------------------------------------


@dataclass
class Result:
    losses: dict[int, float]  # step -> training loss
    heldout: dict[int, float]  # step -> held-out loss
    model: Any
    seconds: float = 0.0  # training wall-clock (compilation included)
    tokens_per_s: float = 0.0  # after the first step


def train(
    text: Any,
    size: Size,
    mesh: jax.sharding.Mesh,
    *,
    seed: int = 0,
    policy: na.nn.Precision | None = None,
    eval_batches: int = 8,
    checkpoint_dir: str | None = None,
    checkpoint_every: int = 100,
    console: Console | None = None,
) -> Result:
    """Train ``size`` on ``text`` on ``mesh`` (resuming from ``checkpoint_dir`` if it holds a step).

    Batch ``s`` is fixed by ``(seed, s)``, and each process reads only its rows of it.
    """
    steps = size.steps
    console = console or Console(quiet=True)
    cfg = model_config(size, text.vocab_size, stages=mesh.shape.get("stage", 1))
    optimizer = make_optimizer(size)
    params, compute = mappings(mesh)
    train_step, eval_step = make_steps(optimizer, policy, params, compute)
    flops, peak = flops_per_token(cfg, size.seq), peak_flops(mesh.devices.flat[0])
    tokens_per_step = size.batch * size.seq
    with jax.set_mesh(mesh):
        # Plan before allocating: parameters, optimizer state, bytes per device.
        abstract = jax.eval_shape(lambda: init_state(cfg, size, optimizer, seed, params))
        console.print(
            na.analysis.plan(abstract, mesh, params, params="model", top=4), highlight=False
        )
        state = init_state(cfg, size, optimizer, seed, params)

        start, manager = 0, None
        if checkpoint_dir:
            from namedaxes.checkpoint import CheckpointManager

            manager = CheckpointManager(checkpoint_dir, max_to_keep=3)
            last = manager.latest_step()
            if last is not None:
                # Read straight into this run's parameter layout, whatever mesh saved it.
                state, start = manager.restore(state, mapping=params), last + 1
                console.print(f"resumed from step {last} in {checkpoint_dir}")
        model, opt_state = state["model"], state["opt_state"]
        result = Result({}, {}, model)

        def batch(step: int) -> na.NamedArray:
            return text.train_batch(step, batch=size.batch, length=size.seq + 1, seed=seed,
                                    mapping=compute)  # fmt: skip

        columns = [
            TextColumn("[bold]train"), BarColumn(), TextColumn("step {task.completed}/{task.total}"),
            TextColumn("loss {task.fields[loss]:.3f}"), TextColumn("{task.fields[tps]:,.0f} tok/s"),
            TextColumn("{task.fields[mfu]}"), TextColumn("held-out {task.fields[heldout]}"),
            TimeElapsedColumn(), TimeRemainingColumn(),
        ]  # fmt: skip
        t_start = time.perf_counter()
        with Progress(*columns, console=console) as progress:
            task = progress.add_task("train", total=steps, completed=start, loss=float("nan"),
                                     tps=0.0, mfu="", heldout="-")  # fmt: skip
            tokens = batch(start) if start < steps else None
            busy = 0.0  # seconds spent in training steps after the first (which compiles)
            for step in range(start, steps):
                t0 = time.perf_counter()
                model, opt_state, loss = train_step(model, opt_state, tokens)  # returns at once
                if step + 1 < steps:
                    tokens = batch(step + 1)  # read while the device computes this step
                result.losses[step] = loss = float(loss)  # waits for the step
                if step > start:
                    busy += time.perf_counter() - t0
                    result.tokens_per_s = tokens_per_step * (step - start) / busy
                mfu = (f"MFU {100 * flops * result.tokens_per_s / (peak * mesh.size):.1f}%"
                       if peak and result.tokens_per_s else "")  # fmt: skip
                progress.update(task, advance=1, loss=loss, tps=result.tokens_per_s, mfu=mfu)
                if manager is not None and (
                    (step + 1) % checkpoint_every == 0 or step + 1 == steps
                ):
                    manager.save(step, {"model": model, "opt_state": opt_state})  # asynchronous
                if (step + 1) % size.eval_every == 0 or step + 1 == steps:
                    h = result.heldout[step] = heldout_loss(
                        eval_step, model, text, size, eval_batches, compute
                    )
                    progress.update(task, heldout=f"{h:.3f}")
                    progress.console.print(f"step {step + 1}: held-out loss {h:.3f}")
        if manager is not None:
            manager.close()  # waits for the last save
        result.seconds = time.perf_counter() - t_start
        if not result.heldout:  # nothing left to train: the restored model's
            result.heldout[steps - 1] = heldout_loss(
                eval_step, model, text, size, eval_batches, compute
            )
    result.model = model
    return result


# -- after training: samples and export ------------------------------------------------------------


def heldout_prompts(text: Any, n: int, length: int) -> np.ndarray:
    """The first ``length`` tokens of ``n`` held-out documents (spread over the split), ``(n, length)``."""
    tokens = np.asarray(text.heldout)
    ends = np.flatnonzero(tokens == text.eos_id) if text.eos_id is not None else np.array([], int)
    starts = np.concatenate([[0], ends + 1])
    lengths = np.diff(np.concatenate([starts, [len(tokens)]]))
    starts = starts[lengths > length] if np.any(lengths > length) else starts[:1]
    chosen = starts[np.linspace(0, len(starts) - 1, n).astype(int)]
    return np.stack([tokens[s : s + length] for s in chosen]).astype(np.int32)


def continuations(
    model: Any, text: Any, *, n: int = 3, prompt_tokens: int = 24, new_tokens: int = 40,
    seed: int = 0, policy: na.nn.Precision | None = None,
) -> list[tuple[str, str, str]]:  # fmt: skip
    """``(prompt, greedy continuation, sampled continuation)`` for ``n`` held-out prompts.

    Sampling is ``namedaxes.models.generate`` (one compiled prefill and decode loop); the sampled
    continuation draws at temperature 0.8 from the 40 likeliest tokens. Call under the mesh.
    """
    ids = na.named(heldout_prompts(text, n, prompt_tokens), ("batch", "position"))
    prompt = na.distributed.from_process_local(
        ids, SAMPLING
    )  # every process passes the same prompts
    options = dict(max_new_tokens=new_tokens, eos_token_id=text.eos_id, pad_token_id=text.eos_id)
    with na.axis_mapping(SAMPLING), na.nn.precision(policy):
        greedy = models.generate(model, prompt, **options)
        sampled = models.generate(model, prompt, temperature=0.8, top_k=40,
                                  key=jax.random.key(seed), **options)  # fmt: skip

    def texts(out: na.NamedArray) -> list[str]:
        rows = np.asarray(na.distributed.process_allgather(out).array)[:, prompt_tokens:]
        return [text.decode(r[: _until_eos(r, text.eos_id)]) for r in rows]

    prompts = [text.decode(r) for r in np.asarray(ids.array)]
    return list(zip(prompts, texts(greedy), texts(sampled)))


def _until_eos(row: np.ndarray, eos: int | None) -> int:
    hits = np.flatnonzero(row == eos) if eos is not None else []
    return int(hits[0]) if len(hits) else len(row)


def save_for_transformers(model: Any, text: Any, folder: str) -> None:
    """``config.json`` + safetensors (``save_hf``) and the tokenizer: a folder that
    ``transformers``' ``AutoModelForCausalLM`` and ``AutoTokenizer`` load."""
    models.save_hf(model, folder)  # every process takes part; each writes its own files
    if jax.process_index() == 0:
        shutil.copy(text.folder / "tokenizer.json", Path(folder) / "tokenizer.json")
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": text_data.EOS,
                  "model_max_length": model.config.max_position_embeddings}  # fmt: skip
        (Path(folder) / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")


# -- the command line ------------------------------------------------------------------------------


def positive(text: str) -> int:
    """An argparse type: an int >= 1 (every 0 steps divides by zero; 0 rows or tokens mean nothing)."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return n


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--size",
        choices=list(SIZES),
        help="model preset (default: small on CPUs, 100m on GPUs and TPUs)",
    )
    parser.add_argument("--steps", type=int, help="training steps (default: the preset's)")
    parser.add_argument("--batch", type=positive, help="rows per step (default: the preset's)")
    parser.add_argument("--seq", type=positive, help="tokens per row (default: the preset's)")
    parser.add_argument("--lr", type=float, help="peak learning rate (default: the preset's)")
    parser.add_argument("--eval-every", type=positive, help="held-out loss every N steps")
    parser.add_argument(
        "--eval-batches", type=positive, default=8, help="held-out batches per evaluation"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="fixes the initial model and every batch"
    )
    parser.add_argument(
        "--data", help="a folder or text file (default: the standard library's source)"
    )
    parser.add_argument("--tokenizer", help="a tokenizer.json to use instead of training a BPE")
    parser.add_argument(
        "--mesh",
        help="mesh sizes, e.g. data=2,model=4 or stage=2,data=2,model=2 (pipelined; default: every "
        "accelerator on data, or the 8 simulated CPU devices as data=2,model=4)",
    )
    parser.add_argument(
        "--explicit", action="store_true", help="an Explicit mesh (sharding in types)"
    )
    parser.add_argument(
        "--mixed-precision",
        action=argparse.BooleanOptionalAction,
        help="parameters float32, compute bfloat16 (default: on accelerators)",
    )
    parser.add_argument(
        "--precision",
        metavar="POLICY",
        help="a precision policy instead, e.g. params=float32,compute=bfloat16,matmul=float8",
    )
    parser.add_argument(
        "--checkpoint-dir",
        help="save there and resume from its latest step (needs the [checkpoint] extra)",
    )
    parser.add_argument("--checkpoint-every", type=positive, default=100, help="save every N steps")
    parser.add_argument("--save-hf", metavar="DIR", help="export the trained model and tokenizer")
    parser.add_argument("--samples", type=int, default=3, help="held-out prompts to continue")
    add_compile_cache_option(parser)
    return parser.parse_args(argv)  # fmt: skip


def chosen_size(args: argparse.Namespace, platform: str) -> tuple[str, Size]:
    """The name of the preset of ``--size`` (default: ``default_size(platform)``) and the preset
    with the flags' overrides."""
    name = args.size or default_size(platform)
    overrides = {k: getattr(args, k) for k in ("steps", "batch", "seq", "lr", "eval_every")}
    size = dataclasses.replace(SIZES[name], **{k: v for k, v in overrides.items() if v is not None})
    return name, size


def chosen_policy(args: argparse.Namespace, accelerator: bool) -> na.nn.Precision | None:
    """``--precision``'s policy, else ``MIXED`` with ``--mixed-precision`` (default: on
    accelerators), else ``None`` (float32)."""
    if args.precision:
        return na.nn.Precision.parse(args.precision)
    mixed = accelerator if args.mixed_precision is None else args.mixed_precision
    return MIXED if mixed else None


def main(argv: list[str] | None = None) -> None:
    setup_devices()
    args = parse_args(argv)
    use_compile_cache(args.compile_cache)
    preset, size = chosen_size(args, jax.default_backend())
    accelerator = jax.default_backend() != "cpu"
    policy = chosen_policy(args, accelerator)
    console = Console(width=120, quiet=jax.process_index() != 0)

    mesh = make_mesh(args.mesh, args.explicit)
    # Every device of `data` gets the same number of rows, split evenly into the microbatches.
    stages = mesh.shape.get("stage", 1)
    rows = mesh.shape["data"] * (2 * stages if stages > 1 else 1)
    if size.batch % rows:
        size = dataclasses.replace(size, batch=-(-size.batch // rows) * rows)
    device = jax.devices()[0]
    console.print(
        f"devices: {jax.device_count()} x {device.device_kind} ({jax.default_backend()}), "
        f"mesh {dict(mesh.shape)} ({mesh.axis_types[0].name} axes), precision {policy or 'float32'}"
    )
    params, compute = mappings(mesh)
    console.print(f"parameters stored by {params}\ncomputed under     {compute}", highlight=False)
    t0 = time.perf_counter()
    text = text_data.load_text(args.data, tokenizer=args.tokenizer, vocab_size=size.vocab)
    console.print(
        f"{text.summary()}\n           ({time.perf_counter() - t0:.1f} s)", highlight=False
    )

    cfg = model_config(size, text.vocab_size, stages=mesh.shape.get("stage", 1))
    console.print(
        f"model:     {preset}: Llama-style Transformer, {cfg.num_layers} layers of width "
        f"{cfg.hidden_size}, {cfg.num_heads} heads ({cfg.num_kv_heads} key/value) of "
        f"{cfg.head_dim}, SwiGLU MLP of {cfg.intermediate_size}, vocabulary {cfg.vocab_size} (tied head); {size.batch} rows of "
        f"{size.seq} tokens per step, {size.steps} steps",
        highlight=False,
    )
    result = train(
        text, size, mesh, seed=args.seed, policy=policy, eval_batches=args.eval_batches,
        checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
        console=console,
    )  # fmt: skip
    heldout = result.heldout[max(result.heldout)]
    if result.losses:
        first, last = result.losses[min(result.losses)], result.losses[max(result.losses)]
        console.print(f"training loss {first:.3f} -> {last:.3f} in {result.seconds:.0f} s "
                      f"({result.tokens_per_s:,.0f} tokens/s after the first step)")  # fmt: skip
    else:
        console.print(f"nothing to train: the checkpoint is at step {size.steps}")
    if args.save_hf:
        save_for_transformers(result.model, text, args.save_hf)
        console.print(f"saved for transformers in {args.save_hf}")
    if args.samples:
        with jax.set_mesh(mesh):
            prompt = min(24, size.seq // 4)  # prompt and continuation within the trained length
            samples = continuations(result.model, text, n=args.samples, prompt_tokens=prompt,
                                    new_tokens=min(40, size.seq - prompt), seed=args.seed,
                                    policy=policy)  # fmt: skip
        print_samples(console, samples)
    console.print(f"unigram entropy of the held-out tokens: {text.unigram_entropy:.3f} (the loss "
                  "of a model that ignores context)")  # fmt: skip
    console.print(f"held-out loss: {heldout:.3f}", highlight=False)


def print_samples(console: Console, samples: list[tuple[str, str, str]]) -> None:
    for i, (prompt, greedy, sampled) in enumerate(samples, 1):
        console.rule(f"held-out prompt {i}", align="left", style="dim")
        console.print(escape(prompt), style="dim")
        for how, continuation in (
            ("greedy", greedy),
            ("sampled: temperature 0.8, top 40", sampled),
        ):
            console.rule(f"continued ({how})", align="left", style="dim")
            console.print(escape(continuation), style="bold")
    console.rule(style="dim")


if __name__ == "__main__":
    main()
