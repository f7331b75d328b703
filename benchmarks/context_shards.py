"""Context parallelism's attention work per shard, timed on one device.

Run on a GPU (or TPU) from the repository root: ``python benchmarks/context_shards.py`` (tiny
sizes for a check: ``--small`` or ``--quick``, the default on a CPU). A real context-parallel step
needs ``c`` devices; this measures, on one, what one shard of ``c`` computes in its attention
(forward + backward, causal, bfloat16 on accelerators), which is what decides the strategies'
step time besides the exchange:

* ``ring`` in order and ``ring zigzag`` (the balanced layout, ``context_balance="zigzag"``): the
  calls shard ``i`` makes, taken from the ring's own code (``namedaxes.nn._ring``: the same pairs
  of query and key runs, the same test that skips a pair no query sees), each an XLA attention
  call with its log-sum-exp, merged as the ring merges them. In order shard ``c - 1`` does ``c``
  blocks and shard 0 one; zig-zag every shard the same. Reported per timed shard: the calls, the
  query x key positions computed, the time, and the spread of the zig-zag shards' times (the
  issue's bar: within 10%).
* ``ulysses``: one shard's kernel call after the all-to-all: every position of ``heads / c``
  heads, causal, with the kernel ``dot_product_attention`` picks (cuDNN on GPUs).
* ``all_gather``: the last shard's queries against every key, causal at their offset (XLA: cuDNN
  takes no causal offset).

The exchanges (ring ``ppermute``\\ s, all-to-alls, all-gathers) are not timed: one device has no
one to exchange with. ``benchmarks/parallelism.py context`` compiles the real steps on simulated
CPU devices (memory, collectives).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import Budget, clock  # noqa: E402

import namedaxes as na  # noqa: E402
from namedaxes.nn import _ring as ring  # noqa: E402

F32 = jnp.float32
# (option, accelerator size, --small / CPU size)
SIZES = (
    ("tokens", 16384, 512),
    ("shards", 8, 4),
    ("heads", 16, 4),
    ("head_dim", 64, 32),
    ("rounds", 7, 3),
    ("budget", 90.0, 40.0),
)


def _grads(loss: Callable[..., jax.Array]) -> Any:
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def ring_shard(c: int, shard: int, zigzag: bool, q: Any, k: Any, v: Any, g: Any) -> tuple:
    """``(calls, positions, fwd+bwd function)`` of shard ``shard``'s ring attention: its queries
    ``q`` (its block of the whole ``q``) against every block of ``k``, ``v`` it does not skip."""
    t = q.shape[1] // c
    cfg = ring.Ring(None, c, q.shape[-1] ** -0.5, True, None, zigzag)
    runs = []
    for r in range(c):
        block = (shard - r) % c
        for a, qp, kp in ring._pairs(cfg, t, t, shard, block):  # noqa: SLF001
            if ring._sees(True, None, qp.start - kp.start, qp.size, kp.size):  # noqa: SLF001
                runs.append((a, qp, block, kp))
    local = jnp.concatenate(  # the shard's queries in its layout
        [q[:, p.start : p.start + p.size] for p in ring.pieces(zigzag, t, c, shard)], axis=1
    )
    gl = jnp.concatenate(
        [g[:, p.start : p.start + p.size] for p in ring.pieces(zigzag, t, c, shard)], axis=1
    )

    def loss(ql: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        state: dict[int, Any] = {}
        for a, qp, block, kp in runs:
            kb, vb = (x[:, block * t : (block + 1) * t] for x in (k, v))
            call = ring._block_call(cfg, ql, kb, vb, 0, qp, kp, None, None, None)  # noqa: SLF001
            ob, lb = ring._block_forward(call)  # noqa: SLF001
            if a in state:
                o, lse = state[a]
                new = jnp.logaddexp(lse, lb)
                rows = lambda x: jnp.moveaxis(x, 3, 1)[..., None]  # noqa: E731
                ob = o * rows(jnp.exp(lse - new)) + ob * rows(jnp.exp(lb - new))
                lb = new
            state[a] = (ob, lb)
        out = jnp.concatenate([state[a][0] for a in sorted(state)], axis=1)
        return jnp.sum(out.reshape(gl.shape).astype(F32) * gl.astype(F32))

    work = sum(qp.size * kp.size for _, qp, _, kp in runs)
    fn = _grads(loss)
    return len(runs), work, lambda: fn(local, k, v)


def ulysses_shard(c: int, q: Any, k: Any, v: Any, g: Any) -> tuple:
    heads = q.shape[2] // c
    names = ("batch", "position", "heads", "head_dim")
    kv_names = ("batch", "key_position", "heads", "head_dim")

    def loss(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        out = na.nn.dot_product_attention(
            na.named(q, names), na.named(k, kv_names), na.named(v, kv_names), causal=True
        )
        return jnp.sum(out.array.astype(F32) * g[:, :, :heads].astype(F32))

    fn = _grads(loss)
    qs, ks, vs = (x[:, :, :heads] for x in (q, k, v))
    t = q.shape[1]
    return 1, t * (t + 1) // 2 * heads // q.shape[2], lambda: fn(qs, ks, vs)


def gather_shard(c: int, q: Any, k: Any, v: Any, g: Any) -> tuple:
    t = q.shape[1]
    tl = t // c
    names = ("batch", "position", "heads", "head_dim")
    kv_names = ("batch", "key_position", "heads", "head_dim")

    def loss(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        out = na.nn.dot_product_attention(
            na.named(q, names), na.named(k, kv_names), na.named(v, kv_names), causal=True,
            query_offset=t - tl,
        )  # fmt: skip
        return jnp.sum(out.array.astype(F32) * g[:, t - tl :].astype(F32))

    fn = _grads(loss)
    return 1, tl * t, lambda: fn(q[:, t - tl :], k, v)


def main() -> int:
    accel = jax.default_backend() in ("gpu", "tpu")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--small", "--quick", action="store_true", help="the tiny CPU sizes (default on a CPU)"
    )
    parser.add_argument("--tokens", type=int, help="sequence length (16384; 512 small)")
    parser.add_argument("--shards", type=int, help="context shards c (8; 4 small)")
    parser.add_argument("--heads", type=int, help="attention heads (16; 4 small)")
    parser.add_argument("--head-dim", type=int, help="head width (64; 32 small)")
    parser.add_argument("--rounds", type=int, help="timed rounds per row (7; 3 small)")
    parser.add_argument("--budget", type=float, help="seconds for all rows (90; 40 small)")
    args = parser.parse_args()
    # An explicit size wins; otherwise --small (or a CPU backend) picks the tiny ones.
    small = args.small or not accel
    for name, big, tiny in SIZES:
        if getattr(args, name) is None:
            setattr(args, name, tiny if small else big)
    t, c = args.tokens, args.shards
    dtype = jnp.bfloat16 if accel else F32
    if t % (2 * c) or args.heads % c:
        parser.error(f"--tokens must cut into {2 * c} chunks and --heads split into {c}")
    shape = (1, t, args.heads, args.head_dim)
    q, k, v, g = (
        jax.random.normal(key, shape, dtype) for key in jax.random.split(jax.random.key(0), 4)
    )
    print(
        f"device: {jax.devices()[0].device_kind} ({jax.default_backend()}), jax {jax.__version__}; "
        f"one shard of {c}: {t} tokens, {args.heads} heads x {args.head_dim}, causal, "
        f"{jnp.dtype(dtype).name}, forward + backward"
    )
    rows: list[tuple[str, int, int, int, Callable[[], Any]]] = []
    for shard in (0, c - 1):
        rows.append(("ring in order", shard, *ring_shard(c, shard, False, q, k, v, g)))
    for shard in (0, c // 2, c - 1):
        rows.append(("ring zigzag", shard, *ring_shard(c, shard, True, q, k, v, g)))
    rows.append(("ulysses", -1, *ulysses_shard(c, q, k, v, g)))
    rows.append(("all_gather", c - 1, *gather_shard(c, q, k, v, g)))

    budget = Budget(args.budget)
    block = (t // c) ** 2
    times: dict[tuple[str, int], float] = {}
    print(f"\n{'strategy':<14} {'shard':>5} {'calls':>5} {'blocks':>7} {'ms':>9}")
    for name, shard, calls, work, run in rows:
        if budget.left() <= 0:
            print(f"{name:<14} {shard:>5}  skipped (budget)")
            continue
        try:
            clock(run)  # compile
            ms = 1e3 * statistics.median(clock(run) for _ in range(args.rounds))
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"{name:<14} {shard:>5}  failed: {type(e).__name__}: {str(e)[:80]}")
            continue
        times[(name, shard)] = ms
        label = "all" if shard < 0 else str(shard)
        print(f"{name:<14} {label:>5} {calls:>5} {work / block:>7.2f} {ms:>9.2f}")
        sys.stdout.flush()
    zig = [ms for (name, _), ms in times.items() if name == "ring zigzag"]
    worst = times.get(("ring in order", c - 1))
    if len(zig) > 1:
        print(f"\nzig-zag shards: spread {100 * (max(zig) / min(zig) - 1):.1f}% (max/min - 1)")
    if zig and worst:
        print(f"slowest shard, in order / zig-zag: {worst / max(zig):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
