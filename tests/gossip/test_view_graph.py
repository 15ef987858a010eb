"""The graph one member's view makes: its own neighbours as the whole graph has them, and a
pause that moves only the edges at the paused member."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gossip.topology import TOPOLOGIES, build
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
