"""A small on-disk registry of running clusters, so that every view can find every cluster.

Each running :class:`~transient_nb.deploy.cluster.TransientCluster` writes ``NAME.json`` into
``transient.registry-dir`` and removes it when it closes. An entry whose owning process is gone
(a crashed kernel) is reported as stale rather than hidden.

A detached GCE cluster's entry is written by the client that created its head VM and names that
VM (``head_vm``) instead of a local pid. Such an entry is never stale here: whether the VM still
runs is a question for the Compute API, which ``connect()`` asks (and forgets the entry when the
head is gone), as do ``shutdown()``, ``transient-nb down`` and ``sweep``.

The folder is trusted with what connects to clusters, so it is checked before it is read:

- it is created 0700, and refused (a ``ValueError`` naming it and the fix) when it belongs to
  another user or others may write to it: on a shared host, someone who could plant an entry
  could otherwise have ``connect`` send this user's OAuth token to an endpoint of theirs,
  delete a folder of this user's (the entry's TLS folder), or put code in a notebook (the
  panel's ``connect(...)`` snippet);
- every entry is checked as it is read (:func:`check_entry`): a cluster name, a Compute API
  endpoint (:func:`check_api_endpoint`), TLS files under the registry's own ``tls`` folder
  (where :func:`tls_folder` puts them). An entry that fails is skipped, with a warning.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import psutil

from transient_nb import config
from transient_nb.backends.tls import CLIENT_CN

logger = logging.getLogger(__name__)

_NAME_RE = re.compile(r"[a-z]([-a-z0-9]{0,40}[a-z0-9])?\Z")
#: The Compute API's own endpoint (``None`` in an entry means this one).
COMPUTE_API = "https://compute.googleapis.com"
#: Hosts of a plain-HTTP endpoint an entry may name: a local fake server, which gets anonymous
#: credentials only (``ComputeAPI`` never sends a token over plain HTTP).
_LOOPBACK = ("127.0.0.1", "localhost", "::1")
_ADDRESS_RE = re.compile(r"(tls|tcp|inproc|ucx)://[-A-Za-z0-9_.:\[\]/%]+\Z")


def check_name(name: Any) -> str:
    """``name`` if it is an allowed cluster name; a ``ValueError`` saying what is allowed if not.

    Examples
    --------
    >>> check_name("demo-1")
    'demo-1'
    >>> check_name("demo\\n")
    Traceback (most recent call last):
    ...
    ValueError: Cluster name 'demo\\n' is not allowed: ...
    """
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(
            f"Cluster name {name!r} is not allowed: use lowercase letters, digits and dashes, "
            "starting with a letter (at most 42 characters), e.g. 'demo-1'."
        )
    return name


def check_private(folder: str) -> None:
    """Refuse ``folder`` unless this user owns it and nobody else may write to it.

    Raises ``ValueError`` naming the folder, its owner or mode, and the fix. Does nothing where
    the system has no owners (Windows).
    """
    if not hasattr(os, "getuid"):  # pragma: no cover - Windows
        return
    st = os.stat(folder)
    if st.st_uid != os.getuid():
        raise ValueError(
            f"The cluster registry folder {folder} belongs to user id {st.st_uid}, not to you "
            f"({os.getuid()}): its entries say where your credentials and certificates go, so "
            "they must be yours. Point transient.registry-dir at a folder of your own (e.g. "
            "dask.config.set({'transient.registry-dir': '~/.transient_nb/clusters'}))."
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ValueError(
            f"The cluster registry folder {folder} may be written by others (mode "
            f"{stat.S_IMODE(st.st_mode):o}): anyone who can write there can plant an entry. "
            f"Make it yours only with `chmod 700 {folder}`."
        )


def registry_dir(path: str | None = None) -> str:
    """The registry folder: created 0700 if needed, refused if it is not this user's alone."""
    folder = os.path.expanduser(config.get("registry-dir", override_with=path))
    os.makedirs(folder, mode=stat.S_IRWXU, exist_ok=True)
    check_private(folder)
    if stat.S_IMODE(os.stat(folder).st_mode) & (stat.S_IRWXG | stat.S_IRWXO):
        os.chmod(folder, stat.S_IRWXU)  # an older, readable folder of ours: close it
    return folder


def tls_folder(name: str, path: str | None = None) -> str:
    """The folder (0700, in the registry) of cluster ``name``'s client certificate and key."""
    root = os.path.join(registry_dir(path), "tls")
    folder = os.path.join(root, check_name(name))
    os.makedirs(folder, mode=stat.S_IRWXU, exist_ok=True)
    os.chmod(root, stat.S_IRWXU)
    os.chmod(folder, stat.S_IRWXU)
    return folder


def check_api_endpoint(endpoint: Any) -> None:
    """Refuse an entry's Compute API endpoint unless it is the Compute API's (or a local fake).

    Allowed: none (the Compute API), ``https://compute.googleapis.com``, the endpoint this user
    configured (``transient.gce.api-endpoint``), and plain HTTP on the loopback interface, which
    gets anonymous credentials only. Anything else would receive this user's OAuth token.
    """
    if endpoint is None:
        return
    configured = config.get("gce.api-endpoint")
    if not isinstance(endpoint, str):
        raise ValueError(f"api_endpoint={endpoint!r} is not an address")
    if endpoint.rstrip("/") in (COMPUTE_API, str(configured or "").rstrip("/") or COMPUTE_API):
        return
    url = urlsplit(endpoint)
    if url.scheme == "http" and url.hostname in _LOOPBACK:
        return
    raise ValueError(
        f"api_endpoint={endpoint!r} is not the Compute API ({COMPUTE_API}) nor this user's "
        "transient.gce.api-endpoint: your credentials would be sent there"
    )


def _under(path: str, folder: str) -> bool:
    real, root = os.path.realpath(path), os.path.realpath(folder)
    return os.path.commonpath([real, root]) == root and real != root


def check_entry(entry: Mapping[str, Any], folder: str, fname: str | None = None) -> None:
    """Refuse (``ValueError``, saying why) an entry this user's clusters would not have written.

    The name is a cluster name (that of its file), the scheduler address an address, the Compute
    API endpoint the Compute API's, and the TLS files are under ``folder``'s ``tls`` folder.
    """
    name = check_name(entry.get("name"))
    if fname is not None and fname != f"{name}.json":
        raise ValueError(f"its name {name!r} is not that of its file")
    address = entry.get("scheduler_address")
    if address is not None and not (isinstance(address, str) and _ADDRESS_RE.match(address)):
        raise ValueError(f"scheduler_address={address!r} is not a Dask address")
    pid = entry.get("pid")
    if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int)):
        raise ValueError(f"pid={pid!r} is not a process id")
    head = entry.get("head_vm")
    if head is not None:
        if not isinstance(head, Mapping):
            raise ValueError(f"head_vm={head!r} is not a VM")
        check_api_endpoint(head.get("api_endpoint"))
    tls = entry.get("tls")
    if tls is not None:
        if not isinstance(tls, Mapping) or set(tls) != {"ca", "cert", "key"}:
            raise ValueError(f"tls={tls!r} is not a set of ca, cert and key files")
        root = os.path.join(folder, "tls")
        for what, where in tls.items():
            if not isinstance(where, str) or not _under(where, root):
                raise ValueError(f"its TLS {what} file {where!r} is not under {root}")


def _pid_alive(pid: int) -> bool:
    # A zombie (a head that exited before its parent reaped it) is gone for our purposes.
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def register(name: str, info: dict[str, Any], path: str | None = None) -> str:
    """Write (atomically) the entry of cluster ``name``; returns its file path.

    Refused (``ValueError``) if the entry would not pass :func:`check_entry`.
    """
    folder = registry_dir(path)
    entry = {"name": name, "pid": os.getpid(), "registered": time.time(), **info}
    check_entry(entry, folder)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(entry, f)
    target = os.path.join(folder, f"{name}.json")
    os.replace(tmp, target)
    return target


def unregister(name: str, path: str | None = None) -> None:
    """Remove the entry of cluster ``name`` and its client certificate, if they are there."""
    folder = registry_dir(path)
    try:
        os.remove(os.path.join(folder, f"{check_name(name)}.json"))
    except FileNotFoundError:
        pass
    shutil.rmtree(os.path.join(folder, "tls", name), ignore_errors=True)


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
        try:
            if not isinstance(entry, dict):
                raise ValueError("it is not an object")
            check_entry(entry, folder, fname)
        except ValueError as e:
            logger.warning("Skipped the registry entry %s: %s", os.path.join(folder, fname), e)
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
    folder = tls_folder(name)
    paths = {
        "ca": os.path.join(folder, "ca.pem"),
        "cert": os.path.join(folder, f"{CLIENT_CN}.pem"),
        "key": os.path.join(folder, f"{CLIENT_CN}.key"),
    }
    for what, text in (("key", key_pem), ("cert", cert_pem), ("ca", ca_pem)):
        _write_private(paths[what], text)
    return paths


def forget(entry: Mapping[str, Any], path: str | None = None) -> None:
    """Remove a head's local registry entry and this client's TLS files for it (only ever the
    registry's own ``tls/NAME`` folder, whatever the entry names)."""
    unregister(check_name(entry["name"]), path)
