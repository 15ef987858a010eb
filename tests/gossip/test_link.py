"""The link machine's protocol, command by command, on a clock the test moves.

What a refusal of each reason does, how the back-off grows and resets, that answers of an epoch
already given up change nothing, and when the link counts as busy. The end-to-end property (any
schedule of faults ends bit-identical) is in test_outbox.py.
"""

from __future__ import annotations

import random

import pytest
import torch

from gossip.codecs import get_codec
from gossip.link import Link, LinkConfig, Phase, SendDelta, SendSnapshot, round_pace
from gossip.messages import Delta
from gossip.refusals import REFUSALS, Reason, Retry

PAYLOAD = get_codec("fp32", 8).compress(torch.ones(4)).encoded
CFG = LinkConfig(queue=4, window=2, backoff_min_s=0.1, backoff_max_s=1.0)


def delta(seq: int) -> Delta:
    return Delta("s", 1, seq, 0, PAYLOAD)


def streaming(cfg: LinkConfig = CFG, seed: int = 0) -> Link:
    """A link whose first snapshot (at seq 0) was taken and answered at time 0."""
    link = Link(cfg, random.Random(seed))
    command = link.poll(0.0)
    assert command == SendSnapshot(1)
    assert link.poll(0.0) is None  # nothing else while the snapshot's call is out
    link.snapshot_taken(1, 0, 0.0)
    link.snapshot_answered(1, 0.0)
    assert link.healthy
    return link


def send(link: Link, seq: int, now: float) -> SendDelta:
    link.offer(delta(seq))
    command = link.poll(now)
    assert isinstance(command, SendDelta)
    assert command.delta.seq == seq
    return command


def resumes_at(link: Link, now: float) -> float:
    """When the link sends its next snapshot: nothing from ``poll`` until then, one at it."""
    at = link.next_deadline()
    assert at > now
    assert link.poll(at - 1e-9) is None
    assert isinstance(link.poll(at), SendSnapshot)
    return at


def test_a_link_starts_with_a_snapshot_then_streams_its_deltas_in_order() -> None:
    link = streaming()
    assert [send(link, seq, 0.1).delta.seq for seq in (1, 2, 3)] == [1, 2, 3]
    assert link.stats.deltas_sent == 3
    assert link.stats.snapshots_sent == 1
    assert link.poll(0.2) is None


@pytest.mark.parametrize("reason", sorted(Reason))
def test_a_refusal_is_treated_as_its_reason_is_classified(reason: Reason) -> None:
    link = streaming()
    command = send(link, 1, 1.0)
    link.offer(delta(2))  # queued behind it
    treat = link.refused(command.epoch, reason, 1.0)
    assert treat == REFUSALS[reason]
    assert link.outbox.needs_snapshot
    assert len(link.outbox) == 1  # a refusal keeps the queue: it serves after the snapshot
    if treat.resync:  # gap, stale: the snapshot repairs it at once, and it is no failure
        assert link.stats.failures == 0
        assert link.poll(1.0) == SendSnapshot(2)
        return
    assert link.stats.failures == 1
    wait_s = resumes_at(link, 1.0) - 1.0
    first_s = CFG.not_neighbour_retry_s if treat.retry is Retry.SOON else CFG.backoff_min_s
    assert first_s / 2 <= wait_s <= first_s


def test_a_failure_drops_the_queue_and_backs_off_doubling_with_jitter_up_to_the_max() -> None:
    link = streaming()
    send(link, 1, 0.0)
    waits, now = [], 0.0
    for _ in range(8):
        link.offer(delta(2))
        assert link.failed(link.epoch, now)  # the delta's stream, then each snapshot, fails
        assert len(link.outbox) == 0  # a dead neighbour holds no memory
        at = resumes_at(link, now)
        waits.append(at - now)
        now = at
    bounds = [min(CFG.backoff_max_s, CFG.backoff_min_s * 2**k) for k in range(8)]
    assert all(b / 2 <= w <= b for w, b in zip(waits, bounds, strict=True))
    assert link.stats.failures == 8


def test_the_back_off_is_the_injected_randomness_and_resets_once_the_link_works() -> None:
    def fail_three_times(seed: int) -> list[float]:
        link = Link(CFG, random.Random(seed))
        now, waits = 0.0, []
        for _ in range(3):
            assert isinstance(link.poll(now), SendSnapshot)
            link.failed(link.epoch, now)
            at = link.next_deadline()
            waits.append(at - now)
            now = at
        assert isinstance(link.poll(now), SendSnapshot)
        link.snapshot_taken(link.epoch, 0, now)
        link.snapshot_answered(link.epoch, now)
        send(link, 1, now)  # the link works again: the back-off starts over
        link.failed(link.epoch, now)
        waits.append(link.next_deadline() - now)
        return waits

    one, again, other = fail_three_times(1), fail_three_times(1), fail_three_times(2)
    assert one == again != other
    assert CFG.backoff_min_s / 2 <= one[3] <= CFG.backoff_min_s  # reset: not 0.8 s
    assert one[2] > CFG.backoff_min_s  # doubled twice before


def test_answers_of_an_epoch_given_up_change_nothing() -> None:
    link = streaming()
    old = [send(link, seq, 1.0) for seq in (1, 2)]
    link.failed(old[0].epoch, 1.0)
    at = link.next_deadline()
    assert link.poll(at) == SendSnapshot(2)
    link.snapshot_taken(2, 2, at)
    link.snapshot_answered(2, at)
    send(link, 3, at)
    in_flight = link.outbox.in_flight
    # The old stream's answers straggle in: an ack, a refusal, a failure.
    link.acked(1, at)
    assert link.refused(1, Reason.GAP, at) is None
    assert not link.failed(1, at)
    assert link.outbox.in_flight == in_flight == 1
    assert link.healthy
    assert link.epoch == 2
    assert link.poll(at) is None  # no spurious resync
    assert link.stats.failures == 1


def test_an_overdue_link_stops_holding_up_rounds_only_once_another_answers_a_later_send() -> None:
    """Two links on one uplink, their answers late alike: the uplink is what is slow, and the
    rounds wait (in the simulator, six nodes on 80 kbit/s uplinks otherwise let 100 deltas
    pile up on each link). A vanished neighbour is one whose link stays silent while another
    answers deltas sent after its own: that one no longer holds up the rounds."""
    cfg = LinkConfig(queue=8, window=2, window_bytes=0, overdue_min_s=2.0, overdue_factor=4.0)
    a, b = streaming(cfg), streaming(cfg)
    for link in (a, b):
        send(link, 1, 0.0)
        send(link, 2, 0.0)
    links = {"a": a, "b": b}
    assert round_pace(links, 1.0, per_link=False) == (False, frozenset(links))
    assert round_pace(links, 2.5, per_link=False)[0] is False  # both overdue: wait
    assert round_pace(links, 2.5, per_link=True) == (False, frozenset())
    b.acked(b.epoch, 3.0)  # b answers a send of time 0: no later than a's oldest
    assert round_pace(links, 3.1, per_link=False)[0] is False  # a still holds the round
    assert round_pace(links, 3.1, per_link=True) == (True, frozenset({"b"}))
    send(b, 3, 3.2)
    b.acked(b.epoch, 3.5)
    b.acked(b.epoch, 3.6)  # b answered a send of 3.2, after a's oldest of 0.0
    assert round_pace(links, 3.7, per_link=True) == (True, frozenset(links))
    assert round_pace(links, 3.7, per_link=False) == (True, frozenset(links))
    assert not a.busy(2.5)  # asked alone, an overdue link holds up nothing, as before
    assert not a.busy(2.5, others_answered_sent=1.0)
    assert a.busy(2.5, others_answered_sent=0.0)


def test_busy_while_window_deltas_are_out_but_not_backing_off_nor_once_overdue() -> None:
    # window_bytes 0: the window alone decides, whatever the deltas' size (gossip/outbox.py).
    cfg = LinkConfig(queue=8, window=2, window_bytes=0, overdue_min_s=2.0, overdue_factor=4.0)
    link = streaming(cfg)
    send(link, 1, 0.0)
    assert not link.busy(0.0)  # one out, none queued
    send(link, 2, 0.0)
    assert link.busy(0.0)
    assert link.busy(1.9)
    assert not link.busy(2.1)  # no answer for longer than overdue_min_s: it stops holding up
    link.failed(link.epoch, 2.1)
    link.offer(delta(3))
    link.offer(delta(4))
    assert not link.busy(2.1)  # backing off: never busy


def test_small_deltas_may_fill_window_bytes_before_the_link_is_busy() -> None:
    link = streaming(LinkConfig(queue=8, window=2, window_bytes=1 << 20))
    for seq in range(1, 7):  # queue - window of them, however small, make it busy
        assert not link.busy(0.0)
        send(link, seq, 0.0)
    assert link.busy(0.0)


def test_busy_while_its_snapshot_travels_with_window_queued_behind_it() -> None:
    link = Link(CFG, random.Random(0))
    assert isinstance(link.poll(0.0), SendSnapshot)
    link.offer(delta(1))
    link.offer(delta(2))
    assert not link.busy(0.0)  # the snapshot is not read yet: nothing waits on the wire
    link.snapshot_taken(1, 0, 0.0)
    assert link.busy(0.0)


def test_deltas_a_snapshot_covers_stop_keeping_the_link_busy_once_it_is_taken() -> None:
    """A refusal keeps the queue; the snapshot that repairs it covers what was queued then. From
    the moment it is read those deltas count for nothing: the driver tells the node that the
    link changed right then, and no later send would (the stream skips them silently)."""
    link = streaming()
    command = send(link, 1, 0.0)
    for seq in (2, 3, 4):
        link.offer(delta(seq))
    link.refused(command.epoch, Reason.GAP, 0.0)
    assert isinstance(link.poll(0.0), SendSnapshot)
    link.snapshot_taken(link.epoch, 4, 0.0)  # x̂ at seq 4: covers 2, 3 and 4
    assert len(link.outbox) == 0
    assert not link.busy(0.0)
    link.offer(delta(5))
    link.snapshot_answered(link.epoch, 0.0)
    assert send(link, 5, 0.0).delta.seq == 5


def test_a_resync_owes_a_snapshot_and_a_closed_link_sends_nothing() -> None:
    link = streaming()
    send(link, 1, 0.0)
    link.resync()
    assert not link.healthy
    assert link.poll(0.0) == SendSnapshot(2)
    link.close()
    link.offer(delta(2))
    assert link.phase is Phase.CLOSED
    assert link.poll(10.0) is None
    assert len(link.outbox) == 0


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"backoff_min_s": 0.0}, "backoff"),
        ({"backoff_min_s": 2.0, "backoff_max_s": 1.0}, "backoff"),
        ({"not_neighbour_retry_s": 0.0}, "retry delay"),
        ({"call_timeout_s": 0.0}, "call_timeout_s"),
        ({"queue": 0}, "at least 1"),
    ],
)
def test_config_refuses_what_cannot_work(bad: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LinkConfig(**bad)  # type: ignore[arg-type]


def test_progress_says_where_a_link_stands_and_what_went_wrong_last() -> None:
    link = Link(CFG, random.Random(0))
    assert link.progress(0.0) == "not dialed"
    assert link.poll(0.0) == SendSnapshot(1)
    assert link.progress(0.0) == "dialing"
    link.snapshot_taken(1, 0, 0.0)
    assert link.progress(0.0) == "snapshot sent"
    link.refused(1, Reason.UNKNOWN_SENDER, 0.0)
    at = link.next_deadline()
    assert link.progress(0.0) == (f"backing off {at:.1f} s after a refusal (unknown_sender)")
    assert link.progress(at) == "retrying after a refusal (unknown_sender)"
    assert link.poll(at) == SendSnapshot(2)
    link.snapshot_taken(2, 0, at)
    link.failed(2, at)
    assert link.progress(link.next_deadline()) == "retrying after no answer"
    assert link.poll(link.next_deadline()) == SendSnapshot(3)
    link.snapshot_taken(3, 0, 2.0)
    link.snapshot_answered(3, 2.0)
    assert link.progress(2.0) == "snapshot acked"
    link.close()
    assert link.progress(2.0) == "closed"


def test_a_snapshot_waits_for_the_hold_and_goes_once_it_lets_it() -> None:
    wait = {"s": 3.0}
    link = Link(CFG, random.Random(0), hold=lambda: wait["s"])
    assert link.poll(10.0) is None
    assert link.next_deadline() == 13.0
    assert link.progress(11.0) == "held 2.0 s by the byte budget"
    assert not link.busy(11.0)  # a held link does not hold up the others' rounds
    wait["s"] = 0.0
    assert isinstance(link.poll(13.0), SendSnapshot)
    # A stream that needs a snapshot again (its queue overflowed) waits as a new link does.
    link.snapshot_taken(1, 0, 13.0)
    link.snapshot_answered(1, 13.5)
    assert link.phase is Phase.STREAM
    link.resync()
    wait["s"] = 1.0
    assert link.poll(14.0) is None
    assert not link.healthy
    assert link.progress(14.0) == "held 1.0 s by the byte budget"
    assert link.next_deadline() == 15.0
