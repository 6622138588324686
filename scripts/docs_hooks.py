"""MkDocs hooks: tables the docs show are written from the core's own schemas, so a page can
never disagree with the code. A page asks for one with a marker comment:

    <!-- generated:layer-kinds -->   every layer kind, its class, fields and what it keeps
    <!-- generated:limits -->        every bound of pdplan.limits
    <!-- generated:contributing -->  CONTRIBUTING.md, its links made the site's

`tests/test_docs.py` calls `expand` on every page, as the docs build does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pdplan import _core


def layer_kinds_table() -> str:
    rows = ["| class (`kind`) | fields | keeps |", "| --- | --- | --- |"]
    for kind, cls, keeps, fields in _core.LAYER_KINDS:
        shown = []
        for name, ty, default, doc in fields:
            value = f" = {default}" if default is not None else (" = None" if "None" in ty else "")
            shown.append(f"`{name}: {ty}{value}` ({doc})")
        rows.append(f"| `{cls}` (`{kind}`) | {'; '.join(shown) or '—'} | {keeps} |")
    return "\n".join(rows)


def limits_table() -> str:
    rows = ["| `pdplan.limits.` | accepted | what to do past it |", "| --- | --- | --- |"]
    for name, least, most, unit, advice in _core.LIMITS:
        rows.append(f"| `{name}` | {least:,} to {most:,} {unit} | {advice or '—'} |")
    return "\n".join(rows)


def contributing() -> str:
    """CONTRIBUTING.md as the site shows it: its links are from the repository's root."""
    text = (Path(__file__).resolve().parent.parent / "CONTRIBUTING.md").read_text(encoding="utf-8")
    return text.replace("](docs/", "](")


TABLES = {"layer-kinds": layer_kinds_table, "limits": limits_table, "contributing": contributing}


def expand(markdown: str) -> str:
    for name, table in TABLES.items():
        markdown = markdown.replace(f"<!-- generated:{name} -->", table())
    return markdown


def on_page_markdown(markdown: str, **_: Any) -> str:
    return expand(markdown)
