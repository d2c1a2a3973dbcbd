"""``.. transient-prices::``: hourly prices of worker and PS VMs, read from a price catalog.

Each line of the content is ``label | gpu | machine type`` (``-`` for no GPU: the PS host); the
prices come from the catalog shipped in the package, so the table changes when the catalog does.
"""

from __future__ import annotations

from typing import Any

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.util.docutils import SphinxDirective

from transient_docs.nodes import paragraph, table


class PricesDirective(SphinxDirective):
    has_content = True
    option_spec = {"catalog": directives.unchanged_required, "zone": directives.unchanged_required}

    def run(self) -> list[nodes.Node]:
        from transient_nb.catalog.prices import PriceCatalog

        catalog = PriceCatalog.load(self.options.get("catalog", "gce-2025"))
        zone = self.options.get("zone", "us-central1-a")
        rows: list[Any] = []
        for line in self.content:
            if not line.strip():
                continue
            label, gpu, machine = (part.strip() for part in line.split("|"))
            price = catalog.worker_price(None if gpu == "-" else gpu, machine, zone)
            spot = f"{price.spot:.3f}" if gpu != "-" else "–"
            rows.append([label, spot, f"{price.on_demand:.3f}"])
        return [
            table(["VM", "Spot $/h", "on demand $/h"], rows, [60, 20, 20]),
            paragraph(
                f"Catalog `{catalog.name}` of {catalog.date}, zone `{zone}`; GPU and machine "
                f"type together; billed per second with a {catalog.minimum_s:.0f}-second minimum."
            ),
        ]
