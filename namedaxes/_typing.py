"""Axis-aware annotations: ``NamedArray["batch embed"]`` and the ``check_axes`` decorator.

``NamedArray["batch embed"]`` is a class whose ``isinstance`` check passes for NamedArrays with
exactly the axes ``batch`` and ``embed``, in any order (named ops never depend on axis order, so
the annotation does not either). ``...`` allows further axes: ``NamedArray["batch ..."]``. An
optional second item constrains the dtype with ``jnp.issubdtype``, so both exact types and
categories work: ``NamedArray["batch embed", jnp.floating]``; Python's ``float``, ``int``,
``complex`` and ``bool`` stand for ``jnp.floating``, ``jnp.integer``, ``jnp.complexfloating`` and
``jnp.bool_`` (jaxtyping's convention), so ``NamedArray["batch", float]`` accepts float32. Because the check is a plain
``isinstance``, runtime checkers that use ``isinstance`` (beartype, typeguard) understand it too.

Static checkers see ``NamedArray["..."]`` as ``NamedArray``: pyright accepts the subscript because
``NamedArray`` declares ``__class_getitem__``; mypy needs the ``namedaxes.mypy_plugin`` plugin.

This module sits below ``_array``: ``NamedArray.__class_getitem__`` passes the class in, and the
annotation classes keep it as their base.
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

import jax.numpy as jnp
import numpy as np

from ._errors import AxisSizeError, NamedTypeError, format_axes, format_names

__all__ = ["annotation_class", "check_axes", "parse_axes"]

F = TypeVar("F", bound=Callable[..., Any])


class _AxesMeta(type):
    """Metaclass of the annotation classes: ``isinstance`` checks axis names (and dtype)."""

    _base: type  # NamedArray
    _names: frozenset[str]
    _extra_ok: bool
    _dtype: Any
    _spec: str

    def __instancecheck__(cls, x: Any) -> bool:
        return _mismatch(cls, x) is None

    def __repr__(cls) -> str:
        dtype = "" if cls._dtype is None else f", {_dtype_name(cls._dtype)}"
        return f"NamedArray[{cls._spec!r}{dtype}]"


def _dtype_name(dtype: Any) -> str:
    return getattr(dtype, "__name__", None) or str(np.dtype(dtype))


def _mismatch(ann: _AxesMeta, x: Any) -> str | None:
    """Why ``x`` does not match ``ann``, or ``None`` when it does."""
    if not isinstance(x, ann._base):
        return "not a NamedArray (name its axes with named(x, (...)))"
    have = set(x.axis_names)
    problems = []
    missing = [n for n in sorted(ann._names) if n not in have]
    if missing:
        problems.append(f"missing axes {format_names(missing)}")
    if not ann._extra_ok:
        extra = [n for n in x.axis_names if n not in ann._names]
        if extra:
            problems.append(
                f"unexpected axes {format_names(extra)} (add '...' to allow extra axes)"
            )
    if ann._dtype is not None:
        dtype = getattr(x.array, "dtype", None)
        if dtype is not None and not jnp.issubdtype(dtype, ann._dtype):
            # str(), not np.dtype(): typed PRNG keys (key<fry>) are not NumPy dtypes.
            problems.append(f"dtype {dtype} is not {_dtype_name(ann._dtype)}")
    return "; ".join(problems) or None


def parse_axes(spec: str) -> tuple[tuple[str, ...], bool]:
    """The axis names of an annotation string, and whether it allows extra axes (has ``...``).

    Names are separated by spaces or commas, so ``"embed,"`` is the one axis ``embed`` (the form
    that mypy accepts for a single axis in a function signature; see ``namedaxes.mypy_plugin``).

    Raises:
        NamedTypeError: if ``...`` appears more than once or a name repeats.

    Example:
        >>> parse_axes("batch ... embed"), parse_axes("embed,")
        ((('batch', 'embed'), True), (('embed',), False))
    """
    tokens = spec.replace(",", " ").split()
    names = tuple(t for t in tokens if t != "...")
    if len(tokens) - len(names) > 1:
        raise NamedTypeError(f"NamedArray[{spec!r}] has more than one '...'; use it at most once.")
    if len(set(names)) != len(names):
        dups = sorted({n for n in names if names.count(n) > 1})
        raise NamedTypeError(f"NamedArray[{spec!r}] names {format_names(dups)} more than once.")
    return names, len(names) != len(tokens)


@functools.cache
def _annotation(base: type, spec: str, dtype: Any) -> _AxesMeta:
    names, extra_ok = parse_axes(spec)

    def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
        raise NamedTypeError(
            f"{cls!r} is an annotation; create arrays with NamedArray(array, axes) or named()."
        )

    namespace = {
        "__slots__": (),
        "__new__": __new__,
        "__module__": "namedaxes",
        "_base": base,
        "_names": frozenset(names),
        "_extra_ok": extra_ok,
        "_dtype": dtype,
        "_spec": spec,
    }
    return _AxesMeta(f"NamedArray[{spec!r}]", (base,), namespace)


_PYTHON_DTYPES: dict[type, Any] = {
    bool: jnp.bool_,
    int: jnp.integer,
    float: jnp.floating,
    complex: jnp.complexfloating,
}


def annotation_class(cls: type, item: Any) -> _AxesMeta:
    """``NamedArray["batch embed"]`` or ``NamedArray["batch embed", dtype]`` (``cls[item]``).

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> ann = na.NamedArray["batch embed", jnp.floating]
        >>> ann, isinstance(na.named(jnp.ones((2, 3)), ("embed", "batch")), ann)
        (NamedArray['batch embed', floating], True)
    """
    if isinstance(cls, _AxesMeta):
        raise NamedTypeError(f"{cls!r} already names its axes; subscript NamedArray itself.")
    spec, dtype = item if isinstance(item, tuple) and len(item) == 2 else (item, None)
    if not isinstance(spec, str):
        raise NamedTypeError(
            f"NamedArray[...] takes a string of axis names, optionally with a dtype, e.g. "
            f"NamedArray['batch embed'] or NamedArray['batch embed', jnp.float32]; got {item!r}."
        )
    # Python's float/int/complex name categories (jaxtyping's convention): jnp.issubdtype(float32,
    # float) is False unless x64 is on, so `float` would otherwise match nothing by default.
    dtype = _PYTHON_DTYPES.get(dtype, dtype) if isinstance(dtype, type) else dtype
    if dtype is not None:
        try:
            jnp.issubdtype(jnp.float32, dtype)
        except TypeError:
            raise NamedTypeError(
                f"NamedArray[{spec!r}, {dtype!r}]: {dtype!r} is not a dtype or dtype category "
                "(e.g. jnp.float32, jnp.floating, jnp.integer)."
            ) from None
    return _annotation(cls, " ".join(spec.replace(",", " ").split()), dtype)


def _ours(ann: Any) -> list[_AxesMeta]:
    """Annotation classes in ``ann`` itself or in its ``Union``/``Optional`` members."""
    if isinstance(ann, _AxesMeta):
        return [ann]
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(ann) if isinstance(a, _AxesMeta)]
    return []


def _matches(member: Any, value: Any) -> bool:
    if member is type(None):
        return value is None
    try:
        return isinstance(value, member)
    except TypeError:  # a parametrized generic: not ours to judge
        return True


def _describe(value: Any, base: type) -> str:
    if isinstance(value, base):
        return f"NamedArray({format_axes(value.axes)})"
    shape = getattr(value, "shape", None)
    return type(value).__name__ + ("" if shape is None else f" of shape {tuple(shape)}")


def _verify(
    fn_name: str, ann: Any, value: Any, what: str, sizes: dict[str, tuple[int, str]]
) -> None:
    ours = _ours(ann)
    if not ours:
        return
    members = typing.get_args(ann) if not isinstance(ann, _AxesMeta) else (ann,)
    matched = next((m for m in members if _matches(m, value)), None)
    if matched is None:
        got = _describe(value, ours[0]._base)
        reasons = "; or ".join(f"{a!r}: {_mismatch(a, value)}" for a in ours)
        raise NamedTypeError(f"{fn_name}() {what} is {got}, which does not match {reasons}.")
    if isinstance(matched, _AxesMeta):
        for a in value.axes:
            if a.name not in matched._names:
                continue
            seen = sizes.setdefault(a.name, (a.size, what))
            if seen[0] != a.size:
                raise AxisSizeError(
                    f"{fn_name}() axis {a.name!r} has size {a.size} in {what} but size {seen[0]} "
                    f"in {seen[1]}. Axes with one name must have one size within a call."
                )


def _home(fn: Any) -> Any:
    """The plain function whose globals and closure give ``fn``'s string annotations meaning.

    Follows what ``inspect.signature`` follows: partials, bound methods, ``__wrapped__`` and a
    callable object's ``__call__``. ``None`` when there is no such function (a C callable).
    """
    for _ in range(100):  # a bound on odd chains (a __wrapped__ that wraps itself)
        if isinstance(fn, types.FunctionType) and not hasattr(fn, "__wrapped__"):
            return fn
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif isinstance(fn, types.MethodType):
            fn = fn.__func__
        elif hasattr(fn, "__wrapped__"):
            fn = fn.__wrapped__
        elif not isinstance(fn, type) and isinstance(type(fn).__call__, types.FunctionType):
            fn = type(fn).__call__
        else:
            return None
    return None


def _annotations(sig: inspect.Signature) -> dict[str, Any]:
    """The raw annotations of ``sig``'s parameters (by name) and result (``"return"``)."""
    raw = {n: p.annotation for n, p in sig.parameters.items() if p.annotation is not p.empty}
    if sig.return_annotation is not sig.empty:
        raw["return"] = sig.return_annotation
    return raw


def _resolve(name: str, raw: dict[str, Any], home: Any) -> dict[str, Any]:
    """``raw`` with string annotations evaluated, one at a time, where ``home`` was defined.

    A string that does not resolve (a name imported only under ``TYPE_CHECKING``, a class local
    to another function) is skipped, as other annotations are, unless it mentions
    ``NamedArray``: that one was meant to be checked.
    """
    namespace: dict[str, Any] = dict(getattr(home, "__globals__", {}))
    code, cells = getattr(home, "__code__", None), getattr(home, "__closure__", None) or ()
    for var, cell in zip(code.co_freevars if code else (), cells, strict=True):
        try:
            namespace[var] = cell.cell_contents
        except ValueError:  # a nonlocal not assigned yet
            pass
    hints, skipped = {}, []
    for key, ann in raw.items():
        if not isinstance(ann, str):
            hints[key] = ann
            continue
        what = "the result" if key == "return" else f"parameter {key!r}"
        try:
            hints[key] = eval(ann, namespace)  # what typing.get_type_hints does, one by one
        except Exception as e:  # any failure means "cannot resolve"
            skipped.append(f"{ann!r} of {what}")
            if "NamedArray" in ann:
                raise NamedTypeError(
                    f"check_axes() cannot resolve the annotation {ann!r} of {what} of {name}() "
                    f"({type(e).__name__}: {e}). Make the names it uses importable where "
                    f"{name}() is defined (not only under TYPE_CHECKING)."
                ) from None
    if not any(_ours(a) for a in hints.values()):
        raise _nothing_to_check(name, skipped)
    return hints


def _nothing_to_check(name: str, skipped: list[str]) -> NamedTypeError:
    unresolved = f" (annotations it cannot resolve: {', '.join(skipped)})" if skipped else ""
    return NamedTypeError(
        f"check_axes(): {name}() has no NamedArray[...] annotation on its parameters or "
        f"result{unresolved}, so there is nothing to check. Name the axes, e.g. "
        "x: NamedArray['batch embed'], or leave out @check_axes."
    )


def check_axes(fn: F) -> F:
    """Check at call time that arguments and the result match their ``NamedArray[...]`` annotations.

    Parameters (and the return value) annotated with ``NamedArray["..."]`` — directly or inside an
    ``Optional``/``Union`` — are checked with ``isinstance``; other annotations are ignored, even
    ones that cannot be resolved (a name imported only under ``TYPE_CHECKING``). Within one call,
    an axis named in several annotations must have one size everywhere. Checks run when the
    function runs, so under ``jax.jit`` they cost nothing after tracing.

    ``fn`` may be any callable with a signature: a function, a method, a ``functools.partial``,
    or an object with an annotated ``__call__`` (an equinox Module). String annotations (``from
    __future__ import annotations``) are resolved on the first call, so they may name what is
    defined later.

    Args:
        fn: The function to wrap.

    Returns:
        The wrapped function.

    Raises:
        NamedTypeError: if ``fn`` is not a callable with a signature, or none of its parameters
            nor its result is annotated with ``NamedArray[...]`` (for string annotations: on
            the first call); (when called) if an argument or the result has the wrong axes or
            dtype, or an annotation that mentions ``NamedArray`` cannot be resolved.
        AxisSizeError: (when called) if one axis name has two sizes across the checked values.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> @na.check_axes
        ... def project(x: na.NamedArray["batch embed"], w: na.NamedArray["embed mlp"]
        ...             ) -> na.NamedArray["batch mlp"]:
        ...     return na.dot(x, w, axis="embed")
        >>> x = na.named(jnp.ones((2, 3)), ("batch", "embed"))
        >>> project(x, na.named(jnp.ones((3, 4)), ("embed", "mlp")))
        NamedArray(float32, batch=2, mlp=4)
        >>> project(x, na.named(jnp.ones((3, 4)), ("embed", "hidden")))
        Traceback (most recent call last):
        ...
        namedaxes._errors.NamedTypeError: project() argument 'w' is NamedArray(embed=3, hidden=4), which does not match NamedArray['embed mlp']: missing axes 'mlp'; unexpected axes 'hidden' (add '...' to allow extra axes).
    """
    if not callable(fn):
        raise NamedTypeError(
            f"check_axes() decorates a function, got {fn!r} ({type(fn).__name__}). Put "
            "@na.check_axes above a def, or wrap one: na.check_axes(my_function)."
        )
    try:
        sig = inspect.signature(fn)  # unwraps partials, methods and a callable's __call__
    except (TypeError, ValueError):  # builtins and some C callables have none
        raise NamedTypeError(
            f"check_axes() cannot read the signature of {fn!r}, so it has no annotations to check. "
            "Wrap it in a def with NamedArray[...] annotations."
        ) from None
    home = _home(fn)
    name = getattr(fn, "__name__", None) or getattr(home, "__qualname__", type(fn).__name__)
    raw = _annotations(sig)
    # Strings are resolved on the first call; without any, nothing to check is known now.
    if not any(isinstance(a, str) or _ours(a) for a in raw.values()):
        raise _nothing_to_check(name, [])
    hints: dict[str, Any] | None = None

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        nonlocal hints
        if hints is None:  # resolved on first call so forward references can be defined later
            hints = _resolve(name, raw, home)
        bound = sig.bind(*args, **kwargs)
        sizes: dict[str, tuple[int, str]] = {}
        for pname, value in bound.arguments.items():
            if pname not in hints:
                continue
            kind = sig.parameters[pname].kind
            if kind is inspect.Parameter.VAR_POSITIONAL:
                for i, v in enumerate(value):
                    _verify(name, hints[pname], v, f"argument *{pname}[{i}]", sizes)
            elif kind is inspect.Parameter.VAR_KEYWORD:
                for k, v in value.items():
                    _verify(name, hints[pname], v, f"argument {k!r}", sizes)
            else:
                _verify(name, hints[pname], value, f"argument {pname!r}", sizes)
        out = fn(*args, **kwargs)
        if "return" in hints:
            _verify(name, hints["return"], out, "result", sizes)
        return out

    return wrapper  # type: ignore[return-value]
