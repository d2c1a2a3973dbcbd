"""transient_nb's configuration, in dask.config's ``transient`` namespace.

Defaults live in ``transient.yaml`` beside this file; users override them in
``~/.config/dask/transient.yaml``, with ``DASK_TRANSIENT__*`` environment variables or with
``dask.config.set``. Explicit arguments win over configuration, read with
``dask.config.get(key, override_with=value)``.
"""

from __future__ import annotations

import os
from typing import Any

import dask.config
import yaml

_here = os.path.dirname(__file__)
DEFAULTS_FILE = os.path.join(_here, "transient.yaml")
SCHEMA_FILE = os.path.join(_here, "transient-schema.yaml")

with open(DEFAULTS_FILE) as f:
    defaults: dict[str, Any] = yaml.safe_load(f)

# Copy the commented defaults into the user's dask config folder once, as Dask's own packages do,
# so users find every key documented where they edit their settings.
dask.config.ensure_file(source=DEFAULTS_FILE)
dask.config.update_defaults(defaults)


def get(key: str, override_with: Any = None) -> Any:
    """Read ``transient.<key>``, unless ``override_with`` is given (not None).

    Parameters
    ----------
    key
        Dotted key inside the ``transient`` namespace, e.g. ``"replacement.at"``.
    override_with
        An explicit value that wins over the configuration.

    Examples
    --------
    >>> get("backend")
    'local'
    >>> get("workers", override_with=8)
    8
    """
    return dask.config.get(f"transient.{key}", override_with=override_with)
