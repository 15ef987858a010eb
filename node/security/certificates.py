"""Node certificates: what one holds, reading a node's TLS material, and checking a certificate
a peer presents against the swarm's CA.

This is the running node's side; :mod:`node.security.ca` issues what is checked here.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from node.security.identity import KEY_FILE, load_key, node_id_of

__all__ = [
    "ADMIN_UNIT",
    "CA_CERT_FILE",
    "CERT_FILE",
    "TLS_NAME",
    "CertificateExpired",
    "CertificateRefused",
    "NodeCertificates",
    "TlsFiles",
    "check_node_certificate",
    "describe_key",
    "is_admin_certificate",
    "load_tls",
    "node_id_of_cert",
    "pem_of",
    "read_cert",
    "spki_of",
]

CERT_FILE = "node_cert.pem"
CA_CERT_FILE = "ca_cert.pem"
TLS_NAME = "murmur"
#: The organizational unit of an admin's certificate (``murmur ca issue --admin``): it may
#: pause and resume any node of the swarm (``murmur ctl``). It is a node certificate otherwise.
ADMIN_UNIT = "murmur admin"
_HOW_TO_ISSUE = "`murmur ca issue CA_DIR NAME --out DIR` makes them, or --insecure runs without TLS"


@dataclass(frozen=True)
class TlsFiles:
    """A node's TLS material, checked to fit together: its key, its certificate, the swarm CA's."""

    key_pem: bytes
    cert_pem: bytes
    ca_pem: bytes


def pem_of(cert: x509.Certificate) -> bytes:
    """``cert`` as PEM, as it is written to a file and handed to gRPC."""
    return cert.public_bytes(serialization.Encoding.PEM)


def spki_of(public_key: object) -> bytes:
    """An ECDSA public key's DER SubjectPublicKeyInfo, to tell whether a certificate is a key's.

    Raises:
        ValueError: not an ECDSA key.
    """
    if not isinstance(public_key, ec.EllipticCurvePublicKey):
        raise ValueError(f"not an ECDSA key: {type(public_key).__name__}")
    return public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def read_cert(path: Path) -> x509.Certificate:
    """The PEM certificate in ``path``.

    Raises:
        ValueError: the file holds no PEM certificate (the message names it).
    """
    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except ValueError as err:
        raise ValueError(f"{path} does not hold a PEM certificate: {err}") from None


def node_id_of_cert(cert_pem: bytes) -> str:
    """The node id a PEM certificate is bound to: the hash of its ECDSA P-256 public key.

    Raises:
        ValueError: not a PEM certificate, or its key is not ECDSA P-256 (so no node's).
    """
    public_key = x509.load_pem_x509_certificate(cert_pem).public_key()
    if not isinstance(public_key, ec.EllipticCurvePublicKey) or not isinstance(
        public_key.curve, ec.SECP256R1
    ):
        raise ValueError(f"the certificate's key is {type(public_key).__name__}, not ECDSA P-256")
    return node_id_of(public_key)


def _check_validity(path: Path, cert: x509.Certificate, now: datetime) -> None:
    if now < cert.not_valid_before_utc:
        raise ValueError(
            f"{path} is not valid yet: it starts at {cert.not_valid_before_utc:%Y-%m-%d %H:%M} "
            "UTC (is this machine's clock right?)"
        )
    if now > cert.not_valid_after_utc:
        raise ValueError(
            f"{path} expired at {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC; "
            "`murmur ca issue` with --out pointing here makes a new one and keeps the node id"
        )


def load_tls(state_dir: Path, now: datetime | None = None) -> TlsFiles:
    """The TLS material in ``state_dir``, checked so that a misfit is explained here, not as a
    failed handshake later.

    Raises:
        FileNotFoundError: a file is missing (the message says which and how to make them).
        ValueError: the certificate is not for ``node_key.pem``'s key, is not signed by the CA
            in ``ca_cert.pem``, or is expired or not yet valid (likewise the CA's).
    """
    paths = {f: state_dir / f for f in (KEY_FILE, CERT_FILE, CA_CERT_FILE)}
    missing = [f for f, p in paths.items() if not p.exists()]
    if missing:
        raise FileNotFoundError(f"{state_dir}: missing {', '.join(missing)}; {_HOW_TO_ISSUE}")
    key = load_key(paths[KEY_FILE])
    cert = read_cert(paths[CERT_FILE])
    ca = read_cert(paths[CA_CERT_FILE])
    cert_path, ca_path = paths[CERT_FILE], paths[CA_CERT_FILE]
    if spki_of(cert.public_key()) != spki_of(key.public_key()):
        raise ValueError(
            f"{cert_path} is for node {node_id_of_cert(pem_of(cert))}, but {KEY_FILE} is "
            f"node {node_id_of(key.public_key())}; issue a certificate for this key "
            f"(`murmur ca issue CA_DIR NAME --out {state_dir}`)"
        )
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise ValueError(
            f"{cert_path} was not issued by the CA in {ca_path} "
            f"(issuer {cert.issuer.rfc4514_string()!r}, CA {ca.subject.rfc4514_string()!r}); "
            "a node's certificate and CA certificate must come from the same `murmur ca issue`"
        ) from None
    if TLS_NAME not in _dns_names(cert):
        raise ValueError(f"{cert_path} lacks the DNS name {TLS_NAME!r} every node certificate has")
    at = now if now is not None else datetime.now(UTC)
    _check_validity(cert_path, cert, at)
    _check_validity(ca_path, ca, at)
    return TlsFiles(
        key_pem=paths[KEY_FILE].read_bytes(),
        cert_pem=pem_of(cert),
        ca_pem=pem_of(ca),
    )


def _dns_names(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return san.get_values_for_type(x509.DNSName)


class CertificateRefused(ValueError):
    """A certificate that is no node's certificate of this swarm; the message says why."""


class CertificateExpired(CertificateRefused):
    """A node certificate of this swarm, but not valid at the time asked (clocks differ a
    little between machines, so an honest peer may still take it)."""


def describe_key(public_key: object) -> str:
    """A key's kind as people name it: "ECDSA P-256", "RSA-2048", "Ed25519"."""
    if isinstance(public_key, ec.EllipticCurvePublicKey):
        return f"ECDSA {public_key.curve.name.replace('secp', 'P-').removesuffix('r1')}"
    if isinstance(public_key, rsa.RSAPublicKey):
        return f"RSA-{public_key.key_size}"
    return type(public_key).__name__.removeprefix("_").removesuffix("PublicKey") or "unknown"


def check_node_certificate(
    cert: x509.Certificate, ca: x509.Certificate, now: datetime | None = None
) -> str:
    """The node id ``cert`` certifies, if it is a node certificate of the swarm ``ca`` made:
    an ECDSA P-256 key, not a CA (CA:FALSE, no certificate signing: a CA under the swarm's CA
    cannot admit nodes of its own), issued by ``ca`` itself, and, when ``now`` is given, valid
    then.

    Raises:
        CertificateRefused: naming the first of those that does not hold.
    """
    key = cert.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP256R1):
        raise CertificateRefused(
            f"its key is {describe_key(key)}; a node certificate holds an ECDSA P-256 key "
            "(`murmur ca issue` makes one)"
        )
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    try:
        signs = cert.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    except x509.ExtensionNotFound:
        signs = False
    if is_ca or signs:
        raise CertificateRefused(
            "it is a CA certificate (CA:TRUE or certificate signing), not a node's; only the "
            "swarm's CA itself admits nodes"
        )
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise CertificateRefused(
            f"it was not issued by the swarm's CA itself (issuer {cert.issuer.rfc4514_string()!r})"
        ) from None
    if now is not None:
        if now < cert.not_valid_before_utc:
            raise CertificateRefused(f"it is not valid before {cert.not_valid_before_utc:%Y-%m-%d}")
        if now > cert.not_valid_after_utc:
            raise CertificateRefused(f"it expired at {cert.not_valid_after_utc:%Y-%m-%d %H:%M}")
    return node_id_of(key)


def is_admin_certificate(cert: x509.Certificate) -> bool:
    """Whether ``cert`` names an admin (its subject's OU is :data:`ADMIN_UNIT`); only
    meaningful for a certificate the swarm's CA issued."""
    units = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    return any(u.value == ADMIN_UNIT for u in units)


@dataclass(frozen=True)
class _Verdict:
    node_id: str  # empty when refused
    refusal: str
    not_before: datetime
    not_after: datetime
    admin: bool = False


class NodeCertificates:
    """Verdicts on certificates (PEM or DER) against the swarm's CA, each reached once: parsing
    and checking a signature cost far more than a look-up, and the same certificates come back
    on every call and every gossiped record. Validity is checked against the time at each use.

    Args:
        ca_pem: the swarm CA's certificate.
        cache: verdicts kept (the least recently used forgotten first).
    """

    def __init__(self, ca_pem: bytes, cache: int = 4096) -> None:
        self.ca = x509.load_pem_x509_certificate(ca_pem)
        self._cache = cache
        self._verdicts: OrderedDict[bytes, _Verdict] = OrderedDict()
        #: Certificates parsed and checked (not answered from the cache).
        self.checked = 0

    def cached(self, cert: bytes) -> bool:
        return cert in self._verdicts

    def node_id(self, cert: bytes, now: datetime | None = None) -> str:
        """The node id ``cert`` certifies now.

        Raises:
            CertificateRefused: it does not parse, is not a node certificate of this swarm (see
                :func:`check_node_certificate`), or is not valid at ``now`` (default: now).
        """
        verdict = self._verdicts.get(cert)
        if verdict is None:
            verdict = self._judge(cert)
            self._verdicts[cert] = verdict
            if len(self._verdicts) > self._cache:
                self._verdicts.popitem(last=False)
        else:
            self._verdicts.move_to_end(cert)
        if verdict.refusal:
            raise CertificateRefused(verdict.refusal)
        at = now if now is not None else datetime.now(UTC)
        if at < verdict.not_before:
            raise CertificateExpired(f"it is not valid before {verdict.not_before:%Y-%m-%d}")
        if at > verdict.not_after:
            raise CertificateExpired(f"it expired at {verdict.not_after:%Y-%m-%d %H:%M}")
        return verdict.node_id

    def is_admin(self, cert: bytes) -> bool:
        """Whether ``cert``, a valid node certificate of this swarm, is an admin's."""
        try:
            self.node_id(cert)
        except CertificateRefused:
            return False
        return self._verdicts[cert].admin

    def _judge(self, data: bytes) -> _Verdict:
        self.checked += 1
        never = datetime.min.replace(tzinfo=UTC)
        try:
            if data.startswith(b"-----BEGIN"):
                cert = x509.load_pem_x509_certificate(data)
            else:
                cert = x509.load_der_x509_certificate(data)
            node_id = check_node_certificate(cert, self.ca)
        except CertificateRefused as err:
            return _Verdict("", str(err), never, never)
        except ValueError:
            return _Verdict("", "it is not an X.509 certificate", never, never)
        return _Verdict(
            node_id,
            "",
            cert.not_valid_before_utc,
            cert.not_valid_after_utc,
            is_admin_certificate(cert),
        )
