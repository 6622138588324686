"""Every name the API reference shows is described, and every parameter too.

The reference (docs/reference/api.md) is mkdocstrings' Python handler rendering the objects its
``::: name`` directives name, through griffe, with the options of mkdocs.yml. This test loads
the imported package the same way (the stub ``_core.pyi`` stands for the compiled module, as
``allow_inspection: false`` makes it), walks each object and the members the handler shows,
and fails, naming every offender at once, on:

- an object with no description: a function or method, a class, a property (its own
  docstring), a field, attribute or enum member (its own docstring, or an ``:ivar name:`` of
  its class's docstring);
- a docstring that names a parameter (``:param name:``) its signature lacks, or an attribute
  (``:ivar name:``) its class lacks;
- a signature parameter the docstring does not describe (not ``self``/``cls``; ``*args`` and
  ``**kwargs`` only where named). A class's parameters are its constructor's (``__init__``,
  shown on the class with ``merge_init_into_class``; ``__new__`` in a compiled class's stub;
  or its dataclass or NamedTuple fields), described by a ``:param:`` of the class's or the
  constructor's docstring or, for a field, by the field's own description.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import griffe
import pytest

import pdplan

ROOT = Path(__file__).resolve().parent.parent
API = ROOT / "docs" / "reference" / "api.md"
MKDOCS = ROOT / "mkdocs.yml"
#: The directory the imported pdplan sits in (site-packages under scripts/test_wheel.sh).
PACKAGE_ROOT = Path(pdplan.__file__).resolve().parent.parent

#: The handler options the checker mirrors, as mkdocs.yml must give them.
MIRRORED = {
    "docstring_style": "sphinx",
    "filters": ["!^_"],
    "merge_init_into_class": True,
    "allow_inspection": False,
    "show_if_no_docstring": True,
}


def handler_options() -> dict[str, Any]:
    """mkdocs.yml's options of the Python handler (``key: value`` lines, JSON-ish values)."""
    text = MKDOCS.read_text(encoding="utf-8")
    block = re.search(r"\n(\s+)python:\n\s+options:\n((?:\1\s+\S.*\n)+)", text)
    assert block, "mkdocs.yml has no python handler options"
    options: dict[str, Any] = {}
    for line in block.group(2).splitlines():
        if line.strip().startswith("#"):
            continue
        key, _, value = line.strip().partition(": ")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def directives() -> list[str]:
    """The objects the reference shows, in its order."""
    return re.findall(r"^::: (\S+)\s*$", API.read_text(encoding="utf-8"), re.M)


def keep(name: str, filters: list[str]) -> bool:
    """Whether the handler's ``filters`` show a member named ``name`` (mkdocstrings' rule: the
    last matching filter decides; without a match, kept unless every filter includes)."""
    kept = None
    for pattern in filters:
        exclude = pattern.startswith("!")
        if re.search(pattern[1:] if exclude else pattern, name):
            kept = not exclude
    if kept is None:
        return any(pattern.startswith("!") for pattern in filters) or not filters
    return kept


def sections(obj: griffe.Object | griffe.Alias) -> list[griffe.DocstringSection]:
    return obj.docstring.parsed if obj.docstring is not None else []


def text_of(obj: griffe.Object | griffe.Alias) -> str:
    """The docstring's prose, without its fields."""
    return "\n".join(
        str(s.value) for s in sections(obj) if s.kind is griffe.DocstringSectionKind.text
    ).strip()


def field_names(obj: griffe.Object | griffe.Alias, kind: griffe.DocstringSectionKind) -> list[str]:
    """The names of a docstring's ``:param:`` (``kind=parameters``) or ``:ivar:`` fields."""
    return [item.name.lstrip("*") for s in sections(obj) if s.kind is kind for item in s.value]


PARAMETERS = griffe.DocstringSectionKind.parameters
ATTRIBUTES = griffe.DocstringSectionKind.attributes


def signature(function: griffe.Function) -> tuple[list[str], set[str]]:
    """A function's parameters a docstring must describe, and the names it may describe (those
    and ``*args``, ``**kwargs``); without the leading ``self`` or ``cls``."""
    params = list(function.parameters)
    if params and params[0].name in ("self", "cls"):
        params = params[1:]
    starred = {griffe.ParameterKind.var_positional, griffe.ParameterKind.var_keyword}
    required = [p.name for p in params if p.kind not in starred]
    return required, {p.name for p in params}


def is_namedtuple(cls: griffe.Class) -> bool:
    return any(str(base).split(".")[-1] == "NamedTuple" for base in cls.bases)


def fields(cls: griffe.Class) -> list[griffe.Attribute]:
    """A dataclass's or NamedTuple's fields: its annotated attributes that are not ClassVars."""
    return [
        m
        for m in cls.members.values()
        if isinstance(m, griffe.Attribute)
        and "instance-attribute" in m.labels
        and "property" not in m.labels
    ]


class Checker:
    """Walks objects as the handler shows them and collects what is wrong."""

    def __init__(self, filters: list[str]) -> None:
        self.filters = filters
        self.problems: list[str] = []
        self.entries = 0
        self.described = 0

    def fault(self, path: str, problem: str) -> None:
        self.problems.append(f"{path}: {problem}")

    def entry(self, path: str, described: bool) -> None:
        self.entries += 1
        if described:
            self.described += 1
        else:
            self.fault(path, "no description")

    def shown(self, obj: griffe.Object) -> Iterator[griffe.Object]:
        """The members the handler shows: declared here (not inherited), kept by the filters;
        a module's imported names only where public."""
        for name, member in obj.members.items():
            if not keep(name, self.filters):
                continue
            if member.is_alias:
                if obj.is_module and not member.is_public:
                    continue
                member = member.final_target
            yield member

    def check(self, obj: griffe.Object | griffe.Alias, path: str | None = None) -> None:
        target = obj.final_target if obj.is_alias else obj
        path = path or obj.path
        if isinstance(target, griffe.Class):
            self.check_class(target, path)
        elif isinstance(target, griffe.Function):
            self.check_function(target, path)
        elif isinstance(target, griffe.Module):
            self.entry(path, bool(text_of(target)))
            for member in self.shown(target):
                self.check(member, f"{path}.{member.name}")
        else:
            self.entry(path, bool(text_of(target)))

    def check_function(self, function: griffe.Function, path: str) -> None:
        self.entry(path, bool(text_of(function)))
        self.check_parameters(path, signature(function), field_names(function, PARAMETERS), [])

    def check_parameters(
        self,
        path: str,
        params: tuple[list[str], set[str]],
        documented: list[str],
        described_otherwise: list[str],
    ) -> None:
        required, allowed = params
        for name in documented:
            if name not in allowed:
                problem = f"the docstring names parameter {name!r}, which the signature lacks"
                self.fault(path, problem)
        for name in required:
            if name not in documented and name not in described_otherwise:
                self.fault(path, f"parameter {name!r} is not described (:param {name}:)")

    def check_class(self, cls: griffe.Class, path: str) -> None:
        self.entry(path, bool(text_of(cls)))
        ivars = field_names(cls, ATTRIBUTES)
        for name in ivars:
            if name not in cls.members:
                self.fault(path, f"the docstring names attribute {name!r}, which the class lacks")
        # The constructor, shown on the class (merge_init_into_class); a compiled class's
        # stub declares ``__new__`` instead.
        init = cls.members.get("__init__") or cls.members.get("__new__")
        documented = field_names(cls, PARAMETERS)
        own_fields = fields(cls)
        described_fields = [f.name for f in own_fields if text_of(f) or f.name in ivars]
        if isinstance(init, griffe.Function):
            documented += field_names(init, PARAMETERS)
            self.check_parameters(path, signature(init), documented, described_fields)
        elif is_namedtuple(cls):
            names = [f.name for f in own_fields]
            self.check_parameters(path, (names, set(names)), documented, described_fields)
        else:
            self.check_parameters(path, ([], set()), documented, [])
        for member in self.shown(cls):
            member_path = f"{path}.{member.name}"
            if isinstance(member, griffe.Attribute):
                # A property is described where it is defined; a field may be in the class's.
                in_class = "property" not in member.labels and member.name in ivars
                self.entry(member_path, bool(text_of(member)) or in_class)
            else:
                self.check(member, member_path)


def load(options: dict[str, Any]) -> griffe.GriffeLoader:
    """The imported package, loaded as mkdocstrings' handler loads it."""
    loader = griffe.GriffeLoader(
        extensions=griffe.load_extensions(),
        search_paths=[str(PACKAGE_ROOT), *(p for p in sys.path if p)],
        docstring_parser=griffe.Parser(options["docstring_style"]),
        allow_inspection=options["allow_inspection"],
    )
    loader.load("pdplan", try_relative_path=False)
    loader.resolve_aliases(implicit=False, external=None)
    return loader


def check_reference() -> Checker:
    options = handler_options()
    loader = load(options)
    checker = Checker(options["filters"])
    for name in directives():
        checker.check(loader.modules_collection[name])
    return checker


def test_the_checker_mirrors_the_handler_options() -> None:
    options = handler_options()
    differ = {k: (options.get(k), v) for k, v in MIRRORED.items() if options.get(k) != v}
    assert not differ, f"mkdocs.yml's handler options (found, mirrored) changed: {differ}"


def test_the_reference_reads_the_installed_package_and_the_stub() -> None:
    loader = load(handler_options())
    loaded = Path(loader.modules_collection["pdplan"].filepath).resolve()
    assert loaded.parent == PACKAGE_ROOT / "pdplan"
    assert Path(loader.modules_collection["pdplan._core"].filepath).name == "_core.pyi"
    assert len(directives()) > 50


def test_every_name_in_the_reference_is_described() -> None:
    checker = check_reference()
    assert checker.entries > 250
    problems = "\n".join(checker.problems)
    assert not checker.problems, f"{len(checker.problems)} problems:\n{problems}"


#: Each fault the checker catches, once: a module whose objects carry them.
FIXTURE = '''
"""A module of faults."""
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple


def bare(x: int) -> int:
    return x


def extra(x: int) -> int:
    """Names a parameter it lacks.

    :param x: a number.
    :param y: not a parameter.
    """
    return x


def missing(x: int, *args: int, y: int = 0, **kwargs: int) -> int:
    """Describes one of its parameters.

    :param x: a number.
    """
    return x


def fine(x: int, *args: int) -> int:
    """Describes all of its parameters.

    :param x: a number.
    :param args: more numbers.
    """
    return x


@dataclass
class Fields:
    """A dataclass.

    :ivar a: described here.
    :ivar gone: not a field.
    """

    a: int
    b: int
    c: int = 0
    """Described by its own docstring."""

    @property
    def plain(self) -> int:
        return 0

    def _private(self) -> None:
        pass


class Pair(NamedTuple):
    left: int
    """The left one."""
    right: int


class Kind(Enum):
    """An enum."""

    ONE = "one"
    """The first."""
    TWO = "two"


class Built:
    """Built from two numbers.

    :param z: not a parameter.
    """

    def __init__(self, x: int, y: int) -> None:
        """:param x: the first."""

    def method(self, n: int) -> None:
        """Does nothing; describes nothing."""


class Native:
    """Made by ``__new__``, as a compiled class's stub declares it."""

    def __new__(cls, x: int, y: int) -> "Native":
        """:param x: the first."""
        return object.__new__(cls)
'''


def test_the_checker_catches_each_fault() -> None:
    parser = griffe.Parser(MIRRORED["docstring_style"])
    with griffe.temporary_visited_package(
        "faults",
        {"__init__.py": FIXTURE},
        extensions=griffe.load_extensions(),
        docstring_parser=parser,
    ) as package:
        checker = Checker(MIRRORED["filters"])
        checker.check(package)
    assert sorted(checker.problems) == sorted(
        [
            "faults.bare: no description",
            "faults.bare: parameter 'x' is not described (:param x:)",
            "faults.extra: the docstring names parameter 'y', which the signature lacks",
            "faults.missing: parameter 'y' is not described (:param y:)",
            "faults.Fields: the docstring names attribute 'gone', which the class lacks",
            "faults.Fields: parameter 'b' is not described (:param b:)",
            "faults.Fields.b: no description",
            "faults.Fields.plain: no description",
            "faults.Pair: no description",
            "faults.Pair: parameter 'right' is not described (:param right:)",
            "faults.Pair.right: no description",
            "faults.Kind.TWO: no description",
            "faults.Built: the docstring names parameter 'z', which the signature lacks",
            "faults.Built: parameter 'y' is not described (:param y:)",
            "faults.Built.method: parameter 'n' is not described (:param n:)",
            "faults.Native: parameter 'y' is not described (:param y:)",
        ]
    )
    # Everything else was looked at and found described.
    assert checker.entries - checker.described == 6


@pytest.mark.parametrize(
    ("filters", "name", "kept"),
    [(["!^_"], "_private", False), (["!^_"], "public", True), (["^a"], "b", False)],
)
def test_filters_as_the_handler_applies_them(filters: list[str], name: str, kept: bool) -> None:
    assert keep(name, filters) is kept


def stub_texts() -> dict[str, str]:
    """The reference's text of each compiled name, from the stub it reads: ``name`` or
    ``Class.member``; a class's ``__new__`` text follows its own (as ``help()`` shows it)."""
    import ast

    stub = PACKAGE_ROOT / "pdplan" / "_core.pyi"
    texts: dict[str, str] = {}
    for node in ast.parse(stub.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef) and ast.get_docstring(node):
            texts[node.name] = ast.get_docstring(node) or ""
        elif isinstance(node, ast.ClassDef):
            own = ast.get_docstring(node) or ""
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and ast.get_docstring(item):
                    text = ast.get_docstring(item) or ""
                    if item.name == "__new__":
                        own = f"{own}\n\n{text}"
                    else:
                        texts[f"{node.name}.{item.name}"] = text
            if own:
                texts[node.name] = own
    return texts


def test_help_shows_the_reference_s_text_of_every_compiled_name() -> None:
    # One text: what help() and IDEs' hover show of the compiled module is the stub's, which
    # the API reference renders (scripts/stub_docs.py writes the bindings' doc comments).
    import inspect

    from pdplan import _core

    texts = stub_texts()
    assert len(texts) > 30 and "decode_transfer_fragments" in texts
    differing = []
    for name, text in texts.items():
        owner, _, member = name.partition(".")
        obj = getattr(_core, owner)
        if member:
            obj = getattr(obj, member) if callable(getattr(obj, member)) else None
            obj = obj or inspect.getattr_static(getattr(_core, owner), member)
        if inspect.getdoc(obj) != inspect.cleandoc(text):
            differing.append(name)
    assert not differing, f"help() differs from the stub for {differing}"


def test_help_shows_every_public_description() -> None:
    # Every public name, its members, and each field of a dataclass or named tuple: the
    # descriptions griffe reads from the source (the reference's) appear in help()'s text.
    import pydoc

    loader = load(handler_options())
    package = loader.modules_collection["pdplan"]
    silent = []
    for name in pdplan.__all__:
        obj = getattr(pdplan, name)
        if not callable(obj) and not isinstance(obj, type):
            continue  # constants: described in the reference and the stub only
        text = pydoc.render_doc(obj, renderer=pydoc.plaintext)
        described = package[name]
        if described.is_alias:
            described = described.final_target
        if described.docstring and described.docstring.value.split("\n")[0] not in text:
            silent.append(name)
        for member_name, member in getattr(described, "members", {}).items():
            if member_name.startswith("_") or not member.docstring:
                continue
            first = member.docstring.value.strip().split("\n")[0].strip()
            if first not in text:
                silent.append(f"{name}.{member_name}")
    assert not silent, f"help() does not show the descriptions of {silent}"
