"""The Jupyter Server extension that serves the JupyterLab panel.

An :class:`~jupyter_server.extension.application.ExtensionApp` rather than a bare loader function,
for one reason: it gets a ``stop_extension`` call when the server shuts down, which is when the
clusters started from the panel (they live in this process) must be closed, or their worker
processes would outlive the server.
"""

from __future__ import annotations

from jupyter_server.extension.application import ExtensionApp
from traitlets import Float

from transient_nb.server.handlers import handlers
from transient_nb.server.manager import ClusterManager


class TransientServerExtension(ExtensionApp):
    """Routes under ``/transient-nb/`` backed by one :class:`ClusterManager`.

    Enabled by ``jupyter_server_config.d/transient_nb.json``, which ``pip install`` puts in
    place; check with ``jupyter server extension list``.
    """

    name = "transient_nb"
    # Serves only an API: no page of its own, and JupyterLab and friends load as usual.
    load_other_extensions = True

    rpc_timeout = Float(
        2.0, config=True, help="Seconds to wait for a scheduler before calling it unreachable."
    )
    answer_timeout = Float(
        5.0, config=True, help="Seconds to wait for a cluster's answer to a control request."
    )

    def initialize_settings(self) -> None:
        self.manager = ClusterManager(
            rpc_timeout=self.rpc_timeout, answer_timeout=self.answer_timeout
        )
        self.settings.update({"transient_nb_manager": self.manager})

    def initialize_handlers(self) -> None:
        self.handlers.extend(handlers())

    async def stop_extension(self) -> None:
        await self.manager.close()
