"""Axes and the pure algebra over them. No JAX here: this module only knows names and sizes."""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from ._errors import (
    AxisError,
    AxisNotFoundError,
    AxisSizeError,
    DuplicateAxisError,
    NamedTypeError,
    format_axes,
    format_names,
)

__all__ = [
    "Axis",
    "AxisSelector",
    "AxisSpec",
    "axis_name",
    "axis_names",
    "broadcast_axes",
    "check_unique",
    "eliminate_axes",
    "find_axis",
    "index_of",
    "replace_axis",
    "to_axes",
    "without_axes",
]


@dataclass(frozen=True, slots=True)
class Axis:
    """A named dimension of known size.

    Immutable and hashable, so axes can be dictionary keys and static arguments.

    Args:
        name: A non-empty string.
        size: A non-negative integer.

    Raises:
        AxisError: if the name is not a non-empty string or the size is not a non-negative int.

    Example:
        >>> Batch = Axis("batch", 8)
        >>> Batch.name, Batch.size
        ('batch', 8)
        >>> Batch.resize(16)
        Axis(name='batch', size=16)
    """

    name: str
    size: int

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise AxisError(
                f"Axis name must be a non-empty string, got {self.name!r}. "
                "Name the axis, e.g. Axis('batch', 8)."
            )
        size = self.size
        if isinstance(size, bool) or not hasattr(size, "__index__"):
            raise AxisError(
                f"Axis {self.name!r} size must be an int, got {size!r} ({type(size).__name__}). "
                "Pass a Python int, e.g. Axis('batch', 8)."
            )
        size = operator.index(size)
        if size < 0:
            raise AxisError(f"Axis {self.name!r} size must be >= 0, got {size}.")
        object.__setattr__(self, "size", size)

    def resize(self, size: int) -> Axis:
        """Return an axis with the same name and a new size."""
        return Axis(self.name, size)

    def alias(self, name: str) -> Axis:
        """Return an axis with the same size and a new name."""
        return Axis(name, self.size)


#: An axis given by name or as an ``Axis``.
AxisSelector: TypeAlias = str | Axis
#: Axes given with sizes: a sequence of ``Axis`` or a ``{name: size}`` mapping.
AxisSpec: TypeAlias = Sequence[Axis] | Mapping[str, int] | Axis


def axis_name(axis: AxisSelector) -> str:
    """The name of an axis selector (a name or an ``Axis``).

    Example:
        >>> axis_name(Axis("embed", 4)), axis_name("embed")
        ('embed', 'embed')
    """
    if isinstance(axis, Axis):
        return axis.name
    if isinstance(axis, str):
        return axis
    raise NamedTypeError(
        f"Expected an axis name (str) or an Axis, got {axis!r} ({type(axis).__name__})."
    )


def axis_names(axes: AxisSelector | Sequence[AxisSelector]) -> tuple[str, ...]:
    """Names of one selector or a sequence of them."""
    if isinstance(axes, (str, Axis)):
        return (axis_name(axes),)
    return tuple(axis_name(a) for a in axes)


def to_axes(spec: AxisSpec, *, what: str = "axes") -> tuple[Axis, ...]:
    """Normalize ``Axis`` / sequence of ``Axis`` / ``{name: size}`` to a tuple of ``Axis``.

    Raises:
        NamedTypeError: if an element is not an ``Axis`` (bare names carry no size).
        DuplicateAxisError: if a name appears twice.

    Example:
        >>> to_axes({"batch": 2, "embed": 3})
        (Axis(name='batch', size=2), Axis(name='embed', size=3))
    """
    if isinstance(spec, Axis):
        axes: tuple[Axis, ...] = (spec,)
    elif isinstance(spec, Mapping):
        axes = tuple(Axis(name, size) for name, size in spec.items())
    elif isinstance(spec, Sequence) and not isinstance(spec, str):
        for a in spec:
            if not isinstance(a, Axis):
                raise NamedTypeError(
                    f"{what} must be Axis objects or a {{name: size}} dict, got {a!r} in {spec!r}. "
                    "Give sizes, e.g. {'batch': 8} or (Axis('batch', 8),)."
                )
        axes = tuple(spec)
    else:
        raise NamedTypeError(
            f"{what} must be a sequence of Axis or a {{name: size}} dict, got {spec!r}."
        )
    check_unique(axes)
    return axes


def check_unique(axes: Sequence[AxisSelector]) -> None:
    """Raise ``DuplicateAxisError`` if a name appears twice."""
    names = axis_names(axes)
    if len(set(names)) != len(names):
        dups = sorted({n for n in names if names.count(n) > 1})
        raise DuplicateAxisError(
            f"Duplicate axis names {format_names(dups)} in ({format_names(names)}). "
            "Each axis of a NamedArray needs its own name; rename one of them."
        )


def index_of(axes: Sequence[Axis], axis: AxisSelector) -> int | None:
    """Position of ``axis`` in ``axes`` by name, or ``None``."""
    name = axis_name(axis)
    for i, a in enumerate(axes):
        if a.name == name:
            return i
    return None


def find_axis(axes: Sequence[Axis], axis: AxisSelector, *, where: str | None = None) -> int:
    """Position of ``axis`` in ``axes``; raise a helpful error when missing or of the wrong size.

    Args:
        axes: The axes to search.
        axis: A name or an ``Axis`` (whose size must then match).
        where: How to describe the searched object in the message; defaults to
            ``NamedArray(batch=8, embed=64)``.

    Raises:
        AxisNotFoundError: with the available axes listed.
        AxisSizeError: if an ``Axis`` was given whose size differs.
    """
    i = index_of(axes, axis)
    if i is None:
        where = where or f"NamedArray({format_axes(axes)})"
        raise AxisNotFoundError(
            f"Axis {axis_name(axis)!r} not found in {where}. "
            f"Available axes: {format_names(a.name for a in axes)}."
        )
    if isinstance(axis, Axis) and axes[i].size != axis.size:
        raise AxisSizeError(
            f"Axis {axis.name!r} has size {axes[i].size} in NamedArray({format_axes(axes)}), "
            f"but size {axis.size} was asked for."
        )
    return i


def broadcast_axes(left: Sequence[Axis], right: Sequence[Axis]) -> tuple[Axis, ...]:
    """Axes of a by-name broadcast: ``left``'s axes, then ``right``'s axes that ``left`` lacks.

    Raises:
        AxisSizeError: if a shared name has two sizes (both sizes are named).

    Example:
        >>> broadcast_axes((Axis("a", 2),), (Axis("b", 3), Axis("a", 2)))
        (Axis(name='a', size=2), Axis(name='b', size=3))
    """
    by_name = {a.name: a for a in left}
    extra = []
    for a in right:
        mine = by_name.get(a.name)
        if mine is None:
            extra.append(a)
        elif mine.size != a.size:
            raise AxisSizeError(
                f"Cannot broadcast axis {a.name!r}: size {mine.size} in "
                f"({format_axes(left)}) but size {a.size} in ({format_axes(right)}). "
                "Slice or pad one operand so the sizes agree, or rename one axis."
            )
    return tuple(left) + tuple(extra)


# -- editing axis tuples ----------------------------------------------------------------------
# Pure helpers for building the axes of a result from the axes of an input. Each takes a sequence of
# ``Axis`` (or names) or a ``{name: size}`` dict and returns the same kind.


def _as_items(axes: AxisSpec | Sequence[AxisSelector]) -> tuple[list[AxisSelector], bool]:
    """The axes as a list of ``Axis``/names, and whether they came as a dict."""
    if isinstance(axes, Mapping):
        return [Axis(n, s) for n, s in axes.items()], True
    if isinstance(axes, (str, Axis)):
        return [axes], False
    if isinstance(axes, Sequence):
        items = list(axes)
        for a in items:
            axis_name(a)  # type check with the usual message
        return items, False
    raise NamedTypeError(
        f"Expected axes as a sequence of names/Axis or a {{name: size}} dict, got {axes!r} "
        f"({type(axes).__name__})."
    )


def _rebuild(items: Sequence[AxisSelector], was_mapping: bool) -> Any:
    if was_mapping:
        return {a.name: a.size for a in items if isinstance(a, Axis)}
    return tuple(items)


def _describe(items: Sequence[AxisSelector]) -> str:
    if all(isinstance(a, Axis) for a in items):
        return f"({format_axes(items)})"
    return f"({format_names(axis_name(a) for a in items)})"


def _locate(items: Sequence[AxisSelector], sel: AxisSelector, verb: str, hint: str) -> int:
    """Position of ``sel`` in ``items``; a typed error when it is missing or has another size."""
    names = [axis_name(a) for a in items]
    name = axis_name(sel)
    if name not in names:
        raise AxisNotFoundError(
            f"Cannot {verb} axis {name!r}: it is not in {_describe(items)}. "
            f"Available axes: {format_names(names)}.{hint}"
        )
    i = names.index(name)
    mine = items[i]
    if isinstance(sel, Axis) and isinstance(mine, Axis) and mine.size != sel.size:
        raise AxisSizeError(
            f"Cannot {verb} Axis({name!r}, {sel.size}): {name!r} has size {mine.size} in "
            f"{_describe(items)}."
        )
    return i


def without_axes(axes: Any, remove: AxisSelector | Sequence[AxisSelector]) -> Any:
    """``axes`` without the ones named in ``remove``; names ``axes`` lacks are skipped.

    This is set difference: use :func:`eliminate_axes` when every removed axis must be present.

    Args:
        axes: A sequence of ``Axis`` or names, or a ``{name: size}`` dict.
        remove: One name/``Axis`` or a sequence of them.

    Returns:
        The remaining axes in their order, as a tuple (a dict if ``axes`` was one).

    Example:
        >>> without_axes((Axis("batch", 2), Axis("embed", 3)), "embed")
        (Axis(name='batch', size=2),)
        >>> without_axes({"batch": 2, "embed": 3}, ("embed", "heads"))
        {'batch': 2}
    """
    items, was_mapping = _as_items(axes)
    gone = set(axis_names(remove))
    return _rebuild([a for a in items if axis_name(a) not in gone], was_mapping)


def eliminate_axes(axes: Any, remove: AxisSelector | Sequence[AxisSelector]) -> Any:
    """``axes`` without ``remove``, every one of which must be present.

    Args:
        axes: A sequence of ``Axis`` or names, or a ``{name: size}`` dict.
        remove: One name/``Axis`` or a sequence of them (an ``Axis``'s size is checked).

    Returns:
        The remaining axes in their order, as a tuple (a dict if ``axes`` was one).

    Raises:
        AxisNotFoundError: if an axis to remove is not in ``axes`` (the available ones are listed).
        AxisSizeError: if an ``Axis`` to remove has another size than the one in ``axes``.
        DuplicateAxisError: if ``remove`` names an axis twice.

    Example:
        >>> eliminate_axes((Axis("batch", 2), Axis("embed", 3)), "batch")
        (Axis(name='embed', size=3),)
    """
    items, was_mapping = _as_items(axes)
    selectors = (remove,) if isinstance(remove, (str, Axis)) else tuple(remove)
    check_unique(selectors)
    for sel in selectors:
        _locate(items, sel, "eliminate", " Use without_axes() to skip missing ones.")
    gone = {axis_name(s) for s in selectors}
    return _rebuild([a for a in items if axis_name(a) not in gone], was_mapping)


def replace_axis(axes: Any, old: AxisSelector, new: Any) -> Any:
    """``axes`` with ``old`` replaced, in place, by ``new`` (one axis or several).

    Args:
        axes: A sequence of ``Axis`` or names, or a ``{name: size}`` dict.
        old: The axis to replace (must be present; an ``Axis``'s size is checked).
        new: A name, an ``Axis``, a sequence of them, or a ``{name: size}`` dict. With a dict as
            ``axes``, the new axes need sizes.

    Returns:
        The new axes, as a tuple (a dict if ``axes`` was one).

    Raises:
        AxisNotFoundError: if ``old`` is not in ``axes``.
        DuplicateAxisError: if a new name collides with an axis that stays.
        NamedTypeError: if ``axes`` is a dict and a new axis is a bare name (it has no size).

    Example:
        >>> replace_axis(("batch", "embed"), "embed", ("heads", "head_dim"))
        ('batch', 'heads', 'head_dim')
        >>> replace_axis({"batch": 2, "embed": 6}, "embed", {"heads": 2, "head_dim": 3})
        {'batch': 2, 'heads': 2, 'head_dim': 3}
    """
    items, was_mapping = _as_items(axes)
    i = _locate(items, old, "replace", "")
    added, _ = _as_items(new)
    if was_mapping and not all(isinstance(a, Axis) for a in added):
        raise NamedTypeError(
            f"replace_axis() on a {{name: size}} dict needs sizes for the new axes, got {new!r}. "
            "Pass Axis objects or a dict, e.g. {'heads': 2}."
        )
    out = items[:i] + added + items[i + 1 :]
    check_unique(out)
    return _rebuild(out, was_mapping)
