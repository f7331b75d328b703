"""Logical-to-physical rules: ``ResourceMapping``, ``AxisRules`` and their normalization.

A ``ResourceMapping`` is the everyday form (``{"batch": "data"}``); ``AxisRules`` is the general one:
an ordered, immutable, hashable sequence of ``(logical_name, mesh_axes)`` pairs in which a name may
repeat (later pairs are fallbacks). Everything else in the package works on ``AxisRules``; mappings
are converted once (and the conversion is cached) by ``as_rules``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, TypeAlias

from .._caches import register
from .._errors import MappingTypeError, ShardingError, format_names
from .._spec import entry_of

__all__ = [
    "AxisRules",
    "MeshAxes",
    "ResourceMapping",
    "RulesLike",
    "UnsatisfiedPolicy",
    "as_rules",
    "merge_rules",
]

#: Where one logical axis goes: one mesh axis, several (split over their product), or ``None``
#: (explicitly replicated).
MeshAxes: TypeAlias = str | tuple[str, ...] | None
#: A logical axis name to the mesh axes it is split over.
ResourceMapping: TypeAlias = Mapping[str, MeshAxes]
#: What to do when rules exist for an axis but none of them applies.
UnsatisfiedPolicy: TypeAlias = Literal["error", "replicate"]
_POLICIES = ("error", "replicate")

# Normalized target of one rule: a non-empty tuple of distinct mesh-axis names, or None.
_Target: TypeAlias = tuple[str, ...] | None


def _normalize_target(name: Any, value: Any) -> _Target:
    """Check and normalize one rule's mesh axes; errors name the logical axis and the value."""
    if value is None:
        return None
    if isinstance(value, str):
        if not value:
            raise MappingTypeError(
                f"Logical axis {name!r} is mapped to an empty mesh-axis name ''. "
                "Use a mesh axis name such as 'data', or None to replicate."
            )
        return (value,)
    if isinstance(value, (tuple, list)):
        bad = [v for v in value if not isinstance(v, str) or not v]
        if bad:
            raise MappingTypeError(
                f"Logical axis {name!r} is mapped to {value!r}, which contains {bad[0]!r} "
                f"({type(bad[0]).__name__}); every mesh axis must be a non-empty string. "
                "Use e.g. ('data', 'model')."
            )
        target = tuple(value)
        if len(set(target)) != len(target):
            raise ShardingError(
                f"Logical axis {name!r} is mapped to {value!r}, which names a mesh axis twice. "
                "List each mesh axis once."
            )
        return target or None  # () means "split over nothing": replicated
    raise MappingTypeError(
        f"Logical axis {name!r} is mapped to {value!r} ({type(value).__name__}); a mapping value "
        "must be a mesh axis name (str), a tuple of mesh axis names, or None (replicated). "
        f"Use e.g. {{{name!r}: 'data'}}."
    )


class AxisRules:
    """Ordered logical-to-mesh rules; a name may repeat, later pairs being fallbacks.

    ``resolve`` processes the pairs in order: a pair gives its mesh axes to the array's axis of that
    name if the axis has no placement yet, the mesh axes are unused by the array and their size
    divides the axis size. Rule order is priority. When pairs exist for a name but none applies,
    ``unsatisfied`` decides: ``"error"`` raises a ``ShardingError``, ``"replicate"`` leaves the
    axis unsharded.

    Immutable and hashable (usable as a cache key); equal rules compare equal whether mesh axes were
    given as ``"data"`` or ``("data",)``. An empty tuple of mesh axes means the same as ``None``.

    Args:
        pairs: ``(logical_name, mesh_axes)`` pairs, a ``ResourceMapping``, or another ``AxisRules``
            (whose pairs are copied; its policy is replaced by ``unsatisfied``).
        unsatisfied: ``"error"`` (default) or ``"replicate"``.

    Raises:
        MappingTypeError: if a name is not a non-empty string or mesh axes have the wrong type.
        ShardingError: if ``unsatisfied`` is not a known policy, or a pair names a mesh axis twice.

    Example:
        >>> rules = AxisRules([("batch", ("replica", "data")), ("batch", "data"), ("mlp", "model")])
        >>> rules.candidates("batch")
        (('replica', 'data'), ('data',))
        >>> rules
        AxisRules([('batch', ('replica', 'data')), ('batch', 'data'), ('mlp', 'model')], unsatisfied='error')
    """

    __slots__ = ("_pairs", "_unsatisfied", "_by_name", "_mesh_axes", "_hash")

    _pairs: tuple[tuple[str, _Target], ...]
    _unsatisfied: UnsatisfiedPolicy
    _by_name: dict[str, tuple[_Target, ...]]
    _mesh_axes: tuple[str, ...]
    _hash: int

    def __init__(
        self,
        pairs: Iterable[tuple[str, MeshAxes]] | ResourceMapping | AxisRules = (),
        unsatisfied: UnsatisfiedPolicy = "error",
    ) -> None:
        if unsatisfied not in _POLICIES:
            raise ShardingError(
                f"unsatisfied must be one of {format_names(_POLICIES)}, got {unsatisfied!r}."
            )
        if isinstance(pairs, AxisRules):
            normalized = pairs._pairs
        else:
            items: Iterable[Any] = pairs.items() if isinstance(pairs, Mapping) else pairs
            if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
                raise MappingTypeError(
                    f"AxisRules expects (logical_name, mesh_axes) pairs or a mapping, got {pairs!r} "
                    f"({type(pairs).__name__}). Use e.g. AxisRules([('batch', 'data')])."
                )
            out = []
            for item in items:
                if not isinstance(item, (tuple, list)) or len(item) != 2:
                    given = f" in {pairs!r}" if isinstance(pairs, (list, tuple)) else ""
                    raise MappingTypeError(
                        f"Each rule must be a (logical_name, mesh_axes) pair, got {item!r}{given}. "
                        "Use e.g. [('batch', 'data')], or a dict {'batch': 'data'}."
                    )
                name, value = item
                if not isinstance(name, str) or not name:
                    raise MappingTypeError(
                        f"A logical axis name must be a non-empty string, got {name!r} "
                        f"({type(name).__name__}) in rule {tuple(item)!r}."
                    )
                out.append((name, _normalize_target(name, value)))
            normalized = tuple(out)
        by_name: dict[str, list[_Target]] = {}
        mesh_axes: dict[str, None] = {}
        for name, target in normalized:
            by_name.setdefault(name, []).append(target)
            for m in target or ():
                mesh_axes[m] = None
        set_ = object.__setattr__
        set_(self, "_pairs", normalized)
        set_(self, "_unsatisfied", unsatisfied)
        set_(self, "_by_name", {k: tuple(v) for k, v in by_name.items()})
        set_(self, "_mesh_axes", tuple(mesh_axes))
        set_(self, "_hash", hash((normalized, unsatisfied)))

    # -- immutability / value semantics ---------------------------------------------------

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(
            f"AxisRules is immutable; build a new one instead of setting {name!r}."
        )

    def __delattr__(self, name: str) -> None:
        raise AttributeError("AxisRules is immutable.")

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AxisRules):
            return NotImplemented
        return self._pairs == other._pairs and self._unsatisfied == other._unsatisfied

    def __reduce__(self) -> tuple[Any, ...]:
        return (AxisRules, (list(self.pairs), self._unsatisfied))

    def __repr__(self) -> str:
        return f"AxisRules({list(self.pairs)!r}, unsatisfied={self._unsatisfied!r})"

    # -- queries ------------------------------------------------------------------------------

    @property
    def pairs(self) -> tuple[tuple[str, MeshAxes], ...]:
        """The pairs in order, a single mesh axis shown as a string."""
        return tuple((n, entry_of(t)) for n, t in self._pairs)

    @property
    def ordered_pairs(self) -> tuple[tuple[str, tuple[str, ...] | None], ...]:
        """The pairs in order with normalized targets (a tuple of mesh axes, or ``None``)."""
        return self._pairs

    @property
    def unsatisfied(self) -> UnsatisfiedPolicy:
        """The policy for axes that have rules of which none applies."""
        return self._unsatisfied

    @property
    def names(self) -> tuple[str, ...]:
        """The logical names that have rules, in first-appearance order."""
        return tuple(self._by_name)

    @property
    def mesh_axes(self) -> tuple[str, ...]:
        """Every mesh axis named by any rule, in first-appearance order."""
        return self._mesh_axes

    def candidates(self, name: str) -> tuple[tuple[str, ...] | None, ...]:
        """The normalized targets for ``name`` in order (``()`` when it has no rules).

        Example:
            >>> AxisRules({"batch": "data"}).candidates("batch")
            (('data',),)
        """
        return self._by_name.get(name, ())

    def first(self, name: str) -> MeshAxes:
        """The first rule's mesh axes for ``name`` (``None`` when unmapped or mapped to ``None``).

        Example:
            >>> AxisRules([("embed", ("data", "model")), ("embed", "data")]).first("embed")
            ('data', 'model')
        """
        found = self._by_name.get(name)
        return entry_of(found[0]) if found else None

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __len__(self) -> int:
        return len(self._pairs)

    def __iter__(self) -> Iterator[tuple[str, MeshAxes]]:
        return iter(self.pairs)

    # -- building -------------------------------------------------------------------------------

    def replace(
        self,
        overrides: Mapping[str, MeshAxes] | None = None,
        *,
        unsatisfied: UnsatisfiedPolicy | None = None,
    ) -> AxisRules:
        """A copy in which each name in ``overrides`` has exactly the one given rule.

        Example:
            >>> AxisRules([("batch", "data"), ("batch", None)]).replace({"batch": "model"})
            AxisRules([('batch', 'model')], unsatisfied='error')
        """
        overrides = dict(overrides or {})
        kept = [(n, entry_of(t)) for n, t in self._pairs if n not in overrides]
        return AxisRules(kept + list(overrides.items()), unsatisfied or self._unsatisfied)


#: Anything accepted where rules are: ``AxisRules``, a ``ResourceMapping``, or a list or tuple of
#: ``(logical_name, mesh_axes)`` pairs (flax's form).
RulesLike: TypeAlias = AxisRules | ResourceMapping | Sequence[tuple[str, MeshAxes]]


@functools.lru_cache(maxsize=1024)
def _rules_from_items(items: tuple[tuple[Any, Any], ...]) -> AxisRules:
    return AxisRules(items)


def as_rules(rules: RulesLike | None) -> AxisRules:
    """Normalize ``AxisRules`` / ``ResourceMapping`` / pairs / ``None`` (no rules) to ``AxisRules``.

    Conversions of mappings with hashable values are cached, so the hot path pays one dict walk.

    Raises:
        MappingTypeError: if ``rules`` is neither, or holds a mis-typed value.

    Example:
        >>> as_rules({"batch": "data"})
        AxisRules([('batch', 'data')], unsatisfied='error')
        >>> as_rules([("embed", "model"), ("embed", "data")])
        AxisRules([('embed', 'model'), ('embed', 'data')], unsatisfied='error')
    """
    if isinstance(rules, AxisRules):
        return rules
    if rules is None:
        return _EMPTY
    if isinstance(rules, Mapping):
        items = tuple(rules.items())
        try:
            return _rules_from_items(items)
        except TypeError as e:  # an unhashable value (a list): validate without the cache
            if isinstance(e, MappingTypeError):
                raise
            return AxisRules(items)
    if isinstance(rules, (list, tuple)):
        try:
            return _rules_from_items(tuple(tuple(p) if isinstance(p, list) else p for p in rules))
        except TypeError:
            # Unhashable pieces, or a malformed rule: validate without the cache, on the value as
            # given (so a message shows what the caller passed).
            return AxisRules(rules)
    raise MappingTypeError(
        f"Expected axis rules: a dict of logical name -> mesh axes, AxisRules, or a list of "
        f"(logical_name, mesh_axes) pairs; got {rules!r} ({type(rules).__name__}). "
        "Use e.g. {'batch': 'data'} or [('batch', 'data')]."
    )


_EMPTY = AxisRules(())
register(_rules_from_items.cache_clear)


def merge_rules(inner: RulesLike, outer: RulesLike) -> RulesLike:
    """Combine two mappings so that ``inner`` wins on every name it mentions.

    Rule order is priority, so inner's names come first in either form. Two plain mappings merge
    into a dict: inner's entries, then outer's for the names inner does not mention. Otherwise the
    result is ``AxisRules`` with inner's pairs before outer's (outer's pairs for inner's names stay
    as fallbacks); the policy is inner's when inner is ``AxisRules``, else outer's.

    Example:
        >>> merge_rules({"batch": "model"}, {"batch": "data", "embed": None})
        {'batch': 'model', 'embed': None}
    """
    if isinstance(inner, Mapping) and isinstance(outer, Mapping):
        as_rules(inner)  # validate both before merging
        as_rules(outer)
        return {**inner, **{k: v for k, v in outer.items() if k not in inner}}
    inner_r, outer_r = as_rules(inner), as_rules(outer)
    policy = inner_r.unsatisfied if isinstance(inner, AxisRules) else outer_r.unsatisfied
    # Rule order is priority, so listing inner's pairs first makes them win while outer's pairs
    # for the same names remain as fallbacks.
    return AxisRules(list(inner_r.pairs) + list(outer_r.pairs), policy)
