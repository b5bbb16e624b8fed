"""Certificates and keys for the local control plane: one CA, serving and client certs, SA keys.

EC P-256 keys keep generation fast; everything is valid for a year and lives in the cluster's
working directory only.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=365)


@dataclass(frozen=True)
class CertPair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class ClusterPKI:
    ca: CertPair
    apiserver: CertPair
    admin: CertPair
    controller_manager: CertPair
    scheduler: CertPair
    # What the API server presents to kubelets (logs, exec); kubelets trust the cluster CA.
    apiserver_kubelet_client: CertPair
    # ServiceAccount token signing pair (apiserver signs, controller-manager needs the private key).
    sa_private_key: Path
    sa_public_key: Path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    # Signing only (EC keys); a CA also signs certificates and CRLs.
    return x509.KeyUsage(
        digital_signature=True,
        key_encipherment=False,
        content_commitment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attrs)


def _issue(
    *,
    directory: Path,
    stem: str,
    subject: x509.Name,
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    server: bool,
    sans: list[x509.GeneralName] | None = None,
) -> CertPair:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    pair = CertPair(cert=directory / f"{stem}.crt", key=directory / f"{stem}.key")
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(pair.key, key)
    return pair


def generate_pki(directory: Path) -> ClusterPKI:
    """Create every certificate and key the control plane needs under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    ca_subject = _name("accel-dra-local-ca")
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_subject)
        .issuer_name(ca_subject)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    ca = CertPair(cert=directory / "ca.crt", key=directory / "ca.key")
    ca.cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    _write_key(ca.key, ca_key)

    sans: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.DNSName("kubernetes"),
        x509.DNSName("kubernetes.default"),
        x509.DNSName("kubernetes.default.svc"),
        x509.DNSName("kubernetes.default.svc.cluster.local"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        # First address of the (unused) service range, the in-cluster "kubernetes" Service.
        x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
    ]

    def client(stem: str, cn: str, org: str | None = None) -> CertPair:
        return _issue(
            directory=directory,
            stem=stem,
            subject=_name(cn, org),
            ca_cert=ca_cert,
            ca_key=ca_key,
            server=False,
        )

    apiserver = _issue(
        directory=directory,
        stem="apiserver",
        subject=_name("kube-apiserver"),
        ca_cert=ca_cert,
        ca_key=ca_key,
        server=True,
        sans=sans,
    )
    sa_key = ec.generate_private_key(ec.SECP256R1())
    sa_private = directory / "sa.key"
    sa_public = directory / "sa.pub"
    _write_key(sa_private, sa_key)
    sa_public.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return ClusterPKI(
        ca=ca,
        apiserver=apiserver,
        admin=client("admin", "local-admin", "system:masters"),
        controller_manager=client("controller-manager", "system:kube-controller-manager"),
        scheduler=client("scheduler", "system:kube-scheduler"),
        apiserver_kubelet_client=client(
            "apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters"
        ),
        sa_private_key=sa_private,
        sa_public_key=sa_public,
    )


def issue_client_cert(
    *, ca: CertPair, directory: Path, stem: str, common_name: str, organization: str | None = None
) -> CertPair:
    """A client certificate signed by the cluster CA (read from ``ca``), e.g. a node's
    ``CN=system:node:<name>, O=system:nodes``, which the Node authorizer and NodeRestriction judge."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    directory.mkdir(parents=True, exist_ok=True)
    return _issue(
        directory=directory,
        stem=stem,
        subject=_name(common_name, organization),
        ca_cert=ca_cert,
        ca_key=ca_key,
        server=False,
    )
