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

Every certificate names its holder's role in its subject (``OU``: ``client``, ``head`` for the
scheduler, ``worker``, ``ps``; :mod:`transient_nb.worker.peers`), set by this CA whatever a
request asks for, and the CA remembers what it issued to whom (:meth:`ClusterCA.lookup`). The
scheduler's guard (:mod:`transient_nb.deploy.guard`) answers client operations only for a
client's certificate, and refuses a certificate the CA revoked: the cluster revokes a VM's
certificates when the VM goes (:meth:`ClusterCA.revoke`). No certificate outlives the CA, which
lives for the cluster's deadline (and an hour), or ``transient.tls-lifetime`` without one.

What this protects against: anyone who can read instance metadata (a project Viewer with
``compute.instances.get``, any process on a VM) gets only public certificates, with which no TLS
connection to the scheduler can be made (Dask's TLS requires a client certificate signed by the
cluster's CA, and proof of its key); root on a worker VM, who can read that VM's key, can act as
that worker only (join as it, serve data, post events), never as a client, and not once its VM is
gone. What it does not protect against: Dask's workers unpickle what other workers send them, so
that root can still run code in the other workers (see :mod:`transient_nb.worker.guard`).
"""

from __future__ import annotations

import datetime
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from distributed.security import Security

from transient_nb.worker.peers import ROLE_CLIENT, ROLE_HEAD, ROLES

#: Common names of the roles that are not VMs.
SCHEDULER_CN = "transient-scheduler"
CLIENT_CN = "transient-client"
#: How long a cluster's CA (and so every certificate it issues) lives without a deadline.
DEFAULT_LIFETIME_S = 30 * 24 * 3600.0


def tls_lifetime_s(seconds: float | None = None) -> float:
    """How long a new cluster's certificates live: ``seconds``, else ``transient.tls-lifetime``.

    Examples
    --------
    >>> tls_lifetime_s(3600.0), tls_lifetime_s() == 30 * 24 * 3600
    (3600.0, True)
    """
    from transient_nb import config, limits

    value = config.get("tls-lifetime", override_with=seconds)
    lifetime = limits.duration(value, "tls-lifetime", "30 days")
    if lifetime is None:  # a null in the configuration: certificates need a lifetime
        raise ValueError("tls-lifetime=None must be a positive duration such as '30 days'.")
    return lifetime


@dataclass(frozen=True)
class Issued:
    """What a cluster's CA issued a certificate for: its common name, role, and VM (the Dask
    worker name of the VM that holds it; None for the client and the scheduler)."""

    name: str
    role: str
    vm: str | None = None


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


def role_of(cert_pem: str) -> str | None:
    """The role a PEM certificate names (its subject's OU), or None."""
    from cryptography.x509.oid import NameOID

    cert = _x509().load_pem_x509_certificate(cert_pem.encode())
    units = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    return str(units[0].value) if units else None


@dataclass
class ClusterCA:
    """A certificate authority that lives in the owning process's memory only.

    It names each holder's role in the certificate's subject (``OU``), remembers what it issued
    (:meth:`lookup`), and forgets a VM's certificates when the VM goes (:meth:`revoke`).

    Examples
    --------
    >>> from transient_nb.worker.peers import ROLE_CLIENT
    >>> ca = ClusterCA.create("demo")
    >>> cert, key = ca.issue("transient-client", role=ROLE_CLIENT)
    >>> common_name(cert), role_of(cert)
    ('transient-client', 'client')
    """

    name: str
    cert_pem: str
    _key: Any = field(repr=False)
    #: When the CA's certificate expires (epoch seconds): no certificate it signs lives longer.
    not_after: float = 0.0
    #: Serial number -> what it was issued for (revoked ones are gone from here).
    issued: dict[int, Issued] = field(default_factory=dict, repr=False)

    @classmethod
    def create(cls, name: str, lifetime_s: float | None = None) -> ClusterCA:
        """A new CA for cluster ``name``, valid for ``lifetime_s`` seconds (default 30 days)."""
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.x509.oid import NameOID

        x509 = _x509()
        key, _ = new_key_pem()
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"transient-ca-{name}")])
        now = datetime.datetime.now(datetime.timezone.utc)
        until = now + datetime.timedelta(seconds=lifetime_s or DEFAULT_LIFETIME_S)
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(until)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(key, hashes.SHA256())
        )
        pem = cert.public_bytes(serialization.Encoding.PEM).decode()
        return cls(name, pem, key, not_after=until.timestamp())

    def _sign(self, subject_name: str, public_key: Any, role: str, vm: str | None) -> str:
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.x509.oid import NameOID

        if role not in ROLES:
            raise ValueError(f"role={role!r}: use one of {', '.join(ROLES)}.")
        x509 = _x509()
        issuer = _x509().load_pem_x509_certificate(self.cert_pem.encode()).subject
        now = datetime.datetime.now(datetime.timezone.utc)
        serial = x509.random_serial_number()
        subject = x509.Name(
            [
                x509.NameAttribute(NameOID.COMMON_NAME, subject_name),
                # The role, set here: a request cannot choose it.
                x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
            ]
        )
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(public_key)
            .serial_number(serial)
            .not_valid_before(now - datetime.timedelta(minutes=5))
            # Never longer than the CA itself: the cluster's life.
            .not_valid_after(datetime.datetime.fromtimestamp(self.not_after, datetime.timezone.utc))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.issued[serial] = Issued(subject_name, role, vm)
        return str(cert.public_bytes(serialization.Encoding.PEM).decode())

    def issue(self, subject_name: str, *, role: str, vm: str | None = None) -> tuple[str, str]:
        """A new key and its certificate for ``subject_name`` in ``role`` (of VM ``vm``):
        ``(cert_pem, key_pem)``."""
        key, key_pem = new_key_pem()
        return self._sign(subject_name, key.public_key(), role, vm), key_pem

    def sign_csr(
        self, csr_pem: str, expected_name: str, *, role: str, vm: str | None = None
    ) -> str:
        """Sign a VM's CSR, only if it is well formed and asks for ``expected_name``.

        The certificate names ``role`` (whatever else the CSR's subject says). Raises
        ``ValueError`` otherwise (a CSR for another name is an attempt to pass for another VM,
        or for the client).
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
        return self._sign(expected_name, csr.public_key(), role, vm)

    def lookup(self, serial: int | None) -> Issued | None:
        """What the certificate of serial number ``serial`` was issued for; None when this CA did
        not issue it, or revoked it (its VM is gone)."""
        return None if serial is None else self.issued.get(serial)

    def revoke(self, vm: str) -> int:
        """Revoke every certificate issued to VM ``vm`` (it is gone); how many there were."""
        gone = [serial for serial, what in self.issued.items() if what.vm == vm]
        for serial in gone:
            del self.issued[serial]
        return len(gone)

    def cluster_security(self) -> Security:
        """TLS of the owning process: the scheduler's (role ``head``) and the client's own
        certificates."""
        scheduler_cert, scheduler_key = self.issue(SCHEDULER_CN, role=ROLE_HEAD)
        client_cert, client_key = self.issue(CLIENT_CN, role=ROLE_CLIENT)
        return Security(
            require_encryption=True,
            tls_ca_file=self.cert_pem,
            tls_scheduler_cert=scheduler_cert,
            tls_scheduler_key=scheduler_key,
            tls_client_cert=client_cert,
            tls_client_key=client_key,
        )

    def write_files(
        self, folder: str, subject_name: str, *, role: str, vm: str | None = None
    ) -> dict[str, str]:
        """Issue a pair for ``subject_name`` in ``role`` into ``folder`` (0700) as 0600 files.

        Returns the paths: ``ca``, ``cert``, ``key``.
        """
        os.makedirs(folder, mode=0o700, exist_ok=True)
        os.chmod(folder, stat.S_IRWXU)
        cert, key = self.issue(subject_name, role=role, vm=vm)
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
    >>> cert_matches_key(ca.sign_csr(csr, "transient-client", role="client"), key)
    True
    >>> cert_matches_key(ca.issue("other", role="client")[0], key)
    False
    """
    from cryptography.hazmat.primitives import serialization

    cert = _x509().load_pem_x509_certificate(cert_pem.encode())
    key = serialization.load_pem_private_key(key_pem.encode(), password=None)
    fmt = (serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return bool(cert.public_key().public_bytes(*fmt) == key.public_key().public_bytes(*fmt))
