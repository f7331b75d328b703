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
from .._errors import AxisNotFoundError, LayerError, NamedTypeError, format_axes
from .._ops._common import explicit_sharding, unshard_dims
from .._spec import entry_axes
from ._common import expect_axes, expect_floating, place, real_number

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
        LayerError: for an unknown kind, a missing setting the kind needs, a ``factor`` (and the
            ``"llama3"``/``"yarn"`` settings above) that is not a finite number > 0, an
            ``original_max_position_embeddings`` that is not an int >= 1, ``high_freq_factor <=
            low_freq_factor`` (``"llama3"``) or ``beta_fast < beta_slow`` (``"yarn"``).

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
        # Every number a formula divides by, takes the log of or scales with: checked here, not
        # met later as a ZeroDivisionError, a math domain error or silently wrong frequencies.
        _positive(self, "factor", self.factor)
        original = self.original_max_position_embeddings
        if original is None and self.kind in ("dynamic", "llama3", "yarn"):
            raise LayerError(
                f"RopeScaling {self.kind!r} needs original_max_position_embeddings (the context "
                "length the model was trained with)."
            )
        if original is not None and (
            isinstance(original, bool) or not isinstance(original, numbers.Integral) or original < 1
        ):
            raise LayerError(
                f"RopeScaling {self.kind!r} needs original_max_position_embeddings as an int >= 1 "
                f"(the context length the model was trained with, e.g. 4096), got {original!r}."
            )
        if self.kind == "llama3":
            _positive(self, "low_freq_factor", self.low_freq_factor)
            _positive(self, "high_freq_factor", self.high_freq_factor)
            if not self.high_freq_factor > self.low_freq_factor:
                raise LayerError(
                    f"RopeScaling 'llama3' needs high_freq_factor > low_freq_factor, got "
                    f"{self.high_freq_factor} and {self.low_freq_factor}."
                )
        if self.kind == "yarn":
            _positive(self, "beta_fast", self.beta_fast)
            _positive(self, "beta_slow", self.beta_slow)
            if self.beta_fast < self.beta_slow:  # the ramp would run backwards
                raise LayerError(
                    f"RopeScaling 'yarn' needs beta_fast >= beta_slow (the ramp runs from "
                    f"beta_fast rotations down to beta_slow), got {self.beta_fast} and "
                    f"{self.beta_slow}. Swap them."
                )
            if self.attention_factor is not None:
                _positive(self, "attention_factor", self.attention_factor)
            for name in ("mscale", "mscale_all_dim"):  # 0, like None, means not given
                if getattr(self, name) is not None:
                    _positive(self, name, getattr(self, name), zero=True)


def _positive(s: RopeScaling, name: str, value: Any, zero: bool = False) -> None:
    """Refuse a setting that is not a finite real number > 0 (>= 0 with ``zero``)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not (math.isfinite(value) and (value >= 0 if zero else value > 0))
    ):
        raise LayerError(
            f"RopeScaling {s.kind!r} needs {name} as a finite number {'>=' if zero else '>'} 0, "
            f"got {value!r}."
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
    axes (``heads``, ``kv_heads``...) in any order; when ``x`` has every axis of ``positions`` (the
    usual case) the result has ``x``'s axes in their order, and always ``x``'s dtype. A positions
    axis that ``x`` lacks (``batch`` with one ``x`` for every row) is broadcast too: the result
    gains it, laid out as named ops lay out a broadcast. ``x`` must share at least one axis with
    ``positions``, so a misnamed sequence axis is an error, not an outer product. The tables are
    computed in float32. The layer has no parameters.

    Args:
        HeadDim: The rotated feature axis (its size must be even).
        theta: The base of the frequencies.
        scaling: A :class:`RopeScaling` (``None``: plain RoPE).

    Raises:
        LayerError: if ``HeadDim``'s size is odd or 0 (or 2 with ``"dynamic"`` scaling), or
            ``theta`` is not a finite number > 1.

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
        if HeadDim.size % 2 or HeadDim.size == 0:
            raise LayerError(
                f"RotaryEmbedding rotates pairs of features: {HeadDim.name}={HeadDim.size} must be "
                "even and > 0."
            )
        if scaling is not None and not isinstance(scaling, RopeScaling):
            raise NamedTypeError(
                f"RotaryEmbedding scaling must be a RopeScaling or None, got {scaling!r}."
            )
        if scaling is not None and scaling.kind == "dynamic" and HeadDim.size <= 2:
            # Its base grows with the power d / (d - 2): no power for d = 2.
            raise LayerError(
                f"RotaryEmbedding: 'dynamic' scaling needs {HeadDim.name} > 2 (its base grows "
                f"with the power d / (d - 2)), got {HeadDim.name}={HeadDim.size}. Use 'linear' "
                "scaling for such heads."
            )
        value = real_number(theta)
        if value is None or not (math.isfinite(value) and value > 1):
            raise LayerError(
                f"RotaryEmbedding theta must be a finite number > 1 (the base of the frequencies, "
                f"e.g. 10000.0), got {theta!r}."
            )
        self.HeadDim = HeadDim
        self.theta = value
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
        """``x`` rotated by the angles of ``positions``, in ``x``'s dtype.

        The result has ``x``'s axes in their order when ``x`` has every axis of ``positions``;
        otherwise it gains the positions' axes ``x`` lacks (e.g. ``batch`` when ``x`` holds one
        sequence for every row of ``positions``), laid out as named ops lay out a broadcast.

        Args:
            x: A floating NamedArray with ``head_dim`` and at least one of the positions' axes.
            positions: Integer position ids, e.g. ``(batch, position)`` or ``(position,)`` (or
                no axes: one position for all of ``x``).

        Raises:
            AxisNotFoundError / AxisSizeError: if ``x`` lacks ``head_dim`` or has it with
                another size, or ``x`` has none of the positions' axes.
            NamedTypeError: if ``x`` is not floating, or ``positions`` is not an integer
                NamedArray without ``head_dim``.
        """
        x = expect_floating(expect_axes(x, (self.HeadDim,), "RotaryEmbedding"), "RotaryEmbedding")
        cos, sin = self.cos_sin(place(positions))  # split like the sequence: angles per shard
        names = positions.axis_names
        if names and not any(x.has_axis(n) for n in names):
            raise AxisNotFoundError(
                f"RotaryEmbedding: x NamedArray({format_axes(x.axes)}) has none of the axes of "
                f"positions NamedArray({format_axes(positions.axes)}), so every position would "
                f"rotate all of x (an outer product). Name x's sequence axis as the positions' "
                f"(e.g. x.rename({{'seq': {names[-1]!r}}}))."
            )
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
