"""The cluster's own certificate authority: a separate certificate (and key) for every role.

Every transient cluster makes a fresh CA in memory when it is created. The scheduler and the
client get their own certificate and key from it, in the process that owns the cluster; the CA's
private key and the client's key never leave that host. A worker gets a certificate for its own
key:

- on the local backend, the cluster issues the worker's pair and hands it over in files that only
  this user can read (mode 0600 in a 0700 folder);
- on GCE, the VM makes its key at boot and publishes a certificate signing request (CSR) as a
  guest attribute (:func:`enroll`, run by the startup script); the cluster signs CSRs only from
  instances it created, only for the name it gave them, and writes the signed certificate, which
  is public, to the instance's metadata. No private key is ever in metadata or anywhere else the
  Compute API can read.

What this protects against: anyone who can read instance metadata (a project Viewer with
``compute.instances.get``, any process on a VM) gets only public certificates, with which no TLS
connection to the scheduler can be made (Dask's TLS requires a client certificate signed by the
cluster's CA, and proof of its key). What it does not protect against: root on a worker VM can use
that worker's own key to act as that worker (as it always could run code there); the scheduler
then knows which VM it is (its certificate names it).
"""

from __future__ import annotations

import datetime
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from distributed.security import Security

#: Common names of the roles that are not VMs.
SCHEDULER_CN = "transient-scheduler"
CLIENT_CN = "transient-client"


def _x509() -> Any:
    from cryptography import x509

    return x509


def new_key_pem() -> tuple[Any, str]:
    """A fresh private key (EC P-256: quick to make on a VM's boot) and its PEM."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    return key, pem


def make_csr(name: str) -> tuple[str, str]:
    """A private key and a CSR for common name ``name``, as PEM (the VM's side of enrolment).

    Examples
    --------
    >>> key, csr = make_csr("demo-w-0")
    >>> "PRIVATE KEY" in key and "CERTIFICATE REQUEST" in csr
    True
    """
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.x509.oid import NameOID

    x509 = _x509()
    key, key_pem = new_key_pem()
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .sign(key, hashes.SHA256())
    )
    return key_pem, csr.public_bytes(serialization.Encoding.PEM).decode()


def common_name(cert_pem: str) -> str:
    """The common name a PEM certificate was issued to."""
    from cryptography.x509.oid import NameOID

    cert = _x509().load_pem_x509_certificate(cert_pem.encode())
    return str(cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


@dataclass
class ClusterCA:
    """A certificate authority that lives in the owning process's memory only.

    Examples
    --------
    >>> ca = ClusterCA.create("demo")
    >>> cert, key = ca.issue("transient-client")
    >>> common_name(cert)
    'transient-client'
    """

    name: str
    cert_pem: str
    _key: Any = field(repr=False)

    @classmethod
    def create(cls, name: str, days: int = 30) -> ClusterCA:
        """A new CA for cluster ``name``."""
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.x509.oid import NameOID

        x509 = _x509()
        key, _ = new_key_pem()
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"transient-ca-{name}")])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(key, hashes.SHA256())
        )
        return cls(name, cert.public_bytes(serialization.Encoding.PEM).decode(), key)

    def _sign(self, subject_name: str, public_key: Any, days: int = 30) -> str:
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.x509.oid import NameOID

        x509 = _x509()
        issuer = _x509().load_pem_x509_certificate(self.cert_pem.encode()).subject
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject_name)]))
            .issuer_name(issuer)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        return str(cert.public_bytes(serialization.Encoding.PEM).decode())

    def issue(self, subject_name: str) -> tuple[str, str]:
        """A new key and its certificate for ``subject_name``: ``(cert_pem, key_pem)``."""
        key, key_pem = new_key_pem()
        return self._sign(subject_name, key.public_key()), key_pem

    def sign_csr(self, csr_pem: str, expected_name: str) -> str:
        """Sign a VM's CSR, only if it is well formed and asks for ``expected_name``.

        Raises ``ValueError`` otherwise (a CSR for another name is an attempt to pass for
        another VM, or for the client).
        """
        from cryptography.x509.oid import NameOID

        try:
            csr = _x509().load_pem_x509_csr(csr_pem.encode())
        except ValueError as e:
            raise ValueError(f"Not a certificate signing request: {e}") from e
        if not csr.is_signature_valid:
            raise ValueError("The CSR's signature does not match its key.")
        names = [a.value for a in csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
        if names != [expected_name]:
            raise ValueError(f"The CSR asks for {names!r}, not for {expected_name!r}.")
        return self._sign(expected_name, csr.public_key())

    def cluster_security(self) -> Security:
        """TLS of the owning process: the scheduler's and the client's own certificates."""
        scheduler_cert, scheduler_key = self.issue(SCHEDULER_CN)
        client_cert, client_key = self.issue(CLIENT_CN)
        return Security(
            require_encryption=True,
            tls_ca_file=self.cert_pem,
            tls_scheduler_cert=scheduler_cert,
            tls_scheduler_key=scheduler_key,
            tls_client_cert=client_cert,
            tls_client_key=client_key,
        )

    def write_files(self, folder: str, subject_name: str) -> dict[str, str]:
        """Issue a pair for ``subject_name`` into ``folder`` (0700) as 0600 files.

        Returns the paths: ``ca``, ``cert``, ``key``.
        """
        os.makedirs(folder, mode=0o700, exist_ok=True)
        os.chmod(folder, stat.S_IRWXU)
        cert, key = self.issue(subject_name)
        paths = {
            "ca": os.path.join(folder, "ca.pem"),
            "cert": os.path.join(folder, f"{subject_name}.pem"),
            "key": os.path.join(folder, f"{subject_name}.key"),
        }
        for what, text in (("ca", self.cert_pem), ("cert", cert), ("key", key)):
            fd = os.open(paths[what], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
        return paths


def security_from_files(paths: dict[str, str], role: str = "client") -> Security:
    """A Security that uses a pair written by :meth:`ClusterCA.write_files`."""
    return Security(
        require_encryption=True,
        tls_ca_file=paths["ca"],
        **{f"tls_{role}_cert": paths["cert"], f"tls_{role}_key": paths["key"]},
    )


def security_from_registry(entry: Mapping[str, Any]) -> Security | None:
    """The client TLS of a registered cluster (its ``tls`` files), or None when it has none.

    For the processes of the same user that attach to a cluster they do not own (``connect``,
    the JupyterLab panel): the files are readable by this user only.
    """
    paths = entry.get("tls")
    if not paths:
        return None
    return security_from_files(dict(paths), "client")


def cert_matches_key(cert_pem: str, key_pem: str) -> bool:
    """Whether a PEM certificate was issued for the public half of a PEM private key.

    A client checks the certificate the head hands back before it trusts it.

    Examples
    --------
    >>> key, csr = make_csr("transient-client")
    >>> ca = ClusterCA.create("demo")
    >>> cert_matches_key(ca.sign_csr(csr, "transient-client"), key)
    True
    >>> cert_matches_key(ca.issue("other")[0], key)
    False
    """
    from cryptography.hazmat.primitives import serialization

    cert = _x509().load_pem_x509_certificate(cert_pem.encode())
    key = serialization.load_pem_private_key(key_pem.encode(), password=None)
    fmt = (serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return bool(cert.public_key().public_bytes(*fmt) == key.public_key().public_bytes(*fmt))
