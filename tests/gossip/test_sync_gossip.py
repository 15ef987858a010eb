"""Gossip alone (no training), 16 in-memory nodes on the synchronous schedule.

Every message goes through encode -> bytes -> decode -> replica, as in the daemon.
"""

from __future__ import annotations

import math

import pytest
import torch

from gossip.codecs import get_codec
from gossip.simulate import SyncSwarm, consensus_distance
from gossip.topology import Graph, build, metropolis_hastings, mixing_matrix, spectral_gap
from node.config import GossipConfig

N, DIM, BLOCK = 16, 256, 64
IDS = [f"n{i:02d}" for i in range(N)]


def initial() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    # A common offset keeps the mean well away from zero, so "relative drift" means something.
    return {i: torch.randn(DIM, generator=g) + 1.0 for i in IDS}


def rounds_until(swarm: SyncSwarm, factor: float, max_rounds: int) -> int | None:
    """Rounds until the consensus distance fell by ``factor``; None if it never did."""
    target = swarm.consensus_distance() / factor
    for r in range(1, max_rounds + 1):
        swarm.round()
        if swarm.consensus_distance() <= target:
            return r
    return None


def relative_drift(swarm: SyncSwarm, mean0: torch.Tensor) -> float:
    return float((swarm.mean() - mean0).norm() / mean0.norm())


@pytest.mark.parametrize("kind", ["ring", "exponential"])
def test_exact_gossip_falls_a_millionfold_within_the_spectral_bound(kind: str) -> None:
    graph = build(kind, IDS)
    gap = spectral_gap(mixing_matrix(graph))
    swarm = SyncSwarm(graph, initial(), get_codec("fp32"), gamma=1.0)
    mean0 = swarm.mean()
    rounds = rounds_until(swarm, 1e6, 400)
    assert rounds is not None
    # Exact gossip shrinks the distance by at least (1 - gap)^2 a round.
    bound = math.log(1e6) / (-2 * math.log(1 - gap))
    assert rounds <= math.ceil(bound)
    assert relative_drift(swarm, mean0) < 1e-6


def test_the_exponential_graph_needs_far_fewer_rounds_than_the_ring() -> None:
    rounds, gaps = {}, {}
    for kind in ("ring", "exponential"):
        graph = build(kind, IDS)
        gaps[kind] = spectral_gap(mixing_matrix(graph))
        rounds[kind] = rounds_until(SyncSwarm(graph, initial(), get_codec("fp32"), 1.0), 1e6, 400)
    assert rounds["ring"] is not None
    assert rounds["exponential"] is not None
    assert rounds["ring"] >= 8 * rounds["exponential"]
    # The ratio of rounds follows the ratio of log-contraction rates the spectral gaps give.
    rate = math.log(1 - gaps["exponential"]) / math.log(1 - gaps["ring"])
    assert 0.5 * rate <= rounds["ring"] / rounds["exponential"] <= 1.5 * rate


@pytest.mark.parametrize(
    ("codec", "gamma", "kind", "max_rounds"),
    [
        ("int8", 0.8, "exponential", 60),
        ("int4", 0.5, "exponential", 120),
        ("int8", 0.8, "ring", 400),
        ("int4", 0.5, "ring", 600),
    ],
)
def test_compressed_gossip_still_falls_ten_thousandfold_and_keeps_the_mean(
    codec: str, gamma: float, kind: str, max_rounds: int
) -> None:
    swarm = SyncSwarm(build(kind, IDS), initial(), get_codec(codec, BLOCK), gamma)
    mean0 = swarm.mean()
    assert rounds_until(swarm, 1e4, max_rounds) is not None
    assert relative_drift(swarm, mean0) < 1e-6


def test_one_bit_gossip_converges_with_a_small_step() -> None:
    swarm = SyncSwarm(build("exponential", IDS), initial(), get_codec("sign", BLOCK), 0.1)
    mean0 = swarm.mean()
    assert rounds_until(swarm, 1e4, 1500) is not None
    assert relative_drift(swarm, mean0) < 1e-6


def naive_gossip(graph: Graph, codec: str, gamma: float, rounds: int) -> dict[str, torch.Tensor]:
    """What CHOCO is not: every node sends Q(x_i) itself, and mixes with what it received."""
    c = get_codec(codec, BLOCK)
    weights = metropolis_hastings(graph)
    x = initial()
    gen = torch.Generator().manual_seed(1)
    for _ in range(rounds):
        q = {i: c.decode(c.encode(x[i], gen)) for i in graph.nodes}
        for i in graph.nodes:
            x[i] = x[i] + gamma * sum(
                (w * (q[j] - q[i]) for j, w in weights[i].items()), torch.zeros(DIM)
            )
    return x


@pytest.mark.parametrize(("codec", "gamma"), [("int8", 0.8), ("int4", 0.5)])
def test_without_public_copies_quantization_noise_never_goes_away(codec: str, gamma: float) -> None:
    graph = build("exponential", IDS)
    rounds = 120
    start = consensus_distance(initial())
    choco = SyncSwarm(graph, initial(), get_codec(codec, BLOCK), gamma)
    for _ in range(rounds):
        choco.round()
    naive = consensus_distance(naive_gossip(graph, codec, gamma, rounds))
    assert choco.consensus_distance() <= start * 1e-8
    # The naive scheme stalls at its quantization floor, orders of magnitude above CHOCO.
    assert naive >= start * 1e-6
    assert naive >= 1000 * choco.consensus_distance()


SPARSE_BLOCK, SPARSE_FRACTION = 64, 0.125  # 8 values of each block of 64


def sparse_gamma(codec: str) -> float:
    """The step size a node picks by default for this codec at these settings."""
    return GossipConfig(
        codec=codec, block_size=SPARSE_BLOCK, compress_fraction=SPARSE_FRACTION
    ).step_size


@pytest.mark.parametrize(
    ("codec", "max_rounds"),
    # Twice the rounds bench/codec_gamma.py measured at these settings: 31, 128 and 31.
    [("topk", 60), ("randk", 260), ("dct-topk", 60)],
)
def test_sparse_gossip_with_error_feedback_falls_ten_thousandfold_and_keeps_the_mean(
    codec: str, max_rounds: int
) -> None:
    c = get_codec(codec, SPARSE_BLOCK, SPARSE_FRACTION)
    swarm = SyncSwarm(build("exponential", IDS), initial(), c, sparse_gamma(codec))
    mean0 = swarm.mean()
    assert rounds_until(swarm, 1e4, max_rounds) is not None
    assert relative_drift(swarm, mean0) < 1e-6
    # Each node sent an eighth of the values (and their indices) each round, no more.
    sent_per_round = swarm.bytes_sent / swarm.rounds
    assert sent_per_round == sum(len(build("exponential", IDS).neighbours(i)) for i in IDS) * (
        c.encoded_nbytes(DIM)
    )


def test_top_k_without_public_copies_stalls_where_choco_converges() -> None:
    graph = build("exponential", IDS)
    rounds = 60
    start = consensus_distance(initial())
    c = get_codec("topk", SPARSE_BLOCK, SPARSE_FRACTION)
    choco = SyncSwarm(graph, initial(), c, sparse_gamma("topk"))
    for _ in range(rounds):
        choco.round()
    x = initial()
    weights = metropolis_hastings(graph)
    for _ in range(rounds):  # each node sends top-k of x_i itself and mixes with what came
        q = {i: c.decode(c.encode(x[i])) for i in graph.nodes}
        for i in graph.nodes:
            x[i] = x[i] + sparse_gamma("topk") * sum(
                (w * (q[j] - q[i]) for j, w in weights[i].items()), torch.zeros(DIM)
            )
    naive = consensus_distance(x)
    assert choco.consensus_distance() <= start * 1e-6
    assert naive >= start * 0.1
