"""``one_hot`` and ``cross_entropy`` over a named class axis."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from .._array import NamedArray
from .._axis import Axis, AxisSelector, axis_name
from .._errors import AxisNotFoundError, NamedTypeError, format_axes, format_names
from .._ops.creation import arange
from .._ops.elementwise import clip, maximum
from .._ops.reductions import log_softmax
from .._ops.reductions import sum as named_sum
from .._ops.sets import where
from ._common import expect_axes, expect_free
from ._precision import upcast

__all__ = ["cross_entropy", "one_hot"]

_REDUCTIONS = ("mean", "sum", None)


def one_hot(indices: NamedArray, axis: Axis, *, dtype: Any = jnp.float32) -> NamedArray:
    """One-hot vectors: the indices' axes, then ``axis``, with ``1`` at each index.

    Args:
        indices: An integer NamedArray.
        axis: The new class axis (its size is the number of classes).
        dtype: The result's dtype.

    Returns:
        ``indices``' axes + ``(axis,)``; out-of-range indices give all zeros (as
        ``jax.nn.one_hot``).

    Raises:
        NamedTypeError: if ``indices`` is not an integer NamedArray or ``axis`` not an ``Axis``.
        DuplicateAxisError: if ``indices`` already has ``axis``.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> one_hot(na.named(jnp.array([0, 2]), "batch"), na.Axis("vocab", 3)).array
        Array([[1., 0., 0.],
               [0., 0., 1.]], dtype=float32)
    """
    if not isinstance(axis, Axis):
        raise NamedTypeError(f"one_hot needs an Axis with the number of classes, got {axis!r}.")
    if not isinstance(indices, NamedArray) or not jnp.issubdtype(indices.dtype, jnp.integer):
        raise NamedTypeError(
            f"one_hot needs an integer NamedArray of indices, got {indices!r}. Name the array "
            "first."
        )
    expect_free(indices, (axis.name,), "one_hot", "is the class axis to create")
    return NamedArray(jax.nn.one_hot(indices.array, axis.size, dtype=dtype), indices.axes + (axis,))


def _target_entry(logp: NamedArray, cls: Axis, targets: NamedArray) -> NamedArray:
    """``take(logp, cls, targets)``, as a masked sum over ``cls``.

    The ids are read as ``take`` reads them (negative ones count from the end, the rest are
    clamped), so values are the gather's, and so are gradients for ids inside the axis (a clamped
    id gets its clamped entry's gradient, which JAX's gather drops). A sum reduces a class axis split
    over a mesh axis where it lies, like the logsumexp beside it: one all-reduce of the
    targets-shaped result, on Auto and Explicit meshes alike, and its gradient is the mask itself,
    where the gather's is a scatter into a zero array of the logits' size.
    """
    ids = targets if targets.dtype.itemsize >= 4 else targets.astype(jnp.int32)
    if jnp.issubdtype(ids.dtype, jnp.signedinteger):
        ids = where(ids < 0, ids + cls.size, ids)
    ids = clip(ids, 0, cls.size - 1)
    return named_sum(logp, cls.name, where=arange(cls, dtype=ids.dtype) == ids)


def cross_entropy(
    logits: NamedArray,
    axis: AxisSelector,
    targets: NamedArray,
    *,
    where: NamedArray | None = None,
    reduction: str | None = "mean",
) -> NamedArray:
    """Cross-entropy between ``logits`` over the class ``axis`` and integer or soft targets.

    With integer ``targets`` (class ids, over some of the logits' other axes), the per-element
    loss is ``-take(log_softmax(logits, axis), axis, targets)``; with float ``targets`` that have
    ``axis`` (probabilities, e.g. ``one_hot``), it is ``-sum(targets * log_softmax(logits), axis)``.
    The loss is computed in float32 at least (bfloat16 logits are upcast first).
    ``where`` (a boolean NamedArray over some of the remaining axes, ``True`` where the loss counts)
    drops padding: it sets the loss to 0 there and, for ``"mean"``, counts only the ``True``
    elements (an all-``False`` mask gives 0, not NaN).

    Args:
        logits: Float NamedArray with ``axis``.
        axis: The class axis (e.g. ``"vocab"``).
        targets: Integer class ids without ``axis``, or floats with ``axis``.
        where: Optional boolean mask.
        reduction: ``"mean"`` or ``"sum"`` over every remaining axis (a NamedArray with no axes), or
            ``None`` for the per-element loss.

    Returns:
        The loss as a NamedArray.

    Raises:
        AxisNotFoundError: if ``axis`` is missing, or the targets or the mask have an axis the
            per-element loss lacks.
        NamedTypeError: if an argument has the wrong kind, or ``reduction`` is unknown.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> logits = na.named(jnp.log(jnp.array([[0.5, 0.5], [0.25, 0.75]])), ("batch", "vocab"))
        >>> targets = na.named(jnp.array([0, 1]), "batch")
        >>> round(cross_entropy(logits, "vocab", targets).item(), 4)   # -(log .5 + log .75) / 2
        0.4904
    """
    name = axis_name(axis)
    if reduction not in _REDUCTIONS:
        raise NamedTypeError(
            f"cross_entropy reduction must be 'mean', 'sum' or None, got {reduction!r}."
        )
    logits = expect_axes(logits, (), "cross_entropy", "logits")
    cls = logits.resolve_axis(name)
    if not isinstance(targets, NamedArray):
        raise NamedTypeError(
            f"cross_entropy needs NamedArray targets, got {type(targets).__name__}. Name them, "
            "e.g. named(ids, ('batch', 'position'))."
        )
    logp = log_softmax(upcast(logits), name)
    if jnp.issubdtype(targets.dtype, jnp.integer):
        why = "is the class axis (integer targets are class ids)"
        expect_free(targets, (name,), "cross_entropy", why)
        _subset(targets, logits, "targets", "the logits")
        nll = -_target_entry(logp, cls, targets)
    else:
        expect_axes(targets, (cls,), "cross_entropy", "targets")
        _subset(targets, logits, "targets", "the logits")
        nll = -named_sum(logp * targets.astype(logp.dtype), name)
    if where is None:
        if reduction == "mean":
            return nll.mean()
        return nll.sum() if reduction == "sum" else nll
    if not isinstance(where, NamedArray) or where.dtype != jnp.bool_:
        raise NamedTypeError(f"cross_entropy where= must be a boolean NamedArray, got {where!r}.")
    _subset(where, nll, "where", "the per-element loss")
    if reduction is None:
        return nll * where.astype(nll.dtype)
    total = named_sum(nll, where=where)
    if reduction == "sum":
        return total
    # A mask over fewer axes than the loss counts once per element of the missing axes.
    count = named_sum(where.astype(nll.dtype)) * float(nll.size // where.size)
    return total / maximum(count, 1.0)


def _subset(x: NamedArray, of: NamedArray, what: str, of_what: str) -> None:
    extra = [a.name for a in x.axes if not of.has_axis(a.name)]
    if extra:
        raise AxisNotFoundError(
            f"cross_entropy: {what} NamedArray({format_axes(x.axes)}) has axis "
            f"{format_names(extra)} that {of_what} NamedArray({format_axes(of.axes)}) lack. Use "
            f"only axes of {of_what}."
        )
