"""Push-sum with running sums (gossip/pushsum.py): the mean is preserved to 1e-6 under asymmetric
schedules, losses, duplicates and reordering (Hypothesis), and every estimate converges to it."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gossip.pushsum import PushGap, PushMessage, PushSum, PushSumError, in_flight
from gossip.simulate import PushSumSwarm

DIM = 12


def make(n: int, seed: int, dtype: torch.dtype) -> dict[str, PushSum]:
    gen = torch.Generator().manual_seed(seed)
    return {
        f"n{i}": PushSum(f"n{i}", torch.randn(DIM, generator=gen).to(dtype) * 10 + 3)
        for i in range(n)
    }


def held(nodes: dict[str, PushSum]) -> tuple[torch.Tensor, float]:
    value = torch.stack([s.value.to(torch.float64) for s in nodes.values()]).sum(0)
    return value, sum(s.weight for s in nodes.values())


def deliver(nodes: dict[str, PushSum], message: PushMessage) -> None:
    """What a node does with a message: take it, or on a gap take the sender's running sums."""
    try:
        nodes[message.to].receive(message)
    except PushGap:
        nodes[message.to].receive_resync(nodes[message.sender].resync(message.to))


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(2, 9),
    rounds=st.integers(1, 40),
    loss=st.floats(0.0, 0.6),
    seed=st.integers(0, 2**31 - 1),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_the_mean_is_kept_under_asymmetric_schedules_loss_duplicates_and_reordering(
    n: int, rounds: int, loss: float, seed: int, dtype: torch.dtype
) -> None:
    rng = random.Random(seed)
    nodes = make(n, seed, dtype)
    ids = sorted(nodes)
    total0, weight0 = held(nodes)
    scale = float(total0.abs().max()) + n
    late: list[PushMessage] = []
    for _ in range(rounds):
        outgoing: list[PushMessage] = []
        for i in ids:  # each node sends to a subset of its own choosing, often nobody
            others = [j for j in ids if j != i]
            outgoing += nodes[i].send(rng.sample(others, rng.randint(0, len(others))))
        rng.shuffle(outgoing)
        for message in outgoing:
            fate = rng.random()
            if fate < loss:
                continue  # lost: its mass is in flight until a resync
            if fate < loss + 0.1:
                late.append(message)  # held back: arrives after later ones
                continue
            deliver(nodes, message)
            if rng.random() < 0.1:
                nodes[message.to].receive(message)  # a duplicate changes nothing
        while late and rng.random() < 0.5:
            deliver(nodes, late.pop(rng.randrange(len(late))))
        value, weight = held(nodes)
        moving, moving_w = in_flight(nodes)
        # held plus in flight is the initial mass, at every moment
        assert float((value + moving - total0).abs().max()) <= 1e-6 * scale
        assert abs(weight + moving_w - weight0) <= 1e-9 * n
    for message in late:
        deliver(nodes, message)
    for i in ids:  # the links' last resync: nothing left in flight
        for j in sorted(nodes[i].out_links):
            nodes[j].receive_resync(nodes[i].resync(j))
    value, weight = held(nodes)
    assert float((value - total0).abs().max()) <= 1e-6 * scale
    assert abs(weight - weight0) <= 1e-9 * n
    moving, moving_w = in_flight(nodes)
    assert float(moving.abs().max()) == 0.0
    assert moving_w == 0.0


@pytest.mark.parametrize(("kind", "fanout"), [("one-peer-exponential", 1), ("epidemic", 2)])
@pytest.mark.parametrize("loss", [0.0, 0.2])
def test_every_estimate_converges_to_the_initial_mean(kind: str, fanout: int, loss: float) -> None:
    gen = torch.Generator().manual_seed(3)
    init = {f"n{i:02d}": torch.randn(DIM, generator=gen) for i in range(24)}
    mean = torch.stack(list(init.values())).to(torch.float64).mean(0)
    swarm = PushSumSwarm(init, kind, fanout=fanout, loss=loss, seed=5)
    first = swarm.consensus_distance()
    for _ in range(120):
        swarm.round()
    assert swarm.consensus_distance() < first * 1e-8
    for z in swarm.estimates().values():
        assert torch.allclose(z.to(torch.float64), mean, atol=1e-5)
    assert (swarm.resyncs > 0) == (loss > 0)


def test_duplicates_and_older_messages_change_nothing_and_gaps_are_refused() -> None:
    a, b = PushSum("a", torch.ones(3)), PushSum("b", torch.zeros(3))
    first, second = a.send(["b"])[0], a.send(["b"])[0]
    assert b.receive(first)
    before = (b.value.clone(), b.weight)
    assert not b.receive(first)
    assert torch.equal(b.value, before[0])
    assert b.weight == before[1]
    a.send(["b"])  # seq 3, lost
    with pytest.raises(PushGap, match="expected seq 2, got 4"):
        b.receive(a.send(["b"])[0])
    assert torch.equal(b.value, before[0])  # refused: unchanged
    assert b.receive_resync(a.resync("b"))  # the second, the lost third and the fourth
    assert not b.receive(second)  # older than the resync
    assert not b.receive_resync(a.resync("b"))  # nothing newer
    total = a.value + b.value
    assert torch.allclose(total, torch.ones(3))
    assert a.weight + b.weight == pytest.approx(2.0)


def test_bad_messages_are_refused_with_nothing_changed() -> None:
    a, b = PushSum("a", torch.ones(3)), PushSum("b", torch.zeros(3))
    (good,) = a.send(["b"])
    for bad, match in [
        (PushMessage("a", "c", 1, good.value, good.weight), "for c reached b"),
        (PushMessage("a", "b", 1, torch.ones(4), good.weight), "4 values"),
        (PushMessage("a", "b", 1, torch.full((3,), float("nan")), good.weight), "non-finite"),
        (PushMessage("a", "b", 1, good.value, -1.0), "negative"),
    ]:
        with pytest.raises(PushSumError, match=match):
            b.receive(bad)
        assert torch.equal(b.value, torch.zeros(3))
        assert b.weight == 1.0
    with pytest.raises(ValueError, match="flat float32"):
        PushSum("a", torch.ones(2, 2))
    with pytest.raises(ValueError, match="positive"):
        PushSum("a", torch.ones(2), weight=0.0)


def test_a_training_step_moves_the_estimate_by_itself() -> None:
    node = PushSum("a", torch.tensor([1.0, 2.0]), weight=1.0)
    node.send(["b", "c", "d"])  # keeps a quarter of its mass
    assert node.weight == pytest.approx(0.25)
    node.local_change(torch.tensor([0.5, -1.0]))
    assert torch.allclose(node.estimate(), torch.tensor([1.5, 1.0]))
