"""Static typing: mypy sees NamedArray's operators and methods and reads NamedArray["..."] annotations.

One ``mypy --strict`` run checks examples/typed_usage.py (must be clean) with a snippet of mistakes
(each must be flagged), with the project's configuration (the namedaxes.mypy_plugin plugin).
"""

import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "typed_usage.py"

MISTAKES = """\
import jax.numpy as jnp

import namedaxes as na
from namedaxes import NamedArray

x = na.named(jnp.ones((2, 3)), ("batch", "embed"))
a = x.summ("embed")
b: NamedArray["batch batch"] = x
c: NamedArray[3] = x
d: int = x.sum("embed")
e = x + "text"
f = x.rename({"embed": 3.5})
g = x.take("embed")


@na.named_jit
def step(x: NamedArray, lr: float) -> NamedArray:
    return x * lr


h: int = step(x, 0.1)
i = step(x, "fast")
j = na.fsdp(step, {"embed": "data"}, {"batch": "data"})(x)
k: NamedArray[()] = x
m: NamedArray[b"batch embed"] = x
n: NamedArray["batch embed", 3] = x
o: NamedArray["batch", "embed"] = x
p: NamedArray["batch embed", 3.5] = x
q: NamedArray["batch embed", "bfloat16"] = x
r: NamedArray["batch embed", "float32"] = x
"""
# (line, start of mypy's message) for each mistake above.
EXPECTED = [
    (7, '"NamedArray" has no attribute "summ"; maybe "sum"?'),
    (8, "NamedArray['batch batch'] names 'batch' more than once."),
    (9, "NamedArray[...] takes a string of axis names and optionally a dtype"),
    (
        10,
        'Incompatible types in assignment (expression has type "NamedArray", variable has type "int")',
    ),
    (11, 'Unsupported operand types for + ("NamedArray" and "str")'),
    (12, "Dict entry 0 has incompatible type"),
    (13, 'Missing positional argument "indices" in call to "take" of "NamedArray"'),
    # named_jit and fsdp keep the wrapped function's signature (ParamSpec).
    (
        21,
        'Incompatible types in assignment (expression has type "NamedArray", variable has type "int")',
    ),
    (
        22,
        'Argument 2 to "__call__" of "NamedJitWrapped" has incompatible type "str"; expected "float"',
    ),
    (23, 'Missing positional argument "lr" in call to "__call__" of "NamedJitWrapped"'),
    # What the runtime refuses: an empty index, bytes, a number as the dtype.
    (24, "NamedArray[...] takes a string of axis names and optionally a dtype"),
    (25, "NamedArray[...] takes a string of axis names and optionally a dtype"),
    (26, "NamedArray['batch embed', 3]: the second argument must be a dtype or dtype category"),
    # A string is a dtype's name, as the runtime reads it: "embed" is none ("bfloat16" and
    # "float32" on lines 29 and 30 are). mypy keeps no value for a float literal (it was shown
    # as None).
    (
        27,
        "NamedArray['batch', 'embed']: 'embed' is not a dtype or dtype category (e.g. "
        "jnp.float32, jnp.floating, jnp.integer).",
    ),
    (
        28,
        "NamedArray['batch embed', <expression>]: the second argument must be a dtype or dtype category",
    ),
]


@pytest.fixture(scope="module")
def mypy_run(tmp_path_factory):
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed; install the test extra: pip install -e '.[test]'")
    mistakes = tmp_path_factory.mktemp("static_typing") / "mistakes.py"
    mistakes.write_text(MISTAKES)
    # A cache kept between runs: the first run analyses jax (tens of seconds), later ones reuse it.
    cache = Path(tempfile.gettempdir()) / "namedaxes-mypy-cache"
    cmd = [
        sys.executable, "-m", "mypy",
        "--config-file", str(ROOT / "pyproject.toml"),
        "--strict",
        "--follow-imports=silent",  # report errors in the checked files, not in jax or namedaxes
        "--cache-dir", str(cache),
        "--no-error-summary",
        str(EXAMPLE), str(mistakes),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 1), f"mypy did not run:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout.splitlines()


def test_typed_example_passes_mypy(mypy_run):
    problems = [line for line in mypy_run if "typed_usage.py" in line]
    assert problems == []
    assert "# type: ignore" not in EXAMPLE.read_text()


@pytest.mark.parametrize(("line", "message"), EXPECTED, ids=[str(n) for n, _ in EXPECTED])
def test_mistakes_are_flagged(mypy_run, line, message):
    at_line = [out for out in mypy_run if f"mistakes.py:{line}: error: " in out]
    assert any(message in out for out in at_line), (
        f"line {line}: expected {message!r}, got {at_line}"
    )


def test_every_mistake_is_accounted_for(mypy_run):
    flagged = {int(out.split(":")[1]) for out in mypy_run if "mistakes.py:" in out}
    assert flagged == {n for n, _ in EXPECTED}


def test_typed_example_runs(capsys):
    import runpy

    runpy.run_path(str(EXAMPLE), run_name="__main__")
    out = capsys.readouterr().out
    assert "totals: [ 3. 12.] peak: 5.0 any > 2: True embed size: 3" in out
    assert "h: NamedArray(float32, batch=2, mlp=4) centered row sums: [0. 0.]" in out
