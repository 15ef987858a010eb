"""Membership heals by itself (issue 13): after a partition of any shape, one view."""

from __future__ import annotations

import random

import pytest

from gossip.clock import ManualClock
from gossip.swim import Kind, Outgoing, Status, Swim, SwimConfig
from gossip.swim_sim import SwimSimulation

CFG = SwimConfig()
HEAL_BOUND_S = 30.0  # issue 13: one view of all live members within 30 s of the end


def views(sim: SwimSimulation) -> dict[str, list[str]]:
    return {a: [r.node_id for r in m.live_members()] for a, m in sim.members.items()}


@pytest.mark.parametrize("shape", [(3, 3), (1, 5), (2, 2, 2)], ids=["3|3", "1|5", "2|2|2"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_after_a_partition_every_view_holds_exactly_the_live_members(
    shape: tuple[int, ...], seed: int
) -> None:
    sim = SwimSimulation(sum(shape), CFG, seed=seed, signed=True)
    addresses = list(sim.members)
    groups, start = [], 0
    for size in shape:
        groups.append(addresses[start : start + size])
        start += size
    everyone = sorted(m.node_id for m in sim.members.values())
    incarnations = {a: m.incarnation for a, m in sim.members.items()}
    sim.run_until(10)
    sim.split(groups, start_s=10, duration_s=30)
    sim.run_until(40)
    # Each side has declared the others dead. A member alone is slower (nobody answers it,
    # not even with a nack, so its local health stretches its probes: Lifeguard at work), but
    # its view is not whole either.
    dead_to_someone = set()
    for group in groups:
        for address in group:
            held = {r.node_id: r.status for r in sim.members[address].records()}
            dead_to_someone |= {i for i, status in held.items() if status is Status.DEAD}
            others = {held[sim.members[a].node_id] for a in addresses if a not in group}
            if len(group) > 1:
                assert others == {Status.DEAD}
            else:
                assert others != {Status.ALIVE}
    whole_at: list[float] = []

    def check() -> None:
        if not whole_at and all(v == everyone for v in views(sim).values()):
            whole_at.append(sim.clock.now())

    sim.run_until(40 + HEAL_BOUND_S, check)
    assert whole_at, f"views after {HEAL_BOUND_S:g} s: {views(sim)}"
    # and it stays whole: no member is lost again.
    broken: list[float] = []
    sim.run_until(
        100,
        lambda: broken.extend(
            [sim.clock.now()] if any(v != everyone for v in views(sim).values()) else []
        ),
    )
    assert broken == []
    # Every member that was dead to someone came back by refuting, with a higher incarnation.
    assert dead_to_someone
    for address, m in sim.members.items():
        assert m.incarnation > incarnations[address] or m.node_id not in dead_to_someone


def test_a_dead_member_is_pushed_pulled_at_a_slow_rate_until_it_is_forgotten() -> None:
    cfg = SwimConfig(forget_after_s=200.0)
    to_dead: list[float] = []
    sim = SwimSimulation(
        8,
        cfg,
        seed=3,
        on_message=lambda o: to_dead.append(sim.clock.now()) if o.address == victim else None,
    )
    victim = "sim://m0005"
    sim.run_until(10)
    sim.crash(victim)
    sim.run_until(10 + cfg.detection_deadline_s(8))
    assert all(sim.status(a, "m0005") is Status.DEAD for a in sim.live_addresses())
    to_dead.clear()
    sim.run_until(110)
    # About one attempt per reconnect interval, swarm-wide (the first ones at random times).
    per_interval = len(to_dead) * cfg.reconnect_interval_s / (110 - 10 - 25)
    assert 0.3 < per_interval < 3
    sim.run_until(10 + cfg.forget_after_s + 30)
    to_dead.clear()
    sim.run_until(sim.clock.now() + 60)
    assert to_dead == []
    assert all(sim.status(a, "m0005") is None for a in sim.live_addresses())


def test_a_departed_member_is_never_contacted_again() -> None:
    to_left: list[Outgoing] = []
    sim = SwimSimulation(
        8, CFG, seed=4, on_message=lambda o: to_left.append(o) if o.address == leaver else None
    )
    leaver = "sim://m0002"
    sim.run_until(5)
    sim.send(sim.members[leaver].leave(fanout=7))
    sim.crash(leaver)
    sim.run_until(8)
    to_left.clear()
    sim.run_until(200)
    assert to_left == []


def run_net(members: list[Swim], clock: ManualClock, until: float, kinds: set[Kind]) -> None:
    """Run ``members`` with instant delivery of the messages of ``kinds`` (the rest is lost)."""
    by_address = {m.address: m for m in members}
    while clock.now() < until:
        outgoing = [o for m in members for o in m.tick()]
        while outgoing:
            out = outgoing.pop()
            if out.address in by_address and out.message.kind in kinds:
                outgoing += by_address[out.address].receive(out.message)
        clock.advance_to(min(until, *(m.next_deadline() for m in members)))


@pytest.mark.parametrize("push_pull", [False, True], ids=["gossip alone", "with push-pull"])
def test_a_push_pull_repairs_what_gossip_missed(push_pull: bool) -> None:
    clock = ManualClock()
    a, b, c, d = (
        Swim(i, f"sim://{i}", 1, CFG, clock, random.Random(n)) for n, i in enumerate("abcd")
    )
    # a and b know each other; c only a, d only b; and nothing is left to piggyback (a view
    # that gossip has missed).
    for m, known in ((a, [b, c]), (b, [a, d]), (c, [a]), (d, [b])):
        m.merge([k.me for k in known])
        m.clear_updates()
    kinds = set(Kind) if push_pull else set(Kind) - {Kind.PUSH_PULL, Kind.PUSH_PULL_REPLY}
    run_net([a, b, c, d], clock, 2 * CFG.push_pull_period_s(4) + 1, kinds)
    views = [{r.node_id for r in m.live_members()} for m in (a, b, c, d)]
    if push_pull:
        assert views == [set("abcd")] * 4
    else:
        assert views == [set("abc"), set("abd"), set("ac"), set("bd")]
