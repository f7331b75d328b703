"""Axes and the pure algebra over them. No JAX here: this module only knows names and sizes."""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias, Union

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
    "find_axis",
    "index_of",
    "to_axes",
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
AxisSelector: TypeAlias = Union[str, Axis]
#: Axes given with sizes: a sequence of ``Axis`` or a ``{name: size}`` mapping.
AxisSpec: TypeAlias = Union[Sequence[Axis], Mapping[str, int], Axis]


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
