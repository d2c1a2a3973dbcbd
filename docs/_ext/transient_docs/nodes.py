"""Docutils nodes built from plain text: tables and inline code, with nothing to escape.

The generated reference pages take their text from comments in the package's source and YAML.
Building nodes directly (rather than writing reST and parsing it) means a ``*`` or a stray
backquote in a comment can never break the build.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TypeAlias

from docutils import nodes

_CODE = re.compile(r"``([^`]+)``|`([^`]+)`")


def inline(text: str) -> list[nodes.Node]:
    """``text`` with its backquoted spans (single or double) as inline code."""
    out: list[nodes.Node] = []
    pos = 0
    for m in _CODE.finditer(text):
        if m.start() > pos:
            out.append(nodes.Text(text[pos : m.start()]))
        code = m.group(1) or m.group(2)
        out.append(nodes.literal(code, code))
        pos = m.end()
    if pos < len(text):
        out.append(nodes.Text(text[pos:]))
    return out


def paragraph(text: str) -> nodes.paragraph:
    para = nodes.paragraph()
    para.extend(inline(text))
    return para


Cell: TypeAlias = str | nodes.Node | Sequence[nodes.Node]


def table(
    header: Sequence[str], rows: Sequence[Sequence[Cell]], widths: Sequence[int]
) -> nodes.table:
    """A table node; a cell is text (backquotes become code), a node, or a list of nodes."""
    tab = nodes.table(classes=["transient-reference"])
    group = nodes.tgroup(cols=len(header))
    tab += group
    for w in widths:
        group += nodes.colspec(colwidth=w)
    head = nodes.thead()
    group += head
    head += _row(header)
    body = nodes.tbody()
    group += body
    for r in rows:
        body += _row(r)
    return tab


def _row(cells: Sequence[Cell]) -> nodes.row:
    row = nodes.row()
    for cell in cells:
        entry = nodes.entry()
        if isinstance(cell, str):
            entry += paragraph(cell)
        elif isinstance(cell, nodes.Node):
            entry += cell
        elif cell and all(isinstance(c, nodes.paragraph) for c in cell):
            entry.extend(cell)
        else:
            entry += nodes.paragraph("", "", *cell)
        row += entry
    return row


def definitions(
    items: Sequence[tuple[Sequence[nodes.Node], Sequence[nodes.Node]]],
) -> nodes.definition_list:
    """A definition list: each item a term (inline nodes) and its body (block nodes)."""
    out = nodes.definition_list(classes=["transient-reference"])
    for term, body in items:
        item = nodes.definition_list_item()
        item += nodes.term("", "", *term)
        definition = nodes.definition()
        definition.extend(body)
        item += definition
        out += item
    return out


def code(text: str) -> nodes.literal:
    return nodes.literal(text, text)


def section(title: str, ids: str) -> nodes.section:
    sec = nodes.section(ids=[ids])
    sec += nodes.title(title, title)
    return sec
