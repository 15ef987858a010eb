"""The link machine: one direction of one edge, this node's log delivered to one neighbour.

A sans-I/O state machine in the style of h11 and swim-protocol's worker: it is told what happened
(events, each with the time) and says what to do next (commands); it never waits, dials, sends
or reads a clock. The daemon's link (node/daemon/links.py, over gRPC or the in-memory transport) and
the simulator's (node/sim/link.py, over a modelled network) are thin drivers of it, so both
follow one protocol:

* the neighbour's replica of this node's public copy x̂ is a replicated log (gossip/replicas.py):
  a snapshot of x̂ starts it, then deltas follow in sequence on a stream, each acknowledged once
  applied. What is queued and when a snapshot is owed instead is the :class:`Outbox`'s call;
* every snapshot opens a new *epoch*: the stream that follows it carries that epoch's deltas,
  and answers (acknowledgements, refusals, failures) name the epoch they belong to. Answers of an
  older epoch are ignored, so a driver never has to drain a stream it dropped;
* a refusal is handled by its reason's classification (gossip/refusals.py): a gap or a stale
  message is repaired by a snapshot at once; a neighbour whose view does not count us yet is
  retried soon; anything else, and any failure to reach it, backs off (doubling, with jitter
  drawn from the injected ``rng``) before the next snapshot;
* the node asks :meth:`Link.busy` whether another round would only wait in line on this link.

Drivers: call :meth:`Link.poll` after every event until it returns None, carry each command
out, report its outcome, and poll again at :meth:`Link.next_deadline` (the end of a back-off)
and, to re-ask ``busy``, at :meth:`Link.overdue_at`.

How what comes next fits on it, unchanged:

* **a connection dialed by either end, carrying both directions** (NAT, relays). The machine
  neither dials nor knows who did: a command names an epoch, and the driver carries it on
  whatever session it holds to that neighbour (a stream it dialed, a session the neighbour
  dialed, a relayed one). The other direction of the same session is the neighbour's own link
  machine, and its deltas land in this node's inbound path (node/daemon/inbound.py), whose answers
  go back on the session. A session that breaks is :meth:`Link.failed` for the epoch it carried.
* **per-link pacing**: ``busy`` and ``poll`` are per link, and nothing here assumes that the
  delta offered to one link is the one offered to the others. A link that sends at its own
  pace is offered, when it is not busy, the change accumulated since its own last send (from a
  public copy of its own, with its own error feedback); a budget of bytes holds ``poll`` until
  the budget allows (``poll`` takes the time for that reason).
* **a codec per link** (``auto``): the machine never looks inside a payload; each delta names
  its codec, so a link changes codec between two deltas without a snapshot. What the choice
  needs, how long each codec's deltas take on the link, the machine measures from its own
  deltas' answers (:attr:`Link.meter`, gossip/link_meter.py).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum

from gossip.link_meter import LinkMeter
from gossip.messages import Delta
from gossip.outbox import Outbox, OutboxConfig
from gossip.refusals import Reason, Refusal, Retry, refusal

__all__ = [
    "Command",
    "Link",
    "LinkConfig",
    "LinkStats",
    "Phase",
    "SendDelta",
    "SendSnapshot",
    "round_pace",
]


@dataclass(frozen=True)
class LinkConfig:
    """Args:
    queue: deltas held for a neighbour; past that the link resyncs with a snapshot instead.
    window: unacknowledged or queued deltas at which the link counts as busy.
    window_bytes, window_s: payload bytes, and seconds of the link's measured pace, in line
        below which more than ``window`` small deltas may be (see gossip/outbox.py).
    overdue_min_s, overdue_factor: when an answer counts as overdue (see gossip/outbox.py).
    call_timeout_s: the deadline of a call a driver makes for the link (a snapshot's grows
        with its bytes: node/daemon/links.py's ``transfer_timeout_s``).
    backoff_min_s, backoff_max_s: the back-off after a failure starts at the first and doubles
        up to the second; each wait is drawn uniformly from its upper half.
    not_neighbour_retry_s: the retry delay while the neighbour does not count us as one yet.
    """

    queue: int = 16  # bounds a link's memory; 16 rounds is seconds of a slow link's traffic
    window: int = 2  # one delta on the wire while the next is queued keeps a link full
    window_bytes: int = 65_536  # one TCP loss recovery on a link must not stop every round
    window_s: float = 0.5  # nor may small deltas queue for seconds on a slow uplink
    overdue_min_s: float = 2.0  # below this, a slow answer is jitter, not a vanished peer
    overdue_factor: float = 4.0  # a few usual answer times: a queue on a slow link is not death
    call_timeout_s: float = 10.0  # a unary call on a working edge link answers well within this
    backoff_min_s: float = 0.1  # a refusal during churn clears within a round trip or two
    backoff_max_s: float = 5.0  # a dead peer costs one snapshot attempt per few seconds
    not_neighbour_retry_s: float = 0.25  # its view lags ours by a protocol period or so

    def __post_init__(self) -> None:
        _ = self.outbox  # checks the queue, the window and the overdue rule
        if not 0 < self.backoff_min_s <= self.backoff_max_s or self.not_neighbour_retry_s <= 0:
            raise ValueError("need 0 < backoff_min_s <= backoff_max_s and a positive retry delay")
        if self.call_timeout_s <= 0:
            raise ValueError("call_timeout_s must be positive")

    @property
    def outbox(self) -> OutboxConfig:
        return OutboxConfig(
            queue=self.queue,
            window=self.window,
            window_bytes=self.window_bytes,
            window_s=self.window_s,
            overdue_min_s=self.overdue_min_s,
            overdue_factor=self.overdue_factor,
        )


@dataclass
class LinkStats:
    """What one link sent. Counts are the machine's; bytes are the driver's to add, since only
    it knows the wire sizes."""

    bytes_sent: int = 0
    deltas_sent: int = 0
    snapshots_sent: int = 0  # answered ones
    named: int = 0  # of them, those that named the model by its digest (gossip/digest.py)
    failures: int = 0  # refusals other than gaps and stale messages, and failures to reach it


@dataclass(frozen=True)
class SendSnapshot:
    """Drop the stream of any earlier epoch, read x̂ (report :meth:`Link.snapshot_taken`), send
    it by a call, and report its answer (:meth:`Link.snapshot_answered`, ``refused``, ``failed``);
    after a good answer this epoch's stream carries the deltas."""

    epoch: int


@dataclass(frozen=True)
class SendDelta:
    """Send ``delta`` on this epoch's stream; report its acknowledgement or what went wrong."""

    epoch: int
    delta: Delta


Command = SendSnapshot | SendDelta


class Phase(Enum):
    IDLE = "idle"  # nothing open: owes a snapshot, now or after a back-off
    SNAPSHOT = "snapshot"  # a snapshot call is out
    STREAM = "stream"  # the epoch's stream carries deltas
    CLOSED = "closed"  # the neighbour is no longer one; nothing more happens


class Link:
    """Args:
    cfg: the link's policy.
    rng: draws the back-off's jitter (injected, so that runs can be repeated).
    hold: asked before each snapshot: the seconds it must wait first (0: none). The byte
        budget's (gossip/budget.py ``wait_s``): a node ahead of its allowance makes only
        heartbeat rounds, and every new or resynced link would otherwise cost a whole model at
        once, which under topology churn (pauses, joins) is most of what a budgeted node sends.
        None: snapshots never wait.
    """

    def __init__(
        self, cfg: LinkConfig, rng: random.Random, hold: Callable[[], float] | None = None
    ) -> None:
        self.cfg = cfg
        self._hold = hold
        #: Until when a snapshot waits for the byte budget (-inf: it does not).
        self.held_until = -math.inf
        self.outbox = Outbox(cfg.outbox)
        self.stats = LinkStats()
        #: How long each codec's deltas take on the link, from their answers.
        self.meter = LinkMeter()
        #: Numbers the snapshots, and the streams that follow them; 0 before the first.
        self.epoch = 0
        self.phase = Phase.IDLE
        self._rng = rng
        self._taken = False  # the current snapshot has been read (and is on its way)
        self._backoff_s = cfg.backoff_min_s
        self._resume_at = -math.inf
        #: Why the last epoch ended badly (a refusal's reason, or "unreachable"); None while
        #: nothing went wrong since the link last streamed.
        self.last_problem: str | None = None
        #: A snapshot of the model the node started from may go by its digest
        #: (gossip/digest.py): until the neighbour said it holds no such model.
        self.may_name = True

    # -- what the node asks -------------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        """Streaming deltas: not resyncing, not backing off after a failure."""
        return self.phase is Phase.STREAM and not self.outbox.needs_snapshot

    def busy(self, now: float, others_answered_sent: float = math.inf) -> bool:
        """Another round now would only wait in line: streaming, or sending a snapshot, with
        ``window`` deltas unanswered or queued behind it. A link that backs off after a failure
        is never busy, so a dead neighbour does not hold up the others' rounds; nor is one whose
        answer is overdue while other neighbours answer later sends (a neighbour that vanished
        without a word: ``Outbox.busy_at``), so it holds them up for a few answer times at
        most."""
        carrying = self.healthy or (self.phase is Phase.SNAPSHOT and self._taken)
        return carrying and self.outbox.busy_at(now, others_answered_sent)

    def progress(self, now: float) -> str:
        """Where the link stands, in words, for a node that waits for its edges: ``not
        dialed``, ``dialing`` (a snapshot owed or being read), ``snapshot sent`` (the call is
        out), ``snapshot acked`` (streaming deltas), or ``backing off`` / ``retrying`` after
        what went wrong last."""
        why = f" after {self.last_problem}" if self.last_problem else ""
        if self.phase is Phase.CLOSED:
            return "closed"
        if self.phase is Phase.STREAM:
            return "snapshot acked"
        if self.phase is Phase.SNAPSHOT:
            return "snapshot sent" if self._taken else f"dialing{why}"
        if now < self._resume_at:
            return f"backing off {self._resume_at - now:.1f} s{why}"
        if now < self.held_until:
            return f"held {self.held_until - now:.1f} s by the byte budget"
        return f"retrying{why}" if self.epoch else "not dialed"

    def next_deadline(self) -> float:
        """When :meth:`poll` may have a command without any event happening (a back-off ends);
        infinity when only an event can bring one."""
        wake = max(self._resume_at, self.held_until)
        if self.phase is Phase.IDLE and wake > -math.inf:
            return wake
        return math.inf

    def overdue_at(self) -> float | None:
        """When the oldest unanswered send becomes overdue, and :meth:`busy` may turn false
        without any event happening; None while nothing is unanswered."""
        return self.outbox.overdue_at()

    # -- commands -----------------------------------------------------------------------------

    def poll(self, now: float) -> Command | None:
        """The next thing to do, or None until an event (or :meth:`next_deadline`)."""
        if self.phase in (Phase.CLOSED, Phase.SNAPSHOT) or now < self._resume_at:
            return None
        if self.outbox.needs_snapshot:
            wait_s = self._hold() if self._hold is not None else 0.0
            if wait_s > 0:
                self.held_until = now + wait_s
                self.phase = Phase.IDLE  # a stream that needs a snapshot carries nothing more
                return None
            self.held_until = -math.inf
            self.epoch += 1
            self.phase = Phase.SNAPSHOT
            self._taken = False
            return SendSnapshot(self.epoch)
        if self.phase is Phase.STREAM:
            delta = self.outbox.next_delta()
            if delta is not None:
                self.outbox.delta_sent(delta, now)
                self.meter.sent(now, delta.payload.codec)
                self.stats.deltas_sent += 1
                self._backoff_s = self.cfg.backoff_min_s  # the link works again
                return SendDelta(self.epoch, delta)
        return None

    # -- events -------------------------------------------------------------------------------

    def offer(self, delta: Delta) -> None:
        """A round's delta for this neighbour; a full queue is dropped in favour of a resync."""
        if self.phase is not Phase.CLOSED:
            self.outbox.offer(delta)

    def resync(self) -> None:
        """Owe the neighbour a snapshot (a new log: another codec, a restarted public copy); the
        stream of this epoch carries nothing more."""
        if self.phase is Phase.STREAM:
            self.phase = Phase.IDLE
        self.outbox.refused()
        self.meter.lost()

    def snapshot_taken(self, epoch: int, seq: int, now: float) -> None:
        """x̂ at ``seq`` was read for ``epoch``'s snapshot, which now leaves."""
        if epoch == self.epoch and self.phase is Phase.SNAPSHOT:
            self.outbox.snapshot_taken(seq, now)
            self._taken = True

    def snapshot_answered(self, epoch: int, now: float, named: bool = False) -> None:
        """The neighbour took ``epoch``'s snapshot (``named``: by its digest): its stream
        carries the deltas after it, unless the queue overflowed meanwhile (then a fresher
        snapshot goes at once)."""
        if epoch != self.epoch or self.phase is not Phase.SNAPSHOT:
            return
        self.outbox.snapshot_answered(now, carried=not named)
        self.stats.snapshots_sent += 1
        self.stats.named += named
        self.last_problem = None
        self.phase = Phase.IDLE if self.outbox.needs_snapshot else Phase.STREAM

    def acked(self, epoch: int, now: float) -> None:
        """The neighbour applied the oldest unanswered delta of ``epoch``."""
        if epoch == self.epoch and self.phase is Phase.STREAM:
            self.outbox.acked(now)
            self.meter.answered(now)

    def refused(self, epoch: int, reason: Reason, now: float) -> Refusal | None:
        """The neighbour refused a message of ``epoch`` (its stream is dead). Returns how the
        refusal was treated, or None when it belonged to an epoch already given up."""
        if not self._current(epoch):
            return None
        self.phase = Phase.IDLE
        self.outbox.refused()  # the queue may still serve after the snapshot
        self.meter.lost()
        treat = refusal(reason)
        self.last_problem = f"a refusal ({reason})"
        if reason is Reason.UNKNOWN_BASE:
            self.may_name = False
        if treat.resync:
            return treat  # the snapshot repairs it, now
        self.stats.failures += 1
        if treat.retry is Retry.SOON:
            self._backoff_s = self.cfg.not_neighbour_retry_s
        self._back_off(now)
        return treat

    def failed(self, epoch: int, now: float) -> bool:
        """``epoch``'s call or stream failed (no answer, a broken connection): whatever the
        neighbour missed, a snapshot covers, after a back-off; the queue is dropped so that a
        dead neighbour holds no memory. Returns False when the epoch was already given up."""
        if not self._current(epoch):
            return False
        self.phase = Phase.IDLE
        self.outbox.lost()
        self.meter.lost()
        self.stats.failures += 1
        self.last_problem = "no answer"
        self._back_off(now)
        return True

    def close(self) -> None:
        """The neighbour is no longer one: the link sends nothing more and holds nothing."""
        self.phase = Phase.CLOSED
        self.outbox.lost()

    @property
    def closed(self) -> bool:
        return self.phase is Phase.CLOSED

    # -- helpers ------------------------------------------------------------------------------

    def _current(self, epoch: int) -> bool:
        return epoch == self.epoch and self.phase in (Phase.SNAPSHOT, Phase.STREAM)

    def _back_off(self, now: float) -> None:
        self._resume_at = now + self._backoff_s * self._rng.uniform(0.5, 1.0)
        self._backoff_s = min(2 * self._backoff_s, self.cfg.backoff_max_s)


def round_pace(
    links: Mapping[str, Link], now: float, per_link: bool
) -> tuple[bool, frozenset[str]]:
    """Whether a node's round may begin now, and the links it goes to (the daemon's and the
    simulator's rule, ``--pace``).

    With one public copy (``per_link`` False) a round goes to every link, and begins only while
    no link is :meth:`Link.busy`: every link must carry every delta, so the slowest sets the
    pace. With a copy per link a round goes to the healthy links that are not busy, and
    begins while there is one (or while no link streams at all: nothing waits then); a busy
    link keeps its unsent change for its next delta. An overdue link stops counting as busy
    only once another link has answered a later send: until then the node's own uplink may
    be what is slow.
    """
    answered = {p: link.outbox.answered_sent for p, link in links.items()}

    def busy(peer: str, link: Link) -> bool:
        others = max((t for q, t in answered.items() if q != peer), default=-math.inf)
        return link.busy(now, others)

    if not per_link:
        return not any(busy(p, link) for p, link in links.items()), frozenset(links)
    ready = frozenset(p for p, link in links.items() if link.healthy and not busy(p, link))
    streaming = any(link.healthy for link in links.values())
    return bool(ready) or not streaming, ready
