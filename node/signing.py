"""Signed member records: a node signs what only it may say about itself, anyone checks it.

A record carries the member's public key (DER); its SHA-256 must be the member's id, so nobody
can put a key of their own on someone else's record, and the signature (ECDSA P-256, SHA-256)
must hold over :meth:`gossip.swim.MemberRecord.claim`. A relay can then neither move a member to
another address nor announce that it left.
"""

from __future__ import annotations

import functools
import hashlib
from collections import OrderedDict
from collections.abc import Callable

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gossip.swim import MemberRecord
from node.identity import Identity

__all__ = ["MemberVerifier", "public_key_der", "record_signer", "signature_holds"]

_ECDSA = ec.ECDSA(hashes.SHA256())


def public_key_der(identity: Identity) -> bytes:
    return identity.key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def record_signer(identity: Identity) -> Callable[[bytes], bytes]:
    """Signs with the node's key (the one its id and certificate are for)."""
    key = identity.key

    def sign(data: bytes) -> bytes:
        return key.sign(data, _ECDSA)

    return sign


class MemberVerifier:
    """Checks member records; remembers the last ``cache`` good ones, since the same records
    come back many times as they are gossiped around."""

    def __init__(self, cache: int = 4096) -> None:
        self._good: OrderedDict[tuple[bytes, bytes, bytes], None] = OrderedDict()
        self._cache = cache

    def __call__(self, record: MemberRecord) -> bool:
        if not record.public_key or not record.signature:
            return False
        claim = record.claim()
        entry = (claim, record.public_key, record.signature)
        if entry in self._good:
            self._good.move_to_end(entry)
            return True
        if hashlib.sha256(record.public_key).hexdigest()[:32] != record.node_id:
            return False
        try:
            key = serialization.load_der_public_key(record.public_key)
            if not isinstance(key, ec.EllipticCurvePublicKey):
                return False
            key.verify(record.signature, claim, _ECDSA)
        except (ValueError, TypeError, InvalidSignature):
            return False
        self._good[entry] = None
        if len(self._good) > self._cache:
            self._good.popitem(last=False)
        return True


@functools.lru_cache(maxsize=4096)
def signature_holds(public_key: bytes, data: bytes, signature: bytes) -> bool:
    """Whether ``signature`` over ``data`` holds for ``public_key`` (DER, P-256): how an
    accuser's signature on a suspicion is checked (``Swim.check_signature``). Cached, failures
    too, since the same accusations come back many times as they are gossiped around."""
    try:
        key = serialization.load_der_public_key(public_key)
        if not isinstance(key, ec.EllipticCurvePublicKey):
            return False
        key.verify(signature, data, _ECDSA)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True
