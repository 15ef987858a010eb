"""Why a node refuses a message, and what each reason means to everyone who meets it.

A receiver refuses a message with a :class:`Reason` (it travels in gRPC's ``murmur-reason``
trailer, and labels the node's rejection counters). Each reason is classified here, once, for
every part of the node that reacts to a refusal:

* the link that sent it (gossip/link.py): whether the refusal only says the receiver lacks this
  node's log (``resync``: a gap or a stale message; a snapshot repairs it at once and it is no
  failure), how soon to try again (``retry``), and whether it is ``expected`` in a healthy swarm
  (churn, a node starting or stopping), so not worth a warning;
* the receiver: whether it ``counts`` against the sender (node/security/penalties.py bans a sender
  whose messages keep being bad in themselves; what honest peers meet during churn never counts);
* a joiner: whether a refused hello is worth repeating (``retryable``: the member is starting
  or stopping) or ends the join ``for_good`` (another task, protocol or an address nobody dials);
* the transport: whether the message is wrong in itself (``invalid_argument``, gRPC's
  INVALID_ARGUMENT) or only does not fit the receiver's state (FAILED_PRECONDITION).

:func:`reason_of` maps the core's own errors (gossip/replicas.py, gossip/codecs.py) to reasons,
so the daemon's service and the simulator refuse a bad delta with the same one.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, StrEnum

__all__ = ["REFUSALS", "Reason", "Refusal", "Retry", "reason_of", "refusal"]


class Reason(StrEnum):
    """Why a message was refused; also the label of the node's rejection counters."""

    MALFORMED = "malformed"
    PROTOCOL_VERSION = "protocol_version"
    FINGERPRINT = "fingerprint"
    UNKNOWN_SENDER = "unknown_sender"
    BAD_PAYLOAD = "bad_payload"
    NON_FINITE = "non_finite"
    GAP = "gap"
    STALE = "stale"
    NOT_READY = "not_ready"
    SHUTTING_DOWN = "shutting_down"
    #: A joiner's advertised address does not answer, or someone else answers there.
    BAD_ADDRESS = "bad_address"
    #: The message speaks for another node than the one its TLS certificate names.
    IDENTITY = "identity"
    #: The caller's certificate belongs to a node the swarm's CA revoked.
    REVOKED = "revoked"
    #: The sender sends faster than any honest node does.
    RATE_LIMITED = "rate_limited"
    #: The sender sent too many bad messages lately and is kept out for a while.
    BANNED = "banned"
    #: The caller's certificate is from the swarm's CA but unfit for a node (key type, a CA).
    CERTIFICATE = "certificate"
    #: Member records dropped for want of proof that a certificate of the swarm's CA names
    #: their id (counted per record; the message carrying them is taken).
    UNADMITTED = "unadmitted"
    #: Member records dropped unchecked: their relayer spent its budget of signature checks.
    OVER_BUDGET = "over_budget"
    #: A delta or snapshot that would move a replica absurdly far (gossip/replicas.py).
    IMPLAUSIBLE = "implausible"
    #: A revocation list that is too large, malformed, or not signed by the swarm's CA.
    BAD_REVOCATIONS = "bad_revocations"
    #: The node's byte budget (``--byte-budget``) does not allow the model's bytes now: a joiner
    #: pulls from another member.
    BUDGET_SPENT = "budget_spent"
    #: A snapshot named a model by its digest (gossip/digest.py) that the receiver does not
    #: hold: the sender sends the values.
    UNKNOWN_BASE = "unknown_base"


class Retry(Enum):
    """When a link tries again after a refusal (it always resyncs by snapshot first)."""

    AT_ONCE = "at_once"  # the snapshot is the repair
    SOON = "soon"  # the receiver's view lags ours by a protocol period or so
    BACK_OFF = "back_off"  # doubling, jittered back-off


@dataclass(frozen=True)
class Refusal:
    """How the node treats one reason of refusal (see the module's docstring)."""

    retry: Retry = Retry.BACK_OFF
    expected: bool = False
    counts: bool = False
    retryable: bool = False
    for_good: bool = False
    invalid_argument: bool = False

    @property
    def resync(self) -> bool:
        """The refusal only says the receiver lacks our log: a snapshot repairs it, now."""
        return self.retry is Retry.AT_ONCE


_NOT_NOW = Refusal(expected=True, retryable=True)
_BAD = Refusal(counts=True)

#: Every reason's classification; the one place that says what a refusal means.
REFUSALS: dict[Reason, Refusal] = {
    Reason.MALFORMED: Refusal(counts=True, invalid_argument=True),
    Reason.PROTOCOL_VERSION: Refusal(counts=True, for_good=True),
    Reason.FINGERPRINT: Refusal(counts=True, for_good=True),
    Reason.UNKNOWN_SENDER: Refusal(retry=Retry.SOON, expected=True),
    Reason.BAD_PAYLOAD: Refusal(counts=True, invalid_argument=True),
    Reason.NON_FINITE: Refusal(counts=True, invalid_argument=True),
    Reason.GAP: Refusal(retry=Retry.AT_ONCE, expected=True),
    Reason.STALE: Refusal(retry=Retry.AT_ONCE, expected=True),
    Reason.NOT_READY: _NOT_NOW,
    Reason.SHUTTING_DOWN: _NOT_NOW,
    Reason.BAD_ADDRESS: Refusal(for_good=True, invalid_argument=True),
    Reason.IDENTITY: _BAD,
    Reason.REVOKED: Refusal(),
    Reason.RATE_LIMITED: Refusal(),
    Reason.BANNED: Refusal(),
    Reason.CERTIFICATE: Refusal(),
    Reason.UNADMITTED: _BAD,
    Reason.OVER_BUDGET: Refusal(),
    Reason.IMPLAUSIBLE: _BAD,
    Reason.BAD_REVOCATIONS: Refusal(),
    Reason.BUDGET_SPENT: _NOT_NOW,
    Reason.UNKNOWN_BASE: Refusal(retry=Retry.AT_ONCE, expected=True),
}


def refusal(reason: Reason) -> Refusal:
    """The classification of ``reason``; a reason without a row is treated as a plain refusal
    (back off, say so, do not count it against the sender)."""
    return REFUSALS.get(reason, Refusal())


def reason_of(err: Exception) -> Reason:
    """The refusal a core error stands for: the state machine's (gossip/replicas.py) and the
    codecs' (gossip/codecs.py)."""
    # Imported here: the reasons themselves serve commands that start without torch
    # (`murmur status`, tests/node/test_cli_light.py).
    from gossip.codecs import NonFiniteError
    from gossip.replicas import ImplausibleUpdate, SequenceGap, StaleSequence, UnknownPeer

    if isinstance(err, UnknownPeer):
        return Reason.UNKNOWN_SENDER
    if isinstance(err, SequenceGap):
        return Reason.GAP
    if isinstance(err, StaleSequence):
        return Reason.STALE
    if isinstance(err, NonFiniteError):
        return Reason.NON_FINITE
    if isinstance(err, ImplausibleUpdate):
        return Reason.IMPLAUSIBLE
    return Reason.BAD_PAYLOAD
