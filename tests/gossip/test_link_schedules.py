"""Time-varying schedules over a node's links (gossip/schedules.py ``LinkSchedule``, the Mixer's
link rounds): ``--topology one-peer-exponential`` and ``--topology epidemic``.

What the daemon and the simulator rely on: the one-peer classes are exactly the exponential
graph's links, a round goes to one class (or ``fanout`` drawn links) and passes over a class it
cannot serve, a swarm gossiping so agrees about its starting mean on a fraction of the deltas of
every link every round, and a heartbeat still reaches every link. A link plan's bridges carry one
round in P, with a codec of their own.
"""

from __future__ import annotations

import functools

import pytest
import torch

from gossip.clock import ManualClock
from gossip.codecs import AutoCodec, get_codec
from gossip.mixing import MixConfig, Mixer
from gossip.replicas import GossipState
from gossip.schedules import LinkPlan, LinkSchedule, ScheduleConfig, ring_classes
from gossip.topology import build, exponential
from gossip.trigger import TriggerConfig

DIM = 64


@pytest.mark.parametrize("n", [2, 3, 5, 8, 12, 16, 33])
def test_the_one_peer_classes_are_the_exponential_graphs_links(n: int) -> None:
    ids = [f"n{i:02d}" for i in range(n)]
    graph = exponential(ids)
    for i in ids:
        classes = ring_classes(ids, i)
        assert set(classes) == graph.neighbours(i)
        assert set(classes.values()) <= set(range(max(1, (n - 1).bit_length())))


def test_a_node_of_eight_has_the_classes_one_two_and_four_away() -> None:
    ids = [f"n{i}" for i in range(8)]
    assert ring_classes(ids, "n0") == {"n1": 0, "n7": 0, "n2": 1, "n6": 1, "n4": 2}
    assert ring_classes(ids, "n9") == {}  # not on the ring: no classes


def test_the_schedules_run_over_the_exponential_graph() -> None:
    ids = [f"n{i}" for i in range(10)]
    for kind in ("one-peer-exponential", "epidemic"):
        assert build(kind, ids).adj == exponential(ids).adj


def test_one_peer_rounds_cycle_through_the_classes_and_pass_over_those_not_ready() -> None:
    schedule = LinkSchedule(ScheduleConfig("one-peer-exponential"))
    schedule.set_classes({"a": 0, "b": 0, "c": 1, "d": 2})
    every = frozenset("abcd")
    picked = []
    for _ in range(6):
        chosen = schedule.pick(every)
        schedule.made(chosen)
        picked.append(chosen)
    assert picked == [frozenset("ab"), frozenset("c"), frozenset("d")] * 2
    # Class 1's link is busy: the round goes to class 2 and the cycle goes on from there.
    assert schedule.pick(frozenset("abd")) == frozenset("ab")
    schedule.made(frozenset("ab"))
    chosen = schedule.pick(frozenset("abd"))
    assert chosen == frozenset("d")
    schedule.made(chosen)
    assert schedule.pick(every) == frozenset("ab")
    assert schedule.pick(frozenset()) == frozenset()


def test_a_link_without_a_class_is_still_served_once_a_cycle() -> None:
    schedule = LinkSchedule(ScheduleConfig("one-peer-exponential"))
    schedule.set_classes({"a": 0, "b": 1, "c": 2})
    every = frozenset("abcx")
    served: list[str] = []
    for _ in range(3):
        chosen = schedule.pick(every)
        schedule.made(chosen)
        served.extend(chosen)
    assert sorted(served) == ["a", "b", "c", "x"]


def test_epidemic_draws_fanout_ready_links_afresh_each_round() -> None:
    schedule = LinkSchedule(ScheduleConfig("epidemic", fanout=2, seed=3))
    ready = frozenset("abcdef")
    draws = []
    for _ in range(40):
        chosen = schedule.pick(ready)
        assert len(chosen) == 2
        assert chosen <= ready
        assert schedule.pick(ready) == chosen  # the same round draws the same links
        schedule.made(chosen)
        draws.append(chosen)
    assert len(set(draws)) > 8
    assert set().union(*draws) == ready
    assert schedule.pick(frozenset("a")) == frozenset("a")


def test_a_schedule_needs_a_copy_per_link() -> None:
    state = GossipState(torch.zeros(DIM), get_codec("int8", 32), ManualClock(), session=1)
    with pytest.raises(ValueError, match="copy of the model per link"):
        Mixer(state, MixConfig(schedule=ScheduleConfig("epidemic")))


def _swarm(
    n: int, schedule: ScheduleConfig | None, trigger: TriggerConfig | None = None
) -> tuple[ManualClock, dict[str, torch.Tensor], dict[str, GossipState], dict[str, Mixer]]:
    clock = ManualClock()
    ids = [f"n{i:02d}" for i in range(n)]
    gen = torch.Generator().manual_seed(5)
    xs = {i: torch.randn(DIM, generator=gen) * 2 + k for k, i in enumerate(ids)}
    graph = exponential(ids)
    states = {
        i: GossipState(
            xs[i],
            get_codec("fp32", 32),
            clock,
            torch.Generator().manual_seed(k),
            session=1,
            per_link=True,
        )
        for k, i in enumerate(ids)
    }
    mixers = {
        i: Mixer(states[i], MixConfig(silence_limit_s=1e9, trigger=trigger, schedule=schedule))
        for i in ids
    }
    for i in ids:
        mixers[i].set_neighbours(graph.neighbours(i), LinkPlan(ring_classes(ids, i)))
    for i in ids:
        for j in graph.neighbours(i):
            seq, values = states[i].snapshot_for(j, xs[i])
            states[j].receive_snapshot(i, 1, seq, values, degree=graph.degree(i))
    return clock, xs, states, mixers


@functools.cache
def _gossip_until_agreed(n: int, schedule: ScheduleConfig | None) -> tuple[int, int, float]:
    """Rounds of every node in turn until the spread is 1e-4 of its start: (rounds, deltas
    sent, drift of the mean against the start's spread)."""
    clock, xs, states, mixers = _swarm(n, schedule)
    mean0 = torch.stack(list(xs.values())).mean(0)
    spread0 = float(torch.stack(list(xs.values())).std(0).mean())
    deltas = 0
    for r in range(1, 2001):
        made = {i: m.round(xs[i], ready=m.neighbours) for i, m in mixers.items()}
        for i, m in made.items():
            assert m is not None
            if schedule is not None:
                assert len(m.links) <= (2 if schedule.kind != "epidemic" else schedule.fanout)
            for j, (seq, payload) in m.links.items():
                states[j].receive_delta(i, 1, seq, payload, degree=2)
                deltas += 1
        clock.advance(0.1)
        spread = float(torch.stack(list(xs.values())).std(0).mean())
        if spread < 1e-4 * spread0:
            drift = float((torch.stack(list(xs.values())).mean(0) - mean0).abs().max())
            return r, deltas, drift / spread0
    raise AssertionError(f"no agreement in 2000 rounds: spread {spread / spread0:.2e}")


@pytest.mark.parametrize("n", [8, 12, 32])
def test_a_one_peer_swarm_agrees_about_its_exact_mean(n: int) -> None:
    """Each round goes to one offset class, both ways round the ring, so the two ends of a
    link mix it in the same rounds: the swarm agrees to 1e-4 of its starting spread with the
    mean kept exactly (lock-step here), two deltas a node a round."""
    _, _, drift = _gossip_until_agreed(n, ScheduleConfig("one-peer-exponential"))
    assert drift < 1e-5


@pytest.mark.parametrize("n", [8, 12, 32])
def test_an_epidemic_swarm_agrees_near_its_mean(n: int) -> None:
    """Each node draws its own links, so the two ends of a link mix it at different rounds
    and the mean moves, as in Epidemic Learning, whose mixing is only row-stochastic: here by
    under a third of the starting spread (measured 0.03-0.08)."""
    _, _, drift = _gossip_until_agreed(n, ScheduleConfig("epidemic", fanout=2))
    assert drift < 0.3


@pytest.mark.parametrize("kind", ["one-peer-exponential", "epidemic"])
def test_at_64_nodes_a_schedule_agrees_on_under_half_the_deltas_of_every_link(
    kind: str,
) -> None:
    """Measured 4,864 (one-peer, 41 rounds) and 6,016 (epidemic with two links, 47 rounds)
    deltas to agree, against 12,672 in 18 rounds for a delta on every link every round. Before
    a schedule's round also mixed the copies that arrived on its other links, it needed
    12,928 and 12,672: the copies it mixed were a cycle of classes old."""
    _, deltas, _ = _gossip_until_agreed(64, ScheduleConfig(kind, fanout=2))
    _, every_deltas, _ = _gossip_until_agreed(64, None)
    assert deltas < 0.6 * every_deltas, (deltas, every_deltas)


def test_a_heartbeat_goes_to_every_link() -> None:
    """Once nothing moves, the trigger makes only heartbeats: those go to every link, so a
    link of a class that rarely comes round still hears from the node within the heartbeat."""
    trigger = TriggerConfig(threshold=0.5, heartbeat_s=1.0)
    clock, xs, states, mixers = _swarm(8, ScheduleConfig("one-peer-exponential"), trigger)
    for i, m in mixers.items():
        xs[i].zero_()
        for j in m.neighbours:
            seq, values = states[i].snapshot_for(j, xs[i])
            states[j].receive_snapshot(i, 1, seq, values, degree=5)
    first = mixers["n00"].round(xs["n00"], ready=mixers["n00"].neighbours)
    assert first is not None
    assert first.reason == "first"
    assert len(first.links) <= 2
    assert mixers["n00"].round(xs["n00"], ready=mixers["n00"].neighbours) is None
    clock.advance(1.5)
    beat = mixers["n00"].round(xs["n00"], ready=mixers["n00"].neighbours)
    assert beat is not None
    assert beat.reason == "heartbeat"
    assert set(beat.links) == mixers["n00"].neighbours
    assert sum(beat.weights.values()) < 1


def test_a_bridge_carries_one_round_in_p_with_a_codec_of_its_own() -> None:
    """A link in the plan's periods carries a delta in one of every P rounds, and one in its
    codecs sends with that codec; the other links carry every round in the node's own, and
    every replica stays bit-identical to the copy its link keeps."""
    clock = ManualClock()
    auto = AutoCodec(32, initial="int8")
    x = torch.randn(DIM, generator=torch.Generator().manual_seed(2))
    me = GossipState(x, auto, clock, torch.Generator().manual_seed(1), session=1, per_link=True)
    peers = {p: GossipState(torch.zeros(DIM), auto, clock, session=2) for p in ("a", "b", "c")}
    mixer = Mixer(me, MixConfig(silence_limit_s=1e9))
    mixer.set_neighbours(frozenset(peers), LinkPlan(periods={"c": 3}, codecs={"c": "sign"}))
    for p, state in peers.items():
        state.set_peers(frozenset({"me"}))
        seq, values = me.snapshot_for(p, x)
        state.receive_snapshot("me", 1, seq, values, degree=3)
    sent: dict[str, list[str]] = {p: [] for p in peers}
    for _ in range(12):
        x.add_(torch.randn(DIM, generator=torch.Generator().manual_seed(len(sent["a"]))))
        made = mixer.round(x, ready=frozenset(peers))
        assert made is not None
        for p, (seq, payload) in made.links.items():
            peers[p].receive_delta("me", 1, seq, payload, degree=3)
            sent[p].append(payload.codec)
    assert sent["a"] == sent["b"] == ["int8"] * 12
    assert sent["c"] == ["sign"] * 4
    for p, state in peers.items():
        assert torch.equal(state.replicas["me"].value, me.copies[p].value)


def test_a_schedule_mixes_each_copy_that_arrived_at_its_next_round_whatever_the_class() -> None:
    """A copy that arrived on a link the next round does not go to is pulled toward at that
    round, not at its link's next turn (a cycle of classes later, when it is older): every
    neighbour that sent is in the next round's weights, once."""
    _, xs, states, mixers = _swarm(8, ScheduleConfig("one-peer-exponential"))
    me, mixer = states["n00"], mixers["n00"]
    first = mixer.round(xs["n00"], ready=mixer.neighbours)
    assert first is not None
    senders = mixer.neighbours - set(first.links)
    for p in sorted(senders):
        made = states[p].make_link_delta("n00", xs[p] + 1.0)
        assert made is not None
        me.receive_delta(p, 1, made[0], made[1], degree=5)
    second = mixer.round(xs["n00"], ready=mixer.neighbours)
    assert second is not None
    assert senders - set(second.links)  # some sent on a link this round did not go to
    assert set(second.weights) == senders
    third = mixer.round(xs["n00"], ready=mixer.neighbours)
    assert third is not None
    assert third.weights == {}


def test_a_round_that_mixes_more_copies_than_its_links_stays_a_convex_step() -> None:
    """An epidemic node drawn by every neighbour at once mixes five copies at the schedule's
    weight of 1/3 each; at γ = 1 their pulls are scaled to sum to one, so a node whose
    neighbours all hold r lands on r, not past it (unscaled, x + 5/3 (r - x))."""
    _, xs, states, mixers = _swarm(8, ScheduleConfig("epidemic", fanout=2))
    me, mixer = states["n00"], mixers["n00"]
    r = torch.full((DIM,), 3.0)
    for k, p in enumerate(sorted(mixer.neighbours)):
        me.receive_snapshot(p, 1, 1000 + k, r.clone(), degree=5)
    made = mixer.round(xs["n00"], ready=mixer.neighbours)
    assert made is not None
    assert len(made.links) == 2
    assert set(made.weights) == mixer.neighbours
    torch.testing.assert_close(xs["n00"], r)
