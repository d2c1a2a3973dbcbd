"""transient_nb's own Sphinx extension: the reference pages generated from the package.

- ``transient-events``: the event vocabulary (:mod:`transient_docs.events`);
- ``transient-config``: the configuration keys (:mod:`transient_docs.config_keys`);
- ``transient-screenshot``: a picture the browser tests took (:mod:`transient_docs.screenshots`);
- ``transient-prices``: VM prices from a shipped price catalog (:mod:`transient_docs.prices`);
- the public API's pages, one per name of ``transient_nb.__all__`` (:mod:`transient_docs.public_api`);
- references to the small offline inventories checked (:mod:`transient_docs.inventories`).

The CLI and the magic are rendered by sphinx-argparse, the magic through one parser joined from
its subcommands' own (:mod:`transient_docs.magic`).
"""

from __future__ import annotations

from typing import Any

from transient_docs import config_keys, events, inventories, prices, public_api, screenshots


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("transient-events", events.EventsDirective)
    app.add_directive("transient-config", config_keys.ConfigDirective)
    app.add_directive("transient-screenshot", screenshots.ScreenshotDirective)
    app.add_directive("transient-prices", prices.PricesDirective)
    app.connect("config-inited", public_api.write_pages)
    app.connect("autodoc-process-signature", public_api.forwarded_signature)
    # After intersphinx (priority 500): our short names (transient_nb.TransientCluster).
    app.connect("missing-reference", public_api.resolve_short_name, priority=600)
    # What is still unresolved then (conf.py sets nitpicky): reported, or left as plain text.
    app.connect("warn-missing-reference", inventories.warn_missing_reference)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
