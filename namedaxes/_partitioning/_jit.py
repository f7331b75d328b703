"""What ``named_jit`` and ``fsdp`` return: ``jax.jit`` for functions of named pytrees, with mappings
in force (the decorators themselves, which check their options, are in ``_named_jit``).

Per call, the arguments are flattened once (C++), and a bounded cache keyed on (structure, leaf
types, mapping) and then (static leaves, mesh) yields a ``jax.jit``-compiled *flat* function with
everything precomputed: which leaves are static, input placements, donation, how to rebuild the
output. A cached call therefore costs about what ``jax.jit`` costs on the same leaves. The mapping
and the mesh are part of the key, so changing either retraces (never a stale program) and repeating
them does not.

Named inputs are placed before the call: by ``in_axis_resources`` when given (moving what is
elsewhere); otherwise those not placed yet (NumPy, uncommitted arrays) by the mapping in force, while
those on the mesh stay put and one committed elsewhere is refused (``IfUnplaced``, the rule fsdp uses
for its non-parameter inputs). Output shardings are applied inside the traced function (``reshard``
/ sharding constraints), since the output structure is only known while tracing; plain-array outputs
keep whatever sharding JAX gives them, and plain-array inputs keep their own.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import threading
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar

import jax

from .._caches import register_owner
from .._errors import NamedTypeError, ShardingError, UnsatisfiedAxisError
from .._logical._context import (
    axis_mapping,
    current_mapping_and_rules,
    neutral_trace_key,
    trace_key_is_neutral,
)
from .._logical._rules import AxisRules, RulesLike, as_rules
from .._mesh import AnyMesh, context_mesh, mesh_of_leaves, require_mesh
from ._held import parameters_held_by
from ._jit_args import (
    argument_path,
    check_donation,
    donation_flags,
    frozen_mapping,
    release_moved,
    unhashable_static,
)
from ._jit_entries import (
    Compiled,
    IfUnplaced,
    Layout,
    OutInfo,
    concrete_targets,
    is_dynamic_type,
    place_inputs_fast,
    signature,
)
from ._jit_outputs import (
    check_strict,
    constrain_outputs,
    parameter_structures,
    refuse_unplaceable_outputs,
)
from ._lru import lru_put, lru_touch
from ._plan import TreePlan, plan_tree
from ._shard import place_leaves
from ._tree import walk

__all__ = ["NamedJitWrapped"]

P = ParamSpec("P")
R = TypeVar("R")


class NamedJitWrapped(Generic[P, R]):
    """The callable ``named_jit`` and ``fsdp`` return: call it like the function it wraps (its
    signature is kept for type checkers); ``.lower`` to inspect."""

    def __init__(
        self,
        fn: Callable[P, R],
        axis_resources: RulesLike | None,
        in_axis_resources: RulesLike | None,
        out_axis_resources: RulesLike | None,
        donate_args: Any,
        donate_kwargs: Any,
        jit_kwargs: dict[str, Any],
        cache_size: int = 64,
        in_rules_rest: RulesLike | None = None,
        strict: bool = False,
    ) -> None:
        self._fn = fn
        self._strict = strict
        self._fsdp = in_rules_rest is not None
        self._caller = "fsdp" if self._fsdp else "named_jit"
        # Copied now: mutating the caller's dict later must change neither tracing nor placement.
        self._axis_value = frozen_mapping(axis_resources)
        self._axis_rules = None if axis_resources is None else as_rules(axis_resources)
        self._in_rules = None if in_axis_resources is None else as_rules(in_axis_resources)
        # fsdp: arguments after the first (the batch) are placed by the compute mapping.
        self._in_rules_rest = None if in_rules_rest is None else as_rules(in_rules_rest)
        self._out_rules = None if out_axis_resources is None else as_rules(out_axis_resources)
        # First calls of a signature are serialized so that each signature is traced and compiled
        # once even when several threads make it at the same time (the fast path takes no lock).
        self._lock = threading.RLock()
        register_owner(self)
        self._donate_args = donate_args
        self._donate_kwargs = donate_kwargs
        # A `leaf -> bool` donation option depends on the leaves' values (dtype, shape), which the
        # layout key (structure and leaf types) does not tell apart: evaluated on every call, and
        # its flags are part of the keys. Bools alone are fixed per structure (once per layout).
        self._donate_per_call = any(
            callable(flag)
            for option in (donate_args, donate_kwargs)
            for flag in jax.tree_util.tree_leaves(option, is_leaf=callable)
        )
        self._jit_kwargs = jit_kwargs
        self._cache_size = cache_size
        # fsdp: the name its parameters (fn's first parameter) can be passed by, read once.
        self._first_parameter = _first_parameter(fn) if self._fsdp else None
        self._layouts: collections.OrderedDict[Any, Layout] = collections.OrderedDict()
        self._fast: collections.OrderedDict[Any, Any] = collections.OrderedDict()
        functools.update_wrapper(self, fn)

    # -- the hot path -------------------------------------------------------------------------

    def _lookup(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], donated: tuple[int, ...] | None
    ) -> tuple[Layout, Compiled, tuple[Any, ...], list[Any]]:
        leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
        types = tuple(map(type, leaves))
        if self._axis_rules is not None:
            value, rules = self._axis_value, self._axis_rules
        else:
            found = current_mapping_and_rules()
            value, rules = (None, None) if found is None else found
        key = (treedef, types, rules, donated)
        try:
            layout = self._layouts.get(key)
        except TypeError as e:
            raise NamedTypeError(
                "named_jit needs the arguments' static structure to be hashable, but it holds an "
                f"unhashable value ({e}); typically an eqx.Module static field holding a list, dict "
                "or array. Make it a tuple, or a regular (non-static) field."
            ) from None
        if layout is None:
            donate = donated if donated is not None else self._donated(args, kwargs)
            layout = Layout(treedef, types, donate)
            lru_put(self._layouts, key, layout, self._cache_size)
        else:
            lru_touch(self._layouts, key)
        dyn = layout.get_dyn(leaves)
        statics = layout.get_static(leaves) if layout.static_idx else ()
        # The abstract mesh is cheap to get and is all the traced program needs (jax.jit itself
        # keys on the concrete devices); placing inputs before the call needs the concrete one.
        mesh: AnyMesh | None = jax.sharding.get_abstract_mesh()
        from_leaves = False
        if mesh.empty:  # type: ignore[union-attr]
            mesh = mesh_of_leaves(dyn)
            from_leaves = mesh is not None
        elif self._in_rules is not None or rules is not None:  # inputs are placed: see _compile
            mesh = context_mesh()
        inner_key = (statics, mesh)
        try:
            compiled = layout.by_key.get(inner_key)
        except TypeError:
            raise unhashable_static(layout, leaves, statics) from None
        if compiled is None:
            compiled = self._compile(layout, leaves, statics, value, rules, mesh, from_leaves)
            lru_put(layout.by_key, inner_key, compiled, self._cache_size)
        else:
            lru_touch(layout.by_key, inner_key)
        return layout, compiled, dyn, leaves

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        # Fast path: one flatten, one or two dict lookups, the jitted call, one unflatten.
        leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
        if self._axis_rules is not None:
            rules = self._axis_rules
        else:
            found = current_mapping_and_rules()
            rules = None if found is None else found[1]
        donated = self._donated(args, kwargs) if self._donate_per_call else None
        fast_key = (
            treedef,
            tuple(map(type, leaves)),
            rules,
            jax.sharding.get_abstract_mesh(),
            donated,
        )
        try:
            hit = self._fast.get(fast_key)
        except TypeError:  # unhashable static data in the structure: reported by the slow path
            hit = None
        if hit is not None:
            layout, compiled = hit
            if layout.static_idx:  # one more lookup, by the static leaves' values
                try:
                    compiled = compiled.get(layout.get_static(leaves))
                except TypeError:
                    compiled = None
            if compiled is not None and compiled.in_targets is not None:
                # Input targets are built on the concrete mesh, which the key (the abstract mesh)
                # does not tell apart from another of its shape on other devices.
                mesh = context_mesh()
                if mesh is not compiled.mesh and mesh != compiled.mesh:
                    compiled = None
            if compiled is not None:
                dyn = given = layout.get_dyn(leaves)
                if layout.donate:
                    check_donation(layout, dyn, args, kwargs)
                if compiled.in_targets is not None:
                    dyn = place_inputs_fast(dyn, compiled)
                if trace_key_is_neutral():  # see _call_slow
                    out = compiled.jitted(*dyn)
                else:
                    with neutral_trace_key():
                        out = compiled.jitted(*dyn)
                if layout.donate:
                    release_moved(layout, given, dyn)
                info = compiled.single
                return (info if info is not None else compiled.out_info(dyn)).rebuild(out)
        with self._lock:
            return self._call_slow(args, kwargs, fast_key)

    def _call_slow(self, args: tuple[Any, ...], kwargs: dict[str, Any], fast_key: Any) -> Any:
        layout, compiled, dyn, leaves = self._lookup(args, kwargs, fast_key[4])
        if not compiled.shaped_targets and compiled.set_mesh is None and not fast_key[3].empty:
            # Eligible for the fast path: nothing depends on the leaves' shapes or on the
            # arguments' own mesh. With static leaves the entry is a dict keyed by their values.
            # (Bounded; the slow path remains the source of truth.)
            if layout.static_idx:
                by_statics = self._fast.get(fast_key, (layout, {}))[1]
                if len(by_statics) >= self._cache_size:
                    by_statics.pop(next(iter(by_statics)))
                by_statics[layout.get_static(leaves)] = compiled
                lru_put(self._fast, fast_key, (layout, by_statics), self._cache_size)
            else:
                lru_put(self._fast, fast_key, (layout, compiled), self._cache_size)
        given = dyn
        if layout.donate:
            check_donation(layout, dyn, args, kwargs)
        if compiled.in_targets is not None or compiled.shaped_targets:
            dyn = self._place_inputs(layout, compiled, dyn, leaves)
        # Each entry (its own jax.jit) is keyed by the mapping its program runs under: named_jit's
        # own axis_resources, else the visible mapping. The mapping is kept out of JAX's trace key
        # here, so a program with its own mapping is not traced again for each mapping around it.
        with neutral_trace_key():
            if compiled.set_mesh is not None:
                with jax.set_mesh(compiled.set_mesh):
                    out = compiled.jitted(*dyn)
            else:
                out = compiled.jitted(*dyn)
        if layout.donate:
            release_moved(layout, given, dyn)
        return compiled.out_info(dyn).rebuild(out)

    def lower(self, *args: P.args, **kwargs: P.kwargs) -> Any:
        """Lower for the given arguments (or ``ShapeDtypeStruct``s) and return JAX's ``Lowered``.

        Example:
            >>> import jax.numpy as jnp
            >>> from namedaxes import named, named_jit
            >>> f = named_jit(lambda x: x.array * 2)
            >>> "multiply" in f.lower(named(jnp.ones(3), "a")).as_text()
            True
        """
        donated = self._donated(args, kwargs) if self._donate_per_call else None
        with self._lock:
            layout, compiled, dyn, leaves = self._lookup(args, kwargs, donated)
        if compiled.in_targets is not None or compiled.shaped_targets:
            dyn = self._place_inputs(layout, compiled, dyn, leaves)
        with neutral_trace_key():
            if compiled.set_mesh is not None:
                with jax.set_mesh(compiled.set_mesh):
                    return compiled.jitted.lower(*dyn)
            return compiled.jitted.lower(*dyn)

    def _place_inputs(
        self, layout: Layout, compiled: Compiled, dyn: Any, leaves: list[Any]
    ) -> list[Any]:
        targets = compiled.in_targets
        if compiled.shaped_targets:  # field(axis_names=...) leaves: sizes come from shapes
            all_targets = self._input_targets(layout.treedef, leaves, compiled.mesh, compiled.rules)
            targets = list(layout.get_dyn(all_targets)) if layout.dyn_idx else []
        placed, _ = place_leaves(list(dyn), concrete_targets(dyn, targets))  # type: ignore[arg-type]
        return placed

    def _input_targets(
        self, treedef: Any, leaves: list[Any], mesh: AnyMesh, rules: AxisRules | None
    ) -> list[Any]:
        """Per leaf of ``(args, kwargs)``: where to place it before the call (``None``: as is).

        ``in_axis_resources`` places every named input; fsdp places its parameters by the
        parameter mapping and the other named inputs, unless already on the mesh, by the compute
        mapping; ``named_jit`` without ``in_axis_resources`` places the unplaced named inputs by
        the mapping in force (``rules``), and refuses one committed elsewhere."""
        tree = treedef.unflatten(leaves)
        flat = (leaves, treedef)
        if self._in_rules_rest is not None:  # fsdp: each leaf resolved by its mapping only
            held = plan_tree(tree, self._in_rules, mesh, caller=self._caller, flat=flat)
            computed = plan_tree(tree, self._in_rules_rest, mesh, caller=self._caller, flat=flat)
            is_parameter = self._parameter_mask(*tree)
            return [
                held.target(i) if parameter else _if_unplaced(computed, i)
                for i, parameter in enumerate(is_parameter)
            ]
        if self._in_rules is not None:
            return plan_tree(tree, self._in_rules, mesh, caller=self._caller, flat=flat).targets
        if rules is None:  # no mapping in force: nothing to place by
            return [None] * len(leaves)
        # Planned per argument, so that an error names the argument and the leaf's path in it.
        args, kwargs = tree
        prefix = (tuple(range(len(args))), dict.fromkeys(kwargs, 0))
        units = jax.tree_util.tree_structure(prefix).flatten_up_to(tree)
        names = [argument_path(p) for p, _ in jax.tree_util.tree_flatten_with_path(prefix)[0]]
        out: list[Any] = []
        for name, unit in zip(names, units):
            planned = plan_tree(unit, rules, mesh, caller=self._caller)
            paths = jax.tree_util.tree_flatten_with_path(unit)[0]
            for i, (path, _) in enumerate(paths):
                out.append(_if_unplaced(planned, i, name + jax.tree_util.keystr(path), name))
        return out

    # -- fsdp: which argument holds the parameters -----------------------------------------------

    def _parameters(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
        """fsdp: ``(the parameters, a prefix of (args, kwargs) marking them)``: ``fn``'s first
        parameter, passed by position or by keyword (``None`` when it is not passed).

        Raises:
            NamedTypeError: for keyword arguments only, when ``fn``'s first parameter has no name
                they could pass it by (its signature can't be read, or it is positional-only).
        """
        if args:
            return args[0], (tuple(i == 0 for i in range(len(args))), dict.fromkeys(kwargs, False))
        name = self._first_parameter
        if name is None and kwargs:
            raise NamedTypeError(
                f"fsdp takes the parameters from the first parameter of {self._fn!r}, but it was "
                f"called with keyword arguments only ({', '.join(map(repr, kwargs))}) and that "
                "parameter cannot be passed by keyword (its signature can't be read, or it is "
                "positional-only). Pass the parameters positionally: step(params, ...)."
            )
        return kwargs.get(name), ((), {k: k == name for k in kwargs})  # type: ignore[arg-type]

    def _parameter_mask(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[bool]:
        """Per leaf of ``(args, kwargs)``: whether it lies in the parameters."""
        prefix = self._parameters(args, kwargs)[1]
        nested = jax.tree_util.tree_map(
            lambda flag, sub: [flag] * len(jax.tree_util.tree_leaves(sub)), prefix, (args, kwargs)
        )
        return [f for part in jax.tree_util.tree_leaves(nested, is_leaf=_is_list) for f in part]

    # -- building an entry (once per key) ----------------------------------------------------------

    def _donated(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, ...]:
        """Positions (among the array leaves) of the donated ones."""
        if self._donate_args is None and self._donate_kwargs is None:
            return ()
        flags = donation_flags(args, self._donate_args, "donate_args", "positional arguments")
        flags += donation_flags(kwargs, self._donate_kwargs, "donate_kwargs", "keyword arguments")
        leaves = jax.tree_util.tree_leaves((args, kwargs))
        types_dyn = [i for i, leaf in enumerate(leaves) if is_dynamic_type(type(leaf))]
        return tuple(pos for pos, i in enumerate(types_dyn) if flags[i])

    def _compile(
        self,
        layout: Layout,
        leaves: list[Any],
        statics: tuple[Any, ...],
        value: RulesLike | None,
        rules: AxisRules | None,
        mesh: AnyMesh | None,
        from_leaves: bool,
    ) -> Compiled:
        if self._fsdp:  # which argument holds the parameters: refused first if it can't be told
            self._parameters(*layout.treedef.unflatten(leaves))
        compiled = Compiled()
        compiled.set_mesh = mesh if from_leaves else None
        compiled.mesh = mesh
        compiled.rules = rules
        fn = self._fn
        out_rules = self._out_rules if self._out_rules is not None else rules
        # Rules given to named_jit itself (not found in the context) are a request to place outputs.
        explicit_out = self._out_rules is not None or self._axis_rules is not None
        treedef = layout.treedef
        if mesh is not None:  # the plan checks each mapping given here against the mesh
            given = (self._axis_rules, self._in_rules, self._in_rules_rest, self._out_rules)
            for mapping in dict.fromkeys(r for r in given if r is not None):
                plan_tree(treedef.unflatten(leaves), mapping, mesh, caller=self._caller)

        def flat(*dyn: Any) -> list[Any]:
            args, kwargs = treedef.unflatten(layout.merge(dyn, statics))
            # fsdp: layers pin their narrow copies of parameters to where these are held
            held = parameters_held_by(self._in_rules) if self._fsdp else contextlib.nullcontext()
            mapped = axis_mapping(value) if value is not None else contextlib.nullcontext()
            with held, mapped:
                out = fn(*args, **kwargs)
            parameters = self._parameters(args, kwargs)[0] if self._fsdp else None
            if self._strict:  # once per trace: never on the cached path
                if self._in_rules_rest is not None:  # fsdp: parameters, then everything computed
                    check_strict(
                        args, kwargs, out, (self._in_rules_rest,), self._in_rules, parameters
                    )
                else:
                    check_strict(args, kwargs, out, (rules, self._in_rules, out_rules))
            out_leaves, out_def = jax.tree_util.tree_flatten(out)
            specs: dict[int, Any] = {}
            if out_rules is not None and mesh is not None:
                # fsdp: outputs shaped like the parameters are parameters, the rest computed
                fsdp_split = {}
                if self._in_rules_rest is not None:
                    fsdp_split = {
                        "compute_rules": self._in_rules_rest,
                        "parameters": parameter_structures(parameters),
                    }
                out_leaves, specs = constrain_outputs(
                    out, out_def, out_leaves, out_rules, mesh, **fsdp_split
                )
            elif explicit_out and out_rules is not None:
                refuse_unplaceable_outputs(out, out_rules)
            dyn_pos = tuple(i for i, v in enumerate(out_leaves) if is_dynamic_type(type(v)))
            static_out = tuple(
                (i, v) for i, v in enumerate(out_leaves) if not is_dynamic_type(type(v))
            )
            empty = tuple(
                (k, specs[i])
                for k, i in enumerate(dyn_pos)
                if i in specs and out_leaves[i].size == 0
            )
            compiled.record(signature(dyn), OutInfo(out_def, dyn_pos, static_out, empty))
            return [out_leaves[i] for i in dyn_pos]

        flat.__name__ = getattr(fn, "__name__", "named_jit_fn")
        flat.__qualname__ = getattr(fn, "__qualname__", flat.__name__)
        compiled.jitted = jax.jit(flat, donate_argnums=layout.donate, **self._jit_kwargs)
        # Named inputs are placed before the call: by in_axis_resources (which needs a mesh), or,
        # when unplaced, by the mapping in force (on the mesh there is, if any).
        places = self._in_rules is not None or (rules is not None and mesh is not None)
        tree_walk = walk(treedef.unflatten(leaves), treedef)
        if places and tree_walk.any_named:
            caller = "fsdp" if self._fsdp else "named_jit(in_axis_resources=...)"
            m = require_mesh(mesh, caller=caller, has_mesh_arg=False)
            compiled.mesh = m
            if tree_walk.any_field:
                compiled.shaped_targets = True  # targets depend on shapes: computed per call
            else:
                targets = list(layout.get_dyn(self._input_targets(treedef, leaves, m, rules)))
                # Nothing to place (no named array input): the cached call skips placing.
                compiled.in_targets = targets if any(t is not None for t in targets) else None
        return compiled

    def clear_cache(self) -> None:
        """Drop every compiled program this function holds (the next call traces again)."""
        with self._lock:
            self._layouts.clear()
            self._fast.clear()

    def __repr__(self) -> str:
        return f"named_jit({getattr(self._fn, '__qualname__', self._fn)!r})"

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        # Methods: bind like a function so `self` becomes the first (pytree) argument.
        if obj is None:
            return self
        return functools.partial(self, obj)


def _first_parameter(fn: Callable[..., Any]) -> str | None:
    """The name ``fn``'s first parameter can be passed by (``None``: none, or unreadable)."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # some builtins and C callables have no readable signature
        return None
    if not parameters or parameters[0].kind not in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    ):
        return None
    return parameters[0].name


def _is_list(x: Any) -> bool:
    return isinstance(x, list)


def _if_unplaced(
    planned: TreePlan, i: int, path: str = "", argument: str = ""
) -> IfUnplaced | None:
    """Leaf ``i``'s target for when it is not on the mesh (``None``: it has no names). A leaf
    the mapping cannot place is refused only if it has to be placed: one already on the mesh
    stays put whatever the mapping says of it. ``path``: see ``IfUnplaced``; ``argument``: the
    argument planned (``args[0]``), for the message."""
    if planned.walk.infos[i] is None:
        return None
    try:
        target = planned.target(i)
    except ShardingError as e:  # kept as text: the entry must not hold the trace of this call
        message = str(e)
        if argument and isinstance(e, UnsatisfiedAxisError):
            # named_jit's remedies: resolve's generic ones name options named_jit does not have.
            message = (
                f"named_jit cannot place argument {argument} by the mapping in force. "
                f"{e.diagnosis}. Place it yourself before the call (na.shard(x, mapping, mesh) "
                f"with a mapping that divides it, or pad it), or {e.fallback_advice()}."
            )
        elif argument:
            message = f"named_jit cannot place argument {argument} by the mapping in force. {e}"
        return IfUnplaced(None, planned.mesh, path, (type(e), message, dict(e.__dict__)))
    return None if target is None else IfUnplaced(target, planned.mesh, path)
