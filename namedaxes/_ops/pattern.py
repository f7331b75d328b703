"""einops-style patterns for ``rearrange``: ``"b (h d) s -> b h s d"`` read by name.

The left side names axes of the input, **by name and in any order** (the input's layout does not
matter). A group ``(h d)`` on the left splits one axis; it names that axis with a label,
``(embed: h d)``, or, when exactly one axis of the input is not named elsewhere on the left, may
leave the label out. ``...`` stands for the axes the left side does not name (in their current
order). The right side lists the result's axes in order: names from the left (group parts
included, or axes covered by ``...``), ``...``, and groups that merge axes, ``(h d)`` or
``(label: h d)``; an unlabelled merge takes the name of the left group with the same parts, or its
only part's name. ``...`` may also sit inside one right-side group to merge the axes it covers;
on the right it needs one on the left (as in einops). Sizes of split parts are given as keywords
(``h=8``, ints of at least 0); one part per group may be left to infer.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .._array import NamedArray
from .._errors import (
    AxisError,
    AxisNotFoundError,
    AxisSizeError,
    DuplicateAxisError,
    NamedTypeError,
    format_axes,
    format_names,
)
from ._checks import is_static_int
from ._reshape import flatten_axes_as, reorder, unflatten_axis_as

__all__ = ["rearrange_pattern"]

_TOKEN = re.compile(r"\.\.\.|[():]|[^\s():.]+|\S")
_NAME = re.compile(r"[A-Za-z_][\w]*\Z")


@dataclass
class _Group:
    label: str | None
    parts: list[str] = field(default_factory=list)  # names, and "..." on the right side


# An element of one side: a name, "...", or a group.
_Element = str | _Group


def _error(pattern: str, message: str) -> AxisError:
    return AxisError(f"rearrange({pattern!r}): {message}")


def _parse_side(text: str, pattern: str, side: str) -> list[_Element]:
    tokens = _TOKEN.findall(text)
    out: list[_Element] = []
    group: _Group | None = None
    i = 0
    while i < len(tokens):
        t = tokens[i]
        if t == "(":
            if group is not None:
                raise _error(
                    pattern, f"nested parentheses on the {side} side; groups hold names only."
                )
            group = _Group(None)
            if i + 2 < len(tokens) and tokens[i + 2] == ":":
                group.label = _check_name(tokens[i + 1], pattern)
                i += 2
        elif t == ")":
            if group is None:
                raise _error(pattern, f"')' without '(' on the {side} side.")
            if not group.parts:
                raise _error(
                    pattern, "an empty group '()' has no axes; use broadcast_axis to add an axis."
                )
            out.append(group)
            group = None
        elif t == ":":
            raise _error(
                pattern,
                "':' labels a group and must follow its name inside '(', e.g. '(embed: h d)'.",
            )
        elif t == "...":
            (group.parts if group is not None else out).append("...")
        else:
            name = _check_name(t, pattern)
            (group.parts if group is not None else out).append(name)
        i += 1
    if group is not None:
        raise _error(pattern, f"unclosed '(' on the {side} side.")
    return out


def _check_name(token: str, pattern: str) -> str:
    if not _NAME.match(token):
        hint = " Use broadcast_axis to add a size-1 axis." if token.isdigit() else ""
        raise _error(pattern, f"{token!r} is not an axis name (letters, digits, '_').{hint}")
    return token


def _check_sizes(sizes: Mapping[str, Any], pattern: str) -> dict[str, int]:
    """The keyword sizes as Python ints: each an int (NumPy's too, not a bool), at least 0."""
    out: dict[str, int] = {}
    for key, size in sizes.items():
        if not is_static_int(size):
            raise NamedTypeError(
                f"rearrange({pattern!r}): size {key}={size!r} ({type(size).__name__}) is not an "
                f"int. Pass an int size, e.g. {key}=2."
            )
        if size < 0:
            raise AxisSizeError(
                f"rearrange({pattern!r}): size {key}={size} is negative. Pass a size of at least 0, "
                "or leave one part of a group out to infer it."
            )
        out[key] = int(size)
    return out


def _parts(elements: list[_Element]) -> list[str]:
    """The names and ``...`` of a side, group parts included (group labels not)."""
    return [p for e in elements for p in ([e] if isinstance(e, str) else e.parts)]


def _names_in(elements: list[_Element]) -> list[str]:
    out: list[str] = []
    for e in elements:
        out.extend([e] if isinstance(e, str) else ([e.label] if e.label else []) + e.parts)
    return [n for n in out if n != "..."]


def rearrange_pattern(x: NamedArray, pattern: str, sizes: Mapping[str, int]) -> NamedArray:
    """Apply an einops-style ``pattern`` to ``x`` (see the module docstring).

    ``sizes`` give the sizes of split parts.
    """
    op = f"rearrange({pattern!r})"
    sizes = _check_sizes(sizes, pattern)

    if pattern.count("->") != 1:
        raise _error(pattern, "a pattern needs exactly one '->', e.g. 'b (h d) -> b h d'.")
    left_text, right_text = pattern.split("->")
    left = _parse_side(left_text, pattern, "left")
    right = _parse_side(right_text, pattern, "right")
    for e in left:
        if isinstance(e, _Group) and "..." in e.parts:
            raise _error(pattern, "'...' cannot be split on the left side; name the axis to split.")
    if sum(1 for e in left if e == "...") > 1:
        raise _error(pattern, "'...' appears more than once on the left side.")

    # Which axis of x each left element is.
    bare = [e for e in left if isinstance(e, str) and e != "..."]
    groups = [e for e in left if isinstance(e, _Group)]
    for name in bare + [g.label for g in groups if g.label]:
        if not x.has_axis(name):
            raise AxisNotFoundError(
                f"rearrange({pattern!r}): axis {name!r} not found in "
                f"NamedArray({format_axes(x.axes)}). Available axes: {format_names(x.axis_names)}."
            )
    claimed = bare + [g.label for g in groups if g.label]
    dups = sorted({n for n in claimed if claimed.count(n) > 1})
    if dups:
        raise DuplicateAxisError(
            f"rearrange({pattern!r}): axis {format_names(dups)} appears twice on the left side."
        )
    unlabelled = [g for g in groups if g.label is None]
    if unlabelled:
        free = [a.name for a in x.axes if a.name not in claimed]
        if len(unlabelled) > 1 or len(free) != 1:
            raise _error(
                pattern,
                f"cannot tell which axis of NamedArray({format_axes(x.axes)}) the group "
                f"'({' '.join(unlabelled[0].parts)})' splits (candidates: {format_names(free)}). "
                f"Label it with the axis it splits, e.g. '({free[0] if free else 'embed'}: "
                f"{' '.join(unlabelled[0].parts)})'.",
            )
        unlabelled[0].label = free[0]
        claimed.append(free[0])
    rest = [a.name for a in x.axes if a.name not in claimed]
    if rest and "..." not in left:
        raise _error(
            pattern,
            f"axes {format_names(rest)} of NamedArray({format_axes(x.axes)}) are not on the left "
            "side. Name them, or add '...' to cover them.",
        )

    # Split: sizes of each group's parts.
    parts_of: dict[str, list[str]] = {}
    used_sizes: set[str] = set()
    for g in groups:
        source = x.resolve_axis(g.label)  # type: ignore[arg-type]
        known = {p: sizes[p] for p in g.parts if p in sizes}
        used_sizes.update(known)
        unknown = [p for p in g.parts if p not in known]
        if len(set(g.parts)) != len(g.parts):
            raise DuplicateAxisError(
                f"rearrange({pattern!r}): group '({' '.join(g.parts)})' repeats a name."
            )
        prod = math.prod(known.values())
        if len(unknown) > 1:
            raise AxisSizeError(
                f"rearrange({pattern!r}): give the sizes of all but one of {format_names(g.parts)} "
                f"(splitting {source.name!r} of size {source.size}), e.g. {unknown[0]}=..."
            )
        if unknown:
            if prod == 0 or source.size % prod:
                raise AxisSizeError(
                    f"rearrange({pattern!r}): axis {source.name!r} of size {source.size} cannot be "
                    f"split into {format_axes(known)} and {unknown[0]!r}: {prod} does not divide "
                    f"{source.size}."
                )
            known[unknown[0]] = source.size // prod
        elif prod != source.size:
            raise AxisSizeError(
                f"rearrange({pattern!r}): parts ({format_axes({p: known[p] for p in g.parts})}) "
                f"multiply to {prod}, but axis {source.name!r} has size {source.size}."
            )
        x = unflatten_axis_as(x, source.name, {p: known[p] for p in g.parts}, op)
        parts_of[source.name] = list(g.parts)
    for name in bare:
        if name in sizes:
            used_sizes.add(name)
            if sizes[name] != x.axis_size(name):
                raise AxisSizeError(
                    f"rearrange({pattern!r}): {name}={sizes[name]} was given, but axis {name!r} "
                    f"has size {x.axis_size(name)}."
                )
    unused = sorted(set(sizes) - used_sizes)
    if unused:
        raise _error(
            pattern,
            f"sizes were given for {format_names(unused)}, which no left-side group splits.",
        )

    # The right side: every elementary axis exactly once.
    elementary = [n for n in x.axis_names if n not in rest]
    seen: list[str] = []
    right_ellipses = _parts(right).count("...")
    if right_ellipses > 1:
        raise _error(pattern, "'...' appears more than once on the right side.")
    if right_ellipses and "..." not in left:  # as einops: it would stand for nothing
        raise _error(
            pattern,
            "'...' is on the right side but not on the left; add '...' to the left side to cover "
            "the axes it stands for, or remove it from the right.",
        )
    for n in _names_in([e if isinstance(e, str) else _Group(None, e.parts) for e in right]):
        if n not in elementary and n not in rest:
            raise AxisNotFoundError(
                f"rearrange({pattern!r}): right-side axis {n!r} is not on the left side nor an "
                f"axis of NamedArray. Available: {format_names(elementary + rest)}."
            )
        seen.append(n)
    dups = sorted({n for n in seen if seen.count(n) > 1})
    if dups:
        raise DuplicateAxisError(
            f"rearrange({pattern!r}): axis {format_names(dups)} appears twice on the right side."
        )
    covered = [n for n in rest if n not in seen]  # what '...' on the right stands for
    dropped = [n for n in elementary if n not in seen] + ([] if right_ellipses else covered)
    if dropped:
        raise _error(
            pattern,
            f"the right side drops {format_names(dropped)}; rearrange keeps every axis (reduce "
            "or index them first, or add '...').",
        )

    # Merge the right side's groups, then order.
    order: list[Any] = []
    for e in right:
        if isinstance(e, str):
            order.append(Ellipsis if e == "..." else e)
            continue
        merged = [p for q in e.parts for p in (covered if q == "..." else [q])]
        name = e.label or _merged_name(e.parts, parts_of, pattern)
        if not merged:
            raise _error(pattern, f"group '({' '.join(e.parts)})' covers no axes.")
        if merged != [name]:
            x = flatten_axes_as(x, merged, name, op)
        order.append(name)
    if Ellipsis in order:
        at = order.index(Ellipsis)
        order = order[:at] + covered + order[at + 1 :]
    return reorder(x, tuple(order))


def _merged_name(parts: list[str], parts_of: dict[str, list[str]], pattern: str) -> str:
    """The name of an unlabelled merge: the left group with the same parts, or its only part."""
    for source, p in parts_of.items():
        if p == parts:
            return source
    if len(parts) == 1 and parts[0] != "...":
        return parts[0]
    raise _error(
        pattern,
        f"name the merged axis '({' '.join(parts)})' with a label, e.g. "
        f"'({'_'.join(p for p in parts if p != '...') or 'merged'}: {' '.join(parts)})'.",
    )
