"""Rotary position embeddings (RoPE) over a named ``head_dim`` axis, with the usual scalings."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from .._array import NamedArray
from .._axis import Axis
from .._errors import LayerError, NamedTypeError, format_axes
from .._ops._common import explicit_sharding, unshard_dims
from .._spec import entry_axes
from ._common import expect_axes, place

__all__ = ["RopeScaling", "RotaryEmbedding"]

ROPE_KINDS = ("default", "linear", "dynamic", "llama3", "yarn")


@dataclass(frozen=True)
class RopeScaling:
    """How a :class:`RotaryEmbedding` stretches its frequencies past the training context.

    ``kind`` is one of:

    - ``"default"``: plain RoPE, ``inv_freq[i] = theta ** (-2i / head_dim)``;
    - ``"linear"``: every frequency divided by ``factor`` (position interpolation);
    - ``"dynamic"``: NTK-aware: once the largest position id + 1 exceeds
      ``original_max_position_embeddings``, the base becomes
      ``theta * (factor * n / original - (factor - 1)) ** (d / (d - 2))``, ``n`` that length;
    - ``"llama3"``: wavelengths above ``original / low_freq_factor`` divided by ``factor``, below
      ``original / high_freq_factor`` kept, a smooth blend between;
    - ``"yarn"``: per-frequency blend of interpolated (``/ factor``) and original frequencies over
      the correction range set by ``beta_fast``/``beta_slow``, and cos/sin scaled by the attention
      factor (``0.1 * mscale * ln(factor) + 1`` unless given).

    These are the ``rope_type``\\s of Hugging Face configs; ``namedaxes.models`` reads them from
    ``config.json``.

    Args:
        kind: The scaling type (above).
        factor: The scaling factor (not used by ``"default"``).
        original_max_position_embeddings: The context length the model was trained with
            (``"dynamic"``, ``"llama3"``, ``"yarn"``).
        low_freq_factor: ``"llama3"``.
        high_freq_factor: ``"llama3"``.
        beta_fast: ``"yarn"`` (extrapolation bound of the ramp).
        beta_slow: ``"yarn"`` (interpolation bound of the ramp).
        attention_factor: ``"yarn"``: the cos/sin scale; ``None`` derives it from ``factor``
            (and ``mscale``/``mscale_all_dim`` when both are given).
        mscale: ``"yarn"``.
        mscale_all_dim: ``"yarn"``.
        truncate: ``"yarn"``: round the correction range outward to whole dimensions.

    Raises:
        LayerError: for an unknown kind, a missing setting the kind needs, or a factor <= 0.

    Example:
        >>> import namedaxes as na
        >>> na.nn.RopeScaling("linear", factor=2.0).kind
        'linear'
    """

    kind: str = "default"
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True

    def __post_init__(self) -> None:
        if self.kind not in ROPE_KINDS:
            raise LayerError(
                f"RopeScaling kind {self.kind!r} is not supported. Supported kinds: "
                f"{', '.join(repr(k) for k in ROPE_KINDS)}."
            )
        if not self.factor > 0:
            raise LayerError(f"RopeScaling {self.kind!r} needs factor > 0, got {self.factor}.")
        if (
            self.kind in ("dynamic", "llama3", "yarn")
            and self.original_max_position_embeddings is None
        ):
            raise LayerError(
                f"RopeScaling {self.kind!r} needs original_max_position_embeddings (the context "
                "length the model was trained with)."
            )
        if self.kind == "llama3" and not self.high_freq_factor > self.low_freq_factor:
            raise LayerError(
                f"RopeScaling 'llama3' needs high_freq_factor > low_freq_factor, got "
                f"{self.high_freq_factor} and {self.low_freq_factor}."
            )


def _original(s: RopeScaling) -> float:
    """``original_max_position_embeddings`` of a kind that needs it (checked by RopeScaling)."""
    if s.original_max_position_embeddings is None:
        raise LayerError(f"RopeScaling {s.kind!r} needs original_max_position_embeddings.")
    return float(s.original_max_position_embeddings)


def _yarn_attention_factor(s: RopeScaling) -> float:
    if s.attention_factor is not None:
        return float(s.attention_factor)

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if s.mscale and s.mscale_all_dim:
        return mscale(s.factor, s.mscale) / mscale(s.factor, s.mscale_all_dim)
    return mscale(s.factor)


def _yarn_ramp(s: RopeScaling, theta: float, dim: int) -> Any:
    """The share of the original (extrapolated) frequency in each of the ``dim / 2`` pairs."""
    original = _original(s)

    def correction_dim(rotations: float) -> float:
        ratio = original / (rotations * 2 * math.pi)
        return dim * math.log(ratio) / (2 * math.log(theta))

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a step instead of a division by zero
    ramp = jnp.clip((jnp.arange(dim // 2, dtype=jnp.float32) - low) / (high - low), 0.0, 1.0)
    return 1.0 - ramp


class RotaryEmbedding(eqx.Module):
    """Rotary position embeddings: rotate pairs of ``head_dim`` features by position-dependent angles.

    ``rope(x, positions)`` returns ``x * cos + rotate_half(x) * sin``, where the angles are
    ``positions * inv_freq`` and ``rotate_half`` pairs feature ``i`` with feature
    ``i + head_dim / 2`` (the layout of Hugging Face checkpoints). ``cos`` and ``sin`` have the
    positions' axes plus ``head_dim`` and broadcast into ``x`` by name, so ``x`` may have any other
    axes (``heads``, ``kv_heads``...) in any order; the result keeps ``x``'s axes and dtype. The
    tables are computed in float32. The layer has no parameters.

    Args:
        HeadDim: The rotated feature axis (its size must be even).
        theta: The base of the frequencies.
        scaling: A :class:`RopeScaling` (``None``: plain RoPE).

    Raises:
        LayerError: if ``HeadDim`` has an odd size, or ``theta`` is not a finite number > 0.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> rope = na.nn.RotaryEmbedding(na.Axis("head_dim", 4))
        >>> q = na.ones({"position": 3, "heads": 2, "head_dim": 4})
        >>> y = rope(q, na.arange(na.Axis("position", 3)))
        >>> y.axis_names, [round(float(v), 3) for v in y.array[1, 0]]
        (('position', 'heads', 'head_dim'), [-0.301, 0.99, 1.382, 1.01])
    """

    HeadDim: Axis = eqx.field(static=True)
    theta: float = eqx.field(static=True)
    scaling: RopeScaling = eqx.field(static=True)

    def __init__(
        self, HeadDim: Axis, *, theta: float = 10000.0, scaling: RopeScaling | None = None
    ):
        if not isinstance(HeadDim, Axis):
            raise NamedTypeError(f"RotaryEmbedding HeadDim must be an Axis, got {HeadDim!r}.")
        if HeadDim.size % 2:
            raise LayerError(
                f"RotaryEmbedding rotates pairs of features: {HeadDim.name}={HeadDim.size} must be "
                "even."
            )
        if scaling is not None and not isinstance(scaling, RopeScaling):
            raise NamedTypeError(
                f"RotaryEmbedding scaling must be a RopeScaling or None, got {scaling!r}."
            )
        if (
            isinstance(theta, bool)
            or not isinstance(theta, numbers.Real)
            or not (math.isfinite(theta) and theta > 1)
        ):
            raise LayerError(
                f"RotaryEmbedding theta must be a finite number > 1 (the base of the frequencies, "
                f"e.g. 10000.0), got {theta!r}."
            )
        self.HeadDim = HeadDim
        self.theta = float(theta)
        self.scaling = scaling if scaling is not None else RopeScaling()

    @property
    def attention_factor(self) -> float:
        """The scale of ``cos``/``sin`` (1 except for ``"yarn"``)."""
        return _yarn_attention_factor(self.scaling) if self.scaling.kind == "yarn" else 1.0

    def inverse_frequencies(self, max_position: Any = None) -> Any:
        """The ``head_dim / 2`` angular frequencies (float32).

        Args:
            max_position: The largest position id in use (``"dynamic"`` scaling grows its base from
                it; a traced value is fine). Ignored by the other kinds.
        """
        s, dim = self.scaling, self.HeadDim.size
        exponents = jnp.arange(0, dim, 2, dtype=jnp.float32) / dim
        if s.kind == "dynamic":
            original = _original(s)
            length = (
                original
                if max_position is None
                else jnp.maximum(jnp.asarray(max_position, jnp.float32) + 1.0, original)
            )
            base = self.theta * ((s.factor * length / original) - (s.factor - 1)) ** (
                dim / (dim - 2)
            )
            return 1.0 / (base**exponents)
        inv = 1.0 / (self.theta**exponents)
        if s.kind == "linear":
            return inv / s.factor
        if s.kind == "llama3":
            original = _original(s)
            low_wavelen, high_wavelen = original / s.low_freq_factor, original / s.high_freq_factor
            wavelen = 2 * math.pi / inv
            scaled = jnp.where(wavelen > low_wavelen, inv / s.factor, inv)
            smooth = (original / wavelen - s.low_freq_factor) / (
                s.high_freq_factor - s.low_freq_factor
            )
            blended = (1 - smooth) * scaled / s.factor + smooth * scaled
            medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
            return jnp.where(medium, blended, scaled)
        if s.kind == "yarn":
            extrapolated = _yarn_ramp(s, self.theta, dim)
            pos_freqs = self.theta**exponents
            return (1.0 / (s.factor * pos_freqs)) * (1 - extrapolated) + (
                1.0 / pos_freqs
            ) * extrapolated
        return inv

    def cos_sin(self, positions: NamedArray) -> tuple[NamedArray, NamedArray]:
        """``cos`` and ``sin`` tables: the positions' axes plus ``head_dim`` (float32).

        Raises:
            NamedTypeError: if ``positions`` is not an integer NamedArray or has ``head_dim``.
        """
        if not isinstance(positions, NamedArray) or not jnp.issubdtype(
            positions.dtype, jnp.integer
        ):
            raise NamedTypeError(
                "RotaryEmbedding needs positions as an integer NamedArray, e.g. "
                f"na.arange(Axis('position', n)), got {positions!r}."
            )
        if positions.has_axis(self.HeadDim.name):
            raise NamedTypeError(
                f"RotaryEmbedding: positions NamedArray({format_axes(positions.axes)}) has the "
                f"feature axis {self.HeadDim.name!r}; positions carry position axes only."
            )
        p = positions.array.astype(jnp.float32)
        max_position = jnp.max(p) if self.scaling.kind == "dynamic" else None
        inv = self.inverse_frequencies(max_position)
        angles = p[..., None] * inv.reshape((1,) * p.ndim + inv.shape)
        angles = jnp.concatenate([angles, angles], axis=-1)
        axes = positions.axes + (self.HeadDim,)
        factor = self.attention_factor
        return (
            NamedArray(jnp.cos(angles) * factor, axes),
            NamedArray(jnp.sin(angles) * factor, axes),
        )

    def __call__(self, x: NamedArray, positions: NamedArray) -> NamedArray:
        """``x`` rotated by the angles of ``positions`` (same axes, same order, same dtype).

        Args:
            x: A NamedArray with ``head_dim`` and the positions' axes (or some of them).
            positions: Integer position ids, e.g. ``(batch, position)`` or ``(position,)``.

        Raises:
            AxisNotFoundError / AxisSizeError: if ``x`` lacks ``head_dim`` or has it with
                another size.
        """
        x = expect_axes(x, (self.HeadDim,), "RotaryEmbedding")
        cos, sin = self.cos_sin(place(positions))  # split like the sequence: angles per shard
        cos, sin = cos.astype(x.dtype), sin.astype(x.dtype)
        i = x.axis_index(self.HeadDim.name)
        half = self.HeadDim.size // 2
        halves = _halves_splittable(x.array, i, half)
        first = jax.lax.slice_in_dim(halves, 0, half, axis=i)
        second = jax.lax.slice_in_dim(halves, half, 2 * half, axis=i)
        rotated = NamedArray(jnp.concatenate([-second, first], axis=i), x.axes)
        return x * cos + rotated * sin


def _halves_splittable(array: jax.Array, dim: int, half: int) -> jax.Array:
    """``array`` with ``dim`` (``head_dim``) replicated when it is split over Explicit mesh axes
    into more shards than ``half`` divides into: JAX refuses to slice such a dimension there,
    where XLA gathers it on Auto meshes (``head_dim=4`` over 4 devices). A split the halves
    divide into is kept."""
    info = explicit_sharding(array)
    if info is None or info[1][dim] is None:
        return array
    mesh, entries = info
    if half % math.prod(mesh.shape[a] for a in entry_axes(entries[dim])) == 0:
        return array
    return unshard_dims(array, [dim])
