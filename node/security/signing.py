"""Signed member records, and admission by the swarm's CA.

A record carries the member's public key (DER), the certificate the swarm's CA issued for it
(DER), and the member's signature (ECDSA P-256, SHA-256) over
:meth:`gossip.swim.MemberRecord.claim`. A record is admitted when

* the SHA-256 of its key is its id, so nobody can put a key of their own on someone else's record;
* (with a CA) its certificate is a node certificate of the swarm's CA (``node/security/pki.py``:
  ECDSA P-256, not a CA, issued by the CA itself, valid now) for that same id, so that only the
  CA can mint identities: an insider with one certificate can sign records for itself only;
* its signature holds, so a relay can neither move a member to another address nor announce
  that it left.

Revocation is checked beside this, by the caller (``node/daemon/peers.py``). Without a CA (plain
TCP, ``--insecure``) there is no admission: any key may make up a member.

Checking costs two ECDSA verifications for a new member and one for each new record of a known
one. :class:`MemberVerifier` remembers both verdicts, good and bad, so a record seen again costs a
look-up; :class:`RecordScreen` does the checks that records arriving from the network need on a
thread of its own, ahead of the membership protocol, within a budget per peer.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gossip.clock import Clock
from gossip.swim import MemberRecord
from node.security.identity import Identity
from node.security.penalties import RateConfig, RateLimiter
from node.security.pki import CertificateExpired, CertificateRefused, NodeCertificates

__all__ = [
    "MemberVerifier",
    "RecordScreen",
    "Screened",
    "certificate_der",
    "public_key_der",
    "record_signer",
    "signature_holds",
]

_ECDSA = ec.ECDSA(hashes.SHA256())


def public_key_der(identity: Identity) -> bytes:
    return identity.key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def certificate_der(cert_pem: bytes) -> bytes:
    """The DER form of a PEM certificate, as member records carry it."""
    from cryptography import x509

    return x509.load_pem_x509_certificate(cert_pem).public_bytes(serialization.Encoding.DER)


def record_signer(identity: Identity) -> Callable[[bytes], bytes]:
    """Signs with the node's key (the one its id and certificate are for)."""
    key = identity.key

    def sign(data: bytes) -> bytes:
        return key.sign(data, _ECDSA)

    return sign


class _Lru:
    """A bounded map, least recently used forgotten first; safe across threads."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._items: OrderedDict[object, object] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: object) -> object | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: object, value: object) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            if len(self._items) > self._size:
                self._items.popitem(last=False)


class MemberVerifier:
    """Decides which member records to admit (see the module's docstring); it is the check
    ``Swim.verify`` runs on every record.

    Args:
        ca_pem: the swarm CA's certificate; None (plain TCP) checks keys and signatures only.
        counts: where dropped records are counted, by reason (the node's rejection counters).
        cache: verdicts on records remembered, good and bad alike.
    """

    def __init__(
        self,
        ca_pem: bytes | None = None,
        counts: Counter[str] | None = None,
        cache: int = 8192,
    ) -> None:
        self.certificates = NodeCertificates(ca_pem) if ca_pem is not None else None
        self.counts: Counter[str] = counts if counts is not None else Counter()
        self._verdicts = _Lru(cache)  # (claim, key, signature) -> bool
        self._keys = _Lru(cache)  # DER -> the loaded public key
        #: Signatures and certificates verified (not answered from a cache).
        self.verified = 0

    def __call__(self, record: MemberRecord) -> bool:
        """Whether to admit ``record``; a dropped one is counted as ``unadmitted``."""
        verdict = self.verdict(record)
        if verdict is None:
            verdict = self.check(record)
        if not verdict:
            self.counts["unadmitted"] += 1
        return verdict

    def verdict(self, record: MemberRecord) -> bool | None:
        """The verdict on ``record`` if it costs no signature check (it is refused by its
        shape, or was judged before); None when a check is needed (:meth:`check`)."""
        if not record.public_key or not record.signature:
            return False
        if hashlib.sha256(record.public_key).hexdigest()[:32] != record.node_id:
            return False
        if self.certificates is not None:
            if not record.certificate:
                return False
            if not self.certificates.cached(record.certificate):
                return None
            if not self._certified(record):
                return False
        known = self._verdicts.get(self._key(record))
        return None if known is None else bool(known)

    def check(self, record: MemberRecord) -> bool:
        """The whole check, whatever it costs; the verdict is remembered."""
        cheap = self.verdict(record)
        if cheap is not None:
            return cheap
        if self.certificates is not None and not self._certified(record):
            return False  # the certificate was judged just now, and did not do
        self.verified += 1
        good = self._signature_holds(record)
        self._verdicts.put(self._key(record), good)
        return good

    def blameworthy(self, record: MemberRecord) -> bool:
        """Whether a refused record is one that no honest member relays: refused for anything
        but a certificate outside its validity (machines' clocks differ a little)."""
        if self.certificates is not None and record.certificate:
            try:
                self.certificates.node_id(record.certificate)
            except CertificateExpired:
                return False
            except CertificateRefused:
                return True
        return True

    def _certified(self, record: MemberRecord) -> bool:
        assert self.certificates is not None
        try:
            return self.certificates.node_id(record.certificate) == record.node_id
        except CertificateRefused:
            return False

    @staticmethod
    def _key(record: MemberRecord) -> tuple[bytes, bytes, bytes]:
        return (record.claim(), record.public_key, record.signature)

    def _signature_holds(self, record: MemberRecord) -> bool:
        key = self._keys.get(record.public_key)
        try:
            if key is None:
                key = serialization.load_der_public_key(record.public_key)
                if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(
                    key.curve, ec.SECP256R1
                ):
                    return False
                self._keys.put(record.public_key, key)
            assert isinstance(key, ec.EllipticCurvePublicKey)
            key.verify(record.signature, record.claim(), _ECDSA)
        except (ValueError, TypeError, InvalidSignature):
            return False
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


@dataclass(frozen=True)
class Screened:
    """What :meth:`RecordScreen.screen` made of a batch of records."""

    records: tuple[MemberRecord, ...]  # to hand on: every verdict among them is now cached
    over_budget: int  # dropped unchecked: the peer's budget of checks was spent
    #: Refused for a reason no honest relay has (a bad signature, no certificate of the CA for
    #: the id, ...): what counts against the peer.
    blamed: int


class RecordScreen:
    """Checks the records a peer sent before the membership protocol sees them, off the event
    loop and within a budget per peer, so that a flood of records costs the node a bounded
    share of one core however they are made.

    Records whose verdict is free (cached, or refused by their shape) pass at once; the others
    each take a token of the peer's budget (``rate`` per second, ``burst`` at once, enough for a
    joiner's hello) and are checked on a thread of their own; records past the budget are dropped
    unchecked (an honest record comes again with the next gossip). Afterwards every record
    handed on has a cached verdict, so ``Swim.verify`` decides it with a look-up.

    Args:
        verifier: the node's record check.
        clock: for the budgets.
        rate: checks per second per peer; at ~0.2 ms a check, 100/s is 2% of a core.
        burst: checks a peer may have at once after a quiet spell.
    """

    def __init__(
        self, verifier: MemberVerifier, clock: Clock, rate: float = 100.0, burst: float = 2000.0
    ) -> None:
        self.verifier = verifier
        self._budget = RateLimiter(RateConfig(rate=rate, burst=burst), clock)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify")

    async def screen(
        self,
        peer: str,
        records: Sequence[MemberRecord],
        budgeted: bool = True,
        skip: Callable[[str], bool] = lambda node_id: False,
    ) -> Screened:
        """Check ``records`` from ``peer``; ``budgeted`` False for records this node asked for
        (a hello's answer). Records of ids in ``skip`` (the revoked) pass unchecked."""
        keep: list[MemberRecord] = []
        work: list[MemberRecord] = []
        over = 0
        for record in records:
            if skip(record.node_id) or self.verifier.verdict(record) is not None:
                keep.append(record)
            elif over or (budgeted and not self._budget.allow(peer)):
                over += 1  # once the budget is spent, it stays spent for this batch
            else:
                keep.append(record)
                work.append(record)
        if work:
            await asyncio.get_running_loop().run_in_executor(
                self._pool, lambda: [self.verifier.check(r) for r in work]
            )
        blamed = sum(
            not skip(r.node_id)
            and self.verifier.verdict(r) is False
            and self.verifier.blameworthy(r)
            for r in keep
        )
        return Screened(tuple(keep), over, blamed)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
