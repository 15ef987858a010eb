"""A node's long-lived identity: an ECDSA P-256 key in its state dir; its id hashes the public key.

Ids derived from keys cannot be claimed by anyone without the key: mutual TLS binds the key to
the connection, and a peer's id is recomputed from the certificate it presents. The key is
ECDSA P-256 rather than Ed25519 because gRPC's TLS (BoringSSL) negotiates no signature algorithm
for Ed25519 certificates.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

__all__ = [
    "KEY_FILE",
    "Identity",
    "check_private",
    "load_key",
    "load_or_create_identity",
    "node_id_of",
    "write_atomic",
]

KEY_FILE = "node_key.pem"

log = logging.getLogger(__name__)


def node_id_of(public_key: ec.EllipticCurvePublicKey) -> str:
    """32 hex characters of SHA-256 over the public key's DER SubjectPublicKeyInfo."""
    der = public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(der).hexdigest()[:32]


@dataclass(frozen=True)
class Identity:
    """A node's private key and the id derived from its public half."""

    key: ec.EllipticCurvePrivateKey
    node_id: str

    @classmethod
    def from_key(cls, key: ec.EllipticCurvePrivateKey) -> Identity:
        """The identity of ``key``."""
        return cls(key, node_id_of(key.public_key()))


def write_atomic(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` with ``mode`` (0600 unless told), atomically.

    A crash leaves the old file or the new one, never half of either.
    """
    tmp = path.with_name(path.name + ".tmp")
    # Created with its final mode, so a key is never readable by others, not even briefly.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        # A stale .tmp left by a crash keeps its old mode through O_CREAT, and umask may narrow.
        os.fchmod(f.fileno(), mode)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def check_private(path: Path) -> None:
    """Refuse a key file that every user of the machine may read or write; warn, loudly, about
    one its group may.

    Like ssh, which ignores a private key others can read: anyone who reads the key can act as
    this node (or, for the CA's, admit nodes) until it is revoked. Unlike ssh, a key its group
    may read is only warned about: container runtimes and Kubernetes (``fsGroup``) grant a
    service's group read access on purpose, and refusing would break those deployments.

    Raises:
        ValueError: the file is accessible to every user (the message says how to fix it).
    """
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o007:
        raise ValueError(
            f"{path} is accessible to every user of this machine (mode {mode:04o}): anyone "
            f"could read the key and act as its owner; `chmod 600 {path}`, and if others may "
            "have copied it, issue a new key and revoke the old id"
        )
    if mode & 0o070:
        log.warning(
            "UNPROTECTED PRIVATE KEY: %s is accessible to its group (mode %04o); everyone in the "
            "group can act as its owner. `chmod 600 %s` unless the group is this service's own",
            path,
            mode,
            path,
        )


def load_key(path: Path) -> ec.EllipticCurvePrivateKey:
    """The P-256 key in ``path``; a key of another kind, or one every user may read, is refused
    with what to do about it (see :func:`check_private`)."""
    check_private(path)
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        raise ValueError(
            f"{path} holds a {type(key).__name__.removeprefix('_')} key, not an ECDSA P-256 one "
            "(keys made by older versions were Ed25519, which gRPC's TLS cannot use); remove "
            "the file to make a new identity, or use another state dir"
        )
    return key


def load_or_create_identity(state_dir: Path) -> Identity:
    """The identity stored in ``state_dir``, made (mode 0600) on first use."""
    path = state_dir / KEY_FILE
    if path.exists():
        return Identity.from_key(load_key(path))
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    state_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(path, pem)
    return Identity.from_key(key)
