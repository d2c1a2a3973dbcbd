"""Tests for transient_nb.backends.tls: the cluster's own CA and the VM's enrolment."""

from __future__ import annotations

import os
import stat
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from transient_nb.backends.gce import enroll as gce_enroll
from transient_nb.backends.tls import (
    CLIENT_CN,
    ClusterCA,
    common_name,
    make_csr,
    role_of,
    tls_lifetime_s,
)


def test_each_role_gets_its_own_certificate_from_the_clusters_ca() -> None:
    ca = ClusterCA.create("demo")
    security = ca.cluster_security()
    assert common_name(security.tls_client_cert) == CLIENT_CN
    assert common_name(security.tls_scheduler_cert) == "transient-scheduler"
    assert security.tls_client_key != security.tls_scheduler_key
    assert "PRIVATE KEY" not in ca.cert_pem


def test_a_csr_is_signed_only_for_the_name_it_was_expected_to_ask_for() -> None:
    ca = ClusterCA.create("demo")
    _, csr = make_csr("demo-w-0")
    assert common_name(ca.sign_csr(csr, "demo-w-0", role="worker")) == "demo-w-0"
    with pytest.raises(ValueError, match=r"asks for \['demo-w-0'\], not for 'demo-w-1'"):
        ca.sign_csr(csr, "demo-w-1", role="worker")
    _, as_client = make_csr(CLIENT_CN)
    with pytest.raises(ValueError, match="transient-client"):
        ca.sign_csr(as_client, "demo-w-0", role="worker")
    with pytest.raises(ValueError, match="Not a certificate signing request"):
        ca.sign_csr("-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n", "demo-w-0", role="worker")


def test_every_certificate_names_its_role_which_the_ca_sets_and_remembers() -> None:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    ca = ClusterCA.create("demo")
    security = ca.cluster_security()
    assert role_of(security.tls_client_cert) == "client"
    assert role_of(security.tls_scheduler_cert) == "head"
    # A VM asks for its name; the role is the CA's to set, whatever the request says.
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, "demo-w-0"),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "client"),  # a wish
        ]
    )
    from cryptography.hazmat.primitives import serialization

    csr = x509.CertificateSigningRequestBuilder().subject_name(subject).sign(key, hashes.SHA256())
    pem = csr.public_bytes(serialization.Encoding.PEM).decode()
    cert = ca.sign_csr(pem, "demo-w-0", role="worker", vm="w-0")
    assert role_of(cert) == "worker"
    serial = x509.load_pem_x509_certificate(cert.encode()).serial_number
    issued = ca.lookup(serial)
    assert issued is not None and (issued.name, issued.role, issued.vm) == (
        "demo-w-0",
        "worker",
        "w-0",
    )
    with pytest.raises(ValueError, match="role='root'"):
        ca.issue("x", role="root")
    # Its VM goes: the CA forgets its certificates, the others stay.
    ca.issue("demo-w-1", role="worker", vm="w-1")
    assert ca.revoke("w-0") == 1 and ca.lookup(serial) is None
    assert ca.revoke("w-0") == 0
    assert {i.vm for i in ca.issued.values()} == {None, "w-1"}


def test_no_certificate_outlives_the_ca_whose_lifetime_is_the_clusters() -> None:
    from cryptography import x509

    ca = ClusterCA.create("demo", lifetime_s=7200)
    cert = x509.load_pem_x509_certificate(ca.issue("demo-w-0", role="worker")[0].encode())
    root = x509.load_pem_x509_certificate(ca.cert_pem.encode())
    assert cert.not_valid_after_utc == root.not_valid_after_utc
    assert abs(root.not_valid_after_utc.timestamp() - ca.not_after) < 1
    assert tls_lifetime_s() == 30 * 24 * 3600
    with pytest.raises(ValueError, match="tls-lifetime"):
        tls_lifetime_s(-1)


def test_files_are_for_this_user_only(tmp_path: Path) -> None:
    paths = ClusterCA.create("demo").write_files(str(tmp_path / "tls"), "w-0", role="worker")
    assert stat.S_IMODE(os.stat(tmp_path / "tls").st_mode) == 0o700
    for path in paths.values():
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_enrolment_keeps_the_key_and_publishes_only_the_csr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca = ClusterCA.create("demo")
    seen: dict[str, str] = {}

    class Metadata(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _answer(self, code: int, text: str) -> None:
            data = text.encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_PUT(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"])).decode()
            seen[self.path] = body
            # The cluster's side: it signs the request for this VM's name.
            seen["cert"] = ca.sign_csr(body, "demo-w-0", role="worker", vm="w-0")
            self._answer(200, "")

        def do_GET(self) -> None:
            key = self.path.rsplit("/", 1)[-1]
            if key == gce_enroll.CERT_KEY and "cert" in seen:
                self._answer(200, seen["cert"])
            elif key == gce_enroll.CA_KEY:
                self._answer(200, ca.cert_pem)
            else:
                self._answer(404, "Not Found")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("GCE_METADATA_HOST", f"127.0.0.1:{server.server_address[1]}")
    try:
        assert gce_enroll.main([str(tmp_path), "demo-w-0", "10"]) == 0
    finally:
        server.shutdown()
        server.server_close()
    published = seen["/computeMetadata/v1/instance/guest-attributes/transient-nb/csr"]
    assert "CERTIFICATE REQUEST" in published and "PRIVATE KEY" not in published
    assert "PRIVATE KEY" in (tmp_path / "key.pem").read_text()
    assert stat.S_IMODE(os.stat(tmp_path / "key.pem").st_mode) == 0o600
    assert common_name((tmp_path / "cert.pem").read_text()) == "demo-w-0"
    # No certificate in time: a clear failure (the startup script then powers off).
    assert gce_enroll.main([str(tmp_path), "demo-w-0", "0"]) == 1
