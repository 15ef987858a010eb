"""Membership records from others (issue 21): old ones change nothing, accusations name their
accuser, a death is only a suspicion to whoever hears of it, and what one member holds is
bounded."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gossip.clock import ManualClock
from gossip.swim import Kind, MemberRecord, Status, Swim, SwimConfig, SwimMessage
from gossip.swim_sim import SwimSimulation, fake_check_signature, fake_signer, fake_verify

CFG = SwimConfig()


def member(node_id: str, clock: ManualClock, incarnation: int = 1, cfg: SwimConfig = CFG) -> Swim:
    """A member that signs its records and checks others', as a node does with its key."""
    return Swim(
        node_id,
        f"sim://{node_id}",
        incarnation,
        cfg,
        clock,
        sign=fake_signer(node_id),
        public_key=node_id.encode(),
        verify=fake_verify,
        check_signature=fake_check_signature,
    )


def accuse(record: MemberRecord, accuser: str, status: Status = Status.DEAD) -> MemberRecord:
    """An accusation of ``record``'s member, signed by ``accuser``."""
    accusation = replace(record, status=status, accuser=accuser)
    return replace(accusation, accuser_signature=fake_signer(accuser)(accusation.accusation()))


def record_of(node_id: str, incarnation: int, status: Status = Status.ALIVE) -> MemberRecord:
    """The member's own signed record (alive, or that it left) at ``incarnation``."""
    owner = member(node_id, ManualClock(), incarnation)
    owner.leaving = status is Status.LEFT
    return owner.me


def kind_of(incarnation: int, kind: Status, accuser: str = "c") -> MemberRecord:
    if kind in (Status.ALIVE, Status.LEFT):
        return record_of("x", incarnation, kind)
    return accuse(record_of("x", incarnation), accuser, kind)


def run_alone(swim: Swim, clock: ManualClock, until: float) -> None:
    """Run ``swim``'s timers with every message it sends lost."""
    while clock.now() < until:
        swim.tick()
        clock.advance_to(min(until, max(swim.next_deadline(), clock.now() + 0.01)))
    swim.tick()


def receiver_holding(state: Status) -> tuple[Swim, ManualClock]:
    """A member that knows x (incarnation 5) in ``state``, and c, who accuses x."""
    clock = ManualClock()
    r = member("r", clock)
    r.merge([record_of("c", 1), record_of("x", 5)])
    if state is Status.SUSPECT:
        r.merge([accuse(record_of("x", 5), "c", Status.SUSPECT)])
    elif state is Status.DEAD:
        r.merge([accuse(record_of("x", 5), "c", Status.SUSPECT)])
        run_alone(r, clock, 120.0)  # nobody answers: its own probes confirm the suspicion
    elif state is Status.LEFT:
        r.merge([record_of("x", 5, Status.LEFT)])
    held = r.record("x")
    assert held is not None
    assert held.status is state
    r.drain_changes()
    return r, clock


#: (what the receiver holds of x at incarnation 5, a record that is not news to it)
NOT_NEWS = [
    *((held, kind_of(4, kind)) for held in Status for kind in Status),  # older incarnation
    (Status.ALIVE, kind_of(5, Status.ALIVE)),
    (Status.SUSPECT, kind_of(5, Status.ALIVE)),
    (Status.SUSPECT, kind_of(5, Status.SUSPECT)),  # the same accuser counts once
    (Status.SUSPECT, kind_of(5, Status.DEAD)),
    *((Status.DEAD, kind_of(5, kind)) for kind in (Status.ALIVE, Status.SUSPECT, Status.DEAD)),
    *((Status.LEFT, kind_of(5, kind)) for kind in Status),
]


@pytest.mark.parametrize(("held", "replayed"), NOT_NEWS)
def test_a_record_that_is_not_news_changes_nothing(held: Status, replayed: MemberRecord) -> None:
    r, _clock = receiver_holding(held)
    before = r.record("x")
    live_before = [m.node_id for m in r.live_members()]
    r.merge([replayed], relayer="c")
    assert r.record("x") == before
    assert [m.node_id for m in r.live_members()] == live_before
    assert r.drain_changes() == []
    # Nothing of it is passed on (what is, about x, is what r holds: a newer record, sent
    # again so that the old one dies out).
    assert [u for u in r.pending_updates() if u.node_id == "x"] in ([], [before])


def test_hearsay_of_a_death_makes_a_live_member_suspect_not_dead() -> None:
    clock = ManualClock()
    r = member("r", clock)
    x = member("x", clock, incarnation=5)
    x.merge([record_of("c", 1)])
    r.merge([record_of("c", 1), x.me])
    r.merge([accuse(x.me, "c", Status.DEAD)])
    held = r.record("x")
    assert held is not None
    assert held.status is Status.SUSPECT
    assert "x" in {m.node_id for m in r.live_members()}
    # r probes the suspect itself, and tells it (the buddy system); x refutes.
    [ping] = [o for o in r.tick() if o.address == "sim://x"]
    assert ping.message.kind is Kind.PING
    assert held in ping.message.updates
    x.receive(ping.message)
    assert x.incarnation == 6
    r.merge([x.me])
    assert r.record("x") == x.me


def test_an_accusation_needs_the_signature_of_an_accuser_we_know() -> None:
    clock = ManualClock()
    r = member("r", clock)
    x = record_of("x", 3)
    r.merge([record_of("c", 1), x])
    for bad in (
        replace(x, status=Status.DEAD),  # the member's own alive signature, no accuser
        replace(accuse(x, "c"), accuser_signature=b"forged"),
        replace(accuse(x, "m"), accuser="c"),  # signed by another than it names
        accuse(x, "x"),  # a member does not accuse itself
    ):
        r.merge([bad])
    assert r.forged == 4
    r.merge([accuse(x, "stranger")])
    assert r.refused["accuser unknown"] == 1
    assert r.record("x") == x


def test_nobody_can_make_a_member_refute_past_its_own_incarnation() -> None:
    clock = ManualClock()
    me = member("me", clock, incarnation=7)
    me.merge([record_of("c", 1)])
    me.merge([accuse(record_of("me", 10**18), "c")])
    assert me.incarnation == 7
    assert me.refused["about us, from our future"] == 1
    me.merge([accuse(me.me, "c")])  # at our incarnation: refuted
    assert me.incarnation == 8


def test_one_insider_re_sending_deaths_never_takes_a_live_member_out_of_any_view() -> None:
    n = 8
    sim = SwimSimulation(n, CFG, seed=11, signed=True)
    victim, insider = sim.members["sim://m0003"], sim.members["sim://m0007"]
    honest = [a for a in sim.members if a not in (victim.address, insider.address)]
    sim.run_until(5)
    out_of_view: list[tuple[float, str]] = []

    def check() -> None:
        for address in honest:
            if victim.node_id not in {r.node_id for r in sim.members[address].live_members()}:
                out_of_view.append((sim.clock.now(), address))

    for period in range(5, 125):
        # Every period, the victim's current record (every Status hands it out) turned into a
        # death: signed by the insider, in another member's name, and with no accuser at all.
        current = victim.me
        lies = (
            accuse(current, insider.node_id),
            replace(accuse(current, insider.node_id), accuser="m0001"),
            replace(current, status=Status.DEAD),
        )
        message = SwimMessage(Kind.PING, insider.node_id, insider.address, 0, updates=lies)
        for address in honest:
            sim.inject(address, message)
        sim.run_until(period + 1, check)
    assert out_of_view == []
    assert victim.incarnation > 5  # it was suspected, again and again, and refuted each time
    assert sum(sim.members[a].forged for a in honest) >= 2 * len(honest) * 100


# -- bounds ------------------------------------------------------------------------------------


def test_a_full_view_forgets_the_longest_dead_first_then_refuses_newcomers() -> None:
    clock = ManualClock()
    cfg = SwimConfig(max_members=3)
    r = member("r", clock, cfg=cfg)
    r.merge([record_of("a", 1), record_of("b", 1), record_of("c", 1)])
    r.merge([record_of("a", 1, Status.LEFT)])
    r.merge([record_of("d", 1)])  # room made: a, departed, goes
    assert {m.node_id for m in r.records()} == {"r", "b", "c", "d"}
    r.merge([record_of("e", 1)])  # nobody to forget: refused
    assert r.record("e") is None
    assert r.refused["view full"] == 1


def test_the_update_queue_is_bounded_and_drops_what_was_sent_most() -> None:
    clock = ManualClock()
    r = member("r", clock, cfg=SwimConfig(max_pending=4))
    r.merge([record_of(f"m{i}", 1) for i in range(4)])
    r.ping("sim://m0")  # one send each, for the four queued so far
    r.merge([record_of("m9", 1)])
    assert len(r.pending_updates()) == 4
    assert record_of("m9", 1) in r.pending_updates()
    assert r.refused["update queue full"] == 1


def test_a_message_carries_a_bounded_number_of_records() -> None:
    clock = ManualClock()
    r = member("r", clock, cfg=SwimConfig(max_piggyback=2, new_members_burst=100))
    many = tuple(record_of(f"m{i}", 1) for i in range(10))
    r.receive(SwimMessage(Kind.PING, "m0", "sim://m0", 1, updates=many))
    assert len(r.live_members()) == 1 + 4  # itself, the sender's own record and 2 + 1 more
    assert r.refused["records over a message's limit"] == 6


def test_one_relayer_introduces_new_members_at_a_bounded_rate() -> None:
    clock = ManualClock()
    r = member("r", clock, cfg=SwimConfig(new_members_per_s=2.0, new_members_burst=10))
    strangers = [record_of(f"m{i:03d}", 1) for i in range(100)]
    r.merge(strangers, relayer="relay-1")
    assert len(r.live_members()) == 1 + 10
    assert r.refused["new members over the relayer's rate"] == 90
    clock.advance_to(5.0)  # 10 more tokens
    r.merge(strangers, relayer="relay-1")
    assert len(r.live_members()) == 1 + 20
    r.merge(strangers, relayer="relay-2")  # another relayer has a bucket of its own
    assert len(r.live_members()) == 1 + 30
    r.merge(strangers)  # what this member asked for (its hello's answer) is not limited
    assert len(r.live_members()) == 1 + 100


def test_a_push_pull_carries_a_bounded_share_of_a_large_view_live_members_first() -> None:
    clock = ManualClock()
    r = member("r", clock, cfg=SwimConfig(max_push_pull=8))
    r.merge([record_of(f"m{i}", 1) for i in range(20)])
    r.merge([record_of(f"m{i}", 1, Status.LEFT) for i in range(15)])
    asked = SwimMessage(Kind.PUSH_PULL, "m0", "sim://m0", 1, updates=(record_of("m0", 1),))
    [reply] = r.receive(asked)
    assert reply.message.kind is Kind.PUSH_PULL_REPLY
    carried = reply.message.updates
    assert len(carried) == 8
    assert carried[0] == r.me
    assert {u.status for u in carried[1:6]} == {Status.ALIVE}  # the 5 live first
    assert {u.status for u in carried[6:]} == {Status.LEFT}


def test_a_member_cannot_name_itself_the_relay_of_another() -> None:
    """The relays are the member's own claim, signed with its address: a record that names a
    relay the member never chose (added to its record, or made up and signed by the would-be
    relay) is dropped, and the member stays reached as it chose."""
    clock = ManualClock()
    r = member("r", clock)
    x = member("x", ManualClock())
    x.set_relays(("sim://a",))
    r.merge([x.me])
    r.drain_changes()
    added = replace(x.me, relays=("sim://a", "sim://m"), incarnation=x.me.incarnation + 1)
    made_up = replace(added, signature=fake_signer("m")(added.claim()))
    for forged in (added, made_up):
        r.merge([forged])
        held = r.record("x")
        assert held is not None
        assert held.relays == ("sim://a",)
        assert held.incarnation == x.me.incarnation
    assert r.drain_changes() == []
