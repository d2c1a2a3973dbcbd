"""``.. transient-events::``: the event vocabulary, read from ``transient_nb/eventlog/vocabulary.py``.

The kinds and their fields come from ``EVENTS`` itself; what each kind means comes from the
comments beside it in the source (the comment lines above a kind, or the one at the end of its
entry), the groups from the ``# -- group --`` lines, and a field's meaning from the comment on
its line. So the page says what the source says, and a kind added there is on the page at the
next build.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

from transient_docs.nodes import code, definitions, inline, paragraph, section

_GROUP = re.compile(r"^#\s*--\s*(.+?)\s*--\s*$")


@dataclass
class Kind:
    name: str
    group: str
    fields: tuple[str, ...]
    comment: str = ""
    field_notes: dict[str, str] = field(default_factory=dict)


def _comments(source: str) -> dict[int, tuple[str, bool]]:
    """Line number -> (comment text without ``#``, whether the comment is alone on its line)."""
    out = {}
    lines = source.splitlines()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            alone = not lines[row - 1][:col].strip()
            out[row] = (tok.string, alone)
    return out


def _assigned(tree: ast.Module, name: str) -> ast.expr:
    return next(
        node.value
        for node in tree.body
        if isinstance(node, ast.AnnAssign | ast.Assign)
        and node.value is not None
        and name in [t.id for t in _targets(node) if isinstance(t, ast.Name)]
    )


def _element_notes(value: ast.expr, comments: dict[int, tuple[str, bool]]) -> dict[str, str]:
    """The comment beside each string of a tuple written one element a line."""
    notes = {}
    if isinstance(value, ast.Tuple):
        for elt in value.elts:
            if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                note = comments.get(elt.lineno)
                if note and not note[1]:
                    notes[elt.value] = note[0].lstrip("#").strip()
    return notes


def read(path: Path) -> list[Kind]:
    """The kinds of ``EVENTS`` in source order, with their groups and comments.

    A kind without a comment of its own takes the one beside it in ``LIFECYCLE``.
    """
    import transient_nb.eventlog.vocabulary as vocabulary

    source = path.read_text()
    comments = _comments(source)
    tree = ast.parse(source)
    lifecycle = _element_notes(_assigned(tree, "LIFECYCLE"), comments)
    value = _assigned(tree, "EVENTS")
    assert isinstance(value, ast.Dict)
    kinds = []
    group = ""
    previous_end = value.lineno
    for key, val in zip(value.keys, value.values, strict=True):
        assert isinstance(key, ast.Constant) and isinstance(key.value, str)
        above: list[str] = []
        for line in range(previous_end + 1, key.lineno):
            text, alone = comments.get(line, ("", False))
            if not alone:
                continue
            m = _GROUP.match(text)
            if m:
                group, above = m.group(1), []
            else:
                above.append(text.lstrip("#").strip())
        end = val.end_lineno or key.lineno
        beside = comments.get(end)
        comment = " ".join(above)
        if beside and not beside[1] and not comment:
            comment = beside[0].lstrip("#").strip()
        comment = comment or lifecycle.get(key.value, "")
        # A one-line entry's comment is the kind's, not its last field's.
        notes = {
            name: note for name, note in _element_notes(val, comments).items() if end != key.lineno
        }
        if notes and isinstance(val, ast.Tuple) and val.elts and val.elts[-1].lineno == end:
            notes.pop(getattr(val.elts[-1], "value", ""), None)
        kinds.append(Kind(key.value, group, tuple(vocabulary.EVENTS[key.value]), comment, notes))
        previous_end = end
    return kinds


def _targets(node: ast.AnnAssign | ast.Assign) -> list[ast.expr]:
    return [node.target] if isinstance(node, ast.AnnAssign) else list(node.targets)


def _fields(kind: Kind) -> list[nodes.Node]:
    out: list[nodes.Node] = []
    for i, name in enumerate(kind.fields):
        if i:
            out.append(nodes.Text(", "))
        out.append(code(name))
        if name in kind.field_notes:
            out.append(nodes.Text(" ("))
            out.extend(inline(kind.field_notes[name]))
            out.append(nodes.Text(")"))
    return out


class EventsDirective(SphinxDirective):
    """One section per group of kinds, one definition per kind."""

    def run(self) -> list[nodes.Node]:
        import transient_nb.eventlog.vocabulary as vocabulary

        path = Path(vocabulary.__file__)
        self.env.note_dependency(str(path))
        kinds = read(path)
        out: list[nodes.Node] = []
        groups: dict[str, list[Kind]] = {}
        for k in kinds:
            groups.setdefault(k.group or "other", []).append(k)
        for group, members in groups.items():
            sec = section(group[:1].upper() + group[1:], f"events-{_slug(group)}")
            items: list[Any] = []
            for k in members:
                target = nodes.target("", "", ids=[f"event-{k.name}"])
                self.state.document.note_explicit_target(target)
                body: list[nodes.Node] = [paragraph(k.comment)] if k.comment else []
                fields = nodes.paragraph("", "", nodes.emphasis("", "Fields: "), *_fields(k))
                body.append(fields)
                items.append(([target, code(k.name)], body))
            sec += definitions(items)
            out.append(sec)
        out.insert(0, paragraph(f"{len(kinds)} kinds, from `{vocabulary.__name__}.EVENTS`."))
        return out


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
