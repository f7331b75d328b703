"""A griffe extension for the docs build: read a Google-style ``Example:`` section as examples.

namedaxes docstrings title their doctest section ``Example:`` (singular); griffe's Google parser
only knows ``Examples:`` and would render the singular one as an admonition of plain text, so the
``>>>`` lines would lose their code formatting. Renaming the title before parsing keeps the
docstrings as they are.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from typing import Any

import griffe

_TITLE = re.compile(r"^(\s*)Example:[ \t]*$", re.MULTILINE)
# Sphinx roles (:func:`plan`) read as literal text in Markdown: show the name as code instead.
_ROLE = re.compile(r":(?:func|class|meth|attr|mod|data|exc|obj):`~?([^`]+)`")


def _markdown(text: str) -> str:
    return _ROLE.sub(r"`\1`", _TITLE.sub(r"\1Examples:", text))


class ExampleSections(griffe.Extension):
    """Rewrite ``Example:`` section titles to ``Examples:`` on every loaded object."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _markdown(obj.docstring.value)


class RedundantAliasExports(griffe.Extension):
    """Treat ``from ._x import Y as Y`` in a module without ``__all__`` as a public re-export.

    That is the convention of ``namedaxes/__init__.py`` (PEP 484's explicit re-export form); griffe
    otherwise hides imported names, so ``::: namedaxes`` would list none of them.
    """

    def on_module_members(self, *, node: Any, mod: griffe.Module, **kwargs: Any) -> None:
        if mod.exports or not isinstance(node, ast.Module):
            return
        for stmt in node.body:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                for alias in stmt.names:
                    if (
                        alias.asname is not None
                    ):  # `Y as Y`, or a rename such as `slice_axis as slice`
                        member = mod.members.get(alias.asname)
                        if member is not None and not alias.asname.startswith("_"):
                            member.public = True


_KINDS = {
    inspect.Parameter.POSITIONAL_ONLY: griffe.ParameterKind.positional_only,
    inspect.Parameter.POSITIONAL_OR_KEYWORD: griffe.ParameterKind.positional_or_keyword,
    inspect.Parameter.VAR_POSITIONAL: griffe.ParameterKind.var_positional,
    inspect.Parameter.KEYWORD_ONLY: griffe.ParameterKind.keyword_only,
    inspect.Parameter.VAR_KEYWORD: griffe.ParameterKind.var_keyword,
}


def _text(annotation: Any) -> str | None:
    if annotation is inspect.Parameter.empty:
        return None
    return (
        annotation
        if isinstance(annotation, str)
        else getattr(annotation, "__name__", repr(annotation))
    )


class LiftedFunctions(griffe.Extension):
    """Document table-built ops (``abs = _lift("abs", jnp.abs, 1)``) as the functions they are.

    Static analysis sees an attribute assigned from a call; the runtime object is a function with
    a signature and a full docstring, which this reads (importing the module) and puts in its place.
    """

    def on_module_members(self, *, mod: griffe.Module, **kwargs: Any) -> None:
        if not mod.path.startswith("namedaxes._ops"):
            return
        runtime = None
        for name, member in list(mod.members.items()):
            if (
                member.is_alias
                or not member.is_attribute
                or not str(member.value).startswith("_lift(")
            ):
                continue
            runtime = runtime or importlib.import_module(mod.path)
            fn = getattr(runtime, name)
            sig = inspect.signature(fn)
            params = griffe.Parameters(
                *(
                    griffe.Parameter(
                        p.name,
                        kind=_KINDS[p.kind],
                        annotation=_text(p.annotation),
                        default=None if p.default is inspect.Parameter.empty else repr(p.default),
                    )
                    for p in sig.parameters.values()
                )
            )
            func = griffe.Function(
                name,
                parameters=params,
                returns=_text(sig.return_annotation),
                lineno=member.lineno,
                endlineno=member.endlineno,
            )
            text = _markdown(inspect.cleandoc(fn.__doc__ or ""))
            # Operands are untyped in the signature on purpose (NamedArray or scalar): no type warning.
            func.docstring = griffe.Docstring(
                text,
                lineno=member.lineno,
                parent=func,
                parser="google",
                parser_options={"warn_missing_types": False},
            )
            mod.set_member(name, func)
