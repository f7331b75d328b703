"""NamedArray["..."] annotations: isinstance semantics, dtype form, check_axes, errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import namedaxes as na
from namedaxes import NamedArray

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
