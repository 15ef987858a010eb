"""Forwarded calls: how a member reaches a node that nobody can dial and that holds no session
to it, through one of the node's relays (node/transport/session.py has the sessions).

What a relay passes on is checked end to end, so that a relay can only drop or delay it, and
the node finds out when it does:

* The maker signs each forwarded call with its key: the node it is for, the relay it goes
  through, the method, a sequence number of its own and the message. The relay checks the
  signature and that it has not passed that number on before; the node checks both again, and
  that the call came down the session of the relay it names. A call that fails there was
  altered or replayed by that relay (an honest one refuses such calls from their makers), and
  the node stops naming it.
* The node signs its answer the same way, so the maker knows the answer is the node's.
* The node probes each of its relays: a call from itself to itself through the relay, which
  must come back within the forward timeout, signed and in sequence. A relay that drops or
  holds back its probes (two in a row) is no longer named (node/daemon/dialout.py). A probe and
  its answer carry no certificate (the relay checks it against the one the node proved when it
  opened the session, and the node knows its own), which keeps them to about 200 bytes.

Each member keeps to the relay that passed its last call on for a node, and before that prefers
the node's relays in an order of its own (``gossip.relays.relay_order``): so the members' calls
spread over a node's relays instead of all going through the first one its record names.

A relay can tell a node's probes from other calls (a probe names its method; other calls carry
their maker's certificate): the probes catch relays that fail or misbehave toward the node,
while a relay that drops other members' calls only is left by those members, who try the
node's next relay.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from dataclasses import dataclass
from enum import Enum

from gossip.refusals import Reason
from node.security.pki import CertificateRefused, NodeCertificates, TlsFiles
from node.transport import wire
from node.transport.session import sign, signed_by

__all__ = [
    "FORWARDED_METHODS",
    "PROBE",
    "ForwardChecks",
    "Forwarder",
    "Seen",
    "SeqWindows",
    "Verdict",
    "answer_claim",
    "forward_claim",
]

pb = wire.pb

#: The method of a node's probe of its own relay (answered by the node's session end itself).
PROBE = "Probe"

#: What a relay passes on for members without a session of their own: membership, and probes.
FORWARDED_METHODS = frozenset({"Swim", PROBE})

#: Sequence numbers kept per maker, the newest; an older one is refused (not blamed).
WINDOW = 1024
#: Makers whose numbers are kept (the least recently heard forgotten first).
MAKERS = 4096


def forward_claim(to: str, via: str, method: str, seq: int, message: bytes) -> bytes:
    """What the maker of a forwarded call signs."""
    return f"murmur-forward|{to}|{via}|{method}|{seq}|".encode() + message


def answer_claim(to: str, via: str, seq: int, message: bytes) -> bytes:
    """What the node a forwarded call was for signs of its answer."""
    return f"murmur-forward-answer|{to}|{via}|{seq}|".encode() + message


class Seen(Enum):
    FRESH = "fresh"
    REPLAYED = "replayed"  # taken before: whoever passed it on again is at fault
    OLD = "old"  # below the window: refused, nobody blamed (it may only be late)


class SeqWindows:
    """The sequence numbers taken from each maker, within a window below the newest."""

    def __init__(self, window: int = WINDOW, makers: int = MAKERS) -> None:
        self._window = window
        self._makers = makers
        self._taken: OrderedDict[str, set[int]] = OrderedDict()
        self._newest: dict[str, int] = {}

    def take(self, maker: str, seq: int) -> Seen:
        taken = self._taken.get(maker)
        if taken is None:
            taken = self._taken[maker] = set()
            self._newest[maker] = seq
            if len(self._taken) > self._makers:
                old, _ = self._taken.popitem(last=False)
                del self._newest[old]
        self._taken.move_to_end(maker)
        newest = self._newest[maker]
        if seq in taken:
            return Seen.REPLAYED
        if seq <= newest - self._window:
            return Seen.OLD
        taken.add(seq)
        if seq > newest:
            self._newest[maker] = newest = seq
            floor = newest - self._window
            if len(taken) > 2 * self._window:
                taken.difference_update([s for s in taken if s <= floor])
        return Seen.FRESH


class Forwarder:
    """The maker's end: each forwarded call signed, with a number it never used before (they
    start at the clock's nanoseconds, so a restarted node does not reuse its old ones)."""

    def __init__(self, tls: TlsFiles | None) -> None:
        self.tls = tls
        self._seq = itertools.count(time.time_ns())

    def frame(self, to: str, via: str, method: str, message: bytes) -> wire.pb.SessionFrame:
        seq = next(self._seq)
        frame = pb.SessionFrame(
            method=method, message=message, has_message=True, end=True, origin_seq=seq, via=via
        )
        if self.tls is not None:
            if method != PROBE:  # a probe's maker is the session's holder: both ends know it
                frame.origin_certificate = self.tls.cert_pem
            frame.origin_signature = sign(
                self.tls.key_pem, forward_claim(to, via, method, seq, message)
            )
        return frame

    def answer_signer(
        self, to: str, via: str, call: wire.pb.SessionFrame, answer: wire.pb.SessionFrame
    ) -> bytes | None:
        """The certificate whose key signed ``answer`` as the answer to ``call``; None when the
        signature does not hold. Without TLS nothing is signed: b"" for any answer."""
        if self.tls is None:
            return b""
        # A probe's answer is this node's own: no certificate comes with it.
        cert = self.tls.cert_pem if call.method == PROBE else bytes(answer.origin_certificate)
        claim = answer_claim(to, via, call.origin_seq, bytes(answer.message))
        return cert if signed_by(cert, claim, bytes(answer.origin_signature)) else None


@dataclass(frozen=True)
class Verdict:
    """What one end (the relay, or the node) makes of a forwarded call.

    Args:
        maker: the certificate of the member that made it (None without TLS).
        refusal: (reason, detail) when it is refused.
        relay_at_fault: at the node only: the relay that passed it on altered or replayed it.
    """

    maker: bytes | None
    refusal: tuple[Reason, str] | None = None
    relay_at_fault: bool = False


class ForwardChecks:
    """The checks of forwarded calls, at the relay (before it passes one on) and at the node
    it is for (before it runs one). The same at both, so that what an honest relay passes on
    holds at the node, and what does not hold there is the relay's doing.

    Args:
        tls: this member's files (None: --insecure, where nothing is checked).
        certs: the swarm's certificate verifier (None with --insecure).
    """

    def __init__(self, tls: TlsFiles | None, certs: NodeCertificates | None) -> None:
        self.tls = tls
        self.certs = certs
        self.windows = SeqWindows()

    def check(
        self,
        frame: wire.pb.SessionFrame,
        to: str,
        *,
        holder: tuple[str, bytes] | None = None,
        via: str = "",
    ) -> Verdict:
        """``frame``: the call, for the node at ``to``. At the relay, ``holder`` is the id and
        certificate of the node that holds the session for ``to`` (a probe is its own, and
        comes without a certificate); at the node, None (a probe is this node's own), and
        ``via`` the relay whose session it came down."""
        at_node = holder is None
        if at_node and frame.via != via:
            detail = f"the call was sent through {frame.via!r}, and came through {via!r}"
            return Verdict(None, (Reason.MALFORMED, detail))
        if self.tls is None or self.certs is None:
            return Verdict(None)
        method, message, seq = frame.method, bytes(frame.message), int(frame.origin_seq)
        maker = bytes(frame.origin_certificate)
        if method == PROBE:
            maker = holder[1] if holder is not None else self.tls.cert_pem
        via = frame.via
        claim = forward_claim(to, via, method, seq, message)
        if not signed_by(maker, claim, bytes(frame.origin_signature)):
            detail = "the forwarded call is not signed by the certificate it shows"
            return Verdict(maker, (Reason.IDENTITY, detail), relay_at_fault=at_node)
        try:
            maker_id = self.certs.node_id(maker)
        except CertificateRefused as err:  # revocations may reach the two ends apart: no blame
            return Verdict(maker, (Reason.CERTIFICATE, f"the maker's certificate: {err}"))
        seen = self.windows.take(maker_id, seq)
        if seen is Seen.REPLAYED:
            detail = f"forwarded call {seq} from {maker_id[:8]} was taken before"
            return Verdict(maker, (Reason.STALE, detail), relay_at_fault=at_node)
        if seen is Seen.OLD:
            return Verdict(maker, (Reason.STALE, f"forwarded call {seq} is too old"))
        return Verdict(maker)

    def sign_answer(
        self, to: str, via: str, call: wire.pb.SessionFrame, answer: wire.pb.SessionFrame
    ) -> None:
        """Sign ``answer`` to the forwarded ``call`` as this node's own (nothing without TLS)."""
        if self.tls is None:
            return
        if call.method != PROBE:  # the prober knows its own certificate
            answer.origin_certificate = self.tls.cert_pem
        answer.origin_signature = sign(
            self.tls.key_pem, answer_claim(to, via, call.origin_seq, bytes(answer.message))
        )
