"""One doctest gate: every docstring example in every module of namedaxes runs and shows what it says.

Modules are found with pkgutil (private ones too: that is where the public functions live). Each
example sees its module's globals plus ``jax``, ``jnp``, ``np``, ``na``/``namedaxes`` and ``mesh``
(a ``(data=2, model=4)`` mesh of the 8 CPU devices).
"""

import doctest
import importlib
import importlib.util
import pkgutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import namedaxes
import namedaxes as na

# `python -m namedaxes` entry point: importing it runs the command line.
_NOT_IMPORTABLE = {"namedaxes.__main__"}
# Modules whose examples need an optional dependency: (module, the dependency).
_NEEDS = {"namedaxes.mypy_plugin": "mypy"}


def _module_names() -> list[str]:
    found = pkgutil.walk_packages(namedaxes.__path__, "namedaxes.", onerror=lambda name: None)
    return ["namedaxes"] + sorted(m.name for m in found if m.name not in _NOT_IMPORTABLE)


MODULES = _module_names()


def _extra_globals() -> dict:
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    return {"jax": jax, "jnp": jnp, "np": np, "na": na, "namedaxes": namedaxes, "mesh": mesh}


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    needs = _NEEDS.get(name)
    if needs is not None and importlib.util.find_spec(needs) is None:
        pytest.skip(f"{name}'s examples need {needs}")
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    tests = finder.find(module, name, extraglobs=_extra_globals())
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    report: list[str] = []
    for test in sorted(tests, key=lambda t: t.name):
        runner.run(test, out=report.append, clear_globs=True)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, "".join(report)


def test_the_gate_finds_the_examples():
    """Guard against a gate that passes by running nothing."""
    finder = doctest.DocTestFinder(exclude_empty=True)
    per_module = {
        name: sum(len(t.examples) for t in finder.find(importlib.import_module(name), name))
        for name in (
            "namedaxes",
            "namedaxes._array",
            "namedaxes._ops.elementwise",
            "namedaxes._typing",
        )
    }
    assert all(count > 0 for count in per_module.values()), per_module
    # The lifted elementwise ops say they live in `namedaxes`, so their generated examples (one
    # per op) are found there.
    assert per_module["namedaxes"] > 300
