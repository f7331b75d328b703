"""Where the examples keep what a later run reuses: the tokenized text and JAX's compiled programs.

Both live under one root: ``$NAMEDAXES_CACHE``, else ``$XDG_CACHE_HOME/namedaxes`` (``~/.cache``
by default); ``text/`` holds the tokenizers and token streams (``text_data.py``), ``jax/`` JAX's
persistent compilation cache.

Compiling is most of a short run: on a 2-core CPU the main example's first training step compiles
for several seconds and each prompt shape of ``generate`` for about three. With
``jax_compilation_cache_dir`` set, JAX writes every program that took longer than
``jax_persistent_cache_min_compile_time_secs`` (1 s by default) to compile into that folder, keyed
by the program, its shardings, the devices and the JAX version, and a later run that compiles the
same program reads it back instead. The folder grows without bound unless
``jax_compilation_cache_max_size`` (bytes) is set; delete it to start afresh. JAX trusts what it
reads there (a program is code): keep the folder to yourself.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import jax

__all__ = ["add_compile_cache_option", "cache_root", "use_compile_cache"]


def cache_root() -> Path:
    """``$NAMEDAXES_CACHE``, else ``$XDG_CACHE_HOME/namedaxes`` (``~/.cache/namedaxes``)."""
    if "NAMEDAXES_CACHE" in os.environ:
        return Path(os.environ["NAMEDAXES_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "namedaxes"


def add_compile_cache_option(parser: argparse.ArgumentParser) -> None:
    """``--compile-cache DIR`` (default ``cache_root() / "jax"``) and ``--no-compile-cache``."""
    default = cache_root() / "jax"
    parser.add_argument(
        "--compile-cache",
        metavar="DIR",
        default=str(default),
        help="JAX's persistent compilation cache: programs compiled by an earlier run with the "
        f"same shapes and devices are read back, not compiled again (default: {default})",
    )
    parser.add_argument(
        "--no-compile-cache",
        dest="compile_cache",
        action="store_const",
        const=None,
        help="compile every program, reading and writing no cache",
    )


def use_compile_cache(folder: str | os.PathLike[str] | None) -> None:
    """Read and write compiled programs in ``folder`` (``None``: no cache). Call before compiling."""
    if folder is not None:
        jax.config.update("jax_compilation_cache_dir", os.fspath(Path(folder).expanduser()))
