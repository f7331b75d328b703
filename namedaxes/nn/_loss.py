"""``one_hot`` and ``cross_entropy`` over a named class axis."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from .._array import NamedArray
from .._axis import Axis, AxisSelector, axis_name, index_of
from .._errors import AxisNotFoundError, AxisSizeError, NamedTypeError, format_axes, format_names
from .._ops.creation import arange
from .._ops.elementwise import maximum
from .._ops.reductions import log_softmax
from .._ops.reductions import sum as named_sum
from .._ops.sets import where
from ._common import check_ids, expect_axes, expect_floating, expect_free
from ._precision import upcast

__all__ = ["cross_entropy", "one_hot"]

_REDUCTIONS = ("mean", "sum", None)
_TARGET_FIX = (
    "Leave padding or ignore targets out of the loss with where=, e.g. where=targets != -100 for "
    "the -100 that torch and transformers ignore, or fix the labels."
)


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


def _target_entry(
    logp: NamedArray, cls: Axis, targets: NamedArray, mask: NamedArray | None
) -> NamedArray:
    """``take(logp, cls, targets)`` for ids in ``[0, cls.size)``, as a masked sum over ``cls``; NaN
    for an id outside that range where ``mask`` (if given) is true.

    A sum reduces a class axis split over a mesh axis where it lies, like the logsumexp beside it:
    one all-reduce of the targets-shaped result, on Auto and Explicit meshes alike, and its gradient
    is the mask itself, where the gather's is a scatter into a zero array of the logits' size.
    An id outside the axis (negative ones included: no counting from the end, no clamping) matches
    no class; its entry is the sum of its whole row times NaN rather than selected away, so the
    gradient of every logit of that row is NaN too (a NaN loss never comes with a finite update
    that trains toward some class, or as if the row were masked). Masked-out entries are
    multiplied by 1: the mask drops them later, and NaN * 0 would not.
    """
    ids = targets if targets.dtype.itemsize >= 4 else targets.astype(jnp.int32)
    ok = ids < cls.size
    if jnp.issubdtype(ids.dtype, jnp.signedinteger):
        ok = ok & (ids >= 0)
    if mask is not None:
        ok = ok | ~mask
    entry = named_sum(logp, cls.name, where=(arange(cls, dtype=ids.dtype) == ids) | ~ok)
    return entry * where(ok, 1.0, jnp.nan)


def _soft_entry(logp: NamedArray, probs: NamedArray, name: str) -> NamedArray:
    """``sum(probs * logp)`` over the class axis ``name``, a class of probability 0 adding 0.

    A masked-out class (logit ``-inf``) has ``logp = -inf``, and ``0 * -inf`` is NaN: such a term
    is selected away instead, so the loss and its gradient are those of integer targets (the
    gradient of a ``where`` is 0 on the side not taken). A class of nonzero probability at
    ``-inf`` still gives an infinite loss.
    """
    zero = (probs == 0) & (logp == -jnp.inf)
    return named_sum(where(zero, 0.0, logp) * probs, name)


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
    loss is ``-log_softmax(logits, axis)`` at the target's class; with float ``targets`` that have
    ``axis`` (probabilities, e.g. ``one_hot``), it is ``-sum(targets * log_softmax(logits), axis)``.
    The loss is computed in float32 at least (bfloat16 logits are upcast first).
    ``where`` (a boolean NamedArray over some of the remaining axes, ``True`` where the loss counts)
    drops padding: it sets the loss to 0 there and, for ``"mean"``, counts only the ``True``
    elements (an all-``False`` mask gives 0, not NaN).

    An integer target must be in ``[0, axis size)`` wherever ``where`` counts it: a wrong target
    never trains toward another class. Unlike ``take``, a negative id does not count from the end
    and an id past the end is not clamped to the last class. Concrete targets (outside ``jit``)
    out of range raise ``AxisIndexError`` naming them (the check ``nn.Embedding`` makes of its
    ids); under ``jit`` the loss of such an element is NaN and so is the gradient of its logits,
    which makes a ``"mean"`` or ``"sum"`` NaN too: the mistake shows in the loss curve (and
    ``optax.apply_if_finite`` skips the step) instead of training silently. Masked-out targets may
    hold anything, e.g. the ``-100`` that PyTorch's losses ignore: pass
    ``where=targets != -100`` (there is no separate ``ignore_index``: the mask is the one way).

    Args:
        logits: Float NamedArray with ``axis``.
        axis: The class axis: a name (e.g. ``"vocab"``) or an ``Axis`` of the logits' size.
        targets: Integer class ids without ``axis``, or floats with ``axis`` (of its size).
        where: Optional boolean mask.
        reduction: ``"mean"`` or ``"sum"`` over every remaining axis (a NamedArray with no axes), or
            ``None`` for the per-element loss.

    Returns:
        The loss as a NamedArray.

    Raises:
        AxisNotFoundError: if ``axis`` is missing, float targets lack it, or the targets or the
            mask have an axis the per-element loss lacks.
        AxisSizeError: if ``axis`` is an ``Axis`` of another size than the logits', or float
            targets have ``axis`` with another size.
        AxisIndexError: if concrete integer targets hold an id outside ``[0, axis size)`` where
            ``where`` counts them (traced ones give NaN instead).
        NamedTypeError: if an argument has the wrong kind (boolean targets included), or
            ``reduction`` is unknown.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import namedaxes as na
        >>> logits = na.named(jnp.log(jnp.array([[0.5, 0.5], [0.25, 0.75]])), ("batch", "vocab"))
        >>> targets = na.named(jnp.array([0, 1]), "batch")
        >>> round(cross_entropy(logits, "vocab", targets).item(), 4)   # -(log .5 + log .75) / 2
        0.4904
        >>> labels = na.named(jnp.array([0, -100]), "batch")  # -100: leave this row out
        >>> round(cross_entropy(logits, "vocab", labels, where=labels != -100).item(), 4)
        0.6931
        >>> cross_entropy(logits, "vocab", labels)
        Traceback (most recent call last):
        ...
        namedaxes._errors.AxisIndexError: cross_entropy: target id(s) -100 outside the classes: ...
        >>> jax.jit(lambda t: cross_entropy(logits, "vocab", t, reduction=None))(labels).array
        Array([0.6931472,       nan], dtype=float32)
    """
    name = axis_name(axis)
    if reduction not in _REDUCTIONS:
        raise NamedTypeError(
            f"cross_entropy reduction must be 'mean', 'sum' or None, got {reduction!r}."
        )
    logits = expect_floating(
        expect_axes(logits, (), "cross_entropy", "logits"), "cross_entropy", "logits"
    )
    cls = logits.resolve_axis(axis)  # an Axis must have the logits' size
    if not isinstance(targets, NamedArray):
        raise NamedTypeError(
            f"cross_entropy needs NamedArray targets, got {type(targets).__name__}. Name them, "
            "e.g. named(ids, ('batch', 'position'))."
        )
    per_element = tuple(a for a in logits.axes if a.name != name)
    if where is not None:
        if not isinstance(where, NamedArray) or where.dtype != jnp.bool_:
            raise NamedTypeError(
                f"cross_entropy where= must be a boolean NamedArray, got {where!r}."
            )
        _subset(where, per_element, "where", "the per-element loss")
    logp = log_softmax(upcast(logits), name)
    if targets.dtype == jnp.bool_:
        raise NamedTypeError(
            f"cross_entropy targets must be integer class ids or float probabilities over "
            f"{name!r}, got a boolean NamedArray({format_axes(targets.axes)}). Cast class ids to "
            "an integer dtype, e.g. targets.astype(jnp.int32); a boolean mask goes in where=."
        )
    if jnp.issubdtype(targets.dtype, jnp.integer):
        why = "is the class axis (integer targets are class ids)"
        expect_free(targets, (name,), "cross_entropy", why)
        _subset(targets, logits.axes, "targets", "the logits")
        check_ids(
            targets, cls, "cross_entropy", where=where, what="target id(s)",
            outside="the classes", fix=_TARGET_FIX,
        )  # fmt: skip
        nll = -_target_entry(logp, cls, targets, where)
    else:
        _soft_targets(targets, cls)
        _subset(targets, logits.axes, "targets", "the logits")
        nll = -_soft_entry(logp, targets.astype(logp.dtype), name)
    if where is None:
        if reduction == "mean":
            return nll.mean()
        return nll.sum() if reduction == "sum" else nll
    if reduction is None:
        return nll * where.astype(nll.dtype)
    total = named_sum(nll, where=where)
    if reduction == "sum":
        return total
    # A mask over fewer axes than the loss counts once per element of the missing axes.
    count = named_sum(where.astype(nll.dtype)) * float(nll.size // where.size)
    return total / maximum(count, 1.0)


def _soft_targets(targets: NamedArray, cls: Axis) -> None:
    """Float targets are probabilities over the class axis, of the logits' size."""
    i = index_of(targets.axes, cls.name)
    if i is not None and targets.axes[i].size == cls.size:
        return
    error, got = (
        (AxisNotFoundError, "lack it")
        if i is None
        else (AxisSizeError, f"have it of size {targets.axes[i].size}")
    )
    raise error(
        f"cross_entropy: float targets are probabilities over the class axis {cls.name!r} of "
        f"size {cls.size} (the logits'), but targets NamedArray({format_axes(targets.axes)}) "
        f"{got}. Pass integer class ids, or probabilities over Axis({cls.name!r}, {cls.size}), "
        f"e.g. one_hot(ids, Axis({cls.name!r}, {cls.size}))."
    )


def _subset(x: NamedArray, of: tuple[Axis, ...], what: str, of_what: str) -> None:
    names = {a.name for a in of}
    extra = [a.name for a in x.axes if a.name not in names]
    if extra:
        raise AxisNotFoundError(
            f"cross_entropy: {what} NamedArray({format_axes(x.axes)}) has axis "
            f"{format_names(extra)} that {of_what} NamedArray({format_axes(of)}) lack. Use "
            f"only axes of {of_what}."
        )
