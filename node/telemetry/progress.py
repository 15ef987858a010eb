"""Progress and countdown lines for the long moments of a node's life, at a rate a log bears.

A model pull, a big checkpoint, a wait for members or for a join address that does not answer:
each says what it waits for, how far it is, and how long it has left, first soon after it
starts and then at growing intervals (a :class:`Ticker`), never a line per second forever.
Short operations say nothing: the first line comes only once one has lasted ``first_s``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Ticker", "TickerConfig", "TransferProgress", "announce", "fmt_duration", "fmt_size"]


@dataclass(frozen=True)
class TickerConfig:
    """Args:
    first_s: the first line comes this long after the start (0: at once).
    every_s: then the next one this long after it...
    growth: ...each interval this many times the one before...
    max_s: ...up to this.
    """

    # A pull or a write that ends within 2 s needs no progress; its end says how long it took.
    first_s: float = 2.0
    every_s: float = 5.0
    # Doubling: a wait that lasts says so at 2, 7, 17, 37, 67... s, about ten lines in five
    # minutes, and then one every max_s.
    growth: float = 2.0
    max_s: float = 30.0


#: Transfers and writes: their rate and ETA matter, so a line every 5 s throughout.
TRANSFER_TICKS = TickerConfig(first_s=2.0, every_s=5.0, growth=1.0, max_s=5.0)
#: Waits: the first line at once (the wait itself is news), then ever less often.
WAIT_TICKS = TickerConfig(first_s=0.0, every_s=5.0, growth=2.0, max_s=30.0)


class Ticker:
    """When the next progress line is due, on an injected clock (seconds, any origin)."""

    def __init__(self, cfg: TickerConfig, now: float) -> None:
        self.cfg = cfg
        self.started = now
        self._next = now + cfg.first_s
        self._interval = cfg.every_s

    def due(self, now: float) -> bool:
        """Whether a line is due at ``now``; if so, the next one is scheduled."""
        if now < self._next:
            return False
        self._next = now + self._interval
        self._interval = min(self._interval * self.cfg.growth, self.cfg.max_s)
        return True

    @property
    def next_at(self) -> float:
        return self._next


def fmt_size(n: float) -> str:
    """Bytes in binary units, as the rest of murmur gives them: ``812 B``, ``1.2 MiB``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            value = n / scale
            return f"{value:.2f} {unit}" if value < 10 else f"{value:.1f} {unit}"
    return f"{n:.0f} B"


def fmt_duration(seconds: float) -> str:
    """A short duration: ``0.4s``, ``12s``, ``3m05s``, ``2h10m``, ``3d04h``."""
    if not math.isfinite(seconds) or seconds < 0:
        return "-"
    if seconds < 10:
        return f"{seconds:.1f}s"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


class TransferProgress:
    """Progress of moving ``total`` bytes: percentage, rate and time left, now and then.

    Usage: ``p = TransferProgress("pulling the model from 10.0.0.5:7070", total, log)``, then
    ``p.update(done)`` as bytes arrive, and ``p.done()`` for the closing words. Where the bytes
    cannot be counted as they go (one big write), :meth:`tick` with an expected rate says how
    long it has run and, from the rate, how long it may still take.
    """

    def __init__(
        self,
        what: str,
        total: int,
        log: logging.Logger,
        clock: Callable[[], float] = time.monotonic,
        ticks: TickerConfig = TRANSFER_TICKS,
    ) -> None:
        self.what = what
        self.total = total
        self.log = log
        self._clock = clock
        self.started = clock()
        self._ticker = Ticker(ticks, self.started)
        #: Whether any progress line was logged (so the caller knows to log the end too).
        self.spoke = False

    def update(self, done: int) -> None:
        now = self._clock()
        if not self._ticker.due(now):
            return
        elapsed = now - self.started
        rate = done / elapsed if elapsed > 0 else 0.0
        left = (self.total - done) / rate if rate > 0 else math.inf
        self.log.info(
            "%s: %3.0f%% (%s of %s), %s/s, %s left",
            self.what,
            100 * done / self.total if self.total else 100.0,
            fmt_size(done),
            fmt_size(self.total),
            fmt_size(rate),
            fmt_duration(left),
        )
        self.spoke = True

    def tick(self, expected_rate: float | None) -> None:
        """For work whose progress cannot be counted: elapsed time and, at ``expected_rate``
        bytes/s (a previous run's), an estimate of what is left."""
        now = self._clock()
        if not self._ticker.due(now):
            return
        elapsed = now - self.started
        if expected_rate:
            left = max(0.0, self.total / expected_rate - elapsed)
            estimate = (
                f"about {fmt_duration(left)} left at the last write's {fmt_size(expected_rate)}/s"
            )
        else:
            estimate = "no estimate yet (the first write)"
        self.log.info(
            "%s (%s): %s so far, %s",
            self.what,
            fmt_size(self.total),
            fmt_duration(elapsed),
            estimate,
        )
        self.spoke = True

    def rate(self) -> float:
        """Bytes per second from the start until now (for the whole, once done)."""
        elapsed = self._clock() - self.started
        return self.total / elapsed if elapsed > 0 else math.inf

    def done(self) -> str:
        """``270.0 MB in 21.9s (12.3 MB/s)``."""
        elapsed = self._clock() - self.started
        rate = fmt_size(self.total / elapsed) + "/s" if elapsed > 0 else "instant"
        return f"{fmt_size(self.total)} in {fmt_duration(elapsed)} ({rate})"


async def announce(
    describe: Callable[[], str | None],
    log: logging.Logger,
    ticks: TickerConfig = WAIT_TICKS,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Log ``describe()`` now and then until cancelled: a countdown beside a wait.

    ``describe`` is asked only when a line is due, so it can say how long is left then; it
    returns None to say nothing this time (the wait is not the news any more).
    """
    ticker = Ticker(ticks, clock())
    while True:
        now = clock()
        if ticker.due(now):
            line = describe()
            if line is not None:
                log.info("%s", line)
        await asyncio.sleep(max(0.0, ticker.next_at - clock()))
