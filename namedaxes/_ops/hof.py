"""Higher-order functions over a named axis: ``vmap``, ``scan`` and ``fold``.

Each one finds the named axis in every NamedArray of its arguments, hands JAX the underlying arrays
with the right positional axis, rebuilds NamedArrays without the axis inside the user's function,
and gives the axis back (as the first axis) to the NamedArrays it returns. Leaves without the axis
(NamedArrays that lack it, plain arrays unless asked for, Python values, callables) are passed
unchanged to every call; leaves of the outputs that are not arrays (a Python bool, an ``Axis``, a
function) come back unchanged, as ``eqx.filter_vmap`` does.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._array import NamedArray, is_named_array
from .._axis import Axis, AxisSelector, axis_name, check_unique, index_of
from .._errors import (
    AxisNotFoundError,
    AxisSizeError,
    DuplicateAxisError,
    NamedTypeError,
    format_axes,
    format_path,
)
from .._logical._resolve import resolve
from .._spec import entry_axes
from ._carry import (
    CarryMoved,
    check_carry_placement,
    explicit_in_play,
    match_carry,
    place_carry,
)
from ._common import agree_on_dim, mapping_in_force, unshard_dims

__all__ = ["check_remat", "fold", "scan", "vmap"]


def _is_array(x: Any) -> bool:
    """A JAX or NumPy array (what JAX can map or stack); Python values are not."""
    return isinstance(x, (jax.Array, np.ndarray, np.generic))


class _Mapped:
    """The leaves of a pytree that carry the mapped axis, split out for JAX.

    NamedArrays are mapped over the named axis wherever it is. With ``plain=True``, plain arrays
    with dimensions are mapped over their leading dimension too.
    """

    def __init__(
        self,
        tree: Any,
        axis: AxisSelector,
        caller: str,
        what: str,
        label: Callable[[Any], str],
        plain: bool = False,
    ):
        name = axis_name(axis)
        leaves, self.treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_named_array)
        self.leaves = [leaf for _, leaf in leaves]
        self.slots: list[int] = []  # which leaves are mapped
        self.inner_axes: list[tuple[Axis, ...] | None] = []  # None: a plain array
        self.positions: list[int] = []
        self.arrays: list[Any] = []
        self.labels: list[str] = []  # how messages name each mapped leaf
        sizes: dict[str, int] = {}
        for k, (path, leaf) in enumerate(leaves):
            if not isinstance(leaf, NamedArray):
                if plain and _is_array(leaf) and np.ndim(leaf) > 0:
                    self.slots.append(k)
                    self.positions.append(0)
                    self.inner_axes.append(None)
                    self.arrays.append(leaf)
                    self.labels.append(label(path))
                    sizes[f"{label(path)} (leading dimension)"] = np.shape(leaf)[0]
                continue
            i = index_of(leaf.axes, name)
            if i is None:
                continue
            self.slots.append(k)
            self.positions.append(i)
            self.inner_axes.append(leaf.axes[:i] + leaf.axes[i + 1 :])
            self.arrays.append(leaf.array)
            self.labels.append(label(path))
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
                f"{caller}() over axis {name!r}: no NamedArray in {what} has that axis ({listing}). "
                f"Check the axis name, or pass Axis({name!r}, size) to map a fixed number of times."
            )
        if len(set(sizes.values())) > 1:
            listing = ", ".join(f"{p}: {s}" for p, s in sizes.items())
            hint = (
                " Plain arrays are mapped over their leading dimension; pass one that must stay "
                "whole as an extra argument, or name its axes."
                if plain
                else ""
            )
            raise AxisSizeError(
                f"{caller}() over axis {name!r}: the axis has different sizes in {what} ({listing}). "
                f"Every mapped array must agree on its size.{hint}"
            )
        self.name = name
        self.size = next(iter(sizes.values()))

    def rebuild(self, arrays: list[Any]) -> Any:
        """The original tree, with each mapped NamedArray rebuilt around a per-step array."""
        leaves = list(self.leaves)
        for k, axes, array in zip(self.slots, self.inner_axes, arrays):
            leaves[k] = array if axes is None else NamedArray(array, axes)
        return self.treedef.unflatten(leaves)


class _Outputs:
    """Splits a function's output into arrays for JAX and remembers how to rename them after."""

    def __init__(self, name: str, caller: str):
        self.name = name
        self.op = caller
        self.treedef: Any = None
        self.axes: list[tuple[Axis, ...] | None] = []
        self.static: dict[int, Any] = {}  # leaves that are not arrays, returned as they are

    def split(self, out: Any, what: str) -> list[Any]:
        leaves, treedef = jax.tree_util.tree_flatten_with_path(out, is_leaf=is_named_array)
        axes: list[tuple[Axis, ...] | None] = []
        self.static = {
            k: leaf
            for k, (_, leaf) in enumerate(leaves)
            if not isinstance(leaf, NamedArray) and not _is_array(leaf)
        }
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
        return [
            None if k in self.static else leaf.array if isinstance(leaf, NamedArray) else leaf
            for k, (_, leaf) in enumerate(leaves)
        ]

    def join(self, arrays: list[Any], size: int) -> Any:
        """Rebuild the output tree; NamedArrays get the mapped axis first."""
        front = Axis(self.name, size)
        leaves = [
            self.static[k]
            if k in self.static
            else array
            if axes is None
            else NamedArray(array, (front,) + axes)
            for k, (array, axes) in enumerate(zip(arrays, self.axes))
        ]
        return self.treedef.unflatten(leaves)


def _argument_label(path: Any) -> str:
    """``args/0/w`` or ``kwargs/bias/w`` for a leaf of ``(args, kwargs)``."""
    head = "args" if path[0].idx == 0 else "kwargs"
    return format_path((head, *path[1:]))


def _spmd_axis_name(axis: Axis) -> Any:
    """The Auto mesh axes the mapping in force puts ``axis`` on, for ``jax.vmap(spmd_axis_name=)``.

    With it, sharding constraints inside the mapped function keep the mapped dimension sharded
    instead of gathering it. On Explicit mesh axes JAX reads the mapped dimension's sharding from
    the arguments' types (and refuses a different ``spmd_axis_name``), so only Auto axes count.
    """
    found = mapping_in_force()
    if found is None:
        return None
    rules, mesh = found
    (entry,) = resolve((axis,), rules, mesh, unsatisfied="replicate")
    auto = {n for n, t in zip(mesh.axis_names, mesh.axis_types) if t == jax.sharding.AxisType.Auto}
    names = tuple(m for m in entry_axes(entry) if m in auto)
    return names or None


def _axes_arg(axis: Any, caller: str) -> tuple[AxisSelector, ...]:
    """``axis`` as a tuple of selectors (one, or several for ``vmap``)."""
    axes = (axis,) if isinstance(axis, (str, Axis)) else axis
    if (
        not isinstance(axes, Sequence)
        or not axes
        or not all(isinstance(a, (str, Axis)) for a in axes)
    ):
        raise NamedTypeError(
            f"{caller}() needs an axis name, an Axis, or a non-empty sequence of them, got {axis!r}."
        )
    check_unique(axes)
    return tuple(axes)


def vmap(
    fn: Callable[..., Any],
    axis: AxisSelector | Sequence[AxisSelector],
    *,
    map_plain: bool = False,
) -> Callable[..., Any]:
    """Map ``fn`` over a named axis (or several), like ``jax.vmap`` with the axis given by name.

    Every NamedArray argument (positional or keyword, anywhere in a pytree) that has ``axis`` is
    mapped over it; inside ``fn`` it is a NamedArray without that axis. Everything else (NamedArrays
    without the axis, plain arrays unless ``map_plain``, Python values) is passed unchanged to every
    call (``in_axes=None``). NamedArray outputs get ``axis`` back as their first axis; plain-array
    outputs get it as dimension 0; output leaves that are not arrays (a bool, an ``Axis``, a
    function) come back unchanged, as with ``eqx.filter_vmap``.

    Several axes (``("batch", "head")``) map over each in turn, the first outermost, so outputs get
    them in front in that order. When the mapping in force places ``axis`` on Auto mesh axes, they
    are passed as ``spmd_axis_name``, so sharding constraints inside ``fn`` keep the mapped
    dimension sharded (on Explicit mesh axes JAX takes them from the arguments' types). There the
    mapped arguments must shard ``axis`` alike; where they differ (a batch-sharded activation with a
    replicated per-batch array) they take the mapping in force's mesh axes, else the one in use.

    Args:
        fn: The function to map.
        axis: The axis name, an ``Axis``, or a sequence of them. With an ``Axis``, its size is
            checked against the arguments, and ``fn`` may be mapped even when no argument has the
            axis.
        map_plain: Also map plain (unnamed) arrays with dimensions over their leading dimension,
            which must have the axis' size: a split key array ``jax.random.split(key, n)`` then
            gives one key per call (the idiom for initialising stacked layers).

    Returns:
        The mapped function, with the same signature as ``fn``.

    Raises:
        NamedTypeError: if ``fn`` is not callable or ``axis`` is not an axis or axes.
        DuplicateAxisError: if ``axis`` names an axis twice; (when called) if an output NamedArray
            already has an axis of that name.
        AxisNotFoundError: (when called) if no argument has the axis (and ``axis`` is a name).
        AxisSizeError: (when called) if the axis has different sizes in different arguments.
        ShardingError: (when called, Explicit meshes) if arguments shard the axis over different
            mesh axes and no mapping is in force.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from namedaxes import Axis, named, vmap
        >>> x = named(jnp.ones((2, 3)), ("batch", "embed"))
        >>> def norm(v):
        ...     assert v.axis_names == ("embed",)
        ...     return named(jnp.sqrt(jnp.sum(v.array**2)), ())
        >>> vmap(norm, "batch")(x).shape
        {'batch': 2}
        >>> keys = jax.random.split(jax.random.key(0), 4)
        >>> init = lambda key: named(jax.random.normal(key, (3,)), "embed")
        >>> vmap(init, Axis("layer", 4), map_plain=True)(keys).shape
        {'layer': 4, 'embed': 3}
    """
    if not callable(fn):
        raise NamedTypeError(f"vmap() needs a callable, got {fn!r}.")
    axes = _axes_arg(axis, "vmap")
    if len(axes) > 1:  # the first axis outermost, so it comes first in the outputs
        inner = fn
        for a in reversed(axes):
            inner = vmap(inner, a, map_plain=map_plain)
        return functools.wraps(fn)(inner)
    (axis,) = axes
    name = axis_name(axis)

    @functools.wraps(fn)
    def mapped(*args: Any, **kwargs: Any) -> Any:
        ins = _Mapped((args, kwargs), axis, "vmap", "the arguments", _argument_label, map_plain)
        outs = _Outputs(name, "vmap")

        def body(*arrays: Any) -> list[Any]:
            a, kw = ins.rebuild(list(arrays))
            return outs.split(fn(*a, **kw), "output")

        front = Axis(name, ins.size)
        # JAX maps only arrays that shard the mapped dimension alike (Explicit meshes).
        arrays = agree_on_dim("vmap", front, ins.arrays, ins.positions, ins.labels)
        result = jax.vmap(
            body,
            in_axes=tuple(ins.positions),
            out_axes=0,
            axis_size=ins.size,
            spmd_axis_name=_spmd_axis_name(front),
        )(*arrays)
        return outs.join(result, ins.size)

    return mapped


def _is_policy(f: Any) -> bool:
    """Policies take ``(primitive, *args, **params)``; the other public names build policies."""
    if not callable(f):
        return False
    try:
        params = inspect.signature(f).parameters.values()
    except (TypeError, ValueError):  # no signature (a builtin): not a policy JAX could call
        return False
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def _builder_hint(name: str, builder: Any, arg: str) -> str:
    """The fix for a ``jax.checkpoint_policies`` name that builds a policy rather than being one
    (empty for anything else)."""
    policies = jax.checkpoint_policies
    if not name or name.startswith("_") or getattr(policies, name, None) is not builder:
        return ""
    if builder is None or _is_policy(builder):
        return ""
    return (
        f" jax.checkpoint_policies.{name} builds a policy: call it and pass the result, e.g. "
        f"{arg}=jax.checkpoint_policies.{name}(...)."
    )


def _policy_names() -> str:
    policies = jax.checkpoint_policies
    names = sorted(
        n for n in dir(policies) if not n.startswith("_") and _is_policy(getattr(policies, n))
    )
    return ", ".join(repr(n) for n in names)


def check_remat(remat: Any, caller: str, arg: str, also: str) -> None:
    """Raise ``NamedTypeError`` unless ``remat`` is a bool, a policy name or a policy.

    For callers that take ``remat`` under another argument name ``arg`` and also take the names
    ``also`` lists (both are put in the messages).
    """
    _checkpoint_policy(remat, caller, arg, also)


def _checkpoint_policy(
    remat: Any, caller: str, arg: str = "remat", also: str = ""
) -> tuple[bool, Any]:
    """``(checkpoint?, policy)`` from ``remat=``: a bool, a policy name, or a policy."""
    if remat is None or remat is False:
        return False, None
    if remat is True:
        return True, None
    if isinstance(remat, str):
        policies = jax.checkpoint_policies
        policy = getattr(policies, remat, None) if not remat.startswith("_") else None
        if _is_policy(policy):
            return True, policy
        raise NamedTypeError(
            f"{caller}(): {arg}={remat!r} is not {also}a jax.checkpoint_policies policy."
            f"{_builder_hint(remat, policy, arg)} Policies by name: {_policy_names()}."
        )
    if _is_policy(remat):
        return True, remat
    if callable(remat):
        # jax.checkpoint calls a policy as policy(primitive, *args, **params) inside autodiff: a
        # builder or any other callable would fail there, far from here.
        hint = _builder_hint(getattr(remat, "__name__", ""), remat, arg)
        raise NamedTypeError(
            f"{caller}(): {arg}={remat!r} is not a checkpoint policy (a callable taking "
            f"(primitive, *args, **params) and returning whether to save its output).{hint} Pass "
            f"{also}a jax.checkpoint_policies policy or its name: {_policy_names()}."
        )
    raise NamedTypeError(
        f"{caller}(): {arg} must be a bool, {also}a jax.checkpoint_policies name such as "
        f"'nothing_saveable', or a policy callable, got {remat!r} ({type(remat).__name__})."
    )


def scan(
    fn: Callable[..., tuple[Any, Any]],
    axis: AxisSelector,
    *,
    reverse: bool = False,
    unroll: int | bool = 1,
    remat: bool | str | Callable[..., bool] = False,
) -> Callable[..., tuple[Any, Any]]:
    """Scan ``fn`` along a named axis, like ``jax.lax.scan`` with the axis given by name.

    The returned function takes ``(init, xs, *args, **kwargs)`` and returns ``(carry, ys)``. Every
    NamedArray in ``xs`` that has ``axis`` is scanned over it (``fn`` sees it without the axis);
    when ``axis`` is an ``Axis``, plain (unnamed) arrays in ``xs`` are scanned over their leading
    dimension too. Everything else in ``xs`` is passed unchanged to every step, and so are the extra
    ``args`` and ``kwargs`` (never scanned). ``fn(carry, x, *args, **kwargs)`` returns
    ``(carry, y)``; the carry must keep the structure, axes and dtypes of ``init`` (a NamedArray
    returned with its axes in another order is transposed back to ``init``'s). NamedArrays in ``ys``
    get ``axis`` back as their first axis, plain arrays get it as dimension 0, and leaves that are
    not arrays come back unchanged. A scanned axis sharded over Explicit mesh axes is replicated
    first (``jax.lax.scan`` needs that; XLA does the same on Auto meshes), and on Explicit meshes
    ``init`` is placed where ``fn`` puts the carry (found by tracing one step abstractly).

    Args:
        fn: ``(carry, x, *args, **kwargs) -> (carry, y)``.
        axis: The axis to scan over, by name or as an ``Axis`` (needed when no NamedArray in ``xs``
            has it, which then runs ``axis.size`` steps, and to scan plain arrays).
        reverse: Scan from the last index to the first (``ys`` stay in index order).
        unroll: Passed to ``jax.lax.scan``.
        remat: Gradient checkpointing of each step (``jax.checkpoint``): ``True``, the name of a
            ``jax.checkpoint_policies`` policy (``"nothing_saveable"``, ``"dots_saveable"``, ...),
            or a policy callable. ``False`` (the default) saves what autodiff saves.

    Returns:
        The scanning function ``(init, xs, *args, **kwargs) -> (carry, ys)``.

    Raises:
        NamedTypeError: if ``remat`` is not a bool, a policy name or a policy; (when called) if
            ``fn`` does not return a ``(carry, y)`` pair, or its carry differs in structure, axis
            names or sizes, or dtypes from ``init``.
        AxisNotFoundError: (when called) if nothing in ``xs`` has the axis.
        AxisSizeError: (when called) if the axis has different sizes in different leaves.
        ShardingError: (when called, on Explicit meshes) if ``fn`` moves the carry to other mesh
            axes at every step, so that it has no one sharding to keep.

    Example:
        >>> import jax.numpy as jnp
        >>> from namedaxes import Axis, named, scan
        >>> xs = named(jnp.arange(6.0).reshape(3, 2), ("time", "feat"))
        >>> def step(c, x, scale):
        ...     c = named(c.array + scale * x.array, ("feat",))
        ...     return c, c
        >>> carry, ys = scan(step, "time")(named(jnp.zeros(2), ("feat",)), xs, 1.0)
        >>> carry.array, ys.shape
        (Array([6., 9.], dtype=float32), {'time': 3, 'feat': 2})
        >>> carry, ys = scan(lambda c, x: (c + x, c), Axis("step", 3))(jnp.zeros(()), jnp.arange(3.0))
        >>> carry, ys  # a plain xs is scanned over its leading dimension when axis is an Axis
        (Array(3., dtype=float32), Array([0., 0., 1.], dtype=float32))
    """
    return _scan(fn, axis, reverse, unroll, remat, "scan")


def _scan(
    fn: Callable[..., tuple[Any, Any]],
    axis: AxisSelector,
    reverse: bool,
    unroll: int | bool,
    remat: Any,
    caller: str,
) -> Callable[..., tuple[Any, Any]]:
    if not callable(fn):
        raise NamedTypeError(f"{caller}() needs a callable, got {fn!r}.")
    if not isinstance(axis, (str, Axis)):
        raise NamedTypeError(f"{caller}() needs an axis name or an Axis, got {axis!r}.")
    name = axis_name(axis)
    checkpoint, policy = _checkpoint_policy(remat, caller)
    plain = isinstance(axis, Axis)

    def scanned(init: Any, xs: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        ins = _Mapped(xs, axis, caller, "xs", lambda path: format_path(("xs", *path)), plain)
        outs = _Outputs(name, caller)
        # lax.scan walks the leading dimension, which must be replicated on Explicit meshes (XLA
        # gathers it on Auto meshes anyway).
        leading = [
            jnp.moveaxis(unshard_dims(a, [i]), i, 0) if i else unshard_dims(a, [0])
            for a, i in zip(ins.arrays, ins.positions)
        ]

        def body(carry: Any, arrays: list[Any]) -> tuple[Any, list[Any]]:
            out = fn(carry, ins.rebuild(arrays), *args, **kwargs)
            if not isinstance(out, tuple) or len(out) != 2:
                raise NamedTypeError(
                    f"scan() over axis {name!r}: fn must return a (carry, y) pair, got "
                    f"{type(out).__name__}{'' if not isinstance(out, tuple) else f' of length {len(out)}'}. "
                    "Return (carry, None) when there is nothing to stack, or use fold()."
                )
            new_carry, y = out
            new_carry = match_carry(carry, new_carry, caller, name)
            if explicit:
                check_carry_placement(carry, new_carry, caller, name, first=first)
            return new_carry, outs.split(y, "y")

        def run(init: Any) -> tuple[Any, Any]:
            step = body
            if checkpoint:
                # prevent_cse=False: inside scan, CSE cannot undo the recomputation (JAX's advice).
                step = jax.checkpoint(body, policy=policy, prevent_cse=False)
            return jax.lax.scan(
                step, init, leading, length=ins.size, reverse=reverse, unroll=unroll
            )

        # On Explicit meshes the carry's sharding is in its type: if a step returns the carry
        # placed elsewhere, init is placed there and the scan traced again (once); after that,
        # every step must keep it there.
        explicit = explicit_in_play((init, leading, args, kwargs))
        first = explicit
        try:
            carry, ys = run(init)
        except CarryMoved as moved:
            first = False
            carry, ys = run(place_carry(init, moved.shardings))
        return carry, outs.join(ys, ins.size)

    return scanned


def fold(
    fn: Callable[..., Any],
    axis: AxisSelector,
    *,
    reverse: bool = False,
    unroll: int | bool = 1,
    remat: bool | str | Callable[..., bool] = False,
) -> Callable[..., Any]:
    """Fold ``fn`` along a named axis: ``scan`` without per-step outputs.

    The returned function takes ``(init, xs, *args, **kwargs)`` and returns the final carry. It is
    the usual way to apply a stack of layers: an ``eqx.Module`` whose weights have a leading
    ``layer`` axis, folded over ``layer`` with the activations as carry; ``args`` and ``kwargs``
    (a mask, a flag) reach every step unchanged. ``xs`` is scanned as in :func:`scan` (plain arrays
    over their leading dimension when ``axis`` is an ``Axis``).

    Args:
        fn: ``(carry, x, *args, **kwargs) -> carry``; the carry must keep the structure, axes and
            dtypes of ``init`` (axes in another order are transposed back, as for :func:`scan`).
        axis: The axis to fold over, by name or as an ``Axis``.
        reverse: Fold from the last index to the first.
        unroll: Passed to ``jax.lax.scan``.
        remat: Gradient checkpointing of each step, as for :func:`scan` (``True``, a
            ``jax.checkpoint_policies`` name, or a policy).

    Returns:
        The folding function ``(init, xs, *args, **kwargs) -> carry``.

    Raises:
        NamedTypeError: if ``remat`` is not a bool, a policy name or a policy; (when called) if the
            returned carry differs in structure, axis names or sizes, or dtypes from ``init``.
        AxisNotFoundError: (when called) if nothing in ``xs`` has the axis.
        AxisSizeError: (when called) if the axis has different sizes in different leaves.
        ShardingError: (when called) as for :func:`scan`, if ``fn`` keeps moving the carry.

    Example:
        >>> import jax.numpy as jnp
        >>> from namedaxes import named, fold
        >>> ws = named(jnp.full((3, 2), 2.0), ("layer", "feat"))
        >>> h = named(jnp.ones(2), ("feat",))
        >>> fold(lambda h, w, b: named(h.array * w.array + b, ("feat",)), "layer")(h, ws, 1.0).array
        Array([15., 15.], dtype=float32)
    """
    if not callable(fn):
        raise NamedTypeError(f"fold() needs a callable, got {fn!r}.")

    def step(carry: Any, x: Any, *args: Any, **kwargs: Any) -> tuple[Any, None]:
        return fn(carry, x, *args, **kwargs), None

    inner = _scan(step, axis, reverse, unroll, remat, "fold")

    def folded(init: Any, xs: Any, *args: Any, **kwargs: Any) -> Any:
        return inner(init, xs, *args, **kwargs)[0]

    return folded
