"""What one link still owes one neighbour: the bounded queue of deltas and when to resync instead.

The neighbour's replica of this node's public copy x̂ is a replicated log (gossip/replicas.py). An
:class:`Outbox` decides what keeps it so with the least sent and the least held:

* deltas go out in sequence while the neighbour keeps up;
* the queue is bounded: when a delta arrives at a full queue the whole queue is dropped and the
  neighbour is owed a snapshot of x̂ instead, which covers everything dropped. Memory per link stays
  ``queue`` deltas however slow the neighbour is;
* a snapshot is also owed to a new neighbour, after a failed send (the neighbour may have missed
  a delta), and when the neighbour reports a gap or a stale message;
* a delta that a snapshot already covers (its seq is not after the snapshot's) is never sent.

It is pure and synchronous; node/links.py drives it over a transport and the simulator over its
modelled network, so both follow the same policy.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from gossip.messages import Delta

__all__ = ["Outbox", "OutboxConfig"]


@dataclass(frozen=True)
class OutboxConfig:
    """Args:
    queue: deltas held for a neighbour; past that the link resyncs with a snapshot instead.
    window: unacknowledged or queued deltas at which the link counts as busy.
    """

    queue: int = 16
    window: int = 2

    def __post_init__(self) -> None:
        if self.queue < 1 or self.window < 1:
            raise ValueError("queue and window must be at least 1")


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

    def __len__(self) -> int:
        return len(self._pending)

    @property
    def busy(self) -> bool:
        """Another round now would only wait in line behind ``window`` others (unacknowledged or
        queued; while a snapshot travels, queued ones)."""
        return self.in_flight + len(self._pending) >= self.cfg.window

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

    def snapshot_taken(self, seq: int) -> None:
        """A snapshot of x̂ at ``seq`` is on its way: deltas up to ``seq`` are moot. Call it when
        x̂ is read, before the snapshot is sent: an overflow while it travels owes another, and a
        failed send calls :meth:`lost`."""
        self.synced_seq = seq
        self.needs_snapshot = False
        self.in_flight = 0

    def delta_sent(self, delta: Delta) -> None:
        self.synced_seq = delta.seq
        self.in_flight += 1

    def acked(self) -> None:
        self.in_flight = max(0, self.in_flight - 1)

    def refused(self) -> None:
        """The neighbour reported a gap or a stale message: resync; the queue may still serve
        (its deltas after the snapshot's seq go out once the snapshot did)."""
        self.needs_snapshot = True
        self.in_flight = 0

    def lost(self) -> None:
        """A send failed or the neighbour could not be reached: whatever it missed, a snapshot
        will cover; the queue is dropped so that a dead neighbour holds no memory."""
        self._pending.clear()
        self.needs_snapshot = True
        self.in_flight = 0
