"""A small on-disk registry of running clusters, so that every view can find every cluster.

Each running :class:`~transient_nb.deploy.cluster.TransientCluster` writes ``NAME.json`` into
``transient.registry-dir`` and removes it when it closes. An entry whose owning process is gone
(a crashed kernel) is reported as stale rather than hidden.

A detached GCE cluster's entry is written by the client that created its head VM and names that
VM (``head_vm``) instead of a local pid. Such an entry is never stale here: whether the VM still
runs is a question for the Compute API, which ``connect()`` asks (and forgets the entry when the
head is gone), as do ``shutdown()``, ``transient-nb down`` and ``sweep``.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Mapping
from typing import Any

import psutil

from transient_nb import config
from transient_nb.backends.tls import CLIENT_CN


def registry_dir(path: str | None = None) -> str:
    """The registry folder (created if needed)."""
    folder = os.path.expanduser(config.get("registry-dir", override_with=path))
    os.makedirs(folder, exist_ok=True)
    return folder


def _pid_alive(pid: int) -> bool:
    # A zombie (a head that exited before its parent reaped it) is gone for our purposes.
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def register(name: str, info: dict[str, Any], path: str | None = None) -> str:
    """Write (atomically) the entry of cluster ``name``; returns its file path."""
    folder = registry_dir(path)
    entry = {"name": name, "pid": os.getpid(), "registered": time.time(), **info}
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(entry, f)
    target = os.path.join(folder, f"{name}.json")
    os.replace(tmp, target)
    return target


def unregister(name: str, path: str | None = None) -> None:
    """Remove the entry of cluster ``name`` if it is there."""
    try:
        os.remove(os.path.join(registry_dir(path), f"{name}.json"))
    except FileNotFoundError:
        pass


def entries(path: str | None = None) -> list[dict[str, Any]]:
    """Every registered cluster, each with ``stale=True`` when its owning process is gone."""
    folder = registry_dir(path)
    out = []
    for fname in sorted(os.listdir(folder)):
        if not fname.endswith(".json") or fname.startswith("."):
            continue
        try:
            with open(os.path.join(folder, fname)) as f:
                entry = json.load(f)
        except (OSError, json.JSONDecodeError):
            continue
        if entry.get("head_vm"):
            entry["stale"] = False  # owned by a VM: checked through the API on connect
        else:
            entry["stale"] = not _pid_alive(int(entry.get("pid") or -1))
        out.append(entry)
    return out


def lookup(name: str, path: str | None = None) -> dict[str, Any]:
    """The entry of cluster ``name``; ``KeyError`` listing the known names otherwise."""
    for entry in entries(path):
        if entry["name"] == name:
            return entry
    known = ", ".join(e["name"] for e in entries(path)) or "none"
    raise KeyError(f"No transient cluster named {name!r} is registered (known: {known}).")


def check_free(name: str, path: str | None = None) -> None:
    """Raise ``ValueError`` if a live cluster (not a stale entry) already has ``name``."""
    for entry in entries(path):
        if entry["name"] == name and not entry["stale"]:
            raise ValueError(
                f"A transient cluster named {name!r} is already running ({owner(entry)}): "
                "pick another name, or connect to it."
            )


def owner(entry: dict[str, Any]) -> str:
    """Who owns a registered cluster, in words (``head VM demo-head``, ``kernel pid 123``)."""
    head = entry.get("head_vm")
    if head:
        return f"head VM {head.get('instance')} in {head.get('zone')}"
    return f"{'head' if entry.get('detached') else 'kernel'} pid {entry.get('pid')}"


def _write_private(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def write_client_files(name: str, key_pem: str, cert_pem: str, ca_pem: str) -> dict[str, str]:
    """The client's key, certificate and CA as 0600 files in a 0700 folder of the registry."""
    folder = os.path.join(registry_dir(), "tls", name)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.chmod(os.path.dirname(folder), stat.S_IRWXU)
    os.chmod(folder, stat.S_IRWXU)
    paths = {
        "ca": os.path.join(folder, "ca.pem"),
        "cert": os.path.join(folder, f"{CLIENT_CN}.pem"),
        "key": os.path.join(folder, f"{CLIENT_CN}.key"),
    }
    for what, text in (("key", key_pem), ("cert", cert_pem), ("ca", ca_pem)):
        _write_private(paths[what], text)
    return paths


def forget(entry: Mapping[str, Any], path: str | None = None) -> None:
    """Remove a head's local registry entry and this client's TLS files for it."""
    unregister(str(entry["name"]), path)
    key = (entry.get("tls") or {}).get("key")
    if key:
        shutil.rmtree(os.path.dirname(key), ignore_errors=True)
