"""A VM's side of TLS enrolment, run by the startup script before the Dask worker starts.

``python -m transient_nb.backends.gce.enroll FOLDER NAME TIMEOUT_S``

1. makes the VM's private key in ``FOLDER`` (0600; it never leaves the VM);
2. publishes a certificate signing request for ``NAME`` as the guest attribute
   ``transient-nb/csr`` (guest attributes are written from inside the VM only);
3. waits until the cluster has signed it and written the certificate (public) to the instance
   metadata (``transient-nb-tls-cert``), and writes it, with the cluster's CA certificate
   (``transient-nb-tls-ca``), beside the key.

Exits with status 1 when no certificate came within ``TIMEOUT_S`` seconds (the startup script's
``trap`` then powers the VM off). See :mod:`transient_nb.backends.tls` for what this protects.
"""

from __future__ import annotations

import os
import sys
import time
import urllib.error
import urllib.request

#: Guest attribute (namespace/key) of the CSR.
CSR_ATTRIBUTE = "transient-nb/csr"
#: Metadata keys of the signed certificate and of the cluster's CA certificate (both public).
CERT_KEY = "transient-nb-tls-cert"
CA_KEY = "transient-nb-tls-ca"


def _url(path: str) -> str:
    host = os.environ.get("GCE_METADATA_HOST", "metadata.google.internal")
    return f"http://{host}/computeMetadata/v1/{path}"


def _request(path: str, data: bytes | None = None) -> str | None:
    """GET (or PUT ``data``) a metadata path; None for a 404."""
    req = urllib.request.Request(_url(path), data=data, method="PUT" if data is not None else "GET")
    req.add_header("Metadata-Flavor", "Google")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return str(r.read().decode())
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise


def _write(path: str, text: str, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def enroll(folder: str, name: str, timeout_s: float, poll_s: float = 1.0) -> None:
    """Make a key, publish its CSR, wait for the signed certificate; files in ``folder``."""
    from transient_nb.backends.tls import make_csr

    key_pem, csr_pem = make_csr(name)
    _write(os.path.join(folder, "key.pem"), key_pem, 0o600)
    _request(f"instance/guest-attributes/{CSR_ATTRIBUTE}", csr_pem.encode())
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            cert = _request(f"instance/attributes/{CERT_KEY}")
        except (OSError, urllib.error.URLError) as e:
            print(f"transient_nb: metadata server: {e!r}", file=sys.stderr)
            cert = None
        if cert:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"No certificate for {name} within {timeout_s:g} s")
        time.sleep(poll_s)
    ca = _request(f"instance/attributes/{CA_KEY}")
    if not ca:
        raise RuntimeError(f"The instance metadata has no {CA_KEY}")
    _write(os.path.join(folder, "cert.pem"), cert, 0o644)
    _write(os.path.join(folder, "ca.pem"), ca, 0o644)


def main(argv: list[str]) -> int:
    """Command-line entry point (``FOLDER NAME TIMEOUT_S``)."""
    folder, name, timeout_s = argv[0], argv[1], float(argv[2])
    try:
        enroll(folder, name, timeout_s)
    except Exception as e:
        print(f"transient_nb: TLS enrolment failed: {e!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover - run by the startup script
    sys.exit(main(sys.argv[1:]))
