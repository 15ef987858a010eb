"""A swarm's certificates: a CA of its own, and per-node certificates bound to node ids.

Every node runs mutual TLS with a certificate from the swarm's CA. Nodes dial each other by
IP:port, which no certificate can list in advance, so every node certificate carries the one DNS
name ``TLS_NAME`` and clients override the target name to it; who is at the other end is then
checked by node id, the hash of the public key in the certificate the peer presented
(``node_id_of_cert``).
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from node.security.identity import (
    KEY_FILE,
    load_key,
    load_or_create_identity,
    node_id_of,
    write_atomic,
)

__all__ = [
    "CA_CERT_FILE",
    "CA_KEY_FILE",
    "CERT_FILE",
    "ISSUED_FILE",
    "KEY_FILE",
    "TLS_NAME",
    "CertificateExpired",
    "CertificateRefused",
    "NodeCertificates",
    "TlsFiles",
    "check_node_certificate",
    "init_ca",
    "issue_node",
    "issued_nodes",
    "load_tls",
    "node_id_of_cert",
    "resolve_node_id",
]

CERT_FILE = "node_cert.pem"
CA_CERT_FILE = "ca_cert.pem"
CA_KEY_FILE = "ca_key.pem"
#: The nodes a CA issued certificates for (id, name, expiry), so that ``murmur ca revoke`` can
#: take the short ids that logs print.
ISSUED_FILE = "issued.json"
TLS_NAME = "murmur"
#: The organizational unit of an admin's certificate (``murmur ca issue --admin``): it may
#: pause and resume any node of the swarm (``murmur ctl``). It is a node certificate otherwise.
ADMIN_UNIT = "murmur admin"
#: Fewer characters than this are too likely to name another node tomorrow.
MIN_PREFIX = 4
_HEX = re.compile(r"[0-9a-f]+")
NODE_ID_LENGTH = 32

# Certificates start this long before they are made, so a peer whose clock runs a little behind
# does not find a fresh certificate "not yet valid".
CLOCK_SKEW = timedelta(minutes=5)
_HOW_TO_ISSUE = "`murmur ca issue CA_DIR NAME --out DIR` makes them, or --insecure runs without TLS"


@dataclass(frozen=True)
class TlsFiles:
    """A node's TLS material, checked to fit together: its key, its certificate, the swarm CA's."""

    key_pem: bytes
    cert_pem: bytes
    ca_pem: bytes


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _check_days(days: int) -> None:
    if days < 1:
        raise ValueError(f"a certificate must be valid for at least one day, not {days}")


def init_ca(ca_dir: Path, name: str = "murmur swarm", days: int = 3650) -> None:
    """Make a swarm CA in ``ca_dir``: ``ca_key.pem`` (mode 0600) and a self-signed ``ca_cert.pem``.

    Raises:
        FileExistsError: ``ca_dir`` already holds a CA; replacing it would orphan every
            certificate it issued, so that is left to the operator.
        ValueError: ``days`` is not positive.
    """
    _check_days(days)
    existing = [f for f in (CA_KEY_FILE, CA_CERT_FILE) if (ca_dir / f).exists()]
    if existing:
        raise FileExistsError(
            f"{ca_dir} already holds a CA ({', '.join(existing)}); refusing to overwrite it, "
            "since every certificate it issued would stop verifying"
        )
    ca_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    start = datetime.now(UTC) - CLOCK_SKEW
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    # The key goes first: a crash between the two leaves a CA that init refuses to overwrite
    # rather than a certificate whose key is lost.
    write_atomic(ca_dir / CA_KEY_FILE, _key_pem(key))
    write_atomic(ca_dir / CA_CERT_FILE, _cert_pem(cert), mode=0o644)


def _load_ca(ca_dir: Path) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    missing = [f for f in (CA_KEY_FILE, CA_CERT_FILE) if not (ca_dir / f).exists()]
    if missing:
        raise FileNotFoundError(
            f"{ca_dir} is not a CA dir: no {', '.join(missing)} (`murmur ca init` makes one)"
        )
    key = load_key(ca_dir / CA_KEY_FILE)
    cert = _read_cert(ca_dir / CA_CERT_FILE)
    if _spki(cert.public_key()) != _spki(key.public_key()):
        raise ValueError(f"{ca_dir / CA_CERT_FILE} is not the certificate of {CA_KEY_FILE}")
    return key, cert


def issue_node(
    ca_dir: Path,
    out_dir: Path,
    name: str,
    days: int = 365,
    not_before: datetime | None = None,
    admin: bool = False,
) -> str:
    """Issue a node certificate from the CA in ``ca_dir`` into ``out_dir``; returns the node id.

    ``out_dir`` keeps its ``node_key.pem`` when it has one, so a node re-issued (say, before its
    certificate expires) keeps its id; otherwise a new key is made (mode 0600). Written there:
    ``node_cert.pem`` (subject CN = the node id, pseudonym = ``name``; DNS name ``TLS_NAME``;
    for both TLS server and client) and a copy of the CA's ``ca_cert.pem``.

    Args:
        ca_dir: a dir made by ``init_ca``.
        out_dir: the node's state dir, made if missing.
        name: a human label for the node, written into the certificate.
        days: how long the certificate is valid.
        not_before: when it starts being valid (now minus a few minutes for clock skew).
        admin: an admin's certificate (subject OU = :data:`ADMIN_UNIT`), which may also pause
            and resume any node of the swarm.
    """
    _check_days(days)
    if not name or len(name) > 64:
        raise ValueError(f"a node name must be 1 to 64 characters, not {name!r}")
    ca_key, ca_cert = _load_ca(ca_dir)
    identity = load_or_create_identity(out_dir)
    start = not_before if not_before is not None else datetime.now(UTC) - CLOCK_SKEW
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, identity.node_id),
            x509.NameAttribute(NameOID.PSEUDONYM, name),
            *([x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, ADMIN_UNIT)] if admin else []),
        ]
    )
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(identity.key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(TLS_NAME)]), critical=False)
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(identity.key.public_key()), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    write_atomic(out_dir / CERT_FILE, _cert_pem(cert), mode=0o644)
    write_atomic(out_dir / CA_CERT_FILE, _cert_pem(ca_cert), mode=0o644)
    issued = issued_nodes(ca_dir)
    issued[identity.node_id] = {"name": name, "not_after": cert.not_valid_after_utc.isoformat()}
    if admin:
        issued[identity.node_id]["role"] = "admin"
    write_atomic(ca_dir / ISSUED_FILE, json.dumps(issued, indent=1, sort_keys=True).encode())
    return identity.node_id


def issued_nodes(ca_dir: Path) -> dict[str, dict[str, str]]:
    """The nodes the CA in ``ca_dir`` issued certificates for: node id -> name and expiry."""
    path = ca_dir / ISSUED_FILE
    if not path.exists():
        return {}
    try:
        raw = json.loads(path.read_text())
        return {
            str(k): {"name": str(v["name"]), "not_after": str(v["not_after"])}
            for k, v in raw.items()
        }
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{path} is damaged ({err}); it lists the ids this CA issued") from None


def resolve_node_id(ca_dir: Path, given: str) -> str:
    """The full node id that ``given`` means: a full id (32 hex characters) as it is, or a
    prefix of exactly one id this CA issued (the 8 or 12 characters that logs print).

    Raises:
        ValueError: ``given`` is no id nor prefix of one, or a prefix of none or several.
    """
    text = given.strip().lower()
    if not _HEX.fullmatch(text) or len(text) > NODE_ID_LENGTH:
        raise ValueError(
            f"{given!r} is not a node id: those are {NODE_ID_LENGTH} hex characters "
            "(or the first few of one, as logs print them)"
        )
    if len(text) == NODE_ID_LENGTH:
        return text
    if len(text) < MIN_PREFIX:
        raise ValueError(f"{given!r} is too short: give at least {MIN_PREFIX} characters of the id")
    issued = issued_nodes(ca_dir)
    matches = sorted(i for i in issued if i.startswith(text))
    if not matches:
        raise ValueError(
            f"no node that {ca_dir} issued a certificate for has an id starting with {text} "
            f"({len(issued)} issued, listed in {ca_dir / ISSUED_FILE}); a full id of "
            f"{NODE_ID_LENGTH} characters is taken as it is"
        )
    if len(matches) > 1:
        named = ", ".join(f"{i} ({issued[i]['name']})" for i in matches)
        raise ValueError(f"{text} starts several issued ids: {named}; give more characters")
    return matches[0]


def _spki(public_key: object) -> bytes:
    if not isinstance(public_key, ec.EllipticCurvePublicKey):
        raise ValueError(f"not an ECDSA key: {type(public_key).__name__}")
    return public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _read_cert(path: Path) -> x509.Certificate:
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
    cert = _read_cert(paths[CERT_FILE])
    ca = _read_cert(paths[CA_CERT_FILE])
    cert_path, ca_path = paths[CERT_FILE], paths[CA_CERT_FILE]
    if _spki(cert.public_key()) != _spki(key.public_key()):
        raise ValueError(
            f"{cert_path} is for node {node_id_of_cert(_cert_pem(cert))}, but {KEY_FILE} is "
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
        cert_pem=_cert_pem(cert),
        ca_pem=_cert_pem(ca),
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
