"""Shape operations by name: reorder, rename, merge and split axes, broadcast arrays.

Every function takes axes by name (``"embed"``) or as an ``Axis`` (whose size is then checked), and
raises an error listing the available axes when a name is unknown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import EllipsisType
from typing import Any

import jax
import jax.numpy as jnp

from .._array import NamedArray
from .._axis import (
    Axis,
    AxisSelector,
    AxisSpec,
    axis_name,
    find_axis,
    index_of,
    to_axes,
)
from .._errors import (
    AxisError,
    AxisSizeError,
    DuplicateAxisError,
    NamedTypeError,
    format_axes,
    format_names,
)
from ._align import align_to
from ._checks import is_static_int
from ._common import expect_named, unshard_dims
from ._reshape import check_new_names, flatten_axes_as, reorder, unflatten_axis_as
from .pattern import rearrange_pattern

__all__ = [
    "broadcast_axis",
    "broadcast_to",
    "flatten_axes",
    "rearrange",
    "rename",
    "split",
    "unbind",
    "unflatten_axis",
]


def _named_from(array: jax.Array, axes: Sequence[Axis]) -> NamedArray:
    return NamedArray(array, tuple(axes))


# -- reorder / rename ------------------------------------------------------------------------


def rearrange(
    x: NamedArray, axes: Sequence[AxisSelector | EllipsisType] | str, **sizes: int
) -> NamedArray:
    """Reorder the axes of ``x`` by name, or split/merge/reorder them with an einops-style pattern.

    Args:
        x: The array.
        axes: Every axis of ``x`` in the new order, by name or ``Axis``. One ``...`` may stand for
            "all axes not listed, in their current order". Or a pattern with ``->``, such as
            ``"b (h d) s -> b h s d"``: its left side names axes of ``x`` by name (in any order),
            groups split an axis (``(embed: h d)``; the label may be left out when only one axis
            is not named), groups on the right merge axes; see ``namedaxes._ops.pattern``.
        **sizes: With a pattern, the sizes of split parts (``h=8``); one part per group may be
            inferred.

    Returns:
        ``x`` with its axes in the new order (split and merged as the pattern says).

    Raises:
        AxisNotFoundError: if a name is not an axis of ``x``.
        DuplicateAxisError: if a name (or ``...``) is listed twice.
        AxisError: if axes of ``x`` are missing and no ``...`` was given, or a pattern is malformed.
        AxisSizeError: if pattern sizes do not fit.

    Example:
        >>> import jax.numpy as jnp
        >>> from namedaxes import named, rearrange
        >>> x = named(jnp.zeros((2, 3, 4)), ("batch", "seq", "embed"))
        >>> rearrange(x, ("embed", ...)).axis_names
        ('embed', 'batch', 'seq')
        >>> rearrange(x, "batch seq (embed: h d) -> batch h seq d", h=2).shape
        {'batch': 2, 'h': 2, 'seq': 3, 'd': 2}
        >>> rearrange(x, "... (embed: h d) -> (tokens: ...) h d", h=2).shape
        {'tokens': 6, 'h': 2, 'd': 2}
    """
    x = expect_named(x, "rearrange")
    if isinstance(axes, str) and "->" in axes:
        return rearrange_pattern(x, axes, sizes)
    if isinstance(axes, str) and any(c in axes for c in " ()."):
        raise AxisError(
            f"rearrange(): {axes!r} looks like a pattern but has no '->'; write e.g. "
            "'b (h d) -> b h d', or pass the axis order as a tuple of names."
        )
    if sizes:
        raise AxisError(
            f"rearrange(): sizes ({', '.join(sizes)}) only go with a pattern such as "
            "'b (h d) -> b h d'; an axis order takes none."
        )
    return reorder(x, axes)


def rename(x: NamedArray, mapping: Mapping[AxisSelector, str | Axis]) -> NamedArray:
    """Rename axes of ``x``; the data is unchanged.

    Args:
        x: The array.
        mapping: ``{old: new}``. ``old`` is a name or ``Axis``; ``new`` is a name or an ``Axis``
            whose size must equal the old axis' size. Names may be swapped (``{"a": "b", "b": "a"}``).

    Returns:
        A NamedArray with the same array and renamed axes.

    Raises:
        AxisNotFoundError: if an old name is not an axis of ``x``.
        DuplicateAxisError: if a new name is already used by an axis that is not renamed.
        AxisSizeError: if a new ``Axis`` has a different size.

    Example:
        >>> import jax.numpy as jnp
        >>> from namedaxes import named, rename
        >>> x = named(jnp.zeros((2, 3)), ("batch", "embed"))
        >>> rename(x, {"embed": "hidden"}).axis_names
        ('batch', 'hidden')
    """
    x = expect_named(x, "rename")
    if not isinstance(mapping, Mapping):
        raise NamedTypeError(
            f"rename() takes a {{old: new}} dict, got {mapping!r}. Example: rename(x, {{'embed': 'hidden'}})."
        )
    new_axes = list(x.axes)
    for old, new in mapping.items():
        i = find_axis(x.axes, old)
        if isinstance(new, Axis):
            if new.size != x.axes[i].size:
                raise AxisSizeError(
                    f"rename(): cannot rename axis {x.axes[i].name!r} (size {x.axes[i].size}) to "
                    f"{new.name!r} with size {new.size}. Renaming keeps sizes; pass the name "
                    f"{new.name!r} instead of an Axis."
                )
            new_axes[i] = new
        else:
            new_axes[i] = Axis(axis_name(new), x.axes[i].size)
    names = [a.name for a in new_axes]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise DuplicateAxisError(
            f"rename(): renaming NamedArray({format_axes(x.axes)}) with {_fmt_mapping(mapping)} "
            f"gives axis name(s) {format_names(dups)} twice. Rename the existing axis too, "
            "or pick a name the array does not use."
        )
    return _named_from(x.array, new_axes)


def _fmt_mapping(mapping: Mapping[Any, Any]) -> str:
    return "{" + ", ".join(f"{axis_name(k)!r}: {axis_name(v)!r}" for k, v in mapping.items()) + "}"


# -- merge / split one axis ------------------------------------------------------------------


def flatten_axes(x: NamedArray, axes: Sequence[AxisSelector], new_axis: AxisSelector) -> NamedArray:
    """Merge several axes into one whose size is the product of theirs.

    The merged axes need not be adjacent: they are moved together to the position of the one that
    comes first in ``x``, and flattened row-major in the order given by ``axes`` (so ``("a", "b")``
    makes ``b`` vary fastest).

    Args:
        x: The array.
        axes: The axes to merge (at least one).
        new_axis: The name of the merged axis, or an ``Axis`` whose size must equal the product.

    Returns:
        A NamedArray with ``axes`` replaced by ``new_axis``.

    Raises:
        AxisNotFoundError: if one of ``axes`` is not an axis of ``x``.
        DuplicateAxisError: if ``axes`` repeats a name, or ``new_axis`` is the name of an axis that is kept.
        AxisSizeError: if ``new_axis`` is an ``Axis`` of the wrong size.

    Example:
        >>> import jax.numpy as jnp
        >>> from namedaxes import named, flatten_axes
        >>> x = named(jnp.zeros((2, 3, 4)), ("batch", "seq", "embed"))
        >>> flatten_axes(x, ("batch", "seq"), "tokens").shape
        {'tokens': 6, 'embed': 4}
    """
    return flatten_axes_as(x, axes, new_axis, "flatten_axes()")


def unflatten_axis(x: NamedArray, axis: AxisSelector, new_axes: AxisSpec) -> NamedArray:
    """Split one axis into several whose sizes multiply to its size (the inverse of ``flatten_axes``).

    The new axes take the old axis' place, row-major (the last one varies fastest).

    Args:
        x: The array.
        axis: The axis to split.
        new_axes: ``Axis`` objects or a ``{name: size}`` dict, in order.

    Returns:
        A NamedArray with ``axis`` replaced by ``new_axes``.

    Raises:
        AxisNotFoundError: if ``axis`` is not an axis of ``x``.
        AxisSizeError: if the sizes of ``new_axes`` do not multiply to the size of ``axis``.
        DuplicateAxisError: if a new name is already used by another axis of ``x``.

    Example:
        >>> import jax.numpy as jnp
        >>> from namedaxes import named, unflatten_axis
        >>> x = named(jnp.zeros((6, 4)), ("tokens", "embed"))
        >>> unflatten_axis(x, "tokens", {"batch": 2, "seq": 3}).shape
        {'batch': 2, 'seq': 3, 'embed': 4}
    """
    return unflatten_axis_as(x, axis, new_axes, "unflatten_axis()")


def split(x: NamedArray, axis: AxisSelector, new_axes: Sequence[Axis | int]) -> list[NamedArray]:
    """Cut ``axis`` into consecutive chunks.

    Args:
        x: The array.
        axis: The axis to cut.
        new_axes: One entry per chunk, in order: an ``Axis`` (the chunk's axis takes that name and
            size) or an ``int`` (the chunk keeps the old name with that size). Sizes must add up to
            the size of ``axis``. Names may repeat across chunks.

    Returns:
        A list of NamedArrays; chunk ``i`` has ``new_axes[i]`` where ``x`` had ``axis``.

    Raises:
        AxisNotFoundError: if ``axis`` is not an axis of ``x``.
        AxisSizeError: if the sizes do not add up.
        DuplicateAxisError: if a chunk's name is already used by another axis of ``x``.

    Example:
        >>> import jax.numpy as jnp
        >>> from namedaxes import named, split, Axis
        >>> x = named(jnp.zeros((2, 10)), ("batch", "feat"))
        >>> [p.shape for p in split(x, "feat", (Axis("q", 4), Axis("k", 6)))]
        [{'batch': 2, 'q': 4}, {'batch': 2, 'k': 6}]
    """
    x = expect_named(x, "split")
    i = find_axis(x.axes, axis)
    old = x.axes[i]
    if isinstance(new_axes, (Axis, Mapping)) or not isinstance(new_axes, Sequence):
        raise NamedTypeError(
            f"split() takes a sequence of Axis (or int sizes), one per chunk, got {new_axes!r}. "
            "Example: split(x, 'feat', (Axis('q', 4), Axis('k', 6)))."
        )
    chunks = []
    for a in new_axes:
        if isinstance(a, Axis):
            chunks.append(a)
        elif is_static_int(a):  # NumPy ints too, as rearrange's sizes
            chunks.append(Axis(old.name, int(a)))
        else:
            raise NamedTypeError(
                f"split(): each chunk must be an Axis or an int size, got {a!r} ({type(a).__name__})."
            )
    total = sum(a.size for a in chunks)
    if total != old.size:
        raise AxisSizeError(
            f"split(): chunk sizes ({format_axes(chunks)}) add up to {total}, but axis "
            f"{old.name!r} has size {old.size}. Choose sizes that add up to {old.size}."
        )
    check_new_names(x, chunks, [old.name], "split")
    cuts = [sum(a.size for a in chunks[:k]) for k in range(1, len(chunks))]
    pieces = jnp.split(unshard_dims(x.array, [i]), cuts, axis=i)
    return [_named_from(p, x.axes[:i] + (a,) + x.axes[i + 1 :]) for p, a in zip(pieces, chunks)]


def unbind(x: NamedArray, axis: AxisSelector) -> list[NamedArray]:
    """Split ``x`` into one array per index of ``axis``, each without that axis.

    Args:
        x: The array.
        axis: The axis to remove.

    Returns:
        A list of ``x.axis_size(axis)`` NamedArrays.

    Raises:
        AxisNotFoundError: if ``axis`` is not an axis of ``x``.

    Example:
        >>> import jax.numpy as jnp
        >>> from namedaxes import named, unbind
        >>> x = named(jnp.zeros((3, 4)), ("layer", "embed"))
        >>> [p.shape for p in unbind(x, "layer")][0]
        {'embed': 4}
    """
    x = expect_named(x, "unbind")
    i = find_axis(x.axes, axis)
    rest = x.axes[:i] + x.axes[i + 1 :]
    return [_named_from(p, rest) for p in jnp.unstack(unshard_dims(x.array, [i]), axis=i)]


# -- broadcast -------------------------------------------------------------------------------


def _as_named_or_scalar(x: Any, caller: str) -> NamedArray:
    """A NamedArray, or a scalar (Python number, 0-d array) wrapped as one with no axes."""
    if isinstance(x, NamedArray):
        return x
    array = jnp.asarray(x) if not hasattr(x, "shape") else x
    if getattr(array, "ndim", None) == 0:
        return NamedArray(array, ())
    return expect_named(x, caller)


def broadcast_to(x: NamedArray | Any, axes: AxisSpec | Sequence[Axis | EllipsisType]) -> NamedArray:
    """Broadcast ``x`` to exactly the axes ``axes``, in that order.

    Axes of ``x`` are matched by name; axes that ``x`` lacks are added. Every axis of ``x`` must be
    listed (with the same size) unless ``axes`` contains ``...``, which stands for the axes of ``x``
    that are not listed, in their current order. Sizes are never stretched (a size-1 axis does not
    broadcast to a larger one of the same name).

    Args:
        x: A NamedArray, or a scalar (Python number or 0-d array).
        axes: ``Axis`` objects (with at most one ``...``) or a ``{name: size}`` dict.

    Returns:
        A NamedArray with axes ``axes``.

    Raises:
        AxisError: if ``x`` has axes not listed and no ``...`` was given.
        AxisSizeError: if a listed axis has a different size in ``x``.
        NamedTypeError: if ``x`` is a plain non-scalar array.

    Example:
        >>> import jax.numpy as jnp
        >>> from namedaxes import named, broadcast_to, Axis
        >>> x = named(jnp.zeros(4), ("embed",))
        >>> broadcast_to(x, {"batch": 2, "embed": 4}).shape
        {'batch': 2, 'embed': 4}
        >>> broadcast_to(x, (Axis("batch", 2), ...)).shape
        {'batch': 2, 'embed': 4}
    """
    x = _as_named_or_scalar(x, "broadcast_to")
    if isinstance(axes, (Axis, Mapping)):
        target = to_axes(axes, what="broadcast_to() axes")
    else:
        items = list(axes)
        if sum(1 for a in items if a is Ellipsis) > 1:
            raise DuplicateAxisError("broadcast_to(): '...' may appear at most once in axes.")
        listed = to_axes([a for a in items if a is not Ellipsis], what="broadcast_to() axes")
        if Ellipsis in items:
            listed_names = {a.name for a in listed}
            rest = tuple(a for a in x.axes if a.name not in listed_names)
            at = items.index(Ellipsis)
            target = listed[:at] + rest + listed[at:]
        else:
            target = listed
    names = {a.name for a in target}
    extra = [a for a in x.axes if a.name not in names]
    if extra:
        raise AxisError(
            f"broadcast_to(): NamedArray({format_axes(x.axes)}) has axes "
            f"{format_names(a.name for a in extra)} that are not in the target "
            f"({format_axes(target)}). List them in the target, or add ... to keep them."
        )
    for a in target:
        i = index_of(x.axes, a.name)
        if i is not None and x.axes[i].size != a.size:
            raise AxisSizeError(
                f"broadcast_to(): axis {a.name!r} has size {x.axes[i].size} in "
                f"NamedArray({format_axes(x.axes)}) but size {a.size} in the target "
                f"({format_axes(target)}). Named axes only broadcast when they are missing, "
                "not by stretching; slice or rename first."
            )
    array = jnp.broadcast_to(align_to(x, target), tuple(a.size for a in target))
    return _named_from(array, target)


def broadcast_axis(x: NamedArray | Any, axis: AxisSpec) -> NamedArray:
    """Add new axes in front of ``x`` by repeating its values.

    Args:
        x: A NamedArray, or a scalar.
        axis: An ``Axis``, several, or a ``{name: size}`` dict; none may already be an axis of ``x``.

    Returns:
        A NamedArray with ``axis`` first, then the axes of ``x``.

    Raises:
        DuplicateAxisError: if ``x`` already has one of the axes.

    Example:
        >>> import jax.numpy as jnp
        >>> from namedaxes import named, broadcast_axis, Axis
        >>> x = named(jnp.zeros(4), ("embed",))
        >>> broadcast_axis(x, Axis("batch", 2)).shape
        {'batch': 2, 'embed': 4}
    """
    x = _as_named_or_scalar(x, "broadcast_axis")
    new = to_axes(axis, what="broadcast_axis() axis")
    present = [a.name for a in new if x.has_axis(a.name)]
    if present:
        raise DuplicateAxisError(
            f"broadcast_axis(): NamedArray({format_axes(x.axes)}) already has axis(es) "
            f"{format_names(present)}. Use broadcast_to() to reorder or add only missing axes."
        )
    return broadcast_to(x, new + x.axes)
