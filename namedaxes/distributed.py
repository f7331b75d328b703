"""Multi-process helpers: barriers, and moving NamedArrays between process-local and global form.

These run on JAX's multi-controller runtime (``jax.distributed.initialize``): every process runs the
same program, owns some devices of one global mesh, and holds its own slice of the data. With one
process every function here still works (barriers are no-ops), so the same code runs on a laptop
and on a cluster.
"""

from __future__ import annotations

import itertools
import math
import numbers
from fractions import Fraction
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ._array import NamedArray
from ._axis import Axis, AxisSpec, to_axes
from ._errors import (
    AxisError,
    BarrierTimeoutError,
    DistributedError,
    MeshError,
    NamedTypeError,
    ShardingError,
    format_axes,
    format_mesh,
    format_names,
)
from ._logical._context import rules_in_force
from ._logical._resolve import resolve
from ._logical._rules import AxisRules, ResourceMapping, as_rules
from ._mesh import require_mesh
from .mesh._layout import process_block

__all__ = [
    "barrier_sync",
    "from_process_local",
    "is_multiprocess",
    "process_allgather",
    "process_local_indices",
]

# Every process numbers its unnamed barriers the same way, so the n-th call meets the n-th call.
_BARRIER_COUNTER = itertools.count()
# The runtime takes the timeout as an int64 of milliseconds (about 292 million years).
_MAX_TIMEOUT_S = (2**63 - 1) // 1000


def is_multiprocess() -> bool:
    """Whether this program runs as several JAX processes (``jax.process_count() > 1``).

    Example:
        >>> is_multiprocess()  # a plain single-process run
        False
    """
    return jax.process_count() > 1


def _distributed_client() -> Any:
    """The coordination-service client of ``jax.distributed``, or ``None`` before initialize.

    JAX has no public handle to it, and its ``wait_at_barrier(name, timeout_in_ms)`` is the only
    barrier that gives up after a timeout (``multihost_utils.sync_global_devices`` is a collective
    that hangs forever when a peer is missing). This is the one place that touches ``jax._src``.
    """
    from jax._src import distributed as _jax_distributed

    return _jax_distributed.global_state.client


def barrier_sync(timeout: float = 200.0, *, name: str | None = None) -> None:
    """Wait until every process reaches this barrier; a no-op with one process.

    Every process must call ``barrier_sync`` the same number of times in the same order: the n-th
    unnamed call of one process meets the n-th unnamed call of the others. Pass ``name`` to meet at
    a fixed point instead (all processes must use the same name).

    Args:
        timeout: Seconds to wait for the other processes before giving up: a positive, finite
            number (``float("inf")`` is refused; pass a large number to wait long).
        name: Optional barrier name shared by all processes; default a per-call counter.

    Raises:
        NamedTypeError: if ``timeout`` is not a positive, finite number, or ``name`` is not a
            non-empty str.
        BarrierTimeoutError: (a ``TimeoutError``) if some process has not arrived after
            ``timeout`` seconds; the message names the barrier, the timeout and the process count.
        DistributedError: if several processes exist but ``jax.distributed`` is not initialized, or
            the runtime reports another failure.

    Example:
        >>> barrier_sync()  # every process waits here; returns at once with one process
        >>> barrier_sync(timeout=600, name="after-checkpoint")
    """
    if (
        isinstance(timeout, (bool, np.bool_))
        or not isinstance(timeout, numbers.Real)
        or not 0 < timeout <= _MAX_TIMEOUT_S
    ):
        raise NamedTypeError(
            f"barrier_sync timeout must be a positive, finite number of seconds, got {timeout!r}. "
            "Pass a finite number of seconds, such as timeout=3600."
        )
    if name is not None and (not isinstance(name, str) or not name):
        raise NamedTypeError(f"barrier_sync name must be a non-empty str, got {name!r}.")
    barrier = f"namedaxes_barrier_{next(_BARRIER_COUNTER) if name is None else name}"
    if not is_multiprocess():
        return
    client = _distributed_client()
    if client is None:
        raise DistributedError(
            f"barrier_sync: JAX reports {jax.process_count()} processes but the distributed "
            "runtime is not initialized. Call jax.distributed.initialize(...) first."
        )
    try:
        client.wait_at_barrier(barrier, math.ceil(timeout * 1000))
    except jax.errors.JaxRuntimeError as e:
        detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "DEADLINE_EXCEEDED" in str(e):
            raise BarrierTimeoutError(
                f"Barrier {barrier!r} timed out after {timeout:g} s: not all "
                f"{jax.process_count()} processes reached it (this is process "
                f"{jax.process_index()}). Check that every process calls barrier_sync the same "
                f"number of times, in the same order, and that none crashed or is stuck. "
                f"Runtime said: {detail}"
            ) from e
        raise DistributedError(f"Barrier {barrier!r} failed: {detail}") from e


def _local_extents(mesh: Mesh) -> dict[str, int]:
    """How many positions along each mesh axis hold this process's devices.

    A process-local array covers exactly these positions: this process's share of each mesh axis.
    """
    me = jax.process_index()
    block, whole = process_block(mesh.devices, me)
    if not any(block):
        raise MeshError(
            f"Process {me} owns no device of {format_mesh(mesh)}; every process must take part "
            "in the mesh it builds arrays on."
        )
    if not whole:
        raise MeshError(
            f"The devices of process {me} do not form one block of {format_mesh(mesh)}, so its "
            "local data has no rectangular place in the global array. Build the mesh with "
            "namedaxes.mesh.create_mesh, which gives each process a contiguous block."
        )
    return dict(zip(mesh.axis_names, block, strict=True))


def _local_axes(
    axes: tuple[Axis, ...], spec: PartitionSpec, mesh: Mesh, extents: dict[str, int]
) -> tuple[Axis, ...]:
    """The axes of this process's piece of a global array with ``axes`` placed as ``spec``.

    A dimension split over mesh axes ``t`` has ``prod(mesh[t])`` blocks, of which this process's
    devices hold ``prod(extents[t])``; ``resolve`` made the size divisible by the first.
    """
    out = []
    for axis, entry in zip(axes, spec, strict=True):
        names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        blocks = math.prod(mesh.shape[m] for m in names)
        out.append(Axis(axis.name, axis.size // blocks * math.prod(extents[m] for m in names)))
    return tuple(out)


def _global_candidates(
    local: tuple[Axis, ...], rules: AxisRules, mesh: Mesh, extents: dict[str, int]
) -> list[tuple[tuple[Axis, ...], PartitionSpec]]:
    """Every global array (axes and spec, by ``resolve`` on the full mesh) whose piece on this
    process has the axes ``local``.

    An axis placed on mesh axes ``t`` is ``prod(mesh[t] / extents[t])`` times its local size, so
    each axis's global size is its local size times the growth of one of its rule targets (or 1).
    """
    growth = {m: Fraction(mesh.shape[m], extents[m]) for m in mesh.axis_names}
    sizes = []
    for axis in local:
        options = {axis.size}
        for target in rules.candidates(axis.name):
            size = axis.size * math.prod(growth.get(m, Fraction(1)) for m in target or ())
            if size.denominator == 1:
                options.add(int(size))
        sizes.append(sorted(options))
    found = []
    for combo in itertools.product(*sizes):
        axes = tuple(Axis(a.name, n) for a, n in zip(local, combo, strict=True))
        try:
            spec = resolve(axes, rules, mesh)
        except ShardingError:
            continue
        if _local_axes(axes, spec, mesh, extents) == local:
            found.append((axes, spec))
    return found


def _infer_global_axes(
    x: NamedArray, rules: AxisRules, mesh: Mesh, extents: dict[str, int]
) -> tuple[Axis, ...]:
    """The one global array whose piece on this process ``x`` is; a ``ShardingError`` if none or
    several are."""
    found = _global_candidates(x.axes, rules, mesh, extents)
    if len(found) == 1:
        return found[0][0]
    me = jax.process_index()
    if not found:
        note = (
            f"from_process_local resolves process {me}'s local axes against its share of each "
            f"mesh axis: {extents} of {dict(mesh.shape)}."
        )
        try:  # the error for the local axes themselves says best what does not divide
            resolve(x.axes, rules, extents)
        except ShardingError as e:
            raise type(e)(f"{e} ({note})") from e
        raise ShardingError(
            f"Process {me}'s local axes ({format_axes(x.axes)}) are not this process's piece of "
            f"any global array under the mapping on {format_mesh(mesh)} ({note}). Pass the global "
            "sizes with global_axes=..., as given to process_local_indices."
        )
    names = [a.name for i, a in enumerate(x.axes) if len({axes[i].size for axes, _ in found}) > 1]
    readings = " and of ".join(f"({format_axes(axes)}) placed as {spec}" for axes, spec in found)
    options = " or ".join(repr({a.name: a.size for a in axes}) for axes, _ in found)
    raise ShardingError(
        f"from_process_local cannot tell the global size of axis {format_names(names)} from "
        f"process {me}'s local piece ({format_axes(x.axes)}): under the mapping on "
        f"{format_mesh(mesh)} it is the piece of {readings}. Pass the global sizes given to "
        f"process_local_indices: global_axes={options}."
    )


def from_process_local(
    x: NamedArray,
    mapping: ResourceMapping | AxisRules | None = None,
    mesh: Mesh | None = None,
    *,
    global_axes: AxisSpec | None = None,
) -> NamedArray:
    """Build a global, sharded NamedArray from each process's local piece.

    Every process passes its own ``x``. Along axes that the mapping puts on mesh axes spanning
    several processes, ``x`` is this process's slice (processes in mesh order): the global
    indices ``process_local_indices`` names, so a data loader reads only those rows; along the
    other axes every process passes the whole axis (the same data). The result's axes have global
    sizes, and its partition spec is ``resolve`` of those global axes on the full mesh, as for
    ``process_local_indices`` and every other placement.

    Without ``global_axes`` the global sizes are inferred: each axis is its local size times the
    number of pieces its mesh axes cut it into across processes. When a mapping has fallbacks, one
    local piece may fit two global arrays (6 local rows: half of 12 rows on a process-spanning
    ``data`` axis, or all 6 rows on ``model``); that is a ``ShardingError`` asking for
    ``global_axes``.

    Args:
        x: This process's local NamedArray (or NumPy-backed NamedArray).
        mapping: ``{logical_name: mesh_axes}`` or ``AxisRules``; default the ``axis_mapping`` in
            force. Pass ``{}`` to replicate every axis (all processes then pass equal data).
        mesh: The global mesh; default the one set with ``jax.set_mesh``.
        global_axes: The global array's axes (``{name: size}`` or ``Axis`` objects, the names of
            ``x`` in any order), as given to ``process_local_indices``; default inferred.

    Returns:
        A NamedArray over the global mesh, sharded as the mapping says.

    Raises:
        ShardingError: if no mapping is given or in force, the mapping cannot shard the array,
            ``x`` is not this process's piece of ``global_axes``, or the global sizes are
            ambiguous and ``global_axes`` is not given.
        MeshError: if no mesh is given or set, or this process's devices are not one block.

    Example:
        >>> # On each of 2 processes (4 devices each), batch=4 locally:
        >>> from namedaxes import named
        >>> mesh = jax.make_mesh((8,), ("data",))
        >>> local = named(jax.numpy.ones((8 // jax.process_count(), 3)), ("batch", "embed"))
        >>> x = from_process_local(local, {"batch": "data"}, mesh)
        >>> x.shape
        {'batch': 8, 'embed': 3}
        >>> same = from_process_local(local, {"batch": "data"}, mesh, global_axes=x.shape)
        >>> same.sharding.spec
        P('data', None)
    """
    if not isinstance(x, NamedArray):
        raise NamedTypeError(
            f"from_process_local expects a NamedArray, got {type(x).__name__}. "
            "Wrap the local data first: named(local_array, ('batch', ...))."
        )
    mesh = require_mesh(mesh, caller="from_process_local", concrete=True)
    rules = as_rules(rules_in_force(mapping, "from_process_local"))
    extents = _local_extents(mesh)
    if global_axes is None:
        axes = _infer_global_axes(x, rules, mesh, extents)
    else:
        axes = _global_axes_of(x, global_axes)
    # One path: the spec of the global axes, and the local piece it gives this process.
    spec = resolve(axes, rules, mesh)
    expected = _local_axes(axes, spec, mesh, extents)
    if expected != x.axes:
        wrong = next(a for a, b in zip(x.axes, expected, strict=True) if a != b)
        want = next(b for b in expected if b.name == wrong.name)
        raise ShardingError(
            f"from_process_local: process {jax.process_index()}'s local axis {wrong.name!r} has "
            f"size {wrong.size}, but the global array ({format_axes(axes)}) placed as {spec} on "
            f"{format_mesh(mesh)} gives each process {want.size} of it. Pass the indices "
            "process_local_indices names for these global axes."
        )
    local_data = x.array
    if isinstance(local_data, jax.Array):
        if not local_data.is_fully_addressable:
            raise ShardingError(
                f"from_process_local got {x!r}, which is already a global array spanning several "
                "processes. Pass each process's local data (e.g. a NumPy-backed NamedArray)."
            )
        # Host data: JAX slices the local data per device, and slicing a device array under
        # jax.set_mesh would make the slices mesh-wide arrays instead of local ones.
        local_data = np.asarray(local_data)
    array = jax.make_array_from_process_local_data(
        NamedSharding(mesh, spec), local_data, tuple(a.size for a in axes)
    )
    return NamedArray(array, axes)


def _global_axes_of(x: NamedArray, global_axes: AxisSpec) -> tuple[Axis, ...]:
    """``global_axes`` in the order of ``x``'s axes, checked to name exactly those axes."""
    given = to_axes(global_axes, what="from_process_local global_axes")
    by_name = {a.name: a for a in given}
    if set(by_name) != set(x.axis_names):
        raise AxisError(
            f"from_process_local: global_axes ({format_axes(given)}) must name exactly the axes "
            f"of the local piece {x!r}: {format_names(x.axis_names)}."
        )
    return tuple(by_name[name] for name in x.axis_names)


def process_local_indices(
    axes: AxisSpec, mapping: ResourceMapping | AxisRules | None = None, mesh: Mesh | None = None
) -> dict[str, np.ndarray]:
    """Which global indices of each axis this process holds: the piece ``from_process_local`` wants.

    For a global array with ``axes`` placed by the mapping on the mesh, returns, for every axis,
    the global indices that this process's devices hold, in the order ``from_process_local`` reads
    its local data. A data loader reads just those rows (``data[idx["batch"]]``) and passes them
    to ``from_process_local`` with the same mapping and mesh. Along an axis that no
    process-spanning mesh axis shards, every process gets the whole range. With one process every
    axis is whole.

    Args:
        axes: The global array's axes: ``{name: size}`` or ``Axis`` objects (global sizes).
        mapping: ``{logical_name: mesh_axes}`` or ``AxisRules``; default the ``axis_mapping`` in
            force.
        mesh: The global mesh; default the one set with ``jax.set_mesh``.

    Returns:
        ``{axis_name: np.ndarray of int64 indices}`` in the order of ``axes``.

    Raises:
        ShardingError: if no mapping is given or in force, or the mapping cannot shard ``axes``.
        MeshError: if no mesh is given or set, or this process's devices are not one block.

    Example:
        >>> mesh = jax.make_mesh((8,), ("data",))
        >>> idx = process_local_indices({"batch": 8, "position": 3}, {"batch": "data"}, mesh)
        >>> idx["batch"].tolist(), idx["position"].tolist()  # one process holds every row
        ([0, 1, 2, 3, 4, 5, 6, 7], [0, 1, 2])
    """
    axes = to_axes(axes, what="process_local_indices axes")
    mesh = require_mesh(mesh, caller="process_local_indices", concrete=True)
    rules = rules_in_force(mapping, "process_local_indices")
    _local_extents(mesh)  # the same checks as from_process_local: this process owns one block
    shape = tuple(a.size for a in axes)
    sharding = NamedSharding(mesh, resolve(axes, rules, mesh))
    blocks = sharding.addressable_devices_indices_map(shape).values()
    out = {}
    for dim, axis in enumerate(axes):
        ranges = sorted({index[dim].indices(axis.size)[:2] for index in blocks})
        out[axis.name] = np.concatenate([np.arange(lo, hi, dtype=np.int64) for lo, hi in ranges])
    return out


def process_allgather(x: NamedArray) -> NamedArray:
    """The whole value of a global NamedArray, fully addressable, on every process.

    A no-op for arrays that are already fully addressable (one process, or replicated locally).
    The result lives on this process's default device. Every process must call it (it runs a
    collective).

    Args:
        x: A global NamedArray, e.g. from ``from_process_local`` or a jitted step.

    Returns:
        A NamedArray with the same axes whose data is the complete array.

    Raises:
        NamedTypeError: if ``x`` is not a NamedArray, or is traced (called inside ``jax.jit``).

    Example:
        >>> from namedaxes import named
        >>> local = named(jax.numpy.ones((8 // jax.process_count(), 3)), ("batch", "embed"))
        >>> x = from_process_local(local, {"batch": "data"}, jax.make_mesh((8,), ("data",)))
        >>> full = process_allgather(x)  # on every process: batch=8, fully addressable
        >>> full.shape, full.array.is_fully_addressable
        ({'batch': 8, 'embed': 3}, True)
    """
    if not isinstance(x, NamedArray):
        raise NamedTypeError(f"process_allgather expects a NamedArray, got {type(x).__name__}.")
    array = x.array
    if isinstance(array, jax.core.Tracer):
        raise NamedTypeError(
            f"process_allgather got the traced {x!r}: it gathers concrete arrays across "
            "processes on the host and cannot run under jax.jit, vmap or grad. Call it outside "
            "the jitted function, on its output."
        )
    if not isinstance(array, jax.Array) or array.is_fully_addressable:
        return x
    gathered = multihost_utils.process_allgather(array, tiled=True)
    return NamedArray(jnp.asarray(gathered), x.axes)
