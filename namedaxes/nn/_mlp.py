"""``MLP``: embed -> hidden -> embed, optionally gated; activations by their usual names."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax

from .._array import NamedArray
from .._axis import Axis, AxisSpec
from .._errors import LayerError, NamedTypeError
from .._ops.elementwise import gelu, relu, sigmoid, silu
from ._common import as_axes
from ._linear import Linear

__all__ = ["MLP", "activation"]


def _quick_gelu(x: NamedArray) -> NamedArray:
    return x * sigmoid(x * 1.702)


_gelu_tanh = functools.partial(gelu, approximate=True)
_gelu_exact = functools.partial(gelu, approximate=False)

# The names Hugging Face configs use (``hidden_act``, ``activation_function``).
ACTIVATIONS: dict[str, Callable[[NamedArray], NamedArray]] = {
    "gelu": _gelu_exact,
    "gelu_new": _gelu_tanh,
    "gelu_pytorch_tanh": _gelu_tanh,
    "gelu_fast": _gelu_tanh,
    "quick_gelu": _quick_gelu,
    "relu": relu,
    "silu": silu,
    "swish": silu,
}


def activation(name: str) -> Callable[[NamedArray], NamedArray]:
    """The activation function called ``name`` in Hugging Face configs (``hidden_act``).

    ``"gelu"`` is the exact (erf) GELU; ``"gelu_new"``, ``"gelu_pytorch_tanh"`` and ``"gelu_fast"``
    are its tanh approximation; ``"silu"``/``"swish"`` is ``x * sigmoid(x)``; ``"quick_gelu"`` is
    ``x * sigmoid(1.702 x)``; ``"relu"``.

    Raises:
        LayerError: for a name not in the table (the message lists them).

    Example:
        >>> import namedaxes as na
        >>> act = na.nn.activation("gelu_pytorch_tanh")
        >>> round(float(act(na.full({"embed": 1}, 1.0)).array[0]), 4)
        0.8412
    """
    if not isinstance(name, str):
        raise NamedTypeError(f"activation() takes a name, got {name!r}.")
    return _by_name(name)


def _by_name(name: str) -> Callable[[NamedArray], NamedArray]:
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise LayerError(
            f"Unknown activation {name!r}. Known: {', '.join(sorted(ACTIVATIONS))}. Pass a "
            "function of a NamedArray instead."
        ) from None


class MLP(eqx.Module):
    """Two dense layers around an activation: ``down(act(up(x)))``, or gated.

    ``up`` (and ``gate``) map ``Embed`` to ``Hidden``, ``down`` maps ``Hidden`` back to ``Embed``;
    see :class:`Linear` for initialisation and placement. With ``gated=True`` it is a GLU,
    ``down(act(gate(x)) * up(x))``: SwiGLU with ``activation="silu"``, GeGLU with
    ``"gelu_pytorch_tanh"``. ``activation`` is a function of a NamedArray or a name known to
    :func:`activation`.

    Args:
        Embed: The input and output axes.
        Hidden: The hidden axes (e.g. ``{"mlp": 4 * embed}``).
        key: PRNG key.
        activation: A function of a NamedArray or an activation name (default ``na.gelu``).
        gated: Add a gate projection.
        use_bias: Biases in the projections.
        init_scale: Passed to every ``Linear``.
        dtype: The parameters' float dtype.

    Raises:
        NamedTypeError: if ``activation`` is neither a function nor a name.
        LayerError: for an activation name :func:`activation` does not know.

    Example:
        >>> import jax
        >>> import namedaxes as na
        >>> mlp = na.nn.MLP({"embed": 4}, {"mlp": 16}, key=jax.random.key(0))
        >>> mlp(na.ones({"batch": 2, "embed": 4}))
        NamedArray(float32, batch=2, embed=4)
    """

    up: Linear
    down: Linear
    gate: Linear | None
    activation: Callable[[NamedArray], NamedArray] = eqx.field(static=True)
    Embed: tuple[Axis, ...] = eqx.field(static=True)
    Hidden: tuple[Axis, ...] = eqx.field(static=True)

    def __init__(
        self,
        Embed: AxisSpec,
        Hidden: AxisSpec,
        *,
        key: jax.Array,
        activation: Callable[[NamedArray], NamedArray] | str = gelu,
        gated: bool = False,
        use_bias: bool = True,
        init_scale: float = 1.0,
        dtype: Any = None,
    ):
        if not (isinstance(activation, str) or callable(activation)):
            raise NamedTypeError(
                f"MLP activation must be a function of a NamedArray or an activation name, got "
                f"{activation!r}. Pass e.g. na.silu or 'gelu_pytorch_tanh'."
            )
        self.Embed, self.Hidden = as_axes(Embed, "MLP Embed"), as_axes(Hidden, "MLP Hidden")
        k_up, k_down, k_gate = jax.random.split(key, 3)
        kw = dict(use_bias=use_bias, init_scale=init_scale, dtype=dtype)
        self.up = Linear(self.Embed, self.Hidden, key=k_up, **kw)
        self.down = Linear(self.Hidden, self.Embed, key=k_down, **kw)
        self.gate = Linear(self.Embed, self.Hidden, key=k_gate, **kw) if gated else None
        self.activation = _by_name(activation) if isinstance(activation, str) else activation

    def __call__(self, x: NamedArray) -> NamedArray:
        """``x`` through the MLP; the output has ``x``'s axes (``Embed`` last)."""
        if self.gate is None:
            h = self.activation(self.up(x))
        else:
            h = self.activation(self.gate(x)) * self.up(x)
        return self.down(h)
