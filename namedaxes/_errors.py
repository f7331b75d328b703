"""Exception types and the formatters their messages share.

Every error the library raises on bad user input is one of these types. Each subclasses
``ValueError`` or ``TypeError`` so callers can catch the usual thing, and each message says what
failed, shows the offending names/sizes/mesh/path, lists what was available, and names one fix.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "AttentionKernelError",
    "AxisError",
    "AxisIndexError",
    "AxisNotFoundError",
    "AxisSizeError",
    "BarrierTimeoutError",
    "CheckpointAxisError",
    "CheckpointDtypeError",
    "CheckpointError",
    "CheckpointNotFoundError",
    "CheckpointStructureError",
    "DistributedError",
    "DonatedArrayError",
    "DuplicateAxisError",
    "KernelError",
    "LayerError",
    "MappingTypeError",
    "MemoryAnalysisUnavailableError",
    "ModelConfigError",
    "CompileTargetError",
    "DeviceOutOfMemoryError",
    "PlanError",
    "MeshError",
    "MeshTypeError",
    "NamedAxesError",
    "NamedTypeError",
    "ShardingError",
    "ShardingWarning",
    "SpecMismatchError",
    "UnmatchedMappingError",
    "UnsatisfiedAxisError",
    "did_you_mean",
    "format_axes",
    "format_mesh",
    "format_names",
    "format_path",
]


class NamedAxesError(Exception):
    """Base class of every error raised by namedaxes on bad input."""


class AxisError(NamedAxesError, ValueError):
    """An axis specification is invalid (bad name, bad size, wrong count)."""


class AxisNotFoundError(AxisError, KeyError):
    """An axis name was asked for that the array does not have."""

    # KeyError quotes its message in str(); keep it readable.
    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class DuplicateAxisError(AxisError):
    """The same axis name appears twice where names must be unique."""


class AxisSizeError(AxisError):
    """Two axes with the same name disagree on their size, or a size does not fit."""


class AxisIndexError(AxisSizeError, IndexError):
    """A static index is outside its axis (``x["seq", 7]`` when ``seq`` has size 3).

    Also an ``IndexError`` (what NumPy raises) and an ``AxisSizeError`` (the index does not fit the
    axis' size).
    """


class NamedTypeError(NamedAxesError, TypeError):
    """An argument has the wrong type (for example a plain array where a NamedArray is needed)."""


class DonatedArrayError(NamedTypeError, RuntimeError):
    """An array's buffer is gone: it was donated to a call (``named_jit``/``fsdp`` with
    ``donate_args``, ``jax.jit`` with ``donate_argnums``) and then used again, to call with or to
    save. Also a ``RuntimeError``, what JAX raises for a deleted array."""


class ShardingError(NamedAxesError, ValueError):
    """A logical-to-physical mapping cannot be applied to an array on a mesh."""


class MappingTypeError(ShardingError, NamedTypeError):
    """A sharding mapping or rule holds a value of the wrong type (both a ``ShardingError`` and a
    ``TypeError``)."""


class SpecMismatchError(ShardingError):
    """A tree of partition specs does not match the tree of arrays it describes."""


class UnsatisfiedAxisError(ShardingError):
    """No rule of a mapping can place an axis (``resolve`` with ``unsatisfied="error"``).

    Callers that know the remedies their users have (``from_hf``, ``named_jit``) rewrite the
    advice from the fields instead of the text.

    Attributes:
        axis: The axis's name.
        diagnosis: The message without its advice: the array, the mesh and why each candidate
            rule failed.
        candidates: The axis's candidate mesh-axis tuples in rule order.
    """

    def __init__(
        self, message: str, axis: str = "", diagnosis: str = "", candidates: tuple[Any, ...] = ()
    ):
        super().__init__(message)
        self.axis, self.diagnosis, self.candidates = axis, diagnosis, candidates

    def fallback_advice(self) -> str:
        """The fix every caller can offer: a fallback rule for the axis in a list mapping."""
        first = self.candidates[0] if self.candidates else ()
        target = repr(first[0]) if len(first) == 1 else repr(first)
        axis = repr(self.axis)
        return (
            f"give {axis} a fallback in a list mapping, e.g. [..., ({axis}, {target}), ({axis}, "
            "None)], which replicates it where no earlier rule applies"
        )


def with_prefix(error: Exception, prefix: str) -> Exception:
    """``error`` again, of its type, its message after ``prefix`` (where it happened: a leaf's
    path, the caller), keeping the fields of a structured error (``UnsatisfiedAxisError``)."""
    new = type(error)(f"{prefix}{error}")
    new.__dict__.update(error.__dict__)
    if isinstance(error, UnsatisfiedAxisError) and error.diagnosis:
        new.diagnosis = f"{prefix}{error.diagnosis}"  # type: ignore[attr-defined]
    return new


class UnmatchedMappingError(ShardingError):
    """A mapping has entries that match no axis of the tree it places (raised with ``strict=True``
    by ``shard``, ``named_jit`` and ``fsdp``)."""


class MeshError(NamedAxesError, ValueError):
    """A device mesh cannot be built or parsed as asked."""


class MeshTypeError(MeshError, NamedTypeError):
    """Something given as a mesh is not one (or not the kind needed): both a ``MeshError`` and a
    ``TypeError``."""


class NoMeshError(MeshError, ShardingError):
    """A mesh is needed and none was given or set (catchable as ``MeshError`` or ``ShardingError``)."""


class DistributedError(NamedAxesError, RuntimeError):
    """A multi-process operation failed (runtime not initialized, peers not answering)."""


class BarrierTimeoutError(DistributedError, TimeoutError):
    """Not every process reached a barrier within its timeout."""


class MemoryAnalysisUnavailableError(NamedAxesError, NotImplementedError):
    """The backend cannot report compiled memory figures (``memory_analysis()`` is missing)."""


class LayerError(NamedAxesError, ValueError):
    """A ``namedaxes.nn`` layer was configured with an invalid value (e.g. a dropout rate >= 1)."""


class AttentionKernelError(LayerError):
    """An attention kernel asked for by name cannot run here: not on this device, not for these
    dtypes, shapes or options (``dot_product_attention(..., implementation="cudnn")`` on a CPU)."""


class KernelError(NamedAxesError, ValueError):
    """A kernel of ``namedaxes.kernels`` got operands it cannot take (ranks, shapes, dtypes) or
    options it cannot run with (a tiling that is not powers of 2)."""


class PlanError(NamedAxesError, ValueError):
    """Planning input is invalid (a budget that is not a byte count, a bad step or factory)."""


class CompileTargetError(PlanError):
    """A compile target cannot be used (unparsable ``"cpu:data=4"`` string, missing ``libtpu``, a
    mesh too large for the local devices, or the compiling subprocess failed)."""


class DeviceOutOfMemoryError(NamedAxesError, ValueError):
    """XLA refused to compile a program because it does not fit in device memory.

    Attributes:
        used_bytes: Bytes XLA said the program needs per device (``None`` if not reported).
        capacity_bytes: The device memory XLA compared against (``None`` if not reported).
        xla_message: XLA's own message.
    """

    def __init__(
        self, message: str, *, used_bytes: int | None, capacity_bytes: int | None, xla_message: str
    ) -> None:
        super().__init__(message)
        self.used_bytes = used_bytes
        self.capacity_bytes = capacity_bytes
        self.xla_message = xla_message


class ShardingWarning(UserWarning):
    """Base class of the warnings namedaxes emits about shardings (bad specs, unmet budgets)."""


def format_names(names: Iterable[Any]) -> str:
    """Quote and comma-join names: ``'batch', 'embed'`` (``(none)`` when empty)."""
    quoted = [repr(n) for n in names]
    return ", ".join(quoted) if quoted else "(none)"


def did_you_mean(name: str, names: Iterable[str]) -> str:
    """The hint a typo's report ends with: the one of ``names`` closest to ``name`` (by
    ``difflib``), or an empty string when none is close.

    Example:
        >>> did_you_mean("emebd", ["batch", "embed"]), did_you_mean("seq", ["embed"])
        (" (did you mean 'embed'?)", '')
    """
    close = difflib.get_close_matches(name, [n for n in names if n != name], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def format_axes(axes: Iterable[Any]) -> str:
    """Render axes as ``batch=8, embed=64``.

    Accepts ``Axis`` objects (anything with ``name`` and ``size``), ``(name, size)`` pairs, or a
    ``{name: size}`` mapping.
    """
    if isinstance(axes, Mapping):
        items = list(axes.items())
    else:
        items = [(a.name, a.size) if hasattr(a, "name") else tuple(a) for a in axes]
    return ", ".join(f"{name}={size}" for name, size in items)


def format_mesh(mesh: Any) -> str:
    """Render a mesh as ``Mesh(data=2, model=4)``.

    Accepts a ``Mesh`` or ``AbstractMesh`` (anything whose ``shape`` is a mapping), a
    ``{name: size}`` mapping, or ``((name, size), ...)`` pairs; ``None`` gives ``no mesh`` and
    anything else its ``repr``.
    """
    if mesh is None:
        return "no mesh"
    shape = getattr(mesh, "shape", None)
    if isinstance(shape, Mapping):
        items: Iterable[Any] = shape.items()
    elif isinstance(mesh, Mapping):
        items = mesh.items()
    elif isinstance(mesh, tuple) and all(isinstance(p, tuple) and len(p) == 2 for p in mesh):
        items = mesh
    else:
        return repr(mesh)
    return "Mesh(" + ", ".join(f"{name}={size}" for name, size in items) + ")"


def format_path(path: Iterable[Any]) -> str:
    """Render a pytree key path as ``params/layers/0/weight`` (``<root>`` when empty)."""
    parts = []
    for key in path:
        for attr in ("name", "key", "idx"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return "/".join(parts) if parts else "<root>"


# -- checkpoints (namedaxes.checkpoint) ---------------------------------------------------------


class CheckpointError(NamedAxesError, ValueError):
    """A checkpoint cannot be saved or restored as asked (base of the checkpoint errors)."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """A path holds no complete checkpoint (missing, not a namedaxes checkpoint, or an unfinished
    save without its commit marker)."""


class CheckpointStructureError(CheckpointError):
    """The checkpoint's leaves and the tree they are restored into differ (a missing or extra leaf,
    or a leaf of another kind)."""


class CheckpointAxisError(CheckpointError):
    """An axis name or size (or a plain array's shape) differs between the checkpoint and ``like``."""


class CheckpointDtypeError(CheckpointError):
    """A leaf's dtype cannot go where it is asked to: it differs between the checkpoint and
    ``like`` and no cast was asked for, ``like``'s dtype cannot hold the saved value, or the
    checkpoint cannot store it."""


class GenerationError(NamedAxesError, ValueError):
    """Generation cannot run with these options (``namedaxes.models.generate``): a bad sampling
    option or length, or a model that cannot reach the positions asked for."""


class QuantizationError(NamedAxesError, ValueError):
    """Weights cannot be quantized, or a quantized model cannot do what was asked: an unknown
    format, weights quantized twice, a quantized model given to ``save_hf``."""


class ModelConfigError(NamedAxesError, ValueError):
    """A model configuration cannot be used: an unsupported ``model_type`` or option in a Hugging Face
    ``config.json``, or values that contradict each other (``namedaxes.models``)."""


class PlanDoesNotFitError(PlanError):
    """No mapping fits the budget: every one ``plan_search`` tried needs more bytes per device
    (state, or compiled step) than asked for. ``python -m namedaxes plan --search`` exits 1 on it,
    as it does for a plan that does not fit."""
