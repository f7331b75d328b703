"""How a tree is laid out in a checkpoint: its leaves, their dotted keys and metadata records.

Pure Python and JAX tree utilities, no orbax. A tree is walked with every ``NamedArray`` as one
leaf. Each leaf is one of four kinds:

- ``named``: a NamedArray; its axis names and sizes are recorded.
- ``array``: a plain array (``jax.Array``, NumPy array or scalar, ``ShapeDtypeStruct`` in ``like``).
  One declared with ``field(axis_names=...)`` has its axis names and sizes recorded too (from the
  library's one tree walk), so it is aligned by name as a NamedArray is.
- ``scalar``: a Python ``bool``/``int``/``float``/``complex``/``str``; its value is recorded.
- ``static``: anything else (the activation function of an equinox module, say): not data. Its path
  is recorded and ``restore`` takes the object from ``like``.

Leaves are matched between a checkpoint and ``like`` by their dotted key (``params.blocks.0.w``), so
a checkpoint saved from a dict restores into an equinox module with the same field names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.tree_util import DictKey, FlattenedIndexKey, GetAttrKey, SequenceKey

from .._array import NamedArray
from .._axis import Axis
from .._errors import AxisError, CheckpointStructureError, NamedTypeError, format_path
from .._partitioning._tree import leaf_axes, walk
from ._dtypes import check_storable

__all__ = [
    "Leaf",
    "describe",
    "key_of",
    "kind_of",
    "leaves_of",
    "part_of",
    "rebuild",
    "store_keys",
]

_SCALARS = (bool, int, float, complex, str)
_SAFE_KEY = re.compile(r"[A-Za-z0-9_.\-]+")


@dataclass(frozen=True)
class Leaf:
    """One leaf of a tree: its key path, dotted key, kind and value, and its axes (a NamedArray's,
    or a ``field(axis_names=...)`` array's names with sizes from its shape; ``None``: no names)."""

    path: tuple[Any, ...]
    key: str
    kind: str
    value: Any
    axes: tuple[Axis, ...] | None = None


def kind_of(x: Any) -> str:
    """``named``, ``array``, ``scalar`` or ``static`` (see the module docstring)."""
    if isinstance(x, NamedArray):
        return "named"
    if isinstance(x, _SCALARS):
        return "scalar"
    if not isinstance(x, type) and hasattr(x, "shape") and hasattr(x, "dtype"):
        return "array"
    return "static"


def part_of(k: Any) -> str:
    """One component of a dotted key: a dict key, sequence index or attribute name."""
    for attr in ("key", "idx", "name"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def key_of(path: tuple[Any, ...]) -> str:
    """The dotted key of a key path: ``params.blocks.0.w`` (``root`` for a tree that is one leaf).

    Example:
        >>> import jax
        >>> [key_of(p) for p, _ in jax.tree_util.tree_flatten_with_path({"a": [1, 2]})[0]]
        ['a.0', 'a.1']
    """
    return ".".join(part_of(k) for k in path) if path else "root"


def leaves_of(tree: Any) -> list[Leaf]:
    """Every leaf of ``tree`` with NamedArrays as single leaves.

    NamedArrays whose array is ``None`` (``eqx.filter`` leaves those) hold no data and are skipped.

    Raises:
        CheckpointStructureError: if two leaves have the same dotted key (a dict key with a dot in
            it can collide with a nested one), naming both paths.
        AxisError: for a ``field(axis_names=...)`` field holding a NamedArray with other names.
    """
    flat, _ = jax.tree_util.tree_flatten_with_path(
        tree, is_leaf=lambda x: isinstance(x, NamedArray)
    )
    # The one walk's names, one per leaf of tree_flatten(tree): every leaf here but the
    # NamedArrays without an array, which it skips too.
    infos = iter(walk(tree, jax.tree_util.tree_structure(tree)).infos)
    out: list[Leaf] = []
    seen: dict[str, tuple[Any, ...]] = {}
    for path, value in flat:
        if isinstance(value, NamedArray) and value.array is None:
            continue
        axes = _axes(next(infos), value)
        key = key_of(path)
        if key in seen:
            raise CheckpointStructureError(
                f"Leaves {format_path(seen[key])!r} and {format_path(path)!r} both have the dotted "
                f"key {key!r}, which names a leaf in a checkpoint. Rename a dict key so that no key "
                "contains a '.' that imitates nesting."
            )
        seen[key] = path
        out.append(Leaf(tuple(path), key, kind_of(value), value, axes))
    return out


def _axes(info: Any, value: Any) -> tuple[Axis, ...] | None:
    try:
        return leaf_axes(info, value)
    except AxisError:
        # A field whose rank differs from its declared names (its module stacked by
        # nn.Stacked, say) has no names to align by: it is stored by position. Placing it by a
        # mapping still refuses it, naming the field.
        return None


def _json_key(k: Any) -> list[Any]:
    if isinstance(k, DictKey):
        key = k.key
        if isinstance(key, (str, int)) and not isinstance(key, bool):
            return ["key", key]
        return ["key", repr(key)]
    if isinstance(k, SequenceKey):
        return ["idx", k.idx]
    if isinstance(k, GetAttrKey):
        return ["attr", k.name]
    if isinstance(k, FlattenedIndexKey):
        return ["idx", k.key]
    return ["key", part_of(k)]


def store_keys(leaves: list[Leaf]) -> list[str]:
    """The key orbax stores each leaf's array under: its dotted key when that is plain ASCII
    (``[A-Za-z0-9_.-]``), else ``leafN`` (``N`` its index) with ``_`` appended until no other leaf
    has that key, so a fallback never overwrites another leaf's array. Each key is recorded in the
    leaf's metadata (``store``) and read from there, so checkpoints written with another naming
    restore as they were.

    Example:
        >>> import jax.numpy as jnp
        >>> store_keys(leaves_of({"leaf2": jnp.zeros(1), "w/x": jnp.ones(1), "b": jnp.ones(1)}))
        ['b', 'leaf2', 'leaf2_']
    """
    taken = {leaf.key for leaf in leaves if _SAFE_KEY.fullmatch(leaf.key)}
    out = []
    for i, leaf in enumerate(leaves):
        key = leaf.key
        if not _SAFE_KEY.fullmatch(key):
            key = f"leaf{i}"
            while key in taken:
                key += "_"
            taken.add(key)
        out.append(key)
    return out


def describe(leaf: Leaf, store: str) -> dict[str, Any]:
    """The JSON metadata record of one leaf (what ``restore`` checks ``like`` against); an
    array's values are stored under ``store`` (see ``store_keys``).

    Raises:
        NamedTypeError: for an abstract or traced array, which holds no values to save.
        CheckpointDtypeError: for a dtype checkpoints cannot store (``uint4``, say).
    """
    rec: dict[str, Any] = {
        "key": leaf.key,
        "path": [_json_key(k) for k in leaf.path],
        "kind": leaf.kind,
    }
    v = leaf.value
    if leaf.kind in ("named", "array"):
        arr = v.array if leaf.kind == "named" else v
        if isinstance(arr, (jax.ShapeDtypeStruct, jax.core.Tracer)):
            raise NamedTypeError(
                f"Leaf {format_path(leaf.path)!r} is {type(arr).__name__} {arr!r}, which holds no "
                "values to save. Save concrete arrays, outside jax.jit / eval_shape."
            )
        if jax.dtypes.issubdtype(arr.dtype, jax.dtypes.prng_key):
            raise NamedTypeError(
                f"Leaf {format_path(leaf.path)!r} holds typed PRNG keys ({arr.dtype}). Save "
                "jax.random.key_data(key) and rebuild with jax.random.wrap_key_data after restore."
            )
        check_storable(arr.dtype, leaf.key)
        rec["store"] = store
        rec["dtype"] = np.dtype(arr.dtype).name
        rec["shape"] = [int(d) for d in arr.shape]
        if leaf.axes is not None:  # a NamedArray's, or a field(axis_names=...) array's
            rec["axes"] = [[a.name, a.size] for a in leaf.axes]
    elif leaf.kind == "scalar":
        rec["type"] = type(v).__name__
        rec["value"] = [v.real, v.imag] if isinstance(v, complex) else v
    else:
        rec["type"] = f"{type(v).__module__}.{type(v).__qualname__}"
    return rec


def scalar_value(rec: dict[str, Any]) -> Any:
    """The Python value a ``scalar`` record holds."""
    v = rec["value"]
    return complex(*v) if rec["type"] == "complex" else v


def rebuild(items: list[tuple[list[Any], Any]]) -> Any:
    """Nested dicts and lists from ``(json path, value)`` pairs.

    Dict keys and attribute names (equinox fields, NamedTuple fields such as optax states) become
    dict keys, sequence positions become list entries (``None`` where a position held no leaf).

    Example:
        >>> rebuild([([["key", "a"], ["idx", 1]], 5), ([["attr", "b"]], 6)])
        {'a': [None, 5], 'b': 6}
    """
    if len(items) == 1 and not items[0][0]:
        return items[0][1]
    groups: dict[Any, list[tuple[list[Any], Any]]] = {}
    is_list = all(path and path[0][0] == "idx" for path, _ in items)
    for path, value in items:
        groups.setdefault(path[0][1], []).append((path[1:], value))
    if is_list:
        out: list[Any] = [None] * (max(groups) + 1)
        for i, sub in groups.items():
            out[i] = rebuild(sub)
        return out
    return {k: rebuild(sub) for k, sub in groups.items()}
