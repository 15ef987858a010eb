"""SWIM membership on a simulated lossy network, on an injected clock."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import replace

import pytest

from gossip.clock import ManualClock
from gossip.swim import Kind, MemberRecord, Outgoing, Status, Swim, SwimConfig, supersedes
from gossip.swim_sim import SwimSimulation

CFG = SwimConfig()


def record(status: Status, incarnation: int) -> MemberRecord:
    return MemberRecord("x", "sim://x", incarnation, status)


@pytest.mark.parametrize(
    ("new", "old", "wins"),
    [
        (record(Status.SUSPECT, 1), record(Status.ALIVE, 1), True),
        (record(Status.ALIVE, 1), record(Status.SUSPECT, 1), False),
        (record(Status.ALIVE, 2), record(Status.SUSPECT, 1), True),
        (record(Status.DEAD, 1), record(Status.SUSPECT, 1), True),
        (record(Status.ALIVE, 2), record(Status.DEAD, 1), True),
        (record(Status.SUSPECT, 1), record(Status.DEAD, 1), False),
        (record(Status.LEFT, 1), record(Status.ALIVE, 1), True),
        (record(Status.DEAD, 1), record(Status.LEFT, 1), False),
        (record(Status.ALIVE, 1), record(Status.ALIVE, 2), False),
    ],
)
def test_updates_are_ordered_by_incarnation_then_severity(
    new: MemberRecord, old: MemberRecord, wins: bool
) -> None:
    assert supersedes(new, old) is wins


def test_a_quiet_swarm_stays_whole() -> None:
    sim = SwimSimulation(16, CFG, seed=0)
    changes: list[MemberRecord] = []
    sim.run_until(
        300,
        lambda: changes.extend(
            r for a in sim.live_addresses() for r in sim.members[a].drain_changes()
        ),
    )
    assert changes == []
    for address in sim.live_addresses():
        assert len(sim.members[address].live_members()) == 16


@pytest.mark.parametrize("loss", [0.0, 0.1])
def test_a_crashed_member_is_dead_to_everyone_within_the_configured_time(loss: float) -> None:
    n = 32
    sim = SwimSimulation(n, CFG, loss=loss, seed=3)
    sim.run_until(20)
    victim = "m0007"
    sim.crash(f"sim://{victim}")
    crashed_at = sim.clock.now()
    all_dead_at: list[float] = []

    def check() -> None:
        if not all_dead_at and all(
            sim.status(a, victim) is Status.DEAD for a in sim.live_addresses()
        ):
            all_dead_at.append(sim.clock.now())

    sim.run_until(crashed_at + 2 * CFG.detection_deadline_s(n), check)
    assert all_dead_at, "someone never declared the crashed member dead"
    assert all_dead_at[0] - crashed_at <= CFG.detection_deadline_s(n)
    for address in sim.live_addresses():
        assert victim not in {r.node_id for r in sim.members[address].live_members()}


def test_with_ten_percent_loss_no_live_member_is_ever_declared_dead() -> None:
    sim = SwimSimulation(32, CFG, loss=0.1, seed=7)
    deaths: list[MemberRecord] = []
    suspicions = 0

    def watch() -> None:
        nonlocal suspicions
        for address in sim.live_addresses():
            for r in sim.members[address].drain_changes():
                suspicions += r.status is Status.SUSPECT
                if r.status is Status.DEAD:
                    deaths.append(r)

    sim.run_until(1000, watch)  # 1000 protocol periods
    assert deaths == []
    assert suspicions > 0  # loss did cause suspicions, and every one was refuted in time
    for address in sim.live_addresses():
        assert len(sim.members[address].live_members()) == 32


def test_indirect_probes_keep_a_member_whose_direct_link_is_broken() -> None:
    broken = {("sim://m0001", "sim://m0002"), ("sim://m0002", "sim://m0001")}
    sim = SwimSimulation(
        8, CFG, seed=1, drop=lambda out: (out.message.sender_address, out.address) in broken
    )
    changes: list[MemberRecord] = []
    sim.run_until(
        200,
        lambda: changes.extend(
            r for a in sim.live_addresses() for r in sim.members[a].drain_changes()
        ),
    )
    assert [r for r in changes if r.status is not Status.ALIVE] == []


def test_a_member_refutes_a_suspicion_of_itself() -> None:
    sim = SwimSimulation(8, CFG, seed=2)
    sim.run_until(5)
    accused = sim.members["sim://m0003"]
    before = accused.incarnation
    # A rumour that m0003 is suspect reaches one member.
    sim.members["sim://m0000"].merge(
        [MemberRecord("m0003", accused.address, before, Status.SUSPECT)]
    )
    deaths: list[MemberRecord] = []
    sim.run_until(
        5 + 3 * CFG.suspicion_timeout_s(8),
        lambda: deaths.extend(
            r
            for a in sim.live_addresses()
            for r in sim.members[a].drain_changes()
            if r.status is Status.DEAD
        ),
    )
    assert deaths == []
    assert accused.incarnation > before
    for address in sim.live_addresses():
        assert sim.members[address].record("m0003") == accused.me


def test_a_departure_spreads_to_everyone_quickly_and_is_not_suspected_first() -> None:
    sim = SwimSimulation(16, CFG, seed=4)
    sim.run_until(10)
    leaver = sim.members["sim://m0009"]
    sim.send(leaver.leave(fanout=4))
    statuses: set[Status] = set()

    def watch() -> None:
        for a in sim.live_addresses():
            statuses.update(
                r.status for r in sim.members[a].drain_changes() if r.node_id == "m0009"
            )

    sim.run_until(10 + 6 * CFG.period_s, watch)
    assert statuses == {Status.LEFT}
    for address in sim.live_addresses():
        if address != leaver.address:
            assert sim.status(address, "m0009") is Status.LEFT


def test_a_member_joining_through_one_is_known_to_all_within_a_few_periods() -> None:
    sim = SwimSimulation(16, CFG, seed=5)
    sim.run_until(10)
    newcomer = sim.add("m9999", incarnation=1, join_through="sim://m0004")
    sim.run_until(10 + 8 * CFG.period_s)
    for address in sim.live_addresses():
        assert "m9999" in {r.node_id for r in sim.members[address].live_members()}
    assert len(newcomer.live_members()) == 17


def test_a_restarted_member_comes_back_with_a_higher_incarnation() -> None:
    n = 12
    sim = SwimSimulation(n, CFG, seed=6)
    sim.run_until(10)
    sim.crash("sim://m0002")
    sim.run_until(10 + 2 * CFG.detection_deadline_s(n))
    assert sim.status("sim://m0000", "m0002") is Status.DEAD
    # Same id, new process: its incarnation starts above the old one (the node uses its clock).
    sim.add("m0002", incarnation=10_000, join_through="sim://m0005")
    sim.run_until(sim.clock.now() + 8 * CFG.period_s)
    for address in sim.live_addresses():
        assert sim.status(address, "m0002") is Status.ALIVE


def test_a_suspect_is_probed_first_and_told_of_its_suspicion() -> None:
    clock = ManualClock()
    me = Swim("a", "sim://a", 1, CFG, clock)
    me.merge([MemberRecord("b", "sim://b", 1), MemberRecord("c", "sim://c", 4, Status.SUSPECT)])
    [ping] = me.tick()
    assert ping == Outgoing("sim://c", ping.message)
    assert ping.message.kind is Kind.PING
    assert MemberRecord("c", "sim://c", 4, Status.SUSPECT) in ping.message.updates


def test_config_refuses_a_ping_timeout_as_long_as_the_period() -> None:
    with pytest.raises(ValueError, match="ping_timeout"):
        SwimConfig(period_s=1.0, ping_timeout=1.0)


def test_a_refutation_does_not_take_a_place_among_the_updates_for_good() -> None:
    clock = ManualClock()
    me = Swim("a", "sim://a", 1, CFG, clock)
    others = [MemberRecord(f"m{i}", f"sim://m{i}", 1) for i in range(20)]
    me.merge(others)
    me.merge([MemberRecord("a", "sim://a", 1, Status.SUSPECT)])  # suspected: refute
    assert me.me.incarnation == 2
    for _ in range(100):  # plenty of messages to use up every update's budget
        assert me.ping("sim://m0").message.updates[0] == me.me
    # Every update ran out, this member's own record included: it rides first on every message
    # and must not also sit in the queue, crowding out news of others.
    assert me.pending_updates() == []


def fake_signer(node_id: str) -> Callable[[bytes], bytes]:
    """Stands in for a node's key in pure tests (the node uses ECDSA: node/security/signing.py)."""
    return lambda data: hashlib.sha256(node_id.encode() + data).digest()


def status_of(member: Swim, node_id: str) -> Status | None:
    record = member.record(node_id)
    return record.status if record else None


def fake_verify(record: MemberRecord) -> bool:
    return record.signature == fake_signer(record.node_id)(record.claim())


def test_records_are_signed_by_their_member_and_checked_by_others() -> None:
    clock = ManualClock()
    b = Swim("b", "sim://b", 3, CFG, clock, sign=fake_signer("b"), public_key=b"kb")
    a = Swim("a", "sim://a", 1, CFG, clock, verify=fake_verify)
    a.merge([b.me])
    assert a.record("b") == b.me
    # Another member's suspicion keeps b's signature: it is not b's own claim.
    a.merge([replace(b.me, status=Status.SUSPECT)])
    assert status_of(a, "b") is Status.SUSPECT
    # But nobody else can move b, raise its incarnation, or say that it left.
    for forged in (
        replace(b.me, address="sim://evil", incarnation=4),
        replace(b.me, incarnation=9),
        replace(b.me, status=Status.LEFT),
    ):
        a.merge([forged])
    assert a.forged == 3
    assert a.record("b") == replace(b.me, status=Status.SUSPECT)
    b.leaving = True  # b's own departure, signed by b, is taken
    a.merge([b.me])
    assert status_of(a, "b") is Status.LEFT
