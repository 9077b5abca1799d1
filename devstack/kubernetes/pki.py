"""The embedded control plane's PKI: its own CA, a serving certificate that CA signed for the
loopback names (as kubeadm's ca.crt and apiserver.crt), and the key that signs ServiceAccount
tokens (kubeadm's sa.key and sa.pub). Clients trust the CA only: kubectl, the kubernetes package
and the functions' own client get it as `certificate-authority-data` in a kubeconfig, and verify
the server as they would a cluster's."""

from __future__ import annotations

import atexit
import datetime
import ipaddress
import shutil
import ssl
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
VALIDITY = datetime.timedelta(days=30)


@dataclass(frozen=True)
class Certificate:
    """PEM files: the serving certificate and its key, and the CA certificate that signed it."""

    cert_file: Path
    key_file: Path
    ca_file: Path

    @property
    def pem(self) -> bytes:
        """The serving certificate."""
        return self.cert_file.read_bytes()

    @property
    def ca_pem(self) -> bytes:
        """What a client trusts (`certificate-authority-data`)."""
        return self.ca_file.read_bytes()

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert_file, self.key_file)
        context.set_alpn_protocols(["http/1.1"])
        return context


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "loraflow devstack"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _key_usage(signs_certificates: bool) -> x509.KeyUsage:
    """Digital signatures (an EC key's TLS handshakes), and for the CA certificate signing."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs_certificates,
        crl_sign=signs_certificates,
        encipher_only=False,
        decipher_only=False,
    )


def issue(directory: Path, names: tuple[str, ...] = LOOPBACK_NAMES) -> Certificate:
    """A new CA and a serving certificate for `names` (DNS names or IP addresses), EC P-256
    (fast to make), written into `directory` (keys 0600)."""
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + VALIDITY
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("loraflow-devstack-ca")
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(signs_certificates=True), critical=True)
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    alternative: list[x509.GeneralName] = []
    for name in names:
        try:
            alternative.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alternative.append(x509.DNSName(name))
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("loraflow-devstack-kube-apiserver"))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(alternative), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(signs_certificates=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    found = Certificate(directory / "apiserver.crt", directory / "apiserver.key", directory / "ca.crt")
    found.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    found.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    found.key_file.touch(mode=0o600)
    found.key_file.write_bytes(_pem(key))
    # The CA's key is not kept: nothing signs a second certificate with it.
    return found


@lru_cache(maxsize=1)
def loopback_certificate() -> Certificate:
    """Made once per process, into a private temporary directory removed at exit."""
    directory = Path(tempfile.mkdtemp(prefix="loraflow-kube-tls-"))
    atexit.register(shutil.rmtree, directory, True)
    return issue(directory)


@dataclass(frozen=True)
class SigningKey:
    """The ServiceAccount token signer: kube-apiserver signs with `private_file` and verifies
    with `public_file`."""

    private_file: Path
    public_file: Path


def signing_key(directory: Path) -> SigningKey:
    key = ec.generate_private_key(ec.SECP256R1())
    directory.mkdir(parents=True, exist_ok=True)
    found = SigningKey(directory / "sa.key", directory / "sa.pub")
    found.private_file.touch(mode=0o600)
    found.private_file.write_bytes(_pem(key))
    found.public_file.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return found
