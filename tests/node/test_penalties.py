"""The back-off policy for peers whose messages keep failing validation: pure, on a ManualClock."""

from __future__ import annotations

import pytest

from gossip.clock import ManualClock
from node.security.penalties import (
    COUNTED_REASONS,
    LogLimiter,
    Penalties,
    PenaltyConfig,
    RateConfig,
    RateLimiter,
    held_back,
)
from node.transport.base import Reason

A, B = "a" * 32, "b" * 32
CFG = PenaltyConfig(threshold=3, window_s=10.0, ban_s=5.0, max_ban_s=18.0, forgive_after_s=100.0)


def offend(p: Penalties, sender: str, n: int, reason: Reason = Reason.BAD_PAYLOAD) -> list[float]:
    return [p.note_refusal(sender, reason) for _ in range(n)]


def test_the_threshold_th_bad_message_in_the_window_earns_a_ban() -> None:
    p = Penalties(CFG, ManualClock())
    assert offend(p, A, 3) == [0.0, 0.0, 5.0]
    assert p.ban_left_s(A) == 5.0
    assert p.ban_left_s(B) == 0.0


def test_refusals_older_than_the_window_do_not_count() -> None:
    clock = ManualClock()
    p = Penalties(CFG, clock)
    offend(p, A, 2)
    clock.advance(10.0)  # the first two fall out of the window exactly now
    assert offend(p, A, 2) == [0.0, 0.0]
    assert p.ban_left_s(A) == 0.0
    assert offend(p, A, 1) == [5.0]


@pytest.mark.parametrize(
    "reason",
    [Reason.GAP, Reason.STALE, Reason.NOT_READY, Reason.UNKNOWN_SENDER, Reason.BAD_ADDRESS],
)
def test_refusals_that_honest_peers_meet_during_churn_never_count(reason: Reason) -> None:
    p = Penalties(CFG, ManualClock())
    assert offend(p, A, 50, reason) == [0.0] * 50
    assert p.ban_left_s(A) == 0.0
    assert p.tracked() == 0


def test_every_reason_that_says_the_message_is_bad_counts() -> None:
    assert {
        Reason.MALFORMED,
        Reason.BAD_PAYLOAD,
        Reason.NON_FINITE,
        Reason.IDENTITY,
        Reason.FINGERPRINT,
        Reason.PROTOCOL_VERSION,
        Reason.UNADMITTED,
        Reason.IMPLAUSIBLE,
    } == COUNTED_REASONS
    p = Penalties(CFG, ManualClock())
    for reason in sorted(COUNTED_REASONS)[:3]:
        p.note_refusal(A, reason)
    assert p.ban_left_s(A) == 5.0


def test_a_ban_expires_and_repeat_offences_double_it_up_to_the_cap() -> None:
    clock = ManualClock()
    p = Penalties(CFG, clock)
    bans = []
    for _ in range(4):
        bans.append(offend(p, A, 3)[-1])
        clock.advance(bans[-1] - 1.0)
        assert p.ban_left_s(A) == 1.0
        # Refusals during a ban (of messages that got past it some other way) do not extend it.
        assert offend(p, A, 5) == [0.0] * 5
        clock.advance(1.0)
        assert p.ban_left_s(A) == 0.0
    assert bans == [5.0, 10.0, 18.0, 18.0]


def test_a_sender_clean_long_enough_after_a_ban_starts_over() -> None:
    clock = ManualClock()
    p = Penalties(CFG, clock)
    offend(p, A, 3)
    clock.advance(5.0 + 100.0 + 1.0)
    assert offend(p, A, 3)[-1] == 5.0


def test_a_flood_of_made_up_ids_keeps_memory_bounded() -> None:
    p = Penalties(PenaltyConfig(threshold=2, max_tracked=10), ManualClock())
    for i in range(1000):
        p.note_refusal(f"id-{i}", Reason.MALFORMED)
    assert p.tracked() == 10


def test_a_config_that_could_never_ban_or_never_end_one_is_refused() -> None:
    with pytest.raises(ValueError, match="threshold"):
        PenaltyConfig(threshold=0)
    with pytest.raises(ValueError, match="max_ban_s"):
        PenaltyConfig(ban_s=10.0, max_ban_s=5.0)


def test_a_sender_may_burst_then_keep_up_its_rate_and_no_more() -> None:
    clock = ManualClock()
    limiter = RateLimiter(RateConfig(rate=10.0, burst=5.0), clock)
    assert [limiter.allow("a") for _ in range(6)] == [True] * 5 + [False]
    assert limiter.allow("b")  # each sender has a bucket of its own
    clock.advance(0.1)  # one token back
    assert [limiter.allow("a") for _ in range(2)] == [True, False]
    clock.advance(10.0)  # a quiet spell refills to the burst, not beyond
    assert sum(limiter.allow("a") for _ in range(20)) == 5


def test_the_rate_limiter_forgets_the_least_recent_senders() -> None:
    limiter = RateLimiter(RateConfig(rate=1.0, burst=1.0, max_tracked=3), ManualClock())
    assert limiter.allow("a")
    assert not limiter.allow("a")
    for other in ("b", "c", "d"):  # pushes "a" out, so it starts with a full bucket again
        limiter.allow(other)
    assert limiter.allow("a")


def test_log_lines_about_one_peer_are_rate_limited_and_say_what_was_held_back() -> None:
    clock = ManualClock()
    limiter = LogLimiter(clock, period_s=60.0, burst=2)
    assert [limiter.allow("mallory") for _ in range(5)] == [0, 0, None, None, None]
    assert limiter.allow("bob") == 0  # others have lines of their own
    clock.advance(60.0)
    assert limiter.allow("mallory") == 3  # the next line says three were held back
    assert held_back(3) == " (3 more like it held back)"
    assert held_back(0) == ""
    assert limiter.held == 3
