"""``python -m namedaxes plan``: tables, JSON, search, exit status and errors."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from namedaxes._cli import main

MODEL = textwrap.dedent(
    """
    import jax
    import namedaxes as na

    def state():
        w = na.named(jax.ShapeDtypeStruct((1024, 512), "float32"), ("embed", "mlp"))
        return {"params": {"w": w}, "opt": {"m": w}}

    def scale(tree):
        return jax.tree.map(lambda x: x * 2.0, tree)

    def with_step():
        return {"tree": state(), "step": scale, "rules": {"mlp": "model"}}

    def needs_args(n):
        return state()

    def misspelt():
        return {"tree": state(), "rulez": {"mlp": "model"}}

    def train_state():
        return {**state(), "step": 0}  # a state's own "step" counter: not the inputs form

    def broken():
        raise RuntimeError("factory bug")

    def bad_step(tree):
        raise RuntimeError("step bug")

    def with_bad_step():
        return {"tree": state(), "step": bad_step, "rules": {"mlp": "model"}}

    def args_dict():
        return {"tree": state(), "step": scale, "args": state(), "rules": {"mlp": "model"}}

    def args_without_step():
        return {"tree": state(), "args": (state(),), "rules": {"mlp": "model"}}
    """
)
RULES = '{"mlp": "model"}'


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    (d / "na_cli_model.py").write_text(MODEL)
    sys.path.insert(0, str(d))
    yield d
    sys.path.remove(str(d))


def test_plan_json_and_exit_status(model_dir, capsys):
    code = main(
        [
            "plan",
            "na_cli_model:state",
            "--mesh",
            "data=2,model=4",
            "--rules",
            RULES,
            "--budget",
            "1MiB",
            "--json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["param_count"] == 1024 * 512
    assert out["state_bytes_per_device"] == 2 * 1024 * 512 * 4 // 4
    assert out["fits"] is True and out["headroom_bytes"] == 0 and out["rules"] == [["mlp", "model"]]
    code = main(
        [
            "plan",
            "na_cli_model:state",
            "--mesh",
            "data=2,model=4",
            "--rules",
            RULES,
            "--budget",
            "1000KiB",
        ]
    )
    text = capsys.readouterr().out
    assert code == 1  # does not fit
    assert "state per device       1,048,576 B  1.00 MiB" in text and "does NOT fit" in text


def test_plan_with_factory_step_and_rules(model_dir, capsys):
    code = main(["plan", "na_cli_model:with_step", "--mesh", "data=2,model=4", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["compiled"]["argument_bytes"] == out["state_bytes_per_device"]
    assert out["compiled"]["output_bytes"] >= out["state_bytes_per_device"]  # + the output tuple


SEARCH = [
    "plan",
    "na_cli_model:state",
    "--mesh",
    "data=2,model=4",
    "--search",
    "--budget",
    "600KiB",
]


def test_search_json(model_dir, capsys):
    code = main([*SEARCH, "--top", "2", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert 1 <= len(out["plans"]) <= 2 and out["plans"][0]["fits"] is True
    assert out["plans"][0]["state_bytes_per_device"] == 2 * 1024 * 512 * 4 // 8
    assert out["counts"]["over_budget"] > 0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["na_cli_model:state", "--mesh", "data=2,model=4"], "plan needs --rules"),
        (
            ["na_cli_model:state", "--mesh", "data=2,model=4", "--rules", "{embed"],
            "--rules is not JSON",
        ),
        (
            ["na_cli_model:state", "--mesh", "data=two", "--rules", RULES],
            "'data=two' is not 'axis=size'",
        ),
        (
            ["na_cli_model:state", "--mesh", "data:2,model:4", "--rules", RULES],
            "'data' is no platform. Write the mesh axes with '=': 'data=2,model=4'",
        ),
        (
            ["na_cli_model:needs_args", "--mesh", "data=2", "--rules", RULES],
            "must be callable with no arguments",
        ),
        (["na_cli_model", "--mesh", "data=2", "--rules", RULES], "Expected MODULE:FACTORY"),
        (
            ["na_cli_model:nope", "--mesh", "data=2", "--rules", RULES],
            "Cannot load 'na_cli_model:nope'",
        ),
        (
            [
                "na_cli_model:state",
                "--mesh",
                "data=2,model=4",
                "--rules",
                RULES,
                "--budget",
                "lots",
            ],
            "Cannot read budget 'lots'",
        ),
    ],
)
def test_errors_exit_2_with_a_message(model_dir, capsys, argv, message):
    assert main(["plan", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err


def test_search_refuses_rules(model_dir, capsys):
    """The search chooses the rules: --rules beside --search was silently ignored."""
    argv = ["plan", "na_cli_model:state", "--mesh", "data=2,model=4", "--search"]
    assert main([*argv, "--rules", RULES]) == 2
    assert capsys.readouterr().err == (
        'error: --rules \'{"mlp": "model"}\' with --search: the search chooses the rules. '
        "Drop --rules to search, or --search to plan those rules.\n"
    )


def test_top_without_search_lists_that_many_leaves(model_dir, capsys):
    """--top is plan's own top without --search (it had no effect); plan's default is 10."""
    argv = ["plan", "na_cli_model:state", "--mesh", "data=2,model=4", "--rules", "{}", "--json"]
    assert main([*argv, "--top", "0"]) == 0
    assert json.loads(capsys.readouterr().out)["largest"] == []
    assert main(argv) == 0
    assert len(json.loads(capsys.readouterr().out)["largest"]) == 1  # params/w and opt/m: 1 kind


def test_search_that_fits_nothing_exits_1(model_dir, capsys):
    """No mapping fits: the search's "does not fit" is exit 1, as for one plan, not 2."""
    argv = ["plan", "na_cli_model:state", "--mesh", "data=2,model=4", "--search"]
    assert main([*argv, "--budget", "1KiB"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: No mapping of ['embed', 'mlp'] on Mesh(data=2, model=4) fits")


def test_search_json_that_fits_nothing_prints_a_verdict(model_dir, capsys):
    """With --json, "no mapping fits" is JSON on stdout (as a plan's "fits": false), not nothing."""
    argv = ["plan", "na_cli_model:state", "--mesh", "data=2,model=4", "--search", "--json"]
    assert main([*argv, "--budget", "1KiB"]) == 1
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["fits"] is False and out["plans"] == []
    assert out["error"].startswith("No mapping of ['embed', 'mlp'] on Mesh(data=2, model=4) fits")
    assert captured.err == f"error: {out['error']}\n"


def test_empty_rules_are_rules(model_dir, capsys):
    """`--rules '{}'` plans everything replicated (it was "plan needs --rules")."""
    code = main(
        ["plan", "na_cli_model:state", "--mesh", "data=2,model=4", "--rules", "{}", "--json"]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["rules"] == [] and out["state_bytes_per_device"] == 2 * 1024 * 512 * 4


def test_factory_dict_with_a_misspelt_key(model_dir, capsys):
    argv = ["plan", "na_cli_model:misspelt", "--mesh", "data=2,model=4", "--rules", RULES]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        "error: 'na_cli_model:misspelt' returned a dict with 'tree' and the unknown key(s) "
        "'rulez'; the keys are 'args', 'rules', 'step', 'tree'. Fix the key, or return "
        "{'tree': state} when the state itself has a 'tree' key.\n"
    )
    # A state without a "tree" key is the tree, whatever else it holds.
    argv = ["plan", "na_cli_model:train_state", "--mesh", "data=2,model=4", "--rules", RULES]
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["param_count"] == 1024 * 512


def test_python_dash_m(model_dir):
    env = dict(
        os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join([str(model_dir), *sys.path])
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "namedaxes",
            "plan",
            "na_cli_model:state",
            "--mesh",
            "data=8",
            "--rules",
            '{"embed": "data"}',
            "--json",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["state_bytes_per_device"] == 2 * 1024 * 512 * 4 // 8


@pytest.mark.parametrize(
    "factory, message",
    [
        (
            "broken",
            "error: 'na_cli_model:broken' raised RuntimeError: factory bug. Fix the factory; it "
            "must return the abstract tree, or a dict with 'tree' (and 'step', 'args', 'rules').\n",
        ),
        (
            "with_bad_step",
            "error: Compiling the step on Mesh(data=2, model=4) failed: RuntimeError: step bug. "
            "Fix the step: it raised this when traced",
        ),
        (
            "args_dict",
            "error: plan: args must be a tuple of the step's arguments, e.g. args=(state, batch); "
            "got dict. For a step that takes one argument x, pass args=(x,).\n",
        ),
        ("args_without_step", "error: plan: args needs step=: args are the example arguments"),
    ],
)
def test_factory_and_step_failures_exit_2_with_a_message(model_dir, capsys, factory, message):
    """A crash in the factory or the step is bad input (exit 2), not "does not fit" (exit 1)."""
    argv = ["plan", f"na_cli_model:{factory}", "--mesh", "data=2,model=4"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and "Traceback" not in err


def test_search_json_rejected_rules_are_json_lists(model_dir, capsys):
    assert main([*SEARCH, "--top", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rejected"]
    for r in out["rejected"]:  # the same form as plans[].rules, not a Python repr string
        assert isinstance(r["rules"], list) and all(isinstance(p, list) for p in r["rules"])
    assert isinstance(out["plans"][0]["rules"], list)


class _Terminal(__import__("io").StringIO):
    def isatty(self):
        return True


def test_search_in_a_terminal_shows_what_plain_text_shows(model_dir, capsys, monkeypatch):
    pytest.importorskip("rich")
    assert main([*SEARCH, "--top", "1"]) == 0  # plain text (capsys is no terminal)
    plain = capsys.readouterr().out
    out = _Terminal()
    monkeypatch.setattr(sys, "stdout", out)
    assert main([*SEARCH, "--top", "1"]) == 0
    text = out.getvalue()
    for line in ("plan_search: ", "#1", "Why others lost (examples):", "state per device"):
        assert line in plain and line in text, line
    assert "embed->" in text.split("Why others lost")[1]  # rules as text, not a list repr
