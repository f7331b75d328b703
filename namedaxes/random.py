"""Random samplers that produce NamedArrays.

Each sampler mirrors its ``jax.random`` namesake with the key first and the shape given as axes
(a ``{name: size}`` dict, a sequence of ``Axis``, or one ``Axis``). Parameters such as ``minval``
or ``p`` may be scalars or NamedArrays over some of those axes; they broadcast by name. Every
sampler raises ``NamedTypeError`` when its first argument is not one PRNG key, or when ``dtype`` is
not of a kind it can draw (a float dtype for ``normal``, an integer dtype for ``randint``, ...).

Example:
    >>> import jax
    >>> import namedaxes as na
    >>> key = jax.random.key(0)
    >>> na.random.normal(key, {"batch": 2, "embed": 3})
    NamedArray(float32, batch=2, embed=3)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from ._array import NamedArray
from ._axis import Axis, AxisSelector, AxisSpec, find_axis, to_axes
from ._errors import AxisError, NamedTypeError, format_axes, format_names
from ._ops._checks import check_key, check_nonempty, dtype_arg
from ._ops._common import describe_operand, unshard_dims
from ._ops.creation import single_axis
from ._ops.elementwise import broadcast_into
from ._samplers import SAMPLERS as SAMPLERS
from ._samplers import beta as beta
from ._samplers import cauchy as cauchy
from ._samplers import exponential as exponential
from ._samplers import gamma as gamma
from ._samplers import gumbel as gumbel
from ._samplers import laplace as laplace
from ._samplers import loggamma as loggamma
from ._samplers import logistic as logistic
from ._samplers import pareto as pareto
from ._samplers import poisson as poisson
from ._samplers import rademacher as rademacher
from ._samplers import sampler_params
from ._samplers import t as t
from ._samplers import weibull_min as weibull_min

__all__ = [
    "SAMPLERS",
    "ball",
    "bernoulli",
    "beta",
    "categorical",
    "cauchy",
    "choice",
    "exponential",
    "gamma",
    "gumbel",
    "laplace",
    "logistic",
    "loggamma",
    "normal",
    "pareto",
    "permutation",
    "poisson",
    "rademacher",
    "randint",
    "t",
    "truncated_normal",
    "uniform",
    "weibull_min",
]


def _shape(axes: tuple[Axis, ...]) -> tuple[int, ...]:
    return tuple(a.size for a in axes)


def normal(key: jax.Array, axes: AxisSpec, dtype: Any = None) -> NamedArray:
    """Standard normal samples with the given axes.

    Args:
        key: A PRNG key (``jax.random.key`` or ``jax.random.PRNGKey``).
        axes: A ``{name: size}`` dict, a sequence of ``Axis``, or one ``Axis``.
        dtype: A float type; JAX's default float type when ``None``.

    Returns:
        A NamedArray with exactly ``axes``.

    Raises:
        NamedTypeError: if ``key`` is not one PRNG key, ``axes`` has no sizes, or ``dtype`` is not
            a floating-point or complex dtype.

    Example:
        >>> import jax
        >>> import namedaxes as na
        >>> na.random.normal(jax.random.key(0), {"batch": 2, "embed": 3})
        NamedArray(float32, batch=2, embed=3)
    """
    check_key(key, "normal")
    ax = to_axes(axes)
    return NamedArray(jax.random.normal(key, _shape(ax), dtype_arg(dtype, "normal", "inexact")), ax)


def uniform(
    key: jax.Array, axes: AxisSpec, dtype: Any = None, minval: Any = 0.0, maxval: Any = 1.0
) -> NamedArray:
    """Uniform samples in ``[minval, maxval)`` with the given axes.

    Args:
        key: A PRNG key.
        axes: A ``{name: size}`` dict, a sequence of ``Axis``, or one ``Axis``.
        dtype: A float type; JAX's default float type when ``None``.
        minval: Lower bound: a scalar or a NamedArray over some of ``axes``.
        maxval: Upper bound: a scalar or a NamedArray over some of ``axes``.

    Returns:
        A NamedArray with exactly ``axes``.

    Raises:
        AxisError: if a bound has an axis that ``axes`` lacks.

    Example:
        >>> import jax
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> hi = na.named(jnp.array([1.0, 10.0, 100.0]), "embed")  # one bound per embed entry
        >>> na.random.uniform(jax.random.key(0), {"batch": 2, "embed": 3}, maxval=hi)
        NamedArray(float32, batch=2, embed=3)
    """
    check_key(key, "uniform")
    ax = to_axes(axes)
    bounds = sampler_params("uniform", ax, {"minval": minval, "maxval": maxval})
    lo, hi = bounds["minval"], bounds["maxval"]
    dtype = dtype_arg(dtype, "uniform", "float")
    return NamedArray(jax.random.uniform(key, _shape(ax), dtype, minval=lo, maxval=hi), ax)


def bernoulli(key: jax.Array, axes: AxisSpec, p: Any = 0.5) -> NamedArray:
    """Boolean samples that are true with probability ``p``.

    Args:
        key: A PRNG key.
        axes: A ``{name: size}`` dict, a sequence of ``Axis``, or one ``Axis``.
        p: The probability of ``True``: a scalar or a NamedArray over some of ``axes``.

    Returns:
        A boolean NamedArray with exactly ``axes``.

    Raises:
        NamedTypeError: if ``p`` is not floating-point (an int or bool probability).

    Example:
        >>> import jax
        >>> import namedaxes as na
        >>> na.random.bernoulli(jax.random.key(0), {"batch": 2, "embed": 3}, p=0.9)
        NamedArray(bool, batch=2, embed=3)
    """
    check_key(key, "bernoulli")
    ax = to_axes(axes)
    prob = sampler_params("bernoulli", ax, {"p": p})["p"]
    p_dtype = jnp.result_type(prob)
    if not jnp.issubdtype(p_dtype, jnp.floating):
        got = repr(p) if isinstance(p, NamedArray) else describe_operand(p)
        if hasattr(p, "dtype") and not isinstance(p, NamedArray):
            got += f" of dtype {p_dtype}"
        raise NamedTypeError(
            f"bernoulli(): p must be a floating-point probability, got {got}. Pass a float "
            "(p=1.0), or cast it with .astype(jnp.float32)."
        )
    return NamedArray(jax.random.bernoulli(key, prob, _shape(ax)), ax)


def randint(
    key: jax.Array, axes: AxisSpec, minval: Any, maxval: Any, dtype: Any = None
) -> NamedArray:
    """Integers drawn uniformly from ``[minval, maxval)``.

    Args:
        key: A PRNG key.
        axes: A ``{name: size}`` dict, a sequence of ``Axis``, or one ``Axis``.
        minval: Lower bound (inclusive): an int or a NamedArray over some of ``axes``.
        maxval: Upper bound (exclusive): an int or a NamedArray over some of ``axes``.
        dtype: An integer type; JAX's default int type when ``None``.

    Returns:
        An integer NamedArray with exactly ``axes``.

    Example:
        >>> import jax
        >>> import namedaxes as na
        >>> na.random.randint(jax.random.key(0), {"batch": 2, "position": 3}, 0, 100)
        NamedArray(int32, batch=2, position=3)
    """
    check_key(key, "randint")
    ax = to_axes(axes)
    bounds = sampler_params("randint", ax, {"minval": minval, "maxval": maxval})
    lo, hi = bounds["minval"], bounds["maxval"]
    dtype = dtype_arg(dtype, "randint", "integer")
    return NamedArray(jax.random.randint(key, _shape(ax), lo, hi, dtype), ax)


def truncated_normal(
    key: jax.Array, axes: AxisSpec, lower: Any, upper: Any, dtype: Any = None
) -> NamedArray:
    """Standard normal samples truncated to ``(lower, upper)``.

    Args:
        key: A PRNG key.
        axes: A ``{name: size}`` dict, a sequence of ``Axis``, or one ``Axis``.
        lower: Lower bound: a scalar or a NamedArray over some of ``axes``.
        upper: Upper bound: a scalar or a NamedArray over some of ``axes``.
        dtype: A float type; JAX's default float type when ``None``.

    Returns:
        A NamedArray with exactly ``axes``.

    Example:
        >>> import jax
        >>> import namedaxes as na
        >>> na.random.truncated_normal(jax.random.key(0), {"embed": 2, "mlp": 3}, -2.0, 2.0)
        NamedArray(float32, embed=2, mlp=3)
    """
    check_key(key, "truncated_normal")
    ax = to_axes(axes)
    bounds = sampler_params("truncated_normal", ax, {"lower": lower, "upper": upper})
    lo, hi = bounds["lower"], bounds["upper"]
    dtype = dtype_arg(dtype, "truncated_normal", "float")
    return NamedArray(jax.random.truncated_normal(key, lo, hi, _shape(ax), dtype), ax)


def categorical(
    key: jax.Array, logits: NamedArray, axis: AxisSelector, *, axes: AxisSpec | None = None
) -> NamedArray:
    """Sample indices along ``axis`` with probabilities ``softmax(logits)`` over that axis.

    Samples depend only on axis names, never on layout: the same logits laid out in another axis
    order (or another ``axes=`` order) give the same sample for each named position. Draws are made
    in sorted-name order, so they equal ``jax.random.categorical``'s when the result's axes are
    already sorted by name.

    Args:
        key: A PRNG key.
        logits: Unnormalized log-probabilities, a NamedArray that has ``axis``.
        axis: The axis to sample an index from; it is dropped from the result.
        axes: The result's axes, to draw several samples per distribution; they must include
            every axis of ``logits`` except ``axis``. Defaults to exactly those axes.

    Returns:
        An integer NamedArray of indices into ``axis``.

    Raises:
        NamedTypeError: if ``logits`` is not a floating-point NamedArray.
        AxisNotFoundError: if ``logits`` has no ``axis``.
        AxisError: if ``axes`` misses an axis of ``logits`` or contains ``axis``, or ``axis`` has
            size 0 (there is no category to draw).

    Example:
        >>> import jax
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> logits = na.named(jnp.array([[0.0, 50.0], [50.0, 0.0]]), ("batch", "vocab"))
        >>> na.random.categorical(jax.random.key(0), logits, "vocab").array
        Array([1, 0], dtype=int32)
        >>> na.random.categorical(jax.random.key(0), logits, "vocab", axes={"sample": 3, "batch": 2})
        NamedArray(int32, sample=3, batch=2)
    """
    check_key(key, "categorical")
    if not isinstance(logits, NamedArray):
        raise NamedTypeError(
            f"categorical() needs logits as a NamedArray, got {type(logits).__name__}."
        )
    if not jnp.issubdtype(logits.dtype, jnp.floating):
        raise NamedTypeError(
            f"categorical(): logits must be floating-point, got {logits!r}. Cast them first: "
            "logits.astype(jnp.float32)."
        )
    i = find_axis(logits.axes, axis)
    check_nonempty("categorical", logits, (i,), "Sample from an axis with at least one category.")
    sampled = logits.axes[i]
    rest = logits.axes[:i] + logits.axes[i + 1 :]
    target = rest if axes is None else to_axes(axes)
    if any(a.name == sampled.name for a in target):
        raise AxisError(
            f"categorical() samples over {sampled.name!r}, so the result axes "
            f"({format_axes(target)}) cannot contain it. Leave it out of axes=."
        )
    missing = [a.name for a in rest if a.name not in {t.name for t in target}]
    if missing:
        raise AxisError(
            f"categorical() result axes ({format_axes(target)}) miss the logits' axes "
            f"{format_names(missing)}; include every logits axis except {sampled.name!r}."
        )
    # Draw in a canonical axis order (sorted names), so samples depend on names, not on layout.
    canonical = tuple(sorted(target, key=lambda a: a.name))
    aligned = broadcast_into(logits, canonical + (sampled,), caller="categorical", what="logits")
    out = jax.random.categorical(key, aligned, axis=-1, shape=_shape(canonical))
    perm = [canonical.index(a) for a in target]
    if perm != list(range(len(perm))):
        out = jnp.transpose(out, perm)
    return NamedArray(out, target)


def permutation(
    key: jax.Array, x: NamedArray | Axis | Mapping[str, int], axis: AxisSelector | None = None
) -> NamedArray:
    """A random permutation: of ``0..n-1`` over an axis, or of a NamedArray along one axis.

    Args:
        key: A PRNG key.
        x: An ``Axis`` or one-entry ``{name: size}`` dict (returns a shuffled ``arange`` over it),
            or a NamedArray to shuffle.
        axis: For a NamedArray, the axis to shuffle along; may be omitted when it has one axis.
            Slices along the other axes move together. On Explicit meshes a sharded ``axis`` is
            replicated first; the other axes keep their sharding.

    Returns:
        A NamedArray with the same axes as the input (or the single given axis).

    Raises:
        AxisError: if ``axis`` is missing for a NamedArray with several axes, or given with an
            ``Axis``.
        AxisNotFoundError: if the NamedArray has no ``axis``.

    Example:
        >>> import jax
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> perm = na.random.permutation(jax.random.key(0), {"batch": 4})
        >>> sorted(perm.array.tolist())
        [0, 1, 2, 3]
        >>> x = na.named(jnp.arange(12).reshape(3, 4), ("embed", "batch"))
        >>> na.random.permutation(jax.random.key(0), x, "batch")
        NamedArray(int32, embed=3, batch=4)
    """
    check_key(key, "permutation")
    if not isinstance(x, NamedArray):
        ax = single_axis(x, "permutation")
        if axis is not None:
            raise AxisError(
                f"permutation() of Axis({ax.name!r}, {ax.size}) takes no axis= argument; "
                "axis= picks the axis to shuffle a NamedArray along."
            )
        return NamedArray(jax.random.permutation(key, ax.size), (ax,))
    if axis is None:
        if x.ndim != 1:
            raise AxisError(
                f"permutation() needs axis= to shuffle NamedArray({format_axes(x.axes)}); pass "
                f"one of {format_names(x.axis_names)}."
            )
        axis = x.axes[0]
    i = find_axis(x.axes, axis)
    # A shuffle moves data across the axis; on Explicit meshes JAX needs it replicated first.
    return NamedArray(jax.random.permutation(key, unshard_dims(x.array, (i,)), axis=i), x.axes)


def ball(
    key: jax.Array, axes: AxisSpec, dim: Axis | Mapping[str, int], p: float = 2.0, dtype: Any = None
) -> NamedArray:
    """Points drawn uniformly from the unit ``p``-norm ball in ``dim.size`` dimensions.

    Args:
        key: A PRNG key.
        axes: The batch axes (a ``{name: size}`` dict, a sequence of ``Axis``, or one ``Axis``).
        dim: The axis holding each point's coordinates (an ``Axis`` or one-entry dict).
        p: The norm's exponent.
        dtype: A float type; JAX's default when ``None``.

    Returns:
        A NamedArray with ``axes`` then ``dim``.

    Raises:
        DuplicateAxisError: if ``dim`` is also one of ``axes``.

    Example:
        >>> import jax
        >>> import namedaxes as na
        >>> na.random.ball(jax.random.key(0), {"batch": 4}, {"coord": 3})
        NamedArray(float32, batch=4, coord=3)
    """
    check_key(key, "ball")
    ax = to_axes(axes)
    d = single_axis(dim, "ball")
    out_axes = to_axes(ax + (d,))  # checks that dim is new
    dtype = dtype_arg(dtype, "ball", "float")
    kwargs = {} if dtype is None else {"dtype": dtype}
    return NamedArray(jax.random.ball(key, d.size, p, _shape(ax), **kwargs), out_axes)


def choice(
    key: jax.Array,
    a: NamedArray | Axis | Mapping[str, int],
    axes: AxisSpec,
    *,
    axis: AxisSelector | None = None,
    replace: bool = True,
    p: NamedArray | None = None,
) -> NamedArray:
    """Draw entries of ``a`` at random (``jax.random.choice`` by name).

    Args:
        key: A PRNG key.
        a: An ``Axis`` or one-entry ``{name: size}`` dict (draws integers ``0..size-1``), or a
            NamedArray (draws slices along ``axis``).
        axes: The draws' axes (a ``{name: size}`` dict, a sequence of ``Axis`` or one ``Axis``).
            For a NamedArray they replace ``axis``, in place.
        axis: For a NamedArray, the axis to draw along; may be omitted when it has one axis.
        replace: Draw with replacement.
        p: Probabilities: a NamedArray over the drawn axis alone (defaults to uniform).

    Returns:
        A NamedArray: ``axes`` (from an ``Axis``), or ``a``'s axes with ``axis`` replaced by
        ``axes``.

    Raises:
        AxisError: if ``p`` is not over the drawn axis alone, ``axis`` is missing for a NamedArray
            with several axes, or more draws without replacement than entries are asked for.
        DuplicateAxisError: if a draw axis is another axis of ``a``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import namedaxes as na
        >>> na.random.choice(jax.random.key(0), {"vocab": 10}, {"sample": 4})
        NamedArray(int32, sample=4)
        >>> table = na.named(jnp.zeros((10, 8)), ("vocab", "embed"))
        >>> na.random.choice(jax.random.key(0), table, {"sample": 4}, axis="vocab", replace=False)
        NamedArray(float32, sample=4, embed=8)
    """
    check_key(key, "choice")
    draws = to_axes(axes)
    if isinstance(a, NamedArray):
        if axis is None:
            if a.ndim != 1:
                raise AxisError(
                    f"choice() needs axis= to draw from NamedArray({format_axes(a.axes)}); pass "
                    f"one of {format_names(a.axis_names)}."
                )
            axis = a.axes[0]
        i = find_axis(a.axes, axis)
        drawn = a.axes[i]
        out_axes = to_axes(a.axes[:i] + draws + a.axes[i + 1 :])
        source: Any = unshard_dims(a.array, (i,))
    else:
        if axis is not None:
            raise AxisError(
                "choice() of an Axis takes no axis= argument; axis= is for a NamedArray."
            )
        drawn = single_axis(a, "choice")
        i, out_axes, source = 0, draws, drawn.size
    n_draws = math.prod(d.size for d in draws)
    if n_draws and not drawn.size:
        raise AxisError(
            f"choice(): cannot draw {n_draws} entries from {drawn.name!r} of size 0; draw from a "
            "non-empty axis."
        )
    if not replace and n_draws > drawn.size:
        raise AxisError(
            f"choice(): {n_draws} draws without replacement from {drawn.name!r} of size "
            f"{drawn.size}; draw at most {drawn.size} or pass replace=True."
        )
    prob = None
    if p is not None:
        if not isinstance(p, NamedArray) or p.axes != (drawn,):
            got = f"NamedArray({format_axes(p.axes)})" if isinstance(p, NamedArray) else repr(p)
            raise AxisError(
                f"choice(): p must be a NamedArray over ({format_axes((drawn,))}) alone, got {got}."
            )
        prob = unshard_dims(p.array, (0,))  # the draw takes a running sum over all of p
    out = jax.random.choice(key, source, _shape(draws), replace=replace, p=prob, axis=i)
    return NamedArray(out, out_axes)
