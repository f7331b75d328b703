"""A mkdocs hook: the API reference must document every public name (a warning otherwise, which
``mkdocs build --strict`` turns into a failure).

Public names are those of ``namedaxes`` (without modules) and the ``__all__`` of each documented
subpackage; a name counts as documented when some page of the built site has its anchor,
``namedaxes.<name>`` or ``namedaxes.<subpackage>.<name>``.
"""

from __future__ import annotations

import importlib
import logging
import re
import types
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.api_coverage")

SUBPACKAGES = (
    "nn", "models", "random", "mesh", "rules", "analysis", "checkpoint", "distributed", "kernels",
)  # fmt: skip


def _public(module: types.ModuleType) -> list[str]:
    names = getattr(module, "__all__", None) or [n for n in vars(module) if not n.startswith("_")]
    return [n for n in names if not isinstance(getattr(module, n), types.ModuleType)]


def on_post_build(config: Any, **kwargs: Any) -> None:
    site = Path(config["site_dir"])
    anchors: set[str] = set()
    for page in site.glob("api/**/*.html"):
        anchors |= set(re.findall(r'id="(namedaxes[\w.]*)"', page.read_text(encoding="utf-8")))
    top = importlib.import_module("namedaxes")
    missing = []
    for name in _public(top):
        if f"namedaxes.{name}" not in anchors and not any(
            f"namedaxes.{sub}.{name}" in anchors for sub in SUBPACKAGES
        ):
            missing.append(f"namedaxes.{name}")
    for sub in SUBPACKAGES:
        module = importlib.import_module(f"namedaxes.{sub}")
        missing += [
            f"namedaxes.{sub}.{n}" for n in _public(module) if f"namedaxes.{sub}.{n}" not in anchors
        ]
    if missing:
        log.warning(
            "The API reference does not document %d public name(s): %s. Add them to a page in "
            "docs/api/ (a '::: namedaxes...' block or its members list).",
            len(missing),
            ", ".join(missing),
        )
