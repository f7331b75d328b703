"""``HybridMeshShape`` and ``MeshConfig``: immutable mesh descriptions with per-hardware rules."""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import jax
import numpy as np

from .._errors import MeshError, NamedTypeError, format_names
from ._layout import (
    AxisTypes,
    build_mesh,
    check_axis_names,
    check_dims,
    create_device_array,
    hybrid_device_array,
    select_devices,
)

__all__ = ["HybridMeshShape", "MeshConfig", "MeshShape"]


@dataclass(frozen=True)
class HybridMeshShape:
    """A mesh shape given as per-granule (ICI) sizes and across-granule (DCN) sizes.

    The global size of axis ``k`` is ``ici_mesh_shape[k] * dcn_mesh_shape[k]``. Each shape may
    hold one ``-1``: in ``ici_mesh_shape`` it takes the rest of a granule's devices, in
    ``dcn_mesh_shape`` the rest of the granules.

    Args:
        ici_mesh_shape: Sizes within one slice or host (fast interconnect).
        dcn_mesh_shape: How many slices or hosts each axis spans (data-centre network).

    Raises:
        MeshError: if the lengths differ, a size is not a positive int or ``-1``, or a shape has
            two ``-1``s.

    Example:
        >>> # 2 hosts x 8 GPUs: data parallel across hosts, model parallel within a host.
        >>> shape = HybridMeshShape(ici_mesh_shape=(1, 8), dcn_mesh_shape=(2, 1))
        >>> shape.ndim
        2
    """

    ici_mesh_shape: tuple[int, ...]
    dcn_mesh_shape: tuple[int, ...]

    def __post_init__(self) -> None:
        ici = check_dims(self.ici_mesh_shape, what="ici_mesh_shape")
        dcn = check_dims(self.dcn_mesh_shape, what="dcn_mesh_shape")
        if len(ici) != len(dcn):
            raise MeshError(
                f"HybridMeshShape needs equally long shapes, got ici_mesh_shape {ici} "
                f"({len(ici)} axes) and dcn_mesh_shape {dcn} ({len(dcn)} axes). Give one ICI and "
                "one DCN size per mesh axis (1 where an axis does not span hosts)."
            )
        object.__setattr__(self, "ici_mesh_shape", ici)
        object.__setattr__(self, "dcn_mesh_shape", dcn)

    @property
    def ndim(self) -> int:
        """The number of mesh axes."""
        return len(self.ici_mesh_shape)


#: A global mesh shape (tuple of ints, one may be -1) or a ``HybridMeshShape``.
MeshShape: TypeAlias = tuple[int, ...] | HybridMeshShape


def _check_shape(shape: Any, names: tuple[str, ...], what: str) -> MeshShape:
    if isinstance(shape, HybridMeshShape):
        if shape.ndim != len(names):
            raise MeshError(
                f"{what} {shape} has {shape.ndim} axes but there are {len(names)} mesh axis names "
                f"({format_names(names)}). Give one size per axis name."
            )
        return shape
    return check_dims(shape, names, what=what)


@dataclass(frozen=True)
class MeshConfig:
    """A mesh shape with axis names, batch axes and per-hardware overrides.

    Args:
        mesh_shape: The global mesh shape (a tuple; its DCN split is inferred as in
            ``create_mesh``), or a ``HybridMeshShape`` giving ICI and DCN sizes explicitly.
        mesh_axis_names: One unique name per mesh axis.
        batch_axis_names: The mesh axis (or axes) that input batches are sharded over; each must
            be one of ``mesh_axis_names``, listed once (a bare string is one name).
        mesh_rules: ``(regex, mesh_shape_or_None)`` pairs, tried in order by ``select`` against a
            hardware string such as ``"tpu-v5e-256"``; ``None`` keeps the default shape.

    Raises:
        MeshError: on shapes whose length differs from the names, two ``-1``s in a shape,
            repeated names, unknown or repeated batch axes, or an invalid rule.

    Example:
        >>> config = MeshConfig(
        ...     mesh_shape=(1, -1),
        ...     mesh_axis_names=("data", "model"),
        ...     mesh_rules=(("tpu-v5e-.*", (-1, 8)), ("gpu-.*", None)),
        ... )
        >>> config.select("tpu-v5e-256").mesh_shape
        (-1, 8)
        >>> config.select("gpu-h100-8").mesh_shape
        (1, -1)
    """

    mesh_shape: MeshShape
    mesh_axis_names: tuple[str, ...]
    batch_axis_names: str | tuple[str, ...] = "data"
    mesh_rules: tuple[tuple[str, MeshShape | None], ...] | None = None

    def __post_init__(self) -> None:
        names = check_axis_names(self.mesh_axis_names, what="mesh_axis_names")
        object.__setattr__(self, "mesh_axis_names", names)
        object.__setattr__(self, "mesh_shape", _check_shape(self.mesh_shape, names, "mesh_shape"))
        object.__setattr__(self, "batch_axis_names", self._check_batch_axes(names))
        if self.mesh_rules is not None:
            object.__setattr__(self, "mesh_rules", self._check_rules(names))

    def _check_batch_axes(self, names: tuple[str, ...]) -> str | tuple[str, ...]:
        batch = self.batch_axis_names
        if isinstance(batch, str):
            given: tuple[Any, ...] = (batch,)
        elif isinstance(batch, Sequence):
            batch = given = tuple(batch)
        else:
            raise NamedTypeError(
                f"batch_axis_names must be a mesh axis name or a sequence of them, got {batch!r}."
            )
        unknown = [b for b in given if b not in names]
        if unknown:
            raise MeshError(
                f"batch_axis_names {format_names(unknown)} are not mesh axes. Available axes: "
                f"{format_names(names)}. Pass batch_axis_names= one or more of them."
            )
        repeated = [b for b in dict.fromkeys(given) if given.count(b) > 1]
        if repeated:
            raise MeshError(
                f"batch_axis_names {format_names(given)} repeat mesh axis "
                f"{format_names(repeated)}; a batch is split over each mesh axis at most once. "
                "List each batch axis once."
            )
        return batch

    def _check_rules(self, names: tuple[str, ...]) -> tuple[tuple[str, MeshShape | None], ...]:
        rules = self.mesh_rules
        if isinstance(rules, (str, bytes)) or not isinstance(rules, Sequence):
            raise NamedTypeError(
                f"mesh_rules must be a sequence of (regex, mesh_shape) pairs, got {rules!r}."
            )
        checked = []
        for i, rule in enumerate(rules):
            if not (isinstance(rule, Sequence) and len(rule) == 2 and isinstance(rule[0], str)):
                raise MeshError(
                    f"mesh_rules[{i}] is {rule!r}; each rule must be a (regex, mesh_shape) pair, "
                    "e.g. ('tpu-v5e-.*', (-1, 8)), with mesh_shape None to keep the default."
                )
            pattern, shape = rule
            try:
                re.compile(pattern)
            except re.error as e:
                raise MeshError(
                    f"mesh_rules[{i}] pattern {pattern!r} is not a valid regular expression: {e}."
                ) from e
            if shape is not None:
                shape = _check_shape(shape, names, f"mesh_rules[{i}] ({pattern!r}) mesh shape")
            checked.append((pattern, shape))
        return tuple(checked)

    def select(self, selector: str) -> MeshConfig:
        """Apply the first mesh rule whose regex fully matches ``selector``.

        Args:
            selector: A hardware string, e.g. ``"tpu-v5e-256"`` or ``"gpu-h100-8"``.

        Returns:
            A new config with the rule's shape (or the default shape, for a ``None`` rule or no
            match) and no rules left: it describes the chosen mesh.

        Warns:
            UserWarning: when rules exist but none matches (likely a typo in the selector).

        Example:
            >>> config = MeshConfig((2, 4), ("data", "model"), mesh_rules=(("gpu-.*", (1, 8)),))
            >>> config.select("gpu-h100-8").mesh_shape
            (1, 8)
        """
        if not isinstance(selector, str):
            raise NamedTypeError(
                f"The mesh selector must be a str such as 'tpu-v5e-256', got {selector!r}."
            )
        for pattern, shape in self.mesh_rules or ():
            if re.fullmatch(pattern, selector):
                return dataclasses.replace(
                    self, mesh_shape=self.mesh_shape if shape is None else shape, mesh_rules=None
                )
        if self.mesh_rules:
            patterns = format_names(p for p, _ in self.mesh_rules)
            warnings.warn(
                f"Mesh selector {selector!r} matches none of the mesh rules ({patterns}); using "
                f"the default mesh shape {self.mesh_shape}.",
                UserWarning,
                stacklevel=2,
            )
        return dataclasses.replace(self, mesh_rules=None)

    def device_array(self, devices: Sequence[Any] | None = None) -> np.ndarray:
        """Arrange ``devices`` (default ``jax.devices()``) in this config's mesh shape.

        Accepts stand-in device objects (``id``, ``process_index``, optional ``slice_index``), so
        layouts can be checked without the hardware.

        Example:
            >>> from types import SimpleNamespace as Dev
            >>> devs = [Dev(id=i, process_index=i // 4) for i in range(8)]
            >>> config = MeshConfig(HybridMeshShape((1, 4), (2, 1)), ("data", "model"))
            >>> [[d.process_index for d in row] for row in config.device_array(devs)]
            [[0, 0, 0, 0], [1, 1, 1, 1]]
        """
        devices = select_devices(devices)
        if isinstance(self.mesh_shape, HybridMeshShape):
            return hybrid_device_array(
                self.mesh_shape.ici_mesh_shape,
                self.mesh_shape.dcn_mesh_shape,
                self.mesh_axis_names,
                devices,
            )
        return create_device_array(self.mesh_shape, self.mesh_axis_names, devices=devices)

    def create_device_mesh(
        self, devices: Sequence[Any] | None = None, axis_types: AxisTypes = None
    ) -> jax.sharding.Mesh:
        """Build the ``jax.sharding.Mesh`` (ICI within a granule, DCN across granules).

        Args:
            devices: The devices; default ``jax.devices()``. Stand-ins (hashable, with ``id``,
                ``process_index`` and ``slice_index``) give a ``Mesh`` over them, to check a
                multi-host layout without the hardware.
            axis_types: As in ``create_mesh``; default ``Auto``.

        Example:
            >>> config = MeshConfig((2, -1), ("data", "model"))
            >>> dict(config.create_device_mesh(jax.devices()[:8]).shape)
            {'data': 2, 'model': 4}
            >>> from dataclasses import dataclass
            >>> @dataclass(frozen=True)
            ... class Dev:
            ...     id: int
            ...     process_index: int
            ...     slice_index: int = 0
            >>> hosts = [Dev(id=i, process_index=i // 4) for i in range(8)]
            >>> mesh = MeshConfig(HybridMeshShape((1, 4), (2, 1)), ("data", "model")).create_device_mesh(hosts)
            >>> [[d.process_index for d in row] for row in mesh.devices]
            [[0, 0, 0, 0], [1, 1, 1, 1]]
        """
        return build_mesh(self.device_array(devices), self.mesh_axis_names, axis_types)
