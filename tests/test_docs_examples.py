"""The guides' code runs: every ```python block of docs/*.md, docs/migration/*.md and docs/tutorial.md.

Each page runs in one subprocess with 8 simulated CPU devices, its blocks in order in one namespace
(a later block may use what an earlier one defined), from a temporary working directory. A failure
names the page and the line of the block. Markers, each on the line right before a fence:

- ``<!-- skip -->``, or a fence written ```` ```python no-run ````: not run (only for code that needs
  TPUs, several hosts or other libraries);
- ``<!-- raises NamedTypeError -->``: the block must raise that exception (a ``namedaxes`` or builtin
  name), for snippets that show an error.

A hidden setup block, an HTML comment ``<!-- setup`` ... ``-->`` (each on its own line), holds Python
that runs in order with the blocks but is not shown on the site: the definitions a fragment assumes.
"""

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGES = sorted(p for p in [*DOCS.glob("*.md"), *DOCS.glob("migration/*.md")])

_FENCE = re.compile(r"^```(\S*)(.*)$")
_RAISES = re.compile(r"^<!-- raises (\w+) -->$")


def python_blocks(text: str) -> list[tuple[int, str, str | None]]:
    """(first line number, code, expected exception or None) of every runnable block of a page:
    ```python blocks and hidden ``<!-- setup`` blocks, in page order."""
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "<!-- setup":
            end = i + 1
            while end < len(lines) and lines[end].strip() != "-->":
                end += 1
            blocks.append((i + 2, "\n".join(lines[i + 1 : end]), None))
            i = end + 1
            continue
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        lang, rest = m.group(1), m.group(2).strip()
        start = i + 1
        end = start
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        before = lines[i - 1].strip() if i > 0 else ""
        skipped = rest == "no-run" or before == "<!-- skip -->"
        raises = _RAISES.match(before)
        if lang == "python" and not skipped:
            blocks.append(
                (start + 1, "\n".join(lines[start:end]), raises.group(1) if raises else None)
            )
        i = end + 1
    return blocks


_RUNNER = textwrap.dedent(
    """
    import builtins, json, sys, traceback
    import jax
    jax.config.update("jax_num_cpu_devices", 8)
    import namedaxes
    page, blocks = sys.argv[1], json.loads(sys.stdin.read())
    namespace = {"__name__": "__main__"}
    for line, code, raises in blocks:
        expected = None
        if raises is not None:
            expected = getattr(namedaxes, raises, None) or getattr(builtins, raises)
        try:
            exec(compile(code, f"{page}:{line}", "exec"), namespace)
        except BaseException as e:
            if expected is not None and isinstance(e, expected):
                continue
            print(f"block at {page}:{line} failed:", file=sys.stderr)
            traceback.print_exc()
            sys.exit(1)
        if expected is not None:
            print(f"block at {page}:{line} should raise {raises} but did not", file=sys.stderr)
            sys.exit(1)
    """
)


def test_block_extraction_honours_skip_markers():
    page = "\n".join(
        [
            "```python",
            "a = 1",
            "```",
            "<!-- skip -->",
            "```python",
            "b = 2",
            "```",
            "```python no-run",
            "c = 3",
            "```",
            "```bash",
            "ls",
            "```",
            "```python",
            "d = 4",
            "```",
            "<!-- setup",
            "e = 5",
            "-->",
            "<!-- raises NamedTypeError -->",
            "```python",
            "na.sum(3, 0)",
            "```",
        ]
    )
    assert python_blocks(page) == [
        (2, "a = 1", None),
        (15, "d = 4", None),
        (18, "e = 5", None),
        (22, "na.sum(3, 0)", "NamedTypeError"),
    ]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_page_code_runs(page, tmp_path):
    blocks = python_blocks(page.read_text())
    if not blocks:
        pytest.skip(f"{page.name} has no runnable python blocks")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, "-c", _RUNNER, str(page.relative_to(DOCS))],
        input=json.dumps(blocks),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]


def _module_level_imports(tree):
    """Top-level names of the absolute imports a module runs when imported (its body, and the
    bodies of module-level ``try``/``if`` blocks); imports inside functions are lazy."""
    import ast

    names, todo = set(), list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, (ast.Try, ast.If)):
            todo += node.body + node.orelse + getattr(node, "handlers", [])
        elif isinstance(node, ast.ExceptHandler):
            todo += node.body
    return names


def test_docs_extra_installs_what_the_api_reference_imports():
    """``pip install -e '.[docs]' && mkdocs build --strict`` on a fresh machine stopped with
    "namedaxes.checkpoint needs orbax-checkpoint": the API reference imports every subpackage, and
    the docs extra did not install what they import."""
    import ast
    import importlib.metadata
    import tomllib

    root = DOCS.parent
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]

    def canonical(requirement):
        return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")

    installed, todo = set(), list(project["dependencies"]) + list(extras["docs"])
    while todo:  # expand self-references such as "namedaxes[checkpoint]"
        requirement = todo.pop()
        inner = re.fullmatch(r"namedaxes\[([\w,\s-]+)\]", requirement.strip())
        if inner:
            todo += [r for extra in inner.group(1).split(",") for r in extras[extra.strip()]]
        else:
            installed.add(canonical(requirement))
    imported = set()
    for path in sorted((root / "namedaxes").rglob("*.py")):
        imported |= _module_level_imports(ast.parse(path.read_text(), str(path)))
    third_party = imported - set(sys.stdlib_module_names) - {"namedaxes"}
    providers = importlib.metadata.packages_distributions()
    missing = {
        dist.lower().replace("_", "-")
        for name in third_party
        for dist in providers.get(name, [name])
    } - installed
    assert not missing, f"the docs extra does not install {sorted(missing)}"
