"""Rules driven by what the user wrote: logical-axis rules, shape patterns, path regexes, and their
composition.

``LogicalAxisRule`` (and ``PathRegexRule`` given a ``{axis: mesh_axes}`` mapping) turn named axes into
specs through ``resolve`` only; explicit ``PartitionSpec``s are checked against the mesh (when one is
given or set) before they are returned, so every spec a rule produces is valid for the mesh.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jax.sharding import PartitionSpec

from .._array import NamedArray
from .._errors import MeshError, NamedTypeError, ShardingError, format_path
from .._logical._context import rules_in_force
from .._logical._rules import AxisRules, as_rules
from .._mesh import MeshLike, context_mesh, same_placement
from .._partitioning._plan import TreePlan, plan_tree
from ._base import (
    Leaf,
    ShardingRule,
    check_spec,
    describe_mesh,
    entry_axes,
    flatten_leaves,
    map_array_leaves,
    planned_spec,
    replicated,
    rule_mesh,
    rule_specs,
    spec_problems,
)
from ._checks import (
    check_pattern_specs,
    check_same_mesh,
    optional_mesh,
    rank_problem,
    spec_alone_problems,
)
from ._flat import flatten_values, key_paths, leaf_at, shape_dtype

__all__ = ["CompositeShardingRule", "LogicalAxisRule", "PathRegexRule", "ShapeBasedShardingRule"]


class LogicalAxisRule(ShardingRule):
    """Specs for NamedArrays from logical-axis rules, through ``resolve``.

    Each named leaf (a NamedArray, or a plain array declared with ``field(axis_names=...)``) gets
    ``resolve(axes, rules, mesh)``: one entry per axis, exactly as ``shard`` and ``pspec_for``
    place it. A plain array already placed with a ``NamedSharding`` keeps its spec; other plain
    arrays are replicated (``P(None, ...)``). Combine with another rule in a
    ``CompositeShardingRule`` to shard them too.

    Args:
        rules: ``AxisRules``, a ``{logical_name: mesh_axes}`` mapping or a list of pairs; ``None``
            uses the ``axis_mapping`` in force when the rule is applied (and raises if there is
            none: no silent replication).
        mesh: A ``Mesh``, ``AbstractMesh`` or ``{axis: size}`` dict (``None``: context mesh).
        unsatisfied: ``"error"`` or ``"replicate"``, overriding the rules' own policy.

    Raises:
        ShardingError: on construction for a bad ``rules`` or ``unsatisfied``; on ``apply`` with no
            mapping given or in force, if the rules name mesh axes the mesh lacks, or an axis
            cannot be sharded under the ``"error"`` policy (the message starts with the leaf's
            path).

    Example:
        >>> import jax.numpy as jnp
        >>> from namedaxes import named
        >>> from namedaxes.rules import LogicalAxisRule
        >>> x = named(jnp.zeros((8, 6)), ("batch", "embed"))
        >>> LogicalAxisRule({"batch": "data"}, {"data": 2, "model": 4}).apply({"x": x})
        {'x': P('data', None)}
    """

    def __init__(
        self, rules: Any = None, mesh: MeshLike | None = None, *, unsatisfied: Any = None
    ) -> None:
        if rules is not None:
            as_rules(rules)  # validate now, so the error points at the construction
        if unsatisfied is not None and unsatisfied not in ("error", "replicate"):
            raise ShardingError(
                f"LogicalAxisRule: unsatisfied must be one of 'error', 'replicate', got "
                f"{unsatisfied!r}."
            )
        self.rules = rules
        self.mesh = mesh
        self.unsatisfied = unsatisfied

    def __repr__(self) -> str:
        return f"LogicalAxisRule({self.rules!r}, mesh={self.mesh!r})"

    def apply(self, tree: Any) -> Any:
        """Return a spec per array leaf: resolved names for NamedArrays, replicated otherwise."""
        mesh = rule_mesh(self.mesh, caller="LogicalAxisRule")
        rules = rules_in_force(self.rules, "LogicalAxisRule.apply")
        if self.unsatisfied is not None:
            rules = rules.replace(unsatisfied=self.unsatisfied)
        # The plan checks the rules against the mesh, so a typo fails even on plain leaves.
        planned = plan_tree(tree, rules, mesh, caller="LogicalAxisRule.apply")
        return map_array_leaves(tree, lambda leaf: planned_spec(planned, leaf))


def _check_spec_value(spec: Any, where: str, *, allow_mapping: bool) -> Any:
    if spec is None or isinstance(spec, PartitionSpec):
        if spec is not None:
            problems = spec_alone_problems(spec)
            if problems:
                raise ShardingError(f"{where} has an invalid spec: {'; '.join(problems)}.")
        return spec
    if allow_mapping and isinstance(spec, AxisRules):
        return spec
    if allow_mapping and isinstance(spec, Mapping):
        return dict(spec)
    allowed = "a PartitionSpec, None (replicated)" + (
        " or a {axis_name: mesh_axes} mapping / AxisRules for NamedArrays" if allow_mapping else ""
    )
    raise NamedTypeError(f"{where} has spec {spec!r} ({type(spec).__name__}); expected {allowed}.")


def _checked_spec(
    leaf: Callable[[], Leaf],
    shape: tuple[int, ...],
    spec: PartitionSpec,
    sizes: Mapping[str, int] | None,
    *,
    caller: str,
) -> PartitionSpec:
    """``spec`` after checking it for an array of ``shape``: fully on a mesh, else its rank only.

    ``leaf`` gives the leaf's record, built only when a message must name it.
    """
    if sizes is not None:
        if spec_problems(shape, spec, sizes):
            check_spec(leaf(), spec, sizes, caller=caller)  # raises, naming the leaf
        return spec
    problem = rank_problem(shape, spec)
    if problem:
        raise ShardingError(
            f"{caller} gives leaf {leaf().path!r} (shape {shape}) an invalid spec: {problem}."
        )
    return spec


class ShapeBasedShardingRule(ShardingRule):
    """Specs from shape patterns: the first pattern matching an array's shape gives its spec.

    A pattern is a tuple of sizes in which ``None`` matches any size; it matches arrays of the same
    rank only. Patterns are tried in order (a sequence of pairs, or a dict's insertion order).
    Arrays that match nothing are replicated (one ``None`` per dimension). A matched spec is
    returned as written.

    No mesh is needed to apply the rule. Specs are checked on their own when the rule is built
    (entries are mesh axis names, no mesh axis twice, no longer than the pattern); when a mesh is
    given or set (``jax.set_mesh``), every pattern's spec is also checked against its axes, matched
    or not, and each matched spec against the array's sizes.

    Args:
        shape_patterns: ``{pattern: spec}`` or ``[(pattern, spec), ...]``; a spec of ``None``
            means replicated.
        mesh: A ``Mesh``, ``AbstractMesh`` or ``{axis: size}`` dict to check specs against
            (``None``: the context mesh, if any).

    Raises:
        ShardingError: if a pattern has a negative size, or a spec is longer than its pattern or
            repeats a mesh axis; on ``apply``
            with a mesh, if a spec names a mesh axis the mesh lacks or a matched spec does not
            divide the array's sizes.

    Example:
        >>> import jax
        >>> from jax.sharding import PartitionSpec as P
        >>> from namedaxes.rules import ShapeBasedShardingRule
        >>> rule = ShapeBasedShardingRule([((None, 1024), P("model", None))], mesh={"model": 4})
        >>> rule.apply({"emb": jax.ShapeDtypeStruct((32000, 1024), "float32")})
        {'emb': P('model', None)}
        >>> ShapeBasedShardingRule({(None, 8): P("data")}).apply([jax.ShapeDtypeStruct((3, 8), "int8")])
        [P('data',)]
    """

    def __init__(
        self,
        shape_patterns: Mapping[tuple[int | None, ...], PartitionSpec | None]
        | Sequence[tuple[tuple[int | None, ...], PartitionSpec | None]],
        mesh: MeshLike | None = None,
    ) -> None:
        items = shape_patterns.items() if isinstance(shape_patterns, Mapping) else shape_patterns
        patterns = []
        for item in items:
            if not isinstance(item, (tuple, list)) or len(item) != 2:
                raise NamedTypeError(
                    f"ShapeBasedShardingRule expects (pattern, spec) pairs, got {item!r}. "
                    "Use e.g. [((None, 1024), P('model', None))]."
                )
            pattern, spec = item
            if not isinstance(pattern, tuple) or any(
                p is not None and (isinstance(p, bool) or not isinstance(p, int)) for p in pattern
            ):
                raise NamedTypeError(
                    f"A shape pattern must be a tuple of ints and None wildcards, got {pattern!r}."
                )
            negative = [p for p in pattern if p is not None and p < 0]
            if negative:  # it would match no array, silently
                raise ShardingError(
                    f"Shape pattern {pattern} has negative size {negative[0]}, which no array "
                    "has. Give the dimension's size (>= 0), or None to match any size."
                )
            spec = _check_spec_value(spec, f"Shape pattern {pattern}", allow_mapping=False)
            if spec is not None and len(spec) > len(pattern):
                raise ShardingError(
                    f"Shape pattern {pattern} (rank {len(pattern)}) has spec {spec} with "
                    f"{len(spec)} entries; give at most one entry per dimension."
                )
            patterns.append((pattern, spec))
        self.shape_patterns: tuple[tuple[tuple[int | None, ...], PartitionSpec | None], ...] = (
            tuple(patterns)
        )
        self.mesh = mesh
        if mesh is not None:  # a known mesh: fail at construction, not at the first apply
            self._check_on(*optional_mesh(mesh, caller="ShapeBasedShardingRule"))

    def __repr__(self) -> str:
        return f"ShapeBasedShardingRule({list(self.shape_patterns)!r}, mesh={self.mesh!r})"

    def _check_on(self, mesh: MeshLike | None, sizes: dict[str, int] | None) -> None:
        if sizes is not None:
            labelled = [(f"shape pattern {p}", s) for p, s in self.shape_patterns]
            check_pattern_specs("ShapeBasedShardingRule", labelled, mesh, sizes)  # type: ignore[arg-type]

    def match(self, shape: Sequence[int]) -> PartitionSpec | None:
        """The spec of the first pattern matching ``shape`` (``None`` when nothing matches).

        Example:
            >>> from jax.sharding import PartitionSpec as P
            >>> from namedaxes.rules import ShapeBasedShardingRule
            >>> ShapeBasedShardingRule({(None, 4): P("data")}).match((7, 4))
            P('data',)
        """
        rank = len(shape)
        for pattern, spec in self.shape_patterns:
            if len(pattern) != rank:
                continue
            for p, s in zip(pattern, shape):
                if p is not None and p != s:
                    break
            else:
                return spec if spec is not None else PartitionSpec()
        return None

    def apply(self, tree: Any) -> Any:
        """Return a spec per array leaf: its first matching pattern's, else replicated."""
        mesh, sizes = optional_mesh(self.mesh, caller="ShapeBasedShardingRule")
        self._check_on(mesh, sizes)
        # Specs depend on the shape alone: match and check once per distinct shape, and build
        # nothing per leaf (a Leaf record only for a leaf a message names).
        values, treedef = flatten_values(tree)
        done: dict[tuple[int, ...], PartitionSpec] = {}
        out: list[PartitionSpec | None] = []
        for i, value in enumerate(values):
            shape = shape_dtype(value)[0]
            if shape is None:
                out.append(None)
                continue
            spec = done.get(shape)
            if spec is None:
                spec = self.match(shape)
                if spec is None:
                    spec = replicated(len(shape))
                else:
                    _checked_spec(
                        lambda: leaf_at(tree, treedef, i, value),  # noqa: B023 (called at once)
                        shape,
                        spec,
                        sizes,
                        caller="ShapeBasedShardingRule",
                    )
                done[shape] = spec
            out.append(spec)
        return treedef.unflatten(out)


class PathRegexRule(ShardingRule):
    """Specs from regular expressions on each leaf's pytree path.

    Paths are rendered as ``a/b/0/c`` (a NamedArray is one leaf: its own ``array`` field is not
    part of the path) and matched with ``re.search``; the first matching pattern wins. A spec is a
    ``PartitionSpec`` (positional), ``None`` (replicated), or, for NamedArrays, a
    ``{axis_name: mesh_axes}`` mapping or ``AxisRules`` resolved through ``resolve``.

    ``PartitionSpec``s need no mesh: they are checked on their own when the rule is built, and
    against the mesh when one is given or set (every pattern's spec, matched or not, and each
    matched spec against its leaf's sizes). A mapping spec needs a mesh to be resolved.

    Args:
        rules: ``[(regex, spec), ...]`` (or a dict in insertion order).
        strict: Raise when array leaves match no pattern (else they are replicated). A pattern
            that matches no leaf is allowed: rule sets carry patterns for optional modules (an
            ``lm_head`` a tied model lacks, biases) and are applied to subtrees.
        mesh: A ``Mesh``, ``AbstractMesh`` or ``{axis: size}`` dict (``None``: the context mesh,
            if any).

    Raises:
        ShardingError: if a regex does not compile or a spec repeats a mesh axis; on ``apply``,
            if ``strict`` and leaves are unmatched (all listed), a spec names a mesh axis the mesh
            lacks, a matched spec is invalid for its leaf, or a mapping spec matches with no mesh.

    Example:
        >>> import jax.numpy as jnp
        >>> from jax.sharding import PartitionSpec as P
        >>> from namedaxes.rules import PathRegexRule
        >>> rule = PathRegexRule([(r"attn/.*/kernel", P(None, "model")), (r".*", P())],
        ...                      mesh={"model": 4})
        >>> rule.apply({"attn": {"q": {"kernel": jnp.zeros((8, 8))}}, "bias": jnp.zeros(8)})
        {'attn': {'q': {'kernel': P(None, 'model')}}, 'bias': P()}
        >>> PathRegexRule([(r"kernel$", P("fsdp"))]).apply({"kernel": jnp.zeros(8)})
        {'kernel': P('fsdp',)}
    """

    def __init__(
        self,
        rules: Sequence[tuple[str, Any]] | Mapping[str, Any],
        strict: bool = True,
        mesh: MeshLike | None = None,
    ) -> None:
        items = rules.items() if isinstance(rules, Mapping) else rules
        compiled = []
        for item in items:
            if (
                not isinstance(item, (tuple, list))
                or len(item) != 2
                or not isinstance(item[0], str)
            ):
                raise NamedTypeError(
                    f"PathRegexRule expects (regex, spec) pairs, got {item!r}. "
                    "Use e.g. [(r'.*/kernel', P(None, 'model'))]."
                )
            pattern, spec = item
            try:
                regex = re.compile(pattern)
            except re.error as e:
                raise ShardingError(
                    f"PathRegexRule pattern {pattern!r} is not a valid regex: {e}."
                ) from e
            compiled.append(
                (regex, _check_spec_value(spec, f"Pattern {pattern!r}", allow_mapping=True))
            )
        self.rules: tuple[tuple[re.Pattern[str], Any], ...] = tuple(compiled)
        self.strict = bool(strict)
        self.mesh = mesh
        if mesh is not None:  # a known mesh: fail at construction, not at the first apply
            self._check_on(*optional_mesh(mesh, caller="PathRegexRule"))

    def __repr__(self) -> str:
        shown = [(r.pattern, s) for r, s in self.rules]
        return f"PathRegexRule({shown!r}, strict={self.strict!r}, mesh={self.mesh!r})"

    def _check_on(self, mesh: MeshLike | None, sizes: dict[str, int] | None) -> None:
        if sizes is not None:
            labelled = [(f"pattern {r.pattern!r}", s) for r, s in self.rules]
            check_pattern_specs("PathRegexRule", labelled, mesh, sizes)  # type: ignore[arg-type]

    def apply(self, tree: Any) -> Any:
        """Return a spec per array leaf from the first pattern its path matches."""
        mesh, sizes = optional_mesh(self.mesh, caller="PathRegexRule")
        self._check_on(mesh, sizes)
        # Values and key paths (rebuilt from the structure), no Leaf record per leaf: records
        # (the engine's walk, field(axis_names=...) included) are made only when a pattern gives
        # a mapping, whose specs come from the tree's plan under that mapping (one per pattern).
        values, treedef = flatten_values(tree)
        keys = key_paths(tree, treedef)
        walked: list[Leaf] | None = None
        plans: dict[int, TreePlan] = {}
        out: list[Any] = []
        unmatched: list[str] = []
        checked: set[tuple[int, tuple[int, ...]]] = set()  # (pattern index, shape) seen valid
        resolved: dict[tuple[int, Any], PartitionSpec] = {}  # (pattern index, axes) -> spec
        for j, value in enumerate(values):
            shape = shape_dtype(value)[0]
            if shape is None:
                out.append(None)
                continue
            path = format_path(keys[j])
            for i, (regex, spec) in enumerate(self.rules):
                if not regex.search(path):
                    continue
                if isinstance(spec, (dict, AxisRules)):
                    # A NamedArray's spec depends on its axes alone: once per (pattern, axes).
                    key = (i, value.axes) if isinstance(value, NamedArray) else None
                    found = resolved.get(key) if key is not None else None
                    if found is None:
                        if walked is None:
                            walked = flatten_leaves(tree)[0]
                        leaf = walked[j]
                        self._check_mappable(leaf, regex.pattern, spec, mesh)
                        if i not in plans:
                            plans[i] = plan_tree(tree, as_rules(spec), mesh, caller="PathRegexRule")
                        found = planned_spec(plans[i], leaf)
                        if key is not None:
                            resolved[key] = found
                    out.append(found)
                    break
                spec = spec if spec is not None else PartitionSpec()
                if (i, shape) not in checked:
                    source = f"PathRegexRule pattern {regex.pattern!r}"
                    record = lambda: Leaf(tuple(keys[j]), value)  # noqa: B023, E731 (used at once)
                    _checked_spec(record, shape, spec, sizes, caller=source)
                    checked.add((i, shape))
                out.append(spec)
                break
            else:
                unmatched.append(path)
                out.append(replicated(len(shape)))
        if unmatched and self.strict:
            shown = ", ".join(repr(p) for p in unmatched[:20])
            more = f" (and {len(unmatched) - 20} more)" if len(unmatched) > 20 else ""
            raise ShardingError(
                f"PathRegexRule matched no pattern for {len(unmatched)} leaf path(s): {shown}{more}. "
                f"Patterns: {', '.join(repr(r.pattern) for r, _ in self.rules) or '(none)'}. Add a "
                "pattern for them, end with a catch-all (r'.*', P()), or pass strict=False."
            )
        return treedef.unflatten(out)

    @staticmethod
    def _check_mappable(leaf: Leaf, pattern: str, spec: Any, mesh: MeshLike | None) -> None:
        if leaf.axes is None:
            raise ShardingError(
                f"PathRegexRule pattern {pattern!r} gives leaf {leaf.path!r} the axis mapping "
                f"{spec!r}, but the leaf is a plain array of shape {leaf.shape} with no axis "
                "names. Give a PartitionSpec for plain arrays, or wrap the array with named()."
            )
        if mesh is None:
            raise ShardingError(
                f"PathRegexRule pattern {pattern!r} gives leaf {leaf.path!r} the axis mapping "
                f"{spec!r}, which needs a device mesh to resolve, but none was given and none is "
                "set. Pass mesh=... to PathRegexRule, or wrap the call in `with "
                "jax.set_mesh(mesh):`."
            )


def _names_mesh_axis(spec: Any) -> bool:
    return isinstance(spec, PartitionSpec) and any(entry_axes(e) for e in spec)


class CompositeShardingRule(ShardingRule):
    """Combine rules by priority: for each leaf, the first rule whose spec shards anything wins.

    "Shards anything" means the spec names at least one mesh axis. When no rule shards a leaf, the
    first rule's spec is used. Each rule is applied to the whole tree once; errors propagate (use
    ``PathRegexRule(..., strict=False)`` inside a composite so unmatched leaves fall through).
    All rules plan on one mesh: rules given meshes must agree (same axes and sizes, and the same
    devices for concrete meshes), and the composite's ``mesh`` is the most concrete of them (a
    ``Mesh`` over an ``AbstractMesh`` over a ``{axis: size}`` dict). Rules without a mesh plan on
    that one too; when no rule has a mesh, all use the context mesh.

    Args:
        *rules: ``ShardingRule`` instances, highest priority first.

    Raises:
        NamedTypeError: if no rules are given or one is not a ``ShardingRule``; on ``apply``, if a
            rule gives an array leaf something other than a ``PartitionSpec`` or ``None``.
        MeshError: if two rules were given different meshes; on ``apply``, if a rule without a
            mesh would plan on the composite's mesh while a different context mesh is set.

    Example:
        >>> import jax.numpy as jnp
        >>> from namedaxes import named
        >>> from namedaxes.rules import AutoShardingRule, CompositeShardingRule, LogicalAxisRule
        >>> x = named(jnp.zeros((8, 6)), ("batch", "embed"))
        >>> mesh = {"data": 2, "model": 4}
        >>> rule = CompositeShardingRule(LogicalAxisRule({"batch": "data"}, mesh),
        ...                              AutoShardingRule(mesh))
        >>> rule.apply({"x": x, "w": jnp.zeros((16, 4))})
        {'w': P('model', 'data'), 'x': P('data', None)}
    """

    def __init__(self, *rules: ShardingRule) -> None:
        if not rules:
            raise NamedTypeError(
                "CompositeShardingRule needs at least one rule, e.g. "
                "CompositeShardingRule(LogicalAxisRule(rules), AutoShardingRule())."
            )
        for i, r in enumerate(rules):
            if not isinstance(r, ShardingRule):
                raise NamedTypeError(
                    f"CompositeShardingRule argument {i} is {r!r} ({type(r).__name__}); every "
                    "argument must be a ShardingRule."
                )
        self.rules = tuple(rules)
        check_same_mesh("CompositeShardingRule", self.rules)

    @property
    def mesh(self) -> MeshLike | None:  # type: ignore[override]  # derived from the sub-rules
        """The mesh the rules plan on: the most concrete of the sub-rules' agreeing meshes
        (``None`` when no sub-rule has one: the context mesh). Read each time, since a sub-rule's
        mesh may be reassigned."""
        return check_same_mesh("CompositeShardingRule", self.rules)

    def _on_mesh(self, mesh: MeshLike) -> CompositeShardingRule:
        """The composite with every sub-rule that has no mesh planning on ``mesh``."""
        return CompositeShardingRule(*(r._on_mesh(mesh) for r in self.rules))

    def __repr__(self) -> str:
        return f"CompositeShardingRule({', '.join(map(repr, self.rules))})"

    def apply(self, tree: Any) -> Any:
        """Return, per array leaf, the first sub-rule's spec that names a mesh axis."""
        rules = self.rules
        mesh = self.mesh
        if mesh is not None and any(r.mesh is None for r in rules):
            found = context_mesh()
            if found is not None and not same_placement(found, mesh):
                k = next(i for i, r in enumerate(rules) if r.mesh is None)
                raise MeshError(
                    f"CompositeShardingRule: rule {k} ({type(rules[k]).__name__}) has no mesh, so "
                    f"it plans on the other rules' mesh {describe_mesh(mesh)}, but the context "
                    f"mesh is {describe_mesh(found)}. Give rule {k} its mesh, or set the context "
                    "mesh the rules use."
                )
            rules = self._on_mesh(mesh).rules
        values, treedef = flatten_values(tree)
        per_rule = [rule_specs(r, tree)[2] for r in rules]
        out: list[Any] = []
        for i, value in enumerate(values):
            if shape_dtype(value)[0] is None:
                out.append(None)
                continue
            chosen = next((specs[i] for specs in per_rule if _names_mesh_axis(specs[i])), None)
            out.append(chosen if chosen is not None else per_rule[0][i])
        return treedef.unflatten(out)
