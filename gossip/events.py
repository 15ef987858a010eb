"""A discrete-event engine and a simulated network, on an injected clock.

The engine jumps from one event to the next, so hours of protocol time take seconds of wall
time when little happens. Two simulators run on it: :mod:`gossip.swim_sim` (membership alone)
and ``node/sim`` (whole training swarms, with the same core the daemon runs).

The network models what a wide-area link does to a message of ``b`` bytes sent from ``a`` to
``c``: it waits behind earlier messages on ``a``'s uplink and takes ``b / bandwidth`` seconds to
serialise there (one FIFO per sender, as a home or phone uplink is the usual bottleneck), then
``latency(a, c)`` seconds to arrive, unless it is lost (each message independently). With a
latency fixed per link, messages on one link arrive in the order sent, as on one TCP stream.

A partition (:meth:`Network.split`) cuts the network into groups for a while: a lossy message
between two groups is lost, and a reliable one (a call the transport retries) waits until the
partition ends, then goes.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import zlib
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from gossip.clock import ManualClock

__all__ = ["EventQueue", "LinkLatency", "Network", "Partition"]


class EventQueue:
    """Callbacks run in time order (ties in the order they were scheduled).

    Args:
        clock: moved to each event's time before it runs.
    """

    def __init__(self, clock: ManualClock | None = None) -> None:
        self.clock = clock or ManualClock()
        self._heap: list[tuple[float, int, Callable[[], None], Hashable | None]] = []
        self._order = itertools.count()
        self._timers: dict[Hashable, float] = {}
        #: Events run so far (for the simulators' own cost figures).
        self.processed = 0

    def __len__(self) -> int:
        return len(self._heap)

    def now(self) -> float:
        return self.clock.now()

    def at(self, t: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` at time ``t`` (now, if ``t`` is in the past)."""
        heapq.heappush(self._heap, (max(t, self.clock.now()), next(self._order), fn, None))

    def after(self, delay_s: float, fn: Callable[[], None]) -> None:
        self.at(self.clock.now() + delay_s, fn)

    def timer(self, key: Hashable, t: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` at ``t`` unless ``key``'s timer is already due no later; one per key.

        For state machines that say when they next need a tick (``Swim.next_deadline``): call
        this after every change, and a deadline that moved earlier is met, while one that
        moved later costs at most one early tick, which does nothing.
        """
        if math.isinf(t):
            return
        t = max(t, self.clock.now())
        current = self._timers.get(key)
        if current is not None and current <= t:
            return
        self._timers[key] = t
        heapq.heappush(self._heap, (t, next(self._order), fn, key))

    def cancel_timer(self, key: Hashable) -> None:
        self._timers.pop(key, None)

    @property
    def next_time(self) -> float:
        return self._heap[0][0] if self._heap else math.inf

    def run_until(self, t_end: float, after_event: Callable[[], None] | None = None) -> None:
        """Run every event due up to ``t_end``, then move the clock to ``t_end``."""
        while self._heap and self._heap[0][0] <= t_end:
            t, _, fn, key = heapq.heappop(self._heap)
            if key is not None:
                if self._timers.get(key) != t:
                    continue  # replaced by an earlier one, or cancelled
                del self._timers[key]
            self.clock.advance_to(max(t, self.clock.now()))
            self.processed += 1
            fn()
            if after_event is not None:
                after_event()
        self.clock.advance_to(max(t_end, self.clock.now()))


class LinkLatency:
    """A one-way delay fixed per link (the same both ways), spread uniformly over ``[lo, hi]``.

    Computed from a hash of the two ends and the seed instead of stored: a swarm of n members
    may talk over n^2 links (membership probes anyone).
    """

    def __init__(self, lo_s: float, hi_s: float, seed: int = 0) -> None:
        if not 0 <= lo_s <= hi_s:
            raise ValueError("latency needs 0 <= lo <= hi")
        self.lo_s, self.hi_s, self.seed = lo_s, hi_s, seed

    def __call__(self, a: str, b: str) -> float:
        first, second = (a, b) if a <= b else (b, a)
        h = zlib.crc32(f"{self.seed}|{first}|{second}".encode())
        return self.lo_s + (self.hi_s - self.lo_s) * h / 0xFFFFFFFF


@dataclass(frozen=True)
class Partition:
    """From ``start_s`` until ``end_s`` (simulated seconds), only addresses that ``group_of``
    puts in the same group reach each other."""

    start_s: float
    end_s: float
    group_of: Callable[[str], Hashable]

    def cuts(self, src: str, dst: str, now: float) -> bool:
        return self.start_s <= now < self.end_s and self.group_of(src) != self.group_of(dst)


class Network:
    """Messages between addresses, delivered by callbacks on an :class:`EventQueue`.

    Args:
        latency: one-way delay of a message from the first address to the second.
        bandwidth_bps: every sender's uplink, in bytes per second (inf: no serialisation).
        loss: probability that a lossy message is lost.
        rng: draws the losses.
        slowdown: how many times slower the path from the first address to the second is
            than the sender's uplink; None: none is.

    A sender's uplink sends its messages one after another at ``bandwidth_bps``. A slower path
    is a pipe of its own behind the uplink (a router's queue at its bottleneck): a message
    leaves the uplink at the uplink's rate, then waits for the pipe, which carries one message
    at a time at ``bandwidth_bps / slowdown``. So a slow path slows only what goes down it, as
    on a real network, where the sender's other connections keep their pace; it does not hold
    the sender's uplink for all the time that its message takes.
    """

    def __init__(
        self,
        events: EventQueue,
        latency: Callable[[str, str], float],
        bandwidth_bps: float = math.inf,
        loss: float = 0.0,
        rng: random.Random | None = None,
        slowdown: Callable[[str, str], float] | None = None,
    ) -> None:
        if bandwidth_bps <= 0 or not 0 <= loss < 1:
            raise ValueError("bandwidth must be positive and loss in [0, 1)")
        self.events = events
        self.latency = latency
        self.bandwidth_bps = bandwidth_bps
        self.loss = loss
        self.rng = rng or random.Random(0)
        self.slowdown = slowdown
        self._uplink_free: dict[str, float] = {}
        #: When each slower path's pipe is free again (only those still busy are kept).
        self._pipe_free: dict[tuple[str, str], float] = {}
        self.partitions: list[Partition] = []
        self.sent = 0
        self.lost = 0
        #: Messages a partition stopped (lost, or held until it ended).
        self.cut = 0

    def split(self, group_of: Callable[[str], Hashable], start_s: float, duration_s: float) -> None:
        """Partition the network into the groups of ``group_of`` from ``start_s`` for
        ``duration_s`` seconds."""
        if duration_s <= 0:
            raise ValueError("a partition lasts a positive time")
        self.partitions.append(Partition(start_s, start_s + duration_s, group_of))

    def send(
        self, src: str, dst: str, nbytes: int, deliver: Callable[[], None], lossy: bool = True
    ) -> bool:
        """Put a message of ``nbytes`` on ``src``'s uplink; ``deliver`` runs when it arrives.

        A lost message still takes its time on the uplink (it was sent). Messages that are
        not ``lossy`` stand for ones a transport retries until they arrive (a unary call, an
        acknowledgement on an open stream).

        Returns:
            Whether the message will arrive.
        """
        now = self.events.now()
        ends = [p.end_s for p in self.partitions if p.cuts(src, dst, now)]
        if ends:
            self.cut += 1
            if lossy:
                return False

            def retry() -> None:
                self.send(src, dst, nbytes, deliver, lossy)

            self.events.at(max(ends), retry)
            return True
        self.sent += 1
        lost = lossy and self.loss > 0 and self.rng.random() < self.loss
        start = max(now, self._uplink_free.get(src, now))
        done = start + nbytes / self.bandwidth_bps
        if done > now:
            self._uplink_free[src] = done
        slower = self.slowdown(src, dst) if self.slowdown is not None else 1.0
        if slower != 1.0:
            pipe = (src, dst)
            free = self._pipe_free.get(pipe, now)
            if free <= now:
                self._pipe_free.pop(pipe, None)
            done = max(done, max(start, free) + nbytes * slower / self.bandwidth_bps)
            if done > now:
                self._pipe_free[pipe] = done
        if lost:
            self.lost += 1
            return False
        self.events.at(done + self.latency(src, dst), deliver)
        return True

    def backlog_s(self, src: str) -> float:
        """Seconds until ``src``'s uplink has sent what it holds."""
        return max(0.0, self._uplink_free.get(src, 0.0) - self.events.now())

    def forget(self, src: str) -> None:
        """``src`` is gone: what its uplink and its paths held is no longer in the way."""
        self._uplink_free.pop(src, None)
        for pipe in [p for p in self._pipe_free if p[0] == src]:
            del self._pipe_free[pipe]
