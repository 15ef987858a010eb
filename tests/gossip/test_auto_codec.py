"""``--compress auto``: a codec per link, chosen from what the link measures of itself.

The pieces the daemon and the simulator share: the link's meter (gossip/link_meter.py), which
times each codec's deltas from their answers alone; the choice kept per link, which measures
before it believes and probes what it has not measured (gossip/link_codecs.py ``LinkCodecs``);
the ``auto`` codec, which decodes each delta by the
codec it names; and the copy per link, whose replica stays bit-identical to it while the link
changes codec between any two deltas, with each pair mixing at one γ so the mean is kept.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gossip.clock import ManualClock
from gossip.codec_choice import phase_of
from gossip.codecs import AUTO_CODECS, AutoCodec, CodecError, get_codec
from gossip.link import Link as LinkMachine
from gossip.link import LinkConfig, SendDelta, SendSnapshot
from gossip.link_codecs import DRIFT, LinkCodecs
from gossip.link_meter import SAMPLES, LinkMeter
from gossip.messages import Delta
from gossip.mixing import MixConfig, Mixer
from gossip.replicas import GossipState
from node.config import DEFAULT_GAMMA, GossipConfig

DIM = 96
MLP = 85_000  # the digits MLP's values


class Link:
    """A link whose deltas each take ``took(codec)`` seconds, one after the other."""

    def __init__(self, took: dict[str, float]) -> None:
        self.meter = LinkMeter()
        self.took = took
        self.now = 0.0

    def carry(self, codec: str, n: int = SAMPLES) -> None:
        for _ in range(n):
            self.meter.sent(self.now, codec)
            self.now += self.took[codec]
            self.meter.answered(self.now)


#: A home uplink for the 85k-value MLP: a delta's time is its bytes at 1 Mbit/s.
HOME = {c: get_codec(c).encoded_nbytes(MLP) / 125e3 for c in AUTO_CODECS}


def test_the_meter_keeps_each_codecs_time_and_forgets_what_was_lost_or_is_old() -> None:
    link = Link({"int8": 0.5, "fp16": 0.2})
    link.carry("int8", 2)
    assert link.meter.delta_s("int8", link.now, 60.0) is None  # fewer than min_samples
    link.carry("int8", 1)
    assert link.meter.delta_s("int8", link.now, 60.0) == pytest.approx(0.5)
    link.carry("fp16")
    assert link.meter.delta_s("fp16", link.now, 60.0) == pytest.approx(0.2)
    assert link.meter.delta_s("int8", link.now, 60.0) == pytest.approx(0.5)
    assert link.meter.delta_s("int8", link.now + 61.0, 60.0) is None  # the link may have changed
    link.meter.sent(link.now, "int4")
    link.meter.lost()  # a resync: that delta will never be answered
    link.meter.answered(link.now + 5.0)
    assert link.meter.delta_s("int4", link.now + 5.0, 60.0) is None


def test_answers_that_arrive_bunched_count_as_the_interval_they_are() -> None:
    """Two acknowledgements in one read: the second comes a microsecond after the first. The
    first delta took the whole interval, the second almost none; each took half on average,
    which a rate of the second alone (50,000 times too fast) would not say."""
    meter = LinkMeter()
    for k in range(4):
        meter.sent(2.0 * k, "int8")
        meter.sent(2.0 * k, "int8")
        meter.answered(2.0 * k + 0.2)
        meter.answered(2.0 * k + 0.2 + 1e-6)
    assert meter.delta_s("int8", 8.0, 60.0) == pytest.approx(0.1, rel=1e-4)


def test_a_link_machine_meters_its_own_deltas_by_codec() -> None:
    link = LinkMachine(LinkConfig(), random.Random(0))
    cmd = link.poll(0.0)
    assert isinstance(cmd, SendSnapshot)
    link.snapshot_taken(cmd.epoch, 0, 0.0)
    link.snapshot_answered(cmd.epoch, 0.1)
    for k, codec in enumerate(["int4"] * 3 + ["fp16"] * 3):
        link.offer(Delta("a", 1, k + 1, 0, get_codec(codec, 32).encode(torch.randn(DIM)), 1))
        sent = link.poll(1.0 + k)
        assert isinstance(sent, SendDelta)
        link.acked(sent.epoch, 1.0 + k + (0.05 if codec == "int4" else 0.08))
    assert link.meter.delta_s("int4", 7.0, 60.0) == pytest.approx(0.05)
    assert link.meter.delta_s("fp16", 7.0, 60.0) == pytest.approx(0.08)


def test_a_link_where_bytes_set_the_pace_ends_on_the_smallest() -> None:
    codecs = LinkCodecs(MLP, initial="int8", memory_s=60.0, probe_s=20.0)
    home = Link(HOME)
    home.carry("int8")
    # One codec measured: the others in proportion to their bytes. sign needs 1.5x fp16's
    # rounds while training, int8 1.1x, on a seventh of int8's bytes: sign is best by far.
    assert codecs.update({"home": home.meter}, 0.002, home.now) == {"home": "sign"}
    home.carry("sign")
    assert codecs.update({"home": home.meter}, 0.002, home.now) == {"home": "sign"}
    # two codecs measured, on one line through zero: nothing left to probe
    home.now += 25.0
    assert codecs.update({"home": home.meter}, 0.002, home.now) == {"home": "sign"}


def test_once_training_is_over_a_slow_link_leaves_sign_for_fewer_rounds_to_agree() -> None:
    """While the node trains, a round of sign is worth nearly one of int8 (its error waits in
    x - x̂ for the next), and sign wins a home uplink by its bytes. Once training is over the
    job is closing the disagreement it left (settling), where sign needs 430 rounds to int4's
    12 (ROUNDS_TO_CONSENSUS): fewer bytes in all on int4. While its rounds are only heartbeats,
    the smallest codec: on a LAN too, where settling takes fp16."""
    # (trained, quiet): heartbeats only is quiet, during training (a byte budget) too
    phases = [
        phase_of(t, q) for t, q in [(False, False), (True, False), (True, True), (False, True)]
    ]
    assert phases == ["training", "settling", "quiet", "quiet"]
    home = Link(HOME)
    home.carry("sign")
    home.carry("int8")  # two codecs measured: a line of time against bytes
    per_link = LinkCodecs(MLP, memory_s=60.0)
    assert per_link.update({"home": home.meter}, 0.002, home.now) == {"home": "sign"}
    assert per_link.update({"home": home.meter}, 0.002, home.now, phase="settling") == {
        "home": "int4"
    }
    home.carry("int4")  # as ever, a link measures its codec before it changes again
    assert per_link.update({"home": home.meter}, 0.002, home.now) == {"home": "sign"}
    one = LinkCodecs(MLP, memory_s=60.0)
    assert one.update_all({"home": home.meter}, 0.002, home.now) == "sign"
    assert one.update_all({"home": home.meter}, 0.002, home.now, phase="settling") == "int4"
    # Quiet (only heartbeats): the smallest codec, on any link, measured or not.
    lan = Link(dict.fromkeys(AUTO_CODECS, 0.025))
    lan.carry("int8")
    lan.carry("sign")
    assert per_link.update({"lan": lan.meter}, 0.002, lan.now, phase="settling") == {"lan": "fp16"}
    assert per_link.update({"lan": lan.meter}, 0.002, lan.now, phase="quiet") == {"lan": "sign"}
    assert per_link.probing == {}
    assert (
        one.update_all({"home": home.meter, "lan": lan.meter}, 0.0, lan.now, phase="quiet")
        == "sign"
    )


def test_a_link_where_each_delta_pays_a_fixed_cost_settles_on_int8() -> None:
    """A loaded machine on a fast link: every delta takes 25 ms whatever its bytes. The bytes
    predict sign 7 times as fast as int8; measured, it is as slow, and its 1.5x rounds send
    the link back. fp16 would need 10% fewer rounds than int8, for twice the bytes: int8."""
    codecs = LinkCodecs(MLP, initial="int8", memory_s=60.0, probe_s=20.0)
    lan = Link(dict.fromkeys(AUTO_CODECS, 0.025))
    fresh = LinkMeter()
    lan.carry("int8")
    both = {"lan": lan.meter, "new": fresh}
    assert codecs.update(both, 0.002, lan.now) == {"lan": "sign", "new": "int8"}
    lan.carry("sign")
    assert codecs.update(both, 0.002, lan.now) == {"lan": "int8", "new": "int8"}
    lan.now += 20.0
    assert codecs.update(both, 0.002, lan.now) == {"lan": "int8", "new": "int8"}
    assert codecs.update({"lan": lan.meter}, 0.002, lan.now) == {"lan": "int8"}
    assert codecs.chosen == {"lan": "int8"}  # a link gone is forgotten
    # where bytes cost nothing and any gain counts, the fewest rounds win
    free = LinkCodecs(MLP, memory_s=60.0, frugal=1.0, hysteresis=1.0)
    assert free.update({"lan": lan.meter}, 0.002, lan.now) == {"lan": "fp16"}


def test_a_link_that_slows_down_moves_to_a_smaller_codec() -> None:
    codecs = LinkCodecs(MLP, initial="fp16")
    link = Link(dict.fromkeys(AUTO_CODECS, 0.025))
    link.carry("fp16")
    # One codec measured: the others in proportion to their bytes, so sign looks 14x faster...
    assert codecs.update({"l": link.meter}, 0.002, link.now) == {"l": "sign"}
    link.carry("sign")
    # ...until measured: the line through both is flat, a fixed cost, and int8 is within 15%
    # of fp16 on half its bytes.
    assert codecs.update({"l": link.meter}, 0.002, link.now) == {"l": "int8"}
    link.carry("int8")
    assert codecs.update({"l": link.meter}, 0.002, link.now) == {"l": "int8"}
    link.took = HOME  # shaped to 1 Mbit/s; the old measurements age out
    link.now += codecs.memory_s + 1.0
    link.carry("int8")
    assert codecs.update({"l": link.meter}, 0.002, link.now) == {"l": "sign"}
    link.carry("sign")
    assert codecs.update({"l": link.meter}, 0.002, link.now) == {"l": "sign"}
    with pytest.raises(ValueError, match="initial"):
        LinkCodecs(MLP, initial="topk")
    with pytest.raises(ValueError, match="frugal"):
        LinkCodecs(MLP, frugal=2.0)


def test_a_probe_that_lost_waits_twice_as_long_before_the_next() -> None:
    """On a slow link the probe's deltas are the larger codec's: each one that changes nothing
    makes the next wait longer."""
    codecs = LinkCodecs(MLP, memory_s=1.0, probe_s=5.0)
    home = Link(HOME)
    home.carry("sign")
    assert codecs.update({"h": home.meter}, 0.002, home.now) == {"h": "int4"}  # at once
    probed = home.now
    home.carry("int4", 3)
    assert codecs.update({"h": home.meter}, 0.002, home.now) == {"h": "sign"}  # it lost
    home.now = probed + 6.0  # int4's measurement is gone; 6 s is past probe_s, not past 10 s
    home.carry("sign")
    assert codecs.update({"h": home.meter}, 0.002, home.now) == {"h": "sign"}
    home.now = probed + 10.0
    home.carry("sign")
    assert codecs.update({"h": home.meter}, 0.002, home.now) == {"h": "int4"}
    home.carry("int4", 3)
    assert codecs.update({"h": home.meter}, 0.002, home.now) == {"h": "sign"}
    assert codecs._probe_gap == {"h": 20.0}
    assert codecs.update({}, 0.002, home.now) == {}
    # the link closed: nothing of it is kept
    assert not codecs._probe_gap
    assert not codecs._probing
    assert not codecs._probed_at


def test_a_link_keeps_what_it_learned_and_is_probed_again_only_when_it_changed() -> None:
    """A probe's deltas are the larger codec's: once a link has measured two codecs, the line
    through them predicts the others long after the measurements aged out, scaled to what the
    current codec takes now, until the link leaves it by more than DRIFT."""
    codecs = LinkCodecs(MLP, memory_s=10.0, probe_s=5.0)
    home = Link(HOME)
    home.carry("sign")
    assert codecs.update({"h": home.meter}, 0.002, home.now) == {"h": "int4"}  # at once
    home.carry("int4", 3)
    assert codecs.update({"h": home.meter}, 0.002, home.now) == {"h": "sign"}  # it lost
    for _ in range(5):  # a minute on, int4's time is long forgotten: no probe all the while
        home.now += 12.0
        home.carry("sign")
        assert codecs.update({"h": home.meter}, 0.002, home.now) == {"h": "sign"}
    home.took = {c: 1.5 * t for c, t in HOME.items()}  # a third slower: the same line, scaled
    home.now += 12.0
    home.carry("sign")
    assert codecs.update({"h": home.meter}, 0.002, home.now) == {"h": "sign"}
    assert "h" in codecs._lines
    home.took = {c: t / DRIFT / 2 for c, t in HOME.items()}  # unshaped: a changed link
    home.now += 12.0
    home.carry("sign")
    assert codecs.update({"h": home.meter}, 0.002, home.now) == {"h": "int4"}  # probed again
    assert "h" not in codecs._lines
    home.carry("int4", 3)
    codecs.update({"h": home.meter}, 0.002, home.now)
    assert "h" in codecs._lines  # the new line, learned from the probe
    assert codecs.update({}, 0.002, home.now) == {}
    assert not codecs._lines  # the link closed: its line goes with it


def test_one_codec_for_all_links_is_scored_by_the_slowest() -> None:
    """With one public copy (``--pace node``) a round is done when every link has carried it:
    one slow link sets the node's codec for all."""
    codecs = LinkCodecs(MLP, initial="int8", memory_s=60.0)
    lan, home, fresh = Link(dict.fromkeys(AUTO_CODECS, 0.025)), Link(HOME), LinkMeter()
    for link in (lan, home):
        link.carry("int8")
    now = max(lan.now, home.now)
    assert codecs.update_all({"lan": lan.meter, "new": fresh}, 0.002, now) == "sign"
    assert codecs.update_all({"new": fresh}, 0.002, now) == "sign"  # nothing measured: kept
    codecs = LinkCodecs(MLP, initial="int8", memory_s=60.0)
    lan.carry("sign")
    assert codecs.update_all({"lan": lan.meter}, 0.002, now) == "int8"
    assert codecs.update_all({"lan": lan.meter, "home": home.meter}, 0.002, now) == "sign"
    assert codecs.chosen == {LinkCodecs.ALL: "sign"}


def test_auto_decodes_what_each_delta_names_and_refuses_the_rest() -> None:
    auto = get_codec("auto", 32)
    assert isinstance(auto, AutoCodec)
    x = torch.randn(DIM)
    for name in AUTO_CODECS:
        member = get_codec(name, 32)
        gen = torch.Generator().manual_seed(3)
        made = member.compress(x, gen)
        assert torch.equal(auto.decode(made.encoded), made.value)
    with pytest.raises(CodecError, match="auto sends"):
        auto.validate(get_codec("topk", 32, fraction=0.25).encode(x))
    bad = get_codec("int4", 64).encode(x)  # another block size: the member's check still holds
    with pytest.raises(CodecError, match="block size"):
        auto.validate(bad)
    assert auto.encoded_nbytes(DIM) == get_codec("sign", 32).encoded_nbytes(DIM)


def auto_state(clock: ManualClock, x: torch.Tensor, session: int) -> GossipState:
    gen = torch.Generator().manual_seed(session)
    return GossipState(x, get_codec("auto", 32), clock, gen, session=session, per_link=True)


@settings(max_examples=25, deadline=None)
@given(
    picks=st.lists(st.sampled_from(AUTO_CODECS), min_size=1, max_size=30),
    seed=st.integers(0, 2**16),
)
def test_a_link_changes_codec_between_any_two_deltas_and_its_replica_stays_exact(
    picks: list[str], seed: int
) -> None:
    clock = ManualClock()
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(DIM, generator=gen)
    a, b = auto_state(clock, x, 1), auto_state(clock, torch.zeros(DIM), 2)
    a.set_peers(frozenset({"b"}))
    b.set_peers(frozenset({"a"}))
    seq, values = a.snapshot_for("b", x)
    b.receive_snapshot("a", 1, seq, values)
    for name in picks:
        x += torch.randn(DIM, generator=gen)
        a.set_link_codec("b", name)
        made = a.make_link_delta("b", x)
        assert made is not None
        assert made[1].codec == name
        b.receive_delta("a", 1, made[0], made[1])
        assert b.replicas["a"].codec == name
    assert torch.equal(b.replicas["a"].value, a.copies["b"].value)


def test_only_auto_with_a_copy_per_link_takes_a_codec_per_link() -> None:
    clock = ManualClock()
    plain = GossipState(torch.zeros(DIM), get_codec("int8", 32), clock, per_link=True)
    with pytest.raises(ValueError, match="only auto"):
        plain.set_link_codec("b", "int4")
    auto = auto_state(clock, torch.zeros(DIM), 1)
    with pytest.raises(CodecError, match="auto sends"):
        auto.set_link_codec("b", "topk")
    assert auto.codec_for("b").name == "sign"  # the initial, until the link is measured
    with pytest.raises(ValueError, match="one public copy"):
        auto.set_round_codec("int8")


def test_a_pair_of_codecs_mixes_at_the_smaller_gamma_and_keeps_the_mean() -> None:
    """a sends fp16 to b, b int4 to a: both ends mix the pair at int4's γ, so the sum of the
    two models is what it was, and the step is int4's, not fp16's."""
    clock = ManualClock()
    gen = torch.Generator().manual_seed(0)
    xa, xb = torch.randn(DIM, generator=gen), torch.randn(DIM, generator=gen) + 3
    total = xa + xb
    a, b = auto_state(clock, xa, 1), auto_state(clock, xb, 2)
    gammas = {c: DEFAULT_GAMMA[c] for c in AUTO_CODECS}
    cfg = MixConfig(gamma=1.0, silence_limit_s=1e9, link_gamma=gammas)
    ma, mb = Mixer(a, cfg), Mixer(b, cfg)
    ma.set_neighbours(frozenset({"b"}))
    mb.set_neighbours(frozenset({"a"}))
    for s, me, peer, x in ((a, "a", "b", xa), (b, "b", "a", xb)):
        seq, values = s.snapshot_for(peer, x)
        (b if s is a else a).receive_snapshot(me, s.session, seq, values)
    a.set_link_codec("b", "fp16")
    b.set_link_codec("a", "int4")
    gap = float((xa - xb).norm())
    for _ in range(30):
        ra, rb = ma.round(xa, ready={"b"}), mb.round(xb, ready={"a"})
        assert ra is not None
        assert rb is not None
        b.receive_delta("a", 1, *ra.links["b"])
        a.receive_delta("b", 2, *rb.links["a"])
    assert a.replicas["b"].codec == "int4"
    assert b.replicas["a"].codec == "fp16"
    assert float((xa + xb - total).norm()) < 0.05 * gap
    assert float((xa - xb).norm()) < gap
    # Before either had heard the other's codec both mixed at the smallest γ (a at fp16's
    # own 1.0 and b at int4's 0.5 would have moved the sum by a fifth of the gap); from then on
    # both ends use int4's.
    assert mb._pair_gamma("a", gammas) == ma._pair_gamma("b", gammas) == DEFAULT_GAMMA["int4"]


def test_auto_is_the_default_and_takes_each_codecs_gamma() -> None:
    assert GossipConfig().codec == "auto"
    assert GossipConfig().link_gamma == {c: DEFAULT_GAMMA[c] for c in AUTO_CODECS}
    auto = GossipConfig(codec="auto", pace="link")
    assert auto.step_size == 1.0
    assert auto.link_gamma == {c: DEFAULT_GAMMA[c] for c in AUTO_CODECS}
    fixed = GossipConfig(codec="auto", pace="link", gamma=0.3)
    assert fixed.step_size == 0.3
    assert fixed.link_gamma is None
    assert GossipConfig(codec="int8").link_gamma is None


@settings(max_examples=25, deadline=None)
@given(
    picks=st.lists(st.sampled_from(AUTO_CODECS), min_size=1, max_size=30),
    seed=st.integers(0, 2**16),
)
def test_one_public_copy_changes_codec_between_any_two_rounds_and_replicas_stay_exact(
    picks: list[str], seed: int
) -> None:
    """``auto`` with ``--pace node``: one codec a round for every link, x̂ and each
    neighbour's replica of it moving by the same decoded values."""
    clock = ManualClock()
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(DIM, generator=gen)
    a = GossipState(x, get_codec("auto", 32), clock, torch.Generator().manual_seed(1), session=1)
    others = {p: GossipState(torch.zeros(DIM), get_codec("auto", 32), clock) for p in "bc"}
    a.set_peers(frozenset(others))
    seq, values = a.snapshot()
    for state in others.values():
        state.set_peers(frozenset({"a"}))
        state.receive_snapshot("a", 1, seq, values)
    for name in picks:
        x += torch.randn(DIM, generator=gen)
        a.set_round_codec(name)
        assert {a.codec_for(p).name for p in others} == {name}
        seq, payload = a.make_delta(x)
        assert payload.codec == name
        for state in others.values():
            state.receive_delta("a", 1, seq, payload)
    for state in others.values():
        assert torch.equal(state.replicas["a"].value, a.public)
    with pytest.raises(CodecError, match="auto sends"):
        a.set_round_codec("topk")
    plain = GossipState(torch.zeros(DIM), get_codec("int8", 32), clock)
    with pytest.raises(ValueError, match="only auto"):
        plain.set_round_codec("int4")


def test_with_one_public_copy_a_pair_mixes_at_the_smaller_gamma_and_keeps_the_mean() -> None:
    """As with a copy per link: a's rounds go in fp16, b's in int4, and both ends mix the
    pair at int4's γ, so the sum of the two models stays."""
    clock = ManualClock()
    gen = torch.Generator().manual_seed(0)
    xa, xb = torch.randn(DIM, generator=gen), torch.randn(DIM, generator=gen) + 3
    total = xa + xb
    a = GossipState(xa, get_codec("auto", 32), clock, session=1)
    b = GossipState(xb, get_codec("auto", 32), clock, session=2)
    gammas = {c: DEFAULT_GAMMA[c] for c in AUTO_CODECS}
    cfg = MixConfig(gamma=1.0, silence_limit_s=1e9, link_gamma=gammas)
    ma, mb = Mixer(a, cfg), Mixer(b, cfg)
    ma.set_neighbours(frozenset({"b"}))
    mb.set_neighbours(frozenset({"a"}))
    b.receive_snapshot("a", 1, *a.snapshot())
    a.receive_snapshot("b", 2, *b.snapshot())
    a.set_round_codec("fp16")
    b.set_round_codec("int4")
    gap = float((xa - xb).norm())
    for _ in range(30):
        ra, rb = ma.round(xa), mb.round(xb)
        assert ra is not None
        assert rb is not None
        b.receive_delta("a", 1, ra.seq, ra.payload)
        a.receive_delta("b", 2, rb.seq, rb.payload)
    assert (a.replicas["b"].codec, b.replicas["a"].codec) == ("int4", "fp16")
    assert float((xa + xb - total).norm()) < 0.05 * gap
    assert float((xa - xb).norm()) < 0.1 * gap
    assert mb._pair_gamma("a", gammas) == ma._pair_gamma("b", gammas) == DEFAULT_GAMMA["int4"]
    # robust mixing clips every pull against one radius: it takes the smallest pair's γ
    robust = Mixer(a, MixConfig(gamma=1.0, silence_limit_s=1e9, link_gamma=gammas, robust=True))
    robust.set_neighbours(frozenset({"b"}))
    assert robust._robust_gamma({"b": 0.5}) == DEFAULT_GAMMA["int4"]
    assert robust._robust_gamma({}) == min(gammas.values())
