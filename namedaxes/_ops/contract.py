"""Contractions over named axes: ``dot`` (say which axes to sum) and ``einsum`` (an equation of
names).

Both compile to one ``jnp.einsum`` call with generated single-letter subscripts, so JAX picks the
contraction order. Axes are matched by name across operands; their sizes must agree.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from types import EllipsisType
from typing import Any

import jax.numpy as jnp
from jax.sharding import NamedSharding

from .._array import NamedArray
from .._axis import Axis, AxisSelector, axis_names, check_unique, index_of
from .._errors import (
    AxisError,
    AxisNotFoundError,
    AxisSizeError,
    NamedTypeError,
    format_axes,
    format_names,
)
from .._logical._resolve import resolve
from .._logical._rules import AxisRules
from ._checks import as_selectors, dtype_arg, reject_positional
from ._common import agree_by_name, check_layout, explicit_sharding

__all__ = ["dot", "einsum"]

_LETTERS = string.ascii_letters


def _operands(caller: str, arrays: Sequence[Any]) -> tuple[NamedArray, ...]:
    if not arrays:
        raise NamedTypeError(f"{caller}() needs at least one NamedArray operand.")
    for i, x in enumerate(arrays):
        if not isinstance(x, NamedArray):
            shape = getattr(x, "shape", None)
            hint = (
                "multiply by a scalar with `*` instead"
                if shape is None or len(shape) == 0
                else "wrap it with named(x, (...)) first"
            )
            raise NamedTypeError(
                f"{caller}() operand {i + 1} must be a NamedArray, got {type(x).__name__}"
                f"{'' if shape is None else f' of shape {tuple(shape)}'}; {hint}."
            )
        check_layout(x)
    return tuple(arrays)


def _all_axes(caller: str, arrays: Sequence[NamedArray]) -> tuple[Axis, ...]:
    """Every axis of the operands in first-appearance order; sizes must agree."""
    first: dict[str, tuple[Axis, int]] = {}
    for i, x in enumerate(arrays):
        for a in x.axes:
            seen, j = first.setdefault(a.name, (a, i))
            if seen.size != a.size:
                raise AxisSizeError(
                    f"{caller}(): axis {a.name!r} has size {seen.size} in operand {j + 1} "
                    f"NamedArray({format_axes(arrays[j].axes)}) but size {a.size} in operand "
                    f"{i + 1} NamedArray({format_axes(x.axes)}). One name must have one size; "
                    "slice an operand or rename one of the axes."
                )
    return tuple(a for a, _ in first.values())


def _layout_order(arrays: Sequence[NamedArray], every: tuple[Axis, ...], kept: Any) -> list[str]:
    """The order of the result axes ``kept`` where the user gives none (the layout rule).

    When an operand has every result axis, the result keeps that operand's order (the first such
    operand, as for elementwise ops), so a large operand is not transposed behind the user's back;
    otherwise axes come in first-appearance order across the operands.
    """
    kept = set(kept)
    for x in arrays:
        if kept <= set(x.axis_names):
            return [n for n in x.axis_names if n in kept]
    return [a.name for a in every if a.name in kept]


def _unordered(
    arrays: Sequence[NamedArray], every: tuple[Axis, ...], ordered: Sequence[str], rest: Any
) -> list[str]:
    """The result axes ``rest`` that the user left unordered (at ``...``, or after the names), in
    the layout rule's order for a result with ``ordered`` and ``rest``."""
    rest = set(rest)
    return [n for n in _layout_order(arrays, every, [*ordered, *rest]) if n in rest]


def _run(
    caller: str,
    arrays: Sequence[NamedArray],
    every: tuple[Axis, ...],
    out: Sequence[str],
    precision: Any,
    preferred_element_type: Any,
    out_sharding: Any,
) -> NamedArray:
    preferred_element_type = dtype_arg(preferred_element_type, caller)
    if len(every) > len(_LETTERS):
        raise AxisError(
            f"{caller}() supports at most {len(_LETTERS)} distinct axes across its operands, got "
            f"{len(every)}. Split the contraction into steps."
        )
    # Explicit meshes: operands whose shardings conflict follow the mapping in force.
    arrays = agree_by_name(caller, arrays, keep=set(out))
    letter = {a.name: _LETTERS[i] for i, a in enumerate(every)}
    inputs = ",".join("".join(letter[a.name] for a in x.axes) for x in arrays)
    subscripts = f"{inputs}->{''.join(letter[n] for n in out)}"
    if out_sharding is None:
        out_sharding = _sharding_by_name(arrays, every, out)
    result = jnp.einsum(
        subscripts,
        *(x.array for x in arrays),
        precision=precision,
        preferred_element_type=preferred_element_type,
        out_sharding=out_sharding,
    )
    by_name = {a.name: a for a in every}
    return NamedArray(result, tuple(by_name[n] for n in out))


def _sharding_by_name(
    arrays: Sequence[NamedArray], every: tuple[Axis, ...], out: Sequence[str]
) -> Any:
    """The result's sharding when a contracted axis is sharded over Explicit mesh axes, else None.

    JAX cannot guess the result's sharding then and asks for one. The operands' own shardings
    become rules, in operand order (``(name, mesh_axes)`` for each sharded axis), and ``resolve``
    places the result's axes by them: each kept axis keeps the mesh axes it has in the first
    operand where it is sharded, each mesh axis is used once, and the answer does not depend on
    the order of the result's axes. The mesh axes of contracted axes are summed over.
    """
    mesh = None
    pairs: list[tuple[str, Any]] = []
    contracted_sharded = False
    for x in arrays:
        info = explicit_sharding(x.array)
        if info is None:
            continue
        mesh, entries = info
        for a, entry in zip(x.axes, entries):
            if entry is None:
                continue
            pairs.append((a.name, entry))
            contracted_sharded |= a.name not in out
    if not contracted_sharded:
        return None
    by_name = {a.name: a for a in every}
    rules = AxisRules(pairs, unsatisfied="replicate")
    return NamedSharding(mesh, resolve(tuple(by_name[n] for n in out), rules, mesh))


def dot(
    *arrays: NamedArray,
    axis: AxisSelector | Sequence[AxisSelector] | None,
    precision: Any = None,
    preferred_element_type: Any = None,
    out_sharding: Any = None,
    out_axes: Sequence[AxisSelector | EllipsisType] | None = None,
) -> NamedArray:
    """Multiply NamedArrays and sum over the named ``axis`` (or axes).

    Axes are matched by name. Every axis that is not contracted is kept once, so an axis shared by
    several operands and not in ``axis`` acts as a batch axis. ``axis`` is required, so that no
    axis is summed by accident. An axis held by only one operand is summed within it.

    The result keeps layouts, as elementwise ops do: when an operand has every axis of the result,
    the result keeps that operand's axis order (the first such operand), so it is not transposed
    behind the user's back; otherwise the axes come in first-appearance order across the operands.

    ``axis=None`` (or ``()``) contracts nothing: an outer product over distinct axes, elementwise
    over shared ones. This is deliberate and differs from Haliax, where ``None`` contracts every
    shared axis: which axes happen to share a name is not something to sum over implicitly (adding
    or renaming an axis elsewhere would silently change the math), so sums are always named. To
    contract every shared axis, name them (``axis=("embed", "heads")``) or write
    ``einsum("-> batch", ...)``.

    Args:
        *arrays: One or more NamedArrays.
        axis: The axis or axes to contract: a name, an ``Axis``, a sequence of them, or ``None``.
        precision: Passed to ``jnp.einsum``.
        preferred_element_type: Accumulation/result type, passed to ``jnp.einsum``.
        out_sharding: The result's sharding, passed to ``jnp.einsum``. When ``None`` and a
            contracted axis is sharded over Explicit mesh axes (where JAX asks for one), every kept
            axis keeps the mesh axes it has in the operands.
        out_axes: The result's axis order: every kept axis by name (or as an ``Axis`` of its
            size), or some of them and one ``...`` for the others (in the default order).

    Returns:
        A NamedArray with every axis of the operands but ``axis``, in ``out_axes`` order, else
        in the order of the first operand that has them all, else in first-appearance order.

    Raises:
        AxisNotFoundError: if no operand has a contracted axis (the available axes are listed),
            or ``out_axes`` names an axis the result lacks.
        AxisSizeError: if one axis name has two sizes, or an ``Axis`` in ``axis`` or
            ``out_axes`` has another size.
        AxisError: if ``out_axes`` misses result axes and has no ``...``.
        NamedTypeError: if an operand is not a NamedArray, or ``out_axes`` is not names in order
            (a set, or a position).

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> x = na.named(jnp.ones((2, 3)), ("batch", "embed"))
        >>> w = na.named(jnp.ones((3, 4)), ("embed", "mlp"))
        >>> na.dot(x, w, axis="embed")
        NamedArray(float32, batch=2, mlp=4)
        >>> na.dot(x, w, axis="embed", out_axes=("mlp", ...))
        NamedArray(float32, mlp=4, batch=2)
        >>> na.dot(x, w, axis=None)
        NamedArray(float32, batch=2, embed=3, mlp=4)
        >>> b = na.named(jnp.ones(3), "embed")
        >>> na.dot(b, x, axis=None)  # x has every result axis: its layout is kept
        NamedArray(float32, batch=2, embed=3)
    """
    arrays = _operands("dot", arrays)
    every = _all_axes("dot", arrays)
    first = arrays[0].axes  # axes are names: `axis=0` gets the name at position 0 suggested
    reject_positional("dot", axis, first, f"operand 1 NamedArray({format_axes(first)})")
    selectors = () if axis is None else as_selectors("dot", axis)
    contracted = axis_names(selectors)
    check_unique(contracted)
    for sel in selectors:
        i = index_of(every, sel)
        if i is None:
            raise AxisNotFoundError(
                f"dot() cannot contract axis {axis_names(sel)[0]!r}: no operand has it. "
                f"Available axes: {format_names(a.name for a in every)}."
            )
        if isinstance(sel, Axis) and every[i].size != sel.size:
            raise AxisSizeError(
                f"dot() was asked to contract Axis({sel.name!r}, {sel.size}), but the operands' "
                f"{sel.name!r} has size {every[i].size}."
            )
    out = _layout_order(arrays, every, (a.name for a in every if a.name not in contracted))
    if out_axes is not None:
        out = _order_output("dot", out, out_axes, every, contracted)
    return _run("dot", arrays, every, out, precision, preferred_element_type, out_sharding)


def _order_output(
    caller: str,
    out: list[str],
    wanted: Any,
    every: tuple[Axis, ...],
    contracted: Sequence[str] = (),
) -> list[str]:
    """``out`` reordered as ``wanted`` (names and at most one ``...`` for the rest)."""
    if wanted is Ellipsis or isinstance(wanted, (str, Axis)):
        items = [wanted]
    elif isinstance(wanted, Sequence) and all(
        w is Ellipsis or isinstance(w, (str, Axis)) for w in wanted
    ):
        items = list(wanted)
    else:  # a set has no order to give; positions are not axes
        raise NamedTypeError(
            f"{caller}(): out_axes gives the result's axis order: axis names or Axis objects in a "
            f"tuple or list, with at most one ..., got {wanted!r}; e.g. out_axes=('mlp', ...)."
        )
    if sum(1 for w in items if w is Ellipsis) > 1:
        raise AxisError(f"{caller}(): out_axes has more than one '...'.")
    names = [w if w is Ellipsis else axis_names(w)[0] for w in items]
    listed = [n for n in names if n is not Ellipsis]
    check_unique(listed)
    size = {a.name: a.size for a in every}
    for w in items:
        if w is Ellipsis:
            continue
        n = axis_names(w)[0]
        if n not in out:
            why = " (it is contracted)" if n in contracted else ""
            raise AxisNotFoundError(
                f"{caller}(): out_axes names {n!r}, which the result does not have{why}. Result "
                f"axes: {format_names(out)}."
            )
        if isinstance(w, Axis) and w.size != size[n]:
            raise AxisSizeError(
                f"{caller}(): out_axes asks for Axis({n!r}, {w.size}), but the result's {n!r} has "
                f"size {size[n]}. Give the size it has, or the name alone: out_axes=({n!r}, ...)."
            )
    rest = [n for n in out if n not in listed]
    if Ellipsis not in names:
        if rest:
            raise AxisError(
                f"{caller}(): out_axes ({format_names(listed)}) misses result axes "
                f"{format_names(rest)}; list them or add ... for the others."
            )
        return listed
    at = names.index(Ellipsis)
    return listed[:at] + rest + listed[at:]


def _parse_side(spec: str, where: str) -> tuple[list[str], bool]:
    """Names in one side of an equation and whether it has ``...``."""
    tokens = spec.split()
    for t in tokens:
        if "..." in t and t != "...":  # '...embed' would be looked up as one axis name
            fixed = " ".join(t.replace("...", " ... ").split())
            raise AxisError(
                f"einsum(): {where} {spec.strip()!r} has {t!r}; separate '...' from axis names "
                f"with spaces: {fixed!r}."
            )
    names = [t for t in tokens if t != "..."]
    if len(tokens) - len(names) > 1:
        raise AxisError(f"einsum(): {where} {spec.strip()!r} has more than one '...'.")
    check_unique(names)
    return names, len(names) != len(tokens)


def einsum(
    equation: str,
    *arrays: NamedArray,
    precision: Any = None,
    preferred_element_type: Any = None,
    out_sharding: Any = None,
) -> NamedArray:
    """Einstein summation written with axis names: ``"batch embed, embed mlp -> batch mlp"``.

    Operand specs are separated by commas and list each operand's axes by name (in any order: the
    names, not positions, identify axes). ``...`` in an operand spec stands for its axes that are
    not named; ``...`` on the right stands for every axis that no operand spec names and that the
    right side does not name. The right side gives the result's axis order; every input axis
    missing from it is summed over (so axes covered by ``...`` are summed when the right side has
    no ``...``, as in NumPy).

    Two shorter forms leave the operands' axes unlisted:

    - output-only, ``"-> batch mlp"``: the result has exactly these axes; every other axis is
      summed (``"-> batch ..."`` keeps all others, summing nothing);
    - unordered, ``"{embed mlp} -> mlp"``: the braces name the axes the equation is about; those
      missing on the right are summed, and axes never named are kept as batch axes, at the
      right side's ``...`` or else after its names.

    Axes the equation leaves unordered (those ``...`` or the unordered form keeps) follow
    :func:`dot`'s layout rule: the order of the first operand that has every result axis, else
    first-appearance order; so ``"-> ..."`` never transposes an operand that has every axis.

    Args:
        equation: ``"<names>, <names>, ... -> <names>"`` with names separated by spaces, or
            ``"-> <names>"``, or ``"{<names>} -> <names>"``.
        *arrays: One NamedArray per operand spec.
        precision: Passed to ``jnp.einsum``.
        preferred_element_type: Accumulation/result type, passed to ``jnp.einsum``.
        out_sharding: The result's sharding; defaults as for :func:`dot`.

    Returns:
        A NamedArray with the right side's axes.

    Raises:
        AxisError: if the equation is malformed (``'...embed'`` for ``'... embed'`` included),
            the number of specs differs from the number of operands, or an operand has axes its
            spec neither names nor covers with ``...``.
        AxisNotFoundError: if a spec names an axis its operand lacks, or the right side names an
            axis no operand has.
        AxisSizeError: if one axis name has two sizes.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> x = na.named(jnp.ones((2, 3)), ("batch", "embed"))
        >>> w = na.named(jnp.ones((3, 4)), ("embed", "mlp"))
        >>> na.einsum("batch embed, embed mlp -> mlp batch", x, w)
        NamedArray(float32, mlp=4, batch=2)
        >>> na.einsum("... embed, embed mlp -> ... mlp", x, w)
        NamedArray(float32, batch=2, mlp=4)
        >>> na.einsum("-> mlp", x, w)  # sums batch and embed
        NamedArray(float32, mlp=4)
        >>> na.einsum("{embed} -> ", x, w)  # sums embed, keeps the rest
        NamedArray(float32, batch=2, mlp=4)
    """
    if not isinstance(equation, str) or equation.count("->") != 1:
        raise AxisError(
            f"einsum() needs an equation with exactly one '->', got {equation!r}; e.g. "
            "'batch embed, embed mlp -> batch mlp'."
        )
    arrays = _operands("einsum", arrays)
    lhs, rhs = equation.split("->")
    if not lhs.strip() or lhs.strip().startswith("{"):
        every = _all_axes("einsum", arrays)
        out_names = _named_modes(equation, lhs, rhs, arrays, every)
        return _run(
            "einsum", arrays, every, out_names, precision, preferred_element_type, out_sharding
        )
    specs = lhs.split(",")
    if len(specs) != len(arrays):
        raise AxisError(
            f"einsum() equation {equation!r} has {len(specs)} operand spec(s) but "
            f"{len(arrays)} array(s) were given."
        )
    every = _all_axes("einsum", arrays)
    named_somewhere: set[str] = set()
    for i, (spec, x) in enumerate(zip(specs, arrays)):
        names, ellipsis = _parse_side(spec, f"operand {i + 1} spec")
        for n in names:
            if not x.has_axis(n):
                raise AxisNotFoundError(
                    f"einsum() operand {i + 1} spec {spec.strip()!r} names axis {n!r}, which "
                    f"NamedArray({format_axes(x.axes)}) does not have. Available axes: "
                    f"{format_names(x.axis_names)}."
                )
        rest = [n for n in x.axis_names if n not in names]
        if rest and not ellipsis:
            raise AxisError(
                f"einsum() operand {i + 1} NamedArray({format_axes(x.axes)}) has axes "
                f"{format_names(rest)} that its spec {spec.strip()!r} does not name. Name them, "
                "or add '...' to cover them."
            )
        named_somewhere.update(names)
    # '...' on the right keeps the axes that no spec names.
    covered = [a.name for a in every if a.name not in named_somewhere]
    out_names, out_ellipsis = _parse_side(rhs, "result spec")
    for n in out_names:
        if index_of(every, n) is None:
            raise AxisNotFoundError(
                f"einsum() result spec {rhs.strip()!r} names axis {n!r}, which no operand has. "
                f"Available axes: {format_names(a.name for a in every)}."
            )
    if out_ellipsis:
        kept = _unordered(arrays, every, out_names, (n for n in covered if n not in out_names))
        tokens = rhs.split()
        at = tokens.index("...")
        out_names = out_names[:at] + kept + out_names[at:]
    return _run("einsum", arrays, every, out_names, precision, preferred_element_type, out_sharding)


def _named_modes(
    equation: str, lhs: str, rhs: str, arrays: Sequence[NamedArray], every: tuple[Axis, ...]
) -> list[str]:
    """The result's axes for the output-only (``"-> a b"``) and unordered (``"{a b} -> a"``) forms.

    Output-only: the result has exactly the right side's axes (``...`` keeps every other axis),
    everything else is summed. Unordered: the braces name the axes the equation is about; those not
    on the right are summed, and axes the equation never names are kept, at the right side's
    ``...`` or else after its names. The kept axes follow the layout rule (``_layout_order``).
    """
    available = [a.name for a in every]
    mentioned: list[str] = []
    if lhs.strip():
        inner = lhs.strip()
        if (
            not inner.endswith("}")
            or inner.count("{") != 1
            or inner.count("}") != 1
            or "," in inner
        ):
            raise AxisError(
                f"einsum() equation {equation!r}: the unordered form lists axes in one pair of "
                "braces, e.g. '{embed heads} -> heads'."
            )
        mentioned, dots = _parse_side(inner[1:-1], "unordered spec")
        if dots:
            raise AxisError(f"einsum() equation {equation!r}: '...' has no meaning inside braces.")
        for n in mentioned:
            if n not in available:
                raise AxisNotFoundError(
                    f"einsum() equation {equation!r} names axis {n!r}, which no operand has. "
                    f"Available axes: {format_names(available)}."
                )
    out_names, out_ellipsis = _parse_side(rhs, "result spec")
    for n in out_names:
        if n not in available:
            raise AxisNotFoundError(
                f"einsum() result spec {rhs.strip()!r} names axis {n!r}, which no operand has. "
                f"Available axes: {format_names(available)}."
            )
    if lhs.strip():
        kept = [n for n in available if n not in mentioned and n not in out_names]
    elif out_ellipsis:
        kept = [n for n in available if n not in out_names]
    else:
        return out_names
    kept = _unordered(arrays, every, out_names, kept)
    if not out_ellipsis:
        return out_names + kept
    at = rhs.split().index("...")
    return out_names[:at] + kept + out_names[at:]
