"""The link machine: a neighbour that misses deltas or falls behind still ends bit-identical.

The shipped link machine (gossip/link.py) on a sender's side drives deliveries to a receiver's
:class:`GossipState` through an in-order channel each way, which the test (or hypothesis) can
slow down, lose messages on, break and replay, while time passes. Whatever happens, the
receiver's replica is always one of the sender's past public copies, bit for bit; once the
channel carries traffic again it is the sender's public copy now; and the sender never held more
than ``queue`` deltas.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gossip.clock import ManualClock
from gossip.codecs import CODECS, CodecError, get_codec
from gossip.link import Link, LinkConfig, SendSnapshot
from gossip.messages import Delta
from gossip.outbox import Outbox, OutboxConfig
from gossip.refusals import Reason, reason_of
from gossip.replicas import GossipError, GossipState

DIM = 257  # not a multiple of the block size, so the last block is partial
ACK, ANSWERED, FAILED = "ack", "answered", "failed"


@dataclass
class Snapshot:
    seq: int
    values: torch.Tensor


@dataclass
class Wire:
    """Sender s's link machine → receiver r's state, with an in-order channel each way."""

    codec: str = "int8"
    queue: int = 4
    sender: GossipState = field(init=False)
    receiver: GossipState = field(init=False)
    link: Link = field(init=False)
    forward: deque[tuple[int, Delta | Snapshot]] = field(default_factory=deque)
    backward: deque[tuple[int, str | Reason]] = field(default_factory=deque)
    x: torch.Tensor = field(init=False)
    history: dict[int, torch.Tensor] = field(default_factory=dict)  # the sender's x̂ by seq
    rounds: int = 0
    snapshots: int = 0
    deltas: int = 0
    most_held: int = 0
    now: float = 0.0

    def __post_init__(self) -> None:
        self.x = torch.randn(DIM, generator=torch.Generator().manual_seed(0))
        gen = torch.Generator().manual_seed(1)
        codec = get_codec(self.codec, 64, 0.125)  # the sparse codecs send 8 of each 64
        self.sender = GossipState(self.x, codec, ManualClock(), gen, session=7)
        self.receiver = GossipState(torch.zeros(DIM), codec, ManualClock())
        self.receiver.admit("s")
        self.link = Link(LinkConfig(queue=self.queue, window=2), random.Random(0))
        self.history[0] = self.sender.public.clone()

    def round(self) -> None:
        """The sender trains a little and makes a gossip round."""
        self.rounds += 1
        noise = torch.randn(DIM, generator=torch.Generator().manual_seed(100 + self.rounds))
        self.x += 0.05 * noise
        seq, payload = self.sender.make_delta(self.x)
        self.history[seq] = self.sender.public.clone()
        self.link.offer(Delta("s", self.sender.session, seq, self.rounds, payload))
        self.most_held = max(self.most_held, len(self.link.outbox))

    def send(self) -> None:
        """The driver carries out the machine's next command, if it has one."""
        command = self.link.poll(self.now)
        if isinstance(command, SendSnapshot):
            seq, values = self.sender.snapshot()
            self.link.snapshot_taken(command.epoch, seq, self.now)
            self.forward.append((command.epoch, Snapshot(seq, values)))
            self.snapshots += 1
        elif command is not None:
            self.forward.append((command.epoch, command.delta))
            self.deltas += 1

    def arrive(self) -> None:
        """The receiver takes the oldest message; its answer starts back."""
        if not self.forward:
            return
        epoch, message = self.forward.popleft()
        answer: str | Reason
        try:
            if isinstance(message, Snapshot):
                self.receiver.receive_snapshot(
                    "s", self.sender.session, message.seq, message.values
                )
                answer = ANSWERED
            else:
                self.receiver.receive_delta("s", message.session, message.seq, message.payload)
                answer = ACK
        except (GossipError, CodecError) as err:
            answer = reason_of(err)
        self.backward.append((epoch, answer))
        replica = self.receiver.replicas.get("s")
        if replica is not None:  # always one of the sender's past public copies, bit for bit
            assert torch.equal(replica.value, self.history[replica.seq])

    def answer(self) -> None:
        """The oldest answer reaches the sender's link machine."""
        if not self.backward:
            return
        epoch, answer = self.backward.popleft()
        if answer == ANSWERED:
            self.link.snapshot_answered(epoch, self.now)
        elif answer == ACK:
            self.link.acked(epoch, self.now)
        elif answer == FAILED:
            self.link.failed(epoch, self.now)
        else:
            self.link.refused(epoch, Reason(answer), self.now)

    def lose(self) -> None:
        """The oldest message vanishes: a delta without a word (the next one shows a gap), a
        snapshot's call by its deadline."""
        if self.forward:
            epoch, message = self.forward.popleft()
            if isinstance(message, Snapshot):
                self.backward.append((epoch, FAILED))

    def replay(self) -> None:
        """A delta the receiver already has arrives again."""
        if self.forward and isinstance(self.forward[0][1], Delta):
            self.forward.appendleft(self.forward[0])

    def break_stream(self) -> None:
        """The connection breaks: everything in flight is gone and the sender knows it."""
        self.forward.clear()
        self.backward.clear()
        self.link.failed(self.link.epoch, self.now)

    def wait(self) -> None:
        """A second passes with nothing on the wire moving."""
        self.now += 1.0

    def settle(self) -> None:
        """Traffic flows again without faults: one more round, then everything is delivered."""
        self.round()
        for _ in range(100):
            deadline = self.link.next_deadline()
            if not math.isinf(deadline):
                self.now = max(self.now, deadline)
            for _ in range(self.queue + 2):
                self.send()
            while self.forward or self.backward:
                self.arrive()
                self.answer()
            if self.link.healthy and not self.link.outbox.in_flight and not len(self.link.outbox):
                return
        raise AssertionError("the link did not settle")

    def assert_in_sync(self) -> None:
        replica = self.receiver.replicas["s"]
        assert replica.seq == self.sender.seq
        assert torch.equal(replica.value, self.sender.public)


ACTIONS = {
    "round": Wire.round,
    "send": Wire.send,
    "arrive": Wire.arrive,
    "answer": Wire.answer,
    "lose": Wire.lose,
    "replay": Wire.replay,
    "break": Wire.break_stream,
    "wait": Wire.wait,
}


@settings(max_examples=300, deadline=None)
@given(
    codec=st.sampled_from(sorted(CODECS)),
    queue=st.integers(1, 6),
    script=st.lists(st.sampled_from(sorted(ACTIONS)), max_size=150),
)
def test_any_schedule_of_faults_ends_bit_identical(
    codec: str, queue: int, script: list[str]
) -> None:
    wire = Wire(codec=codec, queue=queue)
    for action in script:
        wire.now += 0.1
        ACTIONS[action](wire)
        assert len(wire.link.outbox) <= queue
    wire.settle()
    wire.assert_in_sync()


def test_a_receiver_that_never_answers_costs_the_sender_only_the_queue() -> None:
    wire = Wire(queue=4)
    wire.send()
    wire.arrive()
    wire.answer()  # the first snapshot
    for _ in range(1000):
        wire.round()  # nothing is sent: the neighbour is stuck
    assert wire.most_held == 4
    assert wire.link.outbox.overflows > 200
    wire.settle()
    wire.assert_in_sync()
    # It caught up with one snapshot and the deltas after it, not with 1001 deltas.
    assert wire.snapshots == 2
    assert wire.deltas <= 4 + 1


def test_lost_delta_is_repaired_by_the_gap_it_leaves() -> None:
    wire = Wire()
    wire.send()
    wire.arrive()
    wire.answer()
    for _ in range(3):
        wire.round()
        wire.send()
    wire.lose()  # the first of the three deltas
    wire.arrive()  # the second: a gap, which the receiver refuses
    wire.answer()
    assert wire.link.outbox.needs_snapshot
    assert wire.link.stats.failures == 0  # a gap is repaired, not a failure
    wire.send()
    assert isinstance(wire.forward[-1][1], Snapshot)  # at once, no back-off
    assert wire.receiver.replicas["s"].seq == 0
    wire.settle()
    wire.assert_in_sync()


def test_deltas_a_snapshot_covers_are_not_sent() -> None:
    wire = Wire(queue=8)
    for _ in range(3):
        wire.round()
    wire.send()  # the first send is a snapshot at seq 3, which covers the three queued deltas
    assert isinstance(wire.forward[0][1], Snapshot)
    wire.arrive()
    wire.answer()
    wire.send()
    assert not wire.forward
    assert wire.deltas == 0
    wire.assert_in_sync()


def test_a_slow_receiver_keeps_up_by_deltas_while_the_queue_holds() -> None:
    wire = Wire(queue=4)
    wire.send()
    wire.arrive()
    wire.answer()
    for _ in range(50):
        for _ in range(3):  # bursts of three rounds fit in a queue of four
            wire.round()
        for _ in range(3):
            wire.send()
        while wire.forward:
            wire.arrive()
            wire.answer()
    wire.assert_in_sync()
    assert wire.snapshots == 1
    assert wire.deltas == 150


def test_an_overflow_while_a_snapshot_travels_owes_another() -> None:
    wire = Wire(queue=2)
    wire.send()  # the first snapshot leaves...
    for _ in range(3):
        wire.round()  # ...and three rounds overflow a queue of two behind it
    assert wire.link.outbox.needs_snapshot
    wire.arrive()
    wire.answer()
    assert isinstance(wire.link.poll(wire.now), SendSnapshot)  # a fresher one, at once
    wire.link.failed(wire.link.epoch, wire.now)  # (it is lost; settle sends another)
    wire.settle()
    wire.assert_in_sync()


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
    # window_s inf: the bytes alone decide here (the time is the next test's).
    outbox = Outbox(OutboxConfig(queue=16, window=2, window_bytes=10_000, window_s=math.inf))
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


def test_small_deltas_wait_in_line_no_longer_than_window_s_at_the_links_pace() -> None:
    cfg = OutboxConfig(queue=16, window=2, window_bytes=1 << 20, window_s=1.0)
    fast = Outbox(cfg)
    fast.snapshot_taken(0, now=0.0)
    fast.snapshot_answered(now=0.0)
    unmeasured = fast.pace_s
    assert unmeasured is None  # no delta answered yet: bytes and counts decide
    sent(fast, 1, 40)  # at 1.0
    fast.acked(now=1.125)
    assert fast.pace_s == 0.125
    busy = []
    for seq in range(2, 11):  # 1 to 9 in line; 8 of them are a second at 0.125 s each
        sent(fast, seq, 40)
        busy.append(fast.busy)
    assert busy == [False] * 7 + [True, True]
    slow = Outbox(cfg)
    slow.snapshot_taken(0, now=0.0)
    slow.snapshot_answered(now=0.0)
    sent(slow, 1, 40)  # at 1.0
    slow.acked(now=1.5)  # 0.5 s for 40 bytes: the uplink is slow, or shared by many links
    busy = []
    for seq in range(2, 4):
        sent(slow, seq, 40)
        busy.append(slow.busy)
    assert busy == [False, True]  # the window's two, not the 14 that 40-byte deltas may be
    slow.acked(now=4.0)  # seq 2, sent at 2.0: 2 s
    assert slow.pace_s == pytest.approx(0.8 * 0.5 + 0.2 * 2.0)
    # An answer's time counts from the answer before it when it waited in line behind that.
    slow.acked(now=4.25)  # seq 3, sent at 3.0, behind seq 2 until 4.0: 0.25 s
    assert slow.pace_s == pytest.approx(0.8 * 0.8 + 0.2 * 0.25)


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


def test_after_a_snapshot_by_name_the_first_answers_get_the_time_their_bytes_take() -> None:
    """A snapshot that went by name says nothing of how long the link's answers take: the
    first large deltas are given the time their bytes take at 1 Mbit/s, not the 2 s floor, so
    that a slow link's first int8 deltas do not count as overdue and let rounds pile up."""
    outbox = Outbox(OutboxConfig(window=2, window_bytes=0, overdue_min_s=2.0))
    outbox.snapshot_taken(0, now=0.0)
    outbox.snapshot_answered(now=0.02, carried=False)  # named: 20 ms, no measure of the link
    assert outbox.answer_s is None
    payload = get_codec("fp32", 64).compress(torch.ones(250_000)).encoded  # 1 MB
    for seq in (1, 2):
        outbox.offer(Delta("s", 1, seq, 0, payload))
        delta = outbox.next_delta()
        assert delta is not None
        outbox.delta_sent(delta, now=1.0)
    assert outbox.overdue_after_s == pytest.approx(2 * payload.nbytes / 125_000)  # 16 s
    assert outbox.busy_at(1.0 + 3.0)  # still waiting on a link it has not measured
    assert not outbox.busy_at(1.0 + 17.0)
    outbox.acked(now=3.0)  # the first answer measures the link: 2 s
    assert outbox.overdue_after_s == pytest.approx(8.0)
    carried = Outbox(OutboxConfig())
    carried.snapshot_taken(0, now=0.0)
    carried.snapshot_answered(now=5.0)  # a model's values: a first, generous estimate
    assert carried.answer_s == pytest.approx(5.0)


@pytest.mark.parametrize(("queue", "window"), [(0, 1), (1, 0)])
def test_config_refuses_empty_queue_or_window(queue: int, window: int) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        OutboxConfig(queue=queue, window=window)


def test_config_refuses_a_deadline_that_cannot_be_met() -> None:
    with pytest.raises(ValueError, match="overdue_min_s"):
        OutboxConfig(overdue_min_s=0)
