"""What one link still owes one neighbour: the bounded queue of deltas and when to resync instead.

The neighbour's replica of this node's public copy x̂ is a replicated log (gossip/replicas.py). An
:class:`Outbox` decides what keeps it so with the least sent and the least held:

* deltas go out in sequence while the neighbour keeps up;
* the queue is bounded: when a delta arrives at a full queue the whole queue is dropped and the
  neighbour is owed a snapshot of x̂ instead, which covers everything dropped. Memory per link stays
  ``queue`` deltas however slow the neighbour is;
* a snapshot is also owed to a new neighbour, after a failed send (the neighbour may have missed
  a delta), and when the neighbour reports a gap or a stale message;
* a delta that a snapshot already covers (its seq is not after the snapshot's) is never sent,
  and is dropped from the queue as soon as the snapshot is taken;
* a link is *busy* (a new round would only wait in line) while ``window`` deltas are unanswered
  or queued and they hold ``window_bytes`` between them (or ``queue - window`` are, however
  small, so that a round always finds room in the queue), but not once an answer is *overdue*:
  later than ``overdue_factor`` times the link's usual answer time (and at least
  ``overdue_min_s``), while another of the node's neighbours has answered a delta sent after
  it. A neighbour that vanished without a word
  then holds up this node's rounds for a few answer times, not until membership declares it dead.
  Without that answer from another, it is the node's own uplink that is slow, not this
  neighbour: every link waits alike, and rounds made then would only queue behind the others.
  (Measured in the simulator: six nodes of the digits MLP on 80 kbit/s uplinks let the
  overdue links take 100 deltas each, and the last of them arrived 25 s after training.)
  The bytes: a window of large deltas is what keeps a slow link from queueing stale ones, but
  small deltas (a few packets each) are held up by the round trip and TCP's loss recovery, not by
  what the link carries: one lost packet stalls a stream for a retransmission timeout (200 ms or
  more), and with only ``window`` of them allowed, every stall on any link stopped the node's
  rounds (at 10% loss and 40 ms each way, rounds fell to a fifth; bench/lossy_links.py).
  But bytes are not time: on a slow uplink 64 KiB of small deltas is seconds of backlog, and each
  round made behind it lands that much staler. So the link is also busy once what waits on it
  would take ``window_s`` to get through at the pace its answers have been coming (each answer's
  time counted from its send, or from the answer before it if that came later:
  gossip/link_meter.py's ``time_on_link``). On a lossy link that pace is fast between stalls, so
  the small deltas still queue; on a slow one they do not.

It is pure and synchronous; node/daemon/links.py drives it over a transport and the simulator over
its modelled network, so both follow the same policy.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from gossip.link_meter import time_on_link
from gossip.messages import Delta

__all__ = ["Outbox", "OutboxConfig"]


@dataclass(frozen=True)
class OutboxConfig:
    """Args:
    queue: deltas held for a neighbour; past that the link resyncs with a snapshot instead.
    window: unacknowledged or queued deltas at which the link counts as busy, once they hold
        ``window_bytes`` of payload (``queue - window`` of them always do).
    window_bytes: payload bytes in line below which more than ``window`` deltas may be.
    window_s: seconds of the link's measured pace in line below which more than ``window``
        deltas may be.
    overdue_min_s: an answer is never overdue sooner than this.
    overdue_factor: an answer is overdue once it takes this many times the link's usual one.
    unmeasured_rate: before the link's first answer that says how long its answers take (a
        snapshot that went by name says nothing of it), an answer is overdue only once the
        bytes in flight would have taken this long at this many bytes a second (1 Mbit/s, the
        slowest link a model transfer is given time for, node/daemon/links.py).
    """

    queue: int = 16
    window: int = 2
    # 13 of the digits MLP's int8 deltas, enough to ride out a TCP loss recovery at 20 rounds/s;
    # half a second on a 1 Mbit/s edge link; any model over ~30k parameters keeps the window.
    window_bytes: int = 65_536
    # At 10% loss and 40 ms each way the digits MLP's int8 deltas were answered every ~60 ms:
    # 8 may wait (bench/lossy_links.py); on a 1 Mbit/s uplink shared by five links, the window's
    # two (bench/sim_window.py).
    window_s: float = 0.5
    overdue_min_s: float = 2.0
    overdue_factor: float = 4.0
    unmeasured_rate: float = 125_000.0

    def __post_init__(self) -> None:
        if self.queue < 1 or self.window < 1:
            raise ValueError("queue and window must be at least 1")
        if self.window_bytes < 0 or self.window_s < 0:
            raise ValueError(
                f"window_bytes is {self.window_bytes} and window_s {self.window_s}:"
                " expected 0 or more"
            )
        if self.overdue_min_s <= 0 or self.overdue_factor < 1 or self.unmeasured_rate <= 0:
            raise ValueError(
                "overdue_min_s and unmeasured_rate must be positive and overdue_factor at least 1"
            )


class Outbox:
    def __init__(self, cfg: OutboxConfig) -> None:
        self.cfg = cfg
        self._pending: deque[Delta] = deque()
        #: A new neighbour has no replica of us yet.
        self.needs_snapshot = True
        #: The last seq the neighbour was sent (by snapshot or delta); -1 before the first.
        self.synced_seq = -1
        #: Deltas sent and not yet acknowledged.
        self.in_flight = 0
        #: How many times the queue overflowed into a resync.
        self.overflows = 0
        #: Smoothed seconds from a send to its answer; None before the first answer.
        self.answer_s: float | None = None
        self._sent_at: deque[float] = deque()  # send times of the unanswered deltas
        self._sent_bytes: deque[int] = deque()  # and their payloads' sizes
        self._waiting_since: float | None = None  # the oldest unanswered send (or snapshot)
        #: When the newest answered delta was sent (-inf before the first answer).
        self.answered_sent = -math.inf
        #: Smoothed seconds between the link's answers while it has deltas in line (each from
        #: its send, or from the answer before it if later); None before the first answer.
        self.pace_s: float | None = None
        self._last_answer = -math.inf

    def __len__(self) -> int:
        return len(self._pending)

    @property
    def overdue_after_s(self) -> float:
        """How long an answer may take before it counts as overdue."""
        if self.answer_s is None:
            usual = sum(self._sent_bytes) / self.cfg.unmeasured_rate
        else:
            usual = self.cfg.overdue_factor * self.answer_s
        return max(self.cfg.overdue_min_s, usual)

    def overdue_at(self) -> float | None:
        """When the oldest unanswered send becomes overdue; None while nothing is unanswered."""
        if self._waiting_since is None:
            return None
        return self._waiting_since + self.overdue_after_s

    def overdue(self, now: float) -> bool:
        at = self.overdue_at()
        return at is not None and now > at

    def _answered(self, sent: float, now: float) -> None:
        sample = max(0.0, now - sent)
        self.answer_s = sample if self.answer_s is None else 0.8 * self.answer_s + 0.2 * sample

    @property
    def busy(self) -> bool:
        """Another round now would only wait in line behind ``window`` others (unacknowledged or
        queued; while a snapshot travels, queued ones) holding ``window_bytes`` or
        ``window_s`` of the link's pace, or behind ``queue - window``."""
        waiting = self.in_flight + len(self._pending)
        if waiting < self.cfg.window:
            return False
        if waiting >= self.cfg.queue - self.cfg.window:
            return True
        if self.pace_s is not None and waiting * self.pace_s >= self.cfg.window_s:
            return True
        held = sum(self._sent_bytes) + sum(d.payload.nbytes for d in self._pending)
        return held >= self.cfg.window_bytes

    def busy_at(self, now: float, others_answered_sent: float = math.inf) -> bool:
        """:attr:`busy`, unless the neighbour's answer is overdue while another neighbour
        answered a delta sent after this one's oldest unanswered (``others_answered_sent``:
        the latest send the node's other links had answered; inf when the caller does not
        say): then it no longer holds up the node's rounds (what it misses, the queue or a
        snapshot will bring)."""
        if not self.busy or not self.overdue(now):
            return self.busy
        assert self._waiting_since is not None  # overdue: something is unanswered
        return others_answered_sent <= self._waiting_since

    def offer(self, delta: Delta) -> None:
        """Queue ``delta``; a full queue is dropped in favour of a snapshot."""
        if len(self._pending) >= self.cfg.queue:
            self._pending.clear()
            self.needs_snapshot = True
            self.overflows += 1
        self._pending.append(delta)

    def next_delta(self) -> Delta | None:
        """The next queued delta that the last snapshot does not cover, or None."""
        while self._pending:
            delta = self._pending.popleft()
            if delta.seq > self.synced_seq:
                return delta
        return None

    def snapshot_taken(self, seq: int, now: float) -> None:
        """A snapshot of x̂ at ``seq`` is on its way: deltas up to ``seq`` are moot. Call it when
        x̂ is read, before the snapshot is sent: an overflow while it travels owes another, and a
        failed send calls :meth:`lost`; its answer calls :meth:`snapshot_answered`."""
        self.synced_seq = seq
        self.needs_snapshot = False
        # Queued deltas it covers go now, not when the stream would skip them: until then they
        # would keep the link busy, and nothing would tell the node when they went.
        while self._pending and self._pending[0].seq <= seq:
            self._pending.popleft()
        self.in_flight = 0
        self._sent_at.clear()
        self._sent_bytes.clear()
        self._waiting_since = now

    def snapshot_answered(self, now: float, carried: bool = True) -> None:
        """The snapshot was taken; ``carried``: it carried the model (not its name), so its
        time is a first, generous estimate of the link's answers."""
        if carried and self._waiting_since is not None and self.answer_s is None:
            self._answered(self._waiting_since, now)
        self._waiting_since = None

    def delta_sent(self, delta: Delta, now: float) -> None:
        self.synced_seq = delta.seq
        self.in_flight += 1
        self._sent_at.append(now)
        self._sent_bytes.append(delta.payload.nbytes)
        if self._waiting_since is None:
            self._waiting_since = now

    def acked(self, now: float) -> None:
        self.in_flight = max(0, self.in_flight - 1)
        if self._sent_at:
            sent = self._sent_at.popleft()
            self.answered_sent = max(self.answered_sent, sent)
            self._answered(sent, now)
            took = time_on_link(sent, self._last_answer, now)
            self.pace_s = took if self.pace_s is None else 0.8 * self.pace_s + 0.2 * took
            self._last_answer = now
            self._sent_bytes.popleft()
        self._waiting_since = self._sent_at[0] if self._sent_at else None

    def refused(self) -> None:
        """The neighbour reported a gap or a stale message: resync; the queue may still serve
        (its deltas after the snapshot's seq go out once the snapshot did)."""
        self.needs_snapshot = True
        self.in_flight = 0
        self._sent_at.clear()
        self._sent_bytes.clear()
        self._waiting_since = None

    def lost(self) -> None:
        """A send failed or the neighbour could not be reached: whatever it missed, a snapshot
        will cover; the queue is dropped so that a dead neighbour holds no memory."""
        self._pending.clear()
        self.needs_snapshot = True
        self.in_flight = 0
        self._sent_at.clear()
        self._sent_bytes.clear()
        self._waiting_since = None
