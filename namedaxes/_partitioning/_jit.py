"""What ``named_jit`` and ``fsdp`` return: ``jax.jit`` for functions of named pytrees, with mappings
in force (the decorators themselves, which check their options, are in ``_named_jit``).

Per call, the arguments are flattened once (C++), and a bounded cache keyed on (structure, leaf
types, mapping) and then (static leaves, mesh) yields a ``jax.jit``-compiled *flat* function with
everything precomputed: which leaves are static, input placements, donation, how to rebuild the
output. A cached call therefore costs about what ``jax.jit`` costs on the same leaves. The mapping
and the mesh are part of the key, so changing either retraces (never a stale program) and repeating
them does not.

Output shardings are applied inside the traced function (``reshard`` / sharding constraints), since
the output structure is only known while tracing; plain-array outputs keep whatever sharding JAX
gives them, and plain-array inputs keep their own.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import threading
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar

import jax

from .._caches import register_owner
from .._errors import NamedTypeError
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
from ._plan import plan_tree
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
        self._jit_kwargs = jit_kwargs
        self._cache_size = cache_size
        self._layouts: collections.OrderedDict[Any, Layout] = collections.OrderedDict()
        self._fast: collections.OrderedDict[Any, Any] = collections.OrderedDict()
        functools.update_wrapper(self, fn)

    # -- the hot path -------------------------------------------------------------------------

    def _lookup(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Layout, Compiled, tuple[Any, ...], list[Any]]:
        leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
        types = tuple(map(type, leaves))
        if self._axis_rules is not None:
            value, rules = self._axis_value, self._axis_rules
        else:
            found = current_mapping_and_rules()
            value, rules = (None, None) if found is None else found
        key = (treedef, types, rules)
        try:
            layout = self._layouts.get(key)
        except TypeError as e:
            raise NamedTypeError(
                "named_jit needs the arguments' static structure to be hashable, but it holds an "
                f"unhashable value ({e}); typically an eqx.Module static field holding a list, dict "
                "or array. Make it a tuple, or a regular (non-static) field."
            ) from None
        if layout is None:
            layout = Layout(treedef, types, self._donated(args, kwargs))
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
        elif self._in_rules is not None:
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
        fast_key = (treedef, tuple(map(type, leaves)), rules, jax.sharding.get_abstract_mesh())
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
        layout, compiled, dyn, leaves = self._lookup(args, kwargs)
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
        with self._lock:
            layout, compiled, dyn, leaves = self._lookup(args, kwargs)
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
            all_targets = self._input_targets(layout.treedef, leaves, compiled.mesh)
            targets = list(layout.get_dyn(all_targets)) if layout.dyn_idx else []
        placed, _ = place_leaves(list(dyn), concrete_targets(dyn, targets))  # type: ignore[arg-type]
        return placed

    def _input_targets(self, treedef: Any, leaves: list[Any], mesh: AnyMesh) -> list[Any]:
        """Per leaf of ``(args, kwargs)``: where to place it before the call (``None``: as is)."""
        args, kwargs = treedef.unflatten(leaves)
        if self._in_rules_rest is None or not args:
            parts = [((args, kwargs), self._in_rules)]
        else:  # fsdp: the first argument holds the parameters; the rest is used where it is
            parts = [(args[0], self._in_rules), ((args[1:], kwargs), self._in_rules_rest)]
        out: list[Any] = []
        for n, (tree, rules) in enumerate(parts):
            planned = plan_tree(tree, rules, mesh, caller=self._caller)
            if not planned.any_named:
                out += [None] * len(planned.leaves)
                continue
            out += [IfUnplaced(t) if n and t is not None else t for t in planned.targets]
        return out

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
        compiled = Compiled()
        compiled.set_mesh = mesh if from_leaves else None
        compiled.mesh = mesh
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
            if self._strict:  # once per trace: never on the cached path
                if self._in_rules_rest is not None:  # fsdp: parameters, then everything computed
                    check_strict(args, kwargs, out, (self._in_rules_rest,), self._in_rules)
                else:
                    check_strict(args, kwargs, out, (rules, self._in_rules, out_rules))
            out_leaves, out_def = jax.tree_util.tree_flatten(out)
            specs: dict[int, Any] = {}
            if out_rules is not None and mesh is not None:
                # fsdp: outputs shaped like the first argument are parameters, the rest computed
                fsdp_split = {}
                if self._in_rules_rest is not None and args:
                    fsdp_split = {
                        "compute_rules": self._in_rules_rest,
                        "parameters": parameter_structures(args[0]),
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
        if self._in_rules is not None:
            tree_walk = walk(treedef.unflatten(leaves), treedef)
            if tree_walk.any_named:
                caller = "fsdp" if self._fsdp else "named_jit(in_axis_resources=...)"
                m = require_mesh(mesh, caller=caller, has_mesh_arg=False)
                compiled.mesh = m
                if tree_walk.any_field:
                    compiled.shaped_targets = True  # targets depend on shapes: computed per call
                else:
                    all_targets = self._input_targets(treedef, leaves, m)
                    compiled.in_targets = (
                        list(layout.get_dyn(all_targets)) if layout.dyn_idx else []
                    )
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
