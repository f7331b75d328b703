"""Elementwise ops over named axes: one lifting engine and a table of lifted functions.

Every function here is built by :func:`_lift` from a plain JAX function: operands broadcast **by
name** (when an operand has every axis of the result, the result keeps the first such operand's
order; otherwise it has the first operand's axes, then each later operand's new axes, in order),
Python scalars and 0-d arrays broadcast to everything, and a plain array with dimensions is refused
because it has no names to broadcast by. NamedArray's arithmetic, bitwise and comparison
operators and its ``astype`` method (declared in ``namedaxes._array``) call these functions.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np

from .._array import NamedArray
from .._axis import Axis
from .._errors import AxisError, AxisSizeError, NamedTypeError, format_axes, format_names
from ._align import align_to, result_axes
from ._common import (
    agree_by_name,
    check_layout,
    describe_operand,
    expect_named,
    scalar_keywords,
)

__all__ = ["ELEMENTWISE_OPS", "astype", "broadcast_into", "canonical_dtype", "clip", "lift_call"]

_SCALAR_TYPES = (bool, int, float, complex, np.generic)


# -- the engine -----------------------------------------------------------------------------------


def _check_operand(x: Any, caller: str, what: str) -> Any:
    """``x`` if it can take part in a by-name broadcast; a typed error otherwise."""
    if isinstance(x, NamedArray):
        return check_layout(x)
    if isinstance(x, _SCALAR_TYPES):
        return x
    shape = None if isinstance(x, type) else getattr(x, "shape", None)
    if shape is not None:
        if len(shape) == 0:
            return x
        raise NamedTypeError(
            f"{caller}() got a plain array of shape {tuple(shape)} for {what}; plain arrays have no "
            "axis names to broadcast by. Wrap it first, e.g. "
            f"named(x, {tuple(f'axis{i}' for i in range(len(shape)))!r})."
        )
    raise NamedTypeError(
        f"{caller}() needs a NamedArray or a scalar for {what}, got {x!r} ({type(x).__name__})."
    )


def lift_call(
    caller: str,
    fn: Callable[..., Any],
    operands: Sequence[Any],
    names: Sequence[str] | None = None,
    /,
    **kwargs: Any,
) -> NamedArray:
    """Apply ``fn`` to ``operands`` broadcast by name; the engine behind every elementwise op.

    The result's axis order is :func:`~namedaxes._ops._align.result_axes`'s: the order of the first
    operand that has every result axis, else the first operand's axes then the others' new ones.

    ``names`` label the operands in error messages. ``None`` operands pass through untouched (for
    optional bounds such as ``clip``'s); ``kwargs`` go to ``fn`` unchanged.

    On Explicit meshes, operands whose shardings conflict are resharded by the mapping in force
    (see :func:`~namedaxes._ops._common.agree_by_name`).

    Raises:
        AxisSizeError: if one axis name has two sizes among the operands.
        NamedTypeError: if an operand is a plain array with dimensions, or not array-like, or a
            keyword is a NamedArray.
        ShardingError: if Explicit shardings conflict and no mapping is in force.
    """
    kwargs = scalar_keywords(caller, kwargs)
    labels = names or [f"operand {i + 1}" for i in range(len(operands))]
    checked = [x if x is None else _check_operand(x, caller, w) for x, w in zip(operands, labels)]
    checked = agree_by_name(caller, checked, labels)  # Explicit meshes: conflicting shardings
    try:
        axes = result_axes([x.axes for x in checked if isinstance(x, NamedArray)])
    except AxisSizeError as e:
        raise AxisSizeError(f"{caller}(): {e}") from None
    arrays = [align_to(x, axes) if isinstance(x, NamedArray) else x for x in checked]
    return NamedArray(fn(*arrays, **kwargs), axes)


def broadcast_into(value: Any, axes: Sequence[Axis], *, caller: str, what: str) -> Any:
    """``value`` laid out to broadcast positionally against an array with ``axes``.

    Scalars and 0-d arrays pass through; a NamedArray must only have axes from ``axes`` (missing
    ones become size-1 dimensions). Used for masks (``where=``), fill values and sampler parameters.

    Raises:
        AxisError: if ``value`` has an axis that ``axes`` lacks.
        AxisSizeError: if a shared axis has another size.
        NamedTypeError: if ``value`` is a plain array with dimensions.
    """
    if value is None:
        return None
    if not isinstance(value, NamedArray):
        return _check_operand(value, caller, what)
    names = [a.name for a in axes]
    extra = [a.name for a in value.axes if a.name not in names]
    if extra:
        raise AxisError(
            f"{caller}(): {what} NamedArray({format_axes(value.axes)}) has axes {format_names(extra)} "
            f"that NamedArray({format_axes(axes)}) lacks; it may only use "
            f"{format_names(names)}. Reduce or index the extra axes first."
        )
    for a in value.axes:
        mine = next(b for b in axes if b.name == a.name)
        if mine.size != a.size:
            raise AxisSizeError(
                f"{caller}(): {what} axis {a.name!r} has size {a.size}, but the result's "
                f"{a.name!r} has size {mine.size}."
            )
    return align_to(value, axes)


def canonical_dtype(dtype: Any, *, caller: str) -> Any:
    """``dtype`` checked to be a numeric or bool dtype (``None`` passes through).

    Raises:
        NamedTypeError: if ``dtype`` is a value rather than a dtype (a NamedArray, an array, a
            scalar: ``jnp.dtype`` would read its ``.dtype``, or refuse it in JAX's terms), is not
            understood by ``jnp.dtype``, or is one that JAX arrays cannot hold (``str``,
            ``object``, bytes, datetimes).
    """
    if dtype is None:
        return None
    if not isinstance(dtype, (type, np.dtype, str)) and hasattr(dtype, "dtype"):
        what = (
            f"NamedArray({format_axes(dtype.axes)})"
            if isinstance(dtype, NamedArray)
            else describe_operand(dtype)
        )
        raise NamedTypeError(
            f"{caller}(): dtype= needs a dtype, got {what}. Pass a dtype such as jnp.float32, "
            "or that value's own: dtype=x.dtype."
        )
    try:
        resolved = jnp.dtype(dtype)
    except TypeError:
        raise NamedTypeError(
            f"{caller}(): {dtype!r} is not a dtype. Pass a dtype such as jnp.float32, jnp.int32 "
            "or 'bfloat16'."
        ) from None
    if not (jnp.issubdtype(resolved, jnp.number) or jnp.issubdtype(resolved, jnp.bool_)):
        raise NamedTypeError(
            f"{caller}(): {dtype!r} ({resolved}) is not a numeric or bool dtype, which JAX arrays "
            "hold. Pass a dtype such as jnp.float32, jnp.int32 or 'bfloat16'."
        )
    return dtype


# -- the table --------------------------------------------------------------------------------

#: Every lifted elementwise op by public name: ``(jax function, arity, example domain)``.
ELEMENTWISE_OPS: dict[str, tuple[Callable[..., Any], int, str]] = {}

_PARAMS = {1: ("x",), 2: ("x1", "x2"), 3: ("condition", "x", "y")}
# Example inputs per domain, used in the generated docstrings.
_EXAMPLE_DATA = {
    "real": "jnp.ones({shape})",
    "int": "jnp.ones({shape}, dtype=jnp.int32)",
    "bool": "jnp.ones({shape}, dtype=bool)",
}


def _source_name(fn: Callable[..., Any]) -> str:
    """Where ``fn`` lives in JAX's public API, for the generated docstring."""
    name = getattr(fn, "__name__", repr(fn))
    namespaces = (
        ("jnp", jnp),
        ("jax.nn", jax.nn),
        ("jax.lax", jax.lax),
        ("jax.scipy.special", jsp),
    )
    for label, namespace in namespaces:
        if getattr(namespace, name, None) is fn:
            return f"{label}.{name}"
    return name


def _example(name: str, arity: int, domain: str) -> str:
    def data(shape: str, dom: str) -> str:
        return _EXAMPLE_DATA[dom].format(shape=shape)

    lines = [">>> import jax.numpy as jnp", ">>> import namedaxes as na"]
    if arity == 1:
        lines += [
            f'>>> x = na.named({data("(2, 3)", domain)}, ("batch", "embed"))',
            f">>> na.{name}(x).axis_names",
            "('batch', 'embed')",
        ]
    elif arity == 2:
        lines += [
            f'>>> x = na.named({data("(2, 3)", domain)}, ("batch", "embed"))',
            f'>>> y = na.named({data("(4, 3)", domain)}, ("mlp", "embed"))',
            f">>> na.{name}(x, y).axis_names  # by name: x's axes, then y's new ones",
            "('batch', 'embed', 'mlp')",
        ]
    else:
        lines += [
            f'>>> c = na.named({data("(3,)", "bool")}, ("embed",))',
            f'>>> x = na.named({data("(2, 3)", domain)}, ("batch", "embed"))',
            f">>> na.{name}(c, x, 0.0).axis_names  # x has every axis: its order is kept",
            "('batch', 'embed')",
        ]
    return "\n".join("        " + line for line in lines)


def _lift(
    name: str, fn: Callable[..., Any], arity: int, domain: str = "real"
) -> Callable[..., NamedArray]:
    """Build the named version of ``fn`` (``arity`` broadcast operands, keywords passed through)."""
    params = _PARAMS[arity]

    def op(*operands: Any, **kwargs: Any) -> NamedArray:
        if len(operands) != arity:
            raise NamedTypeError(
                f"{name}() takes {arity} operand(s) ({', '.join(params)}), got {len(operands)}."
            )
        return lift_call(name, fn, operands, params, **kwargs)

    source = _source_name(fn)
    if arity == 1:
        what = f"``{source}`` applied to each element; the result keeps ``x``'s axes."
        args = "        x: A NamedArray, a Python scalar or a 0-d array.\n"
    else:
        what = (
            f"``{source}`` elementwise, broadcasting by name: when an operand has every axis of "
            "the result, the result keeps the first such operand's axis order; otherwise it has "
            "the first operand's axes, then each later operand's new axes, in order. Scalars and "
            "0-d arrays broadcast to everything."
        )
        args = "".join(
            f"        {p}: A NamedArray, a Python scalar or a 0-d array.\n" for p in params
        )
    size_error = (
        ""
        if arity == 1
        else "        AxisSizeError: if an axis name has two sizes among the operands.\n"
    )
    op.__doc__ = (
        f"Named ``{name}``: {what}\n\n"
        f"    Args:\n{args}        **kwargs: Passed to ``{source}`` unchanged.\n\n"
        "    Returns:\n        A NamedArray.\n\n"
        f"    Raises:\n{size_error}"
        "        NamedTypeError: if an operand is a plain array with dimensions (wrap it with\n"
        "            ``named``), or a keyword is a NamedArray (keywords take scalars).\n\n"
        f"    Example:\n{_example(name, arity, domain)}\n"
    )
    op.__name__ = op.__qualname__ = name
    op.__module__ = "namedaxes"
    op.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(p, inspect.Parameter.POSITIONAL_ONLY) for p in params]
        + [inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)],
        return_annotation=NamedArray,
    )
    ELEMENTWISE_OPS[name] = (fn, arity, domain)
    return op


# Unary, real-valued.
abs = _lift("abs", jnp.abs, 1)  # noqa: A001 - mirrors jnp.abs
absolute = _lift("absolute", jnp.absolute, 1)
negative = _lift("negative", jnp.negative, 1)
positive = _lift("positive", jnp.positive, 1)
sign = _lift("sign", jnp.sign, 1)
exp = _lift("exp", jnp.exp, 1)
exp2 = _lift("exp2", jnp.exp2, 1)
expm1 = _lift("expm1", jnp.expm1, 1)
log = _lift("log", jnp.log, 1)
log1p = _lift("log1p", jnp.log1p, 1)
log2 = _lift("log2", jnp.log2, 1)
log10 = _lift("log10", jnp.log10, 1)
sqrt = _lift("sqrt", jnp.sqrt, 1)
rsqrt = _lift("rsqrt", jax.lax.rsqrt, 1)
cbrt = _lift("cbrt", jnp.cbrt, 1)
square = _lift("square", jnp.square, 1)
reciprocal = _lift("reciprocal", jnp.reciprocal, 1)
sin = _lift("sin", jnp.sin, 1)
cos = _lift("cos", jnp.cos, 1)
tan = _lift("tan", jnp.tan, 1)
arcsin = _lift("arcsin", jnp.arcsin, 1)
arccos = _lift("arccos", jnp.arccos, 1)
arctan = _lift("arctan", jnp.arctan, 1)
sinh = _lift("sinh", jnp.sinh, 1)
cosh = _lift("cosh", jnp.cosh, 1)
tanh = _lift("tanh", jnp.tanh, 1)
arcsinh = _lift("arcsinh", jnp.arcsinh, 1)
arccosh = _lift("arccosh", jnp.arccosh, 1)
arctanh = _lift("arctanh", jnp.arctanh, 1)
deg2rad = _lift("deg2rad", jnp.deg2rad, 1)
rad2deg = _lift("rad2deg", jnp.rad2deg, 1)
sinc = _lift("sinc", jnp.sinc, 1)
floor = _lift("floor", jnp.floor, 1)
ceil = _lift("ceil", jnp.ceil, 1)
trunc = _lift("trunc", jnp.trunc, 1)
rint = _lift("rint", jnp.rint, 1)
round = _lift("round", jnp.round, 1)  # noqa: A001 - mirrors jnp.round (decimals= passes through)
isnan = _lift("isnan", jnp.isnan, 1)
isfinite = _lift("isfinite", jnp.isfinite, 1)
isinf = _lift("isinf", jnp.isinf, 1)
signbit = _lift("signbit", jnp.signbit, 1)
nan_to_num = _lift("nan_to_num", jnp.nan_to_num, 1)
real = _lift("real", jnp.real, 1)
imag = _lift("imag", jnp.imag, 1)
conj = _lift("conj", jnp.conj, 1)
angle = _lift("angle", jnp.angle, 1)
erf = _lift("erf", jsp.erf, 1)
erfinv = _lift("erfinv", jsp.erfinv, 1)
# Unary activations from jax.nn.
sigmoid = _lift("sigmoid", jax.nn.sigmoid, 1)
log_sigmoid = _lift("log_sigmoid", jax.nn.log_sigmoid, 1)
relu = _lift("relu", jax.nn.relu, 1)
relu6 = _lift("relu6", jax.nn.relu6, 1)
gelu = _lift("gelu", jax.nn.gelu, 1)
silu = _lift("silu", jax.nn.silu, 1)
softplus = _lift("softplus", jax.nn.softplus, 1)
elu = _lift("elu", jax.nn.elu, 1)
celu = _lift("celu", jax.nn.celu, 1)
selu = _lift("selu", jax.nn.selu, 1)
leaky_relu = _lift("leaky_relu", jax.nn.leaky_relu, 1)
mish = _lift("mish", jax.nn.mish, 1)
hard_tanh = _lift("hard_tanh", jax.nn.hard_tanh, 1)
hard_sigmoid = _lift("hard_sigmoid", jax.nn.hard_sigmoid, 1)
hard_swish = _lift("hard_swish", jax.nn.hard_swish, 1)
# Unary, boolean and integer.
logical_not = _lift("logical_not", jnp.logical_not, 1, "bool")
bitwise_not = _lift("bitwise_not", jnp.bitwise_not, 1, "int")
invert = _lift("invert", jnp.invert, 1, "int")

# Binary arithmetic.
add = _lift("add", jnp.add, 2)
subtract = _lift("subtract", jnp.subtract, 2)
multiply = _lift("multiply", jnp.multiply, 2)
divide = _lift("divide", jnp.divide, 2)
true_divide = _lift("true_divide", jnp.true_divide, 2)
floor_divide = _lift("floor_divide", jnp.floor_divide, 2)
mod = _lift("mod", jnp.mod, 2)
remainder = _lift("remainder", jnp.remainder, 2)
power = _lift("power", jnp.power, 2)
float_power = _lift("float_power", jnp.float_power, 2)
maximum = _lift("maximum", jnp.maximum, 2)
minimum = _lift("minimum", jnp.minimum, 2)
fmax = _lift("fmax", jnp.fmax, 2)
fmin = _lift("fmin", jnp.fmin, 2)
arctan2 = _lift("arctan2", jnp.arctan2, 2)
hypot = _lift("hypot", jnp.hypot, 2)
logaddexp = _lift("logaddexp", jnp.logaddexp, 2)
logaddexp2 = _lift("logaddexp2", jnp.logaddexp2, 2)
copysign = _lift("copysign", jnp.copysign, 2)
# Binary comparisons.
equal = _lift("equal", jnp.equal, 2)
not_equal = _lift("not_equal", jnp.not_equal, 2)
less = _lift("less", jnp.less, 2)
less_equal = _lift("less_equal", jnp.less_equal, 2)
greater = _lift("greater", jnp.greater, 2)
greater_equal = _lift("greater_equal", jnp.greater_equal, 2)
isclose = _lift("isclose", jnp.isclose, 2)
# Binary, boolean and integer.
logical_and = _lift("logical_and", jnp.logical_and, 2, "bool")
logical_or = _lift("logical_or", jnp.logical_or, 2, "bool")
logical_xor = _lift("logical_xor", jnp.logical_xor, 2, "bool")
bitwise_and = _lift("bitwise_and", jnp.bitwise_and, 2, "int")
bitwise_or = _lift("bitwise_or", jnp.bitwise_or, 2, "int")
bitwise_xor = _lift("bitwise_xor", jnp.bitwise_xor, 2, "int")
left_shift = _lift("left_shift", jnp.left_shift, 2, "int")
right_shift = _lift("right_shift", jnp.right_shift, 2, "int")
gcd = _lift("gcd", jnp.gcd, 2, "int")
lcm = _lift("lcm", jnp.lcm, 2, "int")
# Ternary.
# The three-operand form of ``namedaxes.where`` (``_ops.sets.where`` adds the ``size=`` form).
where3 = _lift("where", jnp.where, 3)


def clip(x: Any, min: Any = None, max: Any = None) -> NamedArray:  # noqa: A002 - jnp's names
    """Named ``jnp.clip``: limit ``x`` to ``[min, max]``; either bound may be ``None``.

    ``x``, ``min`` and ``max`` broadcast by name like every elementwise op (the result keeps the
    axis order of the first of them that has every result axis; otherwise ``x``'s axes, then the
    bounds' new axes).

    Args:
        x: A NamedArray or scalar.
        min: Lower bound: a NamedArray, a scalar, or ``None`` for no bound.
        max: Upper bound: a NamedArray, a scalar, or ``None`` for no bound.

    Returns:
        A NamedArray.

    Raises:
        AxisSizeError: if an axis name has different sizes in two operands.
        NamedTypeError: if an operand is a plain array with dimensions.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> x = na.named(jnp.array([-2.0, 0.5, 3.0]), "embed")
        >>> na.clip(x, 0.0, 1.0).array
        Array([0. , 0.5, 1. ], dtype=float32)
    """

    def _clip(a: Any, lo: Any, hi: Any) -> Any:
        return jnp.clip(a, min=lo, max=hi)

    return lift_call("clip", _clip, (x, min, max), ("x", "min", "max"))


def astype(x: NamedArray, dtype: Any) -> NamedArray:
    """Cast ``x`` to ``dtype``, keeping its axes (also available as ``x.astype(dtype)``).

    Args:
        x: A NamedArray.
        dtype: The new element type.

    Returns:
        A NamedArray with the same axes.

    Raises:
        NamedTypeError: if ``x`` is not a NamedArray or ``dtype`` is not a numeric or bool dtype
            (``None`` included: it names no type).

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> na.named(jnp.ones(3), "embed").astype(jnp.bfloat16)
        NamedArray(bfloat16, embed=3)
    """
    x = expect_named(x, "astype")
    if dtype is None:  # jnp would read None as its default float type: a silent cast
        raise NamedTypeError(
            f"astype() needs a dtype, got None. Pass the type to cast NamedArray("
            f"{format_axes(x.axes)}) to, such as jnp.float32, jnp.int32 or 'bfloat16'."
        )
    return NamedArray(x.array.astype(canonical_dtype(dtype, caller="astype")), x.axes)
