"""Time-varying schedules (gossip/schedules.py): one-peer exponential averages exactly in log2 n
synchronous rounds for n a power of two, and at the rate its period's contraction predicts
otherwise; epidemic draws are reproducible, distinct per node and round, and uniform enough."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from gossip.schedules import (
    epidemic_peers,
    one_peer_contraction,
    one_peer_matrix,
    one_peer_offset,
    one_peer_peer,
    peers_at,
)
from gossip.simulate import PushSumSwarm


def ids(n: int) -> list[str]:
    return [f"node-{i:04d}" for i in range(n)]


def start(n: int, dim: int = 16, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {i: torch.randn(dim, generator=gen, dtype=torch.float64) for i in ids(n)}


def spread(models: dict[str, torch.Tensor]) -> float:
    """||X − 1x̄ᵀ||_F over the nodes."""
    stacked = torch.stack(list(models.values()))
    return float(torch.linalg.matrix_norm(stacked - stacked.mean(0)))


@pytest.mark.parametrize("n", [2, 4, 8, 16, 64, 256])
def test_one_peer_exponential_averages_exactly_in_log2_n_rounds(n: int) -> None:
    init = start(n)
    mean = torch.stack(list(init.values())).mean(0)
    swarm = PushSumSwarm(init, "one-peer-exponential")
    for _ in range(int(math.log2(n)) - 1):
        swarm.round()
    assert spread(swarm.estimates()) > 1e-3  # one round short, it is not there yet
    swarm.round()
    for z in swarm.estimates().values():
        assert torch.allclose(z, mean, rtol=0, atol=1e-12)
    assert swarm.messages == n * int(math.log2(n))  # one message per node per round
    assert one_peer_contraction(n) < 1e-12


@pytest.mark.parametrize("n", [3, 6, 12, 100])
def test_elsewhere_the_error_falls_at_the_rate_theory_gives(n: int) -> None:
    rate = one_peer_contraction(n)
    assert 0.0 < rate < 1.0
    init = start(n, seed=n)
    swarm = PushSumSwarm(init, "one-peer-exponential")
    period = max(1, (n - 1).bit_length())
    before = spread(swarm.estimates())
    for periods in range(1, 6):
        for _ in range(period):
            swarm.round()
        # every weight stays 1 in this schedule (each node hears from exactly one), so the
        # estimates are the matrix products' rows, bounded by the contraction per period
        assert spread(swarm.estimates()) <= rate**periods * before * (1 + 1e-9)


@pytest.mark.parametrize("n", [5, 8, 13])
def test_the_rounds_matrices_are_doubly_stochastic_and_match_the_peers(n: int) -> None:
    for r in range(12):
        w = one_peer_matrix(n, r)
        assert torch.allclose(w.sum(0), torch.ones(n, dtype=torch.float64))
        assert torch.allclose(w.sum(1), torch.ones(n, dtype=torch.float64))
        view = ids(n)
        for pos, node in enumerate(view):
            to = one_peer_peer(view, node, r)
            assert to == view[(pos + one_peer_offset(n, r)) % n]
            assert w[view.index(to), pos] > 0  # the receiver's row takes from the sender


def test_every_member_with_the_same_view_derives_the_same_peers() -> None:
    view = ids(20)
    shuffled = list(reversed(view))
    for r in range(10):
        for node in view:
            assert peers_at("one-peer-exponential", view, node, r) == peers_at(
                "one-peer-exponential", shuffled, node, r
            )
            assert peers_at("epidemic", view, node, r, fanout=3, seed=7) == peers_at(
                "epidemic", shuffled, node, r, fanout=3, seed=7
            )


def test_epidemic_draws_are_distinct_peers_that_change_with_the_round() -> None:
    view = ids(50)
    counts: Counter[str] = Counter()
    draws = set()
    for r in range(400):
        peers = epidemic_peers(view, view[0], r, 4, seed=1)
        assert len(peers) == len(set(peers)) == 4
        assert view[0] not in peers
        counts.update(peers)
        draws.add(peers)
    assert len(draws) > 390  # a fresh draw every round
    # 1,600 picks over 49 peers: about 33 each; uniform draws keep every count within 15..55
    assert set(counts) == set(view[1:])
    assert min(counts.values()) >= 15
    assert max(counts.values()) <= 55
    assert epidemic_peers(view, view[0], 3, 4, seed=1) != epidemic_peers(view, view[0], 3, 4, 2)
    assert len(epidemic_peers(view[:3], view[0], 0, 5)) == 2  # fewer when the view is small


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown schedule"):
        peers_at("star", ids(4), "node-0000", 0)
    with pytest.raises(ValueError, match="fanout"):
        epidemic_peers(ids(4), "node-0000", 0, 0)
    with pytest.raises(ValueError, match="at least one node"):
        one_peer_peer([], "a", 0)
    assert one_peer_peer(["a"], "a", 5) is None
