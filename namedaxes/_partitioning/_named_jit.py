"""``named_jit`` and ``fsdp``: the decorators. They check their options when applied and return a
``NamedJitWrapped`` (``_jit``), typed so that the wrapped function keeps its signature."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypeVar, overload

from .._errors import NamedTypeError, format_names
from .._logical._rules import AxisRules, RulesLike, as_rules
from ._jit import NamedJitWrapped
from ._jit_args import JIT_OPTIONS, RESERVED_JIT_KWARGS

__all__ = ["fsdp", "named_jit"]

P = ParamSpec("P")
R = TypeVar("R")


@overload
def named_jit(
    fn: Callable[P, R],
    axis_resources: RulesLike | None = None,
    *,
    in_axis_resources: RulesLike | None = None,
    out_axis_resources: RulesLike | None = None,
    donate_args: Any = None,
    donate_kwargs: Any = None,
    strict: bool = False,
    **jit_kwargs: Any,
) -> NamedJitWrapped[P, R]: ...


@overload
def named_jit(
    fn: None = None,
    axis_resources: RulesLike | None = None,
    *,
    in_axis_resources: RulesLike | None = None,
    out_axis_resources: RulesLike | None = None,
    donate_args: Any = None,
    donate_kwargs: Any = None,
    strict: bool = False,
    **jit_kwargs: Any,
) -> Callable[[Callable[P, R]], NamedJitWrapped[P, R]]: ...


def named_jit(
    fn: Callable[P, R] | None = None,
    axis_resources: RulesLike | None = None,
    *,
    in_axis_resources: RulesLike | None = None,
    out_axis_resources: RulesLike | None = None,
    donate_args: Any = None,
    donate_kwargs: Any = None,
    strict: bool = False,
    **jit_kwargs: Any,
) -> NamedJitWrapped[P, R] | Callable[[Callable[P, R]], NamedJitWrapped[P, R]]:
    """``jax.jit`` for functions of pytrees with NamedArrays, with a mapping in force while tracing.

    Array leaves of the arguments are traced; every other leaf is static (hashed by value where
    possible), as with ``eqx.filter_jit``. Non-array outputs are returned as they are.

    - ``axis_resources`` (default: the ``axis_mapping`` in force at call time) is in force while
      tracing, so ``shard``/``auto_sharded`` inside the function use it.
    - Named outputs are placed by ``out_axis_resources`` (default ``axis_resources``).
    - With ``in_axis_resources``, named inputs are first placed by it (an argument committed with
      another sharding, or on another mesh, is moved). Without it, named inputs not placed yet
      (NumPy, uncommitted arrays) are placed by the mapping in force; those already on the mesh
      stay where they are, and one committed elsewhere (another mesh, one device) is refused.
      Plain-array inputs and outputs keep their own shardings.
    - The mesh is the one set with ``jax.set_mesh`` at call time, else the arguments' mesh.
    - One trace per distinct call signature, which includes the mapping and the mesh.
    - ``strict=True`` refuses, when tracing, a mapping entry that names no axis of the arguments
      or outputs (a typo, or ``{"heads": ...}`` for a model whose axes are ``kv_heads`` and
      ``q_per_kv``); entries meant only for intermediate values need ``strict=False``. Cached
      calls pay nothing for it.

    Args:
        fn: The function; omit to get a decorator.
        axis_resources: Mapping or ``AxisRules`` in force while tracing.
        in_axis_resources: Mapping used to place named inputs before the call.
        out_axis_resources: Mapping used to place named outputs.
        donate_args: A pytree prefix of the positional arguments of bools (or ``leaf -> bool``,
            asked on every call).
        donate_kwargs: The same for keyword arguments.
        strict: Raise ``UnmatchedMappingError`` for mapping entries that match no axis of the
            arguments or outputs (checked once per trace).
        **jit_kwargs: Passed to ``jax.jit`` (``keep_unused``, ``inline``, ``compiler_options``...).

    Returns:
        The wrapped function, with ``fn``'s signature (or a decorator when ``fn`` is omitted).

    Raises:
        NamedTypeError: if ``fn`` is not callable, or a ``jax.jit`` option that ``named_jit``
            manages itself (``in_shardings``, ``static_argnums``, ...) is passed.
        ShardingError: when called, for a named input committed off the mesh (without
            ``in_axis_resources``), or one the mapping cannot place.
        UnmatchedMappingError: with ``strict=True``, when called (traced) with a mapping entry
            that matches nothing.

    Example:
        >>> import jax.numpy as jnp
        >>> from namedaxes import named
        >>> @named_jit
        ... def double(x):
        ...     return named(x.array * 2, x.axes)
        >>> double(named(jnp.ones(3), "a")).array
        Array([2., 2., 2.], dtype=float32)
    """
    unknown = sorted(k for k in jit_kwargs if k not in JIT_OPTIONS)
    if unknown:
        raise NamedTypeError(
            f"named_jit got unknown option {format_names(unknown)}. It accepts axis_resources, "
            "in_axis_resources, out_axis_resources, donate_args, donate_kwargs and jax.jit's "
            f"options ({format_names(sorted(JIT_OPTIONS - set(RESERVED_JIT_KWARGS)))})."
        )
    bad = [k for k in RESERVED_JIT_KWARGS if k in jit_kwargs]
    if bad:
        raise NamedTypeError(
            f"named_jit manages {', '.join(bad)} itself. Use in_axis_resources/out_axis_resources "
            "for placement, donate_args/donate_kwargs for donation; non-array arguments are "
            "static automatically."
        )
    for value in (axis_resources, in_axis_resources, out_axis_resources):
        if value is not None:
            as_rules(value)  # validate at decoration time

    def wrap(f: Callable[P, R]) -> NamedJitWrapped[P, R]:
        if not callable(f):
            raise NamedTypeError(
                f"named_jit expects a function, got {f!r} ({type(f).__name__}). To pass a mapping "
                "use the keyword: named_jit(fn, axis_resources={...}) or "
                "@named_jit(axis_resources={...})."
            )
        return NamedJitWrapped(
            f,
            axis_resources,
            in_axis_resources,
            out_axis_resources,
            donate_args,
            donate_kwargs,
            jit_kwargs,
            strict=strict,
        )

    if fn is None:
        return wrap
    return wrap(fn)  # type: ignore[arg-type]


@overload
def fsdp(
    fn: Callable[P, R],
    parameter_mapping: RulesLike,
    compute_mapping: RulesLike,
    *,
    strict: bool = False,
    **jit_kwargs: Any,
) -> NamedJitWrapped[P, R]: ...


@overload
def fsdp(
    fn: None = None,
    *,
    parameter_mapping: RulesLike,
    compute_mapping: RulesLike,
    strict: bool = False,
    **jit_kwargs: Any,
) -> Callable[[Callable[P, R]], NamedJitWrapped[P, R]]: ...


@overload
def fsdp(
    fn: AxisRules | Mapping[str, Any] | list[Any],
    parameter_mapping: RulesLike,
    compute_mapping: None = None,
    *,
    strict: bool = False,
    **jit_kwargs: Any,
) -> Callable[[Callable[P, R]], NamedJitWrapped[P, R]]: ...


def fsdp(
    fn: Callable[P, R] | AxisRules | Mapping[str, Any] | list[Any] | None = None,
    parameter_mapping: RulesLike | None = None,
    compute_mapping: RulesLike | None = None,
    *,
    strict: bool = False,
    **jit_kwargs: Any,
) -> NamedJitWrapped[P, R] | Callable[[Callable[P, R]], NamedJitWrapped[P, R]]:
    """``named_jit`` for the FSDP pattern: parameters stored by ``parameter_mapping``, the body
    computed under ``compute_mapping``.

    Placement rule: ``fn``'s **first parameter** holds the parameters (a model, or a
    ``(model, optimizer_state)`` tuple), passed by position or by keyword, and its named leaves
    are placed by ``parameter_mapping``.
    Named leaves of the **other arguments** (optimizer state, the batch, ...) that are already on
    the mesh are used where they are (optimizer state held by the parameter mapping stays put, a
    batch sharded over ``data`` stays sharded); those not on the mesh yet are placed by
    ``compute_mapping``. Named **outputs** are placed by their structure: a returned subtree with
    the tree structure of the parameters (or, when that is a tuple or list, of one of its
    elements), axis names and sizes included, is parameters (the updated model, gradients,
    optax's ``mu``/``nu``) and is placed by ``parameter_mapping``; every other named output
    (logits, per-token losses, metrics) by ``compute_mapping``, so activations stay sharded over
    the batch. Cached calls take ``named_jit``'s fast path.

    Args:
        fn: The function; omit to get a decorator.
        parameter_mapping: How parameters (and returned parameters/gradients/updates) are held.
        compute_mapping: The mapping in force while the body runs, for non-parameter inputs, and
            for outputs that are not shaped like the parameters.
        strict: Raise ``UnmatchedMappingError`` (once per trace) for an entry of
            ``parameter_mapping`` that matches no axis of the parameters, or of
            ``compute_mapping`` that matches no axis of the arguments or outputs.
        **jit_kwargs: Passed on to ``named_jit`` (``donate_args=``, ...).

    Raises:
        NamedTypeError: if a mapping is missing or ``fn`` is not callable; when called with
            keyword arguments only and ``fn``'s first parameter cannot be passed by keyword.
        UnmatchedMappingError: with ``strict=True``, as above.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from namedaxes import named
        >>> step = fsdp(lambda w, x: w, {"embed": "data"}, {"batch": "data"})
        >>> with jax.set_mesh(jax.make_mesh((1,), ("data",))):
        ...     step(named(jnp.ones(4), "embed"), named(jnp.ones(2), "batch")).array.sharding.spec
        P('data',)
    """
    if isinstance(fn, (Mapping, AxisRules, list)) and compute_mapping is None:
        # fsdp(parameter_mapping, compute_mapping) used as a decorator factory
        fn, parameter_mapping, compute_mapping = None, fn, parameter_mapping
    if parameter_mapping is None or compute_mapping is None:
        raise NamedTypeError(
            "fsdp needs parameter_mapping and compute_mapping, e.g. "
            "fsdp(step, parameter_mapping={'embed': 'data'}, compute_mapping={'batch': 'data'})."
        )
    for key in ("axis_resources", "in_axis_resources", "out_axis_resources"):
        if key in jit_kwargs:
            raise NamedTypeError(
                f"fsdp sets {key} itself from parameter_mapping and compute_mapping; use "
                "named_jit directly for other placements."
            )
    named_jit(lambda: None, **jit_kwargs)  # validate the options now (unknown ones are refused)
    as_rules(parameter_mapping), as_rules(compute_mapping)

    def wrap(f: Callable[P, R]) -> NamedJitWrapped[P, R]:
        if not callable(f):
            raise NamedTypeError(f"fsdp expects a function, got {f!r} ({type(f).__name__}).")
        donate_args = jit_kwargs.get("donate_args")
        donate_kwargs = jit_kwargs.get("donate_kwargs")
        rest = {k: v for k, v in jit_kwargs.items() if k not in ("donate_args", "donate_kwargs")}
        return NamedJitWrapped(
            f,
            compute_mapping,
            parameter_mapping,
            parameter_mapping,
            donate_args,
            donate_kwargs,
            rest,
            in_rules_rest=compute_mapping,
            strict=strict,
        )

    if fn is None:
        return wrap
    return wrap(fn)  # type: ignore[arg-type]
