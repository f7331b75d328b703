"""Mesh creation: ``create_mesh`` (single and multi-host), string parsing, CPU helpers.

``create_mesh`` lays devices out so that each slice or host (a *granule*) owns a contiguous block
of the mesh along the axis that crosses the slow network (DCN); the other axes stay on the fast
interconnect (ICI) inside one granule. ``MeshConfig`` bundles a mesh shape, axis names and
per-hardware overrides. See ``docs/mesh.md`` for the guide.
"""

from __future__ import annotations

import contextlib
import operator
import re
from collections.abc import Iterator, Sequence
from typing import Any

import jax

from .._errors import MeshError, NamedTypeError, format_names
from ._layout import (
    DEFAULT_AXIS_DIMS,
    DEFAULT_AXIS_NAMES,
    AxisTypes,
    build_mesh,
    check_axis_names,
    check_dims,
    create_device_array,
    host_mesh_shape,
    host_mesh_shape_of,
    more_cpu_devices,
    resolve_dims,
    select_devices,
)


def create_mesh(
    axis_dims: Sequence[int] = DEFAULT_AXIS_DIMS,
    axis_names: Sequence[str] = DEFAULT_AXIS_NAMES,
    *,
    dcn_mesh_dims: Sequence[int] | None = None,
    axis_types: AxisTypes = None,
    devices: Sequence[Any] | None = None,
    backend: str | None = None,
) -> jax.sharding.Mesh:
    """Create a device mesh, split between fast (ICI) and slow (DCN) links on multi-host setups.

    ``axis_dims`` is the global mesh shape. With several processes or slices, devices are grouped
    into granules (slices when devices have several ``slice_index`` values, else processes), and
    each granule owns one contiguous block of the mesh along the DCN-split axis.

    Args:
        axis_dims: Global mesh shape; at most one ``-1``, which takes the remaining devices. The
            default ``(1, -1, 1, 1, 1)`` puts every device on ``fsdp``.
        axis_names: One name per axis; default ``("dp", "fsdp", "ep", "tp", "sp")``.
        dcn_mesh_dims: How many granules each axis spans (product = granule count). When
            ``None``, the first axis whose size the granule count divides is split.
        axis_types: An ``AxisType``, ``"auto"`` / ``"explicit"`` / ``"manual"``, or one per axis.
            Default ``Auto``.
        devices: The devices to use (a subset); default all devices of ``backend``. Their order
            does not matter: within a slice or host devices are laid out by id (or by physical
            topology on TPU). Stand-in objects (hashable, with ``id``, ``process_index`` and
            ``slice_index``) give a ``Mesh`` over them, so multi-host layouts can be checked
            without the hardware.
        backend: ``"cpu"``, ``"gpu"`` or ``"tpu"``; default JAX's default backend. Not together
            with ``devices``.

    Returns:
        A ``jax.sharding.Mesh``.

    Raises:
        MeshError: on a wrong number of sizes, two ``-1``s, sizes that do not multiply to the
            device count, an empty device list, or a DCN split that divides no axis.

    Example:
        >>> mesh = create_mesh((2, -1), ("data", "model"), devices=jax.devices()[:8])
        >>> dict(mesh.shape)
        {'data': 2, 'model': 4}
    """
    names = check_axis_names(axis_names)
    device_list = select_devices(devices, backend)
    array = create_device_array(axis_dims, names, dcn_mesh_dims=dcn_mesh_dims, devices=device_list)
    return build_mesh(array, names, axis_types)


def create_cpu_mesh(
    axis_dims: Sequence[int] = DEFAULT_AXIS_DIMS,
    axis_names: Sequence[str] = DEFAULT_AXIS_NAMES,
    *,
    axis_types: AxisTypes = None,
) -> jax.sharding.Mesh:
    """Create a mesh over all CPU devices (all processes' CPUs in a multi-process run).

    Example:
        >>> mesh = create_cpu_mesh((1, -1), ("data", "model"))
        >>> mesh.devices.flat[0].platform
        'cpu'
    """
    return create_mesh(axis_dims, axis_names, axis_types=axis_types, backend="cpu")


@contextlib.contextmanager
def force_cpu() -> Iterator[jax.Device]:
    """Make this process's first CPU device JAX's default device inside the block.

    Yields:
        The CPU device. The previous default device is restored on exit.

    Example:
        >>> with force_cpu() as cpu:
        ...     x = jax.numpy.ones(3)
        >>> cpu.platform, x.devices() == {cpu}
        ('cpu', True)
    """
    cpu = jax.local_devices(backend="cpu")[0]
    with jax.default_device(cpu):
        yield cpu


@contextlib.contextmanager
def cpu_context(
    axis_dims: Sequence[int] = DEFAULT_AXIS_DIMS,
    axis_names: Sequence[str] = DEFAULT_AXIS_NAMES,
    *,
    axis_types: AxisTypes = None,
) -> Iterator[jax.sharding.Mesh]:
    """CPU as default device and a CPU mesh set with ``jax.set_mesh``, for tests and debugging.

    Yields:
        The CPU mesh (also ``jax.sharding.get_mesh()`` inside the block).

    Example:
        >>> with cpu_context((1, -1), ("data", "model")) as mesh:
        ...     assert jax.sharding.get_mesh() == mesh
    """
    with force_cpu():
        mesh = create_cpu_mesh(axis_dims, axis_names, axis_types=axis_types)
        with jax.set_mesh(mesh):
            yield mesh


_SIZE = re.compile(r"-?\d+")
# A named entry is ``name:size`` or ``name=size`` (as command-line flags often write it).
_NAMED = re.compile(r"[:=]")


def _parse_size(text: str, token: str, spec: str) -> int:
    if not _SIZE.fullmatch(text):
        raise MeshError(
            f"Mesh string {spec!r}: {token!r} has size {text!r}, which is not an integer. "
            "Write sizes as integers, e.g. 'dp:2,tp:4' (or -1 for the remaining devices)."
        )
    size = int(text)
    if size < 1 and size != -1:
        raise MeshError(
            f"Mesh string {spec!r}: {token!r} has size {size}; sizes must be >= 1, or -1 for "
            "the remaining devices."
        )
    return size


def _mixed_forms(
    spec: str, tokens: Sequence[str], named_tokens: Sequence[bool], names: tuple[str, ...]
) -> MeshError:
    """The error for a string mixing ``name:size`` (or ``name=size``) and bare entries, quoting the
    user's own."""
    named = tokens[named_tokens.index(True)]
    bare = tokens[named_tokens.index(False)]
    sep = next(c for c in named if c in ":=")  # the fix in the spelling the user chose
    if _SIZE.fullmatch(bare):
        return MeshError(
            f"Mesh string {spec!r} mixes named ({named!r}) and positional ({bare!r}) entries. "
            "Use one form throughout."
        )
    # A bare name among named entries is a forgotten size (e.g. 'data:2,model').
    if bare in names:
        return MeshError(f"Mesh string {spec!r}: {bare!r} has no size: write '{bare}{sep}N'.")
    return MeshError(
        f"Mesh string {spec!r}: {bare!r} has no size and is not a mesh axis. Available axes: "
        f"{format_names(names)}. Write 'axis{sep}N' with one of them."
    )


def _check_num_devices(num_devices: object, spec: str) -> int:
    if isinstance(num_devices, bool) or not hasattr(num_devices, "__index__"):
        raise NamedTypeError(
            f"Mesh string {spec!r}: num_devices must be an int, got {num_devices!r} "
            f"({type(num_devices).__name__}). Pass e.g. num_devices=8, or leave it out to use "
            "every device."
        )
    n = operator.index(num_devices)  # type: ignore[arg-type]
    if n < 1:
        raise MeshError(
            f"Mesh string {spec!r}: num_devices must be at least 1, got {n}. Pass the number of "
            "devices the mesh covers, or leave it out to use every device."
        )
    return n


def parse_mesh_shape(
    spec: str, names: Sequence[str] | str, *, num_devices: int | None = None
) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Parse ``"dp:2,tp:4"`` (named) or ``"2,4"`` (positional) into a mesh shape and names.

    A named entry may also be written ``name=size`` (``"dp=2,tp=4"``). In the named form, axes of
    ``names`` that the string does not mention get size 1; in the positional form the string gives
    one size per name. ``-1`` is kept (``create_mesh`` fills it in), but the sizes are checked
    against the device count. Nothing is built: use this to check or adjust a shape;
    ``parse_mesh_from_string`` builds the mesh.

    Args:
        spec: The mesh string, e.g. from a command-line flag.
        names: All mesh axis names, in mesh order (a bare string is one name).
        num_devices: Devices the mesh must cover (a positive int); default
            ``jax.device_count()``.

    Returns:
        ``(axis_dims, axis_names)``, ready for ``create_mesh(*parse_mesh_shape(...))``.

    Raises:
        MeshError: on unknown or repeated names, malformed or non-positive sizes, a mix of the two
            forms (or a named-form entry without a size), a wrong number of positional sizes,
            sizes that cannot cover the devices, or ``num_devices < 1``.
        NamedTypeError: if ``spec`` is not a str or ``num_devices`` not an int.

    Example:
        >>> parse_mesh_shape("dp:2,tp:4", ("dp", "fsdp", "tp"), num_devices=8)
        ((2, 1, 4), ('dp', 'fsdp', 'tp'))
        >>> parse_mesh_shape("2,-1", ("data", "model"), num_devices=8)
        ((2, -1), ('data', 'model'))
        >>> parse_mesh_shape("dp=2,tp=4", ("dp", "tp"), num_devices=8)
        ((2, 4), ('dp', 'tp'))
    """
    if not isinstance(spec, str):
        raise NamedTypeError(
            f"The mesh string must be a str, got {spec!r} ({type(spec).__name__})."
        )
    if num_devices is not None:  # a count to plan for, not this machine's devices
        return _parse_shape(spec, names, _check_num_devices(num_devices, spec), None)
    devices = jax.devices()
    return _parse_shape(spec, names, len(devices), devices)


def _parse_shape(
    spec: str, names: Sequence[str] | str, num_devices: int, devices: Sequence[Any] | None
) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """``parse_mesh_shape`` for ``num_devices`` devices (``devices``, if they are real ones)."""
    names = check_axis_names(names, what="names")
    tokens = [t.strip() for t in spec.split(",")]
    if not spec.strip() or any(not t for t in tokens):
        raise MeshError(
            f"Mesh string {spec!r} has an empty entry. Write comma-separated entries such as "
            "'dp:2,tp:4' or '2,4'."
        )
    named_tokens = [_NAMED.search(t) is not None for t in tokens]
    if all(named_tokens):
        sizes: dict[str, int] = {}
        for token in tokens:
            name, size_text = (part.strip() for part in _NAMED.split(token, maxsplit=1))
            if name not in names:
                raise MeshError(
                    f"Mesh string {spec!r} names axis {name!r}, which is not a mesh axis. "
                    f"Available axes: {format_names(names)}."
                )
            if name in sizes:
                raise MeshError(
                    f"Mesh string {spec!r} gives axis {name!r} twice. Give each axis once."
                )
            sizes[name] = _parse_size(size_text, token, spec)
        dims = tuple(sizes.get(n, 1) for n in names)
    elif not any(named_tokens):
        if len(tokens) != len(names):
            raise MeshError(
                f"Mesh string {spec!r} gives {len(tokens)} sizes for {len(names)} mesh axes "
                f"({format_names(names)}). Give one size per axis, or use the named form "
                "'name:size,...'."
            )
        dims = tuple(_parse_size(t, t, spec) for t in tokens)
    else:
        raise _mixed_forms(spec, tokens, named_tokens, names)
    dims = check_dims(dims, names, what=f"Mesh string {spec!r} =")
    resolve_dims(dims, names, num_devices, what=f"Mesh string {spec!r} =", devices=devices)
    return dims, names


def parse_mesh_from_string(
    spec: str,
    names: Sequence[str] | str,
    *,
    num_devices: int | None = None,
    devices: Sequence[Any] | None = None,
    axis_types: AxisTypes = None,
) -> jax.sharding.Mesh:
    """Build a mesh from ``"dp:2,tp:4"`` (named) or ``"2,4"`` (positional), e.g. a command-line flag.

    The string is read as ``parse_mesh_shape`` reads it (``"dp=2,tp=4"`` too; named-form axes not
    mentioned get size 1; one ``-1`` takes the remaining devices) and the mesh is built by
    ``create_mesh``, so multi-host layouts follow the same ICI/DCN rule.

    Args:
        spec: The mesh string.
        names: All mesh axis names, in mesh order (a bare string is one name).
        num_devices: Use only the first ``num_devices`` devices (a positive int); default all.
        devices: The devices to choose from (real ones or stand-ins with ``id``,
            ``process_index`` and ``slice_index``); default ``jax.devices()``.
        axis_types: As in ``create_mesh``; default ``Auto``.

    Returns:
        A ``jax.sharding.Mesh`` with axes ``names``.

    Raises:
        MeshError: on a malformed string (see ``parse_mesh_shape``), sizes that do not cover the
            devices, or ``num_devices`` below 1 or above the devices available.
        NamedTypeError: if ``spec`` is not a str or ``num_devices`` not an int.

    Example:
        >>> mesh = parse_mesh_from_string("dp:2,tp:4", ("dp", "tp"))
        >>> dict(mesh.shape)
        {'dp': 2, 'tp': 4}
        >>> dict(parse_mesh_from_string("2,-1", ("data", "model"), num_devices=4).shape)
        {'data': 2, 'model': 2}
    """
    if not isinstance(spec, str):
        raise NamedTypeError(
            f"The mesh string must be a str, got {spec!r} ({type(spec).__name__})."
        )
    device_list = select_devices(devices)
    if num_devices is not None:
        n = _check_num_devices(num_devices, spec)
        if n > len(device_list):
            raise MeshError(
                f"Mesh string {spec!r}: num_devices={n}, but only {len(device_list)} devices are "
                f"available. Pass num_devices <= {len(device_list)}, or more devices."
                + more_cpu_devices(n, device_list)
            )
        device_list = device_list[:n]
    dims, names = _parse_shape(spec, names, len(device_list), device_list)
    return create_mesh(dims, names, axis_types=axis_types, devices=device_list)


def calculate_host_mesh_shape(
    global_mesh_shape: Sequence[int],
    total_devices: int | None = None,
    num_processes: int | None = None,
    *,
    devices: Sequence[Any] | None = None,
) -> tuple[int, ...]:
    """The block of a global mesh that one host (process) holds.

    Without counts, this is the block each process holds in ``create_mesh``'s layout of
    ``devices`` (default ``jax.devices()``), slices included: on 2 TPU slices of 2 hosts each,
    ``(2, 4)`` splits the first axis between the slices and each slice's ``(1, 4)`` between its
    hosts, so a host holds ``(1, 2)``.

    With ``total_devices`` and ``num_processes``, it plans for hardware that is not there, taking
    each process as one granule (CPU and GPU hosts, or one process per TPU slice): the processes
    split the first axis whose size their count divides, and each holds the other axes whole. For
    several processes per slice, pass stand-in ``devices`` instead (see ``docs/mesh.md``).

    Args:
        global_mesh_shape: The global mesh shape; one entry may be ``-1``.
        total_devices: Devices on *one* host; default ``jax.local_device_count()`` when
            ``num_processes`` is given.
        num_processes: Number of processes; default ``jax.process_count()`` when
            ``total_devices`` is given.
        devices: The devices to lay out (real ones or stand-ins with ``id``, ``process_index``
            and ``slice_index``); default ``jax.devices()``. Not together with the counts.

    Returns:
        The per-host mesh shape (its product is the devices of one host).

    Raises:
        MeshError: if the global shape does not cover the devices, no axis size is divisible by
            the granule count, ``devices`` are given with counts, or the hosts hold no equal
            blocks of the mesh.
        NamedTypeError: if a count is not an int.

    Example:
        >>> calculate_host_mesh_shape((2, 4), total_devices=4, num_processes=2)
        (1, 4)
        >>> calculate_host_mesh_shape((1, 8), total_devices=2, num_processes=4)
        (1, 2)
        >>> calculate_host_mesh_shape((2, 4))  # this run: one process of 8 devices
        (2, 4)
    """
    if total_devices is None and num_processes is None:
        return host_mesh_shape_of(global_mesh_shape, devices)
    if devices is not None:
        raise MeshError(
            f"calculate_host_mesh_shape got devices ({len(devices)} of them) and device counts "
            f"(total_devices={total_devices!r}, num_processes={num_processes!r}). Pass one: "
            "devices to lay them out as create_mesh does, or the counts to plan for one process "
            "per granule."
        )
    if total_devices is None:
        total_devices = jax.local_device_count()
    if num_processes is None:
        num_processes = jax.process_count()
    return host_mesh_shape(global_mesh_shape, total_devices, num_processes)
