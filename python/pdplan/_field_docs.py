"""``help()`` for the package's classes: each field's (or enum member's) description is written
once, as the docstring under it (where IDEs and the API reference read it), and Python keeps no
such docstring at run time; so at import it is given to a named tuple's field, or added to the
class's own text under "Fields" ("Members" for an enum)."""

from __future__ import annotations

import ast
import enum
import functools
import inspect
import itertools
import sys
import textwrap


@functools.cache
def _classes_of(module_name: str) -> dict[str, ast.ClassDef]:
    """The top-level classes of a module's source, parsed once; none where it cannot be read."""
    try:
        source = inspect.getsource(sys.modules[module_name])
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError, KeyError):
        return {}
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


def field_docs(cls: type) -> dict[str, str]:
    """Each annotated field of ``cls`` that a docstring follows in its source, with that text;
    nothing where the source cannot be read."""
    node = _classes_of(cls.__module__).get(cls.__qualname__)
    body = node.body if node is not None else []
    docs = {}
    for field, after in itertools.pairwise(body):
        text = getattr(after, "value", None)
        targets: list[ast.expr] = [field.target] if isinstance(field, ast.AnnAssign) else []
        if isinstance(field, ast.Assign) and len(field.targets) == 1:
            targets = field.targets  # an enum member
        if (
            targets
            and isinstance(targets[0], ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(text, ast.Constant)
            and isinstance(text.value, str)
        ):
            docs[targets[0].id] = inspect.cleandoc(text.value)
    return docs


def document_fields(cls: type) -> None:
    """Makes ``help(cls)`` show each field's description."""
    docs = field_docs(cls)
    if not docs:
        return
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        for name, text in docs.items():
            getattr(cls, name).__doc__ = text  # a named tuple's field getter takes a doc
        return
    listed = "\n".join(f"{name}\n{textwrap.indent(text, '    ')}" for name, text in docs.items())
    heading = "Members" if issubclass(cls, enum.Enum) else "Fields"
    cls.__doc__ = f"{inspect.cleandoc(cls.__doc__ or '')}\n\n{heading}:\n\n{listed}"
