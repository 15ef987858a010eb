"""Lifeguard's refinements of SWIM, and the rate that bounds what one relayer can add.

After Dadgar, Phillips and Currey, "Lifeguard: Local Health Awareness for More Accurate Failure
Detection" (2018), as HashiCorp's memberlist implements it:

* :class:`LocalHealth`: the local health multiplier (§4.1, "LHA-Probe"). A member that misses
  acks to its own probes, or hears no nack from the helpers it asked to probe for it, is more
  likely slow itself than surrounded by failures: it stretches its probe period and timeout, so
  that it raises fewer false suspicions while it is unwell.
* :func:`suspicion_timeout_s`: the dogpile (§4.2, "LHA-Suspicion"). A suspicion starts with a
  long timeout that shrinks, logarithmically, with each independent confirmation by another
  accuser: a real failure is confirmed by many and dies fast, a member that one unlucky (or
  lying) accuser suspects has long to refute.

The buddy system (§4.3, a suspect is told of its suspicion by whoever writes to it) lives in
:meth:`gossip.swim.Swim._piggyback`. :class:`RelayerRate` is murmur's own: token buckets that
bound how many members new to us one relayer may introduce per second.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["LocalHealth", "RelayerRate", "suspicion_timeout_s"]


@dataclass
class LocalHealth:
    """The local health multiplier: a score in ``[0, max_score]``; timeouts are multiplied by
    ``score + 1`` (Lifeguard §4.1).

    The score rises by one for a probe that got no ack and no nack from any helper, and for a
    refutation of a suspicion of this member; it falls by one for each probe that got its ack.
    """

    max_score: int
    score: int = 0

    def apply(self, delta: int) -> None:
        self.score = min(max(self.score + delta, 0), self.max_score)

    def scale(self, seconds: float) -> float:
        return seconds * (self.score + 1)


def suspicion_timeout_s(min_s: float, max_s: float, confirmations: int, expected: int) -> float:
    """How long a suspicion lasts, given ``confirmations`` independent accusers besides the first
    (Lifeguard §4.2): ``max_s`` with none, falling with log(C + 1) to ``min_s`` at ``expected``.

    ``expected`` 0 (a swarm too small to expect confirmations) means ``min_s`` at once.
    """
    if expected <= 0 or confirmations >= expected:
        return min_s
    fraction = math.log(confirmations + 1) / math.log(expected + 1)
    return max(min_s, max_s - (max_s - min_s) * fraction)


class RelayerRate:
    """One token bucket per relayer: ``burst`` tokens, refilled at ``per_s``.

    At most ``max_relayers`` buckets are kept (the least recently used go first), so that the
    buckets themselves cannot be made to grow without bound; a relayer whose bucket was dropped
    starts again with a full one, which costs at most ``burst`` more.
    """

    def __init__(self, per_s: float, burst: int, max_relayers: int) -> None:
        self.per_s = per_s
        self.burst = burst
        self.max_relayers = max_relayers
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def take(self, relayer: str, now: float) -> bool:
        """Spend one of ``relayer``'s tokens; False (and nothing spent) if it has none."""
        tokens, at = self._buckets.pop(relayer, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) * self.per_s)
        ok = tokens >= 1.0
        self._buckets[relayer] = (tokens - 1.0 if ok else tokens, now)
        if len(self._buckets) > self.max_relayers:
            self._buckets.popitem(last=False)
        return ok
