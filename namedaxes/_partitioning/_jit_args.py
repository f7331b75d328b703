"""What ``named_jit`` checks about its options and arguments: known options, hashable statics,
donation flags, donated buffers. Errors name the argument (``args[0]['w']``) and the fix.

``check_live`` is the same check of donated buffers for a tree about to be written (checkpoints,
state dicts, Hugging Face folders), so that reusing a donated array reads the same everywhere."""

from __future__ import annotations

import inspect
import operator
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from .._array import NamedArray
from .._errors import DonatedArrayError, NamedTypeError, format_path
from .._logical._rules import RulesLike
from ._jit_entries import Layout, is_dynamic_type

RESERVED_JIT_KWARGS = (
    "in_shardings",
    "out_shardings",
    "static_argnums",
    "static_argnames",
    "donate_argnums",
    "donate_argnames",
)


#: jax.jit's keyword options (named_jit passes the rest of them through).
JIT_OPTIONS = frozenset(
    n for n, p in inspect.signature(jax.jit).parameters.items() if p.kind is not p.VAR_POSITIONAL
) - {"fun"}


def frozen_mapping(value: RulesLike | None) -> RulesLike | None:
    """A private copy of a mapping given at decoration time (AxisRules are immutable already)."""
    if isinstance(value, Mapping):
        return {k: tuple(v) if isinstance(v, list) else v for k, v in value.items()}
    if isinstance(value, list):
        return tuple(tuple(p) if isinstance(p, list) else p for p in value)
    return value


def _leaf_path(
    args: Any, kwargs: Any, dyn_pos: int | None = None, leaf_pos: int | None = None
) -> str:
    """``args[0]['w']``-style path of an argument leaf, by its position among array leaves or all."""
    flat = jax.tree_util.tree_flatten_with_path((args, kwargs))[0]
    if dyn_pos is not None:
        flat = [(p, v) for p, v in flat if is_dynamic_type(type(v))]
        path = flat[dyn_pos][0]
    else:
        path = flat[leaf_pos][0]  # type: ignore[index]
    return argument_path(path)


def argument_path(path: Any) -> str:
    """``args[0]['w']``-style name of a leaf of ``(args, kwargs)`` from its key path."""
    head, rest = path[0].idx, path[1:]
    return ("args" if head == 0 else "kwargs") + jax.tree_util.keystr(rest)


def unhashable_static(
    layout: Layout, leaves: list[Any], statics: tuple[Any, ...]
) -> NamedTypeError:
    for pos, value in zip(layout.static_idx, statics):
        try:
            hash(value)
        except TypeError:
            args, kwargs = layout.treedef.unflatten(leaves)
            return NamedTypeError(
                f"named_jit treats non-array arguments as static and keys its cache on their "
                f"values, but {_leaf_path(args, kwargs, leaf_pos=pos)} is an unhashable "
                f"{type(value).__name__} ({value!r}). Pass a hashable value (a tuple instead of a "
                "list), or an array if it should be traced."
            )
    return NamedTypeError("named_jit: an unhashable static argument.")  # pragma: no cover


_IS_DELETED = operator.methodcaller("is_deleted")


def donated_error(what: str, caller: str, use: str = "use") -> DonatedArrayError:
    """The error for a deleted array (``what``: ``argument args[0]``, ``leaf 'w'``) used again."""
    return DonatedArrayError(
        f"{caller}: {what} was donated to an earlier call (named_jit or fsdp with donate_args=..., "
        "jax.jit with donate_argnums=...), so its buffer is gone. Donation hands an argument's "
        f"memory to the call's outputs: {use} the value the call returned instead, or don't "
        "donate it."
    )


def check_live(tree: Any, caller: str) -> None:
    """Refuse to save ``tree`` if one of its arrays was donated (deleted), naming its path.

    Raises:
        DonatedArrayError: naming the first such leaf (``model/embed/weight``).
    """
    flat = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: isinstance(x, NamedArray))
    for path, x in flat[0]:
        array = x.array if isinstance(x, NamedArray) else x
        if isinstance(array, jax.Array) and array.is_deleted():
            raise donated_error(f"leaf {format_path(path)!r}", caller, use="save")


def check_donation(layout: Layout, dyn: Any, args: Any, kwargs: Any) -> None:
    """Refuse donated buffers that are already deleted or also passed as another argument.

    The common case (nothing deleted, no array passed twice) is two C-level passes; the leaf at
    fault is looked for only when one of them finds something."""
    try:
        deleted = any(map(_IS_DELETED, layout.get_donated(dyn)))
    except AttributeError:  # not every donated leaf is a jax.Array: look at each
        deleted = True
    if not deleted and len(set(map(id, dyn))) == len(dyn):
        return
    for i in layout.donate:
        x = dyn[i]
        if isinstance(x, jax.Array) and x.is_deleted():
            raise donated_error(f"argument {_leaf_path(args, kwargs, dyn_pos=i)}", "named_jit")
    if len(set(map(id, dyn))) < len(dyn):
        seen: dict[int, int] = {}
        for i, x in enumerate(dyn):
            j = seen.setdefault(id(x), i)
            if j != i and (i in layout.donate or j in layout.donate):
                raise NamedTypeError(
                    f"named_jit: the same array is passed as {_leaf_path(args, kwargs, dyn_pos=j)} "
                    f"and {_leaf_path(args, kwargs, dyn_pos=i)}, and one of them is donated. A "
                    "donated buffer is reused for outputs, so it cannot also be read as another "
                    "argument: pass a copy, or don't donate it."
                )


def release_moved(layout: Layout, given: Any, placed: Any) -> None:
    """Delete the caller's donated arrays that were moved before the call: the program consumed
    the moved copies, and a donated buffer must not outlive the call (as with ``jax.jit``)."""
    for i in layout.donate:
        x = given[i]
        if placed[i] is not x and isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
            if not x.is_deleted():
                x.delete()


def donation_flags(tree: Any, prefix: Any, what: str, of: str) -> list[bool]:
    """One bool per leaf of ``tree`` from a pytree prefix of bools (or of ``leaf -> bool``)."""
    if prefix is None:
        return [False] * len(jax.tree_util.tree_leaves(tree))

    def expand(flag: Any, sub: Any) -> list[bool]:
        sub_leaves = jax.tree_util.tree_leaves(sub)
        if callable(flag):
            return [bool(flag(x)) for x in sub_leaves]
        if not isinstance(flag, (bool, np.bool_)) and flag is not None:
            raise NamedTypeError(
                f"{what} entries must be True/False (or a function leaf -> bool), got {flag!r} "
                f"({type(flag).__name__}) in {what}={prefix!r}. It is a pytree prefix of the {of}, "
                f"not a list of positions: to donate the first of two arguments use "
                f"{what}=(True, False)."
            )
        return [bool(flag)] * len(sub_leaves)

    if isinstance(prefix, (bool, np.bool_)) or callable(prefix):
        return expand(prefix, tree)
    if not isinstance(prefix, (tuple, list, dict)):
        expand(prefix, tree)  # a lone non-bool (e.g. "no" or 0): refused with the message above
    try:
        nested = jax.tree_util.tree_map(expand, prefix, tree, is_leaf=lambda x: x is None)
    except (ValueError, TypeError) as e:
        raise NamedTypeError(
            f"{what} must be a pytree prefix of the {of} (bools, or functions leaf -> bool), got "
            f"{prefix!r}. E.g. donate_args=(True, False) for f(params, batch). ({e})"
        ) from None
    parts = jax.tree_util.tree_leaves(nested, is_leaf=lambda x: isinstance(x, list))
    return [f for part in parts for f in part]
