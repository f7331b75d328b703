"""Mixture-of-experts language models against the dense model with the same active parameters:
the training step's tokens/s and MFU on active parameters, per MoE dispatch.

Run on a GPU (or TPU) from the repository root:

    python benchmarks/moe_model.py                          # both models, every dispatch
    python benchmarks/moe_model.py --dispatches grouped,capacity --budget 300
    python benchmarks/moe_model.py --quick                  # tiny sizes: a CPU check of the script

The models are ``examples/train_lm.py``'s Llama-style ``namedaxes.models.Transformer`` (RMSNorm,
rotary embeddings, grouped-query attention, a tied output head) with every MLP a
``namedaxes.nn.MoE`` (SwiGLU experts, softmax routing renormalised over the top-k), at a size that
trains in a fraction of a second per step on one 80 GB GPU: 8 layers, hidden 1024, 16 query and 4
key/value heads of 64, a vocabulary of 32768, 8 rows x 2048 tokens (16k tokens) a step:

* ``mixtral-ish``: 8 experts, top-2, expert width 2816 (Mixtral's routing);
* ``qwen3-moe-ish``: 64 experts, top-8, expert width 384 (fine-grained experts and q/k norms:
  Qwen3-30B-A3B has 128 experts of width 768 at hidden 2048, the same width-to-hidden ratio; 64
  keep the ``dense`` dispatch, which computes every expert, at 8x the active work).

``--quick`` (and any run on a CPU) takes the same shapes at hidden 64, 2 layers, 4 x 64 tokens (the
Qwen3-ish one with 32 experts); ``grouped`` runs there in Pallas interpret mode.

Each is timed against its *dense twin*: the same model with a dense MLP of width top-k x expert
width, so the same active parameters but the router's. Every model trains with the example's own
step (``train_lm.make_steps``: AdamW via optax, float32 parameters, bfloat16 compute, ``na.fsdp`` on
a one-device mesh; ``--precision`` sets another policy for every row, e.g. float8 matmuls) on the same random tokens; the load-balancing loss is left out, as the example's
loss has none (it adds a few reductions). Each MoE model runs once per ``--dispatches`` entry
(``TransformerConfig.moe_dispatch``; ``capacity`` at ``--capacity-factor``), each from the same
initial parameters with its own state. The timing rounds are interleaved (every row once per round,
the order rotating; the dense twin a second time as an A/A slot), so the ratios are measured in one
run under the same conditions.

Printed: one markdown table, a row per model and dispatch: ms per step, tokens/s, MFU on active
parameters (the example's ``flops_per_token`` of the dense twin, i.e. 6 x the active matmuls'
parameters plus causal attention, plus the router; over the measured bfloat16 peak of
``benchmarks/accelerator.py``, or ``--peak``), tokens/s as a multiple of the dense twin's (the
dense twin's own row shows the A/A ratio instead), the first step's loss (the same for the dropless
dispatches up to bfloat16 rounding; ``capacity`` drops tokens) and the first call's seconds
(mostly compiling). A row that fails
(an exception, out of memory, a GPU kernel that does not compile) prints its first error line and
the table goes on; ``--budget`` bounds the whole run (rows past it print "skipped (budget)").
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _twin as tw  # noqa: E402  (the example's model, step and optimizer)
from _timing import Budget, interleaved  # noqa: E402
from accelerator import POLICY, failure, on_accelerator, peak_bf16  # noqa: E402
from moe_dispatch import set_mosaic  # noqa: E402

import namedaxes as na  # noqa: E402
from namedaxes import models  # noqa: E402

DISPATCHES = ("dense", "ragged", "grouped", "capacity")
FAST_COMPILE = "--xla_backend_optimization_level=0"


@dataclasses.dataclass(frozen=True)
class Model:
    """An MoE model: the example's size (``size.mlp`` is the dense twin's width, ``top_k x
    width``) and its experts."""

    size: tw.Size
    experts: int
    top_k: int
    width: int
    qwen: bool = False  # Qwen3-MoE: q/k norms over head_dim (Mixtral has none)

    def dense(self) -> models.TransformerConfig:
        """The dense twin: the same model with an MLP of ``top_k x width``."""
        cfg = tw.model_config(self.size, self.size.vocab)
        return cfg.replace(model_type="qwen3", qk_norm="head") if self.qwen else cfg

    def moe(self, dispatch: str, capacity_factor: float) -> models.TransformerConfig:
        return self.dense().replace(
            model_type="qwen3_moe" if self.qwen else "mixtral", num_experts=self.experts,
            num_experts_per_tok=self.top_k, moe_intermediate_size=self.width, norm_topk_prob=True,
            moe_dispatch=dispatch, capacity_factor=capacity_factor if dispatch == "capacity" else None,
        )  # fmt: skip


def _models(base: tw.Size, shapes: dict[str, tuple[int, int, int, bool]]) -> dict[str, Model]:
    return {
        name: Model(dataclasses.replace(base, mlp=k * w), n, k, w, qwen)
        for name, (n, k, w, qwen) in shapes.items()
    }


_GPU = tw.Size(hidden=1024, layers=8, heads=16, kv_heads=4, head_dim=64, mlp=0, vocab=32768,
               seq=2048, batch=8, steps=2000, lr=3e-4, eval_every=250)  # fmt: skip
_CPU = tw.Size(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, mlp=0, vocab=512, seq=64,
               batch=4, steps=2000, lr=3e-4, eval_every=250)  # fmt: skip
# (experts, top-k, expert width, Qwen3): the same shapes at hidden 1024 and (tiny) at 64.
GPU_MODELS = _models(
    _GPU, {"mixtral-ish": (8, 2, 2816, False), "qwen3-moe-ish": (64, 8, 384, True)}
)
CPU_MODELS = _models(_CPU, {"mixtral-ish": (8, 2, 176, False), "qwen3-moe-ish": (32, 8, 24, True)})


def parameters(cfg: models.TransformerConfig) -> int:
    """The model's parameter count (from shapes: nothing is allocated)."""
    shapes = eqx.filter_eval_shape(models.Transformer, cfg, key=jax.random.key(0))
    return sum(x.size for x in jax.tree.leaves(shapes))


def active_flops_per_token(cfg: models.TransformerConfig, seq: int) -> float:
    """The example's ``flops_per_token`` on the active parameters: the top-k experts count as one
    MLP of their summed width, plus the router's matmul."""
    if not cfg.moe:
        return tw.flops_per_token(cfg, seq)
    width = cfg.num_experts_per_tok * cfg.axis("expert_mlp").size
    dense = cfg.replace(num_experts=0, intermediate_size=width)
    return tw.flops_per_token(dense, seq) + 6.0 * cfg.num_layers * cfg.hidden_size * cfg.num_experts


def init(cfg: models.TransformerConfig, size: tw.Size, mesh: Any) -> dict[str, Any]:
    """The example's model and optimizer state for ``cfg`` (``{"model", "opt_state"}``)."""
    with jax.set_mesh(mesh):
        return tw.train_lm.init_state(cfg, size, tw.optimizer(size), seed=0)


def relabel(
    state: dict[str, Any], cfg: models.TransformerConfig, copy: bool = True
) -> dict[str, Any]:
    """``state`` run with ``cfg``'s runtime options: every ``Transformer`` in it (the model, and
    the optimizer's moments) through ``with_options``; a copy unless ``copy=False`` (the steps
    donate their state). No parameter depends on the dispatch, so every dispatch starts from the
    same state, initialized (and compiled) once."""
    options = {f: getattr(cfg, f) for f in models.TransformerConfig.RUNTIME_FIELDS}
    return jax.tree.map(
        lambda x: x.with_options(**options) if isinstance(x, models.Transformer) else x,
        jax.tree.map(jnp.copy, state) if copy else state,
        is_leaf=lambda x: isinstance(x, models.Transformer),
    )


class Slot:
    """One row: a model's training state (its own: the step donates it), its step, and what
    happened (the first loss and call time, or the error that ended it)."""

    def __init__(self, label: str, size: tw.Size, mesh: Any, policy: Any = POLICY):
        self.label, self.mesh = label, mesh
        self.step = tw.train_lm.make_steps(tw.optimizer(size), policy)[0]
        self.state: dict[str, Any] | None = None
        self.first_loss = self.first_call = None
        self.error: str | None = None

    def start(self, state: Callable[[], dict[str, Any]], batch: na.NamedArray) -> None:
        """Take the initial ``state()`` and run (compile) the first step."""
        t0 = time.perf_counter()
        try:
            self.state = state()
        except Exception as e:  # noqa: BLE001 - one row failing must not end the table
            self.fail(e)
            return
        loss = self.run([batch])
        if loss is not None:
            self.first_loss, self.first_call = float(loss), time.perf_counter() - t0

    def run(self, batches: list[na.NamedArray]) -> Any:
        """Train on ``batches``; the last loss, ready (``None`` once the row has failed)."""
        if self.error is not None:
            return None
        try:
            with jax.set_mesh(self.mesh):
                for b in batches:
                    model, opt_state, loss = self.step(
                        self.state["model"], self.state["opt_state"], b
                    )
                    self.state = {"model": model, "opt_state": opt_state}
            return jax.block_until_ready(loss)  # an error in the program shows here
        except Exception as e:  # noqa: BLE001 - e.g. a GPU-only kernel that does not compile
            self.fail(e)
            return None

    def fail(self, e: Exception) -> None:
        self.error, self.state = failure(e), None
        gc.collect()


def model_rows(
    name: str, model: Model, args: argparse.Namespace, peak: float, budget: Budget
) -> list[str]:  # noqa: E501
    """The table's rows for ``model``: its dense twin, then each dispatch."""
    size, mesh = model.size, tw.one_device_mesh()
    batches = [tw.named_batch(t) for t in tw.batches(size, args.steps)]
    twin = Slot("dense twin", size, mesh, args.precision)
    twin.start(lambda: init(model.dense(), size, mesh), batches[0])
    slots = [twin] + [Slot(d, size, mesh, args.precision) for d in args.dispatches]
    shared: dict[str, Any] = {}  # the MoE models' initial state, made for the first that runs

    def moe_state(dispatch: str) -> dict[str, Any]:
        cfg = model.moe(dispatch, args.capacity_factor)
        if not shared:
            shared.update(init(cfg, size, mesh))
        last = dispatch == slots[-1].label  # takes the shared state itself: one state less
        return relabel(shared, cfg, copy=not last)

    for s in slots[1:]:
        if budget.left() <= 0:
            s.error = "skipped (budget)"
            continue
        s.start(functools.partial(moe_state, s.label), batches[0])
    shared.clear()  # every copy is made: free it
    live = {s.label: (lambda s=s: s.run(batches)) for s in slots if s.error is None}
    if twin.error is None:
        live["A/A"] = live[twin.label]  # the dense twin again: the noise floor of the ratios
    times = interleaved(live, budget, args.rounds) if live else {}
    tokens = size.batch * size.seq
    rows = []
    for s in slots:
        if s.error is not None:
            rows.append(f"| {name} | {s.label} | {s.error} |")
            continue
        step = statistics.median(times[s.label]) / args.steps
        cfg = model.dense() if s is twin else model.moe(s.label, args.capacity_factor)
        mfu = 100 * active_flops_per_token(cfg, size.seq) * tokens / step / peak
        if s is twin:
            ratio = "A/A " + _ratio(times["A/A"], times[s.label])
        else:
            ratio = _ratio(times[twin.label], times[s.label]) if twin.error is None else "n/a"
        rows.append(
            f"| {name} | {s.label} | {step * 1e3:.1f} | {tokens / step:,.0f} | {mfu:.1f} "
            f"| {ratio} | {s.first_loss:.4f} | {s.first_call:.0f} | {len(times[s.label])} |"
        )
    return rows


def _ratio(a: list[float], b: list[float]) -> str:
    """The median of the rounds' time ratios ``a / b``: ``b``'s tokens/s as a multiple of ``a``'s."""
    return f"{statistics.median(x / y for x, y in zip(a, b)):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CPU check)")
    parser.add_argument("--models", type=lambda s: s.split(","), default=list(GPU_MODELS))
    parser.add_argument(
        "--dispatches", type=lambda s: list(dict.fromkeys(s.split(","))), default=list(DISPATCHES)
    )
    parser.add_argument("--capacity-factor", type=float, default=1.25)
    parser.add_argument("--remat", default="none", help="gradient_checkpointing of every model")
    parser.add_argument(
        "--precision", type=na.nn.Precision.parse, default=POLICY,
        help="every row's policy (default float32 parameters, bfloat16 compute; add "
        "',matmul=float8' for float8 matmuls, the routed experts' included)",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=None, help="timing rounds (5; 3 on CPU)")
    parser.add_argument(
        "--steps", type=int, default=None, help="steps per row and round (2; 1 on CPU)"
    )
    parser.add_argument("--peak", type=float, help="bfloat16 peak TFLOP/s (default: measured)")
    parser.add_argument("--mosaic", help="Mosaic GPU blocks: rows,contraction,columns,depth,sweep")
    parser.add_argument(
        "--budget", type=float, default=None, help="seconds for the whole run (120; 50 on CPU)"
    )
    args = parser.parse_args()
    if args.quick and "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
        # Before JAX starts its backends. Tiny programs: compiling is nearly all the time, and
        # without LLVM's optimizations XLA compiles about twice as fast (as tests/conftest.py).
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE}".strip()
    set_mosaic(args.mosaic)
    accel = on_accelerator()
    tiny = args.quick or not accel
    table = CPU_MODELS if tiny else GPU_MODELS
    unknown = [m for m in args.models if m not in table]
    unknown += [d for d in args.dispatches if d not in ("auto", *DISPATCHES)]
    if unknown:
        parser.error(f"unknown {unknown}: models {list(table)}, dispatches auto, {DISPATCHES}")
    args.rounds = args.rounds or (5 if accel else 3)
    args.steps = args.steps or (2 if accel else 1)
    total = Budget(args.budget or (120.0 if accel else 50.0))
    peak = 1e12 * args.peak if args.peak else peak_bf16(Budget(min(20.0, total.left())))
    device = jax.devices()[0]
    print(
        f"{device.device_kind} ({jax.default_backend()}), jax {jax.__version__}; bfloat16 peak "
        f"{peak / 1e12:.1f} TFLOP/s ({'given' if args.peak else 'measured'}); remat "
        f"{args.remat!r}, capacity factor {args.capacity_factor}, {args.precision}"
        + ("" if accel else "; CPU: tiny sizes, only the ratios' agreement means anything")
    )
    for name in args.models:
        m = table[name]
        moe = m.moe("dense", args.capacity_factor)
        active = parameters(m.dense()) + m.size.layers * m.size.hidden * m.experts
        print(
            f"- {name}: {m.experts} experts, top-{m.top_k}, width {m.width}: "
            f"{parameters(moe) / 1e6:,.1f}M parameters, {active / 1e6:,.1f}M active; dense twin "
            f"MLP {m.size.mlp}: {parameters(m.dense()) / 1e6:,.1f}M; {m.size.layers} layers, hidden "
            f"{m.size.hidden}, {m.size.batch}x{m.size.seq} tokens a step"
        )
    print(
        "\n| model | dispatch | ms/step | tokens/s | active MFU % | tokens/s vs dense twin "
        f"| first loss | first call s | rounds |\n|{'---|' * 9}",
        flush=True,
    )
    for i, name in enumerate(args.models):
        m = table[name]
        size = dataclasses.replace(m.size, remat=args.remat)
        budget = Budget(total.left() / (len(args.models) - i))  # an even share of what is left
        for row in model_rows(name, dataclasses.replace(m, size=size), args, peak, budget):
            print(row, flush=True)
        gc.collect()
        jax.clear_caches()


if __name__ == "__main__":
    main()
