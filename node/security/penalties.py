"""Back-off for peers whose messages keep failing validation.

A sender whose messages are refused for being bad in themselves (not for arriving at an awkward
moment) ``threshold`` times within ``window_s`` is banned: its messages are refused at once until
the ban ends. Each repeat offence doubles the ban, up to ``max_ban_s``; a sender that stays clean
for ``forgive_after_s`` after a ban starts over. Pure: time comes from an injected clock.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from gossip.clock import Clock
from gossip.refusals import REFUSALS, Reason

__all__ = [
    "COUNTED_REASONS",
    "LogLimiter",
    "Penalties",
    "PenaltyConfig",
    "RateConfig",
    "RateLimiter",
    "held_back",
]

#: Refusals that say the message itself is bad (gossip/refusals.py). Gaps, stale sequence
#: numbers, unknown senders and a node that is not ready are what honest peers meet during churn,
#: so they never count.
COUNTED_REASONS = frozenset(r for r, c in REFUSALS.items() if c.counts)


@dataclass(frozen=True)
class PenaltyConfig:
    """Args:
    threshold: counted refusals within ``window_s`` that earn a ban.
    window_s: how far back refusals are counted.
    ban_s: the first ban; each repeat offence doubles it.
    max_ban_s: the longest ban.
    forgive_after_s: clean time after a ban's end after which the next ban is a first one again.
    max_tracked: senders remembered at once; the least recently heard-from is forgotten first,
        so a flood of made-up ids cannot grow memory without bound.
    """

    threshold: int = 8
    window_s: float = 60.0
    ban_s: float = 30.0
    max_ban_s: float = 3600.0
    forgive_after_s: float = 3600.0
    max_tracked: int = 4096

    def __post_init__(self) -> None:
        if self.threshold < 1 or self.max_tracked < 1:
            raise ValueError("threshold and max_tracked must be at least 1")
        if not 0 < self.ban_s <= self.max_ban_s or self.window_s <= 0:
            raise ValueError("need 0 < ban_s <= max_ban_s and a positive window_s")


@dataclass
class _Record:
    refusals: deque[float] = field(default_factory=deque)
    offences: int = 0
    banned_until: float = float("-inf")


class Penalties:
    """Counts refusals per sender and bans repeat offenders."""

    def __init__(self, cfg: PenaltyConfig, clock: Clock) -> None:
        self.cfg = cfg
        self.clock = clock
        self._records: OrderedDict[str, _Record] = OrderedDict()

    def ban_left_s(self, sender: str) -> float:
        """Seconds left of ``sender``'s ban; 0 when it is not banned."""
        record = self._records.get(sender)
        if record is None:
            return 0.0
        return max(0.0, record.banned_until - self.clock.now())

    def note_refusal(self, sender: str, reason: Reason) -> float:
        """Count a refusal of ``sender``'s message; returns the length of the ban it earned
        (0 when none: the reason does not count, the threshold is not reached, or a ban is on)."""
        if reason not in COUNTED_REASONS or self.ban_left_s(sender) > 0:
            return 0.0
        now = self.clock.now()
        record = self._records.pop(sender, None) or _Record()
        self._records[sender] = record  # most recently heard-from last
        while len(self._records) > self.cfg.max_tracked:
            self._records.popitem(last=False)
        if record.offences and now - record.banned_until > self.cfg.forgive_after_s:
            record.offences = 0
        record.refusals.append(now)
        while record.refusals and record.refusals[0] <= now - self.cfg.window_s:
            record.refusals.popleft()
        if len(record.refusals) < self.cfg.threshold:
            return 0.0
        record.refusals.clear()
        record.offences += 1
        ban_s = min(self.cfg.max_ban_s, self.cfg.ban_s * 2.0 ** min(record.offences - 1, 64))
        record.banned_until = now + ban_s
        return ban_s

    def tracked(self) -> int:
        """Senders remembered now."""
        return len(self._records)


@dataclass(frozen=True)
class RateConfig:
    """Args:
    rate: messages per second a sender may keep up.
    burst: messages it may send at once after a quiet spell.
    max_tracked: senders remembered at once (least recently heard-from forgotten first).
    """

    rate: float = 1000.0
    burst: float = 2000.0
    max_tracked: int = 4096

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.burst < 1 or self.max_tracked < 1:
            raise ValueError("rate must be positive, burst and max_tracked at least 1")


class RateLimiter:
    """A token bucket per sender: each message takes a token; tokens come back at ``rate`` per
    second up to ``burst``. The defaults sit far above what an honest node sends (a round per
    training step at most, to each neighbour), so they only stop floods."""

    def __init__(self, cfg: RateConfig, clock: Clock) -> None:
        self.cfg = cfg
        self.clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, at

    def allow(self, sender: str) -> bool:
        """Take a token for one message from ``sender``; False when it has none left."""
        now = self.clock.now()
        tokens, at = self._buckets.pop(sender, (self.cfg.burst, now))
        tokens = min(self.cfg.burst, tokens + (now - at) * self.cfg.rate)
        allowed = tokens >= 1.0
        self._buckets[sender] = (tokens - 1.0 if allowed else tokens, now)
        if len(self._buckets) > self.cfg.max_tracked:
            self._buckets.popitem(last=False)
        return allowed


class LogLimiter:
    """Rate-limits log lines by key (the peer they are about): at most ``burst`` lines per key
    per ``period_s``, so that a peer that keeps sending bad input cannot fill the log. A line
    let through after others were held back says how many.

    Usage::

        if (held := limiter.allow(peer)) is not None:
            log.warning("bad list from %s%s", peer, held_back(held))
    """

    def __init__(
        self, clock: Clock, period_s: float = 60.0, burst: int = 3, max_tracked: int = 1024
    ) -> None:
        if period_s <= 0 or burst < 1 or max_tracked < 1:
            raise ValueError("period_s must be positive, burst and max_tracked at least 1")
        self.clock = clock
        self.period_s = period_s
        self.burst = burst
        self.max_tracked = max_tracked
        self._keys: OrderedDict[str, tuple[float, int, int]] = OrderedDict()  # start, lines, held
        #: Lines held back in all.
        self.held = 0

    def allow(self, key: str) -> int | None:
        """None when this line is to be held back; else how many were held back since the
        last one let through for ``key``."""
        now = self.clock.now()
        start, lines, held = self._keys.pop(key, (now, 0, 0))
        if now - start >= self.period_s:
            start, lines = now, 0
        if lines >= self.burst:
            self._keys[key] = (start, lines, held + 1)
            self.held += 1
            result = None
        else:
            self._keys[key] = (start, lines + 1, 0)
            result = held
        while len(self._keys) > self.max_tracked:
            self._keys.popitem(last=False)
        return result


def held_back(count: int) -> str:
    """The suffix of a log line let through after ``count`` like it were held back."""
    return f" ({count} more like it held back)" if count else ""
