"""Revoked nodes: a list of node ids signed by the swarm's CA, spread by the nodes themselves.

``murmur ca revoke CA_DIR NODE_ID...`` (full ids, or unique prefixes of ids the CA issued)
writes ``revoked.json`` in the CA dir: a version number,
the ids, and the CA's signature over both. A node adopts a list that is newer than its own and
signed by its CA, wherever it comes from: the ``revoked.json`` in its state dir (looked at every
few seconds, so an operator can drop one in), a hello, or a membership message (each node passes
a new list on with its next few messages, as it does membership news). Once adopted, the list
takes effect at once: the revoked nodes' calls are refused, they leave every member view and
cannot come back, and links to them close. No node restarts.

Lists come from the network and from dropped-in files, so parsing is bounded before anything
else: at most :data:`MAX_BLOB_BYTES`, ASCII, exactly the schema's one object and one array (so no
nesting can reach the JSON parser's recursion), exactly the keys ``version`` (a positive
integer), ``revoked`` (at most :data:`MAX_REVOKED` ids) and ``signature`` (base64); the CA's
signature is checked last.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from node.security.identity import load_key, write_atomic
from node.security.pki import CA_CERT_FILE, CA_KEY_FILE, resolve_node_id

__all__ = [
    "MAX_BLOB_BYTES",
    "MAX_REVOKED",
    "REVOKED_FILE",
    "Revocations",
    "parse_revocations",
    "read_revocations_file",
    "revoke",
]

REVOKED_FILE = "revoked.json"
_ECDSA = ec.ECDSA(hashes.SHA256())
#: Ids a list may hold: a fleet that revokes more than this needs a new CA, not a longer list.
MAX_REVOKED = 10_000
#: Room for MAX_REVOKED ids of up to 32 characters, their quotes and commas, and the rest; a
#: bigger blob is refused before it is parsed.
MAX_BLOB_BYTES = 512 << 10
#: What a node id may look like in a list (as on the wire: node/transport/wire.py); no brackets or
#: braces, which the structural check below relies on.
_ID_RE = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")
_KEYS = frozenset({"version", "revoked", "signature"})
#: A DER ECDSA signature over P-256 is at most 72 bytes: 96 base64 characters.
_MAX_SIGNATURE_CHARS = 200
_MAX_VERSION = 1 << 53


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


def _check_ids(node_ids: list[str]) -> None:
    bad = [i for i in node_ids if not _ID_RE.fullmatch(i)]
    if bad:
        raise ValueError(f"{bad[0][:140]!r} is not a node id (the id `murmur ca issue` printed)")


def revoke(ca_dir: Path, node_ids: list[str]) -> Revocations:
    """Add ``node_ids`` to the CA's list (a new version, signed) and write it.

    Each id is a full node id, or a unique prefix of one the CA issued (:func:`resolve_node_id`);
    anything else is refused before anything is written.

    Raises:
        ValueError: an id is no id, or a prefix of none or several that the CA issued; the list
            would grow past :data:`MAX_REVOKED`; or the CA dir's current list does not parse.
    """
    node_ids = [resolve_node_id(ca_dir, i) for i in node_ids]
    _check_ids(node_ids)
    key = load_key(ca_dir / CA_KEY_FILE)
    path = ca_dir / REVOKED_FILE
    current = Revocations.none()
    if path.exists():
        ca_pem = (ca_dir / CA_CERT_FILE).read_bytes()
        current = parse_revocations(path.read_bytes(), ca_pem)
    ids = current.node_ids | frozenset(node_ids)
    if len(ids) > MAX_REVOKED:
        raise ValueError(f"a list holds at most {MAX_REVOKED} ids; this one would hold {len(ids)}")
    version = current.version + 1
    payload = _payload(version, ids)
    signature = base64.b64encode(key.sign(payload, _ECDSA)).decode()
    blob = json.dumps({"version": version, "revoked": sorted(ids), "signature": signature})
    write_atomic(path, blob.encode(), mode=0o644)
    return Revocations(version, ids, blob.encode())


def _malformed(what: str) -> ValueError:
    return ValueError(f"the revocation list is malformed: {what}")


def _parse_schema(blob: bytes) -> tuple[int, frozenset[str], bytes]:
    """(version, ids, signature) of a blob that fits the schema; raises ValueError otherwise."""
    if len(blob) > MAX_BLOB_BYTES:
        raise ValueError(f"the revocation list is too large ({len(blob)} > {MAX_BLOB_BYTES} bytes)")
    if not blob.isascii():
        raise _malformed("it is not ASCII")
    # One object holding one array of ids: counted before parsing, so that no nesting, however
    # deep, ever reaches the JSON parser (ids and base64 hold no brackets or braces).
    if blob.count(b"{") != 1 or blob.count(b"[") != 1:
        raise _malformed("it is not one object holding one list")
    try:
        raw = json.loads(blob)
    except (ValueError, RecursionError) as exc:
        raise _malformed(str(exc)[:200]) from None
    if not isinstance(raw, dict) or raw.keys() != _KEYS:
        keys = sorted(raw) if isinstance(raw, dict) else type(raw).__name__
        raise _malformed(f"expected exactly the keys {sorted(_KEYS)}, got {keys}"[:300])
    version, revoked, signature = raw["version"], raw["revoked"], raw["signature"]
    if type(version) is not int or not 0 < version < _MAX_VERSION:
        raise _malformed(f"version must be a positive integer, not {str(version)[:40]!r}")
    if not isinstance(revoked, list) or len(revoked) > MAX_REVOKED:
        raise _malformed(f"revoked must be a list of at most {MAX_REVOKED} node ids")
    if not all(isinstance(i, str) and _ID_RE.fullmatch(i) for i in revoked):
        raise _malformed("revoked holds something that is not a node id")
    if not isinstance(signature, str) or len(signature) > _MAX_SIGNATURE_CHARS:
        raise _malformed("signature must be a short base64 string")
    try:
        sig = base64.b64decode(signature, validate=True)
    except ValueError:
        raise _malformed("signature is not base64") from None
    return version, frozenset(revoked), sig


def parse_revocations(blob: bytes, ca_pem: bytes) -> Revocations:
    """Check a list against its schema and the CA's certificate.

    Raises:
        ValueError: it is too large, malformed, or not signed by this CA; the message says which.
    """
    version, ids, signature = _parse_schema(blob)
    ca_key = x509.load_pem_x509_certificate(ca_pem).public_key()
    if not isinstance(ca_key, ec.EllipticCurvePublicKey):
        raise ValueError("the CA's key is not an EC key")
    try:
        ca_key.verify(signature, _payload(version, ids), _ECDSA)
    except InvalidSignature:
        raise ValueError("the revocation list is not signed by this swarm's CA") from None
    return Revocations(version, ids, blob)


def read_revocations_file(path: Path) -> bytes:
    """The bytes of a dropped-in list, read no further than one byte past the limit (so that a
    huge file costs nothing and still fails the size check); empty when there is no file."""
    try:
        with path.open("rb") as f:
            return f.read(MAX_BLOB_BYTES + 1)
    except FileNotFoundError:
        return b""
