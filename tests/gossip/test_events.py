"""The discrete-event engine and the modelled network, by hand-computed cases."""

from __future__ import annotations

import random

import pytest

from gossip.events import EventQueue, LinkLatency, Network


def test_events_run_in_time_order_and_ties_in_the_order_scheduled() -> None:
    q = EventQueue()
    seen: list[str] = []
    q.at(2.0, lambda: seen.append("b"))
    q.at(1.0, lambda: seen.append("a"))
    q.at(2.0, lambda: seen.append("c"))
    q.run_until(1.5)
    assert seen == ["a"]
    assert q.now() == 1.5
    q.run_until(10.0)
    assert seen == ["a", "b", "c"]
    assert q.now() == 10.0


def test_a_timer_keeps_the_earliest_deadline_and_runs_once() -> None:
    q = EventQueue()
    seen: list[float] = []
    q.timer("m", 5.0, lambda: seen.append(q.now()))
    q.timer("m", 3.0, lambda: seen.append(q.now()))  # earlier: replaces
    q.timer("m", 4.0, lambda: seen.append(q.now()))  # later than the one set: ignored
    q.run_until(10.0)
    assert seen == [3.0]


def test_a_cancelled_timer_does_not_run() -> None:
    q = EventQueue()
    seen: list[int] = []
    q.timer("m", 1.0, lambda: seen.append(1))
    q.cancel_timer("m")
    q.run_until(2.0)
    assert seen == []


def test_an_uplink_serialises_messages_in_order_then_each_takes_the_link_latency() -> None:
    q = EventQueue()
    net = Network(q, lambda a, b: 0.5, bandwidth_bps=100.0)
    arrivals: list[tuple[str, float]] = []
    net.send("a", "b", 100, lambda: arrivals.append(("first", q.now())))  # 1 s on the uplink
    net.send("a", "c", 50, lambda: arrivals.append(("second", q.now())))  # waits, then 0.5 s
    net.send("d", "b", 100, lambda: arrivals.append(("other sender", q.now())))
    assert net.backlog_s("a") == pytest.approx(1.5)
    q.run_until(10.0)
    assert arrivals == [("first", 1.5), ("other sender", 1.5), ("second", 2.0)]


def test_lost_messages_never_arrive_but_take_their_time_on_the_uplink() -> None:
    q = EventQueue()
    net = Network(q, lambda a, b: 0.0, bandwidth_bps=10.0, loss=0.5, rng=random.Random(1))
    arrived: list[int] = []
    results = [net.send("a", "b", 10, lambda i=i: arrived.append(i)) for i in range(200)]  # type: ignore[misc]
    q.run_until(1000.0)
    assert arrived == [i for i, ok in enumerate(results) if ok]
    assert 60 < net.lost < 140
    assert net.backlog_s("a") == 0.0
    assert all(net.send("a", "b", 10, lambda: None, lossy=False) for _ in range(50))


def test_a_link_has_one_latency_both_ways_within_its_range() -> None:
    latency = LinkLatency(0.01, 0.05, seed=3)
    values = {latency(f"n{i}", f"n{j}") for i in range(20) for j in range(i + 1, 20)}
    assert all(0.01 <= v <= 0.05 for v in values)
    assert len(values) > 150  # spread out, not one value
    assert latency("x", "y") == latency("y", "x")
    assert LinkLatency(0.01, 0.05, seed=4)("x", "y") != latency("x", "y")


def test_a_partition_loses_lossy_messages_between_groups_and_holds_reliable_ones() -> None:
    q = EventQueue()
    net = Network(q, lambda a, b: 0.25)
    groups = {"a1": 1, "a2": 1, "b1": 2}
    net.split(groups.__getitem__, start_s=1.0, duration_s=2.0)
    arrivals: list[tuple[str, float]] = []
    q.run_until(1.0)
    assert net.send("a1", "b1", 10, lambda: arrivals.append(("across", q.now()))) is False
    assert net.send("a1", "a2", 10, lambda: arrivals.append(("within", q.now())))
    # A call the transport retries gets through once the partition ends.
    assert net.send("b1", "a2", 10, lambda: arrivals.append(("call", q.now())), lossy=False)
    q.run_until(2.9)
    assert arrivals == [("within", 1.25)]
    q.run_until(10.0)
    assert arrivals == [("within", 1.25), ("call", 3.25)]
    assert net.cut == 2
    # Over: every message passes again.
    assert net.send("a1", "b1", 10, lambda: arrivals.append(("after", q.now())))
    q.run_until(20.0)
    assert arrivals[-1] == ("after", 10.25)


def test_a_partition_needs_a_positive_duration() -> None:
    with pytest.raises(ValueError, match="positive"):
        Network(EventQueue(), lambda a, b: 0.0).split(lambda a: a, 0.0, 0.0)
