"""Mixed precision: ``Precision`` (parameter, compute and output dtypes) and the ``precision`` context.

A policy in force (``with precision("params=float32,compute=bfloat16"):``) is read by every
``namedaxes.nn`` layer while it runs (or is traced): parameters are created in ``param``, cast to
``compute`` where a layer uses them (so their gradients come back in ``param``), layer inputs are
cast to ``compute`` and results to ``output``. Numerically sensitive steps run in float32 whatever
the policy: norms, the attention softmax and the loss.

``matmul="float8"`` also runs the matmuls of the layers its rules pick (by the names of their axes,
:data:`MATMUL_RULES` unless the policy adds its own) in float8 (``nn/_fp8.py``); the same rules
pick the layers ``models.quantize`` stores in int8 or float8.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp

from .._array import NamedArray
from .._errors import AxisNotFoundError, NamedTypeError, did_you_mean, format_names

__all__ = ["MATMUL_RULES", "Precision", "current_precision", "picks", "precision"]

_ALIASES = {
    "f32": "float32",
    "full": "float32",
    "bf16": "bfloat16",
    "f16": "float16",
    "half": "float16",
    "f64": "float64",
}
_FIELDS = {
    "param": "param",
    "params": "param",
    "p": "param",
    "compute": "compute",
    "c": "compute",
    "output": "output",
    "o": "output",
    "matmul": "matmul",
    "scaling": "scaling",
}
MATMUL_FORMATS = {"float8": "float8", "fp8": "float8"}
SCALINGS = ("tensor", "row")
# What parameters, computation and outputs may be in (float64 only where JAX has it: x64 on).
# Narrower formats are not a dtype to compute in: float8 is matmul="float8", scaled.
POLICY_DTYPES = ("float32", "bfloat16", "float16", "float64")

MATMUL_RULES: tuple[tuple[str, bool], ...] = (
    ("vocab", False),
    ("experts", False),
    ("shared_gate", False),
    ("mlp", True),
    ("shared_mlp", True),
    ("expert_mlp", True),
    ("heads", True),
    ("kv_heads", True),
    ("embed", True),
)
"""Which layers go to a low-precision format by default (float8 matmuls in training, quantized
weights for inference), as ``(axis name, yes/no)`` rules over the names of a layer's matmul
(a ``Linear``'s input and output axes; the tied head's ``vocab`` and ``embed``). The first rule
naming one of them decides; a layer no rule names stays in the compute dtype. The output head
(``vocab``), the mixture-of-experts router (``experts``) and the shared expert's one-wide gate
stay; the attention projections (``heads``, ``kv_heads``), MLPs (``mlp``, ``shared_mlp``,
``expert_mlp``: the routed experts' products are named like each expert's ``Linear``s) and any
other ``embed`` projection go. Norms, embedding lookups and attention
scores are not layers' matmuls: they never run in float8. ``models.quantize``, which stores weights,
takes an ``Embedding``'s table as a layer named ``vocab`` and ``embed``, so ``{"vocab": True}``
stores every embedding table narrow too (the lookup reads it dequantized)."""


def as_rules(rules: Any, what: str) -> tuple[tuple[str, bool], ...]:
    """``rules`` (a ``{name: bool}`` dict or ``(name, bool)`` pairs; ``"*"`` names every layer)
    as a tuple of pairs.

    Raises:
        NamedTypeError: ``"{what}: ... is not an (axis name, True/False) rule ..."``.
    """
    if rules is None:
        return ()
    items = list(rules.items()) if isinstance(rules, dict) else rules
    if isinstance(items, str) or not isinstance(items, (list, tuple)):
        items = [items]
    out = []
    for rule in items:
        ok = isinstance(rule, (tuple, list)) and len(rule) == 2
        if not (ok and isinstance(rule[0], str) and isinstance(rule[1], bool)):
            raise NamedTypeError(
                f"{what}: {rule!r} is not an (axis name, True/False) rule. Write e.g. "
                "[('vocab', True), ('mlp', False)] or {'vocab': True}; '*' names every layer."
            )
        out.append((rule[0], rule[1]))
    return tuple(out)


def picks(rules: tuple[tuple[str, bool], ...], names: Any) -> bool:
    """Whether the layer whose matmul has the axes ``names`` goes to the low-precision format:
    ``rules`` first, then :data:`MATMUL_RULES`; the first rule naming one of ``names`` (or
    ``"*"``) decides, and no rule means no.

    Example:
        >>> picks((), ("embed", "vocab")), picks((("vocab", True),), ("embed", "vocab"))
        (False, True)
    """
    names = set(names)
    for name, yes in rules + MATMUL_RULES:
        if name == "*" or name in names:
            return yes
    return False


def float_dtype(value: Any, prefix: str, needs: str) -> jnp.dtype | None:
    """``value`` as a floating dtype (``None`` passes through).

    Raises:
        NamedTypeError: ``"{prefix}{value!r} is not a dtype ..."`` or ``"{needs} a floating dtype,
            got ..."``.
    """
    if value is None:
        return None
    try:
        dt = jnp.dtype(value)
    except TypeError:
        raise NamedTypeError(
            f"{prefix}{value!r} is not a dtype. Pass e.g. jnp.float32 or 'bfloat16'."
        ) from None
    if not jnp.issubdtype(dt, jnp.floating):
        raise NamedTypeError(f"{needs} a floating dtype, got {dt}. Pass e.g. jnp.float32.")
    return dt


@dataclasses.dataclass(frozen=True)
class Precision:
    """The dtypes of a mixed-precision run: parameters, computation and layer outputs.

    ``None`` leaves that dtype alone: ``Precision()`` changes nothing. Parse a string with
    ``Precision.parse("params=float32,compute=bfloat16,output=float32")`` (also ``p=f32,c=bf16``,
    as in ``jmp``). Set it for a block of code with :func:`precision`.

    ``matmul="float8"`` runs the matmuls of the layers the rules pick in float8, forward and
    backward: inputs and weights in e4m3, the incoming gradient in e5m2, each scaled from its
    absolute maximum (``scaling="tensor"``: one scale per tensor; ``"row"``: one per row of the
    matmul, per token and per output channel, more accurate), the product accumulated in float32,
    scaled back and returned in the compute dtype. Parameters, their gradients and the optimizer
    are untouched. The rules: ``matmul_rules`` (checked first), then :data:`MATMUL_RULES`.

    Args:
        param: Parameters are created in this dtype (by layers built with ``dtype=None``).
        compute: Layers cast their parameters and inputs to this dtype before computing.
        output: Layers cast their results to this dtype (``None``: results stay in ``compute``).
            Each of the three is ``float32``, ``bfloat16``, ``float16``, ``float64`` (with
            ``jax_enable_x64`` on) or ``None``.
        matmul: ``None``, or ``"float8"`` (also ``"fp8"``) for float8 matmuls.
        scaling: ``"tensor"`` (default) or ``"row"``: how float8 matmuls scale their operands;
            only with ``matmul``.
        matmul_rules: Which layers' matmuls go to ``matmul`` (only with it), before the
            defaults: ``(axis name, True/False)`` pairs or a ``{name: bool}`` dict, ``"*"``
            naming every layer (e.g. ``{"vocab": True}`` adds the output head; ``[("mlp",
            True), ("*", False)]`` keeps only the MLPs). A rule naming no axis of the layers run
            under the policy is refused when its :func:`precision` block ends.

    Raises:
        NamedTypeError: if a dtype is none of the above (float8 and float4 included: pass
            ``matmul="float8"``), or float64 with ``jax_enable_x64`` off; if ``matmul`` or
            ``scaling`` is none of the above, ``scaling`` or ``matmul_rules`` are given without
            ``matmul``, or a rule is not ``(name, bool)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import namedaxes as na
        >>> p = na.nn.Precision(param=jnp.float32, compute=jnp.bfloat16)
        >>> p
        Precision('params=float32,compute=bfloat16')
        >>> p.cast_to_compute(na.ones({"embed": 2})).dtype
        dtype(bfloat16)
    """

    param: Any = None
    compute: Any = None
    output: Any = None
    matmul: str | None = None
    scaling: str | None = None  # "tensor" once there is a matmul format
    matmul_rules: Any = ()

    def __post_init__(self) -> None:
        for f in ("param", "compute", "output"):
            value = getattr(self, f)
            if isinstance(value, str):
                value = _ALIASES.get(value.strip().lower(), value.strip())
            dtype = float_dtype(value, f"Precision {f}=", f"Precision {f} must be")
            if dtype is not None:
                check_policy_dtype(f"Precision {f}", dtype)
            object.__setattr__(self, f, dtype)
        matmul = self.matmul
        if matmul is not None:
            matmul = MATMUL_FORMATS.get(matmul.strip().lower()) if isinstance(matmul, str) else None
            if matmul is None:
                raise NamedTypeError(
                    f"Precision matmul={self.matmul!r} is not a matmul format. Pass 'float8' (or "
                    "None for matmuls in the compute dtype)."
                )
        scaling = self.scaling.strip().lower() if isinstance(self.scaling, str) else None
        if self.scaling is not None and scaling not in SCALINGS:
            raise NamedTypeError(
                f"Precision scaling={self.scaling!r} is not a scaling. Pass 'tensor' (one scale "
                "per tensor) or 'row' (one per token and per output channel)."
            )
        rules = as_rules(self.matmul_rules, "Precision matmul_rules")
        if matmul is None and (scaling is not None or rules):
            given = f"scaling={self.scaling!r}" if scaling is not None else "matmul_rules"
            raise NamedTypeError(
                f"Precision {given} sets how low-precision matmuls run, but matmul is None: it "
                f"would do nothing. Pass matmul='float8' too, or drop {given.partition('=')[0]}."
            )
        object.__setattr__(self, "matmul", matmul)
        object.__setattr__(self, "scaling", scaling or ("tensor" if matmul else None))
        object.__setattr__(self, "matmul_rules", rules)

    @classmethod
    def parse(cls, spec: str) -> Precision:
        """A policy from ``"params=float32,compute=bfloat16,output=float32"``.

        Keys: ``params``/``param``/``p``, ``compute``/``c``, ``output``/``o``; values: dtype names
        and the short forms ``f32``, ``bf16``, ``f16``. Missing keys are ``None``. ``matmul=float8``
        and ``scaling=tensor|row`` set float8 matmuls (with the default rules).

        Raises:
            NamedTypeError: on an unknown key, a repeated key or a value that is not a float dtype.

        Example:
            >>> Precision.parse("p=f32,c=bf16,o=f32").output
            dtype('float32')
            >>> Precision.parse("params=float32,compute=bfloat16,matmul=float8,scaling=row")
            Precision('params=float32,compute=bfloat16,matmul=float8,scaling=row')
        """
        if not isinstance(spec, str):
            raise NamedTypeError(f"Precision.parse needs a string, got {spec!r}.")
        given: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            key, sep, value = part.partition("=")
            field = _FIELDS.get(key.strip().lower())
            if not sep or field is None or field in given:
                why = "repeated" if field in given else "not key=dtype with a known key"
                raise NamedTypeError(
                    f"Precision.parse({spec!r}): {part!r} is {why}. Write e.g. "
                    "'params=float32,compute=bfloat16,output=float32' (keys params, compute, "
                    "output or p, c, o; matmul, scaling)."
                )
            given[field] = value.strip()
        return cls(**given)

    def __repr__(self) -> str:
        parts = [
            f"{name}={dt.name}"
            for name, dt in (
                ("params", self.param),
                ("compute", self.compute),
                ("output", self.output),
            )
            if dt is not None
        ]
        if self.matmul is not None:
            parts.append(f"matmul={self.matmul}")
        if self.scaling not in (None, "tensor"):
            parts.append(f"scaling={self.scaling}")
        rules = f", matmul_rules={self.matmul_rules!r}" if self.matmul_rules else ""
        return f"Precision({','.join(parts)!r}{rules})"

    def float8(self, names: Any) -> bool:
        """Whether a layer whose matmul has the axes ``names`` runs it in float8 here.

        Layers ask the policy in force (a :func:`precision` block); their names are what the
        block checks ``matmul_rules`` against when it ends.

        Example:
            >>> p = Precision(compute="bfloat16", matmul="float8")
            >>> p.float8(("embed", "mlp")), p.float8(("embed", "vocab"))
            (True, False)
        """
        if self.matmul_rules:
            _EVER.setdefault(self, set()).update(names)
            for policy, seen in _SEEN.get():  # every open block of this policy: nested ones too
                if policy == self:
                    seen.update(names)
        return self.matmul == "float8" and picks(self.matmul_rules, names)

    def cast_to_param(self, tree: Any) -> Any:
        """Floating arrays (and NamedArrays) of ``tree`` cast to ``param``."""
        return _cast(tree, self.param)

    def cast_to_compute(self, tree: Any) -> Any:
        """Floating arrays (and NamedArrays) of ``tree`` cast to ``compute``."""
        return _cast(tree, self.compute)

    def cast_to_output(self, tree: Any) -> Any:
        """Floating arrays (and NamedArrays) of ``tree`` cast to ``output`` (else ``compute``)."""
        return _cast(tree, self.output if self.output is not None else self.compute)


def check_policy_dtype(what: str, dt: jnp.dtype) -> None:
    """Refuse a floating dtype that parameters, computation or outputs cannot be in: a narrow
    format (float8, float4: those are ``matmul="float8"``), or float64 while JAX's 64-bit mode is
    off (JAX would silently give float32). ``what`` names the setting, e.g. ``"Precision param"``
    or ``"Linear dtype"``.

    Raises:
        NamedTypeError: ``"{what}={dtype} is not a dtype layers keep or compute in ..."`` or
            ``"{what}=float64 needs 64-bit floats ..."``.
    """
    if dt.name not in POLICY_DTYPES:
        raise NamedTypeError(
            f"{what}={dt.name} is not a dtype layers keep or compute in: use float32, "
            "bfloat16 or float16 (float64 with jax_enable_x64). For float8 matmuls pass "
            "matmul='float8' in the precision policy (e.g. "
            "'params=float32,compute=bfloat16,matmul=float8')."
        )
    if jax.dtypes.canonicalize_dtype(dt) != dt:  # JAX would silently give float32
        raise NamedTypeError(
            f"{what}={dt.name} needs 64-bit floats, which are off here. Turn them on "
            "(jax.config.update('jax_enable_x64', True)) or use float32."
        )


def _cast_leaf(x: Any, dtype: Any) -> Any:
    dt = getattr(x, "dtype", None)
    if dt is None or dt == dtype or not jnp.issubdtype(dt, jnp.floating):
        return x
    return x.astype(dtype)


def _cast(tree: Any, dtype: Any) -> Any:
    if dtype is None:
        return tree
    return jax.tree.map(
        lambda x: _cast_leaf(x, dtype), tree, is_leaf=lambda x: isinstance(x, NamedArray)
    )


_NONE = Precision()
_POLICY: contextvars.ContextVar[Precision] = contextvars.ContextVar(
    "namedaxes_precision", default=_NONE
)
# The policy in force, as part of the key jax.jit caches traces by: layers read it while traced,
# so a function traced under one policy is traced again under another (per thread, following the
# `with` blocks run in it, like JAX's own contexts).
_TRACE_KEY = jax.make_user_context(None)
# The open `precision` blocks (outermost first), each with the axis names of the layers that
# asked its policy (Precision.float8) while it was open: whether a block's rules are checked.
_SEEN: contextvars.ContextVar[tuple[tuple[Precision, set[str]], ...]] = contextvars.ContextVar(
    "namedaxes_precision_seen", default=()
)
# Per policy with rules, the axis names of every layer that ever asked it: what a block's rules are
# checked against. A jitted function whose trace a later block reuses asks nothing there; its
# layers asked when it was traced, under an equal policy (the policy is part of the trace key).
_EVER: dict[Precision, set[str]] = {}


def as_precision(policy: Precision | str | None) -> Precision:
    if policy is None:
        return _NONE
    if isinstance(policy, Precision):
        return policy
    if isinstance(policy, str):
        return Precision.parse(policy)
    raise NamedTypeError(
        f"precision() needs a Precision or a string such as 'params=float32,compute=bfloat16', "
        f"got {policy!r}."
    )


def current_precision() -> Precision:
    """The policy in force (``Precision()``, which changes nothing, when none is).

    Example:
        >>> import namedaxes as na
        >>> na.nn.current_precision()
        Precision('')
        >>> with na.nn.precision("compute=bfloat16"):
        ...     na.nn.current_precision().compute
        dtype(bfloat16)
    """
    return _POLICY.get()


@contextlib.contextmanager
def precision(policy: Precision | str | None) -> Iterator[Precision]:
    """Put a mixed-precision policy in force for a block (or, as a decorator, for a function).

    Layers read the policy when they run, so under ``jax.jit`` (and ``named_jit``/``fsdp``) what
    counts is the policy in force while the function is *traced*: set it inside the jitted
    function (decorate the loss), or around its calls. The policy is part of the key JAX caches
    traces by, so a jitted function called under another policy is traced again (and the trace
    of each policy reused). ``None`` turns a policy off.

    When a block in which layers ran (or were traced) ends, each of the policy's
    ``matmul_rules`` (but ``"*"``) must name an axis of some layer that has asked the policy, in
    this block or an earlier one (a jitted function whose trace is reused asks nothing: its layers
    asked when it was traced), as ``models.quantize`` checks its rules against the model's
    layers: a rule that names none (a typo) would pick nothing. A block inside another of the
    same policy (a decorated function called in a ``with`` block) leaves the check to the outer
    one, which counts its layers too. A block in which no layer asked checks nothing.

    Args:
        policy: A :class:`Precision`, a string for :meth:`Precision.parse`, or ``None``.

    Raises:
        NamedTypeError: if ``policy`` is none of these.
        AxisNotFoundError: when the block ends, for a rule of ``matmul_rules`` that names no axis
            of the layers that asked the policy, with the closest name.

    Example:
        >>> import jax
        >>> import namedaxes as na
        >>> lin = na.nn.Linear({"embed": 4}, {"mlp": 8}, key=jax.random.key(0))
        >>> with na.nn.precision("params=float32,compute=bfloat16,output=float32"):
        ...     y = lin(na.ones({"batch": 2, "embed": 4}))
        >>> y.dtype, lin.weight.dtype
        (dtype('float32'), dtype('float32'))
    """
    policy = as_precision(policy)
    seen: set[str] = set()
    outer = _SEEN.get()
    nested = any(p == policy for p, _ in outer)  # the outer block of this policy checks
    token, seen_token = _POLICY.set(policy), _SEEN.set((*outer, (policy, seen)))
    try:
        with _TRACE_KEY(None if policy == _NONE else policy):
            yield policy
    finally:
        _SEEN.reset(seen_token)
        _POLICY.reset(token)
    if seen and not nested:  # only when the block ended without an error
        _check_rules_matched(policy)


def _check_rules_matched(policy: Precision) -> None:
    """Refuse a rule that named no axis of the layers that have asked ``policy``: it picked
    nothing, silently."""
    seen = sorted(_EVER.get(policy, ()))
    for name, yes in policy.matmul_rules:
        if name != "*" and name not in seen:
            raise AxisNotFoundError(
                f"Precision matmul_rules: the rule {name!r} -> {yes}"
                f"{did_you_mean(name, seen)} names no axis of the layers that ran under the "
                f"policy, whose matmuls' axes are {format_names(seen)}, so it picked nothing. "
                "Name an axis the layers have (or drop the rule)."
            )


# -- what layers call -----------------------------------------------------------------------------


def param_dtype(dtype: Any) -> Any:
    """A layer's parameter dtype: the one given, else the policy's ``param``, else ``None``."""
    return dtype if dtype is not None else _POLICY.get().param


def upcast(x: Any) -> Any:
    """``x`` in float32 when it is a narrower float (norms and softmax compute in float32)."""
    dt = getattr(x, "dtype", None)
    if dt is not None and jnp.issubdtype(dt, jnp.floating) and jnp.finfo(dt).bits < 32:
        return x.astype(jnp.float32)
    return x
