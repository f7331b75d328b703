"""``Embedding``: vectors looked up by integer ids, and the same table as an output head."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from .._array import NamedArray
from .._axis import Axis
from .._errors import NamedTypeError, format_axes
from ..random import normal
from ._common import (
    as_axes,
    check_dtype_float,
    check_ids,
    compute,
    expect_axes,
    expect_free,
    output,
    param,
    place,
)
from ._fp8 import matmul

__all__ = ["Embedding"]


def _one_axis(spec: Any, what: str) -> Axis:
    axes = as_axes(spec, what)
    if len(axes) != 1:
        raise NamedTypeError(f"{what} must be one Axis, got {spec!r}.")
    return axes[0]


class Embedding(eqx.Module):
    """An embedding table ``weight(Vocab, Embed)``: ``ids -> vectors`` and ``vectors -> logits``.

    ``emb(ids)`` looks the ids up by name (a gather along ``Vocab``): the result has the ids' axes,
    then ``Embed``. An id must be in ``[0, Vocab.size)``: a wrong id never reads another token's
    vector. Concrete ids (outside ``jit``) outside that range raise ``AxisIndexError`` naming them;
    under ``jit`` the ids are not known when tracing, so the vector of such an id is all NaN (and so
    is everything computed from it), at the cost of one select on the result, without a host sync.
    Negative ids are out of range too (unlike ``take``, which counts them from the end as NumPy
    does): a token id of -1 or -100 is a padding or ignore marker, not the last token.

    ``emb.unembed(x)`` contracts ``Embed`` with the same table, giving logits over ``Vocab`` (a
    tied output head). The table is drawn from a normal distribution with standard
    deviation ``init_scale / sqrt(Embed.size)``. Under an ``axis_mapping`` with a mesh, the table
    and the outputs are placed by that mapping; under a precision policy the table is used in its
    compute dtype and results come out in its output dtype.

    Args:
        Vocab: The axis of the ids (one ``Axis``, e.g. ``Axis("vocab", 256)``).
        Embed: The vector axis.
        key: PRNG key for the table.
        init_scale: Multiplies the entries' standard deviation.
        dtype: The table's float dtype (the policy's ``param`` or JAX's default when ``None``).

    Raises:
        NamedTypeError: if ``Vocab`` or ``Embed`` is not one axis, or the dtype is not a float
            layers keep and compute in (float8 and, with ``jax_enable_x64`` off, float64 are
            refused, as :class:`Precision` refuses them).
        AxisIndexError: when called with concrete ids outside ``[0, Vocab.size)``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import namedaxes as na
        >>> emb = na.nn.Embedding(na.Axis("vocab", 10), na.Axis("embed", 4), key=jax.random.key(0))
        >>> ids = na.named(jnp.array([[1, 2, 3]]), ("batch", "position"))
        >>> h = emb(ids)
        >>> h
        NamedArray(float32, batch=1, position=3, embed=4)
        >>> emb.unembed(h)
        NamedArray(float32, batch=1, position=3, vocab=10)
        >>> wrong = na.named(jnp.array([3, 10]), "batch")  # 10 is past the vocabulary
        >>> emb(wrong)
        Traceback (most recent call last):
        ...
        namedaxes._errors.AxisIndexError: Embedding: token id(s) 10 outside the vocabulary: ...
        >>> jax.jit(lambda ids: emb(ids))(wrong).array[1]
        Array([nan, nan, nan, nan], dtype=float32)
    """

    weight: NamedArray
    Vocab: Axis = eqx.field(static=True)
    Embed: Axis = eqx.field(static=True)

    def __init__(
        self,
        Vocab: Any,
        Embed: Any,
        *,
        key: jax.Array,
        init_scale: float = 1.0,
        dtype: Any = None,
    ):
        self.Vocab = _one_axis(Vocab, "Embedding Vocab")
        self.Embed = _one_axis(Embed, "Embedding Embed")
        if self.Vocab.name == self.Embed.name:
            raise NamedTypeError(
                f"Embedding: Vocab and Embed are both named {self.Vocab.name!r}; give them "
                "different names."
            )
        dt = check_dtype_float(dtype, "Embedding")
        std = init_scale / self.Embed.size**0.5
        self.weight = normal(key, (self.Vocab, self.Embed), dt) * std

    def __call__(self, ids: NamedArray) -> NamedArray:
        """The vectors of ``ids``: the ids' axes, then ``Embed``.

        Raises:
            NamedTypeError: if ``ids`` is not an integer NamedArray.
            DuplicateAxisError: if ``ids`` has an axis named like ``Vocab`` or ``Embed``.
            AxisIndexError: if concrete ``ids`` hold an id outside ``[0, Vocab.size)`` (traced
                ones read NaN vectors instead).
        """
        if not isinstance(ids, NamedArray) or not jnp.issubdtype(ids.dtype, jnp.integer):
            if isinstance(ids, NamedArray):
                got = f"NamedArray({ids.dtype}, {format_axes(ids.axes)})"
            else:
                shape = getattr(ids, "shape", None)
                got = f"a plain array of shape {tuple(shape)}" if shape is not None else repr(ids)
            raise NamedTypeError(
                f"Embedding needs an integer NamedArray of ids, got {got}. Pass e.g. "
                "named(tokens, ('batch', 'position')) with an integer dtype."
            )
        names = (self.Vocab.name, self.Embed.name)
        expect_free(ids, names, "Embedding", "the lookup creates or consumes")
        check_ids(ids, self.Vocab, "Embedding")
        # The ids placed by the mapping (a replicated arange of positions, say, split like the
        # sequence): the vectors are then looked up where they are used, and their gradients
        # scattered there, instead of gathered whole. An id outside the table (negative ones
        # included: no wrapping) reads a NaN vector instead of the clamped last row.
        table = param(self.weight)
        return output(
            table.at[{self.Vocab.name: place(ids)}].get(
                mode="fill", fill_value=jnp.nan, wrap_negative_indices=False
            )
        )

    def unembed(self, x: NamedArray) -> NamedArray:
        """Logits over ``Vocab``: ``x`` with ``Embed`` contracted against the table (a tied head).

        A float8 policy's rules see the names ``Vocab`` and ``Embed``: by default the head stays
        in the compute dtype.

        Raises:
            AxisNotFoundError: if ``x`` lacks ``Embed``.
            DuplicateAxisError: if ``x`` already has ``Vocab``.
        """
        x = expect_axes(x, (self.Embed,), "Embedding.unembed")
        expect_free(x, (self.Vocab.name,), "Embedding.unembed", "is the output axis")
        return output(matmul(compute(x), self.weight, (self.Embed.name,)))
