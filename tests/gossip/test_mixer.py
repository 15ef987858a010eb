"""A node's rounds (gossip/mixing.py's Mixer): plain, robust, an attacker's, with the outer step.

The daemon's gossip worker and the simulator both make their rounds with it, so what is checked
here is what both do: a plain round is CHOCO-Gossip's, a robust one resists a neighbour that
publishes a harmful model, an attacker publishes it, the outer step applies, and only a round
(never a read of the weights) decides who is out of the mix.
"""

from __future__ import annotations

import pytest
import torch

from gossip.choco import mix_and_send
from gossip.clock import ManualClock
from gossip.codecs import get_codec
from gossip.mixing import MixConfig, Mixer
from gossip.outer import OuterNesterov
from gossip.replicas import GossipState

DIM = 64


def state(clock: ManualClock, x: torch.Tensor, codec: str = "int8") -> GossipState:
    return GossipState(x, get_codec(codec, 32), clock, torch.Generator().manual_seed(3), session=1)


def test_a_plain_round_is_mix_and_send_exactly() -> None:
    clock = ManualClock()
    x0 = torch.randn(DIM, generator=torch.Generator().manual_seed(0))
    pulls = {
        p: torch.randn(DIM, generator=torch.Generator().manual_seed(i)) for i, p in enumerate("abc")
    }
    runs = []
    for use_mixer in (True, False):
        s, x = state(clock, x0), x0.clone()
        s.set_peers(frozenset(pulls))
        for p, v in pulls.items():
            s.receive_snapshot(p, 1, 0, v, degree=2)
        if use_mixer:
            made = Mixer(s, MixConfig(gamma=0.8, silence_limit_s=5.0)).round(x)
            assert made is not None
            seq, payload = made.seq, made.payload
            assert made.weights == {p: 1 / 4 for p in pulls}
        else:
            seq, payload = mix_and_send(s, x, 0.8, frozenset(pulls), 5.0)
        runs.append((seq, payload, x, s.public.clone()))
    (seq1, pay1, x1, pub1), (seq2, pay2, x2, pub2) = runs
    assert (seq1, pay1) == (seq2, pay2)
    assert torch.equal(x1, x2)
    assert torch.equal(pub1, pub2)


def test_only_a_round_decides_who_is_out_of_the_mix_for_silence() -> None:
    clock = ManualClock()
    s = state(clock, torch.zeros(DIM))
    s.set_peers(frozenset({"a", "b"}))
    s.receive_snapshot("a", 1, 0, torch.ones(DIM))
    s.receive_snapshot("b", 1, 0, torch.ones(DIM))
    mixer = Mixer(s, MixConfig(gamma=1.0, silence_limit_s=5.0))
    x = torch.zeros(DIM)
    clock.advance(6.0)
    s.receive_snapshot("a", 1, 1, torch.ones(DIM))  # a speaks; b stays silent
    for _ in range(3):
        assert mixer.weights() == {"a": 1 / 3}  # a read sees b is out...
    assert mixer.silenced == frozenset()  # ...and changes nothing
    made = mixer.round(x)
    assert made is not None
    assert made.went_silent == {"b": 6.0}
    assert mixer.silenced == {"b"}
    s.receive_snapshot("b", 1, 1, torch.ones(DIM))
    assert mixer.silenced == {"b"}  # until the next round finds it speaking
    made = mixer.round(x)
    assert made is not None
    assert made.spoke_again == {"b"}
    assert mixer.silenced == frozenset()


@pytest.mark.parametrize("attack", ["scale", "flip", "random"])
def test_an_attacker_publishes_its_target_and_does_not_mix(attack: str) -> None:
    clock = ManualClock()
    x = torch.full((DIM,), 2.0)
    s = state(clock, torch.zeros(DIM), codec="fp32")
    s.set_peers(frozenset({"a"}))
    s.receive_snapshot("a", 1, 0, torch.full((DIM,), 100.0))
    made = Mixer(s, MixConfig(attack=attack)).round(x)
    assert made is not None
    assert made.weights == {}
    assert torch.equal(x, torch.full((DIM,), 2.0))  # it did not mix
    want = {"scale": 20.0, "flip": -2.0}
    if attack in want:
        assert torch.equal(s.public, torch.full((DIM,), want[attack]))  # fp32: exactly
    else:
        assert 0.5 < float((s.public - x).std()) < 1.5  # unit Gaussian noise around x


def run_swarm(robust: bool, rounds: int = 40) -> tuple[dict[str, Mixer], dict[str, torch.Tensor]]:
    """Five nodes, all neighbours of all, each stepping a little before each round (so their
    deltas keep coming); z publishes ten times its model."""
    clock = ManualClock()
    ids = ["a", "b", "c", "d", "z"]
    gen = torch.Generator().manual_seed(0)
    xs = {i: torch.randn(DIM, generator=gen) + 1 for i in ids}
    states = {i: state(clock, xs[i]) for i in ids}
    mixers = {
        i: Mixer(states[i], MixConfig(0.8, 30.0, robust, attack="scale" if i == "z" else None))
        for i in ids
    }
    for i in ids:
        mixers[i].set_neighbours(frozenset(ids) - {i})
        for j in ids:
            if j != i:
                seq, values = states[j].snapshot()
                states[i].receive_snapshot(j, 1, seq, values, degree=4)
    for _ in range(rounds):
        for i in ids:
            xs[i] += 0.05 * torch.randn(DIM, generator=gen)
        made = {i: mixers[i].round(xs[i]) for i in ids}
        for i, r in made.items():
            assert r is not None
            for j in ids:
                if j != i:
                    states[j].receive_delta(i, 1, r.seq, r.payload, degree=4)
        clock.advance(0.1)
    return mixers, xs


def test_robust_rounds_evict_and_clip_the_attacker_and_plain_ones_follow_it() -> None:
    robust, rx = run_swarm(robust=True)
    plain, px = run_swarm(robust=False)
    honest = ["a", "b", "c", "d"]
    assert all(robust[i].evicted == {"z"} for i in honest)
    assert all("z" not in robust[i].weights() for i in honest)
    assert all(plain[i].evicted == frozenset() for i in honest)
    start = 1.0  # the honest models start around 1
    assert max(float(rx[i].mean()) for i in honest) < 2 * start
    assert min(float(px[i].mean()) for i in honest) > 3 * start  # dragged toward z's 10x


def one_neighbour(outer: OuterNesterov | None, gamma: float = 0.5) -> tuple[Mixer, GossipState]:
    """A node at zero whose one neighbour, ``a``, sits at one (fp32: copies are exact)."""
    s = state(ManualClock(), torch.zeros(DIM), codec="fp32")
    s.set_peers(frozenset({"a"}))
    s.receive_snapshot("a", 1, 0, torch.ones(DIM))
    return Mixer(s, MixConfig(gamma=gamma, silence_limit_s=5.0), outer), s


def test_the_outer_step_is_the_identity_at_lr_one() -> None:
    def after_rounds(outer: OuterNesterov | None) -> torch.Tensor:
        mixer, _ = one_neighbour(outer)
        x = torch.zeros(DIM)
        for k in range(3):
            x += 0.1 * (k + 1)  # some local steps
            mixer.round(x)
        return x

    plain = after_rounds(None)
    assert torch.equal(after_rounds(OuterNesterov(1.0, 0.0)), plain)
    assert not torch.allclose(after_rounds(OuterNesterov(0.7, 0.9)), plain)


def test_the_outer_step_moves_the_local_change_and_leaves_the_mix_alone() -> None:
    """No local steps at all: the rounds only mix, and the outer step must not amplify that
    (its momentum on the mix is what made swarms diverge)."""

    def after_rounds(outer: OuterNesterov | None) -> torch.Tensor:
        mixer, _ = one_neighbour(outer)
        x = torch.zeros(DIM)
        for _ in range(4):
            mixer.round(x)
        return x

    assert torch.equal(after_rounds(OuterNesterov(0.7, 0.9)), after_rounds(None))

    # one local step of +1 between the first two rounds: the outer step makes it
    # 0.7 * (1 + 0.9) = 1.33 before the mix pulls the model halfway to the neighbour's 1
    mixer, _ = one_neighbour(OuterNesterov(0.7, 0.9), gamma=1.0)
    x = torch.zeros(DIM)
    mixer.round(x)  # sets the anchor, then mixes
    mixed = x.clone()
    x += 1.0
    made = mixer.round(x)
    assert made is not None
    w = made.weights["a"]
    public = mixed  # x̂ as the neighbour holds it: the last round's delta (fp32, exact)
    expected = mixed + 1.33 + w * (torch.ones(DIM) - public)
    assert torch.allclose(x, expected, atol=1e-5)
    assert mixer.state.public.equal(x)  # and this round's delta then carries all of it


def test_dropping_a_neighbour_drops_its_replica_and_its_decisions_but_not_its_score() -> None:
    """The score outlives the link: an attacker the graph links again is still out
    (tests/gossip/test_robust.py has the round that follows)."""
    mixers, _ = run_swarm(robust=True, rounds=20)
    a = mixers["a"]
    assert a.evicted == {"z"}
    assert a.set_neighbours(frozenset({"b", "c"})) == {"d", "z"}
    assert a.evicted == frozenset()
    assert set(a.state.replicas) == {"b", "c"}
    assert a.scores is not None
    assert a.scores.anomaly.scores["z"] > a.scores.anomaly.threshold


def test_config_refuses_what_cannot_mix() -> None:
    with pytest.raises(ValueError, match="unknown attack"):
        MixConfig(attack="bribe")
    with pytest.raises(ValueError, match="gamma"):
        MixConfig(gamma=0.0)


@pytest.mark.parametrize("per_link", [False, True])
def test_the_swarms_mean_moves_by_all_of_its_training(per_link: bool) -> None:
    """Eight nodes on a ring, each taking a local step of its own before every round, every
    delta arriving before the next round (as the pacing has it). The mix uses the copies as
    both ends hold them, so the mean moves by exactly the steps taken. Mixing against the
    copy this round's delta carries, which the neighbours did not have yet, took back
    γ Σ_j w_ij = 2/3 of each step: the mean moved at 1 / (1 + 2/3) = 0.6 of the steps."""
    clock = ManualClock()
    ids = [f"n{k}" for k in range(8)]
    gen = torch.Generator().manual_seed(1)
    xs = {i: torch.randn(DIM, generator=gen) for i in ids}
    steps = {i: torch.randn(DIM, generator=gen) for i in ids}
    states = {
        i: GossipState(xs[i], get_codec("fp32", 32), clock, session=1, per_link=per_link)
        for i in ids
    }
    ring = {i: frozenset({ids[k - 1], ids[(k + 1) % 8]}) for k, i in enumerate(ids)}
    mixers = {i: Mixer(states[i], MixConfig(1.0, 1e9)) for i in ids}
    for i in ids:
        mixers[i].set_neighbours(ring[i])
    for i in ids:
        for j in ring[i]:
            seq, values = states[i].snapshot_for(j, xs[i])
            states[j].receive_snapshot(i, 1, seq, values, degree=2)
    mean0 = torch.stack(list(xs.values())).mean(0)
    rounds = 30
    for _ in range(rounds):
        for i in ids:
            xs[i] += 0.1 * steps[i]
        made = {i: mixers[i].round(xs[i], ready=ring[i]) for i in ids}
        for i, r in made.items():
            assert r is not None
            for j in ring[i]:
                seq, payload = r.links[j] if per_link else (r.seq, r.payload)
                states[j].receive_delta(i, 1, seq, payload, degree=2)
        clock.advance(0.1)
    moved = torch.stack(list(xs.values())).mean(0) - mean0
    trained = rounds * 0.1 * torch.stack(list(steps.values())).mean(0)
    assert torch.allclose(moved, trained, atol=1e-4), float((moved - trained).abs().max())
    spread = torch.stack(list(xs.values())).std(0).mean()
    assert float(spread) < float(torch.stack(list(steps.values())).std(0).mean())  # and it mixes
