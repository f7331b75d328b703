"""Device arrangement for meshes: axis sizes, granules (slices or hosts) and the ICI/DCN split.

A *granule* is a group of devices joined by the fast interconnect (ICI): a TPU slice, or one
process (host) when devices do not tell slices apart. Granules talk to each other over the slow
data-centre network (DCN). The layout built here gives every granule one contiguous block of the
mesh along the DCN-split axes, so only those axes' collectives cross the slow network.

Everything here works on any objects with an ``id`` (and optionally ``process_index`` and
``slice_index``), so multi-host layouts can be tested with stand-in devices, down to the
``jax.sharding.Mesh`` (JAX accepts hashable stand-ins; placing arrays on it needs real devices).
"""

from __future__ import annotations

import collections
import math
import operator
from collections.abc import Sequence
from typing import Any, TypeAlias

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType

from .._errors import MeshError, NamedTypeError, format_names

__all__ = [
    "DEFAULT_AXIS_DIMS",
    "DEFAULT_AXIS_NAMES",
    "AxisTypes",
    "build_mesh",
    "check_axis_names",
    "check_dims",
    "create_device_array",
    "device_granules",
    "host_mesh_shape",
    "host_mesh_shape_of",
    "hybrid_device_array",
    "infer_dcn_dims",
    "more_cpu_devices",
    "normalize_axis_types",
    "process_block",
    "resolve_dims",
    "select_devices",
]

DEFAULT_AXIS_DIMS: tuple[int, ...] = (1, -1, 1, 1, 1)
DEFAULT_AXIS_NAMES: tuple[str, ...] = ("dp", "fsdp", "ep", "tp", "sp")

#: One axis type for every axis, or one per axis; strings are "auto", "explicit", "manual".
AxisTypes: TypeAlias = AxisType | str | Sequence[AxisType | str] | None

_AXIS_TYPE_NAMES = {"auto": AxisType.Auto, "explicit": AxisType.Explicit, "manual": AxisType.Manual}


# -- validation ------------------------------------------------------------------------------


def format_dims(dims: Sequence[int], names: Sequence[str] | None = None) -> str:
    """``(dp=2, tp=-1)`` with names, ``(2, -1)`` without."""
    if names is None or len(names) != len(dims):
        return str(tuple(dims))
    return "(" + ", ".join(f"{n}={d}" for n, d in zip(names, dims)) + ")"


def check_axis_names(names: Any, *, what: str = "axis_names") -> tuple[str, ...]:
    """Mesh axis names as a tuple of unique non-empty strings, or a ``MeshError``.

    A bare string is one name (``"data"`` means ``("data",)``), as everywhere in the API where a
    sequence of names is expected, and as ``jax.sharding.Mesh`` reads it.
    """
    if isinstance(names, str):
        names = (names,)
    if not isinstance(names, Sequence):
        raise MeshError(
            f"{what} must be a sequence of strings, got {names!r}. "
            "Pass a tuple such as ('data', 'model')."
        )
    names = tuple(names)
    for n in names:
        if not isinstance(n, str) or not n:
            raise MeshError(
                f"{what} must be non-empty strings, got {n!r} in {names!r}. Name every mesh axis."
            )
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise MeshError(
            f"Duplicate mesh axis names {format_names(dups)} in {what} ({format_names(names)}). "
            "Give every mesh axis its own name."
        )
    return names


def check_dims(
    dims: Any, names: Sequence[str] | None = None, *, what: str = "axis_dims"
) -> tuple[int, ...]:
    """Mesh axis sizes as a tuple of ints, each positive or ``-1`` (at most one ``-1``).

    Raises:
        MeshError: for a non-sequence, a non-int or non-positive size, two ``-1``s, or a length
            that differs from ``names``.
    """
    if isinstance(dims, (str, bytes)) or not isinstance(dims, Sequence):
        raise MeshError(
            f"{what} must be a sequence of ints, got {dims!r}. Pass a tuple such as (2, -1)."
        )
    out = []
    for d in dims:
        if isinstance(d, bool) or not hasattr(d, "__index__"):
            raise MeshError(
                f"{what} {tuple(dims)!r} contains {d!r} ({type(d).__name__}); "
                "mesh axis sizes must be ints."
            )
        d = operator.index(d)
        if d < 1 and d != -1:
            raise MeshError(
                f"{what} {tuple(dims)!r} contains size {d}; sizes must be >= 1, or -1 for "
                "'the remaining devices'."
            )
        out.append(d)
    if out.count(-1) > 1:
        raise MeshError(
            f"{what} {format_dims(out, names)} has {out.count(-1)} axes of size -1; at most one "
            "axis can take the remaining devices. Give the other sizes explicitly."
        )
    if names is not None and len(out) != len(names):
        raise MeshError(
            f"{what} {tuple(out)} has {len(out)} entries but there are {len(names)} mesh axis "
            f"names ({format_names(names)}). Give one size per axis name."
        )
    return tuple(out)


def resolve_dims(
    dims: Sequence[int],
    names: Sequence[str] | None,
    num_devices: int,
    *,
    what: str = "axis_dims",
    unit: str = "devices",
    devices: Sequence[Any] | None = None,
    count_note: str = "",
) -> tuple[int, ...]:
    """Fill in the ``-1`` of checked ``dims`` so that their product is ``num_devices``.

    ``devices`` (the ``num_devices`` devices), when given, let a mesh too large for them say how to
    get more CPU devices (see ``more_cpu_devices``). ``count_note`` follows the available count in
    messages (e.g. ``" (2 processes x 3)"``).

    Raises:
        MeshError: if the product cannot equal ``num_devices``.
    """
    known = math.prod(d for d in dims if d != -1)
    hint = more_cpu_devices(known, devices) if known > num_devices else ""
    if -1 in dims:
        if num_devices % known:
            raise MeshError(
                f"{what} {format_dims(dims, names)} cannot use {num_devices} {unit}{count_note}: "
                f"the other axes multiply to {known}, which does not divide {num_devices}. Choose "
                f"sizes whose product divides {num_devices}.{hint}"
            )
        return tuple(num_devices // known if d == -1 else d for d in dims)
    if known != num_devices:
        raise MeshError(
            f"{what} {format_dims(dims, names)} needs {known} {unit}, but {num_devices}"
            f"{count_note} are available. Make the sizes multiply to {num_devices}, or use -1 for "
            f"one axis to take the remaining ones.{hint}"
        )
    return tuple(dims)


def more_cpu_devices(needed: int, devices: Sequence[Any] | None) -> str:
    """The fix for a mesh of ``needed`` devices over fewer real CPU ``devices`` (else ``""``).

    JAX makes one CPU device per process unless ``jax_num_cpu_devices`` says otherwise, and the
    option only takes effect before its backends start, so a CPU user needs to be told both. The
    count asked for is per process (``devices`` may span several).
    """
    if not devices or not all(isinstance(d, jax.Device) and d.platform == "cpu" for d in devices):
        return ""
    per_process = -(-needed // len({d.process_index for d in devices}))
    return (
        " On CPU, JAX makes as many devices per process as its jax_num_cpu_devices option says (1 "
        f'by default): call jax.config.update("jax_num_cpu_devices", {per_process}) before JAX '
        "initializes its backends (at the top of the script, before the first jax.devices() call "
        "or array)."
    )


def normalize_axis_types(axis_types: AxisTypes, names: Sequence[str]) -> tuple[AxisType, ...]:
    """One ``AxisType`` per mesh axis from ``None`` (Auto), one type/string, or one per axis."""

    def one(t: Any) -> AxisType:
        if isinstance(t, AxisType):
            return t
        if isinstance(t, str) and t.lower() in _AXIS_TYPE_NAMES:
            return _AXIS_TYPE_NAMES[t.lower()]
        if isinstance(t, str):
            raise MeshError(
                f"Unknown axis type {t!r}. Use one of {format_names(_AXIS_TYPE_NAMES)} or a "
                "jax.sharding.AxisType."
            )
        raise NamedTypeError(
            f"axis_types entries must be AxisType or str, got {t!r} ({type(t).__name__})."
        )

    if axis_types is None:
        return (AxisType.Auto,) * len(names)
    if isinstance(axis_types, (AxisType, str)):
        return (one(axis_types),) * len(names)
    if not isinstance(axis_types, Sequence):
        raise NamedTypeError(
            f"axis_types must be an AxisType, a string, or one per axis, got {axis_types!r}."
        )
    if len(axis_types) != len(names):
        raise MeshError(
            f"Got {len(axis_types)} axis_types for {len(names)} mesh axes "
            f"({format_names(names)}). Give one type per axis, or a single type for all."
        )
    return tuple(one(t) for t in axis_types)


# -- devices and granules --------------------------------------------------------------------


def select_devices(devices: Sequence[Any] | None, backend: str | None = None) -> list[Any]:
    """The devices to lay out: ``devices`` as given, or all devices of ``backend``."""
    if devices is not None and backend is not None:
        raise MeshError(
            f"Got both devices ({len(devices)} of them) and backend={backend!r}. "
            "Pass one: devices to choose them exactly, or backend to take all of its devices."
        )
    if devices is None:
        try:
            return list(jax.devices(backend))
        except RuntimeError as e:
            raise MeshError(f"Cannot get the devices of backend {backend!r}: {e}") from e
    devices = list(devices)
    if not devices:
        raise MeshError(
            "The device list is empty; a mesh needs at least one device. Pass devices=None to "
            "use all of jax.devices()."
        )
    counts = collections.Counter(map(_device_id, devices))
    dups = sorted(i for i, c in counts.items() if c > 1)
    if dups:
        raise MeshError(
            f"Devices with ids {dups} appear more than once in the device list; each device can "
            "hold one position of a mesh."
        )
    return devices


def _device_id(device: Any) -> int:
    try:
        return int(device.id)
    except AttributeError:
        raise NamedTypeError(
            f"Mesh devices must have an integer `id` (a jax.Device, or a stand-in with id, "
            f"process_index and optionally slice_index), got {device!r}."
        ) from None


def _plural(kind: str) -> str:
    return "processes" if kind == "process" else f"{kind}s"


def granule_kind(devices: Sequence[Any]) -> str:
    """``"slice"`` when devices name several slices, else ``"process"``.

    CPU and GPU devices report ``slice_index == 0`` on every process, so a slice index only
    defines granules when it actually tells devices apart.
    """
    slices = [getattr(d, "slice_index", None) for d in devices]
    if None not in slices and len(set(slices)) > 1:
        return "slice"
    return "process"


def device_granules(devices: Sequence[Any]) -> tuple[str, list[list[Any]]]:
    """Group devices into granules, each sorted by id; granules sorted by their index.

    Returns:
        ``(kind, granules)`` with ``kind`` ``"slice"`` or ``"process"``.

    Raises:
        MeshError: if granules hold different numbers of devices.
    """
    kind = granule_kind(devices)
    attr = "slice_index" if kind == "slice" else "process_index"
    groups: dict[int, list[Any]] = {}
    for d in devices:
        groups.setdefault(int(getattr(d, attr, 0)), []).append(d)
    granules = [sorted(groups[k], key=_device_id) for k in sorted(groups)]
    sizes = {len(g) for g in granules}
    if len(sizes) > 1:
        counts = ", ".join(f"{kind} {k}: {len(groups[k])}" for k in sorted(groups))
        raise MeshError(
            f"Every {kind} must contribute the same number of devices to a mesh, got {counts}. "
            f"Pass a device list with equally many devices from each {kind}."
        )
    return kind, granules


def _suggest_dcn(dims: Sequence[int], n: int) -> tuple[int, ...] | None:
    """Split ``n`` over several axes from the first (greatest common divisors), if possible."""
    out = []
    for d in dims:
        g = math.gcd(d, n)
        out.append(g)
        n //= g
    return tuple(out) if n == 1 else None


def infer_dcn_dims(
    axis_dims: Sequence[int], names: Sequence[str] | None, num_granules: int, kind: str = "process"
) -> tuple[int, ...]:
    """Put all granules on the first mesh axis whose size the granule count divides.

    Raises:
        MeshError: if no axis size is divisible by the granule count.
    """
    dcn = [1] * len(axis_dims)
    if num_granules == 1:
        return tuple(dcn)
    for i, d in enumerate(axis_dims):
        if d % num_granules == 0:
            dcn[i] = num_granules
            return tuple(dcn)
    # The product is a multiple of num_granules here, so a multi-axis split always exists.
    hint = _suggest_dcn(axis_dims, num_granules)
    raise MeshError(
        f"Cannot split mesh {format_dims(axis_dims, names)} across {num_granules} "
        f"{_plural(kind)}: no axis size is divisible by {num_granules}. Pass "
        f"dcn_mesh_dims={hint} to spread the {_plural(kind)} over several axes, or make one axis "
        f"size a multiple of {num_granules}."
    )


def _check_dcn_dims(
    dcn_dims: Any,
    axis_dims: Sequence[int],
    names: Sequence[str] | None,
    num_granules: int,
    kind: str,
) -> tuple[int, ...]:
    dcn = check_dims(dcn_dims, names, what="dcn_mesh_dims")
    if len(dcn) != len(axis_dims):
        raise MeshError(
            f"dcn_mesh_dims {dcn} has {len(dcn)} entries but the mesh has {len(axis_dims)} axes "
            f"{format_dims(axis_dims)}. Give one DCN size per mesh axis."
        )
    dcn = resolve_dims(dcn, names, num_granules, what="dcn_mesh_dims", unit=f"{_plural(kind)}")
    for i, (g, d) in enumerate(zip(axis_dims, dcn)):
        if g % d:
            axis = f"axis {names[i]!r}" if names else f"axis {i}"
            raise MeshError(
                f"dcn_mesh_dims {format_dims(dcn, names)} splits {axis} of size {g} into {d} "
                f"{kind} blocks, but {d} does not divide {g}. Choose a DCN size that divides the "
                "axis size."
            )
    return dcn


# -- arrangement -----------------------------------------------------------------------------


def _granule_array(devices: list[Any], ici_dims: tuple[int, ...], kind: str) -> np.ndarray:
    """One granule's devices in the shape ``ici_dims``."""
    if all(isinstance(d, jax.Device) for d in devices):
        # Real devices: let JAX follow the physical topology (TPU); on CPU/GPU it keeps id order.
        try:
            return mesh_utils.create_device_mesh(ici_dims, devices, allow_split_physical_axes=True)
        except (ValueError, NotImplementedError) as e:
            raise MeshError(
                f"Cannot arrange the {len(devices)} devices of one {kind} as {ici_dims}: {e}"
            ) from e
    arr = np.empty(len(devices), dtype=object)
    for i, d in enumerate(devices):
        arr[i] = d
    return arr.reshape(ici_dims)


def _arrange(
    granules: list[list[Any]], ici: tuple[int, ...], dcn: tuple[int, ...], kind: str
) -> np.ndarray:
    """Tile granule blocks (shape ``ici``) on a ``dcn`` grid, in granule order."""
    n = len(ici)
    grid = np.empty(dcn + ici, dtype=object)
    for block_index, devices in zip(np.ndindex(*dcn), granules):
        grid[block_index] = _granule_array(devices, ici, kind)
    # Interleave (dcn_0, ici_0, dcn_1, ici_1, ...) so that along axis k the global index is
    # dcn_k * ici_k + i: each granule's block is contiguous.
    order = [ax for k in range(n) for ax in (k, n + k)]
    return grid.transpose(order).reshape(tuple(d * i for d, i in zip(dcn, ici)))


def create_device_array(
    axis_dims: Sequence[int] = DEFAULT_AXIS_DIMS,
    axis_names: Sequence[str] = DEFAULT_AXIS_NAMES,
    *,
    dcn_mesh_dims: Sequence[int] | None = None,
    devices: Sequence[Any] | None = None,
) -> np.ndarray:
    """Arrange devices into a numpy array of shape ``axis_dims`` (the global mesh shape).

    Devices are grouped into granules (slices when devices have several ``slice_index`` values,
    else processes). Along each axis, the DCN size says how many granule blocks the axis spans;
    each granule owns one contiguous block, and within a granule devices follow their id (or the
    physical topology, for real TPU devices). Works with stand-in device objects, so multi-host
    layouts can be unit-tested.

    Args:
        axis_dims: Global mesh shape; one entry may be ``-1`` (the remaining devices).
        axis_names: One name per axis (used in messages).
        dcn_mesh_dims: How many granules each axis spans; its product is the granule count.
            Inferred when ``None``: the first axis whose size the granule count divides.
        devices: The devices; ``None`` means ``jax.devices()``.

    Returns:
        A numpy object array of devices of shape ``axis_dims`` (with ``-1`` filled in).

    Raises:
        MeshError: on bad sizes, an empty device list, unequal granules, or a DCN split that does
            not divide the axes.

    Example:
        >>> from types import SimpleNamespace as Dev
        >>> devs = [Dev(id=i, process_index=i // 2) for i in range(4)]
        >>> arr = create_device_array((2, 2), ("data", "model"), devices=devs)
        >>> [[d.process_index for d in row] for row in arr]
        [[0, 0], [1, 1]]
    """
    names = check_axis_names(axis_names)
    dims = check_dims(axis_dims, names)
    return _device_array(dims, names, dcn_mesh_dims, select_devices(devices))


def _device_array(
    dims: tuple[int, ...],
    names: tuple[str, ...] | None,
    dcn_mesh_dims: Sequence[int] | None,
    devices: list[Any],
    what: str = "axis_dims",
) -> np.ndarray:
    """``create_device_array`` on checked sizes and devices (``names`` may be ``None``)."""
    kind, granules = device_granules(devices)
    global_dims = resolve_dims(dims, names, len(devices), what=what, devices=devices)
    if dcn_mesh_dims is None:
        dcn = infer_dcn_dims(global_dims, names, len(granules), kind)
    else:
        dcn = _check_dcn_dims(dcn_mesh_dims, global_dims, names, len(granules), kind)
    ici = tuple(g // d for g, d in zip(global_dims, dcn))
    return _arrange(granules, ici, dcn, kind)


def hybrid_device_array(
    ici_dims: Sequence[int],
    dcn_dims: Sequence[int],
    axis_names: Sequence[str],
    devices: Sequence[Any] | None = None,
) -> np.ndarray:
    """Like ``create_device_array`` with the shape given as per-granule (ICI) x DCN sizes.

    A ``-1`` in ``ici_dims`` takes the rest of a granule's devices; a ``-1`` in ``dcn_dims`` the
    rest of the granules.

    Example:
        >>> from types import SimpleNamespace as Dev
        >>> devs = [Dev(id=i, process_index=i // 2) for i in range(4)]
        >>> hybrid_device_array((1, 2), (2, 1), ("data", "model"), devs).shape
        (2, 2)
    """
    names = check_axis_names(axis_names)
    ici = check_dims(ici_dims, names, what="ici_mesh_shape")
    dcn = check_dims(dcn_dims, names, what="dcn_mesh_shape")
    devices = select_devices(devices)
    kind, granules = device_granules(devices)
    ici = resolve_dims(
        ici,
        names,
        len(granules[0]),
        what="ici_mesh_shape",
        unit=f"devices per {kind}",
        devices=granules[0],
    )
    dcn = resolve_dims(dcn, names, len(granules), what="dcn_mesh_shape", unit=f"{_plural(kind)}")
    return _arrange(granules, ici, dcn, kind)


def build_mesh(
    device_array: np.ndarray, names: Sequence[str], axis_types: AxisTypes = None
) -> jax.sharding.Mesh:
    """A ``jax.sharding.Mesh`` over an arranged device array.

    JAX builds a ``Mesh`` over any hashable objects with an ``id``, so stand-in devices give a
    real ``Mesh`` whose layout (``mesh.devices``, ``mesh.shape``) can be checked and whose shape
    can plan specs; placing arrays on it needs real devices.
    """
    types = normalize_axis_types(axis_types, names)
    for d in device_array.flat:
        if isinstance(d, jax.Device):
            continue
        # JAX interns meshes by their devices (hashing them) and rebuilds the device array
        # with np.array, which would unpack a tuple-like device into numbers.
        if isinstance(d, (tuple, list, np.ndarray)) or getattr(type(d), "__hash__", None) is None:
            raise NamedTypeError(
                f"A jax.sharding.Mesh needs hashable, non-sequence device objects, got "
                f"{d!r} ({type(d).__name__}). Use jax.Device objects, or stand-ins of a frozen "
                "dataclass with id, process_index and slice_index fields."
            )
    return jax.sharding.Mesh(device_array, tuple(names), axis_types=types)


def process_block(device_array: np.ndarray, process: int) -> tuple[tuple[int, ...], bool]:
    """How many positions along each axis of ``device_array`` hold devices of ``process``, and
    whether those devices fill that block (one rectangle of the mesh, contiguous or not).

    All zeros when the process owns no device there.
    """
    mine = np.vectorize(lambda d: int(getattr(d, "process_index", 0)) == process, otypes=[bool])(
        device_array
    )
    extents = tuple(
        int(np.any(mine, axis=tuple(j for j in range(mine.ndim) if j != i)).sum())
        for i in range(mine.ndim)
    )
    return extents, math.prod(extents) == int(mine.sum())


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise NamedTypeError(
            f"{name} must be an int, got {value!r} ({type(value).__name__}). Pass e.g. {name}=4."
        )
    n = operator.index(value)
    if n < 1:
        raise MeshError(f"{name} must be a positive int, got {n}.")
    return n


def host_mesh_shape(
    global_mesh_shape: Sequence[int], devices_per_host: Any, num_processes: Any
) -> tuple[int, ...]:
    """The block of a global mesh that one host owns when every process is one granule.

    That is the layout ``create_device_array`` gives processes that are the granules (CPU and GPU
    hosts, or one process per TPU slice): the processes split the first axis that their count
    divides, and each holds the rest whole.
    """
    dims = check_dims(global_mesh_shape, what="global_mesh_shape")
    per_host = _positive_int("total_devices", devices_per_host)
    processes = _positive_int("num_processes", num_processes)
    dims = resolve_dims(
        dims,
        None,
        per_host * processes,
        what="global_mesh_shape",
        count_note=f" ({processes} processes x {per_host})",
    )
    dcn = infer_dcn_dims(dims, None, processes, "process")
    return tuple(g // d for g, d in zip(dims, dcn))


def host_mesh_shape_of(
    global_mesh_shape: Sequence[int], devices: Sequence[Any] | None
) -> tuple[int, ...]:
    """The block of a global mesh that each host owns in ``create_device_array``'s layout of
    ``devices`` (slices and processes as they are).

    Raises:
        MeshError: if some process's devices are not one block of the mesh, or the processes hold
            blocks of different shapes.
    """
    dims = check_dims(global_mesh_shape, what="global_mesh_shape")
    device_list = select_devices(devices)
    array = _device_array(dims, None, None, device_list, what="global_mesh_shape")
    blocks = {}
    for process in sorted({int(getattr(d, "process_index", 0)) for d in device_list}):
        block, whole = process_block(array, process)
        if not whole:
            raise MeshError(
                f"In the mesh {format_dims(array.shape)}, the devices of process {process} are "
                "not one block of it, so a host holds no mesh-shaped piece. Choose a shape whose "
                "axes split each host's devices evenly."
            )
        blocks.setdefault(block, []).append(process)
    if len(blocks) > 1:
        shown = "; ".join(f"{b} on process {format_names(p)}" for b, p in blocks.items())
        raise MeshError(
            f"In the mesh {format_dims(array.shape)}, hosts hold blocks of different shapes: "
            f"{shown}. Choose a shape whose axes split every host's devices alike."
        )
    return next(iter(blocks))
