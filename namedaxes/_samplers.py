"""The distributions of ``jax.random`` with parameters (or none) as named samplers.

Each is ``name(key, axes, <jax.random's parameters>, dtype=None)``: the parameters have
``jax.random``'s names and may be given by position or keyword; each is a scalar or a NamedArray over
some of ``axes`` and broadcasts by name. With the same key the values equal ``jax.random``'s for the
same shape. ``namedaxes.random`` re-exports them.
"""

from __future__ import annotations

from typing import Any

import jax

from ._array import NamedArray
from ._axis import Axis, AxisSpec, to_axes
from ._errors import AxisError, format_names
from ._ops._checks import check_key, dtype_arg
from ._ops._common import unshard_dims
from ._ops.elementwise import broadcast_into

__all__ = [
    "SAMPLERS",
    "sampler_params",
    "exponential",
    "laplace",
    "cauchy",
    "logistic",
    "gumbel",
    "rademacher",
    "poisson",
    "gamma",
    "loggamma",
    "beta",
    "t",
    "pareto",
    "weibull_min",
]

#: Sampler name -> (the ``jax.random`` function, its distribution parameters in order, example
#: arguments). Each sampler is ``name(key, axes, *parameters, dtype=None)``.
SAMPLERS: dict[str, tuple[Any, tuple[str, ...], str]] = {
    "exponential": (jax.random.exponential, (), ""),
    "laplace": (jax.random.laplace, (), ""),
    "cauchy": (jax.random.cauchy, (), ""),
    "logistic": (jax.random.logistic, (), ""),
    "gumbel": (jax.random.gumbel, (), ""),
    "rademacher": (jax.random.rademacher, (), ""),
    "poisson": (jax.random.poisson, ("lam",), ", lam=3.0"),
    "gamma": (jax.random.gamma, ("a",), ", a=2.0"),
    "loggamma": (jax.random.loggamma, ("a",), ", a=2.0"),
    "beta": (jax.random.beta, ("a", "b"), ", a=2.0, b=3.0"),
    "t": (jax.random.t, ("df",), ", df=4.0"),
    "pareto": (jax.random.pareto, ("b",), ", b=3.0"),
    "weibull_min": (
        jax.random.weibull_min,
        ("scale", "concentration"),
        ", scale=1.0, concentration=1.5",
    ),
}

# The dtypes jax.random accepts: integers for poisson, a type that holds -1 for rademacher,
# else floats.
_DTYPE_KINDS = {"poisson": "integer", "rademacher": "signed"}
_GUMBEL_MODES = (None, "low", "high", "highest")


def sampler_params(caller: str, axes: tuple[Axis, ...], params: dict[str, Any]) -> dict[str, Any]:
    """Each distribution parameter laid out to broadcast against ``axes``, replicated.

    Samplers mix parameters and fresh draws elementwise. On Explicit meshes JAX needs the operands
    sharded alike, and the draws are unsharded; two parameters sharded over one mesh axis on
    different named axes would even give a result sharded twice over it. So sharded parameters are
    replicated first (they are small); on Auto meshes XLA chooses the same layout either way.

    Raises:
        AxisError: if a parameter has an axis that ``axes`` lacks.
        AxisSizeError: if a parameter's axis has another size than in ``axes``.
    """
    values = {p: broadcast_into(v, axes, caller=caller, what=p) for p, v in params.items()}
    return {
        p: unshard_dims(v, tuple(range(v.ndim))) if getattr(v, "ndim", 0) else v
        for p, v in values.items()
    }


def _draw(
    name: str, key: jax.Array, axes: AxisSpec, params: dict[str, Any], dtype: Any, **options: Any
) -> NamedArray:
    check_key(key, name)
    ax = to_axes(axes)
    values = sampler_params(name, ax, params)
    if dtype is not None:
        options["dtype"] = dtype_arg(dtype, name, _DTYPE_KINDS.get(name, "float"))
    fn = SAMPLERS[name][0]
    return NamedArray(fn(key, *values.values(), shape=tuple(a.size for a in ax), **options), ax)


def exponential(key: jax.Array, axes: AxisSpec, dtype: Any = None) -> NamedArray:
    """Exponential samples (rate 1), with the given axes (``jax.random.exponential``).

    Args:
        key: A PRNG key.
        axes: A ``{name: size}`` dict, a sequence of ``Axis``, or one ``Axis``.
        dtype: A float dtype; JAX's default when ``None``.

    Returns:
        A NamedArray with exactly ``axes``.

    Raises:
        NamedTypeError: if ``key`` is not one PRNG key or ``dtype`` is not of the right kind.

    Example:
        >>> import jax
        >>> import namedaxes as na
        >>> na.random.exponential(jax.random.key(0), {"batch": 2, "embed": 3})
        NamedArray(float32, batch=2, embed=3)
    """
    return _draw("exponential", key, axes, {}, dtype)


def laplace(key: jax.Array, axes: AxisSpec, dtype: Any = None) -> NamedArray:
    """Laplace samples (location 0, scale 1), with the given axes (``jax.random.laplace``).

    Args:
        key: A PRNG key.
        axes: A ``{name: size}`` dict, a sequence of ``Axis``, or one ``Axis``.
        dtype: A float dtype; JAX's default when ``None``.

    Returns:
        A NamedArray with exactly ``axes``.

    Raises:
        NamedTypeError: if ``key`` is not one PRNG key or ``dtype`` is not of the right kind.

    Example:
        >>> import jax
        >>> import namedaxes as na
        >>> na.random.laplace(jax.random.key(0), {"batch": 2, "embed": 3})
        NamedArray(float32, batch=2, embed=3)
    """
    return _draw("laplace", key, axes, {}, dtype)


def cauchy(key: jax.Array, axes: AxisSpec, dtype: Any = None) -> NamedArray:
    """Cauchy samples (location 0, scale 1), with the given axes (``jax.random.cauchy``).

    Args:
        key: A PRNG key.
        axes: A ``{name: size}`` dict, a sequence of ``Axis``, or one ``Axis``.
        dtype: A float dtype; JAX's default when ``None``.

    Returns:
        A NamedArray with exactly ``axes``.

    Raises:
        NamedTypeError: if ``key`` is not one PRNG key or ``dtype`` is not of the right kind.

    Example:
        >>> import jax
        >>> import namedaxes as na
        >>> na.random.cauchy(jax.random.key(0), {"batch": 2, "embed": 3})
        NamedArray(float32, batch=2, embed=3)
    """
    return _draw("cauchy", key, axes, {}, dtype)


def logistic(key: jax.Array, axes: AxisSpec, dtype: Any = None) -> NamedArray:
    """Logistic samples (location 0, scale 1), with the given axes (``jax.random.logistic``).

    Args:
        key: A PRNG key.
        axes: A ``{name: size}`` dict, a sequence of ``Axis``, or one ``Axis``.
        dtype: A float dtype; JAX's default when ``None``.

    Returns:
        A NamedArray with exactly ``axes``.

    Raises:
        NamedTypeError: if ``key`` is not one PRNG key or ``dtype`` is not of the right kind.

    Example:
        >>> import jax
        >>> import namedaxes as na
        >>> na.random.logistic(jax.random.key(0), {"batch": 2, "embed": 3})
        NamedArray(float32, batch=2, embed=3)
    """
    return _draw("logistic", key, axes, {}, dtype)


def gumbel(
    key: jax.Array, axes: AxisSpec, dtype: Any = None, mode: str | None = None
) -> NamedArray:
    """Gumbel samples (location 0, scale 1), with the given axes (``jax.random.gumbel``).

    Args:
        key: A PRNG key.
        axes: A ``{name: size}`` dict, a sequence of ``Axis``, or one ``Axis``.
        dtype: A float dtype; JAX's default when ``None``.
        mode: ``jax.random.gumbel``'s sampling mode: ``"low"``, ``"high"`` or ``"highest"``
            (more precision in the tails, at more cost); JAX's default when ``None``.

    Returns:
        A NamedArray with exactly ``axes``.

    Raises:
        NamedTypeError: if ``key`` is not one PRNG key or ``dtype`` is not of the right kind.
        AxisError: if ``mode`` is not one of the modes above.

    Example:
        >>> import jax
        >>> import namedaxes as na
        >>> na.random.gumbel(jax.random.key(0), {"batch": 2, "embed": 3})
        NamedArray(float32, batch=2, embed=3)
    """
    if mode not in _GUMBEL_MODES:
        raise AxisError(
            f"gumbel() mode must be one of {format_names(m for m in _GUMBEL_MODES if m)} or "
            f"None (JAX's default), got {mode!r}."
        )
    return _draw("gumbel", key, axes, {}, dtype, mode=mode)


def rademacher(key: jax.Array, axes: AxisSpec, dtype: Any = None) -> NamedArray:
    """Rademacher samples: -1 or 1 with equal probability, with the given axes (``jax.random.rademacher``).

    Args:
        key: A PRNG key.
        axes: A ``{name: size}`` dict, a sequence of ``Axis``, or one ``Axis``.
        dtype: A signed integer, float or complex dtype (one that holds -1); JAX's default when
            ``None``.

    Returns:
        A NamedArray with exactly ``axes``.

    Raises:
        NamedTypeError: if ``key`` is not one PRNG key or ``dtype`` is unsigned or ``bool``.

    Example:
        >>> import jax
        >>> import namedaxes as na
        >>> na.random.rademacher(jax.random.key(0), {"batch": 2, "embed": 3})
        NamedArray(int32, batch=2, embed=3)
    """
    return _draw("rademacher", key, axes, {}, dtype)


def poisson(key: jax.Array, axes: AxisSpec, lam: Any, dtype: Any = None) -> NamedArray:
    """Poisson samples, with the given axes (``jax.random.poisson``).

    Args:
        key: A PRNG key.
        axes: A ``{name: size}`` dict, a sequence of ``Axis``, or one ``Axis``.
        lam: The rate: a scalar or a NamedArray over some of ``axes``.
        dtype: An integer dtype; JAX's default when ``None``.

    Returns:
        A NamedArray with exactly ``axes``.

    Raises:
        AxisError: if a parameter has an axis that ``axes`` lacks.
        NamedTypeError: if ``key`` is not one PRNG key or ``dtype`` is not of the right kind.

    Example:
        >>> import jax
        >>> import namedaxes as na
        >>> na.random.poisson(jax.random.key(0), {"batch": 2, "embed": 3}, lam=3.0)
        NamedArray(int32, batch=2, embed=3)
    """
    return _draw("poisson", key, axes, {"lam": lam}, dtype)


def gamma(key: jax.Array, axes: AxisSpec, a: Any, dtype: Any = None) -> NamedArray:
    """Gamma samples (scale 1), with the given axes (``jax.random.gamma``).

    Args:
        key: A PRNG key.
        axes: A ``{name: size}`` dict, a sequence of ``Axis``, or one ``Axis``.
        a: The shape: a scalar or a NamedArray over some of ``axes``.
        dtype: A float dtype; JAX's default when ``None``.

    Returns:
        A NamedArray with exactly ``axes``.

    Raises:
        AxisError: if a parameter has an axis that ``axes`` lacks.
        NamedTypeError: if ``key`` is not one PRNG key or ``dtype`` is not of the right kind.

    Example:
        >>> import jax
        >>> import namedaxes as na
        >>> na.random.gamma(jax.random.key(0), {"batch": 2, "embed": 3}, a=2.0)
        NamedArray(float32, batch=2, embed=3)
    """
    return _draw("gamma", key, axes, {"a": a}, dtype)


def loggamma(key: jax.Array, axes: AxisSpec, a: Any, dtype: Any = None) -> NamedArray:
    """Logarithms of gamma samples (scale 1), accurate for small ``a``, with the given axes (``jax.random.loggamma``).

    Args:
        key: A PRNG key.
        axes: A ``{name: size}`` dict, a sequence of ``Axis``, or one ``Axis``.
        a: The shape: a scalar or a NamedArray over some of ``axes``.
        dtype: A float dtype; JAX's default when ``None``.

    Returns:
        A NamedArray with exactly ``axes``.

    Raises:
        AxisError: if a parameter has an axis that ``axes`` lacks.
        NamedTypeError: if ``key`` is not one PRNG key or ``dtype`` is not of the right kind.

    Example:
        >>> import jax
        >>> import namedaxes as na
        >>> na.random.loggamma(jax.random.key(0), {"batch": 2, "embed": 3}, a=2.0)
        NamedArray(float32, batch=2, embed=3)
    """
    return _draw("loggamma", key, axes, {"a": a}, dtype)


def beta(key: jax.Array, axes: AxisSpec, a: Any, b: Any, dtype: Any = None) -> NamedArray:
    """Beta samples, with the given axes (``jax.random.beta``).

    Args:
        key: A PRNG key.
        axes: A ``{name: size}`` dict, a sequence of ``Axis``, or one ``Axis``.
        a: The first shape parameter: a scalar or a NamedArray over some of ``axes``.
        b: The second shape parameter: a scalar or a NamedArray over some of ``axes``.
        dtype: A float dtype; JAX's default when ``None``.

    Returns:
        A NamedArray with exactly ``axes``.

    Raises:
        AxisError: if a parameter has an axis that ``axes`` lacks.
        NamedTypeError: if ``key`` is not one PRNG key or ``dtype`` is not of the right kind.

    Example:
        >>> import jax
        >>> import namedaxes as na
        >>> na.random.beta(jax.random.key(0), {"batch": 2, "embed": 3}, a=2.0, b=3.0)
        NamedArray(float32, batch=2, embed=3)
    """
    return _draw("beta", key, axes, {"a": a, "b": b}, dtype)


def t(key: jax.Array, axes: AxisSpec, df: Any, dtype: Any = None) -> NamedArray:
    """Student's t samples, with the given axes (``jax.random.t``).

    Args:
        key: A PRNG key.
        axes: A ``{name: size}`` dict, a sequence of ``Axis``, or one ``Axis``.
        df: The degrees of freedom: a scalar or a NamedArray over some of ``axes``.
        dtype: A float dtype; JAX's default when ``None``.

    Returns:
        A NamedArray with exactly ``axes``.

    Raises:
        AxisError: if a parameter has an axis that ``axes`` lacks.
        NamedTypeError: if ``key`` is not one PRNG key or ``dtype`` is not of the right kind.

    Example:
        >>> import jax
        >>> import namedaxes as na
        >>> na.random.t(jax.random.key(0), {"batch": 2, "embed": 3}, df=4.0)
        NamedArray(float32, batch=2, embed=3)
    """
    return _draw("t", key, axes, {"df": df}, dtype)


def pareto(key: jax.Array, axes: AxisSpec, b: Any, dtype: Any = None) -> NamedArray:
    """Pareto samples (scale 1), with the given axes (``jax.random.pareto``).

    Args:
        key: A PRNG key.
        axes: A ``{name: size}`` dict, a sequence of ``Axis``, or one ``Axis``.
        b: The shape: a scalar or a NamedArray over some of ``axes``.
        dtype: A float dtype; JAX's default when ``None``.

    Returns:
        A NamedArray with exactly ``axes``.

    Raises:
        AxisError: if a parameter has an axis that ``axes`` lacks.
        NamedTypeError: if ``key`` is not one PRNG key or ``dtype`` is not of the right kind.

    Example:
        >>> import jax
        >>> import namedaxes as na
        >>> na.random.pareto(jax.random.key(0), {"batch": 2, "embed": 3}, b=3.0)
        NamedArray(float32, batch=2, embed=3)
    """
    return _draw("pareto", key, axes, {"b": b}, dtype)


def weibull_min(
    key: jax.Array, axes: AxisSpec, scale: Any, concentration: Any, dtype: Any = None
) -> NamedArray:
    """Weibull samples, with the given axes (``jax.random.weibull_min``).

    Args:
        key: A PRNG key.
        axes: A ``{name: size}`` dict, a sequence of ``Axis``, or one ``Axis``.
        scale: The scale: a scalar or a NamedArray over some of ``axes``.
        concentration: The concentration (shape): a scalar or a NamedArray over some of ``axes``.
        dtype: A float dtype; JAX's default when ``None``.

    Returns:
        A NamedArray with exactly ``axes``.

    Raises:
        AxisError: if a parameter has an axis that ``axes`` lacks.
        NamedTypeError: if ``key`` is not one PRNG key or ``dtype`` is not of the right kind.

    Example:
        >>> import jax
        >>> import namedaxes as na
        >>> na.random.weibull_min(jax.random.key(0), {"batch": 2, "embed": 3}, scale=1.0, concentration=1.5)
        NamedArray(float32, batch=2, embed=3)
    """
    return _draw("weibull_min", key, axes, {"scale": scale, "concentration": concentration}, dtype)
