"""SWIM's update queue (gossip/dissemination.py) against the plain dict it replaced, which
bench/swim_queue.py keeps as its baseline."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.swim_queue import ScanQueue
from gossip.dissemination import UpdateQueue
from gossip.swim_messages import MemberRecord


def record(i: int, incarnation: int = 0) -> MemberRecord:
    return MemberRecord(f"m{i}", f"sim://m{i}", incarnation)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(0, 12), st.integers(1, 5)),
        st.tuples(st.just("take"), st.integers(1, 4), st.just(0)),
        st.tuples(st.just("discard"), st.integers(0, 12), st.just(0)),
        st.tuples(st.just("clear"), st.just(0), st.just(0)),
    ),
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(capacity=st.integers(1, 8), ops=ops)
def test_the_queue_chooses_as_the_dict_did(capacity: int, ops: list[tuple[str, int, int]]) -> None:
    queue, plain = UpdateQueue(capacity), ScanQueue(capacity)
    for step, (op, a, b) in enumerate(ops):
        if op == "push":
            rec = record(a, step)
            assert queue.push(rec, b) == plain.push(rec, b)
        elif op == "take":
            assert queue.take(a) == plain.take(a)
        elif op == "discard":
            queue.discard(f"m{a}")
            plain.items.pop(f"m{a}", None)
        else:
            queue.clear()
            plain.items.clear()
        assert list(queue) == [r for r, _ in plain.items.values()]
        assert len(queue) == len(plain.items)


def test_a_full_queue_drops_the_most_sent_and_the_older_of_a_tie() -> None:
    queue = UpdateQueue(3)
    for i in range(3):
        assert queue.push(record(i), 4)
    assert queue.take(1) == [record(0)]  # m0 has 3 sends left, the others 4
    assert not queue.push(record(3), 4)
    assert "m0" not in queue
    assert not queue.push(record(4), 4)  # m1, m2 and m3 tie: m1 was queued first
    assert list(queue) == [record(2), record(3), record(4)]


def test_a_record_queued_again_goes_to_the_back_with_a_fresh_count() -> None:
    queue = UpdateQueue(4)
    queue.push(record(0), 2)
    queue.push(record(1), 2)
    queue.push(record(0, 1), 2)
    assert queue.take(2) == [record(1), record(0, 1)]
    assert queue.take(2) == [record(1), record(0, 1)]
    assert len(queue) == 0


def test_stale_entries_do_not_pile_up() -> None:
    queue = UpdateQueue(16)
    for step in range(10_000):
        queue.push(record(step % 20, step), 3)
        queue.take(2)
    assert len(queue) <= 16
    assert len(queue._least_sent) + len(queue._most_sent) <= 4 * len(queue) + 64 + 2


def test_a_queue_needs_room() -> None:
    with pytest.raises(ValueError, match="room for one"):
        UpdateQueue(0)
