"""The graph one member's view makes: its own neighbours as the whole graph has them, and a
pause that moves only the edges at the paused member."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gossip.cycles import expander_cycles
from gossip.topology import TOPOLOGIES, build, expander
from gossip.view_graph import live_graph, neighbours_of


def ids(n: int) -> list[str]:
    return [f"node-{i:04d}" for i in range(n)]


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from(TOPOLOGIES),
    members=st.sets(st.text("abcdef0123", min_size=1, max_size=6), min_size=1, max_size=70),
    pick=st.integers(min_value=0),
    held=st.sets(st.integers(min_value=0, max_value=69), max_size=40),
)
def test_a_nodes_own_neighbours_are_its_neighbours_in_the_whole_graph(
    kind: str, members: set[str], pick: int, held: set[int]
) -> None:
    order = sorted(members)
    me = order[pick % len(order)]
    paused = {order[i] for i in held if i < len(order)} - {me}
    regions = {m: "r" + m[0] for m in members}
    graph = live_graph(kind, members, paused, degree=3, seed=1, regions=regions)
    assert graph.is_symmetric()
    assert graph.is_connected()
    assert set(graph.nodes) == members - paused
    mine = neighbours_of(kind, members, me, paused, degree=3, seed=1, regions=regions)
    assert mine == graph.neighbours(me)


@pytest.mark.parametrize("kind", ["ring", "exponential"])
def test_a_pause_moves_only_the_edges_at_the_paused_member(kind: str) -> None:
    members = ids(1024)
    rng = random.Random(7)
    paused = set(rng.sample(members, 300))

    def edges(held: set[str]) -> set[frozenset[str]]:
        g = live_graph(kind, members, held)
        return {frozenset((i, j)) for i in g.nodes for j in g.neighbours(i)}

    before = edges(paused)
    one = rng.choice(sorted(set(members) - paused))
    after = edges(paused | {one})
    at_it = {e for e in before if one in e}
    assert before - after == at_it  # its own edges go, no one else's
    assert len(after - before) <= 1  # and one edge closes its gap on the ring
    # Built over those not paused, the same pause would have moved edges all over the ring.
    shifted = build(kind, set(members) - paused), build(kind, set(members) - paused - {one})
    moved = {frozenset((i, j)) for i in shifted[0].nodes for j in shifted[0].neighbours(i)}
    moved ^= {frozenset((i, j)) for i in shifted[1].nodes for j in shifted[1].neighbours(i)}
    if kind == "exponential":
        assert len(moved) > 10 * (len(at_it) + 1)
    else:  # on a plain ring the two are the same: two edges go, one closes the gap
        assert len(moved) == 3


def test_a_node_outside_the_ids_or_paused_has_no_neighbours_to_ask_for() -> None:
    with pytest.raises(KeyError):
        neighbours_of("exponential", ids(8), "node-9999")
    with pytest.raises(KeyError):
        neighbours_of("exponential", ids(8), "node-0003", {"node-0003"})


def test_a_pause_on_the_expander_moves_only_the_edges_at_the_paused_member() -> None:
    members = ids(1024)
    rng = random.Random(7)
    paused = set(rng.sample(members, 300))

    def edges(held: set[str]) -> set[frozenset[str]]:
        g = live_graph("auto", members, held)
        return {frozenset((i, j)) for i in g.nodes for j in g.neighbours(i)}

    before = edges(paused)
    one = rng.choice(sorted(set(members) - paused))
    after = edges(paused | {one})
    at_it = {e for e in before if one in e}
    assert len(at_it) >= math.floor(expander_cycles(1024))  # some of its ~18 are to the paused
    assert before - after == at_it  # its own edges go, no one else's
    assert len(after - before) <= 1  # and the first cycle closes its gap
    # Rebuilt over the members not paused, each cycle would link the paused member's two
    # neighbours in it.
    rebuilt = [build("expander", set(members) - held) for held in (paused, paused | {one})]
    moved = [{frozenset((i, j)) for i in g.nodes for j in g.neighbours(i)} for g in rebuilt]
    assert len((moved[1] - moved[0]) - after) >= math.floor(expander_cycles(1024)) - 2


def test_auto_chooses_its_graph_by_the_live_members_paused_or_not() -> None:
    # Over 64 live members, 10 of them paused: still the expander, the paused in their places,
    # so that pauses never switch the swarm between the two graphs (each switch moves every
    # edge); up to 64, the exponential graph with the paused in their places.
    members = ids(70)
    paused = set(members[::7])
    graph = live_graph("auto", members, paused, seed=2)
    assert graph == expander(members, seed=2, paused=paused)
    assert graph != live_graph("exponential", members, paused)
    assert live_graph("auto", members[:64], paused, seed=2) == live_graph(
        "exponential", members[:64], paused
    )


def test_a_nodes_own_neighbours_on_a_large_expander_are_its_neighbours_in_the_whole_graph() -> None:
    members = ids(700)
    paused = set(random.Random(3).sample(members, 200))
    graph = live_graph("auto", members, paused, seed=4)
    for me in sorted(set(members) - paused)[::25]:
        assert neighbours_of("auto", members, me, paused, seed=4) == graph.neighbours(me)
    with pytest.raises(KeyError):
        neighbours_of("auto", members, sorted(paused)[0], paused)
