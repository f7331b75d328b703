"""NamedArray["..."] annotations: isinstance semantics, dtype form, check_axes, errors."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest

import namedaxes as na
from namedaxes import NamedArray

if TYPE_CHECKING:  # for type checkers only: the name never exists at run time
    from optax import GradientTransformation

X = na.named(jnp.ones((2, 3)), ("batch", "embed"))


def test_exact_axis_set_in_any_order():
    assert isinstance(X, NamedArray["batch embed"])
    assert isinstance(X, NamedArray["embed batch"])  # order does not matter
    assert not isinstance(X, NamedArray["batch"])  # `embed` is extra
    assert not isinstance(X, NamedArray["batch embed mlp"])  # `mlp` is missing
    assert not isinstance(X, NamedArray["batch hidden"])
    assert isinstance(na.named(jnp.float32(1), ()), NamedArray[""])
    assert not isinstance(X, NamedArray[""])


def test_ellipsis_allows_extra_axes():
    assert isinstance(X, NamedArray["batch ..."])
    assert isinstance(X, NamedArray["... embed"])
    assert isinstance(X, NamedArray["..."])
    assert not isinstance(X, NamedArray["mlp ..."])


def test_dtype_form_accepts_exact_types_and_categories():
    assert isinstance(X, NamedArray["batch embed", jnp.float32])
    assert isinstance(X, NamedArray["batch embed", jnp.floating])
    assert not isinstance(X, NamedArray["batch embed", jnp.integer])
    assert not isinstance(X, NamedArray["batch embed", jnp.bfloat16])
    assert isinstance(X.astype(jnp.int8), NamedArray["... ", jnp.integer])


def test_non_named_values_never_match():
    assert not isinstance(jnp.ones((2, 3)), NamedArray["batch embed"])
    assert not isinstance(None, NamedArray["..."])


def test_annotation_objects():
    ann = NamedArray["batch embed"]
    assert ann is NamedArray["batch  embed"]  # cached, whitespace-insensitive
    assert repr(ann) == "NamedArray['batch embed']"
    assert repr(NamedArray["batch", jnp.float32]) == "NamedArray['batch', float32]"
    assert issubclass(ann, NamedArray)
    with pytest.raises(
        na.NamedTypeError,
        match=r"NamedArray\['batch embed'\] is an annotation; create arrays with NamedArray\(array, axes\)",
    ):
        ann(jnp.ones((2, 3)), ("batch", "embed"))


def test_commas_separate_names_too():
    """``"embed,"`` is how mypy accepts a single axis in a signature (see namedaxes.mypy_plugin)."""
    assert NamedArray["embed,"] is NamedArray["embed"]
    assert NamedArray["batch, embed"] is NamedArray["batch embed"]
    assert isinstance(na.named(jnp.ones(3), "embed"), NamedArray["embed,"])
    assert not isinstance(X, NamedArray["embed,"])
    assert repr(NamedArray["batch,embed"]) == "NamedArray['batch embed']"


def test_bad_annotations():
    with pytest.raises(
        na.NamedTypeError,
        match=r"NamedArray\[\.\.\.\] takes a string of axis names, optionally with a dtype.*got \('batch', 'embed', 'mlp'\)",
    ):
        NamedArray["batch", "embed", "mlp"]
    with pytest.raises(na.NamedTypeError, match=r"takes a string of axis names.*got 3"):
        NamedArray[3]
    with pytest.raises(
        na.NamedTypeError,
        match=r"NamedArray\['batch', 'flaot'\]: 'flaot' is not a dtype or dtype category",
    ):
        NamedArray["batch", "flaot"]
    with pytest.raises(
        na.NamedTypeError, match=r"NamedArray\['batch batch'\] names 'batch' more than once"
    ):
        NamedArray["batch batch"]
    with pytest.raises(
        na.NamedTypeError, match=r"NamedArray\['\.\.\. batch \.\.\.'\] has more than one '\.\.\.'"
    ):
        NamedArray["... batch ..."]
    with pytest.raises(na.NamedTypeError, match=r"NamedArray\['batch'\] already names its axes"):
        NamedArray["batch"]["embed"]


@na.check_axes
def project(
    x: NamedArray["batch embed"], w: NamedArray["embed mlp", jnp.floating]
) -> NamedArray["batch mlp"]:
    return na.dot(x, w, axis="embed")


@na.check_axes
def broken(x: NamedArray["batch ..."]) -> NamedArray["batch"]:
    return x  # keeps the extra axes: the result check must catch it


@na.check_axes
def maybe(x: NamedArray["batch"] | None = None, n: int = 0) -> int:
    return n


W = na.named(jnp.ones((3, 4)), ("embed", "mlp"))


def test_check_axes_passes_good_calls_and_keeps_metadata():
    assert project(X, W).axis_names == ("batch", "mlp")
    assert project(w=W, x=X).axes[1].size == 4  # keyword arguments are checked too
    assert project.__name__ == "project"
    assert maybe() == 0 and maybe(na.named(jnp.ones(2), "batch"), n=1) == 1


def test_check_axes_catches_wrong_axes_in_arguments_and_result():
    wrong = na.named(jnp.ones((3, 4)), ("embed", "hidden"))
    msg = (
        r"project\(\) argument 'w' is NamedArray\(embed=3, hidden=4\), which does not match "
        r"NamedArray\['embed mlp', floating\]: missing axes 'mlp'; unexpected axes 'hidden' "
        r"\(add '\.\.\.' to allow extra axes\)\."
    )
    with pytest.raises(na.NamedTypeError, match=msg):
        project(X, wrong)
    with pytest.raises(
        na.NamedTypeError,
        match=r"project\(\) argument 'x' is ArrayImpl of shape \(2, 3\), which does not match NamedArray\['batch embed'\]: not a NamedArray \(name its axes with named\(x, \(\.\.\.\)\)\)",
    ):
        project(jnp.ones((2, 3)), W)
    with pytest.raises(na.NamedTypeError, match=r"dtype int32 is not floating"):
        project(X, W.astype(jnp.int32))
    with pytest.raises(
        na.NamedTypeError,
        match=r"broken\(\) result is NamedArray\(batch=2, embed=3\), which does not match NamedArray\['batch'\]: unexpected axes 'embed'",
    ):
        broken(X)
    with pytest.raises(
        na.NamedTypeError,
        match=r"maybe\(\) argument 'x' is NamedArray\(embed=3\), which does not match NamedArray\['batch'\]: missing axes 'batch'",
    ):
        maybe(na.named(jnp.ones(3), "embed"))


def test_check_axes_binds_one_size_per_name_within_a_call():
    w5 = na.named(jnp.ones((5, 4)), ("embed", "mlp"))
    with pytest.raises(
        na.AxisSizeError,
        match=r"project\(\) axis 'embed' has size 5 in argument 'w' but size 3 in argument 'x'",
    ):
        project(X, w5)


def test_check_axes_under_jit():
    f = jax.jit(project)
    assert f(X, W).axis_names == ("batch", "mlp")
    # Axis order is free: (embed, batch) matches "batch embed".
    assert f(na.named(jnp.ones((3, 2)), ("embed", "batch")), W).axis_names == ("batch", "mlp")
    with pytest.raises(
        na.NamedTypeError, match=r"project\(\) argument 'w' is NamedArray\(embed=3, hidden=4\)"
    ):
        f(X, na.named(jnp.ones((3, 4)), ("embed", "hidden")))


def test_varargs_are_checked_one_by_one():
    @na.check_axes
    def total(*xs: NamedArray["batch"]) -> NamedArray[""]:
        return na.sum(sum(xs[1:], xs[0]))

    ok = na.named(jnp.ones(2), "batch")
    assert total(ok, ok).item() == 4.0
    with pytest.raises(
        na.NamedTypeError, match=r"total\(\) argument \*xs\[1\] is NamedArray\(embed=2\)"
    ):
        total(ok, na.named(jnp.ones(2), "embed"))


def test_check_axes_skips_annotations_it_cannot_resolve():
    """Other annotations are ignored, even ones that do not resolve at run time (this module has
    ``from __future__ import annotations``): a TYPE_CHECKING import, a class local to a function."""

    class Config:
        pass

    @na.check_axes
    def step(
        x: NamedArray["batch embed"],
        opt: GradientTransformation | None = None,
        cfg: Config | None = None,
    ) -> NamedArray["batch"]:
        return x.sum("embed")

    assert step(X).axis_names == ("batch",)
    with pytest.raises(
        na.NamedTypeError, match=r"^step\(\) argument 'x' is NamedArray\(batch=2\),"
    ):
        step(X.sum("embed"))

    Tokens = NamedArray["batch position"]  # a local alias the function uses: found in its closure

    @na.check_axes
    def count(ids: Tokens) -> int:
        return sum(isinstance(ids, Tokens) for _ in range(2))

    with pytest.raises(
        na.NamedTypeError, match=r"count\(\) argument 'ids' is NamedArray\(batch=2, embed=3\)"
    ):
        count(X)


def test_check_axes_refuses_an_unresolvable_named_array_annotation():
    @na.check_axes
    def step(x: NamedArray["batch"] | GradientTransformation) -> int:
        return 0

    with pytest.raises(
        na.NamedTypeError,
        match=r"^check_axes\(\) cannot resolve the annotation "
        r"\"NamedArray\['batch'\] \| GradientTransformation\" of parameter 'x' of step\(\) "
        r"\(NameError: name 'GradientTransformation' is not defined\)\. Make the names it uses "
        r"importable where step\(\) is defined \(not only under TYPE_CHECKING\)\.$",
    ):
        step(X)


class Layer(eqx.Module):
    def __call__(self, x: NamedArray["batch embed"]) -> NamedArray["batch"]:
        return x.sum("embed")


class Plain:
    def __call__(self, x: NamedArray["batch embed"], scale: float) -> NamedArray["batch"]:
        return x.sum("embed") * scale


def test_check_axes_reads_the_signature_of_callable_objects_and_partials():
    """An equinox Module (or any object) is checked by its __call__, a partial by what is left."""
    wrong = X.sum("embed")
    layer = na.check_axes(Layer())
    assert layer(X).axis_names == ("batch",)
    with pytest.raises(
        na.NamedTypeError,
        match=r"^Layer\.__call__\(\) argument 'x' is NamedArray\(batch=2\), which does not match "
        r"NamedArray\['batch embed'\]: missing axes 'embed'\.$",
    ):
        layer(wrong)
    with pytest.raises(
        na.NamedTypeError, match=r"^Plain\.__call__\(\) argument 'x' is NamedArray\(batch=2\)"
    ):
        na.check_axes(Plain())(wrong, 2.0)
    scaled = na.check_axes(functools.partial(Plain().__call__, scale=2.0))
    assert float(scaled(X).array[0]) == 6.0
    with pytest.raises(
        na.NamedTypeError, match=r"^Plain\.__call__\(\) argument 'x' is NamedArray\(batch=2\)"
    ):
        scaled(wrong)


def test_check_axes_refuses_a_function_with_nothing_to_check():
    nothing = (
        r"^check_axes\(\): {}\(\) has no NamedArray\[\.\.\.\] annotation on its parameters or "
        r"result, so there is nothing to check\. Name the axes, e\.g\. x: "
        r"NamedArray\['batch embed'\], or leave out @check_axes\.$"
    )
    with pytest.raises(na.NamedTypeError, match=nothing.format("unannotated")):

        @na.check_axes
        def unannotated(x):
            return x

    @na.check_axes
    def plain(x: NamedArray) -> int:  # a string here (future import): resolved on the first call
        return 0

    with pytest.raises(na.NamedTypeError, match=nothing.format("plain")):
        plain(X)

    Ann = NamedArray["batch"]  # a local alias its body never uses: not in its closure

    @na.check_axes
    def keep(x: Ann) -> int:
        return 0

    with pytest.raises(
        na.NamedTypeError,
        match=r"^check_axes\(\): keep\(\) has no NamedArray\[\.\.\.\] annotation on its parameters "
        r"or result \(annotations it cannot resolve: 'Ann' of parameter 'x'\), so there is",
    ):
        keep(X)


@pytest.mark.parametrize(
    ("python_type", "category", "matching", "other"),
    [
        (float, "floating", jnp.ones(2), jnp.ones(2, jnp.int32)),
        (int, "integer", jnp.ones(2, jnp.int32), jnp.ones(2)),
        (complex, "complexfloating", jnp.ones(2, jnp.complex64), jnp.ones(2)),
        (bool, "bool", jnp.ones(2, bool), jnp.ones(2, jnp.int32)),
    ],
)
def test_python_scalar_types_name_dtype_categories(python_type, category, matching, other):
    ann = NamedArray["batch", python_type]
    assert repr(ann) == f"NamedArray['batch', {category}]"
    assert isinstance(na.named(matching, ("batch",)), ann)
    assert not isinstance(na.named(other, ("batch",)), ann)
    if python_type is float:
        assert isinstance(na.named(jnp.ones(2, jnp.bfloat16), ("batch",)), ann)


def test_prng_key_arrays_match_no_numeric_dtype():
    keys = na.named(jax.random.split(jax.random.key(0), 2), ("batch",))
    assert not isinstance(keys, NamedArray["batch", jnp.floating])
    assert isinstance(keys, NamedArray["batch"])

    @na.check_axes
    def f(x: NamedArray["batch", jnp.floating]) -> NamedArray["batch"]:
        return x

    with pytest.raises(
        na.NamedTypeError,
        match=r"f\(\) argument 'x' is NamedArray\(batch=2\), which does not match "
        r"NamedArray\['batch', floating\]: dtype key<fry> is not floating\.",
    ):
        f(keys)
