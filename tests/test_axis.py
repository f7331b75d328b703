"""Axis: construction, validation and the pure axis algebra."""

import numpy as np
import pytest

from namedaxes import Axis, AxisError, AxisSizeError, DuplicateAxisError, NamedTypeError
from namedaxes._axis import axis_name, broadcast_axes, find_axis, to_axes


def test_axis_is_immutable_and_hashable():
    a = Axis("batch", 8)
    assert a == Axis("batch", 8)
    assert {a: 1}[Axis("batch", 8)] == 1
    with pytest.raises(AttributeError):
        a.size = 4  # type: ignore[misc]


def test_axis_accepts_numpy_integers_as_python_ints():
    a = Axis("batch", np.int64(4))
    assert a.size == 4 and type(a.size) is int


@pytest.mark.parametrize("name", ["", 3, None])
def test_axis_rejects_bad_names(name):
    with pytest.raises(AxisError, match="Axis name must be a non-empty string"):
        Axis(name, 2)


@pytest.mark.parametrize("size", [2.0, "2", True, None])
def test_axis_rejects_non_integer_sizes(size):
    with pytest.raises(AxisError, match="size must be an int"):
        Axis("batch", size)


def test_axis_rejects_negative_size():
    with pytest.raises(AxisError, match=r"Axis 'batch' size must be >= 0, got -1"):
        Axis("batch", -1)


def test_resize_and_alias():
    assert Axis("a", 2).resize(5) == Axis("a", 5)
    assert Axis("a", 2).alias("b") == Axis("b", 2)


def test_to_axes_from_dict_sequence_and_single():
    assert to_axes({"a": 1, "b": 2}) == (Axis("a", 1), Axis("b", 2))
    assert to_axes([Axis("a", 1)]) == (Axis("a", 1),)
    assert to_axes(Axis("a", 1)) == (Axis("a", 1),)


def test_to_axes_rejects_bare_names_and_duplicates():
    with pytest.raises(NamedTypeError, match="must be Axis objects or a"):
        to_axes(["a", "b"])
    with pytest.raises(DuplicateAxisError, match=r"Duplicate axis names 'a' in \('a', 'a'\)"):
        to_axes([Axis("a", 1), Axis("a", 1)])


def test_axis_name_rejects_other_types():
    with pytest.raises(NamedTypeError, match=r"Expected an axis name \(str\) or an Axis, got 3"):
        axis_name(3)  # type: ignore[arg-type]


def test_find_axis_lists_available_axes():
    axes = (Axis("batch", 8), Axis("embed", 64))
    assert find_axis(axes, "embed") == 1
    with pytest.raises(
        KeyError,
        match=r"Axis 'embd' not found in NamedArray\(batch=8, embed=64\)\. "
        r"Available axes: 'batch', 'embed'\.",
    ):
        find_axis(axes, "embd")
    with pytest.raises(AxisSizeError, match="has size 64 .* but size 32 was asked for"):
        find_axis(axes, Axis("embed", 32))


def test_broadcast_axes_orders_left_then_new_right():
    left = (Axis("a", 2), Axis("b", 3))
    right = (Axis("c", 4), Axis("a", 2))
    assert broadcast_axes(left, right) == (Axis("a", 2), Axis("b", 3), Axis("c", 4))


def test_broadcast_axes_names_both_sizes_on_conflict():
    with pytest.raises(AxisSizeError, match=r"Cannot broadcast axis 'a': size 2 in .* but size 5"):
        broadcast_axes((Axis("a", 2),), (Axis("a", 5),))
