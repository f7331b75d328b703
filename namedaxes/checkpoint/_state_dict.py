"""Interchange with other frameworks: flat dotted-key state dicts and safetensors files.

A state dict maps dotted keys (``blocks.0.attn.w``) to arrays. Layers stacked on one axis (the
``layer`` axis of ``namedaxes.nn.Stacked``) are unstacked into one key per layer: the layer index
replaces a ``stacked`` path component (the field ``Stacked`` keeps its layers in) or, when the path
has none, goes before the leaf's own name (``{"blocks": {"w": W}}`` gives ``blocks.0.w``,
``blocks.1.w``, ...). ``from_state_dict`` inverts it using ``like``'s structure.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._array import NamedArray
from .._axis import Axis
from .._errors import (
    CheckpointAxisError,
    CheckpointDtypeError,
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointStructureError,
    NamedTypeError,
    format_axes,
    format_names,
)
from .._partitioning._jit_args import check_live
from ..models._safetensors import CODES, SafetensorsFile, write_safetensors
from ._dtypes import python_array, python_scalar
from ._layout import Leaf, leaves_of, part_of
from ._placement import like_sharding

__all__ = ["from_state_dict", "load_safetensors", "save_safetensors", "to_state_dict"]

STACKED_FIELD = "stacked"


def _layer_keys(leaf: Leaf, n: int) -> list[str]:
    """The per-layer keys of a stacked leaf. Built from its path's components (a dict key may hold
    a dot: ``{"model.blocks": ...}``), never by splitting its dotted key."""
    parts = [part_of(k) for k in leaf.path]
    if STACKED_FIELD in parts:
        i = len(parts) - 1 - parts[::-1].index(STACKED_FIELD)
        return [".".join(parts[:i] + [str(j)] + parts[i + 1 :]) for j in range(n)]
    head, tail = parts[:-1], parts[-1:]
    return [".".join(head + [str(j)] + tail) for j in range(n)]


def _check_stacked_axis(stacked_axis: Any) -> None:
    if stacked_axis is not None and not isinstance(stacked_axis, str):
        raise NamedTypeError(f"stacked_axis must be an axis name or None, got {stacked_axis!r}.")


def to_state_dict(tree: Any, *, stacked_axis: str | None = "layer") -> dict[str, Any]:
    """A flat ``{dotted key: array}`` dict of ``tree``'s data, stacked layers unstacked.

    NamedArrays become their plain arrays (axis order as stored); plain arrays and Python scalars
    are kept; leaves that are not data (functions in equinox modules) are left out. A NamedArray
    (or an array declared with ``field(axis_names=...)``) with a ``stacked_axis`` axis gives one
    entry per layer (that axis removed).

    Args:
        tree: Any pytree of NamedArrays, arrays and scalars.
        stacked_axis: The axis that stacks layers (``None``: never unstack).

    Raises:
        CheckpointStructureError: if two leaves map to the same key.
        DonatedArrayError: for an array donated to a step, whose buffer is gone (named).

    Example:
        >>> import jax.numpy as jnp, namedaxes as na
        >>> w = na.named(jnp.zeros((2, 4, 3)), ("layer", "embed", "mlp"))
        >>> sorted(to_state_dict({"blocks": {"stacked": {"w": w}}, "head": jnp.ones(3)}))
        ['blocks.0.w', 'blocks.1.w', 'head']
    """
    return _state_dict(tree, stacked_axis, "to_state_dict")[0]


def _state_dict(
    tree: Any, stacked_axis: str | None, caller: str
) -> tuple[dict[str, Any], dict[str, tuple[str, ...]]]:
    """The state dict of ``tree``, and the axis names of each entry that came from a NamedArray or
    a ``field(axis_names=...)`` array (a layer's entry has its leaf's names without
    ``stacked_axis``)."""
    _check_stacked_axis(stacked_axis)
    check_live(tree, caller)
    out: dict[str, Any] = {}
    names: dict[str, tuple[str, ...]] = {}
    for leaf in leaves_of(tree):
        if leaf.kind == "static":
            continue
        # NamedArrays and field(axis_names=...) arrays alike: their names, their data
        own = None if leaf.axes is None else tuple(a.name for a in leaf.axes)
        data = leaf.value.array if leaf.kind == "named" else leaf.value
        axis = _stacked_index(leaf.axes, stacked_axis)
        if leaf.axes is not None and axis is not None:
            keys = _layer_keys(leaf, leaf.axes[axis].size)
            values = [jnp.take(data, j, axis=axis) for j in range(len(keys))]
            own = tuple(n for n in own or () if n != stacked_axis)
        else:
            keys = [leaf.key]
            values = [data]
        for k, v in zip(keys, values):
            if k in out:
                raise CheckpointStructureError(
                    f"Two leaves map to state-dict key {k!r} (the second is {leaf.key!r}). Rename "
                    "a dict key so that no key contains a '.' or a layer index that imitates another."
                )
            out[k] = v
            if own is not None:
                names[k] = own
    return out, names


def _stacked_index(axes: tuple[Axis, ...] | None, stacked_axis: str | None) -> int | None:
    """The position of ``stacked_axis`` among a leaf's ``axes`` (``None``: not stacked)."""
    names = [a.name for a in axes or ()]
    return names.index(stacked_axis) if stacked_axis in names else None


def _take(state: dict[str, Any], key: str, used: set[str]) -> Any:
    if key not in state:
        raise CheckpointStructureError(
            f"The state dict has no key {key!r}, which like needs. Keys there: "
            f"{format_names(sorted(state)[:8])}{' ...' if len(state) > 8 else ''}."
        )
    used.add(key)
    return state[key]


def _as_array(key: str, value: Any, like: Any, cast: bool) -> Any:
    """A state-dict value for an array leaf: arrays and NamedArrays as they are; a Python number
    or a list of numbers (``to_state_dict`` keeps Python scalars) converted to like's dtype by the
    scalar rules (``_dtypes.python_array``).

    Raises:
        CheckpointStructureError: for a value that is neither an array nor numbers.
        CheckpointDtypeError: for numbers of another kind without ``cast``, or ones like's dtype
            cannot hold.
    """
    if isinstance(value, NamedArray) or (hasattr(value, "shape") and hasattr(value, "dtype")):
        return value
    subject = f"State-dict key {key!r} is a Python {type(value).__name__} ({value!r})"
    if isinstance(value, (bool, int, float, complex, str, list, tuple)):
        return python_array(value, like.dtype, cast, subject)
    raise CheckpointStructureError(
        f"{subject}, not an array; like has an array of {np.dtype(like.dtype).name} with shape "
        f"{tuple(like.shape)} there. Give an array (NumPy or JAX), a Python number or a list of "
        "numbers."
    )


def _as_dtype(key: str, value: Any, dtype: Any, cast: bool) -> Any:
    have = np.dtype(value.dtype)
    if have == np.dtype(dtype):
        return value
    if not cast:
        raise CheckpointDtypeError(
            f"State-dict key {key!r} is {have.name} but like has {np.dtype(dtype).name}. Pass "
            "cast=True to convert to like's dtypes."
        )
    if (
        isinstance(value, np.ndarray)
        and jnp.issubdtype(have, jnp.floating)
        and jnp.issubdtype(dtype, jnp.integer)
    ):  # as JAX's astype (and restore) converts: saturating, NaN to 0; NumPy's wraps
        info = np.iinfo(np.dtype(dtype))
        wide = np.nan_to_num(value.astype(np.float64), nan=0.0)
        value = np.trunc(np.clip(wide, info.min, info.max))
    return value.astype(dtype)


def _aligned(key: str, value: Any, axes: tuple[Axis, ...] | None, names: Any = None) -> Any:
    """A state-dict value as an array in ``axes``' order. A NamedArray entry, or a plain one whose
    axis ``names`` are known (a safetensors file's metadata), is aligned by name: its axes must be
    ``axes``, in any order. Other values are returned as they are."""
    if isinstance(value, NamedArray):
        names, value = value.axis_names, value.array
    if axes is None or names is None:  # like holds a plain array here: only the shape is checked
        return value
    shape = tuple(np.shape(value))
    if len(names) != len(shape):
        raise CheckpointAxisError(
            f"State-dict entry for {key!r} is named ({format_names(names)}) but has shape "
            f"{shape}; like has ({format_axes(axes)}). Give one axis name per dimension."
        )
    mine = dict(zip(names, shape))
    if set(mine) != {a.name for a in axes} or any(mine[a.name] != a.size for a in axes):
        raise CheckpointAxisError(
            f"State-dict entry for {key!r} has axes ({format_axes(mine)}) but like has "
            f"({format_axes(axes)}). Rename or resize the entry's axes to like's, or restore into "
            "a like with these axes."
        )
    order = [list(names).index(a.name) for a in axes]
    return value if order == sorted(order) else value.transpose(order)


def _place(x: Any, like: Any, key: str) -> jax.Array:
    sharding = like_sharding(like, key)
    return jax.device_put(x, sharding) if sharding is not None else jnp.asarray(x)


def from_state_dict(
    like: Any, state: dict[str, Any], *, stacked_axis: str | None = "layer", cast: bool = False
) -> Any:
    """Build a tree shaped like ``like`` from a flat state dict (``to_state_dict``'s inverse).

    Each array is checked against ``like`` (dtype; shape from its axes) and placed with ``like``'s
    sharding if it has one (use ``na.shard`` afterwards to place by a mapping). A NamedArray entry
    is aligned to ``like``'s axes (a NamedArray's, or a ``field(axis_names=...)`` array's) by name,
    transposed if its axes are in another order; a plain array must have ``like``'s shape. A
    Python number (or list of numbers) for an array leaf is converted to ``like``'s dtype when it
    is of that dtype's kind (an ``int`` for any integer dtype), as a weakly typed JAX scalar is;
    another kind needs ``cast=True``. Per-layer keys are stacked back on ``stacked_axis``.

    Args:
        like: A tree with the wanted structure, concrete or from ``eval_shape`` (under
            ``jax.set_mesh`` its shardings are read onto that mesh, Auto or Explicit).
        state: ``{dotted key: array}`` (NumPy or JAX arrays, NamedArrays, or Python scalars).
        stacked_axis: The axis that stacks layers (``None``: never stack).
        cast: Convert arrays whose dtype differs from ``like``'s instead of raising.

    Raises:
        CheckpointStructureError: for a key ``like`` needs that ``state`` lacks, an extra key, or
            a value for an array leaf that is neither an array nor numbers.
        CheckpointAxisError: for a NamedArray whose axes differ from ``like``'s (names or sizes),
            or a plain array whose shape does not match them.
        MeshError: for a ``like`` sharded on an abstract mesh with no such concrete mesh set.
        CheckpointDtypeError: for a dtype that differs and ``cast=False``, or a Python number
            that like's dtype cannot hold.

    Example:
        >>> import jax.numpy as jnp, numpy as np, namedaxes as na
        >>> like = {"w": na.named(jnp.zeros((2, 3)), ("embed", "mlp"))}
        >>> from_state_dict(like, {"w": np.ones((2, 3), np.float32)})["w"]
        NamedArray(float32, embed=2, mlp=3)
        >>> entry = na.named(jnp.ones((3, 2)), ("mlp", "embed"))  # aligned by name
        >>> from_state_dict(like, {"w": entry})["w"]
        NamedArray(float32, embed=2, mlp=3)
    """
    return _from_state_dict(like, state, stacked_axis, cast, {})


def _from_state_dict(
    like: Any,
    state: dict[str, Any],
    stacked_axis: str | None,
    cast: bool,
    names: dict[str, Any],
) -> Any:
    """``from_state_dict``, with the axis names of plain entries (``names``: a safetensors
    file's metadata) to align them by."""
    _check_stacked_axis(stacked_axis)
    if not isinstance(state, dict):
        raise NamedTypeError(
            f"state must be a dict of dotted keys to arrays, got {type(state).__name__}."
        )
    used: set[str] = set()
    likes = leaves_of(like)
    out = []
    for leaf in likes:
        v = leaf.value
        if leaf.kind == "static":
            out.append(v)
            continue
        if leaf.kind == "scalar":
            value = _take(state, leaf.key, used)
            if not isinstance(value, str) and np.ndim(value) == 0:
                value = np.asarray(value).item()  # a 0-d array (safetensors) back to Python
            subject = f"State-dict key {leaf.key!r} is a Python {type(value).__name__} ({value!r})"
            out.append(python_scalar(value, v, cast, subject))
            continue
        wanted = v.array if leaf.kind == "named" else v
        axes = leaf.axes  # a NamedArray's or a field(axis_names=...) array's: aligned by name
        stacked = _stacked_index(axes, stacked_axis)
        if axes is not None and stacked is not None:
            keys = _layer_keys(leaf, axes[stacked].size)
            per_layer = tuple(a for a in axes if a.name != stacked_axis)
            parts = [
                np.asarray(
                    _aligned(
                        k,
                        _as_array(k, _take(state, k, used), wanted, cast),
                        per_layer,
                        names.get(k),
                    )
                )
                for k in keys
            ]
            shapes = {p.shape for p in parts}
            if len(shapes) != 1:
                raise CheckpointAxisError(
                    f"The per-layer keys of {leaf.key!r} ({format_names(keys[:4])}...) have "
                    f"different shapes {sorted(shapes)}; like has ({format_axes(axes)})."
                )
            x = np.stack(parts, axis=stacked)
        else:
            value = _as_array(leaf.key, _take(state, leaf.key, used), wanted, cast)
            x = _aligned(leaf.key, value, axes, names.get(leaf.key))
        shape = tuple(int(d) for d in wanted.shape)
        if tuple(np.shape(x)) != shape:
            what = f"axes ({format_axes(axes)}), shape {shape}" if axes else f"shape {shape}"
            raise CheckpointAxisError(
                f"State-dict entry for {leaf.key!r} has shape {tuple(np.shape(x))} but like has "
                f"{what}. Transpose or reshape it to like's layout first, or give it axis names "
                "(a NamedArray entry is aligned by name)."
            )
        x = _as_dtype(leaf.key, x, wanted.dtype, cast)
        x = _place(x, wanted, leaf.key)
        out.append(NamedArray(x, v.axes) if leaf.kind == "named" else x)
    extra = sorted(set(state) - used)
    if extra:
        raise CheckpointStructureError(
            f"The state dict has {len(extra)} key(s) like does not use: {format_names(extra[:8])}"
            f"{' ...' if len(extra) > 8 else ''}. Drop them, or restore into a like that has them."
        )
    flat = jax.tree_util.tree_leaves(like, is_leaf=lambda x: isinstance(x, NamedArray))
    it = iter(out)
    merged = [x if isinstance(x, NamedArray) and x.array is None else next(it) for x in flat]
    treedef = jax.tree_util.tree_structure(like, is_leaf=lambda x: isinstance(x, NamedArray))
    return jax.tree_util.tree_unflatten(treedef, merged)


# -- safetensors --------------------------------------------------------------------------------

_AXES_KEY = "namedaxes.axes"


def save_safetensors(
    path: str | os.PathLike[str], tree: Any, *, stacked_axis: str | None = "layer"
) -> None:
    """Write ``tree``'s data to a ``.safetensors`` file with ``to_state_dict``'s keys.

    Arrays are gathered to this process one at a time (multi-process runs: gather first, and
    write from one process); Python scalars are stored as 0-d arrays. The axis names of each tensor
    that came from a NamedArray go in the file's metadata (``namedaxes.axes``: JSON
    ``{key: names}``, per tensor key; a layer's without ``stacked_axis``), which
    ``load_safetensors`` aligns by.

    Raises:
        DonatedArrayError: for an array donated to a step, whose buffer is gone (named).
        CheckpointDtypeError: for a dtype safetensors files do not hold here (int4, say), naming
            the leaf; bfloat16 and float8 (e4m3fn, e5m2) are written.

    Example:
        >>> import tempfile, jax.numpy as jnp, namedaxes as na
        >>> f = tempfile.mkdtemp() + "/w.safetensors"
        >>> like = {"w": na.named(jnp.arange(6.0).reshape(2, 3), ("embed", "mlp"))}
        >>> save_safetensors(f, like)
        >>> load_safetensors(f, like)["w"].array.tolist()
        [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    """
    state, names = _state_dict(tree, stacked_axis, "save_safetensors")
    entries, values = [], []
    for k, v in state.items():
        if isinstance(v, str):
            raise NamedTypeError(f"safetensors stores arrays only; leaf {k!r} is the str {v!r}.")
        if isinstance(v, jax.Array) and not v.is_fully_addressable:
            raise NamedTypeError(
                f"Leaf {k!r} spans processes; gather it first (na.distributed.process_allgather) and write "
                "from one process."
            )
        v = v if hasattr(v, "dtype") else np.asarray(v)  # a Python scalar: a 0-d array
        dtype = np.dtype(v.dtype)
        if dtype not in CODES:
            raise CheckpointDtypeError(
                f"Leaf {k!r} is {dtype.name}, which save_safetensors cannot write (the safetensors "
                f"dtypes it writes: {', '.join(d.name for d in CODES)}). Cast it to one of those "
                "before saving."
            )
        entries.append((k, dtype, tuple(int(d) for d in v.shape)))
        values.append(v)
    # One array at a time on the host (write_safetensors takes them as it writes).
    arrays = (np.asarray(v) for v in values)
    write_safetensors(Path(path), entries, arrays, {_AXES_KEY: json.dumps(names)})


def load_safetensors(
    path: str | os.PathLike[str],
    like: Any,
    *,
    stacked_axis: str | None = "layer",
    cast: bool = False,
) -> Any:
    """Read a ``.safetensors`` file into a tree shaped like ``like`` (see ``from_state_dict``).

    A tensor with axis names in the file's metadata (``save_safetensors`` writes them) is aligned
    to ``like``'s axes by name, as a NamedArray entry of a state dict is; a tensor without (another
    framework's file) must have ``like``'s shape.

    Raises:
        CheckpointNotFoundError: if there is no file at ``path``.
        CheckpointError: for a file that is not safetensors, is damaged, or holds a dtype not read
            here.
        CheckpointAxisError: for a tensor whose saved axis names differ from ``like``'s.

    Example:
        >>> import tempfile, jax.numpy as jnp, namedaxes as na
        >>> f = tempfile.mkdtemp() + "/w.safetensors"
        >>> save_safetensors(f, {"b": jnp.ones(2)})
        >>> load_safetensors(f, {"b": jnp.zeros(2)})["b"].tolist()
        [1.0, 1.0]
    """
    where = Path(path)
    if not where.is_file():
        raise CheckpointNotFoundError(f"No safetensors file at {str(where)!r}.")
    file = SafetensorsFile(where)
    try:
        state = {k: file.read(t, [slice(None)] * len(t.shape)) for k, t in file.tensors.items()}
    finally:
        file.close()
    names = _saved_names(where, file.metadata, state)
    return _from_state_dict(like, state, stacked_axis, cast, names)


def _saved_names(
    where: Path, metadata: dict[str, str], state: dict[str, Any]
) -> dict[str, tuple[str, ...]]:
    """The axis names ``save_safetensors`` recorded per tensor (none for other writers' files).

    Names recorded for a key the file has no tensor for are ignored: files written before names
    were recorded per tensor kept a stacked leaf's names under its tree key.
    """
    raw = metadata.get(_AXES_KEY)
    if raw is None:
        return {}
    try:
        saved = json.loads(raw)
    except ValueError:
        saved = None
    if not isinstance(saved, dict):
        raise CheckpointError(
            f"{str(where)!r}: the {_AXES_KEY!r} metadata is not a JSON object of axis names; the "
            "file is damaged, or was not written by save_safetensors."
        )
    return {k: tuple(v) for k, v in saved.items() if k in state and isinstance(v, list)}
