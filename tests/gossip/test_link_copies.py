"""A public copy per link (GossipState ``per_link``, the Mixer's link rounds): ``--pace link``.

Each link keeps its own copy x̂_ij, so a link that cannot carry a round keeps its unsent change
for its next delta while the others go on; what is checked here is what the daemon and the
simulator both rely on: replicas stay bit-identical per link, a snapshot's seq is never stale
for a neighbour that kept an older replica, a slow link's one delta carries many rounds' change,
the mix uses each link's copy and leaves out links that exchanged nothing, and a swarm whose
links run at very different paces still agrees, with the mean kept.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gossip.clock import ManualClock
from gossip.codecs import get_codec
from gossip.mixing import MixConfig, Mixer
from gossip.replicas import GossipState

DIM = 96


def per_link(clock: ManualClock, x: torch.Tensor, codec: str = "int8") -> GossipState:
    gen = torch.Generator().manual_seed(7)
    return GossipState(x, get_codec(codec, 32), clock, gen, session=1, per_link=True)


def plain(clock: ManualClock, x: torch.Tensor) -> GossipState:
    return GossipState(x, get_codec("int8", 32), clock, session=2)


def link_up(
    sender: GossipState, me: str, receiver: GossipState, peer: str, x: torch.Tensor
) -> None:
    seq, values = sender.snapshot_for(peer, x)
    receiver.receive_snapshot(me, sender.session, seq, values, degree=2)


@settings(max_examples=25, deadline=None)
@given(
    schedule=st.lists(st.sets(st.sampled_from(["b", "c"])), min_size=1, max_size=30),
    seed=st.integers(0, 2**16),
)
def test_each_links_replica_stays_bit_identical_to_its_copy(
    schedule: list[set[str]], seed: int
) -> None:
    clock = ManualClock()
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(DIM, generator=gen)
    a = per_link(clock, x)
    a.set_peers(frozenset({"b", "c"}))
    others = {p: plain(clock, torch.zeros(DIM)) for p in ("b", "c")}
    for p, s in others.items():
        s.set_peers(frozenset({"a"}))
        link_up(a, "a", s, p, x)
    for ready in schedule:  # the links that carry this round: any mix of paces
        x += torch.randn(DIM, generator=gen)
        for p in sorted(ready):
            made = a.make_link_delta(p, x)
            assert made is not None
            others[p].receive_delta("a", 1, made[0], made[1])
    for p, s in others.items():
        assert torch.equal(s.replicas["a"].value, a.copies[p].value)
        assert s.replicas["a"].seq == a.copies[p].seq


def test_a_reopened_links_snapshot_is_newer_than_any_replica_kept_of_it() -> None:
    clock = ManualClock()
    x = torch.randn(DIM)
    a, b = per_link(clock, x), plain(clock, torch.zeros(DIM))
    a.set_peers(frozenset({"b", "c"}))
    b.set_peers(frozenset({"a"}))
    link_up(a, "a", b, "b", x)
    a.snapshot_for("c", x)
    for _ in range(5):
        made = a.make_link_delta("c", x + 1)  # another link's deltas raise the mark too
        assert made is not None
    made = a.make_link_delta("b", x)
    assert made is not None
    b.receive_delta("a", 1, *made)
    kept = b.replicas["a"].seq
    a.set_peers(frozenset({"c"}))  # the view drops b: its copy goes; b keeps its replica
    assert "b" not in a.copies
    a.set_peers(frozenset({"b", "c"}))
    seq, values = a.snapshot_for("b", x)
    assert seq > kept
    b.receive_snapshot("a", 1, seq, values)  # not refused as stale
    made = a.make_link_delta("b", x + 2)
    assert made is not None
    assert made[0] == seq + 1
    b.receive_delta("a", 1, *made)  # and the link's deltas follow it


def test_a_link_that_sent_nothing_for_rounds_sends_their_change_in_one_delta() -> None:
    clock = ManualClock()
    x = torch.zeros(DIM)
    a = per_link(clock, x, codec="fp32")
    a.set_peers(frozenset({"fast", "slow"}))
    a.snapshot_for("fast", x)
    a.snapshot_for("slow", x)
    step = torch.linspace(-1, 1, DIM)
    for _ in range(10):
        x += step
        assert a.make_link_delta("fast", x) is not None
    assert torch.equal(a.copies["fast"].value, x)
    assert torch.equal(a.copies["slow"].value, torch.zeros(DIM))  # it kept all ten
    made = a.make_link_delta("slow", x)
    assert made is not None
    assert made[0] == a.copies["slow"].seq
    assert torch.equal(a.copies["slow"].value, x)  # one delta carried the ten rounds


def test_the_mix_uses_each_links_copy_and_only_links_that_exchanged() -> None:
    clock = ManualClock()
    x = torch.zeros(DIM)
    a = per_link(clock, x, codec="fp32")
    mixer = Mixer(a, MixConfig(gamma=1.0, silence_limit_s=30.0))
    mixer.set_neighbours(frozenset({"b", "c"}))
    a.snapshot_for("b", x)
    a.snapshot_for("c", x)
    a.receive_snapshot("b", 1, 0, torch.full((DIM,), 3.0), degree=2)
    a.receive_snapshot("c", 1, 0, torch.full((DIM,), -6.0), degree=2)
    made = mixer.round(x, ready={"b"})  # c's link is busy
    assert made is not None
    assert set(made.links) == {"b"}
    assert made.weights == {"b": 1 / 3}
    assert torch.allclose(x, torch.full((DIM,), 1.0))  # toward b only, by w (3 - 0)
    made = mixer.round(x, ready={"b"})
    assert made is not None
    assert made.weights == {}  # b sent nothing new: its stale difference is not applied again
    assert torch.allclose(x, torch.full((DIM,), 1.0))
    made = mixer.round(x, ready={"b", "c"})
    assert made is not None
    assert made.weights == {"c": 1 / 3}
    # The mix comes before this round's delta: it uses x̂_ac = 0, the copy c holds, not the
    # x = 1 that the delta is about to carry.
    assert torch.allclose(x, torch.full((DIM,), 1.0 + (-6.0 - 0.0) / 3))
    assert torch.equal(a.copies["c"].value, x)  # and the delta then carries the mixed x
    assert mixer.round(x, ready=set()) is None  # no link can carry a round


def test_a_copy_per_link_refuses_robust_mixing() -> None:
    clock = ManualClock()
    with pytest.raises(ValueError, match="per link"):
        Mixer(per_link(clock, torch.zeros(DIM)), MixConfig(robust=True))


@pytest.mark.parametrize("slow_every", [1, 7])
def test_links_at_different_paces_still_agree_and_keep_the_mean(slow_every: int) -> None:
    """A ring of eight over int8, each link carrying a delta each way whenever it is ready:
    the links of node 0 are ready only every ``slow_every``-th round (a slow uplink). The
    fast links never wait for them; the swarm still agrees, about its starting mean."""
    clock = ManualClock()
    n = 8
    ids = [f"n{i}" for i in range(n)]
    gen = torch.Generator().manual_seed(1)
    xs = {i: torch.randn(DIM, generator=gen) * 2 + k for k, i in enumerate(ids)}
    mean0 = torch.stack(list(xs.values())).mean(0)
    states = {i: per_link(clock, xs[i]) for i in ids}
    mixers = {i: Mixer(states[i], MixConfig(gamma=0.6, silence_limit_s=1e9)) for i in ids}
    nbrs = {ids[k]: {ids[(k - 1) % n], ids[(k + 1) % n]} for k in range(n)}
    for i in ids:
        mixers[i].set_neighbours(frozenset(nbrs[i]))
    for i in ids:
        for j in nbrs[i]:
            link_up(states[i], i, states[j], j, xs[i])
    spread0 = float(torch.stack(list(xs.values())).std(0).mean())
    sent: dict[tuple[str, str], int] = {}
    for r in range(400):
        made = {}
        for i in ids:
            ready = {j for j in nbrs[i] if "n0" not in (i, j) or r % slow_every == 0}
            made[i] = mixers[i].round(xs[i], ready=ready)
        for i, m in made.items():
            if m is None:
                continue
            for j, (seq, payload) in m.links.items():
                states[j].receive_delta(i, 1, seq, payload, degree=2)
                sent[(i, j)] = sent.get((i, j), 0) + 1
        clock.advance(0.1)
    spread = float(torch.stack(list(xs.values())).std(0).mean())
    assert spread < 1e-2 * spread0
    drift = float((torch.stack(list(xs.values())).mean(0) - mean0).abs().max())
    assert drift < 0.05 * spread0
    assert sent[("n1", "n2")] == 400  # n1's fast link kept its pace beside its slow one
    assert sent[("n1", "n0")] == -(-400 // slow_every)
