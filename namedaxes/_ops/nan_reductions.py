"""NaN-ignoring reductions (``nansum``, ``nanmean``, ...): the reductions' engine over ``jnp.nan*``.

Each public function is one table row handed to the same helpers that build ``sum``, ``argmax`` and
``cumsum`` in ``reductions``, so axis selection, ``where=`` masks and errors are identical.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp

from .._array import NamedArray
from .._errors import NamedTypeError
from .elementwise import canonical_dtype
from .reductions import _arg_reduce, _cumulative, _reduce

__all__ = ["NAN_REDUCTIONS"]

#: Public name -> (jnp function, kind, extra keywords accepted). Kinds: "reduce" (axis selection and
#: ``where=``), "arg" (exactly one axis, dropped), "cumulative" (one axis, kept).
NAN_REDUCTIONS: dict[str, tuple[Callable[..., Any], str, tuple[str, ...]]] = {
    "nansum": (jnp.nansum, "reduce", ("dtype",)),
    "nanprod": (jnp.nanprod, "reduce", ("dtype",)),
    "nanmean": (jnp.nanmean, "reduce", ("dtype",)),
    "nanmax": (jnp.nanmax, "reduce", ("initial",)),
    "nanmin": (jnp.nanmin, "reduce", ("initial",)),
    "nanvar": (jnp.nanvar, "reduce", ("ddof", "dtype")),
    "nanstd": (jnp.nanstd, "reduce", ("ddof", "dtype")),
    "nanargmax": (jnp.nanargmax, "arg", ()),
    "nanargmin": (jnp.nanargmin, "arg", ()),
    "nancumsum": (jnp.nancumsum, "cumulative", ("dtype",)),
    "nancumprod": (jnp.nancumprod, "cumulative", ("dtype",)),
}

_DEFAULTS = {"dtype": None, "initial": None, "ddof": 0}
_EXAMPLE = """
    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> x = na.named(jnp.array([[1.0, jnp.nan, 3.0]]), ("batch", "seq"))
        >>> na.{name}(x, "seq").axis_names
        {axes}
"""


def _build(
    name: str, fn: Callable[..., Any], kind: str, extras: tuple[str, ...]
) -> Callable[..., NamedArray]:
    base = name[3:]  # "nansum" -> "sum"

    if kind == "reduce":

        def op(x: Any, axis: Any = None, *, where: Any = None, **kwargs: Any) -> NamedArray:
            kw = _keywords(name, extras, kwargs)
            if "dtype" in kw:
                kw["dtype"] = canonical_dtype(kw["dtype"], caller=name)
            return _reduce(name, fn, x, axis, where, **kw)

        axes = "('batch',)"
        what = (
            f"``{base}`` over ``axis`` ignoring NaNs (``jnp.{name}``); arguments as for "
            f":func:`{base}`, keywords {', '.join(f'``{e}``' for e in extras)}."
        )
    elif kind == "arg":

        def op(x: Any, axis: Any = None) -> NamedArray:  # type: ignore[misc]
            return _arg_reduce(name, fn, x, axis)

        axes = "('batch',)"
        what = f"``{base}`` along one axis ignoring NaNs (``jnp.{name}``); as for :func:`{base}`."
    else:

        def op(x: Any, axis: Any, *, dtype: Any = None) -> NamedArray:  # type: ignore[misc]
            return _cumulative(name, fn, x, axis, dtype)

        axes = "('batch', 'seq')"
        what = (
            f"``{base}`` along one axis, NaNs counted as "
            f"{'zero' if base == 'cumsum' else 'one'} (``jnp.{name}``); the result keeps "
            f"``x``'s axes."
        )
    op.__name__ = op.__qualname__ = name
    op.__module__ = "namedaxes"
    op.__doc__ = f"Named ``{name}``: {what}\n" + _EXAMPLE.format(name=name, axes=axes)
    if kind == "reduce":
        params = [
            inspect.Parameter("x", inspect.Parameter.POSITIONAL_OR_KEYWORD),
            inspect.Parameter("axis", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None),
            inspect.Parameter("where", inspect.Parameter.KEYWORD_ONLY, default=None),
        ] + [
            inspect.Parameter(e, inspect.Parameter.KEYWORD_ONLY, default=_DEFAULTS[e])
            for e in extras
        ]
        signature = inspect.Signature(params, return_annotation=NamedArray)
        op.__signature__ = signature  # type: ignore[attr-defined]
    return op


def _keywords(name: str, extras: tuple[str, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(kwargs) - set(extras))
    if unknown:
        raise NamedTypeError(
            f"{name}() got unexpected keyword(s) {', '.join(map(repr, unknown))}; it takes "
            f"axis, where{''.join(', ' + e for e in extras)}."
        )
    return {k: v for k, v in kwargs.items() if not (k != "ddof" and v is None)}


nansum = _build("nansum", *NAN_REDUCTIONS["nansum"])
nanprod = _build("nanprod", *NAN_REDUCTIONS["nanprod"])
nanmean = _build("nanmean", *NAN_REDUCTIONS["nanmean"])
nanmax = _build("nanmax", *NAN_REDUCTIONS["nanmax"])
nanmin = _build("nanmin", *NAN_REDUCTIONS["nanmin"])
nanvar = _build("nanvar", *NAN_REDUCTIONS["nanvar"])
nanstd = _build("nanstd", *NAN_REDUCTIONS["nanstd"])
nanargmax = _build("nanargmax", *NAN_REDUCTIONS["nanargmax"])
nanargmin = _build("nanargmin", *NAN_REDUCTIONS["nanargmin"])
nancumsum = _build("nancumsum", *NAN_REDUCTIONS["nancumsum"])
nancumprod = _build("nancumprod", *NAN_REDUCTIONS["nancumprod"])
