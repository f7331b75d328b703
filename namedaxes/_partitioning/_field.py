"""``field(axis_names=...)``: name the axes of a plain-array field of an ``eqx.Module``.

``shard``, ``pspec_for`` and ``named_jit`` read this metadata from ``dataclasses.fields`` so a module
can hold plain ``jax.Array`` weights and still be sharded by name.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import equinox as eqx

from .._errors import DuplicateAxisError, NamedTypeError, format_names

__all__ = ["AXIS_NAMES_KEY", "annotated_fields", "field"]

#: The ``dataclasses.Field.metadata`` key holding a field's axis names.
AXIS_NAMES_KEY = "namedaxes_axis_names"


def field(*, axis_names: Sequence[str], **eqx_field_kwargs: Any) -> Any:
    """An ``eqx.field`` whose (plain array) value has named axes, for sharding by name.

    Args:
        axis_names: One logical axis name per dimension of the field's array.
        **eqx_field_kwargs: Passed to ``equinox.field`` (``converter=``, ``default=``, ...; any
            ``metadata=`` is kept and extended).

    Returns:
        A dataclass field for an ``eqx.Module`` class body.

    Raises:
        NamedTypeError: if ``axis_names`` is not a sequence of strings.
        DuplicateAxisError: if a name appears twice.

    Example:
        >>> import equinox as eqx, jax, jax.numpy as jnp
        >>> class Linear(eqx.Module):
        ...     weight: jax.Array = field(axis_names=("embed", "mlp"))
        >>> lin = Linear(jnp.zeros((4, 8)))
        >>> annotated_fields(Linear)
        {'weight': ('embed', 'mlp')}
    """
    if (
        isinstance(axis_names, str)
        or not isinstance(axis_names, Sequence)
        or not all(isinstance(n, str) and n for n in axis_names)
    ):
        raise NamedTypeError(
            f"field(axis_names=...) needs a tuple of axis names (non-empty strings), got "
            f"{axis_names!r}. Use e.g. field(axis_names=('embed', 'mlp'))."
        )
    names = tuple(axis_names)
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise DuplicateAxisError(
            f"field(axis_names={names!r}) names {format_names(repeated)} more than once; each "
            "dimension of the array needs its own axis name (sharding by name could not tell "
            f"them apart). Rename one, e.g. {repeated[0]!r} -> {repeated[0] + '_out'!r}."
        )
    metadata = dict(eqx_field_kwargs.pop("metadata", None) or {})
    metadata[AXIS_NAMES_KEY] = names
    return eqx.field(metadata=metadata, **eqx_field_kwargs)


@functools.cache
def annotated_fields(cls: type) -> dict[str, tuple[str, ...]]:
    """``{field_name: axis_names}`` for the fields of a dataclass declared with ``field``.

    Example:
        >>> import equinox as eqx
        >>> class NoNames(eqx.Module):
        ...     x: int
        >>> annotated_fields(NoNames)
        {}
    """
    if not dataclasses.is_dataclass(cls):
        return {}
    return {
        f.name: f.metadata[AXIS_NAMES_KEY]
        for f in dataclasses.fields(cls)
        if AXIS_NAMES_KEY in f.metadata
    }
