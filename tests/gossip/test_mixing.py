"""The round's decisions shared by the daemon and the simulator."""

from __future__ import annotations

import torch

from gossip.choco import mix_and_send, mixing_weights
from gossip.clock import ManualClock
from gossip.codecs import get_codec
from gossip.membership import relink
from gossip.messages import Member
from gossip.pacing import RoundPacer
from gossip.replicas import GossipState


def state(clock: ManualClock, value: float = 0.0) -> GossipState:
    return GossipState(torch.full((8,), value), get_codec("fp32", 8), clock)


def test_weights_use_the_larger_degree_and_leave_out_silent_and_unsynced_neighbours() -> None:
    clock = ManualClock()
    s = state(clock)
    s.set_peers(frozenset({"a", "b", "c"}))
    s.receive_snapshot("a", 1, 0, torch.ones(8), degree=4)
    s.receive_snapshot("b", 1, 0, torch.ones(8), degree=1)
    clock.advance(10.0)
    s.receive_snapshot("a", 1, 1, torch.ones(8), degree=4)  # a spoke again; b did not
    assert mixing_weights(s, ["a", "b", "c"], degree=2, silence_limit_s=5.0) == {"a": 1 / 5}
    assert mixing_weights(s, ["a", "b", "c"], degree=2, silence_limit_s=20.0) == {
        "a": 1 / 5,
        "b": 1 / 3,
    }


def test_a_round_pulls_toward_the_replicas_then_sends_the_change() -> None:
    clock = ManualClock()
    s = state(clock, 0.5)  # x̂ = 0.5: what the neighbour holds of us
    s.set_peers(frozenset({"a"}))
    s.receive_snapshot("a", 1, 0, torch.full((8,), 3.0), degree=1)
    x = torch.full((8,), 1.0)  # a local step since
    seq, payload = mix_and_send(s, x, gamma=1.0, neighbours=["a"], silence_limit_s=5.0)
    # x += 1 * (1/2) * (3 - 0.5): the copies as both ends hold them, not the unsent step
    assert torch.equal(x, torch.full((8,), 2.25))
    assert seq == 1
    assert torch.equal(s.public, x)  # fp32: x̂ caught up with the mixed x exactly
    assert payload.numel == 8


def test_set_peers_forgets_the_replicas_of_those_that_go() -> None:
    s = state(ManualClock())
    s.set_peers(frozenset({"a", "b"}))
    s.receive_snapshot("a", 1, 0, torch.ones(8))
    assert s.set_peers(frozenset({"b", "c"})) == frozenset({"a"})
    assert s.peers == frozenset({"b", "c"})
    assert "a" not in s.replicas


def test_a_peer_taken_back_gets_its_replica_back_as_it_was() -> None:
    # The sender never learned that our view dropped it, so it sends no snapshot (issue 13).
    s = state(ManualClock())
    s.set_peers(frozenset({"a", "b"}))
    s.receive_snapshot("a", 1, 3, torch.ones(8))
    s.set_peers(frozenset({"b"}))
    assert "a" not in s.replicas
    s.set_peers(frozenset({"a", "b"}))
    assert s.replicas["a"].seq == 3
    assert torch.equal(s.replicas["a"].value, torch.ones(8))
    s.receive_snapshot("b", 1, 1, torch.zeros(8))
    s.set_peers(frozenset({"a"}))  # b parked
    s.set_peers(frozenset({"c"}))  # a parked too: at most as many as there are peers, the newest
    s.set_peers(frozenset({"a", "b", "c"}))
    assert sorted(s.replicas) == ["a"]
    # At most MAX_PARKED, however many peers there are: each costs a model's size.
    many = frozenset("defgh")
    s.set_peers(many)
    for peer in sorted(many):
        s.receive_snapshot(peer, 1, 1, torch.zeros(8))
    s.set_peers(frozenset("xyzuvw"))  # all five dropped at once; only the last two kept
    s.set_peers(many)
    assert sorted(s.replicas) == ["g", "h"]


def test_a_copy_taken_back_stays_out_of_the_mix_until_its_sender_goes_on_from_it() -> None:
    # The sender's view dropped us too, so its copy moved on with its other links' rounds and
    # ours is old: mixed at once, it pulled a settled swarm's models apart when members left.
    s = state(ManualClock())
    s.set_peers(frozenset({"a", "b"}))
    s.receive_snapshot("a", 1, 3, torch.ones(8), degree=1)
    s.receive_snapshot("b", 1, 1, torch.ones(8), degree=1)
    s.set_peers(frozenset({"b"}))
    s.set_peers(frozenset({"a", "b"}))
    assert "a" in s.replicas  # held: it counts for the start-up gate
    assert mixing_weights(s, ["a", "b"], degree=2, silence_limit_s=5.0) == {"b": 1 / 3}
    delta = get_codec("fp32", 8).encode(torch.full((8,), 0.5))
    s.receive_delta("a", 1, 4, delta)  # the sender's stream goes on from the copy: it is current
    assert mixing_weights(s, ["a", "b"], degree=2, silence_limit_s=5.0) == {
        "a": 1 / 3,
        "b": 1 / 3,
    }
    s.set_peers(frozenset({"b"}))
    s.set_peers(frozenset({"a", "b"}))
    s.receive_snapshot("a", 1, 9, torch.zeros(8), degree=1)  # or replaces it
    assert set(mixing_weights(s, ["a", "b"], degree=2, silence_limit_s=5.0)) == {"a", "b"}


def test_the_pacer_waits_for_local_steps_and_idle_links() -> None:
    pacer = RoundPacer(local_steps=3)
    assert not pacer.due(2)
    assert pacer.due(3)
    pacer.links_idle = False
    assert not pacer.begin(3)
    pacer.links_idle = True
    assert pacer.begin(3)
    assert not pacer.begin(3)  # one round at a time
    pacer.end()
    assert not pacer.due(5)
    assert pacer.due(6)
    assert not pacer.held(1_000)  # no bound: never held


def test_a_bounded_pacer_holds_from_the_bound_until_a_round_begins() -> None:
    pacer = RoundPacer(local_steps=2, max_local_steps=5)
    assert pacer.begin(2)
    pacer.end()
    assert not pacer.held(6)
    assert pacer.held(7)  # five steps since the round began at step 2
    pacer.links_idle = False
    assert not pacer.begin(7)
    assert pacer.held(7)  # a refused round does not count
    pacer.links_idle = True
    assert pacer.begin(7)
    assert not pacer.held(7)


def test_relink_closes_gone_and_moved_neighbours_and_opens_new_ones() -> None:
    linked = {"a": Member("a", "h:1"), "b": Member("b", "h:2"), "c": Member("c", "h:3")}
    wanted = {"b": Member("b", "h:2"), "c": Member("c", "h:9"), "d": Member("d", "h:4")}
    assert relink(linked, wanted) == (["a", "c"], ["c", "d"])
