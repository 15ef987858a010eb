"""ClippedGossip and the anomaly score: small hand-computed cases and a synchronous swarm with one
Byzantine node."""

from __future__ import annotations

import math

import pytest
import torch

from gossip.clock import ManualClock
from gossip.codecs import get_codec
from gossip.replicas import GossipState
from gossip.robust import (
    AnomalyScore,
    NeighbourScores,
    attack_target,
    clip_radius,
    clipped_consensus_step,
)
from gossip.simulate import SyncSwarm
from gossip.topology import build


def state_with(public: list[float], replicas: dict[str, list[float]]) -> GossipState:
    state = GossipState(torch.tensor(public), get_codec("fp32"), ManualClock())
    for peer, values in replicas.items():
        state.admit(peer)
        state.receive_snapshot(peer, 1, 0, torch.tensor(values))
    return state


def tick(state: GossipState, seconds: float = 0.1) -> None:
    """Time between two rounds (ten a second, as the daemon's)."""
    assert isinstance(state.clock, ManualClock)
    state.clock.advance(seconds)


def test_the_radius_is_the_largest_distance_within_one_minus_delta_of_the_weight() -> None:
    d = {"a": 1.0, "b": 2.0, "c": 3.0, "z": 100.0}
    w = dict.fromkeys(d, 0.2)
    # Cumulative weight, nearest first: 0.2, 0.4, 0.6, 0.8 of 0.8; keep 0.75 * 0.8 = 0.6.
    assert clip_radius(d, w, 0.25) == 3.0
    assert clip_radius(d, w, 0.0) == 100.0
    # Two neighbours: keeping 3/4 of the weight keeps only the nearer one.
    assert clip_radius({"a": 1.0, "z": 50.0}, {"a": 0.3, "z": 0.3}, 0.25) == 1.0
    # One neighbour: nothing to compare with, nothing clipped.
    assert clip_radius({"z": 50.0}, {"z": 0.5}, 0.25) == 50.0
    assert clip_radius({}, {}, 0.25) == math.inf
    with pytest.raises(ValueError, match="byzantine_fraction"):
        clip_radius(d, w, 1.0)


def test_the_far_pull_is_clipped_to_the_radius_and_the_near_ones_are_not() -> None:
    # x̂_i = 0; pulls a = (3, 4) (norm 5), b = (0, 1) (norm 1), z = (300, 400) (norm 500).
    state = state_with([0.0, 0.0], {"a": [3.0, 4.0], "b": [0.0, 1.0], "z": [300.0, 400.0]})
    x = torch.tensor([1.0, 1.0])
    w = {"a": 0.25, "b": 0.25, "z": 0.25}
    # Cumulative weight, nearest first: 0.25, 0.5, 0.75; keep 0.7 * 0.75 = 0.525: b and a.
    result = clipped_consensus_step(state, x, 0.5, w, byzantine_fraction=0.3)
    assert result.tau == 5.0
    assert result.clipped == {"z"}
    # z clipped to norm 5: (3, 4). x += 0.5 * 0.25 * ((3, 4) + (0, 1) + (3, 4)) = (0.75, 1.125).
    assert torch.allclose(x, torch.tensor([1.75, 2.125]))


def test_with_nothing_clipped_the_step_is_exactly_the_plain_consensus_step() -> None:
    g = torch.Generator().manual_seed(1)
    reps = {p: torch.randn(8, generator=g).tolist() for p in "abc"}
    state = state_with(torch.randn(8, generator=g).tolist(), reps)
    w = {"a": 0.2, "b": 0.3, "c": 0.1}
    x0 = torch.randn(8, generator=g)
    plain = state.consensus_step(x0.clone(), 0.7, w)
    robust = x0.clone()
    result = clipped_consensus_step(state, robust, 0.7, w, byzantine_fraction=0.0)
    assert result.clipped == frozenset()
    assert torch.allclose(plain, robust, atol=1e-6)


def test_a_neighbour_with_huge_deltas_is_evicted_and_honest_ones_are_not() -> None:
    g = torch.Generator().manual_seed(2)
    score = AnomalyScore()
    for _ in range(10):
        common = torch.randn(32, generator=g)
        deltas = {p: common + 0.5 * torch.randn(32, generator=g) for p in "abcd"}
        deltas["z"] = -20 * common
        score.update(deltas)
    assert score.evicted() == {"z"}
    assert score.scores["z"] > 3
    assert max(score.scores[p] for p in "abcd") < 0.2


def test_two_flippers_among_five_are_evicted_for_their_distance_and_honest_pulls_are_not() -> None:
    """Issue 21: under a flip attack the score evicted honest neighbours and never the
    attackers. Flippers publish -x: their deltas are as large as honest ones and the others'
    mean direction is half theirs, but they sit two norms away while honest replicas are a
    consensus distance apart; near consensus honest deltas are pulls toward each other, so
    they point against each other."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, generator=g)
    honest = {p: x + 0.05 * torch.randn(64, generator=g) for p in "abc"}
    state = state_with(
        x.tolist(),
        {**{p: v.tolist() for p, v in honest.items()}, "y": (-x).tolist(), "z": (-x).tolist()},
    )
    scores = NeighbourScores()  # δ = 0.25
    peers = frozenset("abcyz")
    evicted: set[str] = set()
    for _ in range(30):
        drift = 0.02 * torch.randn(64, generator=g)
        centre = torch.stack([state.replicas[p].value for p in "abc"]).mean(dim=0)
        for p in "abc":  # half-way to the honest centre, plus this round's training
            value = state.replicas[p].value
            state.replicas[p].value = value + 0.5 * (centre - value) + drift
        for p in "yz":  # the flippers' own training, published sign-flipped
            state.replicas[p].value = state.replicas[p].value - drift
        state.public += drift
        tick(state)
        evicted |= scores.update(state, peers)
    assert evicted == {"y", "z"}
    assert max(scores.anomaly.scores[p] for p in "abc") < 0.5


def test_one_odd_round_does_not_evict_but_a_few_do() -> None:
    score = AnomalyScore()
    honest = {"a": torch.ones(4), "b": torch.ones(4)}
    evicted = []
    for _ in range(3):  # scores 0.5, 0.95, 1.355
        score.update({**honest, "z": 1000 * torch.ones(4)})
        evicted.append(score.evicted())
    assert evicted == [frozenset(), frozenset(), {"z"}]
    for _ in range(30):
        score.update({**honest, "z": torch.ones(4)})
    assert score.evicted() == frozenset()  # it behaves again: back in the mix


def test_a_silent_neighbour_keeps_its_score() -> None:
    score = AnomalyScore()
    score.update({"a": torch.ones(4), "b": torch.ones(4), "z": 100 * torch.ones(4)})
    before = score.scores["z"]
    score.update({"a": torch.ones(4), "b": torch.ones(4), "z": torch.zeros(4)})
    assert score.scores["z"] == before


class ByzantineSwarm(SyncSwarm):
    """A SyncSwarm where ``attacker`` publishes ``scale`` times its model (a valid delta stream,
    so every replica of it stays consistent) and does not mix; the others mix plainly or with
    ClippedGossip."""

    def __init__(self, *args: object, attacker: str, robust: bool, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.attacker, self.robust = attacker, robust

    def round(self) -> None:
        for i in self.graph.nodes:
            target = self.x[i] * 50 if i == self.attacker else self.x[i]
            seq, payload = self.states[i].make_delta(target)
            for j in self.graph.neighbours(i):
                self.states[j].receive_delta(i, self.states[i].session, seq, payload)
        for i in self.graph.nodes:
            if i == self.attacker:
                continue
            if self.robust:
                clipped_consensus_step(self.states[i], self.x[i], self.gamma, self.weights[i], 0.25)
            else:
                self.states[i].consensus_step(self.x[i], self.gamma, self.weights[i])
        self.clock.advance(1.0)


def honest_stats(swarm: ByzantineSwarm, honest_mean0: torch.Tensor) -> tuple[float, float]:
    """(distance of the honest nodes' mean from their starting mean, their spread), relative to
    the starting mean's norm."""
    honest = torch.stack([x for i, x in swarm.x.items() if i != swarm.attacker])
    mean = honest.mean(dim=0)
    scale = float(honest_mean0.norm())
    spread = float((honest - mean).norm(dim=1).max())
    return float((mean - honest_mean0).norm()) / scale, spread / scale


@pytest.mark.parametrize("robust", [False, True])
def test_one_byzantine_node_drags_plain_gossip_but_not_clipped_gossip(robust: bool) -> None:
    ids = [f"n{i}" for i in range(8)]
    g = torch.Generator().manual_seed(0)
    initial = {i: torch.randn(64, generator=g) + 2.0 for i in ids}
    honest_mean0 = torch.stack([initial[i] for i in ids[:-1]]).mean(dim=0)
    swarm = ByzantineSwarm(
        build("exponential", ids), initial, get_codec("int8", 64), 0.8, attacker="n7", robust=robust
    )
    for _ in range(60):
        swarm.round()
    drift, spread = honest_stats(swarm, honest_mean0)
    if robust:
        assert drift < 0.3  # close to the honest mean
        assert spread < 0.1  # and agreeing
    else:
        assert drift > 5  # dragged many times the model's own size away


def test_an_excluded_neighbour_does_not_pull_but_still_counts_in_the_radius() -> None:
    state = state_with([0.0, 0.0], {"a": [3.0, 4.0], "b": [0.0, 1.0], "z": [300.0, 400.0]})
    w = {"a": 0.25, "b": 0.25, "z": 0.25}
    x = torch.tensor([0.0, 0.0])
    result = clipped_consensus_step(state, x, 1.0, w, 0.3, excluded=frozenset({"a", "b"}))
    # Had a and b been dropped, z alone would set τ = 500 and pull unclipped.
    assert result.tau == 5.0
    assert torch.allclose(x, torch.tensor([0.75, 1.0]))  # 0.25 * (3, 4)


def test_the_huge_attack_adds_a_finite_delta_of_ten_thousand_times_the_model() -> None:
    x = torch.randn(1000, generator=torch.Generator().manual_seed(4))
    first = attack_target("huge", x, torch.Generator().manual_seed(5))
    again = attack_target("huge", x, torch.Generator().manual_seed(5))
    assert torch.equal(first, again)  # seeded by the generator it is given
    assert bool(first.isfinite().all())
    assert float((first - x).norm()) == pytest.approx(1e4 * float(x.norm()), rel=1e-4)
    # A random direction, not along x.
    assert abs(float(torch.nn.functional.cosine_similarity(first - x, x, dim=0))) < 0.2
    # A zero model is still attacked, with a delta of norm 1e4.
    zero = attack_target("huge", torch.zeros(10), torch.Generator().manual_seed(5))
    assert float(zero.norm()) == pytest.approx(1e4, rel=1e-4)


def test_the_spike_attack_sets_one_in_a_thousand_coordinates_far_outside_the_model() -> None:
    x = torch.rand(5000, generator=torch.Generator().manual_seed(6)) - 0.5
    spiked = attack_target("spike", x, torch.Generator().manual_seed(7))
    changed = (spiked != x).nonzero().flatten()
    assert len(changed) == 5  # 0.1% of 5,000
    top = 1e3 * float(x.abs().max())
    assert torch.allclose(spiked[changed].abs(), torch.full((5,), top))
    assert {1.0, -1.0} >= set(spiked[changed].sign().tolist())
    assert torch.equal(spiked, attack_target("spike", x, torch.Generator().manual_seed(7)))
    # Small models still get one spike.
    assert int((attack_target("spike", x[:10], torch.Generator()) != x[:10]).sum()) == 1


def test_an_unknown_attack_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="scale, flip, random, huge, spike"):
        attack_target("nope", torch.ones(3), torch.Generator())


def test_near_consensus_replicas_a_thousandth_of_the_norm_away_are_not_evicted() -> None:
    """Issue 21: at consensus honest replicas agree to the codec's precision, τ shrinks to
    nothing, and two neighbours a thousandth of the model's norm away were twenty radii out."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(64, generator=g)  # norm about 8
    near = {p: x + 1e-6 * torch.randn(64, generator=g) for p in "abc"}
    off = {p: x + 1e-3 * torch.randn(64, generator=g) for p in "yz"}  # about 0.008 away
    state = state_with(x.tolist(), {p: v.tolist() for p, v in {**near, **off}.items()})
    scores = NeighbourScores()
    peers = frozenset("abcyz")
    for _ in range(30):
        step = 1e-4 * torch.randn(64, generator=g)
        for replica in state.replicas.values():
            replica.value = replica.value + step
        state.public += step
        tick(state)
        assert scores.update(state, peers) == frozenset()
    # Ten norms away is still far beyond the floor: out within a second.
    state.replicas["z"].value = -9 * state.public
    evicted = []
    for _ in range(10):
        tick(state)
        evicted.append("z" in scores.update(state, peers))
    assert any(evicted)


def test_a_stopped_neighbour_cannot_shrink_the_reference_below_this_nodes_own_change() -> None:
    """Issue 21: a flipper that stopped training sends nearly nothing; when the other
    neighbours were silent, a median of its delta and this node's own made an honest
    neighbour's ordinary delta ten times the reference, and evicted it."""
    g = torch.Generator().manual_seed(9)
    score = AnomalyScore()
    for _ in range(30):
        own = 0.3 * torch.randn(32, generator=g) / 32**0.5
        honest = 0.2 * torch.randn(32, generator=g) / 32**0.5
        stopped = 0.02 * torch.randn(32, generator=g) / 32**0.5
        score.update({"c": honest, "z": stopped, "e": torch.zeros(32)}, own=own)
    assert score.evicted() == frozenset()
    assert score.scores["c"] < 0.1
    # Without its own change to compare with, the node has only the stopped neighbour's.
    alone = AnomalyScore()
    for _ in range(10):
        alone.update({"c": torch.ones(32), "z": 0.01 * torch.ones(32)})
    assert alone.evicted() == {"c"}


def noise(g: torch.Generator, size: float) -> torch.Tensor:
    return size * torch.randn(32, generator=g) / math.sqrt(32)


def test_a_neighbour_that_trains_on_after_the_others_stopped_keeps_its_place() -> None:
    """Real swarms: the nodes finish at different times, and the last one's deltas are then
    a hundred times its finished neighbours' (and this node's own). It is judged against the
    deltas it sent while they all trained, and is not evicted; one that jumps is."""
    g = torch.Generator().manual_seed(10)
    score, t = AnomalyScore(), 0.0
    for _ in range(30):  # three seconds of all training
        t += 0.1
        score.update({p: noise(g, 1.0) for p in "abl"}, own=noise(g, 1.0), now=t)
    for _ in range(30):  # three more of only l training
        t += 0.1
        deltas = {"a": noise(g, 0.01), "b": noise(g, 0.01), "l": noise(g, 1.0)}
        score.update(deltas, own=noise(g, 0.01), now=t)
    assert score.evicted() == frozenset()
    assert score.scores["l"] < 0.1
    for _ in range(10):  # a second of twenty times its own deltas
        t += 0.1
        deltas = {"a": noise(g, 0.01), "b": noise(g, 0.01), "l": noise(g, 20.0)}
        score.update(deltas, own=noise(g, 0.01), now=t)
    assert score.evicted() == {"l"}


def test_a_few_hundred_milliseconds_out_of_step_do_not_evict_but_a_second_of_it_does() -> None:
    """A node that starts training late sends deltas ten times its neighbours' until it has
    caught up; an attacker keeps doing so. With times, the score averages over seconds."""
    g = torch.Generator().manual_seed(11)
    late, attacker, t = AnomalyScore(), AnomalyScore(), 0.0
    for i in range(30):  # twenty updates a second
        t += 0.05
        size = 10.0 if i < 6 else 1.0  # out of step for 0.3 s
        late.update({"a": noise(g, 1.0), "b": noise(g, 1.0), "z": noise(g, size)}, now=t)
        attacker.update({"a": noise(g, 1.0), "b": noise(g, 1.0), "z": noise(g, 10.0)}, now=t)
    assert late.evicted() == frozenset()
    assert attacker.evicted() == {"z"}
    # By rounds in lock-step, as without times, the same 0.3 s would have evicted.
    rounds = AnomalyScore()
    for _ in range(6):
        rounds.update({"a": noise(g, 1.0), "b": noise(g, 1.0), "z": noise(g, 10.0)})
    assert rounds.evicted() == {"z"}


def test_an_attacker_raises_its_own_reference_to_at_most_the_slack_times_the_others() -> None:
    g = torch.Generator().manual_seed(12)
    score, t, size = AnomalyScore(), 0.0, 1.0
    for _ in range(200):  # it grows its deltas 3% a round: never a jump
        t += 0.1
        size *= 1.03
        score.update({"a": noise(g, 1.0), "b": noise(g, 1.0), "z": noise(g, size)}, now=t)
    assert score.usual["z"] <= score.norm_slack * 1.5  # the others' deltas are about 1
    assert score.evicted() == {"z"}


def test_a_fast_device_is_judged_per_step_not_per_delta() -> None:
    """A device five times faster than its neighbours covers five times the steps between two
    of their rounds, so its deltas are five times theirs, always: per step they are alike.
    Counted per delta, it was evicted; an attacker's deltas stay large per step."""
    g = torch.Generator().manual_seed(13)
    per_step, per_delta, t = AnomalyScore(), AnomalyScore(), 0.0
    for _ in range(50):
        t += 0.1
        deltas = {"a": noise(g, 1.0), "b": noise(g, 1.0), "f": noise(g, 6.0)}
        per_step.update(deltas, now=t, steps={"a": 1, "b": 1, "f": 6})
        per_delta.update(deltas, now=t)
    assert per_step.evicted() == frozenset()
    assert per_delta.evicted() == {"f"}
    for _ in range(10):
        t += 0.1
        deltas = {"a": noise(g, 1.0), "b": noise(g, 1.0), "f": noise(g, 60.0)}
        per_step.update(deltas, now=t, steps={"a": 1, "b": 1, "f": 1})
    assert per_step.evicted() == {"f"}


def test_an_evicted_neighbour_linked_again_is_still_out() -> None:
    """Members come and go, the graph moves, and an attacker's link closes and opens again: on
    a fresh score it pulled at an honest node with two neighbours for a second before it was
    evicted again (an e2e run's honest node ended at 0.84)."""
    g = torch.Generator().manual_seed(14)
    x = torch.randn(64, generator=g)
    honest = {p: (x + 0.01 * torch.randn(64, generator=g)).tolist() for p in "ab"}
    state = state_with(x.tolist(), {**honest, "z": (10 * x).tolist()})
    scores = NeighbourScores()
    peers = frozenset("abz")
    evicted: frozenset[str] = frozenset()
    for _ in range(30):
        tick(state)
        evicted = scores.update(state, peers)
    assert evicted == {"z"}
    scores.forget(frozenset("z"))  # the link closes; the replica goes with it
    state.forget("z")
    tick(state)
    assert scores.update(state, frozenset("ab")) == frozenset()
    state.admit("z")  # and opens again, with a new snapshot of the same 10x model
    state.receive_snapshot("z", 2, 0, 10 * x)
    tick(state)
    assert scores.update(state, peers) == {"z"}  # out at the first round, not a second later
