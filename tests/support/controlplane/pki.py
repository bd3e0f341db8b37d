"""The test cluster's certificates: one CA, the API server's serving pair, client certificates
and the service-account signing key, named as kubeadm names them (`ca.crt`, `apiserver.crt`,
`sa.key`, `sa.pub`).

Each client has its own user name, so the audit log tells them apart: `admin` is what the
collection runs as when a test gives it full access, `harness` the test's own calls and the
NVIDIA stand-ins, then kwok, kube-controller-manager and kube-scheduler. All are in
system:masters (the test cluster's own parts are not under test)."""

from __future__ import annotations

import datetime
import ipaddress
import os

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DAY = datetime.timedelta(days=1)
CLIENTS = {
    "admin": "gpuops-mig-test-admin",
    "harness": "gpuops-mig-test-harness",
    "kwok": "kwok",
    "controller-manager": "system:kube-controller-manager",
    "scheduler": "system:kube-scheduler",
}


def _key():
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path, key):
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )


def _write_cert(path, cert):
    with open(path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))


def _name(cn, org=None):
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _sign(subject, key, issuer, issuer_key, *, ca=False, usage=None, sans=()):
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - DAY)
        .not_valid_after(now + 30 * DAY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def write(directory: str) -> dict:
    """Writes the files into `directory`; returns their paths by name."""
    os.makedirs(directory, exist_ok=True)
    paths = {
        name: os.path.join(directory, name)
        for name in ("ca.crt", "ca.key", "apiserver.crt", "apiserver.key", "sa.key", "sa.pub")
    }
    ca_key = _key()
    ca_name = _name("gpuops-mig-test-ca")
    ca = _sign(ca_name, ca_key, ca_name, ca_key, ca=True)
    _write_key(paths["ca.key"], ca_key)
    _write_cert(paths["ca.crt"], ca)

    serving_key = _key()
    sans = [
        x509.DNSName(n)
        for n in ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc")
    ]
    sans += [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    _write_key(paths["apiserver.key"], serving_key)
    _write_cert(
        paths["apiserver.crt"],
        _sign(
            _name("kube-apiserver"),
            serving_key,
            ca_name,
            ca_key,
            usage=ExtendedKeyUsageOID.SERVER_AUTH,
            sans=sans,
        ),
    )

    for client, user in CLIENTS.items():
        key = _key()
        paths[f"{client}.key"] = os.path.join(directory, f"{client}.key")
        paths[f"{client}.crt"] = os.path.join(directory, f"{client}.crt")
        _write_key(paths[f"{client}.key"], key)
        _write_cert(
            paths[f"{client}.crt"],
            _sign(
                _name(user, "system:masters"),
                key,
                ca_name,
                ca_key,
                usage=ExtendedKeyUsageOID.CLIENT_AUTH,
            ),
        )

    sa_key = _key()
    _write_key(paths["sa.key"], sa_key)
    with open(paths["sa.pub"], "wb") as f:
        f.write(
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
    return paths
