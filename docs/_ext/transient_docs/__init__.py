"""transient_nb's own Sphinx extension: the reference pages generated from the package.

- ``transient-events``: the event vocabulary (:mod:`transient_docs.events`);
- ``transient-config``: the configuration keys (:mod:`transient_docs.config_keys`);
- ``transient-screenshot``: a picture the browser tests took (:mod:`transient_docs.screenshots`);
- the public API's pages, one per name of ``transient_nb.__all__`` (:mod:`transient_docs.public_api`);
- references to the small offline inventories checked (:mod:`transient_docs.inventories`).

The CLI and the magic are rendered by sphinx-argparse, the magic through one parser joined from
its subcommands' own (:mod:`transient_docs.magic`).
"""

from __future__ import annotations

from typing import Any

from transient_docs import config_keys, events, inventories, public_api, screenshots


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("transient-events", events.EventsDirective)
    app.add_directive("transient-config", config_keys.ConfigDirective)
    app.add_directive("transient-screenshot", screenshots.ScreenshotDirective)
    app.connect("config-inited", public_api.write_pages)
    # After intersphinx (priority 500): first our short names, then what is left over.
    app.connect("missing-reference", public_api.resolve_short_name, priority=600)
    app.connect("missing-reference", inventories.missing_reference, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
