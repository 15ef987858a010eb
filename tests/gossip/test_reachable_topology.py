"""Edges that can exist when some members cannot be dialled (gossip/topology.py's
reachable_graph, and the member view that applies it)."""

from __future__ import annotations

import itertools
import random

import pytest

from gossip.clock import ManualClock
from gossip.membership import MemberView
from gossip.swim import MemberRecord, Swim, SwimConfig
from gossip.topology import TOPOLOGIES, build, reachable_graph


@pytest.mark.parametrize("kind", TOPOLOGIES)
@pytest.mark.parametrize(("n", "nated"), [(6, 4), (8, 2), (16, 12), (33, 30), (5, 1)])
def test_no_edge_joins_two_unreachable_nodes_and_the_graph_stays_connected(
    kind: str, n: int, nated: int
) -> None:
    ids = [f"{k:02x}" * 4 for k in range(n)]
    unreachable = frozenset(random.Random(n).sample(ids, nated))
    graph = reachable_graph(build(kind, ids, degree=4), unreachable)
    assert graph.is_symmetric()
    assert graph.is_connected()
    for u in unreachable:
        assert not graph.neighbours(u) & unreachable
        assert len(graph.neighbours(u)) >= min(2, n - nated)
    # Edges between reachable nodes of the plain graph all stay.
    plain = build(kind, ids, degree=4)
    for a, b in itertools.combinations(sorted(set(ids) - unreachable), 2):
        if b in plain.neighbours(a):
            assert b in graph.neighbours(a)


def test_with_everyone_reachable_the_graph_is_the_plain_one() -> None:
    ids = [str(k) for k in range(10)]
    assert reachable_graph(build("exponential", ids), frozenset()) == build("exponential", ids)


def test_two_views_that_agree_agree_on_every_edge_and_the_record_decides() -> None:
    """The view reads reachability from the members' own (signed) records."""
    clock = ManualClock()
    cfg = SwimConfig()
    swims = [Swim(f"n{k}", f"10.0.0.{k}:7070", 1, cfg, clock) for k in range(6)]
    records = [
        MemberRecord(s.node_id, s.address, 1, relays=("10.0.0.0:7070",) if k >= 2 else ())
        for k, s in enumerate(swims)
    ]
    for k, s in enumerate(swims):
        if k >= 2:
            assert s.set_relays(("10.0.0.0:7070",))
        s.merge([r for r in records if r.node_id != s.node_id])
    views = [MemberView(s) for s in swims]
    unreachable = {f"n{k}" for k in range(2, 6)}
    assert all(v.unreachable == unreachable for v in views)
    for v in views:
        me = v.swim.node_id
        mine = set(v.neighbours("exponential"))
        if me in unreachable:
            assert mine <= {"n0", "n1"}
            assert mine
        for j in mine:  # the other end counts us too
            assert me in views[int(j[1:])].neighbours("exponential")


def test_relays_are_part_of_the_signed_claim() -> None:
    plain = MemberRecord("a", "h:1", 3)
    assert plain.claim() == b"murmur-member|a|h:1|3|alive"  # what reachable members signed
    via = MemberRecord("a", "h:1", 3, relays=("r:1", "r:2"))
    assert via.claim() != plain.claim()
    assert not via.reachable
    assert plain.reachable
