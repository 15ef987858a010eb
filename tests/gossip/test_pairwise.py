"""CHOCO with a copy per link (gossip/pairwise.py) and the regional graph (gossip/topology.py):
with every link active it is CHOCO itself; links with their own codecs and periods keep the
mean, keep replicas bit-identical across a codec change, and still reach consensus."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gossip.codecs import CODECS, get_codec
from gossip.pairwise import Edge, PairwiseGossip, PairwiseSwarm
from gossip.simulate import SyncSwarm
from gossip.topology import crosses, exponential, regional, ring

DIM = 256


def start(n: int, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {f"n{i:03d}": torch.randn(DIM, generator=gen) + 1.0 for i in range(n)}


def test_with_every_link_every_round_it_is_choco_to_the_byte() -> None:
    init = start(16)
    graph = exponential(init)
    pairwise = PairwiseSwarm(graph, init, lambda _: get_codec("fp32"), 1.0)
    classic = SyncSwarm(graph, init, get_codec("fp32"), 1.0)
    for _ in range(10):
        pairwise.round()
        classic.round()
    # fp32 sends exactly, so every copy is its owner's model and the two mixes agree
    for i in graph.nodes:
        assert torch.allclose(pairwise.x[i], classic.x[i], atol=1e-5)
    int8 = PairwiseSwarm(graph, init, lambda _: get_codec("int8"), 0.8)
    int8_classic = SyncSwarm(graph, init, get_codec("int8"), 0.8)
    for _ in range(5):
        int8.round()
        int8_classic.round()
    assert int8.bytes_sent == int8_classic.bytes_sent  # one delta per link per round


@pytest.mark.parametrize("codec", ["int8", "sign", "topk"])
def test_slow_links_with_their_own_codec_keep_the_mean_and_reach_consensus(codec: str) -> None:
    dim, rounds, period = 64, 400, 4
    gen = torch.Generator().manual_seed(1)
    init = {f"n{i:03d}": torch.randn(dim, generator=gen) + 1.0 for i in range(12)}
    region_of = {i: f"r{k // 4}" for k, i in enumerate(sorted(init))}
    graph = regional(region_of)

    def slow(e: Edge) -> bool:
        return crosses(region_of, *e)

    gamma = {"int8": 0.8, "sign": 0.3, "topk": 0.2}[codec]
    swarm = PairwiseSwarm(
        graph,
        init,
        lambda e: get_codec(codec, fraction=0.1) if slow(e) else get_codec("int8"),
        0.8,
        lambda e: period if slow(e) else 1,
        gamma_of=lambda e: gamma if slow(e) else 0.8,
    )
    mean0, first = swarm.mean(), swarm.consensus_distance()
    for _ in range(rounds):
        swarm.round()
    assert float((swarm.mean() - mean0).abs().max()) < 1e-4
    assert swarm.consensus_distance() < first * 1e-4
    # the slow links sent every fourth round, and nothing in between
    cross = [e for e in swarm.edges if slow(e)]
    inside = [e for e in swarm.edges if not slow(e)]
    assert cross
    slow_bytes = get_codec(codec, fraction=0.1).encoded_nbytes(dim) * 2 * (rounds // period)
    assert all(swarm.bytes_by_edge[e] == slow_bytes for e in cross)
    fast_bytes = get_codec("int8").encoded_nbytes(dim) * 2 * rounds
    assert all(swarm.bytes_by_edge[e] == fast_bytes for e in inside)


@settings(max_examples=30, deadline=None)
@given(
    switches=st.lists(st.sampled_from(sorted(CODECS)), min_size=1, max_size=8),
    seed=st.integers(0, 2**16),
)
def test_replicas_stay_bit_identical_across_codec_changes(switches: list[str], seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(DIM, generator=gen)
    sender, receiver = PairwiseGossip(x, torch.Generator().manual_seed(seed)), PairwiseGossip(x)
    _, snap = sender.open("b", get_codec("int8"), x)
    receiver.open("a", get_codec("int8"), x)
    receiver.receive_snapshot("a", 0, snap)
    for name in switches:
        codec = get_codec(name, fraction=0.25)
        sender.set_codec("b", codec)
        x = x + 0.1 * torch.randn(DIM, generator=gen)
        seq, payload = sender.make_delta("b", x)
        receiver.receive_delta("a", seq, payload, codec)
        replica = receiver.links["a"].replica
        assert replica is not None
        assert torch.equal(replica, sender.links["b"].public)


def test_a_delta_out_of_order_or_before_the_snapshot_is_refused() -> None:
    x = torch.zeros(DIM)
    a, b = PairwiseGossip(x), PairwiseGossip(x)
    a.open("b", get_codec("int8"), x)
    b.open("a", get_codec("int8"), x)
    seq, payload = a.make_delta("b", x + 1)
    with pytest.raises(ValueError, match="does not follow"):
        b.receive_delta("a", seq, payload, get_codec("int8"))  # no snapshot yet
    b.receive_snapshot("a", 0, torch.zeros(DIM))
    a.make_delta("b", x + 2)  # lost
    seq3, payload3 = a.make_delta("b", x + 3)
    with pytest.raises(ValueError, match="does not follow"):
        b.receive_delta("a", seq3, payload3, get_codec("int8"))
    with pytest.raises(ValueError, match="wrong size"):
        b.receive_snapshot("a", 0, torch.zeros(DIM + 1))


@pytest.mark.parametrize(("n", "regions"), [(16, 4), (40, 4), (30, 3), (9, 9)])
def test_the_regional_graph_keeps_edges_inside_and_bridges_each_pair(n: int, regions: int) -> None:
    ids = [f"m{k:03d}" for k in range(n)]
    size = math.ceil(n / regions)
    region_of = {i: f"r{k // size}" for k, i in enumerate(ids)}
    graph = regional(region_of, bridges=2)
    assert graph.is_symmetric()
    assert graph.is_connected()
    names = sorted(set(region_of.values()))
    cross = {(i, j) for i in ids for j in graph.adj[i] if i < j and crosses(region_of, i, j)}
    for a_pos, a in enumerate(names):
        for b in names[a_pos + 1 :]:
            between = [e for e in cross if {region_of[e[0]], region_of[e[1]]} == {a, b}]
            smaller = min(
                sum(r == a for r in region_of.values()), sum(r == b for r in region_of.values())
            )
            assert len(between) == min(2, smaller)
            ends = [x for e in between for x in e]
            assert len(ends) == len(set(ends))  # distinct members bridge
    inside = sum(len(graph.adj[i]) for i in ids) // 2 - len(cross)
    if n >= 4 * regions:
        assert inside > len(cross)
    assert regional(dict(reversed(list(region_of.items())))) == regional(region_of)
    with pytest.raises(ValueError, match="bridges"):
        regional(region_of, bridges=0)


def test_an_unchanging_graph_s_pairwise_mixing_matches_the_ring() -> None:
    init = start(8)
    swarm = PairwiseSwarm(ring(init), init, lambda _: get_codec("fp32"), 1.0)
    mean0 = swarm.mean()
    for _ in range(200):
        swarm.round()
    for x in swarm.x.values():
        assert torch.allclose(x.to(torch.float64), mean0, atol=1e-4)
