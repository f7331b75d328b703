"""Where each parameter of a :class:`Transformer` is in a Hugging Face checkpoint, and how its blocks
map to slices of the stored tensors.

A stored tensor is described by its dimensions as groups of named axes, row-major: a q projection
``(heads * head_dim, embed)`` is ``((heads, head_dim), (embed,))``, GPT-2's fused ``c_attn``
``(embed, 3 * heads * head_dim)`` is ``((embed,), (fused, heads, head_dim))`` with the query at
``fused = 0``. Our parameter is the same data with the axes in its own order (plus ``layer`` for
the stacked decoder layers, one stored tensor per layer, and ``experts`` where each expert has its
own tensors), so reading a block of it by name is reading a block of each stored tensor and
transposing: no host ever needs a whole tensor.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from .._array import NamedArray
from .._axis import Axis
from .._errors import ModelConfigError
from ._families import Family
from ._safetensors import Checkpoint

__all__ = ["LAYER", "Tensor", "pick", "read_block", "tensors_of", "to_stored"]

LAYER = "layer"
EXPERTS = "experts"
FUSED = "fused"


@dataclass(frozen=True)
class Tensor:
    """One parameter of the model and the stored tensor(s) it comes from.

    ``hf``: the stored name (``{i}``: layer index, ``{e}``: expert index); ``path``: attribute
    path of the NamedArray in the model; ``groups``: the stored dimensions as groups of axes (of
    one stored tensor); ``part``: this parameter's ``(index, count)`` along the ``fused`` axis of a
    fused tensor; ``per``: the axes with one stored tensor per index (``layer``, and ``experts``
    where each expert has its own tensors), in the order of ``hf``'s indices.
    """

    hf: str
    path: tuple[str, ...]
    groups: tuple[tuple[Axis, ...], ...]
    part: tuple[int, int] | None
    per: tuple[Axis, ...]

    def name(self, index: tuple[int, ...] = ()) -> str:
        """The stored name of the tensor at ``index`` (one entry per axis of ``per``)."""
        at = dict(zip((a.name for a in self.per), index))
        return self.hf.format(i=at.get(LAYER), e=at.get(EXPERTS))

    def indices(self) -> list[tuple[int, ...]]:
        """Every index of ``per``, in order (``[()]`` for a single stored tensor)."""
        return list(itertools.product(*(range(a.size) for a in self.per)))

    @property
    def shape(self) -> tuple[int, ...]:
        """The stored tensor's shape."""
        return tuple(math.prod(a.size for a in g) for g in self.groups)

    @property
    def view(self) -> tuple[Axis, ...]:
        """The stored dimensions split into their axes, in order."""
        return tuple(a for g in self.groups for a in g)


def _groups(
    module: Any, layout: str, param: str, fused: Axis | None, leaf: NamedArray
) -> tuple[tuple[Axis, ...], ...]:
    if layout == "experts":  # (experts, out, in): a linear layer per expert, in one tensor
        linear = _groups(module, "linear", param, fused, leaf)
        return ((leaf.resolve_axis(EXPERTS),), *linear)
    if layout in ("linear", "conv1d"):
        out = ((fused,) if fused is not None else ()) + tuple(module.Out)
        if param == "bias":
            return (out,)
        return (out, tuple(module.In)) if layout == "linear" else (tuple(module.In), out)
    if layout == "norm":
        return (tuple(module.axis),)
    if layout == "embedding":
        return ((module.Vocab,), (module.Embed,))
    raise ModelConfigError(f"Internal: unknown stored layout {layout!r}.")


def _get(tree: Any, path: Sequence[str]) -> Any:
    for p in path:
        tree = getattr(tree, p)
    return tree


def _leaf_paths(model: Any) -> list[tuple[str, ...]]:
    leaves = jax.tree_util.tree_flatten_with_path(
        model, is_leaf=lambda x: isinstance(x, NamedArray)
    )[0]
    return [
        tuple(str(getattr(k, "name", k)) for k in path)
        for path, leaf in leaves
        if isinstance(leaf, NamedArray)
    ]


def tensors_of(model: Any, family: Family, *, fused: bool = False) -> list[Tensor]:
    """Every parameter of ``model`` with its stored name and layout, in the family's order
    (experts fused into one tensor per layer with ``fused``, else one per expert).

    Raises:
        ModelConfigError: if the family's table and the model disagree (a parameter of the model
            has no stored name, or the table names a module the model lacks).
    """
    out: list[Tensor] = []
    for row in family.modules(model.config, fused=fused):
        parts = row.ours.split(".")
        path = ("layers", "stacked", *parts[1:]) if parts[0] == "layers" else tuple(parts)
        module = _get(model, path)
        if module is None:
            raise ModelConfigError(
                f"Internal: {family.model_type} names module {row.ours!r}, which this model lacks."
            )
        fused_axis = Axis(FUSED, row.part[1]) if row.part is not None else None
        for param in ("weight", "bias"):
            leaf = getattr(module, param, None)
            if leaf is None:
                continue
            groups = _groups(module, row.layout, param, fused_axis, leaf)
            per = tuple(
                leaf.resolve_axis(n)
                for n, here in ((LAYER, True), (EXPERTS, "{e}" in row.hf))
                if here and leaf.has_axis(n)
            )
            mine = {a.name for a in leaf.axes} - {a.name for a in per}
            stored = {a.name for g in groups for a in g if a.name != FUSED}
            if mine != stored:
                raise ModelConfigError(
                    f"Internal: {'.'.join(path)}.{param} has axes {sorted(mine)} but its stored "
                    f"layout has {sorted(stored)}."
                )
            hf = row.hf if row.layout == "experts" else f"{row.hf}.{param}"
            out.append(Tensor(hf, (*path, param), groups, row.part, per))
    named = {t.path for t in out}
    missing = [".".join(p) for p in _leaf_paths(model) if p not in named]
    if missing:
        raise ModelConfigError(
            f"{family.model_type} checkpoints have no tensor for parameter(s) "
            f"{', '.join(missing)} of this model."
        )
    return out


def _norm(s: slice, size: int) -> slice:
    start, stop, step = s.indices(size)
    if step != 1:
        raise ValueError(f"Internal: a strided block {s}.")
    return slice(start, stop)


def _group_read(
    sizes: Sequence[int], slices: Sequence[slice]
) -> tuple[slice, tuple[int, ...], tuple[slice, ...]]:
    """The contiguous range of a merged dimension that holds the block ``slices`` of its axes,
    the shape to split that range into, and the slices that cut the block out of it."""
    k = len(sizes)
    p = next((i for i, s in enumerate(slices) if s.stop - s.start != 1), k - 1)
    strides = [math.prod(sizes[i + 1 :]) for i in range(k)]
    start = sum(slices[i].start * strides[i] for i in range(p + 1))
    last = (
        sum(slices[i].start * strides[i] for i in range(p))
        + (slices[p].stop - 1) * strides[p]
        + sum((sizes[i] - 1) * strides[i] for i in range(p + 1, k))
    )
    shape = (1,) * p + (slices[p].stop - slices[p].start,) + tuple(sizes[p + 1 :])
    cut = (slice(None),) * (p + 1) + tuple(slices[p + 1 :])
    return slice(start, last + 1), shape, cut


def read_block(
    checkpoint: Checkpoint, t: Tensor, axes: Sequence[Axis], index: Sequence[slice], dtype: Any
) -> np.ndarray:
    """The block ``index`` (over ``axes``, our parameter's axes in its order) read from storage."""
    idx = {a.name: _norm(s, a.size) for a, s in zip(axes, index)}
    if t.part is not None:
        idx[FUSED] = slice(t.part[0], t.part[0] + 1)
    per = [a.name for a in t.per]
    per_layer = [a for a in axes if a.name not in per]
    view = t.view
    plans = [_group_read([a.size for a in g], [idx[a.name] for a in g]) for g in t.groups]
    kept = [v for v in view if v.name != FUSED]
    order = [next(i for i, v in enumerate(kept) if v.name == a.name) for a in per_layer]
    fused_at = next((i for i, v in enumerate(view) if v.name == FUSED), None)

    def one(index: tuple[int, ...]) -> np.ndarray:
        raw = checkpoint.read(t.name(index), [r for r, _, _ in plans])
        raw = raw.reshape(tuple(d for _, shape, _ in plans for d in shape))
        raw = raw[tuple(s for _, _, cut in plans for s in cut)]
        if fused_at is not None:
            raw = raw.take(0, axis=fused_at)
        return np.transpose(raw, order)

    if not t.per:
        return np.ascontiguousarray(one(()), dtype=dtype)
    # One stored tensor at a time into the block (the host holds the block and one tensor's rows).
    names = [a.name for a in axes]
    spans = [idx[n] for n in per]
    shape = [idx[a.name].stop - idx[a.name].start for a in axes]
    out = np.empty(shape, dtype)
    for stored in itertools.product(*(range(s.start, s.stop) for s in spans)):
        at: list[Any] = [slice(None)] * len(axes)
        for n, s, i in zip(per, spans, stored):
            at[names.index(n)] = i - s.start
        out[tuple(at)] = one(stored)
    return out


def pick(x: NamedArray, t: Tensor, index: tuple[int, ...]) -> NamedArray:
    """The part of parameter ``x`` that stored tensor ``t.name(index)`` holds."""
    for a, i in zip(t.per, index):
        x = x[a.name, i]
    return x


def to_stored(parts: Sequence[tuple[Tensor, NamedArray]]) -> np.ndarray:
    """The stored tensor made of per-layer parameter values (several for a fused tensor)."""
    t0 = parts[0][0]
    view = [v for v in t0.view if v.name != FUSED]
    arrays = []
    for _, x in sorted(parts, key=lambda p: p[0].part[0] if p[0].part else 0):
        order = [x.axis_names.index(v.name) for v in view]
        arrays.append(np.transpose(np.asarray(x.array), order))
    if t0.part is not None:
        at = [v.name for v in t0.view].index(FUSED)
        full = np.stack(arrays, axis=at)
    else:
        full = arrays[0]
    return np.ascontiguousarray(full.reshape(t0.shape))
