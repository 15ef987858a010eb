"""The swarm's CA: making it, issuing node and admin certificates from it, and the list of
what it issued.

This is the operator's side (``murmur ca``); a running node only checks certificates, with
:mod:`node.security.certificates`, which also defines what a node certificate must hold.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from node.security.certificates import (
    ADMIN_UNIT,
    CA_CERT_FILE,
    CERT_FILE,
    TLS_NAME,
    pem_of,
    read_cert,
    spki_of,
)
from node.security.identity import load_key, load_or_create_identity, write_atomic

__all__ = [
    "CA_KEY_FILE",
    "CLOCK_SKEW",
    "ISSUED_FILE",
    "MIN_PREFIX",
    "NODE_ID_LENGTH",
    "init_ca",
    "issue_node",
    "issued_nodes",
    "resolve_node_id",
]

CA_KEY_FILE = "ca_key.pem"
#: The nodes a CA issued certificates for (id, name, expiry), so that ``murmur ca revoke`` can
#: take the short ids that logs print.
ISSUED_FILE = "issued.json"
#: Fewer characters than this are too likely to name another node tomorrow.
MIN_PREFIX = 4
_HEX = re.compile(r"[0-9a-f]+")
NODE_ID_LENGTH = 32

# Certificates start this long before they are made, so a peer whose clock runs a little behind
# does not find a fresh certificate "not yet valid".
CLOCK_SKEW = timedelta(minutes=5)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


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
    write_atomic(ca_dir / CA_CERT_FILE, pem_of(cert), mode=0o644)


def _load_ca(ca_dir: Path) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    missing = [f for f in (CA_KEY_FILE, CA_CERT_FILE) if not (ca_dir / f).exists()]
    if missing:
        raise FileNotFoundError(
            f"{ca_dir} is not a CA dir: no {', '.join(missing)} (`murmur ca init` makes one)"
        )
    key = load_key(ca_dir / CA_KEY_FILE)
    cert = read_cert(ca_dir / CA_CERT_FILE)
    if spki_of(cert.public_key()) != spki_of(key.public_key()):
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
    write_atomic(out_dir / CERT_FILE, pem_of(cert), mode=0o644)
    write_atomic(out_dir / CA_CERT_FILE, pem_of(ca_cert), mode=0o644)
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
