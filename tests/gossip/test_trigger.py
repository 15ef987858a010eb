"""The event-triggered rule (gossip/trigger.py) on two real Mixers whose deltas are delivered by
hand: it never throttles a training node, falls quiet once the models agree, answers real news,
keeps its heartbeat on an injected clock, and a skipped round leaves the replicated log intact."""

from __future__ import annotations

import pytest
import torch

from gossip.clock import ManualClock
from gossip.codecs import get_codec
from gossip.mixing import MixConfig, Mixer
from gossip.replicas import GossipState
from gossip.trigger import TriggerConfig
from node.config import GossipConfig

N = 512
TICK_S = 0.1  # the daemon's idle round interval


class Pair:
    """Two nodes, a and b, each the other's only neighbour, over int8 with error feedback."""

    def __init__(self, trigger: TriggerConfig | None, silence_limit_s: float = 30.0) -> None:
        self.clock = ManualClock()
        torch.manual_seed(0)
        start = torch.randn(N)
        self.x = {"a": start.clone(), "b": start.clone()}
        self.mixers: dict[str, Mixer] = {}
        for me, other in (("a", "b"), ("b", "a")):
            rounding = torch.Generator().manual_seed(hash(me) % 1000)
            state = GossipState(self.x[me], get_codec("int8", 256), self.clock, rounding)
            state.set_peers(frozenset({other}))
            self.mixers[me] = Mixer(state, MixConfig(0.8, silence_limit_s, trigger=trigger))
        for me, other in (("a", "b"), ("b", "a")):
            seq, values = self.mixers[other].state.snapshot()
            self.mixers[me].state.receive_snapshot(other, 0, seq, values, degree=1)
        self.reasons: dict[str, list[str]] = {"a": [], "b": []}

    def round(self, me: str) -> str | None:
        """One round of ``me``, its delta applied to the other's replica; the reason or None."""
        other = "b" if me == "a" else "a"
        made = self.mixers[me].round(self.x[me])
        if made is None:
            return None
        self.mixers[other].state.receive_delta(me, 0, made.seq, made.payload, degree=1)
        self.reasons[me].append(made.reason)
        return made.reason

    def tick(self, train_lr: float = 0.0) -> None:
        """TICK_S passes; each node takes a step of SGD-like noise if training, then a round."""
        self.clock.advance(TICK_S)
        for me in ("a", "b"):
            if train_lr:
                self.x[me] -= train_lr * torch.randn(N)
            self.round(me)

    def replicas_exact(self) -> bool:
        a, b = self.mixers["a"].state, self.mixers["b"].state
        return torch.equal(a.replicas["b"].value, b.public) and torch.equal(
            b.replicas["a"].value, a.public
        )


def test_a_training_node_makes_every_round() -> None:
    pair = Pair(TriggerConfig())
    for lr in [0.01] * 100 + [0.002] * 100:  # a learning rate that drops five-fold too
        pair.tick(train_lr=lr)
    for me in ("a", "b"):
        trigger = pair.mixers[me].trigger
        assert trigger is not None
        assert trigger.stats.skipped == 0
        assert len(pair.reasons[me]) == 200
        assert set(pair.reasons[me]) <= {"first", "movement"}


def test_a_jump_of_the_model_does_not_hold_back_the_training_rounds_after_it() -> None:
    pair = Pair(TriggerConfig())
    for _ in range(50):
        pair.tick(train_lr=0.01)
    pair.x["a"] += 10.0 * torch.randn(N)  # a rollback, say: a thousand steps' worth at once
    for _ in range(50):
        pair.tick(train_lr=0.01)
    trigger = pair.mixers["a"].trigger
    assert trigger is not None
    assert trigger.stats.skipped == 0


def test_once_training_stops_the_swarm_falls_quiet_to_the_heartbeat() -> None:
    pair = Pair(TriggerConfig(heartbeat_s=5.0))
    for _ in range(100):
        pair.tick(train_lr=0.01)
    made_when_trained = len(pair.reasons["a"])
    training_was_quiet = pair.mixers["a"].quiet
    assert not training_was_quiet  # its last round was training's
    for _ in range(int(10.0 / TICK_S)):  # ten seconds to settle
        pair.tick()
    settled = len(pair.reasons["a"])
    for _ in range(int(60.0 / TICK_S)):
        pair.tick()
    quiet = pair.reasons["a"][settled:]
    assert quiet == ["heartbeat"] * 12  # a minute at one round per 5 s, nothing else
    assert pair.mixers["a"].quiet  # what --compress auto then sends with its smaller codec
    # It settled in a few rounds, not in the 100 a timer would have made.
    assert settled - made_when_trained < 30
    assert pair.replicas_exact()
    distance = float(torch.linalg.vector_norm(pair.x["a"] - pair.x["b"]))
    trigger = pair.mixers["a"].trigger
    assert trigger is not None
    assert distance < trigger.movement  # closer than one training round moves a model


def test_news_from_a_neighbour_makes_a_round_and_a_tiny_change_does_not() -> None:
    pair = Pair(TriggerConfig(heartbeat_s=5.0))
    for _ in range(50):
        pair.tick(train_lr=0.01)
    for _ in range(30):
        pair.tick()
    pair.clock.advance(TICK_S)
    assert pair.round("a") is None  # quiet
    pair.x["b"] += 1e-6 * torch.randn(N)  # far below the threshold
    assert pair.round("b") is None
    pair.x["b"] += 0.05 * torch.randn(N)  # b moves: a step of training, say
    assert pair.round("b") == "movement"
    assert pair.round("a") == "news"  # a's replica of b changed enough to move a
    assert pair.replicas_exact()


def test_the_heartbeat_keeps_its_schedule_and_a_third_of_the_silence_limit() -> None:
    pair = Pair(TriggerConfig(heartbeat_s=2.0))
    assert pair.round("a") == "first"
    times = []
    for _ in range(80):
        pair.clock.advance(0.125)  # exact in binary, so the schedule is too
        if pair.round("a") is not None:
            times.append(round(pair.clock.now(), 6))
    assert times == [2.0, 4.0, 6.0, 8.0, 10.0]
    # A heartbeat over 0.4 of the silence limit would let two lost ones silence us.
    short = Pair(TriggerConfig(heartbeat_s=10.0), silence_limit_s=5.0)
    assert short.mixers["a"].trigger is not None
    assert short.mixers["a"].trigger.heartbeat_s == 2.0


def test_skipped_rounds_leave_the_replicas_bit_identical_and_the_sequence_unbroken() -> None:
    pair = Pair(TriggerConfig(heartbeat_s=1.0))
    skipped = 0
    for i in range(400):
        pair.clock.advance(TICK_S)
        if i % 50 < 10:
            pair.x["a"] -= 0.01 * torch.randn(N)  # bursts of training between quiet spells
        before = pair.mixers["a"].state.seq
        reason = pair.round("a")  # receive_delta raises SequenceGap on a skipped number
        after = pair.mixers["a"].state.seq
        assert after == before + (reason is not None)
        skipped += reason is None
        pair.round("b")
        assert pair.replicas_exact()
    assert skipped > 200  # the quiet spells were mostly skipped


def test_with_the_trigger_off_every_round_is_made_as_before() -> None:
    pair = Pair(None)
    for _ in range(100):
        pair.tick()
    assert pair.reasons["a"] == ["always"] * 100
    assert pair.mixers["a"].trigger is None


def test_settings_turn_the_trigger_off_and_refuse_bad_values() -> None:
    assert GossipConfig().trigger_config == TriggerConfig()
    assert GossipConfig(trigger=False).trigger_config is None
    assert GossipConfig(trigger_threshold=0.3, heartbeat_s=4.0).trigger_config == TriggerConfig(
        0.3, 4.0
    )
    with pytest.raises(ValueError, match="threshold"):
        GossipConfig(trigger_threshold=1.5)
    with pytest.raises(ValueError, match="heartbeat_s"):
        TriggerConfig(heartbeat_s=0.0)
