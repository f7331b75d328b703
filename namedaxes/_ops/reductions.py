"""Reductions over named axes (``sum``, ``mean``, ..., ``logsumexp``), ``softmax`` and cumulative ops.

A reduction takes ``axis`` as one name/``Axis``, a sequence of them, or ``None`` for every axis;
the result keeps the remaining axes in their order. ``where=`` masks are NamedArrays over some of
the input's axes (broadcast by name) or scalars. The reductions are also NamedArray methods
(``x.sum("batch")``, declared in ``namedaxes._array``).

Refused with a typed error rather than computed: an empty selection (``axis=()``; reducing over no
axes returns ``x`` unchanged, and ``softmax`` returns ones, which is almost always a bug), axes given
by position (``sum(x, 0)``), masks that are not boolean, and ``max``/``min`` (without ``initial=``)
or ``argmax``/``argmin`` over an axis of size 0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from .._array import AxisSelection, NamedArray
from .._axis import Axis, AxisSelector, find_axis
from .._errors import AxisError, NamedTypeError, format_axes, format_names
from ._checks import check_mask, check_nonempty, reject_positional, selected_positions
from ._common import agree_by_name, expect_named, scalar_keywords, unshard_dims
from .elementwise import broadcast_into, canonical_dtype

__all__ = [
    "all",
    "any",
    "argmax",
    "argmin",
    "cumprod",
    "cumsum",
    "log_softmax",
    "logsumexp",
    "max",
    "mean",
    "min",
    "prod",
    "softmax",
    "std",
    "sum",
    "var",
]


#: Reductions without an identity: over a size-0 axis they need ``initial=``.
_NO_IDENTITY = (jnp.max, jnp.min, jnp.nanmax, jnp.nanmin)


def _mask(caller: str, x: NamedArray, where: Any) -> tuple[NamedArray, Any]:
    """``x`` and its ``where=`` mask laid out against it, the mask checked to be boolean.

    On Explicit meshes the mask meets ``x`` elementwise, so their shardings are reconciled as
    elementwise operands' are (``agree_by_name``: when they conflict, both are resharded by the
    mapping in force, else a ``ShardingError`` says so). Otherwise ``x`` comes back unchanged.
    """
    check_mask(caller, where)
    if isinstance(where, NamedArray):
        x, where = agree_by_name(caller, [x, where], ["x", "where="])
    return x, broadcast_into(where, x.axes, caller=caller, what="where=")


def _reduce(
    caller: str, fn: Callable[..., Any], x: Any, axis: AxisSelection, where: Any, **kwargs: Any
) -> NamedArray:
    x = expect_named(x, caller)
    # Names only, never positions, and never an empty selection (which would return x unchanged).
    pos = selected_positions(caller, x, axis)
    combine = {"max": "maximum", "min": "minimum"}.get(caller.removeprefix("nan"))
    if combine:  # initial= is one more value in every row: combined by name after reducing
        kwargs = scalar_keywords(
            caller, kwargs, f"combine by name after reducing: na.{combine}(na.{caller}(x, axis), v)"
        )
    else:
        kwargs = scalar_keywords(caller, kwargs)
    if fn in _NO_IDENTITY and kwargs.get("initial") is None:
        sign = "-" if "max" in caller else ""
        if where is not None:  # a row whose elements are all masked out has no result either
            raise AxisError(
                f"{caller}() with where= needs initial=, the result where every element is masked "
                f"out (e.g. initial={sign}jnp.inf)."
            )
        check_nonempty(
            caller,
            x,
            pos,
            f"Pass initial=, the result for an empty axis (e.g. initial={sign}jnp.inf).",
        )
    x, mask = _mask(caller, x, where)
    if mask is not None:
        kwargs["where"] = mask
    out = fn(x.array, axis=pos, **kwargs)
    return NamedArray(out, tuple(a for i, a in enumerate(x.axes) if i not in pos))


def sum(  # noqa: A001 - mirrors jnp.sum
    x: NamedArray, axis: AxisSelection = None, *, where: Any = None, dtype: Any = None
) -> NamedArray:
    """Sum over ``axis`` (one name, several, or ``None`` for all).

    Args:
        x: A NamedArray.
        axis: The axis or axes to sum over; ``None`` sums everything.
        where: Only elements where this mask is true count: a NamedArray over some of ``x``'s
            axes (broadcast by name) or a scalar.
        dtype: Accumulation and result type.

    Returns:
        A NamedArray with the remaining axes, in order.

    Raises:
        AxisNotFoundError: if an axis is not in ``x`` (the available axes are listed).
        AxisError: if ``where`` has an axis that ``x`` lacks, or ``axis`` is ``()`` (use ``None``
            for every axis).
        NamedTypeError: if an axis is given by position (``0``), or ``where`` is not boolean.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> x = na.named(jnp.ones((2, 3)), ("batch", "embed"))
        >>> na.sum(x, "embed")
        NamedArray(float32, batch=2)
        >>> x.sum().item()
        6.0
    """
    return _reduce("sum", jnp.sum, x, axis, where, dtype=canonical_dtype(dtype, caller="sum"))


def prod(
    x: NamedArray, axis: AxisSelection = None, *, where: Any = None, dtype: Any = None
) -> NamedArray:
    """Product over ``axis``; arguments as for :func:`sum`.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> na.prod(na.named(jnp.full((2, 3), 2.0), ("batch", "embed")), "embed").array
        Array([8., 8.], dtype=float32)
    """
    return _reduce("prod", jnp.prod, x, axis, where, dtype=canonical_dtype(dtype, caller="prod"))


def mean(
    x: NamedArray, axis: AxisSelection = None, *, where: Any = None, dtype: Any = None
) -> NamedArray:
    """Mean over ``axis``; arguments as for :func:`sum` (masked-out elements do not count).

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> x = na.named(jnp.array([[1.0, 2.0, 3.0]]), ("batch", "embed"))
        >>> na.mean(x, "embed", where=x > 1.0).array
        Array([2.5], dtype=float32)
    """
    return _reduce("mean", jnp.mean, x, axis, where, dtype=canonical_dtype(dtype, caller="mean"))


def max(  # noqa: A001 - mirrors jnp.max
    x: NamedArray, axis: AxisSelection = None, *, where: Any = None, initial: Any = None
) -> NamedArray:
    """Maximum over ``axis``; with ``where=`` an ``initial`` value is required (as in ``jnp.max``),
    and so it is over an axis of size 0 (else ``AxisError``).

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> x = na.named(jnp.array([[1.0, 5.0], [4.0, 2.0]]), ("batch", "embed"))
        >>> x.max("batch").array
        Array([4., 5.], dtype=float32)
    """
    return _reduce("max", jnp.max, x, axis, where, initial=initial)


def min(  # noqa: A001 - mirrors jnp.min
    x: NamedArray, axis: AxisSelection = None, *, where: Any = None, initial: Any = None
) -> NamedArray:
    """Minimum over ``axis``; with ``where=`` an ``initial`` value is required (as in ``jnp.min``).

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> x = na.named(jnp.array([[1.0, 5.0], [4.0, 2.0]]), ("batch", "embed"))
        >>> x.min("embed").array
        Array([1., 2.], dtype=float32)
    """
    return _reduce("min", jnp.min, x, axis, where, initial=initial)


def var(
    x: NamedArray,
    axis: AxisSelection = None,
    *,
    where: Any = None,
    ddof: int = 0,
    dtype: Any = None,
) -> NamedArray:
    """Variance over ``axis``, dividing by ``N - ddof``; other arguments as for :func:`sum`.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> x = na.named(jnp.array([1.0, 2.0, 3.0, 4.0]), "embed")
        >>> na.var(x, "embed", ddof=1).item()
        1.6666666...
    """
    return _reduce(
        "var", jnp.var, x, axis, where, ddof=ddof, dtype=canonical_dtype(dtype, caller="var")
    )


def std(
    x: NamedArray,
    axis: AxisSelection = None,
    *,
    where: Any = None,
    ddof: int = 0,
    dtype: Any = None,
) -> NamedArray:
    """Standard deviation over ``axis``, dividing by ``N - ddof``; as for :func:`var`.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> x = na.named(jnp.array([[1.0, 3.0]]), ("batch", "embed"))
        >>> x.std("embed").array
        Array([1.], dtype=float32)
    """
    return _reduce(
        "std", jnp.std, x, axis, where, ddof=ddof, dtype=canonical_dtype(dtype, caller="std")
    )


def any(x: NamedArray, axis: AxisSelection = None, *, where: Any = None) -> NamedArray:  # noqa: A001
    """Whether any element along ``axis`` is true; arguments as for :func:`sum`.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> x = na.named(jnp.array([[True, False], [False, False]]), ("batch", "embed"))
        >>> na.any(x, "embed").array
        Array([ True, False], dtype=bool)
    """
    return _reduce("any", jnp.any, x, axis, where)


def all(x: NamedArray, axis: AxisSelection = None, *, where: Any = None) -> NamedArray:  # noqa: A001
    """Whether every element along ``axis`` is true; arguments as for :func:`sum`.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> x = na.named(jnp.array([[True, True], [True, False]]), ("batch", "embed"))
        >>> na.all(x, "embed").array
        Array([ True, False], dtype=bool)
    """
    return _reduce("all", jnp.all, x, axis, where)


def logsumexp(x: NamedArray, axis: AxisSelection = None, *, where: Any = None) -> NamedArray:
    """``log(sum(exp(x)))`` over ``axis``, computed stably; arguments as for :func:`sum`.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> x = na.named(jnp.zeros((2, 4)), ("batch", "vocab"))
        >>> na.logsumexp(x, "vocab").array
        Array([1.3862944, 1.3862944], dtype=float32)
    """
    return _reduce("logsumexp", jax.nn.logsumexp, x, axis, where)


def _arg_reduce(
    caller: str, fn: Callable[..., Any], x: Any, axis: AxisSelector | None
) -> NamedArray:
    x = expect_named(x, caller)
    if axis is None:
        if x.ndim != 1:
            raise AxisError(
                f"{caller}() needs one axis for NamedArray({format_axes(x.axes)}); axis=None only works "
                f"on a 1-axis array. Pass one of {format_names(x.axis_names)}, e.g. "
                f"{caller}(x, {x.axis_names[0] if x.axes else 'name'!r})."
            )
        axis = x.axes[0]
    reject_positional(caller, axis, x.axes)
    if not isinstance(axis, (str, Axis)):
        raise NamedTypeError(
            f"{caller}() reduces exactly one axis; got {axis!r}. Flatten the axes first to take the "
            f"{caller} over several."
        )
    i = find_axis(x.axes, axis)
    check_nonempty(caller, x, (i,), "Give the axis at least one element (pad or slice it first).")
    return NamedArray(fn(x.array, axis=i), x.axes[:i] + x.axes[i + 1 :])


def argmax(x: NamedArray, axis: AxisSelector | None = None) -> NamedArray:
    """Index of the largest element along one axis; the axis is dropped.

    Args:
        x: A NamedArray.
        axis: One axis; may be omitted only when ``x`` has exactly one axis.

    Raises:
        AxisError: if ``axis`` is ``None`` and ``x`` has more than one axis.
        AxisNotFoundError: if the axis is not in ``x``.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> x = na.named(jnp.array([[1.0, 5.0, 2.0]]), ("batch", "vocab"))
        >>> na.argmax(x, "vocab").array
        Array([1], dtype=int32)
    """
    return _arg_reduce("argmax", jnp.argmax, x, axis)


def argmin(x: NamedArray, axis: AxisSelector | None = None) -> NamedArray:
    """Index of the smallest element along one axis; as for :func:`argmax`.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> na.argmin(na.named(jnp.array([3.0, 1.0, 2.0]), "vocab")).item()
        1
    """
    return _arg_reduce("argmin", jnp.argmin, x, axis)


def _along(
    caller: str, fn: Callable[..., Any], x: Any, axis: AxisSelection, where: Any
) -> NamedArray:
    """Apply an axis-preserving op (softmax family) over the selected axes."""
    x = expect_named(x, caller)
    if axis is None:
        raise NamedTypeError(
            f"{caller}() needs the axis to normalize over, e.g. {caller}(x, 'vocab')."
        )
    pos = selected_positions(caller, x, axis, verb="normalize")
    x, mask = _mask(caller, x, where)
    return NamedArray(fn(x.array, axis=pos, where=mask), x.axes)


def softmax(x: NamedArray, axis: AxisSelection, *, where: Any = None) -> NamedArray:
    """Softmax over ``axis`` (one or several); the result keeps ``x``'s axes.

    Args:
        x: A NamedArray of logits.
        axis: The axis or axes that the probabilities sum to 1 over.
        where: Mask of elements to include (a NamedArray over some of ``x``'s axes, or a scalar);
            masked-out elements get probability 0.

    Raises:
        AxisNotFoundError: if an axis is not in ``x``.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> logits = na.named(jnp.zeros((2, 4)), ("batch", "vocab"))
        >>> na.softmax(logits, "vocab").array[0]
        Array([0.25, 0.25, 0.25, 0.25], dtype=float32)
    """
    return _along("softmax", jax.nn.softmax, x, axis, where)


def log_softmax(x: NamedArray, axis: AxisSelection, *, where: Any = None) -> NamedArray:
    """Log of :func:`softmax` over ``axis``, computed stably; the result keeps ``x``'s axes.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> logits = na.named(jnp.zeros((2, 2)), ("batch", "vocab"))
        >>> na.log_softmax(logits, "vocab").array[0]
        Array([-0.6931472, -0.6931472], dtype=float32)
    """
    return _along("log_softmax", jax.nn.log_softmax, x, axis, where)


def _cumulative(
    caller: str, fn: Callable[..., Any], x: Any, axis: AxisSelector, dtype: Any
) -> NamedArray:
    x = expect_named(x, caller)
    reject_positional(caller, axis, x.axes)
    i = find_axis(x.axes, axis)
    # On Explicit meshes JAX refuses a running sum along a sharded dimension; gather it first.
    array = unshard_dims(x.array, (i,))
    return NamedArray(fn(array, axis=i, dtype=canonical_dtype(dtype, caller=caller)), x.axes)


def cumsum(x: NamedArray, axis: AxisSelector, *, dtype: Any = None) -> NamedArray:
    """Running sum along one axis; the result keeps ``x``'s axes.

    On Explicit meshes, an ``axis`` sharded over mesh axes is replicated first (the other axes
    keep their sharding).

    Raises:
        AxisNotFoundError: if the axis is not in ``x``.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> na.cumsum(na.named(jnp.array([1, 2, 3]), "time"), "time").array
        Array([1, 3, 6], dtype=int32)
    """
    return _cumulative("cumsum", jnp.cumsum, x, axis, dtype)


def cumprod(x: NamedArray, axis: AxisSelector, *, dtype: Any = None) -> NamedArray:
    """Running product along one axis; the result keeps ``x``'s axes.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> na.cumprod(na.named(jnp.array([1, 2, 3]), "time"), "time").array
        Array([1, 2, 6], dtype=int32)
    """
    return _cumulative("cumprod", jnp.cumprod, x, axis, dtype)
