"""SWIM's settings, with the reason beside each default (re-exported by :mod:`gossip.swim`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["SwimConfig"]


@dataclass(frozen=True)
class SwimConfig:
    """Args:
    period_s: one probe per member per period (at full local health).
    ping_timeout: the fraction of a period to wait for a direct ack before asking others.
    indirect_probes: how many others to ask (k).
    suspicion_mult: a suspect with enough confirmations is dead after
        ``suspicion_mult * max(1, log10 n)`` periods (the minimum suspicion timeout).
    suspicion_max_mult: a suspicion nobody else confirms lasts this many times the minimum.
    confirmations: accusers besides the first that bring a suspicion down to the minimum (K).
    max_health: the local health score's cap; probes stretch up to ``max_health + 1`` times.
    retransmit_mult: each update is piggybacked ``ceil(retransmit_mult * log10(n + 1))`` times.
    max_piggyback: updates per message, besides the sender's own record.
    reconnect_interval_s: how often a member pings one of the members it holds dead (with the
        probability that makes it about one ping per dead member and interval, swarm-wide).
    forget_after_s: how long dead and departed members are remembered (dead ones are pinged
        again all that time), so that old records about them change nothing.
    push_pull_interval_s: how often a member swaps its whole state with a random member, up to
        32 members; above, times ``ceil(log2 n - 5) + 1``.
    max_push_pull: the most records one push-pull carries (this member's own, then the live
        members, then the others, a random share of each where there are more).
    max_members: the most members a view holds, dead and departed included; a full view makes
        room by forgetting the member longest dead, else refuses newcomers.
    max_pending: the most updates waiting to be piggybacked; a full queue drops the update
        that has been sent most.
    new_members_per_s, new_members_burst: the rate (a token bucket per relayer) at which one
        relayer may introduce members new to us.
    """

    period_s: float = 1.0  # a crash is noticed within a second or two (SWIM §5)
    ping_timeout: float = 0.4  # far above any round trip, and leaves 0.6 of a period for helpers
    indirect_probes: int = 4  # with the retry, 1.6% false failures at 20% loss (3: 2.7%)
    suspicion_mult: float = 5.0  # 10.5 s at 128 members: time for the suspect to hear and refute
    suspicion_max_mult: float = 6.0  # memberlist's: one accuser alone gives a minute at 128
    confirmations: int = 3  # three others that failed too are strong evidence (Lifeguard §4.2)
    max_health: int = 8  # memberlist's awareness cap: a sick member probes 9x slower at worst
    retransmit_mult: float = 6.0  # 13 sends at 128 members: reaches all with high probability
    max_piggyback: int = 8  # ~2 KB of records (key and signature each) on one message
    reconnect_interval_s: float = 5.0  # a healed 3|3 split is one view in ~5 s, well within 30 s
    forget_after_s: float = 86_400.0  # Serf reconnects failed members for 24 h
    push_pull_interval_s: float = 15.0  # repairs within ~2 periods (30 s); ~1 KB/s at 32 members
    max_members: int = 4096  # 16x the largest simulated swarm; ~2 MB of records at most
    max_push_pull: int = 512  # ~160 KB with keys and signatures: far under gRPC's bound
    max_pending: int = 256  # at ~40 records/s sent, more could not go out in their budget anyway
    new_members_per_s: float = 2.0  # joins come a few a minute; one relayer cannot swamp a view
    new_members_burst: int = 64  # a whole small swarm at once, as a push-pull from a new member

    def __post_init__(self) -> None:
        if self.period_s <= 0:
            raise ValueError("period_s must be positive")
        if not 0 < self.ping_timeout < 1:
            raise ValueError("ping_timeout is a fraction of the period, between 0 and 1")
        if self.indirect_probes < 0 or self.suspicion_mult <= 0 or self.retransmit_mult <= 0:
            raise ValueError("indirect_probes, suspicion_mult and retransmit_mult must be positive")
        if self.suspicion_max_mult < 1 or self.confirmations < 0 or self.max_health < 0:
            raise ValueError("suspicion_max_mult >= 1, confirmations >= 0, max_health >= 0")
        if min(self.reconnect_interval_s, self.forget_after_s, self.push_pull_interval_s) <= 0:
            raise ValueError("reconnect, forget and push-pull intervals must be positive")
        if min(self.max_members, self.max_pending, self.max_piggyback, self.new_members_burst) < 1:
            raise ValueError("max_members, max_pending, max_piggyback and the burst must be >= 1")
        if self.max_push_pull < 2:
            raise ValueError("max_push_pull must be at least 2 (ourselves and one other)")
        if self.new_members_per_s <= 0:
            raise ValueError("new_members_per_s must be positive")

    @property
    def ping_timeout_s(self) -> float:
        return self.ping_timeout * self.period_s

    def suspicion_timeout_s(self, n: int) -> float:
        """The minimum suspicion timeout in an n-member swarm."""
        return self.suspicion_mult * max(1.0, math.log10(max(n, 1))) * self.period_s

    def expected_confirmations(self, n: int) -> int:
        """K, or 0 where too few members could confirm (as memberlist)."""
        return self.confirmations if n - 2 >= self.confirmations else 0

    def retransmit_limit(self, n: int) -> int:
        return max(1, math.ceil(self.retransmit_mult * math.log10(n + 1)))

    def push_pull_period_s(self, n: int) -> float:
        if n <= 32:
            return self.push_pull_interval_s
        return (math.ceil(math.log2(n) - 5) + 1) * self.push_pull_interval_s

    def detection_deadline_s(self, n: int) -> float:
        """How long after a crash every member of an n-member swarm has it dead, at the latest
        expected: a few periods until someone's probe fails, the periods the suspicion takes to
        reach everyone (it doubles its reach each period), and the minimum suspicion timeout
        (a real crash is confirmed by everyone who probes it)."""
        spread = math.ceil(math.log2(max(n, 2))) + 2
        return (3 + spread) * self.period_s + self.suspicion_timeout_s(n)
