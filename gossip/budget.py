"""A byte budget per period for metered links (``--byte-budget 500MB/day``).

A node on a metered link (a cellular plan, a satellite uplink) may send a set number of bytes
per period. Spending them as fast as the links allow would use a day's budget in the first
minutes of training and leave the swarm without the node for the rest of the day; so the budget
is spread over the period. By time t into a period the node may have spent

    allowance(t) = budget · min(1, t / period + LEAD)

where ``LEAD`` is a share the node may spend at once (so that a node that joins or resumes
mid-period can catch up, and one round never waits on a rounding error). What it does not spend
stays for later in the same period: a node that was idle in the morning may gossip faster in
the afternoon. While the node is ahead of its allowance (and so once the whole budget is spent)
it makes only heartbeat rounds (gossip/trigger.py), so that its neighbours never take it for
dead; nothing is lost meanwhile, as the unsent change waits in x - x̂. At the turn of the period
the budget is whole again.

Periods are aligned on the clock's zero (for the daemon's wall clock, the Unix epoch: days turn at
00:00 UTC), so that a restarted node finds itself in the same period, and with what it
persisted, the same spending. Pure: the clock is passed in. Safe to share between threads (the
links spend on the event loop, the round asks on the gossip worker).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any

from gossip.clock import Clock

__all__ = ["LEAD", "BudgetConfig", "ByteBudget"]

#: Share of the budget a node may spend at once at the start of a period (at a day's period,
#: half an hour's worth).
LEAD = 1 / 48


@dataclass(frozen=True)
class BudgetConfig:
    """Args:
    nbytes: bytes the node may send per period.
    period_s: the period's length in seconds.
    """

    nbytes: int
    period_s: float

    def __post_init__(self) -> None:
        if self.nbytes <= 0:
            raise ValueError(f"a byte budget must be positive, got {self.nbytes}")
        if not (self.period_s > 0 and math.isfinite(self.period_s)):
            raise ValueError(f"a budget's period must be positive seconds, got {self.period_s}")


class ByteBudget:
    """One node's budget (see the module docstring).

    Args:
        cfg: how many bytes per how long.
        clock: wall time (periods are aligned on its zero).
        charge: what one byte of message costs of the budget (the daemon counts the wire's
            overhead and membership's share this way: node/daemon/pacing.py).
    """

    def __init__(self, cfg: BudgetConfig, clock: Clock, charge: float = 1.0) -> None:
        if not charge >= 1:
            raise ValueError(f"a byte costs at least a byte of the budget, got {charge}")
        self.cfg = cfg
        self.charge = charge
        self._clock = clock
        self._lock = threading.Lock()
        self._start = self._period_of(clock.now())
        self._spent = 0.0
        #: Periods that turned while the node ran.
        self.turns = 0
        #: Bytes spent in the period before this one (0: none yet, or it passed unspent).
        self.last_spent = 0.0

    def _period_of(self, now: float) -> float:
        return math.floor(now / self.cfg.period_s) * self.cfg.period_s

    def _turn(self, now: float) -> None:
        start = self._period_of(now)
        if start > self._start:
            self.last_spent = self._spent if start == self._start + self.cfg.period_s else 0.0
            self._start = start
            self._spent = 0.0
            self.turns += 1

    def spend(self, nbytes: float) -> None:
        """Count ``nbytes`` of message sent (times the charge); negative: a claim given back."""
        with self._lock:
            self._turn(self._clock.now())
            self._spent += nbytes * self.charge

    def ahead(self, upcoming: float = 0.0) -> bool:
        """Whether ``upcoming`` more bytes of message (a round's) would take the node past all
        that it may have spent by now: it then makes heartbeats only."""
        with self._lock:
            now = self._clock.now()
            self._turn(now)
            return self._spent + upcoming * self.charge > self._allowance(now)

    def wait_s(self, upcoming: float) -> float:
        """Seconds until ``upcoming`` more bytes of message (a snapshot's) fit under what the
        node may have spent by then: 0 when they fit now; later in this period as the allowance
        grows; else after the turn of the period. A message bigger than the whole budget never
        fits: it may go when nothing of the period has been spent yet."""
        with self._lock:
            return self._wait_s(upcoming)

    def _wait_s(self, upcoming: float) -> float:
        now = self._clock.now()
        self._turn(now)
        need = upcoming * self.charge
        total, period = self.cfg.nbytes, self.cfg.period_s
        if self._spent + need <= self._allowance(now):
            return 0.0
        if need > total:
            return 0.0 if self._spent == 0 else self._start + period - now
        if self._spent + need <= total:
            at = self._start + ((self._spent + need) / total - LEAD) * period
            return max(0.0, at - now)
        return self._start + period - now + max(0.0, (need / total - LEAD) * period)

    def claim(self, upcoming: float) -> float:
        """:meth:`wait_s`, except that when it is 0 the ``upcoming`` bytes are counted spent at
        once: links that ask in the same moment (a node whose neighbours all joined, or all
        lost a delta) do not each see the same room, and go together over the budget. The
        caller then sends them without spending them again."""
        with self._lock:
            wait_s = self._wait_s(upcoming)
            if wait_s == 0:
                self._spent += upcoming * self.charge
            return wait_s

    def _allowance(self, now: float) -> float:
        share = min(1.0, (now - self._start) / self.cfg.period_s + LEAD)
        return self.cfg.nbytes * share

    @property
    def spent(self) -> float:
        """Bytes spent in this period."""
        with self._lock:
            self._turn(self._clock.now())
            return self._spent

    @property
    def remaining(self) -> float:
        """Bytes left of this period's budget (0 once spent, even when the heartbeats go over)."""
        return max(0.0, self.cfg.nbytes - self.spent)

    @property
    def resets_in(self) -> float:
        """Seconds until the period turns and the budget is whole again."""
        with self._lock:
            now = self._clock.now()
            self._turn(now)
            return max(0.0, self._start + self.cfg.period_s - now)

    def saved(self) -> dict[str, Any]:
        """What to persist, so that a restart keeps the period's spending."""
        with self._lock:
            self._turn(self._clock.now())
            return {
                "nbytes": self.cfg.nbytes,
                "period_s": self.cfg.period_s,
                "period_start": self._start,
                "spent": self._spent,
            }

    def restore(self, saved: dict[str, Any]) -> bool:
        """Take the spending of :meth:`saved` when it is of this period (the same length, the
        same start); a budget that changed size keeps what was spent. Returns whether it did."""
        try:
            period_s = float(saved["period_s"])
            start = float(saved["period_start"])
            spent = float(saved["spent"])
        except (KeyError, TypeError, ValueError):
            return False
        with self._lock:
            self._turn(self._clock.now())
            if period_s != self.cfg.period_s or start != self._start:
                return False
            if not (math.isfinite(spent) and spent >= 0):
                return False
            self._spent = max(self._spent, spent)
            return True
