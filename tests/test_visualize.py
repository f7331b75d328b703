"""visualize_sharding / visualize_array: rows and grids say where leaves live, by name.

Placement is checked against JAX itself (``devices_indices_map``, ``addressable_shards``) on Auto
and Explicit meshes; the rich path against a stream that claims to be a terminal.
"""

import io
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import namedaxes as na


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def _rows(text):
    """{path: [cells]} of a plain-text visualize_sharding table (cells split on 2+ spaces)."""
    lines = text.strip().splitlines()
    assert lines[0].split()[:2] == ["path", "axes"]
    return {re.split(r"\s{2,}", ln)[0]: re.split(r"\s{2,}", ln) for ln in lines[1:-1]}


def _grid(text):
    lines = text.strip().splitlines()
    return lines[0], [
        [c.strip() for c in ln.split("|")] for ln in lines[1:] if not ln.startswith("-")
    ]


@pytest.fixture
def placed(mesh_2x4):
    with jax.set_mesh(mesh_2x4), na.axis_mapping({"batch": "data", "mlp": "model"}):
        tree = {
            "x": na.shard(na.named(jnp.ones((8, 16)), ("batch", "mlp"))),
            "bias": na.shard(na.named(jnp.ones(6), "embed")),  # no rule for embed: replicated
            "plain": jax.device_put(jnp.ones((4, 3)), jax.NamedSharding(mesh_2x4, jax.P("data"))),
            "step": 3,
        }
    return tree


def test_rows_of_placed_tree(placed, capsys):
    na.analysis.visualize_sharding(placed)
    text = capsys.readouterr().out
    rows = _rows(text)
    assert set(rows) == {"x", "bias", "plain"}  # the int is not an array
    assert rows["x"] == [
        "x",
        "batch=8, mlp=16",
        "float32",
        "P('data', 'model')",
        "(4, 4)",
        "64 B",
        "no",
    ]
    bias_spec = str(placed["bias"].array.sharding.spec)  # what shard placed: P() or P(None,)
    assert rows["bias"][1:] == ["embed=6", "float32", bias_spec, "(6,)", "24 B", "yes"]
    assert rows["plain"][1:] == ["(4, 3)", "float32", "P('data',)", "(2, 3)", "24 B", "over model"]
    # per-device shapes agree with JAX's own shards
    assert placed["x"].array.addressable_shards[0].data.shape == (4, 4)
    assert placed["plain"].addressable_shards[0].data.shape == (2, 3)
    assert text.strip().splitlines()[-1] == "busiest device: 112 B on Mesh(data=2, model=4)"


def test_rows_of_abstract_tree_are_planned_by_resolve(axis_type):
    tree = {"w": na.named(jax.ShapeDtypeStruct((64, 256), jnp.bfloat16), ("embed", "mlp"))}
    rules = na.AxisRules([("mlp", "model"), ("embed", "data")])
    out = io.StringIO()
    na.analysis.visualize_sharding(tree, rules, {"data": 2, "model": 4}, file=out)
    row = _rows(out.getvalue())["w"]
    spec = na.resolve(tree["w"].axes, rules, {"data": 2, "model": 4})
    assert row[3] == f"{spec} (planned)" == "P('data', 'model') (planned)"
    assert row[4:] == ["(32, 64)", "4.00 KiB", "no"]


def test_named_leaf_without_mapping_fails_closed():
    tree = {"w": na.named(jax.ShapeDtypeStruct((4, 4), jnp.float32), ("embed", "mlp"))}
    with pytest.raises(na.ShardingError, match=r"visualize_sharding\(\) got no mapping"):
        na.analysis.visualize_sharding(tree, mesh={"data": 2})


def test_rich_table_in_a_terminal(placed):
    out = _Terminal()
    na.analysis.visualize_sharding(placed, file=out)
    text = out.getvalue()
    assert "┃" in text and "path" in text and "batch=8" in text  # a rich table, not plain text
    assert "busiest device: 112 B" in text


def test_grid_matches_jax_devices(placed, mesh_2x4):
    x = placed["x"]
    out = io.StringIO()
    na.analysis.visualize_array(x, file=out)
    title, grid = _grid(out.getvalue())
    assert (
        title == "NamedArray(float32, batch=8, mlp=16)  P('data', 'model') on Mesh(data=2, model=4)"
    )
    assert grid[0] == ["batch \\ mlp", "0:4", "4:8", "8:12", "12:16"]  # names on the sides
    assert [r[0] for r in grid[1:]] == ["0:4", "4:8"]
    for device, index in x.array.sharding.devices_indices_map((8, 16)).items():
        r = [row[0] for row in grid].index(f"{index[0].start}:{index[0].stop}")
        c = grid[0].index(f"{index[1].start}:{index[1].stop}")
        assert grid[r][c] == str(device.id)


def test_grid_one_axis_and_chosen_axes(placed, mesh_2x4):
    out = io.StringIO()
    na.analysis.visualize_array(placed["bias"], file=out)
    _, grid = _grid(out.getvalue())
    assert grid == [
        ["embed", "0:6"],
        ["devices", ",".join(str(d.id) for d in mesh_2x4.devices.flat)],
    ]
    # three axes: draw two; the replicated third shares cells; names transposed swap the sides
    with jax.set_mesh(mesh_2x4), na.axis_mapping({"batch": "data", "mlp": "model"}):
        y = na.shard(na.named(jnp.ones((2, 8, 4)), ("head", "batch", "mlp")))
    out = io.StringIO()
    na.analysis.visualize_array(y, axes=("mlp", "batch"), file=out)
    _, grid = _grid(out.getvalue())
    assert grid[0] == ["mlp \\ batch", "0:4", "4:8"]
    assert [r[0] for r in grid[1:]] == ["0:1", "1:2", "2:3", "3:4"]
    with pytest.raises(na.AxisError, match=r"has 3\. Choose them, e.g. axes=\('head', 'batch'\)"):
        na.analysis.visualize_array(y)
    with pytest.raises(
        na.AxisError, match=r"axis 'embd' not found .* Available axes: 'head', 'batch', 'mlp'"
    ):
        na.analysis.visualize_array(y, axes="embd")


def test_abstract_grid_uses_mesh_positions():
    x = na.named(jax.ShapeDtypeStruct((8, 6), jnp.float32), ("batch", "embed"))
    out = io.StringIO()
    na.analysis.visualize_array(x, {"batch": ("data", "model")}, {"data": 2, "model": 2}, file=out)
    title, grid = _grid(out.getvalue())
    assert title.endswith("P(('data', 'model'), None) (planned) on Mesh(data=2, model=2)")
    assert grid == [
        ["batch \\ embed", "0:6"],
        ["0:2", "0"],
        ["2:4", "1"],
        ["4:6", "2"],
        ["6:8", "3"],
    ]
    out = _Terminal()
    na.analysis.visualize_array(x, {"batch": "model"}, {"data": 2, "model": 2}, file=out)
    assert "batch \\ embed" in out.getvalue() and "0,2" in out.getvalue() and "┃" in out.getvalue()


def test_grid_of_uneven_sharding_on_a_concrete_mesh(axis_type):
    # devices_indices_map refuses an uneven sharding; the grid shows JAX's padded layout (blocks
    # of ceil(6/8) = 1 row, the last empty), labelled by the devices of a mesh in reversed order.
    devices = np.array(jax.devices()[::-1]).reshape(2, 4)
    mesh = jax.sharding.Mesh(devices, ("data", "model"), axis_types=(axis_type,) * 2)
    sharding = jax.NamedSharding(mesh, jax.P(("model", "data")))
    x = na.named(jax.ShapeDtypeStruct((6, 8), jnp.float32, sharding=sharding), ("a", "b"))
    out = io.StringIO()
    na.analysis.visualize_array(x, file=out)
    title, grid = _grid(out.getvalue())
    assert title == "NamedArray(float32, a=6, b=8)  P(('model', 'data'),) on Mesh(data=2, model=4)"
    # block i = model * 2 + data; the device at (data, model) is 7 - (data * 4 + model)
    assert grid == [
        ["a \\ b", "0:8"],
        ["0:1", "7"],
        ["1:2", "3"],
        ["2:3", "6"],
        ["3:4", "2"],
        ["4:5", "5"],
        ["5:6", "1"],
        ["6:6", "0,4"],
    ]


def test_visualize_array_refuses_plain_arrays():
    with pytest.raises(
        na.NamedTypeError, match="visualize_array takes a NamedArray, got ArrayImpl"
    ):
        na.analysis.visualize_array(jnp.ones(3))


def test_memory_report_and_plan_render_as_rich_tables():
    rich = pytest.importorskip("rich.console")
    tree = {"w": na.named(jax.ShapeDtypeStruct((64, 256), jnp.float32), ("embed", "mlp"))}
    report = na.analysis.memory_report(tree, {"mlp": "model"}, {"data": 2, "model": 4})
    p = na.analysis.plan(tree, {"data": 2, "model": 4}, {"mlp": "model"})
    for obj, title in [(report, "Memory report on Mesh(data=2, model=4)"), (p, "Plan")]:
        assert str(obj).splitlines()[0] == title  # str() stays plain text
        out = _Terminal()
        rich.Console(file=out, width=120).print(obj)
        text = out.getvalue()
        assert title in text and "┃" in text and "mlp" in text


def test_plain_text_in_a_terminal_without_rich(placed, monkeypatch):
    for name in ("rich", "rich.console", "rich.table", "rich.text"):
        monkeypatch.setitem(sys.modules, name, None)  # importing them raises ImportError
    out = _Terminal()
    na.analysis.visualize_sharding(placed, file=out)
    assert "┃" not in out.getvalue()
    assert _rows(out.getvalue())["x"][3] == "P('data', 'model')"
    report = na.analysis.memory_report(
        {"x": placed["x"]}, {"batch": "data"}, {"data": 2, "model": 4}
    )
    assert report.__rich__() == str(report)


def test_rows_agree_with_pspec_for_leaf_by_leaf():
    import equinox as eqx

    class Block(eqx.Module):
        w: na.NamedArray
        b: jax.Array = na.field(axis_names=("mlp",))  # a plain array named by its field

    sds = jax.ShapeDtypeStruct
    tree = {
        "block": Block(
            na.named(sds((16, 64), jnp.float32), ("embed", "mlp")), sds((64,), jnp.float32)
        ),
        "emb": na.named(
            sds((6, 16), jnp.float32), ("vocab", "embed")
        ),  # 4 does not divide 6: fallback
    }
    rules = na.AxisRules(
        [
            ("vocab", "model"),
            ("vocab", "data"),
            ("mlp", "model"),
            ("embed", "data"),
            ("embed", None),
        ]
    )
    sizes = {"data": 2, "model": 4}
    out = io.StringIO()
    na.analysis.visualize_sharding(tree, rules, sizes, file=out)
    rows = _rows(out.getvalue())
    specs = na.pspec_for(tree, rules, mesh=sizes)
    expected = {"block/w": specs["block"].w, "block/b": specs["block"].b, "emb": specs["emb"]}
    assert {path: row[3] for path, row in rows.items()} == {
        p: f"{s} (planned)" for p, s in expected.items()
    }
    assert rows["emb"][3] == "P('data', None) (planned)"


def test_inside_jit_shows_the_traced_placement(axis_type):
    # A tracer has no .sharding; on Explicit axes its type holds the real spec (not the plan's).
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(axis_type,) * 2)
    arr = jax.device_put(jnp.ones((8, 16)), jax.NamedSharding(mesh, jax.P(None, "model")))
    x = na.named(arr, ("batch", "embed"))
    out = io.StringIO()

    def f(x):
        na.analysis.visualize_sharding({"x": x}, {"batch": "data"}, mesh, file=out)
        na.analysis.visualize_array(x, {"batch": "data"}, mesh, file=out)
        return x

    with jax.set_mesh(mesh):
        jax.jit(f)(x)
    text = out.getvalue()
    if axis_type == jax.sharding.AxisType.Explicit:
        assert _rows(text.split("NamedArray(")[0])["x"][3:5] == ["P(None, 'model')", "(8, 4)"]
        assert "P(None, 'model') on Mesh(data=2, model=4)" in text
        assert "(planned)" not in text
    else:  # Auto axes inside jit: the compiler decides, the table shows the plan and says so
        assert "P('data', None) (planned)" in text


def test_grid_of_a_scalar_is_one_cell_of_every_device(mesh_2x4):
    x = na.named(jax.device_put(jnp.float32(1.0), jax.NamedSharding(mesh_2x4, jax.P())), ())
    out = io.StringIO()
    na.analysis.visualize_array(x, file=out)
    title, grid = _grid(out.getvalue())
    assert title == "NamedArray(float32)  P() on Mesh(data=2, model=4)"
    assert grid == [["(no axes)", "value"], ["devices", "0,1,2,3,4,5,6,7"]]
    out = io.StringIO()
    na.analysis.visualize_array(na.named(jnp.float32(1.0), ()), {}, {"data": 2}, file=out)
    assert _grid(out.getvalue())[1] == [["(no axes)", "value"], ["devices", "0,1"]]
