"""The cache entries behind ``named_jit``: per-structure layouts, compiled programs, output
rebuilding, and input placement on the fast path."""

from __future__ import annotations

import collections
import functools
import operator
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np

from .._errors import ShardingError, format_mesh
from .._mesh import same_placement
from ._shard import place_leaves


@functools.cache
def is_dynamic_type(t: type) -> bool:
    """Array leaves are traced; everything else is static (the ``eqx.filter_jit`` convention)."""
    return issubclass(t, (jax.Array, np.ndarray, np.generic, jax.core.Tracer, jax.ShapeDtypeStruct))


def getter(idx: tuple[int, ...]) -> Callable[[list[Any]], tuple[Any, ...]]:
    if not idx:
        return lambda leaves: ()
    if len(idx) == 1:
        i = idx[0]
        return lambda leaves: (leaves[i],)
    return operator.itemgetter(*idx)  # type: ignore[return-value]


class OutInfo(NamedTuple):
    treedef: Any
    dyn_idx: tuple[int, ...]  # positions of the array outputs among all output leaves
    statics: tuple[Any, ...]  # (position, value) of non-array outputs
    # (position among array outputs, spec) of named outputs with no elements: XLA drops sharding
    # constraints on empty arrays, so these are placed after the call (they hold no data).
    empty: tuple[tuple[int, Any], ...] = ()

    def rebuild(self, dyn: list[Any]) -> Any:
        if self.empty:
            dyn = place_empty(list(dyn), self.empty)
        if not self.statics:
            return self.treedef.unflatten(dyn)
        leaves: list[Any] = [None] * (len(self.dyn_idx) + len(self.statics))
        for i, v in zip(self.dyn_idx, dyn):
            leaves[i] = v
        for i, v in self.statics:
            leaves[i] = v
        return self.treedef.unflatten(leaves)

    def same_as(self, other: OutInfo) -> bool:
        if (
            self.treedef != other.treedef
            or self.dyn_idx != other.dyn_idx
            or self.empty != other.empty
        ):
            return False
        try:
            return bool(self.statics == other.statics)
        except Exception:  # e.g. arrays compared elementwise
            return False


class IfUnplaced(NamedTuple):
    """A target used only if the leaf is not on ``mesh`` yet: an input already there stays put
    (a batch already sharded, optimizer state held by the parameter mapping, an array the caller
    placed), and is not resolved by the mapping at all.

    ``path`` empty (fsdp's non-parameter inputs): any other input is placed, traced ones and
    ones on other devices included. ``path`` given (``named_jit``'s placement by the mapping in
    force): only unplaced inputs are placed (NumPy, uncommitted arrays); traced ones are left to
    the trace they come from, and one committed elsewhere is refused, naming ``path``."""

    target: Any  # a NamedSharding; None when the mapping cannot place the leaf (see `error`)
    mesh: Any
    path: str = ""
    # Why the mapping cannot place it: the error's type, message and fields (not the error,
    # whose traceback would hold this call's frames).
    error: tuple[type[Exception], str, dict[str, Any]] | None = None

    def placed(self) -> Any:
        """The target, for a leaf that must be placed.

        Raises:
            ShardingError: why the mapping cannot place the leaf (``resolve``'s error).
        """
        if self.error is not None:
            kind, message, fields = self.error
            error = kind(message)
            error.__dict__.update(fields)
            raise error
        return self.target


def concrete_targets(dyn: Any, targets: Any) -> list[Any]:
    """Each leaf's target, with ``IfUnplaced`` decided for the leaf at hand.

    Raises:
        ShardingError: for a leaf committed off the mesh where its ``IfUnplaced`` has a path.
    """
    out = []
    for leaf, t in zip(dyn, targets):
        if isinstance(t, IfUnplaced):
            t = _unless_placed(leaf, t)
        out.append(t)
    return out


def _unless_placed(leaf: Any, t: IfUnplaced) -> Any:
    if isinstance(leaf, jax.core.Tracer):
        return None if t.path else t.placed()
    sharding = getattr(leaf, "sharding", None)
    mesh = t.mesh
    if isinstance(sharding, jax.sharding.NamedSharding) and same_placement(sharding.mesh, mesh):
        return None
    if (
        sharding is not None
        and not isinstance(sharding, jax.sharding.NamedSharding)
        and isinstance(mesh, jax.sharding.Mesh)
        and sharding.device_set == set(mesh.devices.flat)
    ):  # on the mesh's devices in another form (one device, of a 1-device mesh): it stays
        return None
    if not t.path or sharding is None or (isinstance(leaf, jax.Array) and not leaf.committed):
        return t.placed()
    if isinstance(sharding, jax.sharding.NamedSharding):
        where = f"another mesh, {format_mesh(sharding.mesh)}"
        if format_mesh(sharding.mesh) == format_mesh(mesh):
            where += " over other devices"
    elif len(sharding.device_set) == 1:
        where = f"one device, {next(iter(sharding.device_set))!r}"
    else:
        where = repr(sharding)
    raise ShardingError(
        f"named_jit: argument {t.path} is committed to {where}, not to the mesh in force, "
        f"{format_mesh(mesh)}. Pass in_axis_resources=... to move it onto this mesh, or place it "
        "there before the call (na.shard(x, mapping, mesh))."
    )


_SHARDING = operator.attrgetter("sharding")
_MAX_PLACED = 8


def place_inputs_fast(dyn: Any, compiled: Compiled) -> Any:
    """Place inputs by the compiled entry's targets. The inputs' shardings, as one tuple, are
    remembered when nothing had to move; a later call whose inputs have equal shardings (the
    outputs of the previous step, in a training loop) skips the per-leaf check: one C-level pass
    and one set lookup, however equal shardings were produced."""
    try:
        key = tuple(map(_SHARDING, dyn))
    except AttributeError:  # NumPy inputs: placed every call
        key = None
    else:
        if key in compiled.placed:
            return dyn
    placed, changed = place_leaves(list(dyn), concrete_targets(dyn, compiled.in_targets))
    if key is not None and not changed:  # tracers are constrained (changed) on every call
        if len(compiled.placed) >= _MAX_PLACED:
            compiled.placed.clear()
        compiled.placed.add(key)
    return placed


def place_empty(dyn: list[Any], empty: tuple[tuple[int, Any], ...]) -> list[Any]:
    for i, spec in empty:
        x = dyn[i]
        sharding = getattr(x, "sharding", None)
        mesh = getattr(sharding, "mesh", None)
        if isinstance(mesh, jax.sharding.Mesh):
            dyn[i] = jax.device_put(x, jax.sharding.NamedSharding(mesh, spec))
    return dyn


class Compiled:
    """One ``jax.jit`` of the flat function, for one (structure, mapping, statics, mesh)."""

    __slots__ = (
        "jitted",
        "in_targets",
        "shaped_targets",
        "mesh",
        "outs",
        "single",
        "set_mesh",
        "placed",
        "rules",
    )

    def __init__(self) -> None:
        self.outs: dict[Any, OutInfo] = {}
        # Tuples of input shardings found already placed as the targets say (a few per entry).
        self.placed: set[tuple[Any, ...]] = set()
        self.single: OutInfo | None = None  # set while every trace gave the same output info
        self.in_targets: list[Any] | None = None
        self.shaped_targets = False  # input targets depend on leaf shapes (fields): per call
        self.mesh: Any = None
        self.set_mesh: Any = None  # a mesh found on the arguments, set around each call
        self.rules: Any = None  # the mapping in force for this entry

    def record(self, sig: Any, info: OutInfo) -> None:
        if not self.outs:
            self.single = info
        elif self.single is not None and not self.single.same_as(info):
            self.single = None  # outputs differ between traces: look them up by input types
        self.outs[sig] = info

    def out_info(self, dyn: tuple[Any, ...] | list[Any]) -> OutInfo:
        if self.single is not None:
            return self.single
        return self.outs[signature(dyn)]


def signature(dyn: Any) -> tuple[Any, ...]:
    """What tells two traces of one entry apart: the inputs' shapes and dtypes (weak or not)."""
    out = []
    for x in dyn:
        t = jax.typeof(x)
        out.append((t.shape, t.dtype, getattr(t, "weak_type", False)))
    return tuple(out)


class Layout:
    """Per (structure, leaf types, mapping): which leaves are dynamic, donation, compiled entries."""

    __slots__ = (
        "treedef",
        "dyn_idx",
        "static_idx",
        "get_dyn",
        "get_static",
        "donate",
        "get_donated",
        "by_key",
    )

    def __init__(self, treedef: Any, types: tuple[type, ...], donate: tuple[int, ...]) -> None:
        self.treedef = treedef
        self.dyn_idx = tuple(i for i, t in enumerate(types) if is_dynamic_type(t))
        self.static_idx = tuple(i for i, t in enumerate(types) if not is_dynamic_type(t))
        self.get_dyn = getter(self.dyn_idx)
        self.get_static = getter(self.static_idx)
        self.donate = donate
        self.get_donated = getter(donate)
        self.by_key: collections.OrderedDict[Any, Compiled] = collections.OrderedDict()

    def merge(self, dyn: Any, statics: tuple[Any, ...]) -> list[Any]:
        leaves: list[Any] = [None] * (len(self.dyn_idx) + len(self.static_idx))
        for i, v in zip(self.dyn_idx, dyn):
            leaves[i] = v
        for i, v in zip(self.static_idx, statics):
            leaves[i] = v
        return leaves
