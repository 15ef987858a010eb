"""Certificates that `murmur ca issue` would never make, signed by a real swarm CA: other key
types, CAs under the swarm's CA, leaves of those. For tests of what a node refuses."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from node.security.identity import load_key
from node.security.pki import CA_CERT_FILE, CA_KEY_FILE, TLS_NAME, TlsFiles

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


def key_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def build_cert(
    key: PrivateKey,
    issuer: x509.Certificate,
    issuer_key: PrivateKey,
    ca: bool = False,
    days: int = 30,
) -> x509.Certificate:
    """A certificate for ``key`` issued by ``issuer`` (a CA when ``ca``), naming TLS_NAME."""
    start = datetime.now(UTC) - timedelta(minutes=5)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "odd")]))
        .issuer_name(issuer.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(TLS_NAME)]), critical=False)
        .sign(issuer_key, hashes.SHA256())
    )


def swarm_ca(ca_dir: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = x509.load_pem_x509_certificate((ca_dir / CA_CERT_FILE).read_bytes())
    return cert, load_key(ca_dir / CA_KEY_FILE)


def odd_tls(ca_dir: Path, kind: str) -> TlsFiles:
    """Client TLS material of one odd kind: ``rsa`` (RSA-2048 key), ``p384`` (ECDSA P-384),
    ``sub-ca`` (a CA certificate under the swarm's CA, used as a client's), ``sub-ca-leaf``
    (a P-256 node certificate issued by such a CA, sent with it as a chain)."""
    ca_cert, ca_key = swarm_ca(ca_dir)
    ca_pem = cert_pem(ca_cert)
    if kind == "rsa":
        rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        return TlsFiles(key_pem(rsa_key), cert_pem(build_cert(rsa_key, ca_cert, ca_key)), ca_pem)
    if kind == "p384":
        key = ec.generate_private_key(ec.SECP384R1())
        return TlsFiles(key_pem(key), cert_pem(build_cert(key, ca_cert, ca_key)), ca_pem)
    sub_key = ec.generate_private_key(ec.SECP256R1())
    sub = build_cert(sub_key, ca_cert, ca_key, ca=True)
    if kind == "sub-ca":
        return TlsFiles(key_pem(sub_key), cert_pem(sub), ca_pem)
    if kind == "sub-ca-leaf":
        leaf_key = ec.generate_private_key(ec.SECP256R1())
        leaf = build_cert(leaf_key, sub, sub_key)
        return TlsFiles(key_pem(leaf_key), cert_pem(leaf) + cert_pem(sub), ca_pem)
    raise ValueError(f"unknown kind {kind!r}")
