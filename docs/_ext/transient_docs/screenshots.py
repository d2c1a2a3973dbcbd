"""``.. transient-screenshot:: NAME.png``: a picture the browser tests took, or a note that says how.

The browser tests (``tests/test_notebook_browser.py``, ``tests/test_labextension_browser.py``)
save what they see into ``docs/_screenshots/`` (ignored by git), so the pictures are of the code
as it is. A checkout where they have not run yet still builds: the page then says which test
makes the picture instead of showing it (a note, not a warning).
"""

from __future__ import annotations

from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.util.docutils import SphinxDirective

from transient_docs.nodes import paragraph

#: The folder the browser tests write into, relative to the docs' source folder.
FOLDER = "_screenshots"


class ScreenshotDirective(SphinxDirective):
    required_arguments = 1
    has_content = True
    option_spec = {"alt": directives.unchanged_required, "test": directives.unchanged_required}

    def run(self) -> list[nodes.Node]:
        name = self.arguments[0]
        path = Path(self.env.srcdir) / FOLDER / name
        caption = " ".join(self.content) if self.content else ""
        test = self.options.get("test", "the browser tests")
        if not path.exists():
            note = nodes.note()
            note += paragraph(
                f"{caption} (The picture `{name}` is taken by `{test}`; it is not in this "
                f"checkout yet. Run `python -m pytest {test.split('::')[0]}` and build again.)"
            )
            return [note]
        self.env.note_dependency(str(path))
        fig = nodes.figure(classes=["transient-screenshot"])
        # A path from the source folder: Sphinx's image collector finds it and copies it.
        fig += nodes.image(uri=f"/{FOLDER}/{name}", alt=self.options.get("alt", caption or name))
        if caption:
            fig += nodes.caption("", "", *paragraph(caption).children)
        return [fig]
