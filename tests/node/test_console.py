"""What operators read: tables that fit any terminal, stale nodes, progress and countdown lines,
the summary line, and the labelled figures (pure parts; no network)."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from node.cli.monitor import DEPARTED_AFTER_S, MONITOR_COLUMNS, SwarmBoard
from node.cli.swarm import SwarmConfig
from node.cli.swarm_view import SWARM_COLUMNS, progress_view
from node.cli.tables import Column, fit_columns, render_text
from node.telemetry.console import with_countdown
from node.telemetry.mqtt_messages import MqttConfig, parse_status, status_payload
from node.telemetry.progress import (
    WAIT_TICKS,
    Ticker,
    TickerConfig,
    TransferProgress,
    fmt_duration,
    fmt_size,
)
from node.telemetry.status import NeighbourStatus, NodeStatus, format_status, format_summary

WIDTHS = (40, 80, 200)


def status(**overrides: Any) -> NodeStatus:
    base: dict[str, Any] = dict(
        node_id="0123456789abcdef" * 2,
        address="192.168.100.200:65000",
        device="cpu",
        codec="int8",
        step=12345,
        step_budget=30000,
        training_done=False,
        train_loss=0.1234,
        eval_accuracy=0.975,
        rounds=4567,
        bytes_sent=123_456_789,
        bytes_sent_fp32=493_827_156,
        bytes_received=120_000_000,
        samples_per_s=812.0,
        samples=395_040,
        eval_loss=0.0821,
        eval_step=12300,
        eval_age_s=1.5,
        neighbours=tuple(
            NeighbourStatus(f"{k}" * 32, "10.0.0.1:1", 5, 0.1, k != 2, 10, 1, 1, 0.01)
            for k in range(4)
        ),
    )
    return NodeStatus(**{**base, **overrides})


def board_of(n: int, now: float = 1000.0) -> SwarmBoard:
    board = SwarmBoard(MqttConfig(url="mqtt://broker.example.org:1883", swarm="lab"))
    for i in range(n):
        node_id = f"{i:x}" * 32
        s = status(node_id=node_id, step=10_000 + i, address=f"10.1.2.{i}:{40000 + i}")
        board.receive(f"murmur/lab/{node_id}/status", status_payload(s, True, now, 2.0), now=now)
    return board


# -- tables -----------------------------------------------------------------------------------


def data_rows(text: str, ids: list[str]) -> dict[str, list[str]]:
    """Each node's row, split into cells, by the node id it starts with (8 characters at least
    must survive)."""
    rows = {}
    for line in text.splitlines():
        for node_id in ids:
            if line.startswith(node_id[:8]):
                rows[node_id] = line.split()
    return rows


@pytest.mark.parametrize("width", WIDTHS)
def test_the_monitor_fits_the_width_and_keeps_its_key_columns(width: int) -> None:
    board = board_of(5)
    ids = [f"{i:x}" * 32 for i in range(5)]
    text = board.table(now=1001.0, width=width)
    assert all(len(line) <= width for line in text.splitlines()), text
    rows = data_rows(text, ids)
    assert set(rows) == set(ids), text  # one line per node: nothing wrapped
    for i, node_id in enumerate(ids):
        cells = rows[node_id]
        assert "online" in cells
        assert f"{10_000 + i}/30000" in cells
        assert "0.975" in cells  # eval accuracy
    if width >= 200:  # everything, untruncated
        assert all(f"10.1.2.{i}:{40000 + i}" in rows[ids[i]] for i in range(5))
        assert ids[0][:12] in rows[ids[0]]
        for header in ("train", "eval", "address", "rounds", "sent"):
            assert header in text


@pytest.mark.parametrize("width", WIDTHS)
def test_the_swarm_table_fits_the_width_and_keeps_its_key_columns(width: int) -> None:
    statuses = [status(node_id=f"{i:x}" * 32, step=100 * i) for i in range(8)] + [None]
    cfg = SwarmConfig(nodes=9, steps=30000)
    text = render_text(progress_view(cfg, statuses, elapsed=75.0), width)
    assert all(len(line) <= width for line in text.splitlines()), text
    rows = data_rows(text, [f"{i:x}" * 32 for i in range(8)])
    assert len(rows) == 8
    for i, cells in enumerate(rows.values()):
        assert f"{100 * i}/30000" in cells
        assert "0.975" in cells
    assert "no answer" in text  # the node that did not answer still has its line
    if width >= 200:
        assert "25.0%" in text  # vs fp32, the first column to go


def test_columns_go_by_priority_after_the_truncatable_ones_shrink() -> None:
    columns = [
        Column("id", 0, "left", min_width=4),
        Column("a", 2),
        Column("b", 1),
        Column("addr", 3, "left", min_width=5),
    ]
    rows = [["abcdefghij", "11", "22", "host.example.org:7070"]]
    assert fit_columns(columns, rows, 100) == [(0, 10), (1, 2), (2, 2), (3, 21)]
    # 10+2+2+21+3 = 38 > 30: the address shrinks first (to 13), keeping every column.
    assert fit_columns(columns, rows, 30) == [(0, 10), (1, 2), (2, 2), (3, 13)]
    # Below the least widths (4+2+2+5+3 = 16), the highest numbers go first: addr, then a.
    # Then the spare width goes back to the truncated key column: 4 + 5 = 9.
    assert fit_columns(columns, rows, 15) == [(0, 9), (1, 2), (2, 2)]
    assert fit_columns(columns, rows, 8) == [(0, 5), (2, 2)]
    # Key columns stay, however narrow.
    assert fit_columns(columns, rows, 3) == [(0, 4)]


def test_every_monitor_and_swarm_column_has_a_label_that_says_what_it_is() -> None:
    headers = {c.header.replace("\n", " ") for c in (*MONITOR_COLUMNS, *SWARM_COLUMNS)}
    assert {"train loss", "eval loss", "eval acc"} <= headers
    assert not {"loss", "accuracy"} & headers  # nothing unlabelled


# -- stale and departed nodes -----------------------------------------------------------------


def test_a_node_whose_status_is_not_renewed_goes_stale_whatever_its_flags_say() -> None:
    board = board_of(1, now=1000.0)
    node_id = "0" * 32
    board.receive(f"murmur/lab/{node_id}/online", b"true")
    # 3 intervals of 2 s, but at least 5 s: fresh up to 6 s after the last status.
    assert board.statuses(1006.0)[0]["state"] == "online"
    [s] = board.statuses(1006.5)
    assert (s["state"], s["stale"], s["online"]) == ("stale", True, True)
    assert s["last_seen_s"] == pytest.approx(6.5)
    # A fresh status makes it online again.
    payload = status_payload(status(node_id=node_id), True, 1007.0, 2.0)
    board.receive(f"murmur/lab/{node_id}/status", payload, now=1007.0)
    assert board.statuses(1008.0)[0]["state"] == "online"


def test_a_retained_status_is_as_old_as_it_says_but_no_younger_than_its_arrival() -> None:
    board = SwarmBoard(MqttConfig(url="mqtt://h", swarm="s"))
    old, ahead = "a" * 32, "b" * 32
    # Killed while the broker was down: its retained status and online flag stay for good.
    board.receive(f"murmur/s/{old}/online", b"true", retained=True, now=1000.0)
    payload = status_payload(status(node_id=old), True, 400.0, 2.0)
    board.receive(f"murmur/s/{old}/status", payload, retained=True, now=1000.0)
    # A node whose clock runs an hour ahead: its retained status counts from its arrival.
    payload = status_payload(status(node_id=ahead), True, 4600.0, 2.0)
    board.receive(f"murmur/s/{ahead}/status", payload, retained=True, now=1000.0)
    states = {s["node_id"]: s["state"] for s in board.statuses(1001.0)}
    assert states == {old: "stale", ahead: "online"}
    assert {s["node_id"]: s["state"] for s in board.statuses(1010.0)} == {
        old: "stale",
        ahead: "stale",
    }
    text = board.table(1010.0, width=80)
    assert text.startswith("swarm s: 2 nodes, 2 stale; mqtt://h:1883")
    [row] = [line for line in text.splitlines() if line.startswith(old[:8])]
    assert "stale" in row.split()
    assert "10m10s" in row.split()  # last seen, as a duration


def test_a_status_that_says_a_long_interval_goes_stale_later() -> None:
    board = SwarmBoard(MqttConfig(url="mqtt://h", swarm="s"))
    node_id = "c" * 32
    payload = status_payload(status(node_id=node_id), True, 1000.0, 30.0)
    board.receive(f"murmur/s/{node_id}/status", payload, now=1000.0)
    assert board.statuses(1080.0)[0]["state"] == "online"
    assert board.statuses(1091.0)[0]["state"] == "stale"


def test_hide_departed_leaves_out_offline_and_long_silent_nodes() -> None:
    board = board_of(4, now=1000.0)
    ids = [f"{i:x}" * 32 for i in range(4)]
    board.receive(f"murmur/lab/{ids[1]}/online", b"false")
    fresh = status_payload(status(node_id=ids[0]), True, 1000.0 + DEPARTED_AFTER_S, 2.0)
    board.receive(f"murmur/lab/{ids[0]}/status", fresh, now=1000.0 + DEPARTED_AFTER_S)
    recent = status_payload(status(node_id=ids[3]), True, 990.0 + DEPARTED_AFTER_S, 2.0)
    board.receive(f"murmur/lab/{ids[3]}/status", recent, now=990.0 + DEPARTED_AFTER_S)
    now = 1001.0 + DEPARTED_AFTER_S
    text = board.table(now, width=120, hide_departed=True)
    # ids[2] is stale for longer than DEPARTED_AFTER_S, ids[3] only for 11 s.
    assert set(data_rows(text, ids)) == {ids[0], ids[3]}
    assert text.startswith("swarm lab: 4 nodes, 1 online, 2 stale, 1 offline, 2 departed hidden;")
    assert set(data_rows(board.table(now, width=100), ids)) == set(ids)


def test_statuses_from_nodes_before_the_labels_are_still_read() -> None:
    old = json.loads(status_payload(status(), True, 5.0, 2.0))
    for key in ("train_loss", "eval_loss", "eval_accuracy", "eval_step", "eval_age_s"):
        del old[key]
    old |= {"loss": 0.5, "accuracy": 0.9}
    parsed = parse_status(json.dumps(old).encode())
    assert parsed is not None
    assert (parsed["train_loss"], parsed["eval_accuracy"], parsed["eval_loss"]) == (0.5, 0.9, None)


# -- progress, countdowns and summaries -------------------------------------------------------


def test_waits_speak_at_once_then_ever_less_often() -> None:
    ticker = Ticker(WAIT_TICKS, now=0.0)
    due = [t / 2 for t in range(0, 2 * 200) if ticker.due(t / 2)]
    assert due == [0.0, 5.0, 15.0, 35.0, 65.0, 95.0, 125.0, 155.0, 185.0]


def test_transfer_progress_says_how_far_how_fast_and_how_long_is_left(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    log = logging.getLogger("test.progress")
    ticks = TickerConfig(first_s=2.0, every_s=5.0, growth=1.0, max_s=5.0)
    p = TransferProgress("pulling the model from x:1", 100 * 2**20, log, lambda: now[0], ticks)
    with caplog.at_level(logging.INFO, logger="test.progress"):
        for t, done in ((1.0, 5), (2.0, 10), (3.0, 15), (7.0, 35), (10.0, 50)):
            now[0] = t
            p.update(done * 2**20)
        now[0] = 20.0
        closing = p.done()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "pulling the model from x:1:  10% (10.0 MiB of 100.0 MiB), 5.00 MiB/s, 18s left",
        "pulling the model from x:1:  35% (35.0 MiB of 100.0 MiB), 5.00 MiB/s, 13s left",
    ]
    assert p.spoke
    assert closing == "100.0 MiB in 20s (5.00 MiB/s)"


def test_a_write_without_progress_counts_time_against_the_last_rate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    log = logging.getLogger("test.progress")
    p = TransferProgress("writing the final checkpoint", 3 * 2**30, log, lambda: now[0])
    with caplog.at_level(logging.INFO, logger="test.progress"):
        now[0] = 2.5
        p.tick(expected_rate=2**30)  # 1 GiB/s last time: 3 s in all
        now[0] = 7.5
        p.tick(expected_rate=None)
    assert [r.getMessage() for r in caplog.records] == [
        "writing the final checkpoint (3.00 GiB): 2.5s so far, about 0.5s left at the last "
        "write's 1.00 GiB/s",
        "writing the final checkpoint (3.00 GiB): 7.5s so far, no estimate yet (the first write)",
    ]


def test_durations_and_sizes_read_at_a_glance() -> None:
    assert [fmt_duration(s) for s in (0.42, 12.4, 185, 7800, 270000, -1)] == [
        "0.4s",
        "12s",
        "3m05s",
        "2h10m",
        "3d03h",
        "-",
    ]
    assert [fmt_size(n) for n in (812, 1536, 5 * 2**20, 123_456_789)] == [
        "812 B",
        "1.50 KiB",
        "5.00 MiB",
        "117.7 MiB",
    ]


async def test_a_countdown_speaks_while_the_wait_lasts_and_stops_with_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    asked = asyncio.Event()
    release = asyncio.Event()
    calls = []

    def describe() -> str:
        calls.append(1)
        asked.set()
        return "waiting for members (1 of 3 known)"

    async def wait() -> str:
        await release.wait()
        return "done"

    async def ready() -> str:  # a wait whose condition holds already: it never yields
        return "quick"

    ticks = TickerConfig(first_s=0.0, every_s=3600.0)
    with caplog.at_level(logging.INFO, logger="node.telemetry.console"):
        work = asyncio.create_task(with_countdown(wait(), describe, ticks))
        await asyncio.wait_for(asked.wait(), 10)
        release.set()
        assert await asyncio.wait_for(work, 10) == "done"
        # A wait that ends before its first line says nothing.
        assert await with_countdown(ready(), describe, ticks) == "quick"
    assert calls == [1]
    assert [r.getMessage() for r in caplog.records] == ["waiting for members (1 of 3 known)"]


def test_the_summary_line_has_rates_over_the_interval_and_labelled_figures() -> None:
    before = status(samples=100_000, rounds=4000, bytes_sent=100 * 2**20, bytes_received=0)
    now = status(samples=108_120, rounds=4100, bytes_sent=110 * 2**20, bytes_received=2**20)
    line = format_summary(now, before, elapsed_s=10.0)
    assert line == (
        "node 01234567 step 12345/30000, 812 samples/s, rounds 4100 (10.0/s), "
        "sent 1.00 MiB/s, received 102.4 KiB/s, mix 3/4 neighbours, train_loss 0.1234, "
        "eval_loss 0.0821 eval_accuracy 0.9750 (step 12300)"
    )
    fresh = status(step=0, samples=0, train_loss=float("nan"), eval_step=-1, eval_accuracy=-1.0)
    assert format_summary(fresh, None, 10.0).endswith("train_loss -, no eval yet")
    done = format_summary(status(step=30000, training_done=True), before, 10.0)
    assert done.startswith("node 01234567 step 30000/30000 (done), ")


def test_status_text_labels_its_figures() -> None:
    text = format_status(status())
    assert "train_loss 0.1234" in text
    assert "eval_loss 0.0821  eval_accuracy 0.9750 (step 12300, 2 s ago)" in text
    assert "eval: none yet" in format_status(status(eval_step=-1, eval_accuracy=-1.0))
