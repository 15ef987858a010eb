"""The replica/delta state machine: a replicated log of each neighbour's public copy."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from gossip.clock import ManualClock
from gossip.codecs import CodecError, Encoded, NonFiniteError, get_codec
from gossip.replicas import (
    GossipState,
    ImplausibleUpdate,
    SequenceGap,
    StaleSequence,
    UnknownPeer,
    UpdateGuard,
    agreeing_pair,
    relative_distance,
)

DIM = 300


def make_state(codec: str = "int8", seed: int = 0, session: int = 1) -> GossipState:
    x0 = torch.randn(DIM, generator=torch.Generator().manual_seed(seed))
    gen = torch.Generator().manual_seed(seed + 100)
    # fraction: the sparse codecs send 8 of each block of 64; the others ignore it.
    return GossipState(x0, get_codec(codec, 64, 0.125), ManualClock(), gen, session=session)


def drift(x: torch.Tensor, k: int) -> torch.Tensor:
    """A model that moves a little each round, as training would move it."""
    return x + 0.01 * torch.randn(DIM, generator=torch.Generator().manual_seed(1000 + k))


def snapshot_into(sender: GossipState, receiver: GossipState, peer: str = "s") -> None:
    seq, values = sender.snapshot()
    receiver.receive_snapshot(peer, sender.session, seq, values)


def fingerprint(state: GossipState) -> list[tuple[str, int, int, bytes]]:
    return [
        (peer, r.session, r.seq, r.value.numpy().tobytes())
        for peer, r in sorted(state.replicas.items())
    ]


@pytest.fixture
def pair() -> tuple[GossipState, GossipState]:
    sender, receiver = make_state(seed=0), make_state(seed=1, session=2)
    receiver.admit("s")
    return sender, receiver


def test_deltas_after_a_snapshot_keep_the_replica_bit_identical(
    pair: tuple[GossipState, GossipState],
) -> None:
    sender, receiver = pair
    snapshot_into(sender, receiver)
    x = sender.public.clone()
    for k in range(50):
        x = drift(x, k)
        seq, payload = sender.make_delta(x)
        assert receiver.receive_delta("s", sender.session, seq, payload) == seq
    assert torch.equal(receiver.replicas["s"].value, sender.public)


def test_a_delta_before_any_snapshot_asks_for_one(pair: tuple[GossipState, GossipState]) -> None:
    sender, receiver = pair
    seq, payload = sender.make_delta(drift(sender.public, 0))
    with pytest.raises(SequenceGap, match="a snapshot first") as info:
        receiver.receive_delta("s", sender.session, seq, payload)
    assert info.value.expected is None
    assert receiver.replicas == {}


def test_a_gap_is_refused_unchanged_and_a_snapshot_repairs_it(
    pair: tuple[GossipState, GossipState],
) -> None:
    sender, receiver = pair
    snapshot_into(sender, receiver)
    sender.make_delta(drift(sender.public, 0))  # lost on the way
    seq, payload = sender.make_delta(drift(sender.public, 1))
    before = fingerprint(receiver)
    with pytest.raises(SequenceGap, match="expected seq 1, got seq 2"):
        receiver.receive_delta("s", sender.session, seq, payload)
    assert fingerprint(receiver) == before
    snapshot_into(sender, receiver)
    assert torch.equal(receiver.replicas["s"].value, sender.public)


def test_replays_and_old_snapshots_are_stale(pair: tuple[GossipState, GossipState]) -> None:
    sender, receiver = pair
    snapshot_into(sender, receiver)
    seq1, p1 = sender.make_delta(drift(sender.public, 0))
    old_seq, old_values = sender.snapshot()
    receiver.receive_delta("s", sender.session, seq1, p1)
    seq2, p2 = sender.make_delta(drift(sender.public, 1))
    receiver.receive_delta("s", sender.session, seq2, p2)
    before = fingerprint(receiver)
    with pytest.raises(StaleSequence):
        receiver.receive_delta("s", sender.session, seq1, p1)
    with pytest.raises(StaleSequence):
        receiver.receive_snapshot("s", sender.session, old_seq, old_values)
    assert fingerprint(receiver) == before


def test_a_restarted_sender_starts_a_new_log(pair: tuple[GossipState, GossipState]) -> None:
    sender, receiver = pair
    snapshot_into(sender, receiver)
    for k in range(5):
        seq, payload = sender.make_delta(drift(sender.public, k))
        receiver.receive_delta("s", sender.session, seq, payload)
    reborn = make_state(seed=0, session=99)  # same node, new process: seq starts again at 0
    seq, payload = reborn.make_delta(drift(reborn.public, 0))
    with pytest.raises(SequenceGap):
        receiver.receive_delta("s", reborn.session, seq, payload)
    snapshot_into(reborn, receiver)  # seq 1 < 5, accepted because the session is new
    assert torch.equal(receiver.replicas["s"].value, reborn.public)


def test_unknown_and_forgotten_peers_are_refused(pair: tuple[GossipState, GossipState]) -> None:
    sender, receiver = pair
    seq, values = sender.snapshot()
    with pytest.raises(UnknownPeer):
        receiver.receive_snapshot("stranger", 5, seq, values)
    snapshot_into(sender, receiver)
    receiver.forget("s")
    assert receiver.replicas == {}
    seq, payload = sender.make_delta(drift(sender.public, 0))
    with pytest.raises(UnknownPeer):
        receiver.receive_delta("s", sender.session, seq, payload)


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda p: dataclasses.replace(p, numel=p.numel - 1),
        lambda p: dataclasses.replace(p, codec="int4"),
        lambda p: dataclasses.replace(p, block_size=128),
        lambda p: dataclasses.replace(p, data=p.data[:-1]),
        lambda p: dataclasses.replace(p, scales=b"\xff\xff\xff\x7f" + p.scales[4:]),
    ],
    ids=["length", "codec", "block-size", "truncated", "nan-scale"],
)
def test_malformed_deltas_change_nothing(
    pair: tuple[GossipState, GossipState], corrupt: object
) -> None:
    sender, receiver = pair
    snapshot_into(sender, receiver)
    seq, payload = sender.make_delta(drift(sender.public, 0))
    before = fingerprint(receiver)
    with pytest.raises(CodecError):
        receiver.receive_delta("s", sender.session, seq, corrupt(payload))  # type: ignore[operator]
    assert fingerprint(receiver) == before
    receiver.receive_delta("s", sender.session, seq, payload)  # the good one still applies
    assert torch.equal(receiver.replicas["s"].value, sender.public)


def _poke(payload: Encoded, position: int, value: bytes) -> Encoded:
    data = bytearray(payload.data)
    data[position : position + len(value)] = value
    return dataclasses.replace(payload, data=bytes(data))


@pytest.mark.parametrize(
    ("codec", "corrupt"),
    [
        ("topk", lambda p: _poke(p, 0, b"\x40")),  # index 64 of a block of 64
        ("topk", lambda p: _poke(p, 1, p.data[:1])),  # a repeated index
        ("topk", lambda p: _poke(p, len(p.data) - 2, b"\x80\x7f")),  # bfloat16 infinity
        ("randk", lambda p: _poke(p, len(p.data) - 2, b"\xc0\x7f")),  # bfloat16 NaN
        ("randk", lambda p: dataclasses.replace(p, data=p.data[8:])),  # no seed
        ("dct-topk", lambda p: _poke(p, len(p.data) - 1, b"\x80")),  # code -128
        ("dct-topk", lambda p: dataclasses.replace(p, scales=b"\0\0\x80\xbf" + p.scales[4:])),
    ],
    ids=["index", "repeat", "inf", "nan", "seedless", "code", "negative-scale"],
)
def test_malformed_sparse_deltas_change_nothing(codec: str, corrupt: object) -> None:
    sender, receiver = make_state(codec, seed=0), make_state(codec, seed=1, session=2)
    receiver.admit("s")
    snapshot_into(sender, receiver)
    seq, payload = sender.make_delta(drift(sender.public, 0))
    before = fingerprint(receiver)
    with pytest.raises(CodecError):
        receiver.receive_delta("s", sender.session, seq, corrupt(payload))  # type: ignore[operator]
    assert fingerprint(receiver) == before
    receiver.receive_delta("s", sender.session, seq, payload)
    assert torch.equal(receiver.replicas["s"].value, sender.public)


def test_snapshots_of_the_wrong_size_or_with_nan_are_refused(
    pair: tuple[GossipState, GossipState],
) -> None:
    _, receiver = pair
    with pytest.raises(CodecError, match="snapshot has 299 values"):
        receiver.receive_snapshot("s", 1, 0, torch.zeros(DIM - 1))
    bad = torch.zeros(DIM)
    bad[7] = float("nan")
    with pytest.raises(CodecError, match="non-finite"):
        receiver.receive_snapshot("s", 1, 0, bad)
    assert receiver.replicas == {}


def test_a_non_finite_model_sends_nothing() -> None:
    state = make_state()
    x = state.public.clone()
    x[3] = float("inf")
    with pytest.raises(NonFiniteError):
        state.make_delta(x)
    assert state.seq == 0


def test_consensus_step_by_hand() -> None:
    # x_i = 0, x̂_i = 1, x̂_a = 3, x̂_b = -1: pull = 0.25 (3 - 1) + 0.5 (-1 - 1) = -0.5.
    state = GossipState(torch.ones(4), get_codec("fp32"), ManualClock())
    for peer, value in (("a", 3.0), ("b", -1.0)):
        state.admit(peer)
        state.receive_snapshot(peer, 0, 0, torch.full((4,), value))
    state.admit("c")  # no replica yet: left out, its weight stays with x_i
    x = torch.zeros(4)
    state.consensus_step(x, 0.5, {"a": 0.25, "b": 0.5, "c": 0.25})
    assert torch.equal(x, torch.full((4,), -0.25))


def test_silence_is_measured_on_the_injected_clock() -> None:
    clock = ManualClock()
    state = GossipState(torch.zeros(4), get_codec("fp32"), clock)
    state.admit("a")
    assert state.silent_for("a") is None
    state.receive_snapshot("a", 0, 0, torch.zeros(4))
    clock.advance(2.5)
    assert state.silent_for("a") == 2.5


@pytest.mark.parametrize("codec", ["fp32", "int8", "int4", "sign", "topk", "randk", "dct-topk"])
@pytest.mark.parametrize("loss", [0.0, 0.1, 0.4])
@pytest.mark.parametrize("order", ["in-order", "duplicates", "reordered"])
@pytest.mark.parametrize("seed", [0, 1])
def test_replica_always_equals_the_senders_copy_at_its_seq(
    codec: str, loss: float, order: str, seed: int
) -> None:
    """A lossy, duplicating or reordering channel, repaired only by snapshots on a gap.

    Invariant: after every message the receiver accepts, its replica is bit-identical to the
    sender's public copy at the replica's sequence number.
    """
    rng = random.Random(seed)
    sender, receiver = make_state(codec, seed=seed), make_state(codec, seed=seed + 1, session=7)
    receiver.admit("s")
    history = {0: sender.public.clone()}
    snapshot_into(sender, receiver)
    x = sender.public.clone()
    in_flight: list[tuple[int, Encoded]] = []
    applied = snapshots = 0
    for k in range(80):
        x = drift(x, k)
        in_flight.append(sender.make_delta(x))
        history[sender.seq] = sender.public.clone()
        if order == "duplicates" and rng.random() < 0.3:
            in_flight.append(in_flight[-1])
        if order == "reordered" and len(in_flight) > 1 and rng.random() < 0.3:
            in_flight[-1], in_flight[-2] = in_flight[-2], in_flight[-1]
        while in_flight and rng.random() < 0.7:
            seq, payload = in_flight.pop(0)
            if rng.random() < loss:
                continue
            try:
                receiver.receive_delta("s", sender.session, seq, payload)
                applied += 1
            except StaleSequence:
                pass  # an old copy: nothing to do
            except SequenceGap:
                in_flight.clear()  # the link drops what it queued and resyncs
                snapshot_into(sender, receiver)
                snapshots += 1
            replica = receiver.replicas["s"]
            assert torch.equal(replica.value, history[replica.seq])
    assert applied >= 10  # the invariant was checked on real progress
    if loss == 0.0 and order == "in-order":
        assert snapshots == 0
        assert receiver.replicas["s"].seq + len(in_flight) == sender.seq


def test_a_delta_that_would_overflow_the_replica_changes_nothing() -> None:
    state = GossipState(torch.zeros(8), get_codec("fp32"), ManualClock())
    state.admit("a")
    big = torch.full((8,), 3e38)
    state.receive_snapshot("a", 1, 0, big)
    payload = get_codec("fp32").encode(torch.full((8,), 3e38))
    with pytest.raises(NonFiniteError, match="overflow"):
        state.receive_delta("a", 1, 1, payload)
    assert state.replicas["a"].seq == 0
    assert torch.equal(state.replicas["a"].value, big)


def guarded(consistency: float | None = None, seed: int = 1) -> GossipState:
    x0 = torch.randn(DIM, generator=torch.Generator().manual_seed(seed))
    guard = UpdateGuard(consistency=consistency)
    state = GossipState(x0, get_codec("fp32"), ManualClock(), session=seed, guard=guard)
    for peer in ("s", "t"):
        state.admit(peer)
    return state


def test_updates_that_would_move_a_replica_absurdly_far_change_nothing() -> None:
    state = guarded()
    near = state.public + 0.1 * torch.randn(DIM, generator=torch.Generator().manual_seed(7))
    state.receive_snapshot("s", 1, 0, near)
    assert 0 < state.largest_move < 0.2
    before = fingerprint(state)
    # A snapshot of 1e38 everywhere is finite; so is a delta of float32's largest steps.
    with pytest.raises(ImplausibleUpdate, match="times our model's norm"):
        state.receive_snapshot("t", 1, 0, torch.full((DIM,), 1e38))
    with pytest.raises(ImplausibleUpdate):
        state.receive_delta("s", 1, 1, get_codec("fp32").encode(torch.full((DIM,), 1e30)))
    assert fingerprint(state) == before
    # Honest drift applies.
    seq = state.receive_delta("s", 1, 1, get_codec("fp32").encode(0.01 * near))
    assert seq == 1


def test_the_bound_is_our_own_model_so_a_replica_cannot_walk_away_step_by_step() -> None:
    state = guarded()
    state.receive_snapshot("s", 1, 0, state.public.clone())
    step = get_codec("fp32").encode(state.public.clone())  # one whole norm a delta
    norm = float(state.public.norm())
    applied = 0
    for seq in range(1, 100):
        try:
            state.receive_delta("s", 1, seq, step)
        except ImplausibleUpdate:
            break
        applied += 1
    # It walked as far as the bound and no further, however small each step.
    assert applied == int(UpdateGuard().max_distance)
    distance = float((state.replicas["s"].value - state.public).norm()) / norm
    assert distance <= UpdateGuard().max_distance


def test_a_model_near_zero_is_judged_against_a_floor() -> None:
    state = GossipState(torch.zeros(DIM), get_codec("fp32"), ManualClock(), guard=UpdateGuard())
    state.admit("s")
    state.receive_snapshot("s", 1, 0, torch.full((DIM,), 0.1))  # ten times the floor of 0.01
    with pytest.raises(ImplausibleUpdate):
        state.receive_snapshot("s", 1, 1, torch.full((DIM,), 1.0))


def test_with_robust_mixing_a_snapshot_must_agree_with_a_second_member() -> None:
    state = guarded(consistency=1.0)
    far = state.public * 10  # a scaled model: within the absurd bound, but no one's
    # With no other neighbour to agree with, only the absurd bound applies.
    state.receive_snapshot("s", 1, 0, far)
    state.forget("s")
    state.admit("s")
    honest = state.public + 0.05 * torch.randn(DIM, generator=torch.Generator().manual_seed(8))
    state.receive_snapshot("t", 1, 0, honest)
    with pytest.raises(ImplausibleUpdate, match="other neighbours"):
        state.receive_snapshot("s", 1, 0, far)
    assert "s" not in state.replicas
    # A model far from ours but near another neighbour's is consistent (we are the odd one).
    state.public.mul_(-1)
    state.receive_snapshot("s", 1, 0, honest + 0.01)
    # Without robust mixing the scaled model is taken: it is not absurd.
    plain = guarded()
    plain.receive_snapshot("t", 1, 0, honest)
    plain.receive_snapshot("s", 1, 0, far)


def test_pulled_models_are_adopted_only_once_two_agree() -> None:
    x = torch.randn(DIM, generator=torch.Generator().manual_seed(3))
    near = x + 0.02 * torch.randn(DIM, generator=torch.Generator().manual_seed(4))
    poisons = [torch.full((DIM,), 1e38), 10 * x, -x]
    for poison in poisons:
        assert agreeing_pair([poison, x]) is None
        assert agreeing_pair([poison, x, near]) == (1, 2)
        assert agreeing_pair([x, poison, near]) == (0, 2)
    assert agreeing_pair([x, near]) == (0, 1)
    assert agreeing_pair([x]) is None
    assert relative_distance(x, x) == 0.0


def test_a_mix_is_the_same_whatever_order_the_weights_come_in() -> None:
    """Float sums depend on their order, and a dict built from a set follows the process's
    string hashing: the mix sums in the order of the neighbours' ids, so one seed gives one
    model in every process."""
    peers = [f"peer-{k}" for k in range(12)]
    results = []
    for order in (peers, peers[::-1], random.Random(5).sample(peers, len(peers))):
        state = make_state()
        state.set_peers(frozenset(peers))
        for k, peer in enumerate(peers):
            values = torch.randn(DIM, generator=torch.Generator().manual_seed(50 + k)) * 1e3
            state.receive_snapshot(peer, 1, 0, values, degree=3)
        x = state.public.clone()
        weights = {peer: 1 / (3 + k) for k, peer in ((peers.index(p), p) for p in order)}
        state.consensus_step(x, 0.8, weights)
        results.append(x.numpy().tobytes())
    assert results[0] == results[1] == results[2]
