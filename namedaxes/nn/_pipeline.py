"""Pipeline parallelism: a ``Stacked``'s layers split into stages along the mesh axes of ``layer``.

When the mapping in force places the stacked ``layer`` axis on mesh axes (``{"layer": "stage"}``),
each device along them holds a contiguous block of layers: a *stage*. The stack's input is split
into ``m`` microbatches along ``batch`` (row ``b`` goes to microbatch ``b mod m``, so every
microbatch is spread evenly over the mesh axes ``batch`` is split over), and the microbatches flow
through the stages in one ``lax.scan`` over *ticks*: at each tick every stage runs its layers on the
microbatch in front of it and hands the result to the next stage (``ppermute``, a collective-permute
of one microbatch's activations). Everything else about a layer is unchanged: inside a stage the
other mesh axes keep their mapping (data, tensor, context and expert parallelism compose), and the
backward pass is JAX's transpose of the same loop (the permutes reversed).

Schedules (``SCHEDULES``):

* ``gpipe``: every microbatch's forward pass, then (autodiff) every backward pass. ``m + p - 1``
  ticks for ``p`` stages, of which ``p - 1`` are the bubble: idle fraction ``(p - 1) / (m + p - 1)``.
  Activations of all ``m`` microbatches are kept for the backward pass (less with the stack's
  remat policy).
* ``circular``: each device holds ``repeats`` non-adjacent blocks of layers (``repeats * p`` blocks
  in all, block ``i`` on stage ``i mod p``), and each microbatch goes round the ring ``repeats``
  times. ``repeats * m + p - 1`` ticks of a ``1 / repeats`` stage each: the bubble shrinks to
  ``(p - 1) / (repeats * m + p - 1)``. Needs ``m >= p`` (a microbatch coming round waits for the
  stage to be free). The stacked parameters are stored in layer order, contiguous per device, so
  each step moves the blocks to their round-robin stage first (an exchange of parameters over the
  stage axis that GPipe does not have).
* ``1f1b``: the forward pass keeps only the stack's input; the backward pass is a one-forward-one-
  backward schedule: each stage recomputes a microbatch's forward and runs its backward as soon as
  the gradient comes back, so at most ``p`` microbatches are in flight per stage and activation
  memory no longer grows with ``m``. Costs one extra forward pass (as the ``"full"`` remat policy).

The microbatch axis is private while the batch is split (the stack's input and arguments may have
an axis named ``microbatch`` of their own); only ``Stacked.scan``'s ``ys`` without the batch axis
come out with a ``microbatch`` axis. On an Explicit mesh the outputs get their types back: the
carry the input's, ``ys`` the layer axis on the stage axes and their other axes where the input
has those names.

What is outside the stack (embeddings, the final norm, the head and the loss) is not pipelined: it
runs on every stage (replicated over the stage axes, split over the others as the mapping says).
The stack's input enters every stage (the first uses it) and its output, made by the last stage,
is sent to all stages at the end (one all-reduce of the output over the stage axes; its transpose
gathers the input's gradient the same way): so the stage axes carry activations and their
gradients only, never parameters (except ``circular``'s re-layout above).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from .._array import NamedArray, is_named_array
from .._axis import Axis
from .._errors import (
    AxisNotFoundError,
    NamedTypeError,
    ShardingError,
    format_axes,
)
from .._logical._context import axis_mapping, current_rules
from .._logical._resolve import resolve
from .._mesh import context_mesh, explicit_axes
from .._ops.shape import flatten_axes, rearrange, unflatten_axis
from .._partitioning._collectives import permute_blocks
from .._partitioning._shard import constrain
from .._spec import entry_axes, entry_of
from ..analysis._pipeline_plan import pipeline_counts
from ._common import mesh_entries
from ._pipeline_microbatches import (
    MICRO,
    axis_placement,
    merge_microbatches,
    pick_microbatch,
    split_microbatches,
    take_microbatches,
)
from ._stacked_leaves import layer_dim, map_layers, plain_axes

__all__ = ["PIPELINE_SCHEDULES", "SCHEDULES", "Pipeline", "pipeline_for", "run"]

SCHEDULES = ("gpipe", "1f1b", "circular")
#: The pipeline schedules ``nn.Stacked(schedule=...)`` takes (see ``namedaxes.nn._pipeline``).
PIPELINE_SCHEDULES = SCHEDULES

# The circular schedule's blocks per stage (inside the pipeline only).
_REPEAT = "_pipeline_repeat"


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """How a stack is pipelined.

    Attributes:
        mesh_axes: The mesh axes ``layer`` is placed on (the stage axes).
        stages: ``p``, the product of their sizes.
        microbatches: ``m``.
        schedule: One of ``SCHEDULES``.
        repeats: Blocks of layers per stage (``circular``; 1 otherwise).
        batch_axis: The axis split into microbatches.
    """

    mesh_axes: tuple[str, ...]
    stages: int
    microbatches: int
    schedule: str
    repeats: int
    batch_axis: str

    @property
    def axis(self) -> Any:
        return entry_of(self.mesh_axes)

    @property
    def ticks(self) -> int:
        return self.repeats * self.microbatches + self.stages - 1


def check_options(
    microbatches: Any, schedule: Any, repeats: Any, where: str, *, batch_axis: Any = "batch"
) -> None:
    """Typed errors for pipeline options that can never be right (checked at construction and by
    ``with_pipeline``)."""
    if microbatches is not None and (
        isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1
    ):
        raise NamedTypeError(
            f"{where}: microbatches must be a positive int or None (one per stage), got "
            f"{microbatches!r}."
        )
    if schedule not in SCHEDULES:
        raise NamedTypeError(
            f"{where}: unknown pipeline schedule {schedule!r}; choose one of "
            f"{', '.join(repr(s) for s in SCHEDULES)}."
        )
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise NamedTypeError(f"{where}: repeats must be a positive int, got {repeats!r}.")
    if not isinstance(batch_axis, str) or not batch_axis:
        raise NamedTypeError(
            f"{where} needs an axis name for batch_axis, got {batch_axis!r}. Pass the name of "
            "the input's batch axis, e.g. batch_axis='batch'."
        )


def pipeline_for(
    Layer: Axis, stacked: Any, microbatches: int | None, schedule: str, repeats: int,
    batch_axis: str,
) -> Pipeline | None:  # fmt: skip
    """The pipeline the mapping in force asks for, or ``None`` when ``layer`` is not split."""
    leaf = next(
        (
            v
            for v in jax.tree.leaves(stacked, is_leaf=is_named_array)
            if isinstance(v, NamedArray) and v.has_axis(Layer.name)
        ),
        None,
    )
    if leaf is None:
        return None
    entries = mesh_entries(leaf)
    if entries is None:
        return None
    mesh_axes = entry_axes(entries[0].get(Layer.name))
    if not mesh_axes:
        return None
    mesh = context_mesh()
    p = math.prod(mesh.shape[a] for a in mesh_axes)
    if p == 1:
        return None
    m, repeats = pipeline_counts(Layer.name, Layer.size, p, microbatches, schedule, repeats)
    return Pipeline(tuple(mesh_axes), p, m, schedule, repeats, batch_axis)


def _check_stage_axes(
    pipe: Pipeline, Layer: Axis, operands: dict[str, Any], body_rules: Any
) -> None:
    """Fail when the mapping inside the stages (``body_rules``: ``Layer`` replicated) places an
    axis of an array entering them (``operands``: what -> tree) on the stage axes: they carry the
    layers only, and a constraint on them inside would fail. Names the mapping places there that
    no operand has are fine (two stacks, each with its own layer axis name, on one stage axis)."""
    if body_rules is None:
        return
    stage, mesh = set(pipe.mesh_axes), context_mesh()
    for what, tree in operands.items():
        for v in jax.tree.leaves(tree, is_leaf=is_named_array):
            if not isinstance(v, NamedArray):
                continue
            for n, e in zip(v.axis_names, resolve(v.axes, body_rules, mesh)):
                if stage & set(entry_axes(e)):
                    raise ShardingError(
                        f"The mapping pipelines {Layer.name!r} ({Layer.size} layers) over mesh "
                        f"axes {pipe.mesh_axes!r}, and also places {n!r} on them ({what}: "
                        f"NamedArray({format_axes(v.axes)}) has {n!r} on {entry_axes(e)!r}). "
                        f"The stage axes carry the layers only: map {n!r} to other mesh axes."
                    )


def _describe(v: Any) -> str:
    if isinstance(v, NamedArray):
        return f"NamedArray({format_axes(v.axes)})"
    return f"{type(v).__name__} {getattr(v, 'shape', v)!r}"


# -- the stage loop ------------------------------------------------------------------------------


def _array_leaves(tree: Any) -> tuple[list[Any], Any, list[int]]:
    """``tree``'s leaves (NamedArrays whole), its treedef, and which leaves hold arrays."""
    leaves, treedef = jax.tree.flatten(tree, is_leaf=is_named_array)
    return (
        leaves,
        treedef,
        [i for i, v in enumerate(leaves) if isinstance(v, NamedArray | jax.Array)],
    )


def _arrays(tree: Any) -> tuple[list[Any], Callable[[list[Any]], Any]]:
    """The array leaves of ``tree`` (a NamedArray's array, plain arrays) and how to rebuild it with
    arrays of other (local) sizes."""
    leaves, treedef, idx = _array_leaves(tree)

    def rebuild(arrays: list[Any]) -> Any:
        out = list(leaves)
        for i, a in zip(idx, arrays):
            v = leaves[i]
            if isinstance(v, NamedArray):
                out[i] = NamedArray(
                    a, tuple(Axis(ax.name, int(d)) for ax, d in zip(v.axes, a.shape))
                )
            else:
                out[i] = a
        return jax.tree.unflatten(treedef, out)

    arrays = [leaves[i].array if isinstance(leaves[i], NamedArray) else leaves[i] for i in idx]
    return arrays, rebuild


def _layer_specs(stacked: Any, name: str, pipe: Pipeline) -> list[PartitionSpec]:
    leaves, _, idx = _array_leaves(stacked)
    specs = []
    for v in (leaves[i] for i in idx):
        d = layer_dim(v, name)
        if d is None:
            specs.append(PartitionSpec())
        else:
            specs.append(PartitionSpec(*([None] * d), pipe.axis))
    return specs


def _circular_layout(stacked: Any, name: str, pipe: Pipeline, inverse: bool = False) -> Any:
    """The layer axis reordered so that contiguous per-stage blocks hold the round-robin layers:
    layer ``r * p * c + s * c + j`` to position ``s * repeats * c + r * c + j``."""
    p, v = pipe.stages, pipe.repeats

    def one(x: NamedArray) -> NamedArray:
        found = mesh_entries(x)
        placed = found[0] if found is not None else {name: pipe.axis}
        x = _place_like(x, placed)  # (its transpose keeps the gradient where the parameter is)
        c = x.axis_size(name) // (p * v)
        r, st, j = Axis("_pipe_r", v), Axis("_pipe_s", p), Axis("_pipe_c", c)
        src, dst = ((r, st, j), (st, r, j)) if not inverse else ((st, r, j), (r, st, j))
        parts = unflatten_axis(x, name, src)
        names = list(parts.axis_names)
        i = names.index(src[0].name)
        names[i : i + 3] = [a.name for a in dst]
        out = flatten_axes(rearrange(parts, names), [a.name for a in dst], name)
        return _place_like(out, {**placed, name: pipe.axis})

    return map_layers(stacked, name, one)


def _place_like(x: NamedArray, entries: dict[str, Any]) -> NamedArray:
    """``x`` with its axes on ``entries`` (by name), as ``shard`` places a traced array."""
    spec = PartitionSpec(*(entries.get(n) for n in x.axis_names))
    return NamedArray(constrain(x.array, spec, context_mesh()), x.axes)


def run(
    pipe: Pipeline,
    Layer: Axis,
    stage: Callable[..., tuple[Any, Any]],
    stacked: Any,
    keys: Any,
    x: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    with_ys: bool,
) -> Any:
    """Run ``stage(stacked_block, keys_block, h, args, kwargs) -> (h, ys)`` as a pipeline.

    ``stacked`` and ``keys`` have the whole ``Layer`` axis; each stage sees its block (``Layer``
    of the local size). Returns the carry (and, ``with_ys``, the ``ys`` of every layer with a
    ``microbatch`` axis after ``Layer``).
    """
    name = Layer.name
    mesh = context_mesh()
    rules = current_rules()
    body_rules = rules.replace({name: None}) if rules is not None else None
    _check_stage_axes(
        pipe, Layer,
        {"the stack's parameters": stacked, "the stack's input": x,
         "an argument of the stack": (args, kwargs)},
        body_rules,
    )  # fmt: skip
    if pipe.schedule == "circular" and pipe.repeats > 1:
        stacked = _circular_layout(stacked, name, pipe)
        if keys is not None:
            keys = _circular_keys(keys, pipe)
    xs, x_split = split_microbatches(x, pipe.microbatches, pipe.batch_axis, "the stack's input")
    extra, e_split = split_microbatches(
        (args, kwargs), pipe.microbatches, pipe.batch_axis, "an argument of the stack"
    )
    carry = jax.tree.leaves(xs, is_leaf=is_named_array)
    unsplit = [v for v, s in zip(carry, x_split) if not s]
    if not carry or unsplit:
        got = "nothing" if not carry else _describe(unsplit[0])
        raise AxisNotFoundError(
            f"The pipeline splits the stack's input into microbatches along {pipe.batch_axis!r}: "
            f"each leaf of the input must be a NamedArray with that axis, got {got}. Give the "
            f"input a {pipe.batch_axis!r} axis (a models.Transformer's ids: name their batch axis "
            f"{pipe.batch_axis!r}), or pass batch_axis= to the Stacked (Stacked.with_pipeline)."
        )

    p_arrays, p_rebuild = _arrays(stacked)
    p_specs = _layer_specs(stacked, name, pipe)
    k_arrays = [] if keys is None else [keys]
    k_specs = [] if keys is None else [PartitionSpec(pipe.axis)]
    x_arrays, x_rebuild = _arrays(xs)
    e_arrays, e_rebuild = _arrays(extra)
    n_p, n_k, n_x = len(p_arrays), len(k_arrays), len(x_arrays)
    in_specs = tuple(p_specs + k_specs + [PartitionSpec()] * (n_x + len(e_arrays)))
    # (how to rebuild the outputs, how many are the carry's, each output's axes or None)
    traced: list[Any] = []

    operands = (*p_arrays, *k_arrays, *x_arrays, *e_arrays)
    dtypes = [a.dtype for a in operands]
    # XLA:CPU aborts on a bfloat16 psum in a partly manual shard_map, and the backward pass sums
    # the gradient of every operand the stages share (``PartitionSpec()``): on CPUs those enter
    # in float32 and are cast back inside (exact), as ``_psum`` does for the outputs.
    operands = tuple(
        _cpu_wide(a) if spec == PartitionSpec() else a for a, spec in zip(operands, in_specs)
    )

    def body(*flat: Any) -> Any:
        flat = tuple(a.astype(d) if a.dtype != d else a for a, d in zip(flat, dtypes))
        params = p_rebuild(list(flat[:n_p]))
        kb = flat[n_p] if n_k else None
        h_all = x_rebuild(list(flat[n_p + n_k : n_p + n_k + n_x]))
        ex = e_rebuild(list(flat[n_p + n_k + n_x :]))
        with axis_mapping(body_rules) if body_rules is not None else contextlib.nullcontext():
            out, ys = _loop(pipe, Layer, stage, params, kb, h_all, ex, e_split, with_ys)
        o_arrays, o_rebuild = _arrays((out, ys))
        leaves, _, idx = _array_leaves((out, ys))
        o_axes = [leaves[i].axes if isinstance(leaves[i], NamedArray) else None for i in idx]
        traced.append((o_rebuild, len(_arrays(out)[0]), o_axes))
        return tuple(o_arrays)

    def mapped(out_specs: Any) -> Any:
        return jax.shard_map(  # on the context mesh: the Auto view of it under auto_axes
            body, in_specs=in_specs, out_specs=out_specs,
            axis_names=frozenset(pipe.mesh_axes), check_vma=False,
        )  # fmt: skip

    # The carry leaves the stages replicated; ys (layer first) split on the layer axis like the
    # parameters. A first abstract trace counts the carry's leaves.
    probe = jax.eval_shape(mapped(PartitionSpec()), *operands)
    n_out = traced[-1][1]
    specs = tuple(
        PartitionSpec() if i < n_out else PartitionSpec(pipe.axis) for i in range(len(probe))
    )
    call = mapped(specs)
    if explicit_axes(mesh):
        # Sharding in types inside a partly manual shard_map loses the loop's saved activations'
        # layout in XLA (it gathered them over the data and model axes): run the pipeline with
        # the mesh's axes Auto inside, as on an Auto mesh, and give the outputs' types back (the
        # carry as the input, ys on the stage axes and, by name, where the input's axes are).
        out_types = [jax.typeof(a).sharding.spec for a in x_arrays]
        by_name = _input_placement(x, explicit_axes(mesh))
        out_types += [_ys_type(axes, by_name, Layer, pipe, mesh) for axes in traced[-1][2][n_out:]]
        call = jax.sharding.auto_axes(call, out_sharding=tuple(out_types))
    flat_out = call(*operands)
    out, ys = traced[-1][0](list(flat_out))
    out = merge_microbatches(out, pipe.batch_axis)
    if not with_ys:
        return out
    if pipe.repeats > 1:
        ys = _circular_layout(ys, name, pipe, inverse=True)
    return out, merge_microbatches(ys, pipe.batch_axis)


def _input_placement(x: Any, explicit: frozenset[str]) -> dict[str, tuple[str, ...]]:
    """The (Explicit) mesh axes of the stack's input's axes, by name (the first leaf that has a
    name decides)."""
    out: dict[str, tuple[str, ...]] = {}
    for v in jax.tree.leaves(x, is_leaf=is_named_array):
        if isinstance(v, NamedArray):
            for n, axes in axis_placement(v).items():
                out.setdefault(n, tuple(a for a in axes if a in explicit))
    return out


def _ys_type(
    axes: tuple[Axis, ...] | None, by_name: dict[str, tuple[str, ...]], Layer: Axis,
    pipe: Pipeline, mesh: Any,
) -> PartitionSpec:  # fmt: skip
    """The type of one ``ys`` output of the stages (``axes`` as a stage makes it, ``None`` for a
    plain array): the layer axis on the stage axes, every other axis where the input has that
    name (the batch's rows as the input's), when its mesh axes divide it and are still free."""
    if axes is None:
        return PartitionSpec(pipe.axis)
    used = set(pipe.mesh_axes)
    entries = []
    for a in axes:
        if a.name == Layer.name:
            entries.append(pipe.axis)
            continue
        placed = by_name.get(a.name, ())
        if (
            placed
            and not used & set(placed)
            and a.size % math.prod(mesh.shape[m] for m in placed) == 0
        ):
            used |= set(placed)
            entries.append(entry_of(placed))
        else:
            entries.append(None)
    return PartitionSpec(*entries)


def _circular_keys(keys: Any, pipe: Pipeline) -> Any:
    p, v = pipe.stages, pipe.repeats
    c = keys.shape[0] // (p * v)
    return keys.reshape(v, p, c).transpose(1, 0, 2).reshape(p * v * c)


def _loop(
    pipe: Pipeline, Layer: Axis, stage: Callable[..., Any], params: Any, keys: Any,
    h_all: Any, extra: Any, extra_split: list[bool], with_ys: bool,
) -> tuple[Any, Any]:  # fmt: skip
    """The per-device tick loop (inside ``shard_map`` over the stage axes). ``h_all``'s leaves
    are all split into microbatches, ``extra``'s where ``extra_split`` says."""
    p, m, v = pipe.stages, pipe.microbatches, pipe.repeats
    s = jax.lax.axis_index(pipe.axis)
    c = Layer.size // (p * v)  # layers per block
    block_axis = Axis(Layer.name, c)

    def block(r: Any) -> tuple[Any, Any]:
        """The stage's ``r``-th block of layers (and their keys)."""
        if v == 1:
            return params, keys

        def one(x: NamedArray) -> NamedArray:
            i = x.axis_names.index(Layer.name)
            a = jax.lax.dynamic_slice_in_dim(x.array, r * c, c, axis=i)
            return NamedArray(a, x.axes[:i] + (block_axis,) + x.axes[i + 1 :])

        kb = None if keys is None else jax.lax.dynamic_slice_in_dim(keys, r * c, c)
        return map_layers(params, Layer.name, one), kb

    all_split = [True] * len(jax.tree.leaves(h_all, is_leaf=is_named_array))
    first = pick_microbatch(h_all, 0, all_split)
    zeros = jax.tree.map(lambda a: jnp.zeros_like(a), first)
    circ = jax.tree.map(lambda a: jnp.zeros_like(a), h_all) if v > 1 else None
    # What stage 0 takes in at each tick: microbatch t mod m (from the input in the first round,
    # from the ring after that). A scan input, so that its gradient is one slice per tick.
    feed = take_microbatches(h_all, [t % m for t in range(pipe.ticks)])
    # 1f1b: a tick keeps only the stage's input; the backward pass recomputes one stage on one
    # microbatch and runs its backward at once (the stack's policy applies inside that recompute).
    run_stage = (
        eqx.filter_checkpoint(stage, policy=jax.checkpoint_policies.nothing_saveable)
        if pipe.schedule == "1f1b"
        else stage
    )
    ring = [(i, (i + 1) % p) for i in range(p)] if v > 1 else [(i, i + 1) for i in range(p - 1)]

    def tick(carry: Any, xs: Any) -> Any:
        state, circ = carry
        t, fresh = xs
        fresh = _named_like(fresh, first)
        k = t - s
        kc = jnp.clip(k, 0, v * m - 1)
        j, r = kc % m, kc // m
        if v > 1:
            fresh = _where(t < m, fresh, pick_microbatch(circ, t % m, all_split))
        h = _where(s == 0, fresh, state)
        blk, kb = block(r)
        h, y = run_stage(blk, kb, h, *pick_microbatch(extra, j, extra_split), j)
        recv = jax.tree.map(lambda a: permute_blocks(a, pipe.axis, ring), h)
        if v > 1:
            # What the last stage sent at this tick reaches stage 0 and waits for its next round.
            k_back = t - (p - 1)
            kb_c = jnp.clip(k_back, 0, v * m - 1)
            keep = (s == 0) & (k_back >= 0) & (kb_c // m < v - 1)
            circ = _put(circ, kb_c % m, recv, keep)
        return (recv, circ), (h, y)

    ticks = jnp.arange(pipe.ticks)
    _, (hs, ys) = jax.lax.scan(tick, (zeros, circ), (ticks, feed))
    # The last stage finishes microbatch j of the last round at tick (v - 1) m + j + p - 1; it
    # sends the outputs to every stage.
    first_out = (v - 1) * m + p - 1
    outs = jax.tree.map(
        lambda a: _psum(
            jnp.where(s == p - 1, a[first_out : first_out + m], 0).astype(a.dtype), pipe.axis
        ),
        hs,
    )
    outs = _with_axes(outs, h_all)
    if with_ys:
        ys = jax.tree.map(lambda y: _ys_layout(y, s, pipe, Layer.name), ys, is_leaf=is_named_array)
    return outs, ys


def _cpu_wide(a: Any) -> Any:
    """``a`` in float32 if it is bfloat16 and the backend a CPU, else as it is.

    XLA:CPU widens bfloat16 all-reduces itself, and aborts the process on those of a partly manual
    ``shard_map`` ("Invalid binary instruction opcode copy": their reducer ends in a copy), so a
    pipeline under compute=bfloat16 could not compile on a CPU. GPUs reduce bfloat16 as it is."""
    if getattr(a, "dtype", None) == jnp.bfloat16 and jax.default_backend() == "cpu":
        return a.astype(jnp.float32)
    return a


def _psum(a: jax.Array, axis: str) -> jax.Array:
    """``psum`` over ``axis``, in float32 for bfloat16 on CPUs (``_cpu_wide``; exact here: one
    addend is not zero)."""
    return jax.lax.psum(_cpu_wide(a), axis).astype(a.dtype)


def _named_like(arrays: list[Any], like: Any) -> Any:
    """``like`` (one microbatch's NamedArrays) with ``arrays`` in their place."""
    leaves, treedef = jax.tree.flatten(like, is_leaf=is_named_array)
    return jax.tree.unflatten(treedef, [NamedArray(a, v.axes) for a, v in zip(arrays, leaves)])


def _with_axes(outs: Any, like: Any) -> Any:
    """Per-tick outputs (a NamedArray per leaf whose array has a leading microbatch dimension)
    named like ``like`` (``(microbatch, ...)`` leaves)."""
    return jax.tree.map(
        lambda o, ref: NamedArray(o.array, ref.axes) if isinstance(ref, NamedArray) else o,
        outs, like, is_leaf=is_named_array,
    )  # fmt: skip


def _ys_layout(y: Any, s: Any, pipe: Pipeline, name: str) -> Any:
    """The ``ys`` of every tick ``(tick, layer, ...)`` as ``(layer, microbatch, ...)``: stage
    ``s`` works on item ``k`` (repeat ``k // m``, microbatch ``k % m``) at tick ``s + k``. A plain
    array ``y`` (layer first, as ``scan`` stacks it) comes back plain."""
    v, m = pipe.repeats, pipe.microbatches
    named = isinstance(y, NamedArray)
    a = jax.lax.dynamic_slice_in_dim(y.array if named else y, s, v * m, axis=0)
    a = a.reshape(v, m, *a.shape[1:])
    axes = y.axes if named else plain_axes(a.shape[2:], name)
    out = NamedArray(a, (Axis(_REPEAT, v), Axis(MICRO, m), *axes))
    rest = [n for n in out.axis_names if n not in (_REPEAT, MICRO, name)]
    out = flatten_axes(rearrange(out, (_REPEAT, name, MICRO, *rest)), (_REPEAT, name), name)
    return out if named else out.array


def _where(c: Any, a: Any, b: Any) -> Any:
    return jax.tree.map(
        lambda x, y: NamedArray(jnp.where(c, x.array, y.array), x.axes)
        if isinstance(x, NamedArray)
        else jnp.where(c, x, y),
        a, b, is_leaf=is_named_array,
    )  # fmt: skip


def _put(buf: Any, j: Any, val: Any, cond: Any) -> Any:
    """``buf[j] = val`` (the leading microbatch dimension) where ``cond``."""

    def one(b: Any, x: Any) -> Any:
        ba = b.array if isinstance(b, NamedArray) else b
        xa = x.array if isinstance(x, NamedArray) else x
        old = jax.lax.dynamic_index_in_dim(ba, j, 0, keepdims=False)
        new = jax.lax.dynamic_update_index_in_dim(ba, jnp.where(cond, xa, old), j, 0)
        return NamedArray(new, b.axes) if isinstance(b, NamedArray) else new

    return jax.tree.map(one, buf, val, is_leaf=is_named_array)
