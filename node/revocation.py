"""Revoked nodes: a list of node ids signed by the swarm's CA, spread by the nodes themselves.

``murmur ca revoke CA_DIR NODE_ID...`` (full ids, or unique prefixes of ids the CA issued)
writes ``revoked.json`` in the CA dir: a version number,
the ids, and the CA's signature over both. A node adopts a list that is newer than its own and
signed by its CA, wherever it comes from: the ``revoked.json`` in its TLS dir (looked at every
few seconds, so an operator can drop one in), a hello, or a membership message (each node passes
a new list on with its next few messages, as it does membership news). Once adopted, the list
takes effect at once: the revoked nodes' calls are refused, they leave every member view and
cannot come back, and links to them close. No node restarts.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from node.identity import load_key, write_atomic
from node.pki import CA_CERT_FILE, CA_KEY_FILE, resolve_node_id

__all__ = ["REVOKED_FILE", "Revocations", "parse_revocations", "revoke"]

REVOKED_FILE = "revoked.json"
_ECDSA = ec.ECDSA(hashes.SHA256())
#: More ids than any sane list holds: a bigger blob is refused before it is parsed.
MAX_BLOB_BYTES = 1 << 20


@dataclass(frozen=True)
class Revocations:
    version: int
    node_ids: frozenset[str]
    blob: bytes  # the signed JSON, as it travels

    @classmethod
    def none(cls) -> Revocations:
        return cls(0, frozenset(), b"")


def _payload(version: int, node_ids: frozenset[str]) -> bytes:
    return json.dumps({"version": version, "revoked": sorted(node_ids)}, sort_keys=True).encode()


def revoke(ca_dir: Path, node_ids: list[str]) -> Revocations:
    """Add ``node_ids`` to the CA's list (a new version, signed) and write it.

    Each id is a full node id, or a unique prefix of one the CA issued (:func:`resolve_node_id`);
    anything else is refused before anything is written.

    Raises:
        ValueError: an id is no id, or a prefix of none or several that the CA issued.
    """
    node_ids = [resolve_node_id(ca_dir, i) for i in node_ids]
    key = load_key(ca_dir / CA_KEY_FILE)
    path = ca_dir / REVOKED_FILE
    current = Revocations.none()
    if path.exists():
        ca_pem = (ca_dir / CA_CERT_FILE).read_bytes()
        current = parse_revocations(path.read_bytes(), ca_pem)
    ids = current.node_ids | frozenset(node_ids)
    version = current.version + 1
    payload = _payload(version, ids)
    signature = base64.b64encode(key.sign(payload, _ECDSA)).decode()
    blob = json.dumps({"version": version, "revoked": sorted(ids), "signature": signature})
    write_atomic(path, blob.encode(), mode=0o644)
    return Revocations(version, ids, blob.encode())


def parse_revocations(blob: bytes, ca_pem: bytes) -> Revocations:
    """Check a list against the CA's certificate.

    Raises:
        ValueError: it is malformed, or not signed by this CA.
    """
    if len(blob) > MAX_BLOB_BYTES:
        raise ValueError("the revocation list is too large")
    try:
        raw = json.loads(blob)
        version = int(raw["version"])
        ids = frozenset(str(i) for i in raw["revoked"])
        signature = base64.b64decode(raw["signature"], validate=True)
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"the revocation list is malformed: {exc}") from None
    ca_key = x509.load_pem_x509_certificate(ca_pem).public_key()
    if not isinstance(ca_key, ec.EllipticCurvePublicKey):
        raise ValueError("the CA's key is not an EC key")
    try:
        ca_key.verify(signature, _payload(version, ids), _ECDSA)
    except InvalidSignature:
        raise ValueError("the revocation list is not signed by this swarm's CA") from None
    return Revocations(version, ids, blob)
