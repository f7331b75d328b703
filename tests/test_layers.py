"""The package's layers import one way: every import of every module (at module top, inside
functions, under ``TYPE_CHECKING``, or through ``importlib``) goes to its own layer or a lower one,
no module imports within a function, and no modules import each other in a cycle.

The layer order is the one written at the top of ``namedaxes/__init__.py``. A module that no layer
lists fails the test until it is given a place: add it to ``LAYERS`` below and to that docstring.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "namedaxes"

# Lowest first. A module belongs to the entry with the longest matching prefix (``namedaxes`` alone
# is the package's ``__init__``).
LAYERS = [
    ("namedaxes._errors", "namedaxes._caches"),
    ("namedaxes._axis",),
    ("namedaxes._mesh", "namedaxes._spec"),
    ("namedaxes._logical",),
    ("namedaxes._typing",),
    ("namedaxes._array",),
    ("namedaxes._ops", "namedaxes._samplers", "namedaxes.random"),
    ("namedaxes._partitioning",),
    ("namedaxes.mesh", "namedaxes.rules", "namedaxes.distributed"),
    ("namedaxes.analysis",),
    ("namedaxes.kernels",),
    ("namedaxes.nn",),
    ("namedaxes.models", "namedaxes.checkpoint"),
    ("namedaxes", "namedaxes._cli", "namedaxes.__main__", "namedaxes.mypy_plugin"),
]


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def layer_of(module: str) -> int | None:
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for layer, prefixes in enumerate(LAYERS):
        for p in prefixes:
            matches = module == p if p == "namedaxes" else module == p or module.startswith(p + ".")
            if matches and (best is None or len(p) > best[0]):
                best = (len(p), layer)
    return None if best is None else best[1]


class Import:
    def __init__(self, source: str, target: str, line: int, in_function: bool, how: str):
        self.source, self.target, self.line = source, target, line
        self.in_function, self.how = in_function, how

    def __repr__(self) -> str:
        where = "inside a function" if self.in_function else "at module level"
        return f"{self.source}:{self.line} imports {self.target} ({self.how}, {where})"


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports_of(module: str, path: Path) -> list[Import]:
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    in_function: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            in_function.update(id(n) for n in ast.walk(node) if n is not node)
    found = []
    for node in ast.walk(tree):
        targets: list[tuple[str, str]] = []
        if isinstance(node, ast.Import):
            targets = [(a.name, "import") for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, is_package, node)
            for a in node.names:
                full = f"{base}.{a.name}"
                targets.append((full if full in MODULES else base, "from-import"))
        elif (
            isinstance(node, ast.Call)
            and (
                (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                or (
                    isinstance(node.func, ast.Name)
                    and node.func.id in ("import_module", "__import__")
                )
            )
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            targets = [(node.args[0].value, "importlib")]
        for target, how in targets:
            if target == "namedaxes" or target.startswith("namedaxes."):
                found.append(Import(module, target, node.lineno, id(node) in in_function, how))
    return found


def _edges() -> list[Import]:
    """Every import between namedaxes modules, with the package ``__init__``s that importing a
    module from outside its package runs first (``_ops.shape`` from ``_partitioning`` runs
    ``_ops/__init__``)."""
    out = []
    for module, path in MODULES.items():
        for imp in _imports_of(module, path):
            out.append(imp)
            parts = imp.target.split(".")
            for k in range(2, len(parts)):
                package = ".".join(parts[:k])
                if package in MODULES and not (module + ".").startswith(package + "."):
                    out.append(Import(module, package, imp.line, imp.in_function, "package init"))
    return out


EDGES = _edges()


def test_every_module_has_a_layer():
    missing = [m for m in MODULES if layer_of(m) is None]
    assert not missing, (
        f"modules in no layer (add them to LAYERS and the __init__ docstring): {missing}"
    )


def test_the_layer_table_covers_the_packages_to_come():
    # A models/ package is expected; its modules are placed as soon as they exist.
    assert layer_of("namedaxes.models._llama") == layer_of("namedaxes.checkpoint._io")
    assert layer_of("namedaxes.models") > layer_of("namedaxes.nn")


def test_no_upward_imports():
    upward = [
        e
        for e in EDGES
        if e.target in MODULES or e.target == "namedaxes"
        if layer_of(e.target) is not None and layer_of(e.target) > layer_of(e.source)
    ]
    assert not upward, "imports that go up the layers:\n" + "\n".join(map(repr, upward))


def test_nothing_imports_the_package_itself():
    root = [e for e in EDGES if e.target == "namedaxes" and e.how != "package init"]
    assert not root, "\n".join(map(repr, root))


def test_no_function_level_or_importlib_imports():
    hidden = [e for e in EDGES if e.in_function or e.how == "importlib"]
    assert not hidden, "imports hidden in functions or importlib:\n" + "\n".join(map(repr, hidden))


def test_no_import_cycles():
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for e in EDGES:
        if e.target in MODULES and e.target != e.source:
            graph[e.source].add(e.target)
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                return stack[stack.index(t) :] + [t]
            if t not in state:
                found = visit(t)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            cycle = visit(m)
            assert cycle is None, "import cycle: " + " -> ".join(cycle)


@pytest.mark.parametrize(
    "source",
    ["def f():\n    from .._partitioning import resolve\n", "import importlib\n"
     "X = importlib.import_module('namedaxes._ops.shape')\n"],
    ids=["function-level", "importlib"],
)  # fmt: skip
def test_the_checks_see_hidden_imports(tmp_path, source, monkeypatch):
    path = tmp_path / "probe.py"
    path.write_text(source)
    monkeypatch.setitem(MODULES, "namedaxes._ops.probe", path)
    (imp,) = _imports_of("namedaxes._ops.probe", path)
    assert imp.in_function or imp.how == "importlib"
    assert imp.target.startswith("namedaxes.")
