"""without_axes, eliminate_axes, replace_axis: pure axis-tuple algebra and its errors."""

import pytest

import namedaxes as na
from namedaxes import Axis

B, E, H = Axis("batch", 2), Axis("embed", 6), Axis("heads", 3)


def test_without_axes_is_set_difference():
    assert na.without_axes((B, E), "embed") == (B,)
    assert na.without_axes((B, E), ("embed", "missing")) == (B,)
    assert na.without_axes(("batch", "embed"), E) == ("batch",)
    assert na.without_axes({"batch": 2, "embed": 6}, ["batch"]) == {"embed": 6}


def test_eliminate_axes_requires_presence():
    assert na.eliminate_axes((B, E, H), ("heads", B)) == (E,)
    with pytest.raises(
        na.AxisNotFoundError,
        match=r"Cannot eliminate axis 'mlp': it is not in \(batch=2, embed=6\)\. Available axes: 'batch', 'embed'\. Use without_axes\(\) to skip missing ones\.",
    ):
        na.eliminate_axes((B, E), "mlp")
    with pytest.raises(
        na.AxisSizeError,
        match=r"Cannot eliminate Axis\('embed', 4\): 'embed' has size 6 in \(batch=2, embed=6\)",
    ):
        na.eliminate_axes((B, E), Axis("embed", 4))
    with pytest.raises(na.DuplicateAxisError, match="Duplicate axis names 'batch'"):
        na.eliminate_axes((B, E), ("batch", "batch"))


def test_replace_axis_in_place():
    assert na.replace_axis((B, E), "embed", (H, Axis("dim", 2))) == (B, H, Axis("dim", 2))
    assert na.replace_axis((B, E), B, Axis("rows", 2)) == (Axis("rows", 2), E)
    assert na.replace_axis(("batch", "embed"), "batch", "rows") == ("rows", "embed")
    assert na.replace_axis({"batch": 2, "embed": 6}, "embed", {"heads": 3, "dim": 2}) == {
        "batch": 2,
        "heads": 3,
        "dim": 2,
    }
    with pytest.raises(
        na.AxisNotFoundError, match=r"Cannot replace axis 'mlp': it is not in \(batch=2, embed=6\)"
    ):
        na.replace_axis((B, E), "mlp", H)
    with pytest.raises(na.DuplicateAxisError, match="Duplicate axis names 'batch'"):
        na.replace_axis((B, E), "embed", Axis("batch", 6))
    with pytest.raises(
        na.NamedTypeError,
        match=r"replace_axis\(\) on a \{name: size\} dict needs sizes for the new axes",
    ):
        na.replace_axis({"batch": 2}, "batch", "rows")
    with pytest.raises(na.NamedTypeError, match=r"Expected an axis name \(str\) or an Axis, got 3"):
        na.without_axes((B, 3), "batch")
