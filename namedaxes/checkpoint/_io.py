"""``save`` and ``restore``: one checkpoint directory written and read through orbax.

A checkpoint is an orbax composite checkpoint with two items: ``arrays`` (every array leaf, stored
sharded by orbax/tensorstore, each process writing and reading only its own shards) and
``namedaxes`` (JSON: one record per leaf with its dotted key, path, kind, dtype, shape and, for a
NamedArray or a ``field(axis_names=...)`` array, its axis names and sizes). Orbax writes into a
temporary directory and renames it when every process is done, then writes ``commit_success.txt``;
a directory without that marker (or with orbax's temporary suffix) is an unfinished save and is
never restored.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

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
from ._dtypes import python_array, python_scalar
from ._layout import Leaf, describe, leaves_of, rebuild, scalar_value, store_keys
from ._placement import any_named, permuted, placement

__all__ = ["restore", "save"]

FORMAT = "namedaxes.checkpoint"
VERSION = 1
ARRAYS, META = "arrays", "namedaxes"
COMMIT_MARKER = "commit_success.txt"
TMP_SUFFIX = ".orbax-checkpoint-tmp"


# -- finding checkpoints ------------------------------------------------------------------------


def is_complete(p: Path) -> bool:
    """Whether ``p`` is a finished checkpoint: committed by orbax and holding our metadata."""
    return TMP_SUFFIX not in p.name and (p / COMMIT_MARKER).is_file() and (p / META).is_dir()


def complete_steps(directory: Path) -> list[int]:
    """The steps under ``directory`` (subdirectories named by an integer) that are complete."""
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit() and is_complete(p))


def check_step(step: Any, caller: str) -> int:
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise NamedTypeError(f"{caller} step must be an int >= 0, got {step!r}.")
    return int(step)


def find(path: str | os.PathLike[str], step: int | None) -> Path:
    """The checkpoint directory ``restore`` reads: ``path/step``, ``path``, or its latest step.

    Raises:
        CheckpointNotFoundError: naming the path, what it holds instead, and any unfinished saves.
    """
    root = Path(path).absolute()  # orbax wants absolute paths; a relative one is the cwd's
    if step is not None:
        target = root / str(check_step(step, "restore"))
        if is_complete(target):
            return target
        steps = complete_steps(root)
        why = _why_not(target)
        raise CheckpointNotFoundError(
            f"No checkpoint of step {step} in {str(root)!r}: {why}. Complete steps there: "
            f"{steps or '(none)'}."
        )
    if is_complete(root):
        return root
    steps = complete_steps(root)
    if steps:
        return root / str(steps[-1])
    raise CheckpointNotFoundError(
        f"No checkpoint at {str(root)!r}: {_why_not(root)}. Pass the directory given to save() or "
        "to a CheckpointManager."
    )


def _why_not(p: Path) -> str:
    if not p.exists():
        return "the path does not exist"
    if not p.is_dir():
        return "it is a file, not a checkpoint directory"
    if TMP_SUFFIX in p.name or not (p / COMMIT_MARKER).is_file():
        return f"it is an unfinished save (no {COMMIT_MARKER!r} commit marker)"
    if not (p / META).is_dir():
        return "it is not a namedaxes checkpoint (no 'namedaxes' metadata item)"
    # a directory of step directories, none complete
    unfinished = sorted(q.name for q in p.iterdir() if TMP_SUFFIX in q.name or q.name.isdigit())
    if unfinished:
        return f"it holds only unfinished saves ({format_names(unfinished)})"
    return "it holds no checkpoint"


# -- save ---------------------------------------------------------------------------------------


def _global(x: Any) -> Any:
    """In multi-process runs, an array held by one process alone (optax's step count made outside
    jit, say) is saved as NumPy from process 0: orbax refuses host-local jax.Arrays, and such a
    value is the same on every process in a data-parallel program. A NumPy scalar is saved as a
    0-d array (orbax has no handler for ``np.bool_``)."""
    if isinstance(x, np.generic):
        return np.asarray(x)
    if jax.process_count() > 1 and isinstance(x, jax.Array) and x.is_fully_addressable:
        return np.asarray(x)
    return x


def save_args(tree: Any, caller: str) -> ocp.args.Composite:
    """The orbax arguments that save ``tree``: its arrays and the metadata of every leaf.

    Raises:
        DonatedArrayError: for an array donated to a step (its buffer is gone), naming it.
    """
    check_live(tree, caller)
    leaves = leaves_of(tree)
    records, arrays = [], {}
    for leaf, store in zip(leaves, store_keys(leaves)):
        rec = describe(leaf, store)
        records.append(rec)
        if leaf.kind in ("named", "array"):
            arrays[rec["store"]] = _global(leaf.value.array if leaf.kind == "named" else leaf.value)
    meta = {"format": FORMAT, "version": VERSION, "leaves": records}
    items: dict[str, Any] = {META: ocp.args.JsonSave(meta)}
    if arrays:
        items[ARRAYS] = ocp.args.PyTreeSave(arrays)
    return ocp.args.Composite(**items)


def save(
    path: str | os.PathLike[str],
    tree: Any,
    *,
    step: int | None = None,
    overwrite: bool = False,
) -> Path:
    """Save ``tree`` to ``path`` (or ``path/step``), atomically, each process writing its shards.

    ``tree`` is any pytree of NamedArrays, plain arrays, equinox modules and Python scalars (an
    optax state included). Each NamedArray is stored with its axis names and sizes. Leaves that are
    not data (functions held by equinox modules) are recorded by path only; ``restore`` takes them
    from ``like``. Returns when the checkpoint is committed; in multi-process runs every process
    calls it with the same (global) tree, and an array that lives on one process only (not a global
    array) is written from process 0, so it must hold the same value on every process.

    Args:
        path: The checkpoint directory (created, with any missing parents).
        tree: The tree to save.
        step: If given, save to ``path/step`` (the layout ``CheckpointManager`` uses, so
            ``restore(path)`` finds the latest step).
        overwrite: Replace an existing checkpoint at the target instead of raising.

    Returns:
        The directory written.

    Raises:
        CheckpointError: if the target exists and ``overwrite`` is false.
        CheckpointStructureError: if two leaves share a dotted key.
        CheckpointDtypeError: for an array of a dtype checkpoints cannot store (``uint4``,
            ``float8_e4m3``: orbax's TensorStore has no such type), naming the leaf; nothing is
            written.
        DonatedArrayError: for an array that was donated to a step (``named_jit(...,
            donate_args=...)``, ``fsdp``), whose buffer is gone: save the tree the step returned.
        NamedTypeError: for abstract (``ShapeDtypeStruct``) or traced leaves.

    Example:
        >>> import tempfile, jax.numpy as jnp, namedaxes as na
        >>> d = tempfile.mkdtemp()
        >>> tree = {"w": na.named(jnp.ones((4, 2)), ("embed", "mlp")), "step": 3}
        >>> save(f"{d}/ckpt", tree).name
        'ckpt'
        >>> restore(f"{d}/ckpt")["w"]
        NamedArray(float32, embed=4, mlp=2)
    """
    target = Path(path)
    if step is not None:
        target = target / str(check_step(step, "save"))
    target = target.absolute()
    if target.exists() and not overwrite:
        raise CheckpointError(
            f"{str(target)!r} already exists. Save to a new path or step, or pass overwrite=True."
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    args = save_args(tree, "save")
    with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckptr:
        ckptr.save(target, args=args, force=overwrite)
    return target


# -- restore ------------------------------------------------------------------------------------


def read_metadata(where: Path) -> list[dict[str, Any]]:
    with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckptr:
        meta = ckptr.restore(where, args=ocp.args.Composite(**{META: ocp.args.JsonRestore()}))[META]
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointNotFoundError(
            f"{str(where)!r} is an orbax checkpoint but not a namedaxes one (its 'namedaxes' item "
            "has no namedaxes format tag). Restore it with orbax directly."
        )
    if meta.get("version", 0) > VERSION:
        raise CheckpointError(
            f"{str(where)!r} was written by a newer namedaxes (format version {meta['version']}, "
            f"this one reads up to {VERSION}). Upgrade namedaxes."
        )
    return meta["leaves"]


def _named_axes(rec: dict[str, Any]) -> tuple[Axis, ...]:
    return tuple(Axis(n, s) for n, s in rec["axes"])


def _check_named(rec: dict[str, Any], wanted: tuple[Axis, ...]) -> list[int]:
    """The order that takes the stored axes to ``wanted`` (like's); raises if names or sizes
    differ."""
    stored = _named_axes(rec)
    sizes = {a.name: a.size for a in stored}
    key = rec["key"]
    if set(sizes) != {a.name for a in wanted}:
        raise CheckpointAxisError(
            f"Leaf {key!r}: the checkpoint has axes ({format_axes(stored)}) but like has "
            f"({format_axes(wanted)}). Restore into a like with the saved axis names, or rename "
            "after restoring without like."
        )
    for a in wanted:
        if sizes[a.name] != a.size:
            raise CheckpointAxisError(
                f"Leaf {key!r}: axis {a.name!r} has size {sizes[a.name]} in the checkpoint but "
                f"{a.size} in like (checkpoint: {format_axes(stored)}; like: {format_axes(wanted)}). "
                "Build like with the saved sizes."
            )
    names = [a.name for a in stored]
    return [names.index(a.name) for a in wanted]


def _check_shape(rec: dict[str, Any], like: Any) -> list[int]:
    """The identity order of a plain array; raises if its shape differs from the saved one."""
    shape = tuple(int(d) for d in like.shape)
    if shape != tuple(rec["shape"]):
        raise CheckpointAxisError(
            f"Leaf {rec['key']!r} has shape {tuple(rec['shape'])} in the checkpoint but "
            f"{shape} in like. Build like with the saved shape."
        )
    return list(range(len(shape)))


def _check_dtype(rec: dict[str, Any], like_dtype: Any, cast: bool) -> Any:
    """The dtype to convert to after reading (``None``: as stored); raises on a mismatch without
    ``cast``."""
    stored = np.dtype(jnp.dtype(rec["dtype"]))
    wanted = np.dtype(like_dtype)
    if stored == wanted:
        return None
    if not cast:
        raise CheckpointDtypeError(
            f"Leaf {rec['key']!r} is {stored.name} in the checkpoint but like has {wanted.name}. "
            f"Pass cast=True to convert to like's dtypes, or build like with {stored.name}."
        )
    return wanted


_KIND = {
    "named": "a NamedArray",
    "array": "a plain array",
    "scalar": "a Python scalar",
    "static": "a non-data leaf",
}


def _kind_error(rec: dict[str, Any], leaf: Leaf) -> CheckpointStructureError:
    return CheckpointStructureError(
        f"Leaf {rec['key']!r} is {_KIND[rec['kind']]} in the checkpoint but {_KIND[leaf.kind]} in "
        f"like ({type(leaf.value).__name__}). Restore into a like of the saved structure."
    )


def _scalar_subject(rec: dict[str, Any]) -> str:
    return (
        f"Leaf {rec['key']!r} is a Python {rec['type']} ({scalar_value(rec)!r}) in the checkpoint"
    )


def _scalar_as_array(rec: dict[str, Any], like: Any, cast: bool, sharding: Any) -> jax.Array:
    """A saved Python scalar into a 0-d array of like's dtype (``jax.eval_shape`` makes those of
    Python numbers), as a weakly typed scalar converts (see ``_dtypes.python_array``)."""
    if tuple(like.shape) != ():
        raise CheckpointDtypeError(
            f"{_scalar_subject(rec)} but an array of shape {tuple(like.shape)} in like. Build "
            "like with a matching scalar."
        )
    value = python_array(scalar_value(rec), like.dtype, cast, _scalar_subject(rec))
    return jax.device_put(value, sharding)


def _match(records: list[dict[str, Any]], likes: list[Leaf]) -> list[tuple[dict[str, Any], Leaf]]:
    """Each leaf of ``like`` with its record. ``like`` may be a part of the saved tree (the model
    of a model + optimizer checkpoint): the checkpoint's other leaves are not read."""
    by_key = {r["key"]: r for r in records}
    missing = [leaf.key for leaf in likes if leaf.key not in by_key]
    if missing:
        prefix = _saved_under(missing, by_key)
        if prefix is not None:
            wrapped = "like"
            for part in reversed(prefix.split(".")):
                wrapped = f"{{{part!r}: {wrapped}}}"
            fix = f"They are saved under {prefix!r}: restore into {wrapped}."
        else:
            fix = (
                "Restore into the structure that was saved or a part of it (checkpoint leaves: "
                f"{format_names([r['key'] for r in records][:8])}"
                f"{' ...' if len(records) > 8 else ''})."
            )
        raise CheckpointStructureError(
            f"like has {len(missing)} leaf/leaves the checkpoint lacks: {format_names(missing[:8])}"
            f"{' ...' if len(missing) > 8 else ''}. {fix}"
        )
    return [(by_key[leaf.key], leaf) for leaf in likes]


def _saved_under(keys: list[str], saved: dict[str, Any]) -> str | None:
    """The dotted prefix under which the checkpoint holds every one of ``keys`` (a bare model
    given as like for a checkpoint of ``{"model": ...}``), or ``None``."""
    suffix = "." + keys[0]
    for candidate in saved:
        if candidate.endswith(suffix):
            prefix = candidate[: -len(suffix)]
            if all(f"{prefix}.{k}" in saved for k in keys):
                return prefix
    return None


def _read_arrays(where: Path, args: dict[str, ocp.ArrayRestoreArgs]) -> dict[str, jax.Array]:
    """The stored arrays named in ``args``, and only those (orbax's partial restore)."""
    if not args:
        return {}
    wanted = ocp.args.PyTreeRestore(
        item=dict.fromkeys(args, 0), restore_args=args, partial_restore=True
    )
    with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckptr:
        out = ckptr.restore(where, args=ocp.args.Composite(**{ARRAYS: wanted}))
    return out[ARRAYS]


def _restore_args(sharding: Any, rec: dict[str, Any]) -> ocp.ArrayRestoreArgs:
    # Always read as stored: TensorStore's own conversion wraps out-of-range values (300.7 into
    # int8 gave 44), so a cast is jnp's astype, done after reading.
    return ocp.ArrayRestoreArgs(sharding=sharding, global_shape=tuple(rec["shape"]))


def _finish(x: jax.Array, order: list[int] | None, dtype: Any, sharding: Any) -> jax.Array:
    """``x`` transposed to like's axis order and converted to ``dtype`` (each if asked), on
    ``sharding``: one compiled program per distinct (shape, order, dtype, sharding)."""
    if order is None and dtype is None:
        return x

    def f(a: jax.Array) -> jax.Array:
        a = a if order is None else jnp.transpose(a, order)
        return a if dtype is None else a.astype(dtype)

    return jax.jit(f, out_shardings=sharding)(x)


def _data_order(rec: dict[str, Any], leaf: Leaf) -> list[int]:
    """The order that takes the stored dimensions to like's: by name when both the checkpoint
    and like have axis names (a NamedArray or a ``field(axis_names=...)`` array on either side),
    else by position (the shapes must then agree).

    Raises:
        CheckpointStructureError: for a NamedArray on one side and an array without names on the
            other.
        CheckpointAxisError: for names, sizes or a shape that differ.
    """
    if "axes" in rec and leaf.axes is not None:
        return _check_named(rec, leaf.axes)
    if rec["kind"] == "named" or leaf.kind == "named":
        raise _kind_error(rec, leaf)
    return _check_shape(rec, leaf.value)


def _restore_like(
    where: Path, records: list[dict[str, Any]], like: Any, cast: bool, mapping: Any, mesh: Any
) -> Any:
    likes = leaves_of(like)
    pairs = _match(records, likes)
    place = placement(mapping, mesh, needs_rules=any_named(like))
    # The one walk and plan over like: NamedArrays and field(axis_names=...) arrays are placed by
    # name, the other leaves by like's sharding.
    shardings = place.shardings(like, [leaf.key for leaf in likes])
    args: dict[str, ocp.ArrayRestoreArgs] = {}
    finish: list[Any] = []  # per pair: how to turn what was read into the leaf
    data = ("named", "array")
    for (rec, leaf), sharding in zip(pairs, shardings):
        if rec["kind"] == "scalar" and leaf.kind == "array":
            finish.append(("value", _scalar_as_array(rec, leaf.value, cast, sharding)))
            continue
        if rec["kind"] != leaf.kind and not (rec["kind"] in data and leaf.kind in data):
            raise _kind_error(rec, leaf)
        v = leaf.value
        if leaf.kind in data:
            # Read in the stored axis order, then transposed to like's (aligned by name) and
            # cast to like's dtype.
            order = _data_order(rec, leaf)
            dtype = _check_dtype(rec, v.dtype, cast)
            moved = order != sorted(order)
            stored = permuted(sharding, order, len(order)) if moved else sharding
            args[rec["store"]] = _restore_args(stored, rec)
            finish.append(("read", rec, order if moved else None, dtype, sharding, leaf))
        elif leaf.kind == "scalar":
            finish.append(
                ("value", python_scalar(scalar_value(rec), v, cast, _scalar_subject(rec)))
            )
        else:
            finish.append(("value", v))
    read = _read_arrays(where, args)
    out = []
    for item in finish:
        if item[0] == "value":
            out.append(item[1])
            continue
        _, rec, order, dtype, sharding, leaf = item
        x = _finish(read[rec["store"]], order, dtype, sharding)
        out.append(NamedArray(x, leaf.value.axes) if leaf.kind == "named" else x)
    treedef = jax.tree_util.tree_structure(like, is_leaf=lambda x: isinstance(x, NamedArray))
    return _unflatten_like(like, treedef, likes, out)


def _unflatten_like(like: Any, treedef: Any, likes: list[Leaf], out: list[Any]) -> Any:
    # NamedArrays with a None array (eqx.filter) were skipped by leaves_of: keep them as they are.
    flat = jax.tree_util.tree_leaves(like, is_leaf=lambda x: isinstance(x, NamedArray))
    it = iter(out)
    merged = [x if isinstance(x, NamedArray) and x.array is None else next(it) for x in flat]
    return jax.tree_util.tree_unflatten(treedef, merged)


def _abstract(rec: dict[str, Any]) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(rec["shape"]), jnp.dtype(rec["dtype"]))


def _restore_saved(where: Path, records: list[dict[str, Any]], mapping: Any, mesh: Any) -> Any:
    static = [r["key"] for r in records if r["kind"] == "static"]
    if static:
        raise CheckpointStructureError(
            f"Leaves {format_names(static[:8])} are not data (saved by path only: "
            f"{format_names(sorted({r['type'] for r in records if r['kind'] == 'static'}))}); "
            "restore needs like=... to take them from."
        )
    place = placement(mapping, mesh, needs_rules=any("axes" in r for r in records))
    stored = [r for r in records if r["kind"] in ("named", "array")]
    # The saved tree's arrays, abstract, planned as one tree; a field(axis_names=...) array is
    # planned by its recorded names (and comes back a plain array).
    abstract = [
        NamedArray(_abstract(r), _named_axes(r)) if "axes" in r else _abstract(r) for r in stored
    ]
    shardings = place.shardings(abstract, [r["key"] for r in stored])
    args = {r["store"]: _restore_args(s, r) for r, s in zip(stored, shardings)}
    read = _read_arrays(where, args)
    items = []
    for rec in records:
        if rec["kind"] == "named":
            value: Any = NamedArray(read[rec["store"]], _named_axes(rec))
        elif rec["kind"] == "array":
            value = read[rec["store"]]
        else:
            value = scalar_value(rec)
        items.append((rec["path"], value))
    return rebuild(items) if items else {}


def restore(
    path: str | os.PathLike[str],
    like: Any = None,
    *,
    mapping: Any = None,
    mesh: Any = None,
    step: int | None = None,
    cast: bool = False,
) -> Any:
    """Restore a checkpoint, each process reading only the shards it holds.

    With ``like`` (a concrete tree, or one from ``jax.eval_shape`` / ``eqx.filter_eval_shape``), the
    result has ``like``'s structure; every leaf is checked against the checkpoint by its dotted
    key (axis names and sizes, shapes, dtypes). Arrays with axis names (NamedArrays, and arrays
    declared with ``field(axis_names=...)``, which are saved with their names) are aligned by name
    and come back in ``like``'s axis order; either kind restores into the other.
    ``like`` may be a part of the saved tree: ``{"model": like_model}`` restores the model of a
    ``{"model", "opt_state", "step"}`` checkpoint (to export or evaluate it), and only the arrays
    asked for are read. A leaf of ``like`` that the checkpoint lacks is still an error.
    Without ``like``, the saved leaves come back as nested dicts and lists: dict keys and attribute
    names (equinox fields, optax state fields) become dict keys and sequence positions list
    entries; NamedArrays are rebuilt from their stored axis names (``field(axis_names=...)``
    arrays come back plain, placed by their names); Python scalars come back as saved. Containers
    that held no leaf (an optax ``EmptyState``) do not appear.

    Placement: named leaves (NamedArrays, and arrays of equinox modules declared with
    ``field(axis_names=...)``) by ``resolve`` under ``mapping`` (else the mapping in force) on
    ``mesh`` (else the mesh set with ``jax.set_mesh``), as ``shard`` places them; without a
    mapping, ``like``'s sharding if it has one, else replicated on the mesh. Plain arrays keep
    ``like``'s sharding if it has one, else are replicated. A ``like`` sharding on another mesh
    than an explicit ``mesh=`` is read onto ``mesh`` with the same spec, and one on other devices
    without a mesh (a plain ``jnp`` array's one device) is replicated on ``mesh``, so the tree
    lives on ``mesh`` alone (the mesh set with ``jax.set_mesh`` moves none). With neither mapping nor mesh, arrays without a ``like``
    sharding land whole on this process's first local device (pass a mesh in multi-process runs).

    Args:
        path: A checkpoint directory, or a directory of step directories (the latest complete step
            is read unless ``step`` is given).
        like: The tree to restore into, or ``None``.
        mapping: Logical-to-mesh rules (``{"embed": "model"}``, ``AxisRules``).
        mesh: A concrete ``jax.sharding.Mesh``.
        step: Read ``path/step``.
        cast: Convert leaves whose dtype differs from ``like``'s instead of raising. An array is
            read as stored and converted with ``x.astype(dtype)`` on like's placement, so it
            holds what ``astype`` gives (out-of-range floats into an int dtype are not wrapped
            around); a saved Python scalar converts as ``int(...)``/``float(...)`` do. A value like's dtype or type cannot hold
            (``2**40`` into int32, ``"run7"`` into a number) is refused, cast or not.

    Raises:
        CheckpointNotFoundError: if the path holds no complete checkpoint (unfinished saves are
            never read).
        CheckpointStructureError: for a leaf in ``like`` but not in the checkpoint (when the
            checkpoint holds them all under one prefix, the message says how to wrap ``like``),
            or a leaf of another kind.
        CheckpointAxisError: for an axis whose name or size differs (or a plain array's shape).
        CheckpointDtypeError: for a dtype that differs and ``cast=False``, or a saved Python
            scalar that like's dtype or type cannot hold.
        MeshError: if a mapping is in force but no mesh, or a ``like`` sharding's spec does not fit
            the ``mesh=`` given.
        ShardingError: if the mapping cannot place a named leaf (naming it), or names a mesh axis
            the mesh lacks.

    Example:
        >>> import tempfile, jax, jax.numpy as jnp, namedaxes as na
        >>> d = tempfile.mkdtemp()
        >>> _ = save(d + "/c", {"w": na.named(jnp.ones((8, 2)), ("embed", "mlp"))})
        >>> mesh = jax.make_mesh((4,), ("model",))
        >>> w = restore(d + "/c", mapping={"embed": "model"}, mesh=mesh)["w"]
        >>> w.sharding.spec
        P('model', None)

        Part of a checkpoint (here the model of a model + optimizer state one):

        >>> _ = save(d + "/t", {"model": {"w": w}, "opt_state": {"mu": {"w": w}}})
        >>> like = {"model": {"w": na.named(jax.ShapeDtypeStruct((8, 2), jnp.float32),
        ...                                 ("embed", "mlp"))}}
        >>> list(restore(d + "/t", like))
        ['model']
    """
    where = find(path, step)
    records = read_metadata(where)
    if like is None:
        return _restore_saved(where, records, mapping, mesh)
    return _restore_like(where, records, like, cast, mapping, mesh)
