"""A node's long-lived identity: an Ed25519 key in its state dir; its id hashes the public key.

Ids derived from keys cannot be claimed by anyone without the key (checked once transport
security binds the key to the connection).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

__all__ = ["Identity", "load_or_create_identity", "node_id_of"]

KEY_FILE = "node_key.pem"


def node_id_of(public_raw: bytes) -> str:
    """32 hex characters of SHA-256 over the raw public key."""
    return hashlib.sha256(public_raw).hexdigest()[:32]


@dataclass(frozen=True)
class Identity:
    key: Ed25519PrivateKey
    node_id: str

    @classmethod
    def from_key(cls, key: Ed25519PrivateKey) -> Identity:
        raw = key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        return cls(key, node_id_of(raw))


def load_or_create_identity(state_dir: Path) -> Identity:
    """The identity stored in ``state_dir``, made (mode 0600) on first use."""
    path = state_dir / KEY_FILE
    if path.exists():
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError(f"{path} does not hold an Ed25519 key")
        return Identity.from_key(key)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    state_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return Identity.from_key(key)
