"""The Jupyter Server side of the JupyterLab panel: REST routes and the cluster manager.

Jupyter Server finds it through ``transient_nb._jupyter_server_extension_points``; the routes are
in :mod:`transient_nb.server.handlers`, all state in :mod:`transient_nb.server.manager`.
"""

from __future__ import annotations
