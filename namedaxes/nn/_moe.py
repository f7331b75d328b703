"""``MoE``: a mixture of experts over a named ``experts`` axis, and its router statistics."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any, cast

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from .._array import NamedArray
from .._axis import Axis, AxisSpec
from .._errors import (
    AxisNotFoundError,
    LayerError,
    NamedTypeError,
    ShardingError,
    format_axes,
    format_names,
)
from .._mesh import context_mesh
from .._ops.elementwise import sigmoid
from .._ops.hof import vmap
from .._ops.shape import broadcast_to, rearrange
from .._partitioning._shard_map import shard_map
from .._spec import entry_axes
from ..kernels._grouped_matmul import mosaic_runs
from ._attention_kernels import note_once
from ._common import (
    as_axes,
    compute,
    expect_axes,
    expect_free,
    mesh_entries,
    output,
    param,
    spec_by_name,
)
from ._linear import Linear
from ._mlp import MLP, _by_name
from ._moe_dispatch import Narrow, Placement, Routing, local_moe
from ._precision import current_precision
from ._quantized import QuantizedArray

__all__ = ["DISPATCHES", "MoE", "RouterStats"]

#: ``dispatch`` options; ``"auto"`` picks by :func:`auto_dispatch`.
DISPATCHES = ("auto", "ragged", "grouped", "dense", "capacity")


def auto_dispatch(capacity_factor: float | None, dtype: Any) -> str:
    """What ``dispatch="auto"`` runs: the fastest dispatch ``benchmarks/moe_dispatch.py`` measured
    on this backend (docs/nn.md has the table).

    With a ``capacity_factor``, ``"capacity"`` (one batched matmul; every dispatch drops the same
    choices, and it was the fastest on the H100 and on CPUs). Without one: ``"grouped"`` on
    Hopper GPUs for 16-bit compute (the Mosaic GPU grouped matmul: 1.7-4.9x ``"dense"`` at 8-64
    experts), ``"dense"`` on CPUs (where XLA's ``ragged_dot`` is a masked dense product), and
    ``"ragged"`` elsewhere (TPUs and other GPUs, not measured yet), with a one-time note on GPUs.

    Example:
        >>> import jax.numpy as jnp
        >>> from namedaxes.nn._moe import auto_dispatch
        >>> auto_dispatch(1.25, jnp.float32)
        'capacity'
    """
    if capacity_factor is not None:
        return "capacity"
    backend = jax.default_backend()
    if backend == "cpu":
        return "dense"
    if backend == "gpu":
        if mosaic_runs(dtype):
            return "grouped"
        note_once(
            f"MoE dispatch='auto' runs 'ragged' (jax.lax.ragged_dot) here: the fast grouped matmul "
            f"needs a Hopper GPU and bfloat16/float16 compute (got {jnp.dtype(dtype).name} on "
            f"{jax.devices()[0].device_kind}); pass dispatch= to choose."
        )
    return "ragged"


SCORINGS = ("softmax", "sigmoid")


class RouterStats(eqx.Module):
    """What a router did, summed over tokens: enough for the load-balancing loss.

    ``counts`` is how many top-k choices went to each expert and ``probs`` the routing
    probabilities summed per expert (softmax scores; sigmoid scores normalised to sum to 1 per
    token), both over the tokens that were routed (``where``); ``tokens`` counts those tokens.
    Statistics of several layers (``Stacked.scan`` gives them a ``layer`` axis) are pooled, as
    ``transformers`` pools the router logits of all layers.
    """

    counts: NamedArray
    probs: NamedArray
    tokens: NamedArray

    def load_balancing_loss(self) -> jax.Array:
        """The auxiliary load-balancing loss of Switch Transformer, as ``transformers`` computes it.

        ``num_experts * sum_e f_e * P_e``, with ``f_e`` the fraction of top-k choices that went
        to expert ``e`` (per token, so the ``f_e`` sum to ``top_k``) and ``P_e`` the mean routing
        probability of ``e``, both over every routed token of every layer. It is 1 for a uniform
        router (times ``top_k``) and grows as the load concentrates. Scale it (e.g. by
        ``router_aux_loss_coef``) and add it to the training loss.

        Returns:
            A float32 scalar.

        Raises:
            NamedTypeError: if a field is not a NamedArray.
            AxisNotFoundError: unless ``counts`` and ``probs`` have the axes of ``tokens`` and
                one more, the experts.

        Example:
            >>> import jax.numpy as jnp
            >>> import namedaxes as na
            >>> even = na.nn.RouterStats(  # 4 tokens, top-2 of 4 experts, spread evenly
            ...     counts=na.named(jnp.full(4, 2.0), "experts"),
            ...     probs=na.named(jnp.full(4, 1.0), "experts"),
            ...     tokens=na.named(jnp.asarray(4.0), ()),
            ... )
            >>> float(even.load_balancing_loss())  # 4 * 4 * (2/4 * 1/4): top_k for an even load
            2.0
        """
        experts = self._experts_axis()
        n = jnp.maximum(jnp.sum(self.tokens.array), 1.0)
        keep = (experts.name,)
        f = _sum_but(self.counts, keep) / n
        p = _sum_but(self.probs, keep) / n
        return experts.size * jnp.sum(f * p)

    def _experts_axis(self) -> Axis:
        """The experts axis, by name: the one axis of ``counts`` that ``tokens`` lacks (the
        statistics may be stacked over layers, in any axis order); the errors of
        :meth:`load_balancing_loss`."""
        for field in ("counts", "probs", "tokens"):
            value = getattr(self, field)
            if not isinstance(value, NamedArray):
                example = "()" if field == "tokens" else "'experts'"
                raise NamedTypeError(
                    f"RouterStats: {field} must be a NamedArray, got {type(value).__name__} of "
                    f"shape {jnp.shape(value)}. Name its axes as MoE does, e.g. "
                    f"na.named({field}, {example})."
                )
        own = [a for a in self.counts.axes if not self.tokens.has_axis(a.name)]
        others = set(self.counts.axis_names) - {a.name for a in own}
        if (
            len(own) != 1
            or set(self.tokens.axis_names) != others
            or set(self.probs.axis_names) != set(self.counts.axis_names)
        ):
            raise AxisNotFoundError(
                f"RouterStats: counts NamedArray({format_axes(self.counts.axes)}) must have the "
                f"axes of tokens NamedArray({format_axes(self.tokens.axes)}) and exactly one "
                f"more (the experts), and probs NamedArray({format_axes(self.probs.axes)}) the "
                "axes of counts. Build them as MoE does: counts and probs over (..., experts), "
                "tokens over the same other axes."
            )
        return own[0]


def _sum_but(x: NamedArray, keep: tuple[str, ...]) -> jax.Array:
    others = tuple(n for n in x.axis_names if n not in keep)
    return (x.sum(others) if others else x).array


class MoE(eqx.Module):
    """A mixture of experts: each token goes through the ``top_k`` of ``Experts`` MLPs its router
    scores highest, weighted by those scores.

    Parameters: ``router`` (``Embed -> Experts``, no bias) and ``experts``, one gated MLP
    (``down(act(gate(x)) * up(x))``, or ``down(act(up(x)))`` with ``gated=False``) per expert:
    weights ``(experts, embed, Hidden)`` and ``(experts, Hidden, embed)``. Optional: a ``shared``
    MLP every token goes through (hidden axis ``shared_mlp``), scaled by ``sigmoid`` of a
    ``shared_gate`` (``Embed -> shared_gate``, size 1) with ``shared_gate=True`` (Qwen2-MoE).

    Routing: scores are ``softmax`` (or ``sigmoid``) of the router logits, in float32; each token
    takes the ``top_k`` highest and weights its experts' outputs by their scores (renormalised to
    sum to 1 with ``normalize=True``, as Mixtral does). With ``capacity_factor=c`` each expert
    takes at most ``ceil(c * top_k * n / E)`` of the choices made by the ``n`` tokens of a sequence
    (each index of the input's axes other than ``position`` and ``Embed``; the whole input without
    a ``position`` axis), first come first served: in position order, and without a ``position``
    axis in the row-major order of the token axes sorted by name (``(batch, seq)`` whatever the
    layout); the rest are dropped (those tokens get less, or nothing, from the experts). Without
    it (default) nothing is dropped.

    Dispatch: ``"ragged"`` sorts the choices by expert and runs each projection as one grouped
    matmul (``jax.lax.ragged_dot``); ``"grouped"`` does the same with
    :func:`namedaxes.kernels.grouped_matmul`, a kernel that does only the routed work forward and
    backward (JAX's Mosaic GPU grouped matmuls on Hopper GPUs, Pallas/Triton on other GPUs,
    megablox on TPUs; on CPUs Pallas interpret mode, which is slow: for tests); ``"dense"`` runs every expert on every token and combines them with the
    routing weights (zero for experts not chosen): ``E / top_k`` times the work, no sorting;
    ``"capacity"`` (needs ``capacity_factor``) places each sequence's kept choices in
    ``(experts, capacity)`` slots and runs one ``(E, slots, Embed) x (E, Embed, Hidden)`` batched
    matmul per projection (GShard's layout). ``"auto"`` (default) is the fastest measured on the
    backend (:func:`auto_dispatch`): ``"capacity"`` with a ``capacity_factor``; else ``"grouped"``
    on Hopper GPUs for 16-bit compute, ``"dense"`` on CPUs (where XLA computes ``ragged_dot`` as
    a masked dense product, ``top_k`` times the dense work), ``"ragged"`` elsewhere. All give the
    same values and drop the same choices, in the input's and the experts' dtypes promoted (as
    ``Linear`` does).

    Under a precision policy with ``matmul="float8"`` the experts' products run in float8 when
    the rules pick the names of each expert's ``Linear``s (``Embed`` and ``Hidden``; by default
    ``expert_mlp`` goes), with float8's numbers but, on GPUs, not yet its speed (see
    ``docs/nn.md``); the router follows its own ``Linear``'s rule (it stays by default).

    Under a mapping, the layer runs per device (``shard_map``): placing ``experts`` on mesh axes
    is expert parallelism (each device holds and computes its block of experts; with
    ``"ragged"``, ``"grouped"`` and ``"capacity"`` the tokens' choices travel to their experts'
    devices and back by all-to-all), placing ``Hidden`` splits each expert (tensor parallelism),
    and the token axes stay where they are. ``Embed`` is gathered for the layer.

    Args:
        Embed: The input and output axes.
        Experts: The experts axis, e.g. ``Axis("experts", 8)``.
        Hidden: Each expert's hidden axes, e.g. ``{"expert_mlp": 1024}``.
        top_k: Experts per token.
        key: PRNG key.
        activation: A function of a NamedArray or an activation name (default ``"silu"``).
        gated: Gated experts (SwiGLU with ``"silu"``).
        scoring: ``"softmax"`` or ``"sigmoid"``.
        normalize: Renormalise each token's top-k weights to sum to 1.
        capacity_factor: Capacity per expert as a multiple of an even share (capped at the
            group's token count, which no expert can exceed), or ``None`` (dropless).
        dispatch: ``"auto"``, ``"ragged"``, ``"grouped"``, ``"dense"`` or ``"capacity"``.
        SharedHidden: The hidden axes of a shared expert, or ``None`` for none.
        shared_gate: Scale the shared expert by a learned sigmoid gate.
        position: The sequence axis of the inputs (capacity counts per sequence).
        init_scale: Passed to every ``Linear``.
        dtype: The parameters' float dtype.

    Raises:
        LayerError: for ``top_k`` outside ``1 .. Experts.size``, an unknown ``scoring``,
            ``dispatch`` or activation, a capacity factor that is not positive, or
            ``dispatch="capacity"`` without one.

    Example:
        >>> import jax
        >>> import namedaxes as na
        >>> moe = na.nn.MoE({"embed": 8}, na.Axis("experts", 4), {"expert_mlp": 16}, top_k=2,
        ...                 key=jax.random.key(0))
        >>> moe.experts.up.weight
        NamedArray(float32, experts=4, embed=8, expert_mlp=16)
        >>> y, stats = moe(na.ones({"batch": 2, "position": 3, "embed": 8}))
        >>> y, float(stats.tokens.array)
        (NamedArray(float32, batch=2, position=3, embed=8), 6.0)
        >>> loss = 0.01 * stats.load_balancing_loss()  # add to the training loss
    """

    router: Linear
    experts: MLP
    shared: MLP | None
    shared_gate: Linear | None
    Embed: tuple[Axis, ...] = eqx.field(static=True)
    Experts: Axis = eqx.field(static=True)
    Hidden: tuple[Axis, ...] = eqx.field(static=True)
    top_k: int = eqx.field(static=True)
    scoring: str = eqx.field(static=True)
    normalize: bool = eqx.field(static=True)
    capacity_factor: float | None = eqx.field(static=True)
    dispatch: str = eqx.field(static=True)
    position: str = eqx.field(static=True)

    def __init__(
        self,
        Embed: AxisSpec,
        Experts: Axis,
        Hidden: AxisSpec,
        *,
        top_k: int,
        key: jax.Array,
        activation: Callable[[NamedArray], NamedArray] | str = "silu",
        gated: bool = True,
        scoring: str = "softmax",
        normalize: bool = False,
        capacity_factor: float | None = None,
        dispatch: str = "auto",
        SharedHidden: AxisSpec | None = None,
        shared_gate: bool = False,
        position: str = "position",
        init_scale: float = 1.0,
        dtype: Any = None,
    ):
        self.Embed, self.Hidden = as_axes(Embed, "MoE Embed"), as_axes(Hidden, "MoE Hidden")
        if not isinstance(Experts, Axis):
            raise NamedTypeError(
                f"MoE needs an Axis for Experts, e.g. Axis('experts', 8), got {Experts!r}."
            )
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= Experts.size:
            raise LayerError(
                f"MoE: top_k={top_k!r} must be an int from 1 to the {Experts.size} experts."
            )
        _check_choice("scoring", scoring, SCORINGS)
        _check_choice("dispatch", dispatch, DISPATCHES)
        if capacity_factor is not None and not (
            isinstance(capacity_factor, (int, float))
            and not isinstance(capacity_factor, bool)
            and math.isfinite(capacity_factor)
            and capacity_factor > 0
        ):
            raise LayerError(
                f"MoE: capacity_factor={capacity_factor!r} must be a finite positive number, or "
                "None for dropless routing."
            )
        if dispatch == "capacity" and capacity_factor is None:
            raise LayerError(
                "MoE: dispatch='capacity' runs the experts on (experts, capacity) slots and "
                "needs a capacity_factor (e.g. 1.25); for dropless routing use 'ragged', "
                "'grouped' or 'dense'."
            )
        act = _by_name(activation) if isinstance(activation, str) else activation
        k_router, k_experts, k_shared, k_gate = jax.random.split(key, 4)
        kw = dict(use_bias=False, init_scale=init_scale, dtype=dtype)
        self.router = Linear(self.Embed, Experts, key=k_router, **kw)

        def one(k: jax.Array) -> MLP:
            return MLP(self.Embed, self.Hidden, key=k, activation=act, gated=gated, **kw)

        keys = jax.random.split(k_experts, Experts.size)
        self.experts = vmap(one, Experts, map_plain=True)(keys)
        self.shared = None
        if SharedHidden is not None:
            shared_axes = as_axes(SharedHidden, "MoE SharedHidden")
            self.shared = MLP(
                self.Embed, shared_axes, key=k_shared, activation=act, gated=gated, **kw
            )
        self.shared_gate = None
        if shared_gate:
            if self.shared is None:
                raise LayerError("MoE: shared_gate=True needs a shared expert (SharedHidden=...).")
            self.shared_gate = Linear(self.Embed, Axis("shared_gate", 1), key=k_gate, **kw)
        self.Experts, self.top_k, self.scoring = Experts, top_k, scoring
        self.normalize = bool(normalize)
        self.capacity_factor = None if capacity_factor is None else float(capacity_factor)
        self.dispatch, self.position = dispatch, position

    def __call__(
        self, x: NamedArray, *, where: NamedArray | None = None
    ) -> tuple[NamedArray, RouterStats]:
        """Route every token of ``x`` to its experts; the output has ``x``'s axes.

        Args:
            x: ``(..., Embed)``: every other axis is a token axis.
            where: Optional boolean NamedArray over (some of) the token axes: ``False`` tokens
                (padding) skip the routed experts (their output is only the shared expert's, if
                any) and are left out of the statistics and of the capacity.

        Returns:
            ``(y, stats)``: the output and the :class:`RouterStats` of this call.

        Raises:
            AxisNotFoundError: if ``x`` lacks an ``Embed`` axis, or ``where`` has an axis ``x``
                lacks.
            DuplicateAxisError: if ``x`` already has the experts or hidden axes.
            ShardingError: if the mapping splits the tokens over the mesh axes of ``Hidden``,
                or, with a capacity, splits a sequence over devices.
        """
        x = expect_axes(x, self.Embed, "MoE")
        names = [self.Experts.name, *(a.name for a in self.Hidden)]
        expect_free(x, names, "MoE", "is an axis the layer creates")
        embed = tuple(a.name for a in self.Embed)
        tokens = [a for a in x.axes if a.name not in embed]
        if self.capacity_factor is not None:
            # Capacity is first come, first served within a group (one sequence each, in position
            # order; else every token): order the tokens by name, so what is dropped does not
            # depend on the layout. Dropless routing treats every token alike in any order.
            tokens.sort(key=lambda a: (a.name == self.position, a.name))
        mask = _mask(where, tokens)
        xc = rearrange(compute(x), [a.name for a in tokens] + list(embed))
        gate = None if self.experts.gate is None else self.experts.gate.weight
        experts = (gate, self.experts.up.weight, self.experts.down.weight)
        # The experts compute in the input's and their weights' dtypes promoted, as Linear's dot
        # does (every dispatch alike; the grouped kernels take one dtype).
        dtype = functools.reduce(
            jnp.promote_types, (_compute_dtype(w) for w in experts if w is not None), xc.dtype
        )
        weights = (
            param(self.router.weight),
            *(
                None if w is None else self._read(w, kind, dtype)
                for w, kind in zip(experts, ("gate", "up", "down"))
            ),
        )
        y, counts, probs, count = self._run(_cast(xc, dtype), mask, weights, tokens)
        y = rearrange(y, x.axis_names)
        if self.shared is not None:
            s = self.shared(x)
            if self.shared_gate is not None:
                s = s * sigmoid(self.shared_gate(x))["shared_gate", 0]
            y = y + s
        return output(y), RouterStats(counts, probs, count)

    def _read(self, w: Any, kind: str, dtype: Any) -> Any:
        """An expert weight where the layer uses it (``param``) in ``dtype``, or a quantized one
        with scales per expert and output column (``models.quantize``) as its placed values and
        scales, which the experts' products read narrow (``_moe_dispatch.Narrow``: scaled in the
        rows' dtype)."""
        contracted = {a.name for a in (self.Hidden if kind == "down" else self.Embed)}
        if isinstance(w, QuantizedArray) and not set(w.scale.axis_names) & contracted:
            return Narrow(*w.placed())
        return _cast(param(w), dtype)

    def _routing(self, tokens: list[Axis], dtype: Any) -> Routing:
        dispatch = self.dispatch
        if dispatch == "auto":
            dispatch = auto_dispatch(self.capacity_factor, dtype)
        group = tokens[-1].size if tokens and tokens[-1].name == self.position else None
        experts = self.Experts.size
        capacity = None
        if self.capacity_factor is not None:
            n = group if group is not None else math.prod(a.size for a in tokens)
            # An expert gets at most one choice per token of the group (top_k picks distinct
            # experts), so a larger capacity drops nothing more: capped, it also bounds the slots.
            capacity = min(math.ceil(self.capacity_factor * self.top_k * n / experts), n)
        act = self.experts.activation
        # The experts' products are named like each expert's Linears: embed and the hidden axes.
        names = [a.name for a in (*self.Embed, *self.Hidden)]
        policy = current_precision()
        return Routing(
            experts=experts,
            top_k=self.top_k,
            scoring=self.scoring,
            normalize=self.normalize,
            capacity=capacity,
            group=group if group is not None else -1,
            dispatch=dispatch,
            activation=lambda a: act(NamedArray(a, _dims(a))).array,
            gated=self.experts.gate is not None,
            float8=policy.scaling if policy.float8(names) else None,
        )

    def _run(
        self, x: NamedArray, mask: NamedArray, weights: tuple[Any, ...], tokens: list[Axis]
    ) -> tuple[NamedArray, NamedArray, NamedArray, NamedArray]:
        routing = self._routing(tokens, x.dtype)
        up = weights[2].values if isinstance(weights[2], Narrow) else weights[2]
        entries = self._entries(x, up)
        n_embed = len(self.Embed)

        def body(x: NamedArray, mask: NamedArray, *w: Any, p: Placement) -> Any:
            local = x.axes[: x.ndim - n_embed]
            t = math.prod(a.size for a in local)
            r = routing
            if r.group == -1:  # one group: all of this device's tokens
                r = dataclasses.replace(r, group=t)
            h = math.prod(a.size for a in self.Embed)
            router, gate, up, down = (
                None if v is None else self._array(v, kind)
                for v, kind in zip(w, ("router", "gate", "up", "down"))
            )
            y, (c, pr, n) = local_moe(
                x.array.reshape(t, h), mask.array.reshape(t), cast(jax.Array, router),
                (gate, cast(jax.Array, up), cast(jax.Array, down)), r, p,
            )  # fmt: skip
            out = NamedArray(y.reshape(x.array.shape), x.axes)
            exp = (self.Experts,)
            return out, NamedArray(c, exp), NamedArray(pr, exp), NamedArray(n, ())

        if entries is None:
            return body(x, mask, *weights, p=Placement())  # type: ignore[no-any-return]
        placement, specs = self._placement(x, mask, weights, entries)
        run = shard_map(
            lambda *a: body(*a, p=placement),
            in_specs=specs,
            out_specs=(specs[0], PartitionSpec(), PartitionSpec(), PartitionSpec()),
            check_vma=False,
        )
        return run(x, mask, *weights)  # type: ignore[no-any-return]

    def _array(self, w: Any, kind: str) -> Any:
        """A weight as ``(H, E)`` (router), ``(E, H, I)`` (gate, up) or ``(E, I, H)`` (down); a
        :class:`Narrow` one's scales as ``(E, I)`` (gate, up) or ``(E, H)`` (down)."""
        if isinstance(w, Narrow):
            out = [a.name for a in (self.Embed if kind == "down" else self.Hidden)]
            scale = rearrange(w.scale, [self.Experts.name] + out).array
            return Narrow(self._array(w.values, kind), scale.reshape(scale.shape[0], -1))
        embed = [a.name for a in self.Embed]
        hidden = [a.name for a in self.Hidden]
        experts = self.Experts.name
        if kind == "router":
            return rearrange(w, embed + [experts]).array.reshape(-1, w.axis_size(experts))
        order = [experts] + (hidden + embed if kind == "down" else embed + hidden)
        first, second = (hidden, embed) if kind == "down" else (embed, hidden)
        shape = (w.axis_size(experts), _size(w, first), _size(w, second))
        return rearrange(w, order).array.reshape(shape)

    def _entries(self, x: NamedArray, up: NamedArray) -> dict[str, Any] | None:
        """``{axis name: mesh axes}`` for the tokens, experts and hidden axes, or ``None`` when
        the layer runs without ``shard_map`` (no mesh, one device, or an Auto mesh without a
        mapping: XLA places it)."""
        per_name = mesh_entries(x, up)
        if per_name is None:
            return None
        out = {**per_name[0], **per_name[1]}
        for a in self.Embed:
            out[a.name] = None
        if not any(e is not None for e in out.values()):
            return None
        return out

    def _placement(
        self, x: NamedArray, mask: NamedArray, weights: tuple[Any, ...], entries: dict[str, Any]
    ) -> tuple[Placement, tuple[Any, ...]]:
        mesh = context_mesh()
        sizes = tuple((str(k), int(v)) for k, v in dict(mesh.shape).items())  # type: ignore[union-attr]
        token_names = [n for n in x.axis_names if n not in {a.name for a in self.Embed}]
        tok = [m for n in token_names for m in entry_axes(entries[n])]
        ep = entry_axes(entries.get(self.Experts.name))
        tp = tuple(m for a in self.Hidden for m in entry_axes(entries.get(a.name)))
        clash = sorted(set(tp) & set(tok))
        if clash:
            raise ShardingError(
                f"MoE: the mapping splits the tokens of NamedArray({format_axes(x.axes)}) and the "
                f"experts' hidden axes {format_names(a.name for a in self.Hidden)} over the same "
                f"mesh axes {format_names(clash)}. Map the hidden axes elsewhere (or to None)."
            )
        if self.capacity_factor is not None:
            grouped = [self.position] if self.position in token_names else token_names
            split = [n for n in grouped if entries[n] is not None]
            if split:
                raise ShardingError(
                    f"MoE: capacity counts along {format_names(grouped)}, but the mapping splits "
                    f"{format_names(split)} over devices. Keep the sequence whole on each device "
                    "(map it to None) or use dropless routing (capacity_factor=None)."
                )
        many = {k for k, v in sizes if v > 1}  # collectives over one device are left out
        ep = tuple(m for m in ep if m in many)
        tokens = tuple(m for m in dict.fromkeys(tok) if m in many)
        placement = Placement(
            ep=ep,
            rep=tuple(m for m in ep if m not in tokens),
            split=tuple(m for m in ep if m in tokens),
            tokens=tokens,
            tp=tuple(m for m in tp if m in many),
            sizes=sizes,
        )

        router = PartitionSpec()

        def spec(v: Any) -> Any:
            if isinstance(v, Narrow):
                return Narrow(spec_by_name(v.values, entries), spec_by_name(v.scale, entries))
            return None if v is None else spec_by_name(v, entries)

        by_name = [spec(v) for v in (x, mask, *weights[1:])]
        specs = (by_name[0], by_name[1], router, *by_name[2:])
        return placement, specs


def _compute_dtype(w: Any) -> Any:
    """The dtype ``param`` gives a weight (a quantized one: the dtype it dequantizes to)."""
    compute = current_precision().compute
    return jnp.dtype(w.dtype if compute is None else compute)


def _cast(x: NamedArray, dtype: Any) -> NamedArray:
    return x if x.dtype == dtype else x.astype(dtype)


def _size(w: NamedArray, names: list[str]) -> int:
    return math.prod(w.axis_size(n) for n in names)


def _dims(a: jax.Array) -> tuple[Axis, ...]:
    return tuple(Axis(f"d{i}", int(s)) for i, s in enumerate(a.shape))


def _check_choice(what: str, value: Any, options: tuple[str, ...]) -> None:
    if value not in options:
        raise LayerError(f"MoE: {what}={value!r} is not one of {format_names(options)}.")


def _mask(where: Any, tokens: list[Axis]) -> NamedArray:
    if where is None:
        return NamedArray(jnp.ones(tuple(a.size for a in tokens), bool), tuple(tokens))
    if not isinstance(where, NamedArray) or where.dtype != jnp.bool_:
        raise NamedTypeError(
            f"MoE: where must be a boolean NamedArray over the token axes, got {where!r}."
        )
    names = {a.name for a in tokens}
    extra = [n for n in where.axis_names if n not in names]
    if extra:
        raise AxisNotFoundError(
            f"MoE: where NamedArray({format_axes(where.axes)}) has axis {extra[0]!r}, which is not "
            f"a token axis of the input (token axes: {format_names(a.name for a in tokens)})."
        )
    return broadcast_to(where, tuple(tokens))
