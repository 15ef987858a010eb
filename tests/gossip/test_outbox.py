"""The link policy: a neighbour that misses deltas or falls behind still ends bit-identical.

A sender's :class:`GossipState` and :class:`Outbox` talk to a receiver's :class:`GossipState`
through an in-order channel that the test (or hypothesis) can slow down, lose messages on, break
and replay. Whatever happens, once the channel carries traffic again the receiver's replica is the
sender's public copy, bit for bit, and the sender never held more than ``queue`` deltas.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gossip.clock import ManualClock
from gossip.codecs import get_codec
from gossip.messages import Delta
from gossip.outbox import Outbox, OutboxConfig
from gossip.replicas import GossipError, GossipState

DIM = 257  # not a multiple of the block size, so the last block is partial


@dataclass
class Snapshot:
    seq: int
    values: torch.Tensor


@dataclass
class Link:
    """Sender s → receiver r with an in-order channel between them."""

    codec: str = "int8"
    queue: int = 4
    sender: GossipState = field(init=False)
    receiver: GossipState = field(init=False)
    outbox: Outbox = field(init=False)
    channel: deque[Delta | Snapshot] = field(default_factory=deque)
    x: torch.Tensor = field(init=False)
    rounds: int = 0
    snapshots: int = 0
    deltas: int = 0
    most_held: int = 0
    now: float = 0.0  # every action takes a tenth of a second

    def __post_init__(self) -> None:
        self.x = torch.randn(DIM, generator=torch.Generator().manual_seed(0))
        gen = torch.Generator().manual_seed(1)
        codec = get_codec(self.codec, 64, 0.125)  # the sparse codecs send 8 of each 64
        self.sender = GossipState(self.x, codec, ManualClock(), gen, session=7)
        self.receiver = GossipState(torch.zeros(DIM), codec, ManualClock())
        self.receiver.admit("s")
        self.outbox = Outbox(OutboxConfig(queue=self.queue, window=2))

    def round(self) -> None:
        """The sender trains a little and makes a gossip round."""
        self.rounds += 1
        noise = torch.randn(DIM, generator=torch.Generator().manual_seed(100 + self.rounds))
        self.x += 0.05 * noise
        seq, payload = self.sender.make_delta(self.x)
        self.outbox.offer(Delta("s", self.sender.session, seq, self.rounds, payload))
        self.most_held = max(self.most_held, len(self.outbox))

    def send(self) -> None:
        """The link puts what the outbox says next on the channel."""
        if self.outbox.needs_snapshot:
            seq, values = self.sender.snapshot()
            self.channel.clear()  # a snapshot goes on a fresh stream; the old one is dropped
            self.channel.append(Snapshot(seq, values))
            self.outbox.snapshot_taken(seq, self.now)
            self.snapshots += 1
            return
        delta = self.outbox.next_delta()
        if delta is not None:
            self.channel.append(delta)
            self.outbox.delta_sent(delta, self.now)
            self.deltas += 1

    def arrive(self) -> None:
        """The receiver takes the oldest message on the channel; a refusal reaches the sender."""
        if not self.channel:
            return
        message = self.channel.popleft()
        if isinstance(message, Snapshot):
            self.receiver.receive_snapshot("s", self.sender.session, message.seq, message.values)
            self.outbox.snapshot_answered(self.now)
            return
        try:
            self.receiver.receive_delta("s", message.session, message.seq, message.payload)
        except GossipError:
            self.outbox.refused()
        else:
            self.outbox.acked(self.now)

    def lose(self) -> None:
        """The oldest message on the channel vanishes and nobody is told."""
        if self.channel:
            self.channel.popleft()

    def replay(self) -> None:
        """A delta the receiver already has arrives again."""
        if self.channel and isinstance(self.channel[0], Delta):
            self.channel.appendleft(self.channel[0])

    def break_stream(self) -> None:
        """The send fails: everything in flight is gone and the sender knows it."""
        self.channel.clear()
        self.outbox.lost()

    def settle(self) -> None:
        """Traffic flows again without faults: one more round, then everything is delivered."""
        self.round()
        for _ in range(4 * (self.queue + 2)):
            self.send()
            while self.channel:
                self.arrive()

    def assert_in_sync(self) -> None:
        replica = self.receiver.replicas["s"]
        assert replica.seq == self.sender.seq
        assert torch.equal(replica.value, self.sender.public)


ACTIONS = {
    "round": Link.round,
    "send": Link.send,
    "arrive": Link.arrive,
    "lose": Link.lose,
    "replay": Link.replay,
    "break": Link.break_stream,
}


@settings(max_examples=200, deadline=None)
@given(
    codec=st.sampled_from(["int8", "int4", "sign", "fp32", "topk", "randk", "dct-topk"]),
    queue=st.integers(1, 6),
    script=st.lists(st.sampled_from(sorted(ACTIONS)), max_size=120),
)
def test_any_schedule_of_faults_ends_bit_identical(
    codec: str, queue: int, script: list[str]
) -> None:
    link = Link(codec=codec, queue=queue)
    for action in script:
        link.now += 0.1
        ACTIONS[action](link)
        assert len(link.outbox) <= queue
    link.settle()
    link.assert_in_sync()


def test_a_receiver_that_never_answers_costs_the_sender_only_the_queue() -> None:
    link = Link(queue=4)
    link.send()
    link.arrive()  # the first snapshot
    for _ in range(1000):
        link.round()  # nothing is sent: the neighbour is stuck
    assert link.most_held == 4
    assert link.outbox.overflows > 200
    link.settle()
    link.assert_in_sync()
    # It caught up with one snapshot and the deltas after it, not with 1001 deltas.
    assert link.snapshots == 2
    assert link.deltas <= 4 + 1


def test_lost_delta_is_repaired_by_the_gap_it_leaves() -> None:
    link = Link()
    link.send()
    link.arrive()
    for _ in range(3):
        link.round()
        link.send()
    link.lose()  # the first of the three deltas
    link.arrive()  # the second: a gap, which the receiver refuses
    assert link.outbox.needs_snapshot
    replica_seq = link.receiver.replicas["s"].seq
    assert replica_seq == 0
    link.settle()
    link.assert_in_sync()


def test_deltas_a_snapshot_covers_are_not_sent() -> None:
    link = Link(queue=8)
    for _ in range(3):
        link.round()
    link.send()  # the first send is a snapshot at seq 3, which covers the three queued deltas
    assert isinstance(link.channel[0], Snapshot)
    link.send()
    assert len(link.channel) == 1
    assert link.deltas == 0
    link.arrive()
    link.assert_in_sync()


def test_a_slow_receiver_keeps_up_by_deltas_while_the_queue_holds() -> None:
    link = Link(queue=4)
    link.send()
    link.arrive()
    for _ in range(50):
        for _ in range(3):  # bursts of three rounds fit in a queue of four
            link.round()
        for _ in range(3):
            link.send()
        while link.channel:
            link.arrive()
    link.assert_in_sync()
    assert link.snapshots == 1
    assert link.deltas == 150


def test_busy_counts_unacknowledged_and_queued_deltas() -> None:
    outbox = Outbox(OutboxConfig(queue=4, window=2))
    outbox.snapshot_taken(0, now=0.0)
    outbox.snapshot_answered(now=0.0)
    payload = get_codec("fp32", 64).compress(torch.ones(4)).encoded
    outbox.offer(Delta("s", 1, 1, 0, payload))
    one_queued = outbox.busy
    delta = outbox.next_delta()
    assert delta is not None
    outbox.delta_sent(delta, now=0.0)
    outbox.offer(Delta("s", 1, 2, 0, payload))
    one_sent_one_queued = outbox.busy
    outbox.acked(now=0.5)
    one_acked = outbox.busy
    assert (one_queued, one_sent_one_queued, one_acked) == (False, True, False)


def sent(outbox: Outbox, seq: int, nbytes: int) -> None:
    payload = get_codec("fp32", 64).compress(torch.ones(nbytes // 4)).encoded
    assert payload.nbytes == nbytes
    outbox.offer(Delta("s", 1, seq, 0, payload))
    delta = outbox.next_delta()
    assert delta is not None
    outbox.delta_sent(delta, now=float(seq))


def test_small_deltas_may_be_more_than_the_window_up_to_its_bytes_or_nearly_the_queue() -> None:
    outbox = Outbox(OutboxConfig(queue=16, window=2, window_bytes=10_000))
    outbox.snapshot_taken(0, now=0.0)
    outbox.snapshot_answered(now=0.0)
    busy = []
    for seq in range(1, 5):  # 3000 bytes each: the fourth brings 12000 in line
        sent(outbox, seq, 3000)
        busy.append(outbox.busy)
    assert busy == [False, False, False, True]
    outbox.acked(now=5.0)  # 9000 left
    assert not outbox.busy
    tiny = Outbox(OutboxConfig(queue=16, window=2, window_bytes=10_000))
    tiny.snapshot_taken(0, now=0.0)
    busy = []
    for seq in range(1, 15):  # 40 bytes each: queue - window (14) is the most in line
        sent(tiny, seq, 40)
        busy.append(tiny.busy)
    assert busy == [False] * 13 + [True]
    large = Outbox(OutboxConfig(queue=16, window=2, window_bytes=10_000))
    large.snapshot_taken(0, now=0.0)
    sent(large, 1, 20_000)
    assert not large.busy  # one in line is under the window, however large
    sent(large, 2, 20_000)
    assert large.busy


def test_a_neighbour_that_stops_answering_holds_up_rounds_a_few_answer_times_only() -> None:
    # Counted by deltas alone (window_bytes=0), so that two of these tiny ones make it busy.
    cfg = OutboxConfig(queue=16, window=2, window_bytes=0, overdue_min_s=2.0, overdue_factor=4.0)
    outbox = Outbox(cfg)
    outbox.snapshot_taken(0, now=0.0)
    outbox.snapshot_answered(now=1.0)
    payload = get_codec("fp32", 64).compress(torch.ones(4)).encoded
    t = 1.0
    for seq in range(1, 21):  # answers come 1.5 s after each send
        outbox.offer(Delta("s", 1, seq, 0, payload))
        delta = outbox.next_delta()
        assert delta is not None
        outbox.delta_sent(delta, now=t)
        outbox.acked(now=t + 1.5)
        t += 2.0
    assert outbox.answer_s == pytest.approx(1.5, rel=0.01)
    assert outbox.overdue_after_s == pytest.approx(6.0, rel=0.01)  # 4 x 1.5 s, above 2 s
    # Now it vanishes: two deltas go out and nothing comes back.
    for seq in (21, 22):
        outbox.offer(Delta("s", 1, seq, 0, payload))
        delta = outbox.next_delta()
        assert delta is not None
        outbox.delta_sent(delta, now=t)
    waiting = [outbox.busy_at(t + dt) for dt in (0.0, 3.0, 5.9)]
    given_up = [outbox.busy_at(t + dt) for dt in (6.1, 60.0)]
    assert waiting == [True, True, True]
    assert given_up == [False, False]
    assert outbox.overdue_at() == pytest.approx(t + 6.0, rel=0.01)
    # The stream breaks at last: nothing is unanswered any more.
    outbox.lost()
    assert outbox.overdue_at() is None


@pytest.mark.parametrize(("queue", "window"), [(0, 1), (1, 0)])
def test_config_refuses_empty_queue_or_window(queue: int, window: int) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        OutboxConfig(queue=queue, window=window)


def test_config_refuses_a_deadline_that_cannot_be_met() -> None:
    with pytest.raises(ValueError, match="overdue_min_s"):
        OutboxConfig(overdue_min_s=0)


def test_an_overflow_while_a_snapshot_travels_owes_another() -> None:
    link = Link(queue=2)
    link.send()  # the first snapshot leaves...
    for _ in range(3):
        link.round()  # ...and three rounds overflow a queue of two behind it
    assert link.outbox.needs_snapshot
    link.arrive()
    link.settle()
    link.assert_in_sync()
    assert link.snapshots == 2
