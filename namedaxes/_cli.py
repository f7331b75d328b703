"""The command line: ``python -m namedaxes plan MODULE:FACTORY --mesh data=32,model=8 ...``.

``FACTORY`` is called with no arguments and returns the abstract state tree, or a dict with a
``"tree"`` key and optionally ``"step"``, ``"args"`` and ``"rules"`` (``--rules`` wins over the
factory's, even ``--rules '{}'``: everything replicated). Such a dict with any other key is
refused as a misspelling; return ``{"tree": state}`` for a state that itself has a ``"tree"``
key. ``--search`` chooses the rules itself: it refuses ``--rules`` and does not use the
factory's. ``--top`` is how many plans the search shows (default 3) or, without ``--search``, how
many of the largest leaves the plan lists (``plan``'s ``top``, default 10). Exit status: 0; 1 when
a ``--budget`` is given and the plan does not fit, or, with ``--search``, no mapping does (with
``--json`` it prints ``{"fits": false, "error": ..., "plans": []}``); 2 on bad input, or when the
factory or the step raises (``error: ...`` says what to fix).
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import traceback
from collections.abc import Sequence
from typing import Any

from ._errors import NamedAxesError, PlanDoesNotFitError, PlanError, format_names
from ._logical._rules import AxisRules
from .analysis import plan, plan_search
from .analysis._compile_target import import_object, parse_axis_sizes

__all__ = ["main"]

_INPUT_KEYS = {"tree", "step", "args", "rules"}


def _load(spec: str) -> dict[str, Any]:
    obj = import_object(
        spec,
        bad_form=f"Expected MODULE:FACTORY, got {spec!r}; e.g. 'mymodel:abstract_state'.",
        hint="Run from the directory holding the module.",
    )
    if not callable(obj):
        raise PlanError(
            f"{spec!r} is not callable; give a function that returns the abstract tree."
        )
    try:
        inspect.signature(obj).bind()
    except TypeError as e:
        raise PlanError(f"{spec!r} must be callable with no arguments ({e}).") from e
    except ValueError:  # no signature (a builtin): just call it
        pass
    try:
        made = obj()
    except Exception as e:  # the user's code: a typed error (exit 2), not a traceback (exit 1)
        raise PlanError(
            f"{spec!r} raised {type(e).__name__}: {e}. Fix the factory; it must return the "
            "abstract tree, or a dict with 'tree' (and 'step', 'args', 'rules')."
        ) from e
    # A dict with a "tree" key is the inputs form (a state with a "step" counter is not); a
    # misspelt key beside "tree" would otherwise plan the whole dict as the tree.
    if not isinstance(made, dict) or "tree" not in made:
        return {"tree": made}
    unknown = [k for k in made if k not in _INPUT_KEYS]
    if unknown:
        raise PlanError(
            f"{spec!r} returned a dict with 'tree' and the unknown key(s) {format_names(unknown)}; "
            f"the keys are {format_names(sorted(_INPUT_KEYS))}. Fix the key, or return "
            "{'tree': state} when the state itself has a 'tree' key."
        )
    return dict(made)


def _rules(text: str | None) -> AxisRules | None:
    if text is None:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise PlanError(
            f'--rules is not JSON ({e}); give e.g. \'{{"embed": "data", "mlp": "model"}}\' or '
            '\'[["embed", "data"], ["embed", null]]\'.'
        ) from e

    def target(v: Any) -> Any:
        return tuple(v) if isinstance(v, list) else v

    if isinstance(data, dict):
        return AxisRules([(k, target(v)) for k, v in data.items()])
    if isinstance(data, list) and all(isinstance(p, list) and len(p) == 2 for p in data):
        return AxisRules([(k, target(v)) for k, v in data])
    raise PlanError(
        f"--rules must be a JSON object or a list of [name, mesh_axes] pairs, got {text!r}."
    )


def _mesh(text: str) -> Any:
    if ":" in text:  # a compile target: "cpu:data=4,model=2", "tpu-v5e-256:data=32,model=8"
        return text
    return parse_axis_sizes(text)


def _show(obj: Any, as_json: bool) -> None:
    if as_json:
        print(json.dumps(obj.to_dict(), indent=2))
        return
    if sys.stdout.isatty():
        try:
            import rich
        except ImportError:  # rich is optional: plain text below
            pass
        else:  # a Plan and a PlanSearch render their str()'s content as rich tables
            rich.print(obj)
            return
    print(obj)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m namedaxes", description="Plan sharded state before you rent it."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "plan", help="per-device memory of a tree under a mapping, or search mappings"
    )
    p.add_argument(
        "factory",
        metavar="MODULE:FACTORY",
        help="returns the abstract tree (or a dict with 'tree', 'step', 'args', 'rules')",
    )
    p.add_argument(
        "--mesh",
        required=True,
        help="'data=32,model=8', or a target 'cpu:data=32,model=8' / 'tpu-v5e-256:data=32,model=8'",
    )
    p.add_argument("--rules", help='JSON: {"embed": "data"} or [["embed", "data"], ...]')
    p.add_argument("--budget", help="bytes per device: 16GiB, 512MB, or an int")
    p.add_argument(
        "--search",
        action="store_true",
        help="search mappings instead of planning one (it chooses the rules: no --rules)",
    )
    p.add_argument(
        "--top",
        type=int,
        help="with --search: plans to show (default 3); without: largest leaves to list "
        "(default 10)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    opts = parser.parse_args(argv)
    try:
        inputs = _load(opts.factory)
        mesh = _mesh(opts.mesh)
        rules = _rules(opts.rules)  # an empty AxisRules is falsy but given: check for None
        step, args = inputs.get("step"), inputs.get("args", ())  # plan checks them
        if opts.search:
            if rules is not None:
                raise PlanError(
                    f"--rules {opts.rules!r} with --search: the search chooses the rules. Drop "
                    "--rules to search, or --search to plan those rules."
                )
            top = 3 if opts.top is None else opts.top
            found = plan_search(
                inputs["tree"], mesh, step=step, args=args, budget=opts.budget, top=top
            )
            _show(found, opts.json)
            fits = found[0].fits
        else:
            if rules is None:
                rules = inputs.get("rules")
            if rules is None:
                raise PlanError(
                    "plan needs --rules (or 'rules' from the factory), or --search to find some."
                )
            more = {} if opts.top is None else {"top": opts.top}  # else plan's own default
            result = plan(
                inputs["tree"], mesh, rules, step=step, args=args, budget=opts.budget, **more
            )
            _show(result, opts.json)
            fits = result.fits
    except PlanDoesNotFitError as e:  # the search's "does not fit": exit 1, as for one plan
        if opts.json:  # a script reading stdout gets a verdict, as a plan that does not fit gives
            print(json.dumps({"fits": False, "error": str(e), "plans": []}, indent=2))
        print(f"error: {e}", file=sys.stderr)
        return 1
    except NamedAxesError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # a bug, not bad input: exit 1 would read as "does not fit"
        traceback.print_exc()
        print(f"error: unexpected {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    return 1 if fits is False else 0
