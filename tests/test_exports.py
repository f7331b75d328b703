"""The public surface: every public name has exactly one home.

The core (arrays, axes, errors, named ops, partitioning, shard_map) is exported from ``namedaxes``;
the rest from its subpackage. No object is exported from two places or under two names, and
nothing is exported under another name than its own (no alias such as ``slice`` for
``slice_axis``, which would shadow a builtin).
"""

import ast
import importlib
import importlib.util
import types
import typing
from pathlib import Path

import pytest

import namedaxes as na

PUBLIC = [
    "namedaxes",
    "namedaxes.nn",
    "namedaxes.random",
    "namedaxes.mesh",
    "namedaxes.distributed",
    "namedaxes.rules",
    "namedaxes.analysis",
    "namedaxes.models",
    "namedaxes.checkpoint",
    "namedaxes.kernels",
]
MODULES = {
    name: importlib.import_module(name)
    for name in PUBLIC
    if importlib.util.find_spec(name) is not None
}


def _exports(module: types.ModuleType) -> dict[str, object]:
    return {
        n: getattr(module, n)
        for n in module.__all__
        if not isinstance(getattr(module, n), types.ModuleType)
    }


def _is_type_alias(obj: object) -> bool:
    return (
        typing.get_origin(obj) is not None
        or isinstance(obj, (types.UnionType, typing.TypeAliasType))
        or type(obj).__module__ == "typing"
    )


@pytest.mark.parametrize("name", list(MODULES))
def test_public_modules_declare_what_they_export(name):
    module = MODULES[name]
    assert isinstance(getattr(module, "__all__", None), list), f"{name} has no __all__"
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ lists names it lacks: {missing}"


def test_every_public_name_is_exported_from_one_place():
    homes: dict[int, list[str]] = {}
    for name, module in MODULES.items():
        for n, obj in _exports(module).items():
            homes.setdefault(id(obj), []).append(f"{name}.{n}")
    twice = sorted(places for places in homes.values() if len(places) > 1)
    assert not twice, f"exported from more than one place: {twice}"


def test_nothing_is_exported_under_another_name():
    aliases = []
    for name, module in MODULES.items():
        for n, obj in _exports(module).items():
            own = getattr(obj, "__name__", None)
            if own is not None and own != n and not _is_type_alias(obj):
                aliases.append(f"{name}.{n} is {own}")
    assert not aliases, f"aliases: {aliases}"


def test_no_builtin_is_shadowed_by_an_alias():
    assert not hasattr(na, "slice")
    assert na.slice_axis.__name__ == "slice_axis"


def test_the_top_level_reexports_with_the_as_form():
    """Every name of ``namedaxes/__init__.py`` is a ``from .x import y as y`` re-export."""
    source = Path(na.__file__).read_text()
    imported = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.ImportFrom):
            for a in node.names:
                assert a.asname == a.name, f"`{a.name} as {a.asname}` in namedaxes/__init__.py"
                imported.add(a.name)
    assert set(na.__all__) == imported
