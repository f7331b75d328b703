"""Typed use of namedaxes: every line here is checked by mypy (tests/test_static_typing.py).

``assert_type`` tells mypy what each expression must be, so a method that static checkers cannot
see, or one that returns ``Any``, fails the check. ``NamedArray["batch embed"]`` annotations are
checked at run time by ``check_axes``; mypy reads them as ``NamedArray`` with the
``namedaxes.mypy_plugin`` plugin enabled in pyproject.toml. Run it: ``python examples/typed_usage.py``.
"""

from typing import assert_type

import jax.numpy as jnp

import namedaxes as na
from namedaxes import NamedArray


@na.check_axes
def project(x: NamedArray["batch embed"], w: NamedArray["embed mlp"]) -> NamedArray["batch mlp"]:
    """A dense layer: contract the ``embed`` axis."""
    return na.dot(x, w, axis="embed")


@na.check_axes
def center(x: NamedArray["batch ...", jnp.floating]) -> NamedArray["batch ..."]:
    """Subtract each row's mean over every axis but ``batch`` (works for any further axes)."""
    others = [a for a in x.axis_names if a != "batch"]
    return x - x.mean(others)


@na.check_axes
def scale(x: NamedArray["embed,"], factor: float) -> NamedArray["embed,"]:
    """One axis in a signature: written ``"embed,"`` so that mypy does not look ``embed`` up."""
    return x * factor


@na.named_jit
def shift(x: NamedArray, by: float) -> NamedArray:
    """A compiled function keeps its signature for type checkers (named_jit is typed with a
    ParamSpec), so a wrong argument is an error before anything runs."""
    return x + by


def main() -> None:
    x = na.named(jnp.arange(6, dtype=jnp.float32).reshape(2, 3), ("batch", "embed"))
    w = na.named(jnp.ones((3, 4), dtype=jnp.float32), ("embed", "mlp"))
    bias: NamedArray["mlp"] = na.named(jnp.full((4,), 0.5, dtype=jnp.float32), "mlp")

    # Arithmetic broadcasts by name; Python scalars work on either side.
    y = assert_type(2.0 * x + 1.0, NamedArray)
    scaled = assert_type(-((y / 4) ** 2), NamedArray)
    mask = assert_type(x > 2.0, NamedArray)

    # Reductions and shape methods take names.
    totals = assert_type(x.sum("embed"), NamedArray)
    peak = assert_type(x.max(), NamedArray)
    hidden = assert_type(x.rename({"embed": "hidden"}), NamedArray)
    flipped = assert_type(x.rearrange(("embed", "batch")), NamedArray)

    # Indexing by name: an integer drops the axis, a slice keeps it, .at[...] updates.
    first = assert_type(x["batch", 0], NamedArray)
    window = assert_type(x[{"embed": slice(0, 2)}], NamedArray)
    zeroed = assert_type(x.at["embed", 0].set(0.0), NamedArray)

    # Contractions by name, checked against the annotations when called.
    h: NamedArray["batch mlp"] = project(x, w) + bias
    out = assert_type(center(h), NamedArray)
    doubled = assert_type(scale(first, 2.0), NamedArray)
    logits = assert_type(na.einsum("batch embed, embed mlp -> batch mlp", x, w), NamedArray)
    shifted = assert_type(shift(x, 1.0), NamedArray)

    ok = bool(mask.any())
    count: int = x.axis_size("embed")
    print("y:", y, "scaled:", scaled)
    print("totals:", totals.array, "peak:", peak.item(), "any > 2:", ok, "embed size:", count)
    print("renamed:", hidden.axis_names, "rearranged:", flipped.axis_names)
    print("first row:", first.array, "window:", window.shape, "zeroed:", zeroed.array[:, 0])
    print("h:", h, "centered row sums:", out.sum("mlp").array)
    print("doubled:", doubled.array, "logits:", logits.shape, "shifted:", shifted.shape)


if __name__ == "__main__":
    main()
