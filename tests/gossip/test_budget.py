"""The byte budget (gossip/budget.py) on an injected clock: spread over its period, whole again
when the period turns, kept across a restart only within its period; and on two real Mixers,
a budget ahead of its allowance lets only the heartbeat through."""

from __future__ import annotations

import threading

import pytest
import torch

from gossip.budget import LEAD, BudgetConfig, ByteBudget
from gossip.clock import ManualClock
from gossip.codecs import get_codec
from gossip.mixing import MixConfig, Mixer
from gossip.replicas import GossipState
from gossip.trigger import TriggerConfig

PERIOD_S = 480.0
NBYTES = 48_000


def budget(start: float = 0.0) -> tuple[ByteBudget, ManualClock]:
    clock = ManualClock(start)
    return ByteBudget(BudgetConfig(NBYTES, PERIOD_S), clock), clock


def test_the_allowance_grows_with_the_period_from_a_lead() -> None:
    b, clock = budget()
    assert not b.ahead(NBYTES * LEAD)  # what may go at once
    assert b.ahead(NBYTES * LEAD + 1)
    b.spend(NBYTES * LEAD)
    assert b.ahead(1)
    clock.advance(PERIOD_S / 100)  # 1% of the period: 1% more of the budget
    assert not b.ahead(NBYTES / 100 * 0.999)
    assert b.ahead(NBYTES / 100 * 1.001)
    b.spend(NBYTES / 100)
    assert b.remaining == pytest.approx(NBYTES * (1 - LEAD - 0.01))


def test_what_is_not_spent_stays_for_later_in_the_period() -> None:
    b, clock = budget()
    clock.advance(PERIOD_S / 2)  # idle for half the period
    b.spend(NBYTES / 2)  # half the budget at once is within the allowance
    assert not b.ahead(NBYTES * LEAD)
    b.spend(NBYTES * LEAD)
    assert b.ahead(1)


def test_a_spent_budget_holds_until_the_period_turns_then_is_whole() -> None:
    b, clock = budget()
    b.spend(NBYTES * 1.1)  # heartbeats may take it over
    clock.advance(PERIOD_S - 1)
    assert b.ahead()
    assert b.remaining == 0
    assert b.resets_in == pytest.approx(1)
    clock.advance(1)
    assert not b.ahead()
    assert b.remaining == NBYTES
    assert b.turns == 1
    assert b.last_spent == pytest.approx(NBYTES * 1.1)
    assert b.resets_in == pytest.approx(PERIOD_S)


def test_periods_are_aligned_on_the_clock_s_zero() -> None:
    b, _ = budget(start=PERIOD_S * 10 + PERIOD_S / 2)  # started mid-period
    assert b.resets_in == pytest.approx(PERIOD_S / 2)
    b.spend(NBYTES * (0.5 + LEAD) - 1)  # half the period has passed: half its bytes
    assert not b.ahead(1)
    assert b.ahead(2)


def test_a_charge_counts_each_byte_of_message_as_more_of_the_budget() -> None:
    b = ByteBudget(BudgetConfig(NBYTES, PERIOD_S), ManualClock(), charge=1.25)
    b.spend(800)
    assert b.spent == 1000
    assert not b.ahead(NBYTES * LEAD / 1.25 - 800)
    assert b.ahead(NBYTES * LEAD / 1.25 - 799)
    with pytest.raises(ValueError, match="at least a byte"):
        ByteBudget(BudgetConfig(NBYTES, PERIOD_S), ManualClock(), charge=0.5)


def test_a_period_that_passes_unspent_is_not_the_last_spending() -> None:
    b, clock = budget()
    b.spend(1000)
    clock.advance(PERIOD_S * 3)
    assert b.spent == 0
    assert b.last_spent == 0  # the period before this one spent nothing
    assert b.turns == 1


def test_a_restart_keeps_the_period_s_spending_and_only_its_own() -> None:
    b, clock = budget()
    b.spend(20_000)
    saved = b.saved()
    again = ByteBudget(BudgetConfig(NBYTES, PERIOD_S), clock)
    assert again.restore(saved)
    assert again.spent == 20_000
    other_period = ByteBudget(BudgetConfig(NBYTES, PERIOD_S / 2), clock)
    assert not other_period.restore(saved)
    clock.advance(PERIOD_S)
    later = ByteBudget(BudgetConfig(NBYTES, PERIOD_S), clock)
    assert not later.restore(saved)  # of the period before: the budget is whole
    assert later.spent == 0
    for bad in ({}, {"period_s": "x", "period_start": 0, "spent": 1}, {**saved, "spent": -5}):
        assert not ByteBudget(BudgetConfig(NBYTES, PERIOD_S), ManualClock()).restore(bad)


def test_spending_from_two_threads_loses_nothing() -> None:
    b, _ = budget()

    def spend() -> None:
        for _ in range(10_000):
            b.spend(1)

    threads = [threading.Thread(target=spend) for _ in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert b.spent == 20_000


@pytest.mark.parametrize("cfg", [(0, 60.0), (100, 0.0), (100, float("inf"))])
def test_a_budget_of_nothing_or_of_no_period_is_refused(cfg: tuple[int, float]) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        BudgetConfig(*cfg)


N = 512
TICK_S = 0.1
HEARTBEAT_S = 2.0


def training_pair(nbytes: int) -> tuple[list[str], ByteBudget, ManualClock]:
    """Node a (on a budget of ``nbytes`` per 60 s) and b train and gossip for 20 s of ticks,
    a's deltas spending its budget as its link would; returns a's reasons for its rounds."""
    clock = ManualClock()
    torch.manual_seed(0)
    start = torch.randn(N)
    x = {"a": start.clone(), "b": start.clone()}
    b_budget = ByteBudget(BudgetConfig(nbytes, 60.0), clock)
    trigger = TriggerConfig(heartbeat_s=HEARTBEAT_S)
    mixers = {}
    for me, other in (("a", "b"), ("b", "a")):
        state = GossipState(x[me], get_codec("int8", 256), clock, torch.Generator().manual_seed(1))
        state.set_peers(frozenset({other}))
        cfg = MixConfig(0.8, 30.0, trigger=trigger)
        mixers[me] = Mixer(state, cfg, budget=b_budget if me == "a" else None)
    for me, other in (("a", "b"), ("b", "a")):
        seq, values = mixers[other].state.snapshot()
        mixers[me].state.receive_snapshot(other, 0, seq, values, degree=1)
    reasons = []
    for _ in range(200):
        clock.advance(TICK_S)
        for me, other in (("a", "b"), ("b", "a")):
            x[me] -= 0.01 * torch.randn(N)
            made = mixers[me].round(x[me])
            if made is None:
                continue
            mixers[other].state.receive_delta(me, 0, made.seq, made.payload, degree=1)
            if me == "a":
                reasons.append(made.reason)
                b_budget.spend(len(made.payload.data) + len(made.payload.scales))
    return reasons, b_budget, clock


def test_a_budget_ahead_of_its_allowance_lets_only_the_heartbeat_through() -> None:
    reasons, _, _ = training_pair(nbytes=1)  # spent by the first round
    # The first round, then one heartbeat every HEARTBEAT_S of the 20 s: nothing the movement
    # of training would have asked for (every tick, below).
    assert reasons[0] == "first"
    assert set(reasons[1:]) == {"heartbeat"}
    assert len(reasons) == 1 + int((20 - TICK_S) / HEARTBEAT_S)


def test_a_budget_that_allows_more_than_is_sent_holds_nothing_back() -> None:
    reasons, b, _ = training_pair(nbytes=10**9)
    assert len(reasons) == 200  # a round every tick, as without a budget
    assert not b.ahead()


def test_a_budget_paces_the_rounds_to_its_rate() -> None:
    delta_nbytes = N + 4 * (N // 256)  # int8 values and one fp32 scale a block
    per_minute = 60 * delta_nbytes  # one round a second: a tenth of the ticks
    reasons, b, _ = training_pair(nbytes=per_minute)
    allowed = per_minute * (20 / 60 + LEAD)
    assert b.spent <= allowed + delta_nbytes  # a round made while under may go over by one
    assert b.spent >= allowed - delta_nbytes * (1 + HEARTBEAT_S / TICK_S)
    assert 20 <= len(reasons) <= 30  # about one round a second, not ten


def test_a_budget_without_the_trigger_is_refused() -> None:
    clock = ManualClock()
    state = GossipState(torch.zeros(8), get_codec("int8", 8), clock, torch.Generator())
    with pytest.raises(ValueError, match="trigger"):
        Mixer(state, MixConfig(), budget=ByteBudget(BudgetConfig(10, 1.0), clock))


def test_wait_s_says_when_a_message_fits_under_the_allowance() -> None:
    b, clock = budget()
    assert b.wait_s(NBYTES * LEAD) == 0  # within the lead: at once
    b.spend(NBYTES * LEAD)
    # A tenth of the budget more: when a tenth of the period has passed.
    assert b.wait_s(NBYTES / 10) == pytest.approx(PERIOD_S / 10)
    clock.advance(PERIOD_S / 10)
    assert b.wait_s(NBYTES / 10) == pytest.approx(0, abs=1e-9)
    # Past the whole budget: after the turn, and the lead of the next period covers it.
    b.spend(NBYTES / 10)
    b.spend(NBYTES * (0.9 - LEAD))  # all of it spent
    assert b.wait_s(NBYTES * LEAD / 2) == pytest.approx(PERIOD_S * 0.9)
    clock.advance(PERIOD_S * 0.9)
    assert b.wait_s(NBYTES * LEAD / 2) == 0
    # Bigger than a whole budget: only when nothing of the period is spent yet.
    assert b.wait_s(NBYTES * 2) == 0
    b.spend(1)
    assert b.wait_s(NBYTES * 2) == pytest.approx(PERIOD_S)


def test_claims_made_in_the_same_moment_do_not_share_the_room() -> None:
    # Three links want a snapshot at once, each of which fits the lead alone but not together.
    b, clock = budget()
    snapshot = NBYTES * LEAD * 0.6
    waits = [b.claim(snapshot) for _ in range(3)]
    assert waits[0] == 0  # the first goes, and is counted at once
    assert b.spent == pytest.approx(snapshot)
    assert all(w > 0 for w in waits[1:])  # the others wait for the allowance to grow
    assert b.spent == pytest.approx(snapshot)  # and a claim that waits counts nothing
    assert b.wait_s(snapshot) == pytest.approx(waits[1])
    clock.advance(waits[1])
    assert b.claim(snapshot) == 0  # once it has grown, the next goes
    assert b.spent == pytest.approx(2 * snapshot)
    assert b.claim(snapshot) > 0
