"""Time as the core sees it: injected, so that tests move it by hand."""

from __future__ import annotations

from typing import Protocol

__all__ = ["Clock", "ManualClock"]


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic scale; only differences are meaningful."""
        ...


class ManualClock:
    """A clock that moves only when told to."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time does not run backwards")
        self._now += seconds

    def advance_to(self, t: float) -> None:
        """Jump to ``t`` exactly (``advance(t - now)`` can land a rounding error short of it,
        and an event loop that waits for ``now >= t`` then never gets there)."""
        if t < self._now:
            raise ValueError("time does not run backwards")
        self._now = t
