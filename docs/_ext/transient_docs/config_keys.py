"""``.. transient-config::``: every configuration key, from the package's two YAML files.

``transient_nb/transient.yaml`` gives each key, its default and the comment above it (every key
has one: the house style); ``transient_nb/transient-schema.yaml`` gives its type, its allowed
values and bounds. A key in one file and not the other is a warning (an error with ``-W``), as
``tests/test_config.py`` already insists.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from docutils import nodes
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

from transient_docs.nodes import code, definitions, paragraph, section

logger = logging.getLogger(__name__)

_KEY = re.compile(r"^(\s*)([A-Za-z0-9_-]+):(.*)$")


@dataclass
class Key:
    path: tuple[str, ...]  # without the "transient" namespace
    default: Any
    comment: str
    schema: dict[str, Any]

    @property
    def dotted(self) -> str:
        return ".".join(("transient", *self.path))

    @property
    def env(self) -> str:
        return "DASK_" + "__".join(p.upper().replace("-", "_") for p in ("transient", *self.path))


def comments(text: str) -> dict[tuple[str, ...], str]:
    """Key path -> the comment lines right above it, in a YAML file written as ours is."""
    out: dict[tuple[str, ...], str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        m = _KEY.match(line)
        if not m:
            pending = []
            continue
        indent, key = len(m.group(1)), m.group(2)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key))
        out[tuple(k for _, k in stack)] = " ".join(pending)
        pending = []
    return out


def read(defaults_file: Path, schema_file: Path) -> tuple[list[Key], list[str]]:
    """Every leaf key of the defaults, and the mismatches between the two files."""
    defaults = yaml.safe_load(defaults_file.read_text())
    schema = yaml.safe_load(schema_file.read_text())
    notes = comments(defaults_file.read_text())
    keys: list[Key] = []
    problems: list[str] = []

    def walk(value: Any, spec: dict[str, Any] | None, path: tuple[str, ...]) -> None:
        if spec is None:
            problems.append(f"transient.{'.'.join(path)} has no schema entry")
            spec = {}
        if isinstance(value, dict) and spec.get("type") == "object":
            props = spec.get("properties", {})
            for name in set(props) - set(value):
                problems.append(f"transient.{'.'.join((*path, name))} has no default")
            for name, sub in value.items():
                walk(sub, props.get(name), (*path, name))
            return
        keys.append(Key(path, value, notes.get(("transient", *path), ""), spec))

    walk(defaults["transient"], schema["properties"]["transient"], ())
    return keys, problems


def _default(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, str):
        return value if value else '""'
    return json.dumps(value)


def _type(spec: dict[str, Any]) -> list[nodes.Node]:
    kinds = spec.get("type", "")
    text = " or ".join(kinds) if isinstance(kinds, list) else str(kinds)
    out: list[nodes.Node] = [nodes.Text(text)]
    if "enum" in spec:
        out.append(nodes.Text(": "))
        for i, v in enumerate(spec["enum"]):
            if i:
                out.append(nodes.Text(", "))
            out.append(code(str(v)))
    for word, bound in (("minimum", "at least"), ("exclusiveMinimum", "above")):
        if word in spec:
            out.append(nodes.Text(f", {bound} {spec[word]}"))
    return out


class ConfigDirective(SphinxDirective):
    """One section per group of keys (the top-level ones first), one row per key."""

    def run(self) -> list[nodes.Node]:
        from transient_nb import config

        defaults_file, schema_file = Path(config.DEFAULTS_FILE), Path(config.SCHEMA_FILE)
        for f in (defaults_file, schema_file):
            self.env.note_dependency(str(f))
        keys, problems = read(defaults_file, schema_file)
        for p in problems:
            logger.warning("configuration: %s", p, location=self.get_location())
        groups: dict[str, list[Key]] = {}
        for k in keys:
            groups.setdefault(k.path[0] if len(k.path) > 1 else "", []).append(k)
        out: list[nodes.Node] = [
            paragraph(
                f"{len(keys)} keys, from `transient_nb/{defaults_file.name}` (defaults and what "
                f"each means) and `transient_nb/{schema_file.name}` (types)."
            )
        ]
        for group, members in groups.items():
            title = f"transient.{group}" if group else "transient"
            sec = section(title, "config-" + (group or "top"))
            items: list[Any] = []
            for k in members:
                target = nodes.target("", "", ids=["config-" + "-".join(k.path)])
                self.state.document.note_explicit_target(target)
                facts = nodes.paragraph(
                    "",
                    "",
                    nodes.emphasis("", "Default "),
                    code(_default(k.default)),
                    nodes.Text("; "),
                    *_type(k.schema),
                    nodes.Text("; environment "),
                    code(k.env),
                )
                body = [paragraph(k.comment or str(k.schema.get("description", ""))), facts]
                items.append(([target, code(k.dotted)], body))
            sec += definitions(items)
            out.append(sec)
        return out
