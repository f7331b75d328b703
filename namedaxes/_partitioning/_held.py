"""Where ``fsdp`` holds the parameters, for the narrow copies that layers make of them.

A layer casts a parameter to the compute dtype (or quantizes it to float8) and then places the
copy by the compute mapping, which under ``fsdp`` gathers it. Left to itself, XLA's sharding
propagation carries that placement back into the cast, so on an Auto mesh the program gathers the
parameter in its own dtype and casts after: float32 bytes where bfloat16 (or float8) would do.
Pinning the copy to where the parameter is held first puts the gather after the cast. On an
Explicit mesh the types already say where the copy is, and the pin changes nothing.
"""

from __future__ import annotations

from typing import Any, TypeVar

import jax

from .._logical._rules import AxisRules
from .._mesh import context_mesh
from ._shard import _shard_with

T = TypeVar("T")

# The parameter mapping of the fsdp function being traced (part of JAX's trace key: a function
# jitted inside is traced again outside it).
_HELD = jax.make_user_context(None)


def parameters_held_by(rules: AxisRules) -> Any:
    """A context (entered by ``fsdp`` while it traces its function): parameters are held by
    ``rules``."""
    return _HELD(rules)


def held_placed(copy: T) -> T:
    """``copy`` (a narrower copy of parameters) placed where ``fsdp`` holds the parameters;
    unchanged outside an ``fsdp`` function or without a mesh.

    Example:
        >>> import jax.numpy as jnp
        >>> from namedaxes import named
        >>> w = named(jnp.ones(4, jnp.bfloat16), "embed")
        >>> held_placed(w) is w  # not inside fsdp: nothing to pin
        True
    """
    rules = _HELD.value
    mesh = context_mesh()
    if rules is None or mesh is None:
        return copy
    return _shard_with(copy, rules, mesh, "fsdp")
