"""Graphs over node ids: symmetric, connected, agreed by everyone; weights and spectral gaps."""

from __future__ import annotations

import math
import random

import pytest
import torch

from gossip.cycles import expander_cycles
from gossip.topology import (
    AUTO_EXPONENTIAL_UP_TO,
    TOPOLOGIES,
    Graph,
    block_region,
    build,
    crosses,
    expander,
    exponential,
    metropolis_hastings,
    mixing_matrix,
    random_regular,
    regional,
    ring,
    spectral_gap,
)


def ids(n: int) -> list[str]:
    return [f"node-{i:04d}" for i in range(n)]


@pytest.mark.parametrize("kind", TOPOLOGIES)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 16, 33, 100])
def test_graphs_are_symmetric_simple_and_connected(kind: str, n: int) -> None:
    g = build(kind, ids(n), degree=4)
    assert g.is_symmetric()
    assert g.is_connected()
    assert all(i not in g.neighbours(i) for i in g.nodes)


@pytest.mark.parametrize("kind", TOPOLOGIES)
def test_every_node_derives_the_same_graph_whatever_order_it_learned_ids_in(kind: str) -> None:
    names = ids(20)
    shuffled = names[:]
    random.Random(3).shuffle(shuffled)
    assert build(kind, names, seed=7).adj == build(kind, shuffled, seed=7).adj


def test_ring_links_ring_neighbours() -> None:
    g = ring(["c", "a", "d", "b"])
    assert g.nodes == ("a", "b", "c", "d")
    assert g.neighbours("a") == {"b", "d"}
    assert all(g.degree(i) == 2 for i in g.nodes)


def test_exponential_links_powers_of_two_both_ways() -> None:
    g = exponential(ids(16))
    first = g.nodes[0]
    expected = {g.nodes[k] for k in (1, 2, 4, 8, 12, 14, 15)}
    assert g.neighbours(first) == expected
    assert all(g.degree(i) == 7 for i in g.nodes)  # 2 log2(16) - 1: +8 and -8 coincide


def test_random_regular_is_regular_and_seeded() -> None:
    g = random_regular(ids(30), 3, seed=1)  # odd: a pairing, exactly regular
    assert all(g.degree(i) == 3 for i in g.nodes)
    assert random_regular(ids(30), 3, seed=1).adj == g.adj
    assert random_regular(ids(30), 3, seed=2).adj != g.adj


def test_a_sparse_even_degree_is_random_cycles_nearly_regular_and_seeded() -> None:
    for seed in range(3):
        g = random_regular(ids(256), 4, seed=seed)
        assert g.is_symmetric()
        assert g.is_connected()
        degrees = [g.degree(i) for i in g.nodes]
        assert max(degrees) == 4
        assert min(degrees) >= 2
        assert sum(d < 4 for d in degrees) <= 16  # two cycles rarely share a pair at k² ≤ n
    assert random_regular(ids(256), 4, seed=1).adj == random_regular(ids(256), 4, seed=1).adj
    assert random_regular(ids(256), 4, seed=1).adj != random_regular(ids(256), 4, seed=2).adj


@pytest.mark.parametrize("k", [2, 4, 8])
def test_a_member_that_comes_or_goes_changes_few_edges_of_a_sparse_even_degree(k: int) -> None:
    # Every member derives the graph from its view: a pairing drawn afresh kept 27 of 512
    # edges when one member joined 256 (k = 4), and every node had to sync new neighbours.
    members = ids(257)
    before, after = random_regular(members[:256], k), random_regular(members, k)
    changed = [i for i in before.nodes if before.adj[i] != after.adj[i]]
    assert len(changed) <= k  # on each of the k/2 cycles, the joiner's two neighbours
    assert after.degree(members[256]) >= k - 1
    gone = random_regular(members[1:256], k)  # and one that leaves
    assert sum(before.adj[i] != gone.adj[i] for i in gone.nodes) <= k


def edges(graph: Graph) -> set[frozenset[str]]:
    return {frozenset((i, j)) for i in graph.nodes for j in graph.neighbours(i)}


def test_auto_is_the_exponential_graph_up_to_its_bound_and_the_expander_above() -> None:
    n = AUTO_EXPONENTIAL_UP_TO
    assert build("auto", ids(n), seed=3) == exponential(ids(n))
    assert build("auto", ids(n + 1), seed=3) == expander(ids(n + 1), seed=3)
    assert build("auto", ids(n + 1), seed=3) != exponential(ids(n + 1))


@pytest.mark.parametrize("n", [65, 100, 256, 1024])
def test_the_expander_has_about_the_exponential_graphs_degree(n: int) -> None:
    g, exp = expander(ids(n)), exponential(ids(n))
    degrees = [g.degree(i) for i in g.nodes]
    cycles = expander_cycles(n)
    assert max(degrees) <= 2 * math.ceil(cycles) <= exp.degree(ids(n)[0])
    assert sum(degrees) / n > 0.9 * 2 * cycles  # few pairs shared by two cycles
    assert min(degrees) >= 2 * math.floor(cycles) - 4  # a node on two shared pairs


def test_the_expander_mixes_faster_than_the_exponential_graph_from_about_64_nodes() -> None:
    for n in (64, 100, 256):
        faster = spectral_gap(mixing_matrix(expander(ids(n))))
        assert faster > 1.1 * spectral_gap(mixing_matrix(exponential(ids(n))))
    # ... and slower below that: auto keeps the exponential graph there.
    assert spectral_gap(mixing_matrix(expander(ids(17)))) < spectral_gap(
        mixing_matrix(exponential(ids(17)))
    )


@pytest.mark.parametrize("n", [200, 256, 1024])
def test_a_member_that_comes_or_goes_moves_few_edges_of_the_expander(n: int) -> None:
    members = ids(n + 1)
    before = edges(expander(members[:n]))
    bound = 3 * (math.ceil(expander_cycles(n + 1)) + 3)
    # One edge of each cycle gives way to two at the joiner (and two at a leaver to one), and
    # the last cycle, whose share grows with n, takes in a node or two (256 + 1 nodes: a whole
    # cycle more, were the number of cycles whole).
    assert len(before ^ edges(expander(members))) <= bound
    assert len(before ^ edges(expander(members[1:n]))) <= bound
    # The exponential graph shifts everyone's place on the ring: hundreds of edges move.
    assert len(edges(exponential(members[:n])) ^ edges(exponential(members))) > 10 * bound


def test_random_regular_refuses_impossible_degrees() -> None:
    with pytest.raises(ValueError, match="no 3-regular graph on 5 nodes"):
        random_regular(ids(5), 3)
    with pytest.raises(ValueError, match="no 5-regular"):
        random_regular(ids(5), 5)


@pytest.mark.parametrize(("n", "k"), [(8, 7), (20, 7), (30, 9), (64, 12), (200, 16), (41, 30)])
def test_random_regular_draws_high_degrees(n: int, k: int) -> None:
    # The configuration model all but never drew k >= 7 (it tried 10,000 times for seconds).
    for seed in range(3):
        g = random_regular(ids(n), k, seed=seed)
        assert all(g.degree(i) == k for i in g.nodes)
        assert g.is_symmetric()
        assert g.is_connected()
        assert all(i not in g.neighbours(i) for i in g.nodes)
    assert random_regular(ids(n), k, seed=5).adj == random_regular(ids(n), k, seed=5).adj


def test_random_regular_draws_differ_by_seed_at_every_density() -> None:
    for k in (2, 3, 8, 15):  # a cycle, sparse pairings, and the complement of one
        graphs = {tuple(sorted(random_regular(ids(20), k, seed=s).adj.items())) for s in range(4)}
        assert len(graphs) > 1, k


def test_random_regular_refuses_degrees_with_no_connected_graph() -> None:
    with pytest.raises(ValueError, match="no connected 1-regular graph on 4 nodes"):
        random_regular(ids(4), 1)
    with pytest.raises(ValueError, match="no connected 0-regular graph on 2 nodes"):
        random_regular(ids(2), 0)
    # build() raises such a degree to a (random) ring instead.
    g = build("random-regular", ids(6), degree=1)
    assert g.is_connected()
    assert all(g.degree(i) == 2 for i in g.nodes)


def test_unknown_topology() -> None:
    with pytest.raises(ValueError, match="unknown topology 'star'"):
        build("star", ids(4))


@pytest.mark.parametrize("kind", TOPOLOGIES)
def test_metropolis_hastings_is_symmetric_doubly_stochastic_and_nonnegative(kind: str) -> None:
    g = build(kind, ids(13), degree=4)
    w = mixing_matrix(g)
    assert torch.allclose(w, w.T)
    assert torch.allclose(w.sum(dim=0), torch.ones(13, dtype=torch.float64))
    assert bool((w >= 0).all())
    weights = metropolis_hastings(g)
    for i in g.nodes:
        for j, wij in weights[i].items():
            assert wij == 1 / (1 + max(g.degree(i), g.degree(j)))


def test_ring_spectral_gap_matches_the_closed_form() -> None:
    # W = (1/3)(I + shift + shift^-1): eigenvalues 1/3 + (2/3) cos(2πk/n).
    n = 16
    expected = 1 - (1 / 3 + 2 / 3 * math.cos(2 * math.pi / n))
    assert spectral_gap(mixing_matrix(ring(ids(n)))) == pytest.approx(expected, rel=1e-9)


def test_disconnected_graph_has_no_gap() -> None:
    w = torch.eye(4, dtype=torch.float64)
    assert spectral_gap(w) == pytest.approx(0.0)


def test_exponential_gap_stays_large_as_the_ring_gap_vanishes() -> None:
    gaps = {
        n: (
            spectral_gap(mixing_matrix(ring(ids(n)))),
            spectral_gap(mixing_matrix(exponential(ids(n)))),
        )
        for n in (16, 64, 256)
    }
    # Ring: gap ~ 1/n^2. Exponential: bounded away from zero (it shrinks like 1/log n).
    assert gaps[256][0] < gaps[16][0] / 100
    assert gaps[256][1] > gaps[16][1] / 4
    assert all(exp_gap > 5 * ring_gap for ring_gap, exp_gap in gaps.values())


def test_regional_is_built_from_the_regions_it_is_given() -> None:
    nodes = ids(12)
    region_of = {i: block_region(k, 12, 3) for k, i in enumerate(nodes)}
    assert sorted(set(region_of.values())) == ["r0", "r1", "r2"]
    g = build("regional", nodes, degree=2, regions=region_of)
    assert g == regional(region_of, bridges=2)
    across = {frozenset((i, j)) for i in nodes for j in g.neighbours(i) if crosses(region_of, i, j)}
    assert len(across) == 3 * 2  # 2 bridges for each of the 3 pairs of regions
    # One region, or none named: the exponential graph; a member without one is in "".
    assert build("regional", nodes) == exponential(nodes)
    assert build("regional", nodes, regions=dict.fromkeys(nodes, "r0")) == exponential(nodes)
    partial = build("regional", nodes, degree=1, regions={nodes[0]: "far"})
    assert len(partial.neighbours(nodes[0])) == 1


def test_block_region_splits_by_index_and_joiners_go_round_robin() -> None:
    assert [block_region(i, 6, 2) for i in range(6)] == ["r0"] * 3 + ["r1"] * 3
    assert [block_region(i, 6, 2) for i in range(6, 9)] == ["r0", "r1", "r0"]
    with pytest.raises(ValueError, match="regions"):
        block_region(0, 6, 0)
