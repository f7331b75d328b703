"""``Stacked``: N copies of a layer held as one module with a leading ``layer`` axis."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from .._array import NamedArray, is_named_array
from .._axis import Axis
from .._errors import NamedTypeError
from .._ops.hof import check_remat, fold, scan, vmap
from .._ops.shape import rearrange
from ._pipeline import check_options, pipeline_for
from ._pipeline import run as run_pipeline
from ._precision import current_precision
from ._stacked_leaves import map_layers

__all__ = ["REMAT_POLICIES", "Stacked", "check_gradient_checkpointing"]

# The carry entering each layer, named so that the "offload" policy can move it to host memory.
_CARRY = "stacked_carry"

#: What each named ``gradient_checkpointing`` policy keeps between the forward and backward pass.
REMAT_POLICIES = {
    "none": "everything autodiff saves (no recomputation; the most memory)",
    "dots": "each layer's input and its matmul outputs without batch dimensions (projections); the "
    "rest (norms, activations, attention scores) is recomputed",
    "carry": "each layer's input only (the carry); each layer runs again in the backward pass",
    "offload": "like 'carry', with the carries in host memory (pinned_host), copied back for the "
    "backward pass",
    "full": "only the stack's input: the whole stack runs again in the backward pass (as 'carry', "
    "so each layer runs a third time)",
}


def check_gradient_checkpointing(g: Any, caller: str) -> None:
    """Raise ``NamedTypeError`` unless ``g`` is a ``gradient_checkpointing`` value: a bool,
    ``None``, a name of ``REMAT_POLICIES``, or a ``jax.checkpoint_policies`` policy (or its name)."""
    if not (g is None or isinstance(g, bool) or g in REMAT_POLICIES):
        names = ", ".join(repr(n) for n in REMAT_POLICIES)
        check_remat(g, caller, "gradient_checkpointing", f"one of {names} or ")


def _remat(g: Any) -> tuple[Any, bool]:
    """``(fold's remat=, checkpoint the whole fold?)`` for a ``gradient_checkpointing`` value."""
    if g is None or g is False or g == "none":
        return False, False
    if g is True or g == "carry":
        return True, False
    if g == "dots":
        return jax.checkpoint_policies.dots_with_no_batch_dims_saveable, False
    if g == "offload":
        policy = jax.checkpoint_policies.save_and_offload_only_these_names(
            names_which_can_be_saved=[],
            names_which_can_be_offloaded=[_CARRY],
            offload_src="device",
            offload_dst="pinned_host",
        )
        return policy, False
    if g == "full":
        return True, True
    return g, False  # a jax.checkpoint_policies name or policy


def _name_carry(h: Any) -> Any:
    return jax.tree.map(lambda a: checkpoint_name(a, _CARRY), h)


M = TypeVar("M", bound=eqx.Module)


class _Keep:
    """The default of ``with_pipeline``'s options: keep the stack's value."""

    def __repr__(self) -> str:
        return "<keep>"


_KEEP = _Keep()


def _like(out: Any, carry: Any) -> Any:
    """``out`` with each NamedArray in the axis order of the matching carry leaf."""
    if isinstance(out, NamedArray) and isinstance(carry, NamedArray):
        if out.axis_names != carry.axis_names and set(out.axis_names) == set(carry.axis_names):
            return rearrange(out, carry.axis_names)
        return out
    try:
        return jax.tree.map(_like, out, carry, is_leaf=is_named_array)
    except ValueError:  # different structures: let fold/scan report it
        return out


class Stacked(eqx.Module, Generic[M]):
    """``Layer.size`` layers of one kind, stored as one module whose arrays have a ``layer`` axis.

    ``Stacked(Axis("layer", 4), lambda k: Block(..., key=k), key=key)`` calls the constructor once
    per layer under ``na.vmap`` with one key per layer, so every NamedArray of ``stacked`` gets the
    ``Layer`` axis in front (and every plain array a leading dimension of ``Layer.size``). Calling
    the stack folds over ``Layer`` (``na.fold``, one ``lax.scan``, so the program size does not
    grow with depth): ``stack(x, *args, key=key, **kwargs)`` runs ``x = layer(x, *args, key=k_i,
    **kwargs)`` for each layer in order. Extra arguments are the same for every layer; ``key``
    (optional) is split into one key per layer. ``scan`` is the same for layers that return
    ``(x, y)``, stacking the ``y``\\s on ``Layer``.

    ``gradient_checkpointing`` trades compute for memory (``jax.checkpoint`` of each layer). By
    name, from most memory to least: ``"none"`` (``False``), ``"dots"`` (keep each layer's input and
    its projections' outputs, recompute the rest), ``"carry"`` (``True``: keep only each layer's
    input), ``"offload"`` (as ``"carry"``, in host memory), ``"full"`` (keep only the stack's input;
    the stack runs again in the backward pass). A
    ``jax.checkpoint_policies`` policy or its name is also taken. Gradients are the same for all.

    Args:
        Layer: The stacking axis, e.g. ``Axis("layer", 12)``.
        make: ``key -> layer``; called under ``vmap``, so it must not depend on the key's value
            in Python control flow.
        key: PRNG key, split into one key per layer.
        gradient_checkpointing: A policy name (``"none"``, ``"dots"``, ``"carry"``,
            ``"offload"``, ``"full"``), ``False``/``True``, or a ``jax.checkpoint_policies`` policy
            (or its name).

    Raises:
        NamedTypeError: if ``Layer`` is not an ``Axis``, ``make`` is not callable, or
            ``gradient_checkpointing`` is not a policy.

    Example:
        >>> import jax
        >>> import namedaxes as na
        >>> Embed = na.Axis("embed", 4)
        >>> make = lambda k: na.nn.MLP(Embed, {"mlp": 8}, key=k)
        >>> stack = na.nn.Stacked(na.Axis("layer", 3), make, key=jax.random.key(0))
        >>> stack.stacked.up.weight
        NamedArray(float32, layer=3, embed=4, mlp=8)
        >>> stack(na.ones({"batch": 2, "embed": 4}))
        NamedArray(float32, batch=2, embed=4)
    """

    stacked: M
    Layer: Axis = eqx.field(static=True)
    gradient_checkpointing: Any = eqx.field(static=True)
    microbatches: int | None = eqx.field(static=True)
    schedule: str = eqx.field(static=True)
    repeats: int = eqx.field(static=True)
    batch_axis: str = eqx.field(static=True)

    def __init__(
        self,
        Layer: Axis,
        make: Callable[[jax.Array], M],
        *,
        key: jax.Array,
        gradient_checkpointing: bool | str | Callable[..., Any] = False,
        microbatches: int | None = None,
        schedule: str = "gpipe",
        repeats: int = 2,
        batch_axis: str = "batch",
    ):
        if not isinstance(Layer, Axis):
            raise NamedTypeError(
                f"Stacked needs an Axis for Layer, e.g. Axis('layer', 4), got {Layer!r}."
            )
        if not callable(make):
            raise NamedTypeError(f"Stacked needs a callable key -> layer, got {make!r}.")
        check_gradient_checkpointing(gradient_checkpointing, "Stacked")
        check_options(microbatches, schedule, repeats, "Stacked", batch_axis=batch_axis)
        self.stacked = vmap(make, Layer, map_plain=True)(jax.random.split(key, Layer.size))
        self.Layer = Layer
        self.gradient_checkpointing = gradient_checkpointing
        self.microbatches = microbatches
        self.schedule = schedule
        self.repeats = repeats
        self.batch_axis = batch_axis

    def __call__(self, x: Any, *args: Any, key: jax.Array | None = None, **kwargs: Any) -> Any:
        """Apply the layers in order: ``x = layer_i(x, *args, **kwargs)`` (a fold over ``Layer``).

        The carry keeps ``x``'s structure and axis order (a layer may return the axes in another
        order; they are put back by name).
        """
        return self.fold(x, *args, key=key, **kwargs)

    def fold(self, x: Any, *args: Any, key: jax.Array | None = None, **kwargs: Any) -> Any:
        """The same as calling the stack."""

        def body(h: Any, xs: Any, *args: Any, **kwargs: Any) -> Any:
            layer, k = xs
            extra = kwargs if k is None else {**kwargs, "key": k}
            return _like(layer(_name_carry(h), *args, **extra), h)

        return self._run(fold, body, x, key, args, kwargs)

    def with_pipeline(
        self,
        *,
        microbatches: int | None | _Keep = _KEEP,
        schedule: str | _Keep = _KEEP,
        repeats: int | _Keep = _KEEP,
        batch_axis: str | _Keep = _KEEP,
        gradient_checkpointing: Any = _KEEP,
    ) -> Stacked[M]:
        """A copy with other runtime options (the parameters are shared, not copied).

        Example:
            >>> import jax
            >>> import namedaxes as na
            >>> s = na.nn.Stacked(na.Axis("layer", 2), lambda k: na.nn.RmsNorm({"embed": 3}),
            ...                   key=jax.random.key(0))
            >>> s.with_pipeline(microbatches=4, schedule="circular").schedule
            'circular'
        """
        new = {
            "microbatches": microbatches, "schedule": schedule, "repeats": repeats,
            "batch_axis": batch_axis, "gradient_checkpointing": gradient_checkpointing,
        }  # fmt: skip
        new = {k: v for k, v in new.items() if v is not _KEEP}
        merged = {
            k: new.get(k, getattr(self, k))
            for k in ("microbatches", "schedule", "repeats", "batch_axis", "gradient_checkpointing")
        }
        check_options(
            merged["microbatches"], merged["schedule"], merged["repeats"], "Stacked",
            batch_axis=merged["batch_axis"],
        )  # fmt: skip
        check_gradient_checkpointing(merged["gradient_checkpointing"], "Stacked")
        out = copy.copy(self)
        for k, v in merged.items():
            object.__setattr__(out, k, v)
        return out

    def scan(
        self, x: Any, *args: Any, key: jax.Array | None = None, **kwargs: Any
    ) -> tuple[Any, Any]:
        """Apply layers that return ``(x, y)``; returns ``(x, ys)``, ``ys`` stacked on ``Layer``.

        Pipelined, a ``y`` without the batch axis comes back once per microbatch: with a
        ``microbatch`` axis after ``Layer`` (a plain array: as dimension 1); so such a ``y`` must
        not have an axis named ``microbatch`` already (``DuplicateAxisError``). The input and
        the arguments may have one: the pipeline's own microbatch axis is private."""

        def body(h: Any, xs: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            layer, k = xs
            extra = kwargs if k is None else {**kwargs, "key": k}
            out = layer(_name_carry(h), *args, **extra)
            if not isinstance(out, tuple) or len(out) != 2:
                raise NamedTypeError(
                    f"Stacked.scan needs layers that return (x, y), got {type(out).__name__}. Use "
                    "the stack's fold (calling it) for layers that return x."
                )
            return _like(out[0], h), out[1]

        return self._run(scan, body, x, key, args, kwargs)

    def _run(
        self, loop: Any, body: Any, x: Any, key: Any, args: tuple[Any, ...], kwargs: Any
    ) -> Any:
        """``loop`` (``fold`` or ``scan``) of ``body`` over the layers, with a key per layer and
        the stack's remat policy; pipelined when the mapping places ``layer`` on mesh axes."""
        keys = None if key is None else jax.random.split(key, self.Layer.size)
        x = self._settled(loop, body, x, keys, args, kwargs)
        pipe = pipeline_for(
            self.Layer, self.stacked, self.microbatches, self.schedule, self.repeats,
            self.batch_axis,
        )  # fmt: skip
        if pipe is None:
            return self._layers(loop, body, self.stacked, self.Layer, keys, x, args, kwargs)
        with_ys = loop is scan
        block = Axis(self.Layer.name, self.Layer.size // (pipe.stages * pipe.repeats))

        def stage(blk: Any, kb: Any, h: Any, a: Any, kw: Any, j: Any) -> tuple[Any, Any]:
            if kb is not None:  # each microbatch its own keys
                kb = jax.vmap(lambda k: jax.random.fold_in(k, j))(kb)
            out = self._layers(loop, body, blk, block, kb, h, a, kw)
            return out if with_ys else (out, None)

        return run_pipeline(pipe, self.Layer, stage, self.stacked, keys, x, args, kwargs, with_ys)

    def _settled(
        self, loop: Any, body: Any, x: Any, keys: Any, args: tuple[Any, ...], kwargs: Any
    ) -> Any:
        """``x`` in the dtypes a layer returns for it, as the carry of a loop must keep one type.

        Under a precision policy a layer may return another floating dtype than it was given (a
        float32 input, bfloat16 compute): layers applied one after another pass that dtype on,
        so the stack starts the carry in it. Found by evaluating the first layer's shapes, only
        while a policy sets a compute or output dtype."""
        policy = current_precision()
        if policy.compute is None and policy.output is None:
            return x
        step = (self._layer(0), None if keys is None else keys[0])
        out = jax.eval_shape(lambda h: body(h, step, *args, **kwargs), x)
        carry = out[0] if loop is scan else out

        def cast(h: Any, o: Any) -> Any:
            floating = jnp.issubdtype(h.dtype, jnp.floating) and jnp.issubdtype(
                o.dtype, jnp.floating
            )
            return h.astype(o.dtype) if floating and h.dtype != o.dtype else h

        try:
            return jax.tree.map(cast, x, carry, is_leaf=is_named_array)
        except ValueError:  # another structure: the loop itself says what differs
            return x

    def _layers(
        self, loop: Any, body: Any, stacked: Any, Layer: Axis, keys: Any, x: Any,
        args: tuple[Any, ...], kwargs: Any,
    ) -> Any:  # fmt: skip
        remat, whole = _remat(self.gradient_checkpointing)
        run = loop(body, Layer, remat=remat)
        if whole:
            run = eqx.filter_checkpoint(run, policy=jax.checkpoint_policies.nothing_saveable)
        return run(x, (stacked, keys), *args, **kwargs)

    def pipeline_options(self) -> dict[str, Any]:
        """The runtime options the planner prices (``namedaxes.analysis.plan``): the layer axis's
        name and size, ``microbatches`` (``None``: one per stage), ``schedule``, ``repeats`` and
        ``batch_axis``.

        Example:
            >>> import jax
            >>> import namedaxes as na
            >>> s = na.nn.Stacked(na.Axis("layer", 2), lambda k: na.nn.RmsNorm({"embed": 3}),
            ...                   key=jax.random.key(0), microbatches=8)
            >>> s.pipeline_options()["microbatches"]
            8
        """
        return {
            "layer": self.Layer.name, "layers": self.Layer.size,
            "microbatches": self.microbatches, "schedule": self.schedule, "repeats": self.repeats,
            "batch_axis": self.batch_axis,
        }  # fmt: skip

    def unstacked(self) -> tuple[M, ...]:
        """The layers as separate modules (each without the ``Layer`` axis), in order.

        Example:
            >>> import jax
            >>> import namedaxes as na
            >>> s = na.nn.Stacked(na.Axis("layer", 2), lambda k: na.nn.RmsNorm({"embed": 3}),
            ...                   key=jax.random.key(0))
            >>> [m.weight for m in s.unstacked()]
            [NamedArray(float32, embed=3), NamedArray(float32, embed=3)]
        """
        return tuple(self._layer(i) for i in range(self.Layer.size))

    def _layer(self, i: int) -> M:
        """Layer ``i`` as a module without the ``Layer`` axis (plain arrays without their leading
        dimension, as ``fold`` maps them)."""
        name = self.Layer.name
        return map_layers(self.stacked, name, lambda x: x[name, i])
