"""Higher-order functions over a named axis: ``vmap``, ``scan`` and ``fold``.

Each one finds the named axis in every NamedArray of its arguments, hands JAX the underlying arrays
with the right positional axis, rebuilds NamedArrays without the axis inside the user's function,
and gives the axis back (as the first axis) to the NamedArrays it returns. Leaves without the axis
(NamedArrays that lack it, plain arrays, Python values, callables) are passed unchanged to every
call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from .._array import NamedArray, is_named_array
from .._axis import Axis, AxisSelector, axis_name, index_of
from .._errors import (
    AxisNotFoundError,
    AxisSizeError,
    DuplicateAxisError,
    NamedTypeError,
    format_axes,
    format_path,
)
from ._common import unshard_dims

__all__ = ["fold", "scan", "vmap"]


class _Mapped:
    """The NamedArrays of a pytree that carry the mapped axis, split out for JAX."""

    def __init__(
        self, tree: Any, axis: AxisSelector, op: str, what: str, label: Callable[[Any], str]
    ):
        name = axis_name(axis)
        leaves, self.treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_named_array)
        self.leaves = [leaf for _, leaf in leaves]
        self.slots: list[int] = []  # which leaves are mapped
        self.inner_axes: list[tuple[Axis, ...]] = []
        self.positions: list[int] = []
        self.arrays: list[Any] = []
        sizes: dict[str, int] = {}
        for k, (path, leaf) in enumerate(leaves):
            if not isinstance(leaf, NamedArray):
                continue
            i = index_of(leaf.axes, name)
            if i is None:
                continue
            self.slots.append(k)
            self.positions.append(i)
            self.inner_axes.append(leaf.axes[:i] + leaf.axes[i + 1 :])
            self.arrays.append(leaf.array)
            sizes[label(path)] = leaf.axes[i].size
        if isinstance(axis, Axis):
            sizes["requested Axis"] = axis.size
        if not sizes:
            named = [
                f"{label(p)}: ({format_axes(leaf.axes)})"
                for p, leaf in leaves
                if isinstance(leaf, NamedArray)
            ]
            listing = "; ".join(named) if named else "no NamedArrays at all"
            raise AxisNotFoundError(
                f"{op}() over axis {name!r}: no NamedArray in {what} has that axis ({listing}). "
                f"Check the axis name, or pass Axis({name!r}, size) to map a fixed number of times."
            )
        if len(set(sizes.values())) > 1:
            listing = ", ".join(f"{p}: {s}" for p, s in sizes.items())
            raise AxisSizeError(
                f"{op}() over axis {name!r}: the axis has different sizes in {what} ({listing}). "
                "Every mapped NamedArray must agree on its size."
            )
        self.name = name
        self.size = next(iter(sizes.values()))

    def rebuild(self, arrays: list[Any]) -> Any:
        """The original tree, with each mapped NamedArray rebuilt around a per-step array."""
        leaves = list(self.leaves)
        for k, axes, array in zip(self.slots, self.inner_axes, arrays):
            leaves[k] = NamedArray(array, axes)
        return self.treedef.unflatten(leaves)


class _Outputs:
    """Splits a function's output into arrays for JAX and remembers how to rename them after."""

    def __init__(self, name: str, op: str):
        self.name = name
        self.op = op
        self.treedef: Any = None
        self.axes: list[tuple[Axis, ...] | None] = []

    def split(self, out: Any, what: str) -> list[Any]:
        leaves, treedef = jax.tree_util.tree_flatten_with_path(out, is_leaf=is_named_array)
        axes: list[tuple[Axis, ...] | None] = []
        for path, leaf in leaves:
            if isinstance(leaf, NamedArray):
                if leaf.has_axis(self.name):
                    where = f"{what} {format_path(path)}" if path else what
                    raise DuplicateAxisError(
                        f"{self.op}() over axis {self.name!r}: {where} already has "
                        f"an axis {self.name!r} (NamedArray({format_axes(leaf.axes)})), so it cannot "
                        "get the mapped axis back. Rename that axis inside the function."
                    )
                axes.append(leaf.axes)
            else:
                axes.append(None)
        self.treedef, self.axes = treedef, axes
        return [leaf.array if isinstance(leaf, NamedArray) else leaf for _, leaf in leaves]

    def join(self, arrays: list[Any], size: int) -> Any:
        """Rebuild the output tree; NamedArrays get the mapped axis first."""
        front = Axis(self.name, size)
        leaves = [
            array if axes is None else NamedArray(array, (front,) + axes)
            for array, axes in zip(arrays, self.axes)
        ]
        return self.treedef.unflatten(leaves)


def _argument_label(path: Any) -> str:
    """``args/0/w`` or ``kwargs/bias/w`` for a leaf of ``(args, kwargs)``."""
    head = "args" if path[0].idx == 0 else "kwargs"
    return format_path((head, *path[1:]))


def vmap(fn: Callable[..., Any], axis: AxisSelector) -> Callable[..., Any]:
    """Map ``fn`` over a named axis, like ``jax.vmap`` with the axis given by name.

    Every NamedArray argument (positional or keyword, anywhere in a pytree) that has ``axis`` is
    mapped over it; inside ``fn`` it is a NamedArray without that axis. Everything else (NamedArrays
    without the axis, plain arrays, Python values) is passed unchanged to every call
    (``in_axes=None``). NamedArray outputs get ``axis`` back as their first axis; plain-array
    outputs get it as dimension 0.

    Args:
        fn: The function to map.
        axis: The axis name, or an ``Axis``. With an ``Axis``, its size is checked against the
            arguments, and ``fn`` may be mapped even when no argument has the axis.

    Returns:
        The mapped function, with the same signature as ``fn``.

    Raises:
        AxisNotFoundError: (when called) if no argument has the axis (and ``axis`` is a name).
        AxisSizeError: (when called) if the axis has different sizes in different arguments.
        DuplicateAxisError: (when called) if an output NamedArray already has an axis of that name.

    Example:
        >>> import jax.numpy as jnp
        >>> from namedaxes import named, vmap
        >>> x = named(jnp.ones((2, 3)), ("batch", "embed"))
        >>> def norm(v):
        ...     assert v.axis_names == ("embed",)
        ...     return named(jnp.sqrt(jnp.sum(v.array**2)), ())
        >>> vmap(norm, "batch")(x).shape
        {'batch': 2}
    """
    if not callable(fn):
        raise NamedTypeError(f"vmap() needs a callable, got {fn!r}.")
    name = axis_name(axis)

    @functools.wraps(fn)
    def mapped(*args: Any, **kwargs: Any) -> Any:
        ins = _Mapped((args, kwargs), axis, "vmap", "the arguments", _argument_label)
        outs = _Outputs(name, "vmap")

        def body(*arrays: Any) -> list[Any]:
            a, kw = ins.rebuild(list(arrays))
            return outs.split(fn(*a, **kw), "output")

        result = jax.vmap(body, in_axes=tuple(ins.positions), out_axes=0, axis_size=ins.size)(
            *ins.arrays
        )
        return outs.join(result, ins.size)

    return mapped


def _structure(tree: Any) -> tuple[Any, list[Any]]:
    """Tree structure plus the axes of each NamedArray leaf (plain leaves: ``None``)."""
    leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=is_named_array)
    return treedef, [leaf.axes if isinstance(leaf, NamedArray) else None for leaf in leaves]


def _check_carry(init: Any, carry: Any, op: str, name: str) -> None:
    """Raise a clear error when ``fn`` returns a carry shaped differently from ``init``."""
    want, got = _structure(init), _structure(carry)
    if want == got:
        return
    paths_in = jax.tree_util.tree_flatten_with_path(init, is_leaf=is_named_array)[0]
    paths_out = jax.tree_util.tree_flatten_with_path(carry, is_leaf=is_named_array)[0]
    detail = ""
    if want[0] == got[0]:
        for (path, a), (_, b) in zip(paths_in, paths_out):
            axes_a = a.axes if isinstance(a, NamedArray) else None
            axes_b = b.axes if isinstance(b, NamedArray) else None
            if axes_a != axes_b:
                fmt = lambda ax: "a plain leaf" if ax is None else f"NamedArray({format_axes(ax)})"  # noqa: E731
                detail = f" At {format_path(path)}: init is {fmt(axes_a)}, fn returned {fmt(axes_b)}."
                break
    else:
        detail = f" init has structure {want[0]}, fn returned {got[0]}."
    raise NamedTypeError(
        f"{op}() over axis {name!r}: fn must return a carry with the same structure and axes as "
        f"init.{detail} Rearrange or rename the carry inside fn to match."
    )


def scan(
    fn: Callable[[Any, Any], tuple[Any, Any]],
    axis: AxisSelector,
    *,
    reverse: bool = False,
    unroll: int | bool = 1,
) -> Callable[[Any, Any], tuple[Any, Any]]:
    """Scan ``fn`` along a named axis, like ``jax.lax.scan`` with the axis given by name.

    The returned function takes ``(init, xs)`` and returns ``(carry, ys)``. Every NamedArray in
    ``xs`` that has ``axis`` is scanned over it (``fn`` sees it without the axis); everything else in
    ``xs`` is passed unchanged to every step. ``fn(carry, x)`` returns ``(carry, y)``; the carry must
    keep the structure and axes of ``init``. NamedArrays in ``ys`` get ``axis`` back as their first
    axis; plain arrays get it as dimension 0. A scanned axis sharded over Explicit mesh axes is
    replicated first (``jax.lax.scan`` needs that; XLA does the same on Auto meshes).

    Args:
        fn: ``(carry, x) -> (carry, y)``.
        axis: The axis to scan over, by name or as an ``Axis`` (needed when no NamedArray in ``xs``
            has it, which then runs ``axis.size`` steps).
        reverse: Scan from the last index to the first (``ys`` stay in index order).
        unroll: Passed to ``jax.lax.scan``.

    Returns:
        The scanning function ``(init, xs) -> (carry, ys)``.

    Raises:
        AxisNotFoundError: (when called) if no NamedArray in ``xs`` has the axis.
        AxisSizeError: (when called) if the axis has different sizes in different leaves.
        NamedTypeError: (when called) if ``fn`` does not return a ``(carry, y)`` pair, or its carry
            differs in structure or axes from ``init``.

    Example:
        >>> import jax.numpy as jnp
        >>> from namedaxes import named, scan
        >>> xs = named(jnp.arange(6.0).reshape(3, 2), ("time", "feat"))
        >>> def step(c, x):
        ...     c = named(c.array + x.array, ("feat",))
        ...     return c, c
        >>> carry, ys = scan(step, "time")(named(jnp.zeros(2), ("feat",)), xs)
        >>> carry.array, ys.shape
        (Array([6., 9.], dtype=float32), {'time': 3, 'feat': 2})
    """
    return _scan(fn, axis, reverse, unroll, "scan")


def _scan(
    fn: Callable[[Any, Any], tuple[Any, Any]],
    axis: AxisSelector,
    reverse: bool,
    unroll: int | bool,
    op: str,
) -> Callable[[Any, Any], tuple[Any, Any]]:
    if not callable(fn):
        raise NamedTypeError(f"{op}() needs a callable, got {fn!r}.")
    name = axis_name(axis)

    def scanned(init: Any, xs: Any) -> tuple[Any, Any]:
        ins = _Mapped(xs, axis, op, "xs", lambda path: format_path(("xs", *path)))
        outs = _Outputs(name, op)
        # lax.scan walks the leading dimension, which must be replicated on Explicit meshes (XLA
        # gathers it on Auto meshes anyway).
        leading = [
            jnp.moveaxis(unshard_dims(a, [i]), i, 0) if i else unshard_dims(a, [0])
            for a, i in zip(ins.arrays, ins.positions)
        ]

        def body(carry: Any, arrays: list[Any]) -> tuple[Any, list[Any]]:
            out = fn(carry, ins.rebuild(arrays))
            if not isinstance(out, tuple) or len(out) != 2:
                raise NamedTypeError(
                    f"scan() over axis {name!r}: fn must return a (carry, y) pair, got "
                    f"{type(out).__name__}{'' if not isinstance(out, tuple) else f' of length {len(out)}'}. "
                    "Return (carry, None) when there is nothing to stack, or use fold()."
                )
            new_carry, y = out
            _check_carry(carry, new_carry, op, name)
            return new_carry, outs.split(y, "y")

        carry, ys = jax.lax.scan(
            body, init, leading, length=ins.size, reverse=reverse, unroll=unroll
        )
        return carry, outs.join(ys, ins.size)

    return scanned


def fold(
    fn: Callable[[Any, Any], Any],
    axis: AxisSelector,
    *,
    reverse: bool = False,
    unroll: int | bool = 1,
) -> Callable[[Any, Any], Any]:
    """Fold ``fn`` along a named axis: ``scan`` without per-step outputs.

    The returned function takes ``(init, xs)`` and returns the final carry. It is the usual way to
    apply a stack of layers: an ``eqx.Module`` whose weights have a leading ``layer`` axis, folded
    over ``layer`` with the activations as carry.

    Args:
        fn: ``(carry, x) -> carry``; the carry must keep the structure and axes of ``init``.
        axis: The axis to fold over, by name or as an ``Axis``.
        reverse: Fold from the last index to the first.
        unroll: Passed to ``jax.lax.scan``.

    Returns:
        The folding function ``(init, xs) -> carry``.

    Raises:
        AxisNotFoundError: (when called) if no NamedArray in ``xs`` has the axis.
        AxisSizeError: (when called) if the axis has different sizes in different leaves.
        NamedTypeError: (when called) if the returned carry differs in structure or axes from ``init``.

    Example:
        >>> import jax.numpy as jnp
        >>> from namedaxes import named, fold
        >>> ws = named(jnp.full((3, 2), 2.0), ("layer", "feat"))
        >>> h = named(jnp.ones(2), ("feat",))
        >>> fold(lambda h, w: named(h.array * w.array, ("feat",)), "layer")(h, ws).array
        Array([8., 8.], dtype=float32)
    """
    if not callable(fn):
        raise NamedTypeError(f"fold() needs a callable, got {fn!r}.")

    def step(carry: Any, x: Any) -> tuple[Any, None]:
        return fn(carry, x), None

    inner = _scan(step, axis, reverse, unroll, "fold")

    def folded(init: Any, xs: Any) -> Any:
        return inner(init, xs)[0]

    return folded
