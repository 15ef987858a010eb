"""Lifeguard (Dadgar et al. 2018): local health, nacks, the dogpile and the buddy system."""

from __future__ import annotations

import math

import pytest

from gossip.clock import ManualClock
from gossip.lifeguard import LocalHealth, RelayerRate, suspicion_timeout_s
from gossip.swim import Kind, MemberRecord, Outgoing, Status, Swim, SwimConfig, SwimMessage
from gossip.swim_sim import SwimSimulation

CFG = SwimConfig()


@pytest.mark.parametrize(
    ("confirmations", "expected", "timeout"),
    [
        (0, 3, 60.0),
        (1, 3, 60.0 - 50.0 * math.log(2) / math.log(4)),  # 35
        (2, 3, 60.0 - 50.0 * math.log(3) / math.log(4)),
        (3, 3, 10.0),
        (7, 3, 10.0),
        (0, 0, 10.0),  # too few members to expect any: the minimum at once
    ],
)
def test_a_suspicion_shrinks_with_each_independent_confirmation(
    confirmations: int, expected: int, timeout: float
) -> None:
    assert suspicion_timeout_s(10.0, 60.0, confirmations, expected) == pytest.approx(timeout)


def test_local_health_stays_within_its_bounds_and_scales_timeouts() -> None:
    health = LocalHealth(max_score=3)
    health.apply(-1)
    assert health.score == 0
    assert health.scale(0.5) == 0.5
    for _ in range(5):
        health.apply(1)
    assert health.score == 3
    assert health.scale(0.5) == 2.0


def test_a_relayer_rate_refills_and_keeps_a_bounded_number_of_buckets() -> None:
    rate = RelayerRate(per_s=1.0, burst=2, max_relayers=2)
    assert [rate.take("a", 0.0) for _ in range(3)] == [True, True, False]
    assert rate.take("a", 1.0)
    assert not rate.take("a", 1.0)
    rate.take("b", 1.0)
    rate.take("c", 1.0)  # a's bucket, the least recently used, goes
    assert [rate.take("a", 1.0) for _ in range(3)] == [True, True, False]


def probes_per_s(pings: list[float], start: float, end: float) -> float:
    return sum(start <= t < end for t in pings) / (end - start)


def test_a_member_that_misses_its_acks_probes_slower_and_recovers() -> None:
    deaf = {"on": False}
    pings: list[float] = []

    def watch(out: Outgoing) -> None:
        if out.message.sender == "m0000" and out.message.kind is Kind.PING and out.message.seq:
            pings.append(sim.clock.now())

    sim = SwimSimulation(
        8,
        CFG,
        seed=5,
        on_message=watch,
        drop=lambda out: deaf["on"] and out.address == "sim://m0000",
    )
    lonely = sim.members["sim://m0000"]
    sim.run_until(20)
    healthy_rate = probes_per_s(pings, 5, 20)
    deaf["on"] = True  # nothing reaches it: no ack, no nack
    sim.run_until(80)
    assert lonely.health.score == CFG.max_health
    assert probes_per_s(pings, 50, 80) < healthy_rate / 3
    deaf["on"] = False
    sim.run_until(200)
    assert lonely.health.score == 0
    assert probes_per_s(pings, 170, 200) > healthy_rate / 2
    for address in sim.live_addresses():
        assert sim.status(address, "m0000") is Status.ALIVE


def req(sender: Swim, helper: Swim, target: str, seq: int) -> SwimMessage:
    return SwimMessage(Kind.PING_REQ, sender.node_id, sender.address, seq, target, (sender.me,))


def test_a_helper_nacks_when_the_target_does_not_answer_it_either() -> None:
    clock = ManualClock()
    r = Swim("r", "sim://r", 1, CFG, clock)
    h = Swim("h", "sim://h", 1, CFG, clock)
    h.merge([MemberRecord("t", "sim://t", 1), r.me])
    [ping] = h.receive(req(r, h, "t", seq=41))
    assert ping.address == "sim://t"
    assert ping.message.kind is Kind.PING
    clock.advance_to(CFG.ping_timeout_s - 0.01)
    assert [o for o in h.tick() if o.message.kind is Kind.NACK] == []
    clock.advance_to(h.next_deadline())
    [nack] = [o for o in h.tick() if o.message.kind is Kind.NACK]
    assert nack.address == "sim://r"
    assert (nack.message.seq, nack.message.target) == (41, "t")
    # An ack that does come, late, is still relayed.
    ack = SwimMessage(Kind.ACK, "t", "sim://t", ping.message.seq, "t")
    [relayed] = h.receive(ack)
    assert relayed.address == "sim://r"
    assert relayed.message.kind is Kind.ACK


@pytest.mark.parametrize(("helpers_answer", "score"), [(True, 0), (False, 1)])
def test_helpers_that_nack_say_the_silence_is_the_target_s(
    helpers_answer: bool, score: int
) -> None:
    clock = ManualClock()
    r = Swim("r", "sim://r", 1, CFG, clock)
    helpers = {f"sim://h{i}": Swim(f"h{i}", f"sim://h{i}", 1, CFG, clock) for i in range(3)}
    r.merge([MemberRecord("t", "sim://t", 1)])
    [probe] = r.tick()
    assert probe.address == "sim://t"
    r.merge([h.me for h in helpers.values()])
    for h in helpers.values():
        h.merge([r.me, MemberRecord("t", "sim://t", 1)])
    clock.advance_to(CFG.ping_timeout_s)
    relays = []
    for out in r.tick():  # the ping-reqs, and the fallback ping to t (lost)
        if out.address in helpers and helpers_answer:
            relays += helpers[out.address].receive(out.message)  # their pings to t: lost
    clock.advance_to(2 * CFG.ping_timeout_s)
    for h in helpers.values():
        for out in h.tick():
            if out.address == r.address:
                r.receive(out.message)
    clock.advance_to(CFG.period_s)
    r.tick()
    assert r.health.score == score
    held = r.record("t")
    assert held is not None
    assert held.status is Status.SUSPECT
    assert held.accuser == "r"


def dead_at(accusers: list[str], until: float = 60.0) -> float | None:
    """When ``r``, which hears ``accusers`` suspect x and whose own probes are all lost, holds x
    dead (local health off, to see the dogpile alone)."""
    clock = ManualClock()
    r = Swim("r", "sim://r", 1, SwimConfig(max_health=0), clock)
    r.merge([MemberRecord(i, f"sim://{i}", 1) for i in ["x", "c1", "c2", "c3", "c4"]])
    x = r.record("x")
    assert x is not None
    r.merge([MemberRecord("x", x.address, 1, Status.SUSPECT, accuser=a) for a in accusers])
    while clock.now() < until:
        r.tick()
        held = r.record("x")
        if held is not None and held.status is Status.DEAD:
            return clock.now()
        clock.advance_to(r.next_deadline())
    return None


def test_many_accusers_kill_fast_and_one_repeated_counts_once() -> None:
    low = CFG.suspicion_timeout_s(6)
    many = dead_at(["c1", "c2", "c3", "c4"])
    assert many is not None
    assert many <= low + 2 * CFG.period_s
    # c1 ten times, and r's own failed probe: two accusers, far from the minimum.
    one = dead_at(["c1"] * 10)
    expected = suspicion_timeout_s(low, low * CFG.suspicion_max_mult, 1, 3)
    assert one is not None
    assert expected <= one <= expected + 2 * CFG.period_s


def test_a_member_held_dead_is_told_so_by_whoever_answers_it() -> None:
    clock = ManualClock()
    r = Swim("r", "sim://r", 1, CFG, clock)
    x = Swim("x", "sim://x", 4, CFG, clock)
    r.merge([x.me])
    while (dead := r.record("x")) is None or dead.status is not Status.DEAD:
        r.tick()  # its probes of x are lost: x becomes suspect, then dead
        clock.advance_to(r.next_deadline())
    [ack] = r.receive(x.ping("sim://r").message)
    assert ack.address == "sim://x"
    assert dead in ack.message.updates
    x.receive(ack.message)
    assert x.incarnation == 5
