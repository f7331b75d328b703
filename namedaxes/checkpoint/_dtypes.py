"""Dtype rules of checkpoints and state dicts: what can be stored, and how saved values convert.

One home for the rules ``save``, ``restore`` and ``from_state_dict`` share:

- ``check_storable``: a dtype orbax's storage (TensorStore) has no type for is refused before
  anything is written.
- ``python_array``: a Python number (or a list of them) becomes an array of like's dtype. Like a
  weakly typed JAX scalar it fits any dtype of its kind (an ``int`` any integer dtype); another
  kind needs ``cast=True``. A value the dtype cannot hold (out of range, a ``str`` that is not a
  number, a ``complex`` into a real dtype) is refused, cast or not.
- ``python_scalar``: a saved Python scalar into a Python scalar of like's type (``cast=True``
  converts as Python's ``int(...)``, ``float(...)`` do).
"""

from __future__ import annotations

import warnings
from typing import Any

import jax.numpy as jnp
import numpy as np
import tensorstore as ts

from .._errors import CheckpointDtypeError, CheckpointStructureError

__all__ = ["check_storable", "python_array", "python_scalar"]

# Which dtype kinds a Python value of each type fits without a cast (what jax.eval_shape makes of a
# Python number: a 0-d array of that kind).
SCALAR_KINDS = {"bool": "b", "int": "iu", "float": "f", "complex": "c"}
_PY_KIND = {"b": "bool", "i": "int", "u": "int", "f": "float", "c": "complex"}


def check_storable(dtype: Any, leaf: str) -> None:
    """Refuse a dtype that checkpoints cannot store, naming ``leaf`` (its dotted key).

    Orbax writes each array through TensorStore under the dtype's name; asking TensorStore for
    that name is the test (``uint4``, ``uint2`` and ``float8_e4m3`` have none in TensorStore
    0.1.86, so orbax failed mid-write with a bare ``ValueError``).

    Raises:
        CheckpointDtypeError: for a dtype TensorStore has no type for.
    """
    name = jnp.dtype(dtype).name
    try:
        ts.dtype(name)
    except ValueError:
        raise CheckpointDtypeError(
            f"Leaf {leaf!r} is {name}, which checkpoints cannot store (TensorStore, orbax's "
            "storage, has no such type). Cast it to a dtype it stores (int4, int8, float8_e4m3fn, "
            "bfloat16, ...) before saving."
        ) from None


def _convert(value: Any, dtype: np.dtype, subject: str) -> np.ndarray:
    """``np.asarray(value, dtype)``, refusing (not wrapping, clamping or going to inf) what
    ``dtype`` cannot hold."""
    try:
        with np.errstate(all="raise"), warnings.catch_warnings():
            warnings.simplefilter("error")
            return np.asarray(value, dtype=dtype)
    except (TypeError, ValueError, OverflowError, FloatingPointError, Warning) as e:
        raise CheckpointDtypeError(
            f"{subject}, which {dtype.name} cannot hold ({e}). Build like with a dtype that holds "
            "it."
        ) from None


def python_array(value: Any, dtype: Any, cast: bool, subject: str) -> np.ndarray:
    """``value`` (a Python scalar or a list of numbers) as a NumPy array of ``dtype``.

    Args:
        value: A ``bool``/``int``/``float``/``complex``/``str``, or a list or tuple of numbers.
        dtype: like's dtype.
        cast: Whether a value of another kind (an ``int`` into ``float32``) may be converted.
        subject: What the value is, to start error messages with (``"Leaf 'step' is a Python int
            (7) in the checkpoint"``).

    Raises:
        CheckpointDtypeError: for a value of another kind without ``cast``, or one ``dtype``
            cannot hold.
        CheckpointStructureError: for a list that holds something other than numbers.

    Example:
        >>> python_array(3, "int8", False, "Leaf 'n' is 3").dtype
        dtype('int8')
    """
    wanted = np.dtype(dtype)
    if isinstance(value, (list, tuple)):
        kind = _PY_KIND.get(np.asarray(value).dtype.kind)
        if kind is None:
            raise CheckpointStructureError(
                f"{subject}, which is not a list of numbers; like has an array of {wanted.name} "
                "there. Give an array (NumPy or JAX), a Python number or a list of numbers."
            )
    else:
        kind = type(value).__name__
    if not cast and wanted.kind not in SCALAR_KINDS.get(kind, ""):
        raise CheckpointDtypeError(
            f"{subject} but an array of {wanted.name} in like. Build like with a matching "
            "scalar, or pass cast=True."
        )
    return _convert(value, wanted, subject)


def python_scalar(value: Any, like: Any, cast: bool, subject: str) -> Any:
    """``value`` (a Python scalar) as a Python scalar of ``like``'s type.

    Raises:
        CheckpointDtypeError: for another type without ``cast``, or a value ``like``'s type
            cannot take (``int("run7")``, ``float(1 + 2j)``).
    """
    if type(value) is type(like):
        return value
    wanted = type(like).__name__
    if not cast:
        raise CheckpointDtypeError(
            f"{subject} but a {wanted} in like. Pass cast=True to convert it."
        )
    try:
        return type(like)(value)
    except (TypeError, ValueError, OverflowError) as e:
        raise CheckpointDtypeError(
            f"{subject}, which {wanted}() cannot convert ({e}). Build like with a "
            f"{type(value).__name__} there."
        ) from None
