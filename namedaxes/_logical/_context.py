"""The ``axis_mapping`` context: which rules are in force here.

Isolation design. Ordinary entries live in a ``contextvars.ContextVar`` holding an immutable stack,
so threads and asyncio tasks each see their own (tasks inherit the mapping in force where they were
created, as with any context variable). Context variables alone do not scope *generators*: a
generator runs in whichever context resumes it, so one that enters ``with axis_mapping(...)`` and
yields would leave its mapping visible to its caller. An entry made by a ``with`` statement running
directly in a generator (or async generator) frame is therefore *generator-scoped*: it is kept with
that frame (not in any thread's context) and is visible exactly while the frame executes, i.e. is on
the current call stack, in whichever thread resumes it; closing the generator anywhere removes it.
Generators driven by ``contextlib.contextmanager`` / ``asynccontextmanager`` keep ordinary semantics,
since their purpose is to extend the mapping over the caller's block. (To keep a mapping in force
across a plain generator's ``yield``, as in a pytest fixture, enter it through
``contextlib.ExitStack.enter_context``.)

Only public interfaces are used: ``inspect.currentframe`` and code objects' flags, and the
``contextlib`` wrappers are recognized by the code of their (public) ``__enter__`` methods.

The common case (no generator is suspended inside a mapping) costs one ``ContextVar.get``.

Traces. Code traced by ``jax.jit`` (or ``eqx.filter_jit``) reads the mapping while it is traced, so
the mapping is part of the key JAX caches traces by: a ``jax.make_user_context`` that every ``with``
block (and decorated call) sets to the rules it leaves in force. A function traced under one
mapping is traced again under another, and reused under the first again; equal rules share a
trace. Like JAX's own contexts (``jax.set_mesh``), that key is per thread and follows the ``with``
blocks run in it: a mapping entered inside a plain generator (visible only while it runs) is not
part of it, nor is the switch between asyncio tasks with different mappings in one thread; a
function jitted there should be a ``named_jit``, which keys its programs by the mapping visible at
each call.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any, NamedTuple, TypeVar

import jax

from .._errors import MappingTypeError, ShardingError, with_prefix
from ._rules import AxisRules, MeshAxes, RulesLike, as_rules, merge_rules

__all__ = [
    "axis_mapping",
    "current_axis_mapping",
    "current_mapping_and_rules",
    "current_rules",
    "rules_in_force",
]

_F = TypeVar("_F", bound=Callable[..., Any])
_GEN_FLAGS = inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR
# Bound at import: a generator suspended inside a mapping (decorated, or its own ``with``) is closed
# at interpreter exit, possibly after ``inspect``'s globals are cleared; ``__exit__`` must still run.
_currentframe = inspect.currentframe


def _enter_code(cm_factory: Callable[..., Any], method: str) -> Any:
    """The code object of a ``contextlib`` wrapper's enter method, found through public API."""
    return getattr(type(cm_factory()), method).__code__


@contextlib.contextmanager
def _sync_probe() -> Any:
    yield


@contextlib.asynccontextmanager
async def _async_probe() -> Any:
    yield


# The frames from which contextlib drives a @contextmanager generator into its block.
_CM_ENTER_CODES = frozenset(
    {_enter_code(_sync_probe, "__enter__"), _enter_code(_async_probe, "__aenter__")}
)


class _Pushed(NamedTuple):
    """A mapping put in force by ``with axis_mapping(...)`` (or a decorated call)."""

    value: RulesLike  # what current_axis_mapping() returns (as the user gave it, merged)
    rules: AxisRules  # its normalized form
    frame: FrameType | None  # the frame whose `with` statement pushed it
    pushed_by: object  # the axis_mapping object that pushed it


_EMPTY: tuple[_Pushed, ...] = ()
_STACK: contextvars.ContextVar[tuple[_Pushed, ...]] = contextvars.ContextVar(
    "namedaxes_axis_mapping", default=_EMPTY
)
# Generator-scoped entries, by the id of the generator frame that pushed them (the entry holds the
# frame, so the id stays unique while it is here). Shared by all threads: visibility comes from
# the frame being on the current call stack, whichever thread runs it.
_SCOPED: dict[int, tuple[_Pushed, ...]] = {}
_SCOPED_LOCK = threading.Lock()
# The rules in force, as part of the key jax.jit caches traces by (see "Traces" above).
_TRACE_KEY = jax.make_user_context(None)
# The stack that the innermost neutral_trace_key took out of the key, or None.
_NEUTRAL: contextvars.ContextVar[tuple[_Pushed, ...] | None] = contextvars.ContextVar(
    "namedaxes_neutral_stack", default=None
)


def _set_stack(stack: tuple[_Pushed, ...]) -> None:
    """Make ``stack`` this context's mapping stack, and its top's rules JAX's trace key (none
    while it is the stack a neutral_trace_key took out)."""
    _STACK.set(stack)
    neutral = _NEUTRAL.get()
    if neutral is not None and (stack is neutral or stack == neutral):
        stack = _EMPTY
    # A user context is entered to set its value and left entered: the key follows the stack
    # (whose entries may leave out of order, as with ExitStack), not the order of the blocks.
    _TRACE_KEY(stack[-1].rules if stack else None).__enter__()


def trace_key_is_neutral() -> bool:
    """Whether no mapping is part of JAX's trace key now (the common case: one attribute read)."""
    return _TRACE_KEY.value is None


class neutral_trace_key:
    """A context that takes the mapping out of JAX's trace key: for a wrapper that keys its
    programs by the mapping itself (``named_jit``, one ``jax.jit`` per entry), so that its inner
    ``jax.jit`` is not keyed again by whatever mapping surrounds the call. A mapping entered and
    left inside (the one named_jit traces its function under) is in the key while it is in force
    (for the jitted functions traced inside it) and leaves it neutral again, so that the call
    lowers its program under the same key as ``.lower()`` and finds the same compiled program."""

    __slots__ = ("_key", "_token")

    def __enter__(self) -> None:
        self._token = _NEUTRAL.set(_STACK.get())
        self._key = _TRACE_KEY(None)
        self._key.__enter__()

    def __exit__(self, *exc: object) -> None:
        self._key.__exit__(*exc)
        _NEUTRAL.reset(self._token)


def _visible_entry() -> _Pushed | None:
    stack = _STACK.get()
    if not _SCOPED:
        return stack[-1] if stack else None
    # Slow path (some generator holds a mapping): the innermost entry among the executing frames.
    scoped = _SCOPED
    f = _currentframe()
    f = f.f_back if f is not None else None
    depth = 0
    positions: dict[int, int] = {}
    found: tuple[int, _Pushed] | None = None
    while f is not None:
        key = id(f)
        positions[key] = depth
        if found is None:
            entries = scoped.get(key)
            if entries:
                found = (depth, entries[-1])
        f = f.f_back
        depth += 1
    if not stack:
        return found[1] if found else None
    top = stack[-1]
    # A context entry pushed from a frame no longer on the stack (ExitStack, a task's inherited
    # context) is outside every executing frame.
    top_depth = positions.get(id(top.frame), depth) if top.frame is not None else depth
    if found is not None and found[0] < top_depth:
        return found[1]
    return top


def current_axis_mapping() -> RulesLike | None:
    """The mapping or rules in force here, or ``None``.

    Returns what was passed to the innermost ``axis_mapping`` (with its keyword overrides applied,
    and for ``merge=True`` the merged result).

    Example:
        >>> with axis_mapping({"batch": "data"}):
        ...     current_axis_mapping()
        {'batch': 'data'}
        >>> current_axis_mapping() is None
        True
    """
    e = _visible_entry()
    return None if e is None else e.value


def current_mapping_and_rules() -> tuple[RulesLike, AxisRules] | None:
    """``(current_axis_mapping(), its normalized AxisRules)``, or ``None`` (internal)."""
    e = _visible_entry()
    return None if e is None else (e.value, e.rules)


def current_rules() -> AxisRules | None:
    """The normalized ``AxisRules`` in force here, or ``None`` (internal hot path)."""
    e = _visible_entry()
    return None if e is None else e.rules


def rules_in_force(mapping: RulesLike | None, caller: str) -> AxisRules:
    """The one rule for which rules apply: ``mapping`` if given, else the context's, else an error.

    Every planner calls this, so none of them replicates silently for lack of a mapping.

    Raises:
        ShardingError: naming ``caller`` and the two ways to give a mapping.
        MappingTypeError: for a malformed ``mapping``, the message prefixed with ``caller``.

    Example:
        >>> rules_in_force({"batch": "data"}, "pspec_for")
        AxisRules([('batch', 'data')], unsatisfied='error')
    """
    if mapping is not None:
        try:
            return as_rules(mapping)
        except MappingTypeError as err:  # say which call got the bad mapping
            raise with_prefix(err, f"{caller}(): ") from None
    e = _visible_entry()
    if e is None:
        raise ShardingError(
            f"{caller}() got no mapping and no axis_mapping is in force. Pass one, e.g. "
            f"{caller}(..., {{'batch': 'data'}}), or wrap the call in `with axis_mapping({{...}}):`."
        )
    return e.rules


def _generator_scoped(frame: FrameType | None) -> bool:
    """Whether a ``with`` in ``frame`` is generator-scoped (a plain generator's own block)."""
    if frame is None or not frame.f_code.co_flags & _GEN_FLAGS:
        return False
    return not (frame.f_back is not None and frame.f_back.f_code in _CM_ENTER_CODES)


class axis_mapping:
    """Put a logical-to-mesh mapping in force for a block (or a decorated function).

    The mapping is held in ``contextvars``: threads and asyncio tasks are isolated from each other,
    and a generator suspended inside a block does not leak its mapping to its caller (see the module
    notes). Usable as ``with axis_mapping(...):`` and as a decorator.

    Args:
        mapping_or_rules: A ``{logical_name: mesh_axes}`` mapping, ``AxisRules``, or ``None``
            (nothing but the keyword entries).
        merge: If true, combine with the mapping in force: this one wins on every name it mentions
            and its names come first, so they have priority when two compete for a mesh axis (with
            ``AxisRules``, the outer pairs for its names remain as fallbacks). If false, replace
            it.
        **kwargs: Entries that add to or override ``mapping_or_rules`` (``batch="data"``).

    Raises:
        MappingTypeError: if a value has the wrong type (raised on construction, not on use).

    Example:
        >>> with axis_mapping({"batch": "data"}), axis_mapping(embed="model", merge=True):
        ...     current_axis_mapping()
        {'embed': 'model', 'batch': 'data'}
    """

    def __init__(
        self,
        mapping_or_rules: RulesLike | None = None,
        *,
        merge: bool = False,
        **kwargs: MeshAxes,
    ) -> None:
        value: RulesLike
        if mapping_or_rules is None:
            value = dict(kwargs)
        elif isinstance(mapping_or_rules, AxisRules):
            value = mapping_or_rules.replace(kwargs) if kwargs else mapping_or_rules
        elif isinstance(mapping_or_rules, dict) or hasattr(mapping_or_rules, "items"):
            value = {**mapping_or_rules, **kwargs}
        elif isinstance(mapping_or_rules, (list, tuple)):
            rules = as_rules(mapping_or_rules)  # flax's list of (name, mesh_axes) pairs
            value = rules.replace(kwargs) if kwargs else rules
        else:
            raise MappingTypeError(
                f"axis_mapping expects a dict of logical name -> mesh axes, AxisRules or a list of "
                f"(logical_name, mesh_axes) pairs, got "
                f"{mapping_or_rules!r} ({type(mapping_or_rules).__name__}). "
                "Use e.g. axis_mapping({'batch': 'data'})."
            )
        self._value = value
        self._rules = as_rules(value)  # validate now, so the error points at the `with` line
        self._merge = merge

    def __enter__(self) -> RulesLike:
        value, rules = self._value, self._rules
        if self._merge:
            outer = _visible_entry()
            if outer is not None:
                value = merge_rules(value, outer.value)
                rules = as_rules(value)
        here = _currentframe()
        with_frame = here.f_back if here is not None else None
        entry = _Pushed(value, rules, with_frame, self)
        if _generator_scoped(with_frame):
            with _SCOPED_LOCK:
                _SCOPED[id(with_frame)] = _SCOPED.get(id(with_frame), ()) + (entry,)
        else:
            _set_stack(_STACK.get() + (entry,))
        return value

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        here = _currentframe()
        with_frame = here.f_back if here is not None else None
        if with_frame is not None and id(with_frame) in _SCOPED:
            with _SCOPED_LOCK:
                entries = _SCOPED.get(id(with_frame), ())
                mine = [i for i, e in enumerate(entries) if e.pushed_by is self]
                if mine:
                    kept = entries[: mine[-1]] + entries[mine[-1] + 1 :]
                    if kept:
                        _SCOPED[id(with_frame)] = kept
                    else:
                        del _SCOPED[id(with_frame)]
                    return
        # Remove the entry this object pushed in *this* context (so one object, e.g. a decorator,
        # can be active in several threads at once): preferably the one pushed from the frame
        # exiting now, else (ExitStack enters and exits from different frames) its latest one.
        stack = _STACK.get()
        mine = [i for i, e in enumerate(stack) if e.pushed_by is self]
        if not mine:
            return
        same_frame = [i for i in mine if stack[i].frame is with_frame]
        drop = (same_frame or mine)[-1]
        _set_stack(stack[:drop] + stack[drop + 1 :])

    def __call__(self, func: _F) -> _F:
        """Use as a decorator: the mapping is in force while ``func`` runs, also for generator
        functions (while the generator runs, not while it is suspended), coroutine functions and
        async generator functions."""
        if inspect.isasyncgenfunction(func):
            return self._wrap_async_gen(func)  # type: ignore[return-value]
        if inspect.isgeneratorfunction(func):

            @functools.wraps(func)
            def gen(*args: Any, **kwargs: Any) -> Any:
                with self:
                    return (yield from func(*args, **kwargs))

            return gen  # type: ignore[return-value]
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def coro(*args: Any, **kwargs: Any) -> Any:
                with self:
                    return await func(*args, **kwargs)

            return coro  # type: ignore[return-value]

        @functools.wraps(func)
        def plain(*args: Any, **kwargs: Any) -> Any:
            with self:
                return func(*args, **kwargs)

        return plain  # type: ignore[return-value]

    def _wrap_async_gen(self, func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        async def agen(*args: Any, **kwargs: Any) -> Any:
            with self:
                inner = func(*args, **kwargs)
                try:
                    value = await inner.__anext__()
                    while True:
                        try:
                            sent = yield value
                        except GeneratorExit:
                            await inner.aclose()
                            raise
                        except BaseException as e:  # thrown in: forward to the wrapped one
                            value = await inner.athrow(e)
                        else:
                            value = await inner.asend(sent)
                except StopAsyncIteration:
                    return

        return agen

    def __repr__(self) -> str:
        return f"axis_mapping({self._value!r}, merge={self._merge})"
