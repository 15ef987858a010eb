"""What a link measures of itself: how long a delta of each codec takes on it (issue 17's
``auto``).

No probes of its own: the deltas a link carries are the measurement. The link machine
(gossip/link.py) tells its :class:`LinkMeter` when each delta left, with which codec, and when
its answer came back, in order. A delta's time on the link ends with its answer and starts when
it left, or when the answer before it came, if later (it waited in line behind that one, and
that wait is the other delta's time, not its own). Answers that arrive bunched (two
acknowledgements in one read, the second a microsecond after the first) count as the one
interval they are: the first takes it all, the second almost nothing, and their mean is right.

The times are kept per codec, over each codec's last :data:`SAMPLES` deltas, because a delta's
time is not its bytes over a rate alone: each also pays a fixed cost (framing, the call, the
receiver's decode and apply), which on a fast link or a busy machine is most of it, and which a
model of bytes and rate cannot see. ``auto`` compares these times (gossip/codec_choice.py
``LinkCodecs``). Pure: it is told the time, it reads no clock.
"""

from __future__ import annotations

import math
from collections import deque

__all__ = ["SAMPLES", "LinkMeter", "time_on_link"]

#: The deltas of one codec its time on a link is the mean over.
SAMPLES = 8


def time_on_link(left: float, last_answer: float, now: float) -> float:
    """A delta's time on its link, answered at ``now``: from when it ``left``, or from the
    ``last_answer`` before it if that came later (it waited in line behind that one)."""
    return max(0.0, now - max(left, last_answer))


class LinkMeter:
    """Args:
    min_samples: a codec's deltas answered before :meth:`delta_s` says anything of it.
    """

    def __init__(self, min_samples: int = 3) -> None:
        if not 1 <= min_samples <= SAMPLES:
            raise ValueError(f"min_samples is {min_samples}: expected 1 to {SAMPLES}")
        self.min_samples = min_samples
        self._in_flight: deque[tuple[float, str]] = deque()  # (when it left, its codec)
        self._last_answer = -math.inf
        #: By codec: the times of its last deltas on the link, and when the last was answered.
        self._times: dict[str, deque[float]] = {}
        self._seen_at: dict[str, float] = {}

    def sent(self, now: float, codec: str) -> None:
        """A delta encoded with ``codec`` left at ``now``."""
        self._in_flight.append((now, codec))

    def answered(self, now: float) -> None:
        """The oldest delta in flight was answered at ``now``."""
        if not self._in_flight:
            return
        left, codec = self._in_flight.popleft()
        took = time_on_link(left, self._last_answer, now)
        self._times.setdefault(codec, deque(maxlen=SAMPLES)).append(took)
        self._seen_at[codec] = now
        self._last_answer = now

    def lost(self) -> None:
        """What was in flight will not be answered (a resync, a failure)."""
        self._in_flight.clear()
        self._last_answer = -math.inf

    def delta_s(self, codec: str, now: float, memory_s: float) -> float | None:
        """What a delta of ``codec`` took on this link lately (the mean over its last
        :data:`SAMPLES`); None with fewer than ``min_samples`` of them, or when the last was
        answered more than ``memory_s`` before ``now`` (the link may have changed since)."""
        times = self._times.get(codec)
        if not times or len(times) < self.min_samples:
            return None
        if now - self._seen_at[codec] > memory_s:
            return None
        return sum(times) / len(times)
