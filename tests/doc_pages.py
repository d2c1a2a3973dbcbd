"""The documentation's pages read as the docs' own MyST parser reads them, and a page's examples
run in order: Python and IPython blocks in one IPython shell (as a notebook runs them), shell
blocks with bash.

``tests/test_docs.py`` runs each page here, in a process of its own::

    python -m tests.doc_pages docs/how-to/cli.md

Kept apart from the test module so that such a process imports only what reading and running a
page needs.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from IPython.core.interactiveshell import InteractiveShell
from markdown_it.renderer import RendererHTML
from myst_parser.config.main import MdParserConfig
from myst_parser.parsers.mdit import create_md_parser

DOCS = Path(__file__).resolve().parents[1] / "docs"

#: Languages of the blocks that run: Python and IPython in one shell, shell blocks with bash.
RUN = {"python": "python", "ipython": "ipython", "bash": "bash"}
#: Languages of blocks that are not code to run (files, outputs, diagrams).
NOT_CODE = {"", "yaml", "text", "json", "toml"}


@dataclass
class Block:
    page: Path
    line: int
    language: str
    code: str
    reason: str | None = None  # why it does not run; None: it runs


@dataclass
class Page:
    path: Path
    blocks: list[Block] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.relative_to(DOCS).as_posix()


def read_page(path: Path) -> Page:
    """The page's fenced blocks, parsed as the docs' own MyST parser parses them."""

    config = MdParserConfig(enable_extensions={"attrs_block", "colon_fence", "deflist"})
    md = create_md_parser(config, RendererHTML)
    page = Page(path)
    for token in md.parse(path.read_text()):
        if token.type != "fence" or token.info.startswith("{"):
            continue
        language = token.info.split()[0] if token.info.strip() else ""
        classes = str(token.attrs.get("class", "")).split()
        reason = str(token.attrs.get("reason", "")) if "no-run" in classes else None
        line = (token.map[0] + 1) if token.map else 0
        page.blocks.append(Block(path, line, language, token.content, reason))
    return page


def pages() -> list[Page]:
    return [
        read_page(p)
        for p in sorted(DOCS.rglob("*.md"))
        if not any(part.startswith("_") for part in p.relative_to(DOCS).parts)
    ]


def runnable_pages() -> list[Page]:
    return [p for p in pages() if any(b.language in RUN and b.reason is None for b in p.blocks)]


def run_page(path: Path) -> None:
    """Run a page's blocks in order: Python and IPython in one shell, shell blocks with bash."""

    page = read_page(path)
    shell = InteractiveShell.instance()
    for b in page.blocks:
        if b.language not in RUN or b.reason is not None:
            continue
        where = f"{page.name}:{b.line}"
        print(f"--- {where} ({b.language})", flush=True)
        if b.language == "bash":
            done = subprocess.run(["bash", "-euo", "pipefail", "-c", b.code], check=False)
            if done.returncode:
                raise SystemExit(f"{where}: the shell block exited with {done.returncode}")
            continue
        result = shell.run_cell(textwrap.dedent(b.code), store_history=False)
        if not result.success:
            raise SystemExit(
                f"{where}: the block failed: {result.error_in_exec or result.error_before_exec!r}"
            )
    print(f"{page.name}: every example ran", flush=True)


if __name__ == "__main__":
    run_page(Path(sys.argv[1]).resolve())
