"""Who this worker process is: the VM its backend started it on (``TRANSIENT_NB_VM``).

Every backend's worker command line sets ``TRANSIENT_NB_VM`` to a JSON object with the VM's
``name``, ``role``, ``gpu``, ``zone`` and ``spot`` (the local backend, GCE's startup script);
this is the one reader of it.
"""

from __future__ import annotations

import json
import os
from typing import Any

#: The environment variable that carries the VM's identity.
VM_ENV = "TRANSIENT_NB_VM"


def vm_field(key: str) -> str | None:
    """One field of ``TRANSIENT_NB_VM``; None where it is missing or unreadable.

    Examples
    --------
    >>> os.environ[VM_ENV] = '{"name": "w-3", "zone": "us-central1-a"}'
    >>> vm_field("name"), vm_field("gpu")
    ('w-3', None)
    >>> del os.environ[VM_ENV]
    """
    try:
        vm = json.loads(os.environ[VM_ENV])
    except (KeyError, ValueError):
        return None
    value = vm.get(key) if isinstance(vm, dict) else None
    return str(value) if value else None


def vm_name(worker: Any = None) -> str | None:
    """The VM's name as the cluster knows it, else the Dask worker's name (else None)."""
    name = vm_field("name")
    if name is None and worker is not None:
        return str(worker.name)
    return name


def vm_zone() -> str | None:
    """The zone of the VM this process runs on, if its backend said."""
    return vm_field("zone")


def vm_gpu() -> str | None:
    """The GPU type of the VM this process runs on, lower case, as its backend named it."""
    gpu = vm_field("gpu")
    return gpu.lower() if gpu else None
