"""A mypy plugin that reads ``NamedArray["batch embed"]`` annotations as ``NamedArray``.

mypy reads ``X[...]`` in an annotation as the type arguments of a generic class, so without help it
rejects ``NamedArray["batch embed"]`` (a ``__class_getitem__`` does not change that; pyright needs no
plugin). With this plugin, mypy reads ``NamedArray["..."]`` and ``NamedArray["...", dtype]`` as
``NamedArray`` and checks them as the runtime does: a string of axis names (no name twice, at most
one ``...``), and a dtype as the second argument: not a number or bytes, and a string only when it
names a dtype (``"float32"``, not ``"embed"``).
Enable it in ``pyproject.toml``::

    [tool.mypy]
    plugins = ["namedaxes.mypy_plugin"]

One limit of mypy remains: in a function signature it looks a string holding a single bare name
(``NamedArray["embed"]``) up as a type before plugins run, and reports ``Name "embed" is not
defined``. Write one axis there as ``NamedArray["embed,"]`` (names may be separated by commas).

The plugin reads annotations only: mypy rejects ``NamedArray["batch embed"]`` as an expression,
as in ``isinstance(x, NamedArray["batch embed"])`` (``"type[NamedArray]" is not generic and not
indexable``; pyright accepts it). There, annotate a parameter of a function decorated with
``check_axes`` instead, or end that line with ``# type: ignore[misc]``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._errors import NamedTypeError
from ._typing import parse_axes

__all__ = ["plugin"]

_NAMED_ARRAY = "namedaxes._array.NamedArray"
_USAGE = (
    "NamedArray[...] takes a string of axis names and optionally a dtype, e.g. "
    'NamedArray["batch embed"] or NamedArray["batch embed", jnp.float32]'
)


def _axis_string(arg: Any) -> str | None:
    """The text of a string type argument as mypy parsed it, or ``None`` if it is not a string."""
    from mypy.types import RawExpressionType, UnboundType

    if isinstance(arg, RawExpressionType) and arg.base_type_name == "builtins.str":
        return arg.literal_value  # "batch embed": not a valid type expression (b"..." is bytes)
    if isinstance(arg, UnboundType) and arg.original_str_expr is not None:
        return arg.original_str_expr  # "embed": parsed as a forward reference to a name
    return None


def _analyze_named_array(ctx: Any) -> Any:
    """``NamedArray[...]`` in an annotation: check it as the runtime does, give plain ``NamedArray``."""
    from mypy.errorcodes import ErrorCode
    from mypy.types import RawExpressionType

    code = ErrorCode("named-axes", "Check NamedArray[...] annotations", "namedaxes")
    args = ctx.type.args
    spec = _axis_string(args[0]) if args else None
    if ctx.type.empty_tuple_index or (args and (spec is None or len(args) > 2)):
        # NamedArray[()] has no args, as a bare NamedArray, but is not one.
        ctx.api.fail(_USAGE, ctx.context, code=code)
        return ctx.api.named_type(_NAMED_ARRAY, [])
    if spec is not None:
        try:
            parse_axes(spec)
        except NamedTypeError as e:
            ctx.api.fail(str(e), ctx.context, code=code)
    dtype = args[1] if len(args) == 2 else None
    name = _axis_string(dtype) if dtype is not None else None
    if name is not None:  # a dtype's name: read as the runtime reads it
        problem = _dtype_name_problem(spec, name)
        if problem is not None:
            ctx.api.fail(problem, ctx.context, code=code)
    elif isinstance(dtype, RawExpressionType):  # a number, a bool or bytes where the dtype goes
        ctx.api.fail(
            f"NamedArray[{spec!r}, {_shown(dtype)}]: the second argument must be a dtype "
            "or dtype category (e.g. jnp.float32, jnp.floating, jnp.integer)",
            ctx.context,
            code=code,
        )
    return ctx.api.named_type(_NAMED_ARRAY, [])


def _dtype_name_problem(spec: str | None, name: str) -> str | None:
    """The runtime's error for ``NamedArray[spec, name]`` with a string dtype (``"float32"``,
    ``"bfloat16"``; ``"embed"`` is none), or ``None`` when the runtime accepts it: the same test
    (``jnp.issubdtype``) and the same message as ``NamedArray.__class_getitem__``."""
    import jax.numpy as jnp

    try:
        jnp.issubdtype(jnp.float32, name)
    except TypeError:
        return (
            f"NamedArray[{spec!r}, {name!r}]: {name!r} is not a dtype or dtype category (e.g. "
            "jnp.float32, jnp.floating, jnp.integer)."
        )
    return None


def _shown(arg: Any) -> str:
    """A literal as written, where mypy kept its value (ints, bools, bytes). mypy keeps none for
    other expressions (a float such as ``3.5`` included, which it reads as any invalid type
    expression): those show as ``<expression>``, not as ``None``."""
    if arg.base_type_name == "builtins.bytes":
        return f"b{arg.literal_value!r}"
    if arg.literal_value is None:
        return "<expression>"
    return repr(arg.literal_value)


def plugin(version: str) -> type:
    """mypy's entry point: the plugin class (mypy calls this with its version string).

    Example:
        >>> plugin("1.10.0").__name__
        'NamedAxesPlugin'
    """
    from mypy.plugin import Plugin

    class NamedAxesPlugin(Plugin):
        def get_type_analyze_hook(self, fullname: str) -> Callable[[Any], Any] | None:
            return _analyze_named_array if fullname == _NAMED_ARRAY else None

    return NamedAxesPlugin
