"""``plan_search``: enumerate logical-to-mesh mappings, prune by exact state bytes, rank, explain.

How it stays fast: the state bytes of a mapping are arithmetic over the tree's *distinct* leaf
kinds (axes, sizes, bits per element), since ``resolve`` only ever shards a dimension its mesh axes
divide (so every device holds the same ``size / k`` elements, ``packed_bytes`` of them). Thousands of mappings are
priced in well under a second; only the survivors reach a compiler, at most ``compile_limit`` of
them, and each distinct layout of the step's arguments compiles once.

Ranking (documented in :func:`plan_search`): with a ``step``, by XLA's temporaries plus the bytes
of the compiled collectives; without one, by state bytes per device (most room left for the
step's temporaries), then by the fewest rules. Logical axes are enumerated in sorted name order,
so what wins a tie never depends on the order of an array's axes or of ``logical_axes``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

from .._errors import DeviceOutOfMemoryError, PlanDoesNotFitError, PlanError, format_mesh
from .._logical._rules import AxisRules
from .._spec import entry_axes
from ..rules._base import dtype_bits, format_bytes, packed_bytes
from ._compile_target import CompileTarget, compile_steps, leaf_specs
from ._memory import per_device_bytes
from ._plan import (
    Plan,
    check_params,
    collect_leaves,
    mesh_sizes_and_target,
    parse_bytes,
    state_plan,
    step_arguments,
    verdict,
    with_step_axes,
)
from ._plan_format import pairs_text, rules_to_json
from ._report import check_count

__all__ = ["PlanSearch", "plan_search"]


class PlanSearch(list):  # type: ignore[type-arg]
    """The best ``Plan``s, best first (a list), with why the other mappings lost.

    Attributes:
        candidates: How many mappings were enumerated.
        counts: How many were dropped, per reason: ``"conflict"`` (two logical axes of one array
            on the same mesh axis), ``"duplicate"`` (same layout as a simpler mapping),
            ``"over_budget"`` (state alone exceeds the budget), ``"step_over_budget"`` (compiled
            step exceeds it), ``"cannot_run"`` (it pipelines a stack its stages cannot run:
            a layer count that does not divide, too few microbatches), ``"ranked_lower"``.
        rejected: Examples of losers: ``{"rules", "state_bytes_per_device", "reason"}`` (rules
            as ``[[name, mesh_axes], ...]``, like a plan's ``to_dict()``), the closest ones first.
        compiled: How many distinct layouts were compiled.
    """

    candidates: int
    counts: dict[str, int]
    rejected: list[dict[str, Any]]
    compiled: int

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict: ``plans``, ``candidates``, ``counts``, ``rejected``, ``compiled``."""
        return {
            "plans": [p.to_dict() for p in self],
            "candidates": self.candidates,
            "counts": dict(self.counts),
            "rejected": list(self.rejected),
            "compiled": self.compiled,
        }

    def _header(self) -> str:
        return (
            f"plan_search: {self.candidates} mappings, {len(self)} shown, {self.compiled} compiled; "
            "dropped: " + (", ".join(f"{k} {v}" for k, v in self.counts.items() if v) or "none")
        )

    def _losers(self) -> list[str]:
        if not self.rejected:
            return []
        return ["Why others lost (examples):"] + [
            f"  {pairs_text(r['rules'])}: {r['reason']}" for r in self.rejected[:10]
        ]

    def __str__(self) -> str:
        lines = [self._header()]
        for i, p in enumerate(self, 1):
            lines += ["", f"#{i}", str(p)]
        if self.rejected:
            lines += ["", *self._losers()]
        return "\n".join(lines)

    def __rich__(self) -> Any:
        """The same content as ``str()``, each plan as rich tables (``rich.print(found)``)."""
        try:
            from rich.console import Group
            from rich.text import Text
        except ImportError:  # rich is optional
            return str(self)
        parts: list[Any] = [Text(self._header(), style="bold")]
        for i, p in enumerate(self, 1):
            parts += [Text(""), Text(f"#{i}", style="bold"), p.__rich__()]
        if self.rejected:
            parts += [Text(""), Text("\n".join(self._losers()))]
        return Group(*parts)


def _options(size_sets: set[int], mesh: dict[str, int]) -> list[tuple[str, ...]]:
    """Mesh-axis groups (in mesh order) that divide some size this logical axis has."""
    names = [a for a, s in mesh.items() if s > 1]
    out: list[tuple[str, ...]] = [()]
    for r in range(1, len(names) + 1):
        for combo in itertools.combinations(names, r):
            k = math.prod(mesh[a] for a in combo)
            if any(n % k == 0 for n in size_sets):
                out.append(combo)
    return out


def _rules_for(names: Sequence[str], choice: Sequence[tuple[str, ...]]) -> AxisRules:
    return AxisRules([(n, c) for n, c in zip(names, choice) if c], unsatisfied="replicate")


def plan_search(
    tree: Any,
    mesh: Any,
    *,
    logical_axes: Sequence[str] | None = None,
    step: Any = None,
    args: tuple[Any, ...] = (),
    budget: int | str | None = None,
    top: int = 5,
    params: str | None = None,
    max_candidates: int = 200_000,
    compile_limit: int | None = None,
    timeout: float = 900.0,
) -> PlanSearch:
    """Search mappings of logical axes to mesh axes; return the best few as ``Plan``s.

    Each logical axis goes to nothing, one mesh axis, or a group of mesh axes (in mesh order; the
    order within a group changes which device holds which block, not the bytes). Mappings that
    put one mesh axis on two axes of the same array, or that lay every leaf out like a mapping
    with fewer rules, are dropped. Then:

    1. prune: the exact state bytes per device must fit ``budget`` (computed arithmetically);
    2. rank the survivors. With ``step``: the ``compile_limit`` best by state (default
       ``2 * top``, at least 4) are compiled (one compile per distinct layout of the arguments);
       those whose compiled total exceeds the budget drop out, the rest rank by XLA's
       temporaries plus collective bytes, then state. Without ``step``: by state bytes per
       device (the most room left for the step's temporaries, which are often several times the
       state), then by the fewest rules.

    Remaining ties go to the mapping enumerated first: logical axes in sorted name order, the
    first varying slowest, each trying nothing, then single mesh axes, then groups (in mesh
    order). So the result depends on the names and the mesh, never on the order of an array's
    axes or of ``logical_axes``.

    The returned rules use ``unsatisfied="replicate"``: an axis whose size a mapped mesh axis
    does not divide stays whole on that array.

    Args:
        tree: The stored state (as for :func:`plan`).
        mesh: A ``Mesh``, ``AbstractMesh``, ``{axis: size}`` dict or compile target string.
        logical_axes: The logical axes to place (default: every name in the tree, and, with a
            step, in its ``args``). Others stay replicated.
        step: As for :func:`plan`.
        args: As for :func:`plan`.
        budget: Bytes per device (int or ``"16GiB"``); ``None`` keeps every mapping.
        top: How many plans to return (an int >= 1).
        params: As for :func:`plan`.
        max_candidates: Refuse to enumerate more mappings than this.
        compile_limit: How many survivors may be compiled (with ``step``; an int >= 1).
        timeout: Seconds allowed per compiling subprocess.

    Returns:
        A :class:`PlanSearch` (a list of ``Plan``, best first, each with ``rules`` and a ``notes``
        line saying why it ranks there), with ``counts`` and ``rejected`` for the others.

    Raises:
        PlanDoesNotFitError: if no mapping fits the budget (naming the smallest state found), or,
            with a step, none of the compiled ones does (naming XLA's figures).
        PlanError: if the search is larger than ``max_candidates``, ``logical_axes`` names an
            axis the tree lacks, ``args`` is not a tuple or comes without a step, ``params`` names no top-level subtree, or ``top`` or
            ``compile_limit`` is below 1.
        NamedTypeError: if ``top`` or ``compile_limit`` is not an int.
        DeviceOutOfMemoryError: without a budget, when XLA refuses every compiled mapping for
            lack of device memory.

    Example:
        >>> import jax
        >>> from namedaxes import named
        >>> from namedaxes.analysis import plan_search
        >>> w = named(jax.ShapeDtypeStruct((1024, 512), "float32"), ("embed", "mlp"))
        >>> best = plan_search({"w": w}, {"data": 2, "model": 4}, budget="300KiB", top=1)
        >>> best[0].rules, best[0].state_bytes_per_device
        (AxisRules([('mlp', ('data', 'model'))], unsatisfied='replicate'), 262144)
    """
    step_args = step_arguments(tree, step, args, caller="plan_search")
    sizes, where = mesh_sizes_and_target(mesh)
    budget_bytes = None if budget is None else parse_bytes(budget)
    check_count(top, "plan_search", what="how many plans to return", minimum=1, error=PlanError)
    if compile_limit is not None:
        check_count(
            compile_limit, "plan_search", name="compile_limit", what="how many mappings to compile",
            minimum=1, error=PlanError,
        )  # fmt: skip
    leaves = collect_leaves(tree, AxisRules(()), sizes)
    check_params(params, leaves, "plan_search")
    found = list(dict.fromkeys(a.name for lf in leaves for a in (lf.axes or ())))
    if step is not None and args:
        extra = collect_leaves(args, AxisRules(()), sizes)
        found += [
            n
            for n in dict.fromkeys(a.name for lf in extra for a in (lf.axes or ()))
            if n not in found
        ]
    else:
        extra = []
    # Sorted, so that which of two equal mappings is enumerated first (and wins the tie) is a
    # matter of names, not of the order of an array's axes or of logical_axes.
    found = sorted(found)
    if logical_axes is None:
        names = found
    else:
        names = sorted(logical_axes)
        missing = [n for n in names if n not in found]
        if missing:
            raise PlanError(
                f"logical_axes names {missing}, which no leaf has. Axes in the tree: {found}."
            )
    size_sets = {
        n: {a.size for lf in leaves + extra for a in (lf.axes or ()) if a.name == n} for n in names
    }
    options = [_options(size_sets[n], sizes) for n in names]
    total = math.prod(len(o) for o in options)
    if total > max_candidates:
        raise PlanError(
            f"plan_search would enumerate {total:,d} mappings of {len(names)} logical axes on "
            f"{format_mesh(sizes)} (more than max_candidates={max_candidates:,d}). Pass "
            "logical_axes=[...] with the axes worth placing, or raise max_candidates."
        )

    # Distinct leaf kinds: (index of each dim's logical axis in names or -1, dim sizes, bits per
    # element) -> leaf count. Bytes are rounded up per shard (sub-byte types), so per leaf.
    index = {n: i for i, n in enumerate(names)}
    kinds: dict[tuple[tuple[int, ...], tuple[int, ...], int], int] = {}
    fixed_records = []
    for lf in leaves:
        bits = dtype_bits(lf.dtype)
        if lf.axes is None:
            spec_entries = tuple(entry_axes(e) for e in lf.spec)
            fixed_records.append((lf.shape, bits, spec_entries))
            continue
        key = (tuple(index.get(a.name, -1) for a in lf.axes), lf.shape, bits)
        kinds[key] = kinds.get(key, 0) + 1
    fixed = int(per_device_bytes(fixed_records, sizes)[0].max()) if fixed_records else 0
    masks = [{c: sum(1 << list(sizes).index(a) for a in c) for c in opts} for opts in options]
    kof = [{c: math.prod(sizes[a] for a in c) for c in opts} for opts in options]
    # The step's arguments (a batch of token ids): their layouts count, their bytes do not.
    arg_kinds = list(
        dict.fromkeys(
            (tuple(index.get(a.name, -1) for a in lf.axes), lf.shape)
            for lf in extra
            if lf.axes is not None
        )
    )
    kind_list = [
        (dims, shape, bits, math.prod(shape), n) for (dims, shape, bits), n in kinds.items()
    ]

    counts = {
        "conflict": 0,
        "duplicate": 0,
        "over_budget": 0,
        "step_over_budget": 0,
        "cannot_run": 0,
        "ranked_lower": 0,
    }
    seen: dict[tuple[Any, ...], int] = {}  # layout -> index into survivors
    survivors: list[
        tuple[int, int, int, tuple[tuple[str, ...], ...]]
    ] = []  # (state, n_rules, order, choice)
    over: list[tuple[int, int, tuple[tuple[str, ...], ...]]] = []

    def lay_out(choice: Any, dims: tuple[int, ...], shape: tuple[int, ...]) -> Any:
        """``(mesh axes per dimension, shard count)``, or ``None`` for a conflict."""
        used = 0
        k = 1
        eff = []
        for d, i in enumerate(dims):
            c = choice[i] if i >= 0 else ()
            if not c or shape[d] % kof[i][c]:
                eff.append(())
                continue
            if used & masks[i][c]:
                return None
            used |= masks[i][c]
            k *= kof[i][c]
            eff.append(c)
        return tuple(eff), k

    for order, choice in enumerate(itertools.product(*options)):
        state = fixed
        layout = []
        conflict = False
        for dims, shape, bits, size, n in kind_list:
            got = lay_out(choice, dims, shape)
            if got is None:
                conflict = True
                break
            state += n * packed_bytes(size // got[1], bits)
            layout.append(got[0])
        for dims, shape in arg_kinds if not conflict else ():
            got = lay_out(choice, dims, shape)
            if got is None:
                conflict = True
                break
            layout.append(got[0])
        if conflict:
            counts["conflict"] += 1
            continue
        n_rules = sum(1 for c in choice if c)
        key = tuple(layout)
        if key in seen:
            counts["duplicate"] += 1
            j = seen[key]
            if j >= 0 and n_rules < survivors[j][1]:  # keep the simplest mapping of a layout
                survivors[j] = (state, n_rules, survivors[j][2], choice)
            continue
        if budget_bytes is not None and state > budget_bytes:
            counts["over_budget"] += 1
            over.append((state, n_rules, choice))
            seen[key] = -1
            continue
        seen[key] = len(survivors)
        survivors.append((state, n_rules, order, choice))

    def describe(choice: Sequence[tuple[str, ...]]) -> list[list[Any]]:  # JSON, as plans give it
        return rules_to_json(_rules_for(names, choice))

    rejected = [
        {
            "rules": describe(c),
            "state_bytes_per_device": s,
            "reason": f"state {format_bytes(s)} per device is over the budget of {format_bytes(budget_bytes or 0)}",
        }
        for s, _, c in sorted(over, key=lambda t: (t[0], t[1]))[:5]
    ]
    if not survivors:
        best = min((s for s, _, _ in over), default=None)
        raise PlanDoesNotFitError(
            f"No mapping of {names} on {format_mesh(sizes)} fits the budget of "
            f"{format_bytes(budget_bytes or 0)}: the smallest state found is "
            f"{format_bytes(best or 0)} per device ({total:,d} mappings tried). Use a larger mesh, "
            "a smaller model or optimizer state, or a larger budget."
        )
    survivors.sort(key=lambda t: (t[0], t[1], t[2]))

    result = PlanSearch()
    result.candidates = total
    result.compiled = 0
    if step is None:
        best_state = survivors[0][0]
        plans = []
        looked = 0
        for state, n_rules, _, choice in survivors:
            if len(plans) == top:
                break
            looked += 1
            note = (
                f"rank {len(plans) + 1} of {len(survivors)} surviving mappings by state per device "
                f"({format_bytes(state)}; best {format_bytes(best_state)}), then fewest rules ({n_rules})"
            )
            try:
                plans.append(
                    _final_plan(tree, sizes, where, names, choice, params, budget_bytes, note)
                )
            except PlanError as e:  # e.g. it pipelines a stack that cannot run on those stages
                counts["cannot_run"] += 1
                rejected.append({"rules": describe(choice), "state_bytes_per_device": state,
                                 "reason": str(e)})  # fmt: skip
        if not plans:
            raise PlanError(
                f"None of the {len(survivors)} mappings of {names} that fit can run: "
                f"{rejected[-1]['reason']}"
            )
        for state, n_rules, _, choice in survivors[looked : looked + 5]:
            rejected.append(
                {
                    "rules": describe(choice),
                    "state_bytes_per_device": state,
                    "reason": f"ranked lower: state {format_bytes(state)} per device with {n_rules} rules",
                }
            )
        counts["ranked_lower"] = max(len(survivors) - looked, 0)
    else:
        plans = _rank_compiled(
            tree,
            sizes,
            where,
            names,
            survivors,
            step,
            step_args,
            params,
            budget_bytes,
            top,
            compile_limit,
            timeout,
            counts,
            rejected,
            result,
            describe,
        )
    result.extend(plans)
    result.counts = counts
    result.rejected = rejected
    return result


def _final_plan(
    tree: Any,
    sizes: dict[str, int],
    where: Any,
    names: Sequence[str],
    choice: Any,
    params: str | None,
    budget: int | None,
    note: str,
    compiled: dict[str, Any] | None = None,
    args: tuple[Any, ...] = (),
) -> Plan:
    rules = _rules_for(names, choice)
    p = state_plan(tree, sizes, rules, params=params)
    if isinstance(where, CompileTarget):
        p = p.with_(target=where.text)
    if compiled is not None:
        memory = {
            k: compiled["memory"][k]
            for k in ("argument_bytes", "output_bytes", "temp_bytes", "alias_bytes", "total_bytes")
        }
        p = p.with_(compiled=memory, cost=compiled["cost"], collectives=compiled["collectives"])
        p = with_step_axes(p, args, sizes)
    return verdict(p.with_(notes=(note,)), budget)


def _rank_compiled(
    tree: Any,
    sizes: dict[str, int],
    where: Any,
    names: Sequence[str],
    survivors: list[Any],
    step: Any,
    step_args: tuple[Any, ...],
    params: str | None,
    budget: int | None,
    top: int,
    compile_limit: int | None,
    timeout: float,
    counts: dict[str, int],
    rejected: list[dict[str, Any]],
    result: PlanSearch,
    describe: Any,
) -> list[Plan]:
    limit = compile_limit if compile_limit is not None else max(2 * top, 4)
    # One compile per distinct layout of the arguments, all in one batch (one subprocess for a target).
    keyed = []
    layouts: dict[Any, AxisRules] = {}
    for state, n_rules, order, choice in survivors[:limit]:
        rules = _rules_for(names, choice)
        key = tuple(str(s) for s in leaf_specs(step_args, rules, sizes))
        layouts.setdefault(key, rules)
        keyed.append((key, state, n_rules, order, choice))
    figures = compile_steps(step, step_args, list(layouts.values()), where, timeout=timeout)
    result.compiled = len(layouts)
    cache = dict(zip(layouts, figures))
    scored = []
    refusals: list[str] = []  # why each compiled mapping lost, for the error when all did
    for key, state, n_rules, order, choice in keyed:
        got = cache[key]
        if isinstance(got, Exception):
            refusals.append(f"{pairs_text(describe(choice))}: XLA out of device memory")
            counts["step_over_budget"] += 1
            rejected.append(
                {
                    "rules": describe(choice),
                    "state_bytes_per_device": state,
                    "reason": f"XLA: {str(got)[:200]}",
                }
            )
            continue
        total = got["memory"]["total_bytes"]
        if budget is not None and total > budget:
            refusals.append(
                f"{pairs_text(describe(choice))}: compiled step needs {format_bytes(total)}"
            )
            counts["step_over_budget"] += 1
            rejected.append(
                {
                    "rules": describe(choice),
                    "state_bytes_per_device": state,
                    "reason": f"compiled step needs {format_bytes(total)} per device, over the budget",
                }
            )
            continue
        coll = sum(c["bytes"] for c in got["collectives"])
        scored.append(
            (got["memory"]["temp_bytes"] + coll, state, n_rules, order, choice, got, coll)
        )
    if not scored:  # every one was over the budget or refused by XLA for lack of memory
        if budget is None:
            oom = next(g for g in cache.values() if isinstance(g, DeviceOutOfMemoryError))
            raise oom
        raise PlanDoesNotFitError(
            f"None of the {len(keyed)} best mappings by state compiles within the budget of "
            f"{format_bytes(budget)} per device ({'; '.join(refusals[:3])}). Raise "
            "compile_limit or the budget, or shard activations (rematerialize with "
            "jax.checkpoint)."
        )
    scored.sort(key=lambda t: t[:4])
    plans = []
    for rank, (_, _, _, _, choice, got, coll) in enumerate(scored[:top], 1):
        note = (
            f"rank {rank} of {len(scored)} compiled mappings by XLA temporaries + collective bytes "
            f"({format_bytes(got['memory']['temp_bytes'])} + {format_bytes(coll)})"
        )
        plans.append(
            _final_plan(tree, sizes, where, names, choice, params, budget, note, got, step_args)
        )
    for cost, state, _, _, choice, _, _ in scored[top:]:
        rejected.append(
            {
                "rules": describe(choice),
                "state_bytes_per_device": state,
                "reason": f"ranked lower: temporaries + collectives {format_bytes(cost)}",
            }
        )
    counts["ranked_lower"] = max(len(survivors) - len(plans) - counts["step_over_budget"], 0)
    return plans
