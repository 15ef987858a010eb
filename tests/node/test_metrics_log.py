"""The metrics log: strict JSON, a torn line never swallows the next record, a bad line costs
that line only (with a warning naming it), and a full disk never stops the node."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import pytest

from node.cli.report import write_report
from node.daemon.node import METRICS_FILE
from node.telemetry.events import MetricsLog, read_metrics
from tests.node.test_report import A, B, ev, start, stop, table, write_log


def strict(line: str) -> Any:
    """Parse as a strict JSON parser does (NaN and Infinity are not JSON)."""

    def refuse(name: str) -> None:
        raise ValueError(f"not JSON: {name}")

    return json.loads(line, parse_constant=refuse)


def test_non_finite_numbers_are_written_as_null(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path / METRICS_FILE)
    log.write("eval", step=1, loss=math.nan, accuracy=0.5, extra=[math.inf, 1.0])
    log.close()
    [line] = (tmp_path / METRICS_FILE).read_text().splitlines()
    record = strict(line)
    assert record["loss"] is None
    assert record["extra"] == [None, 1.0]


def test_a_reopened_log_starts_on_a_fresh_line(tmp_path: Path) -> None:
    path = tmp_path / METRICS_FILE
    path.write_text('{"time": 1.0, "event": "start"}\n{"time": 2.0, "event": "ev')  # a crash
    log = MetricsLog(path)
    log.write("start", node_id="n")
    log.close()
    events = [r["event"] for r in read_metrics(path)]
    assert events == ["start", "start"]


def test_a_full_disk_drops_records_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    log = MetricsLog(Path("/dev/full"))  # every write fails with ENOSPC, a real one
    with caplog.at_level(logging.WARNING):
        for step in range(3):
            log.write("eval", step=step)
    log.close()
    [warning] = [r.getMessage() for r in caplog.records]
    assert "cannot write to /dev/full" in warning
    assert "No space left on device" in warning


def test_bad_lines_are_skipped_with_a_warning_naming_file_and_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / METRICS_FILE
    lines = [
        json.dumps({"time": 1.0, "event": "start"}),
        "x" * 15_000,  # one invalid line used to drop the node from the report
        "[1, 2]",
        json.dumps({"event": "eval"}),  # no time
        json.dumps({"time": 2.0, "event": "stop"}),
        '{"time": 3.0, "event": "ev',  # torn last line: the node died mid-write
    ]
    path.write_text("\n".join(lines))
    with caplog.at_level(logging.INFO):
        records = read_metrics(path)
    assert [r["event"] for r in records] == ["start", "stop"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [w.split(" skipped")[0] for w in warnings] == [f"{path}: line {n}" for n in (2, 3, 4)]
    assert all(len(w) < 300 for w in warnings)
    assert "line 6 is torn" in caplog.text


def test_past_ten_bad_lines_one_warning_counts_the_rest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / METRICS_FILE
    path.write_text("junk\n" * 25 + json.dumps({"time": 1.0, "event": "start"}) + "\n")
    with caplog.at_level(logging.WARNING):
        assert len(read_metrics(path)) == 1
    assert len(caplog.records) == 11
    assert caplog.records[-1].getMessage() == f"{path}: 15 more bad lines skipped"


def test_the_report_keeps_a_node_with_bad_lines_and_counts_its_restarts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_log(
        tmp_path / "node-0",
        [start(0, A), ev(10, 100, 0.5, 10, 1.0), stop(15, A, 100, 10, 1.0)],
    )
    write_log(
        tmp_path / "node-1",
        [start(1, B), ev(11, 100, 0.6, 11, 1.0), start(20, B), ev(30, 200, 0.9, 5, 0.5)],
    )
    lines = (tmp_path / "node-1" / METRICS_FILE).read_text().splitlines()
    # A torn record swallowing the next life's start (as logs were written before), a line that
    # is no JSON, an eval without an accuracy, and a torn last line.
    lines[2] = lines[1][:30] + lines[2]
    lines.insert(1, "not json at all")
    lines.insert(2, json.dumps({"time": 1.5, "event": "eval", "step": 5, "loss": 1.0}))
    (tmp_path / "node-1" / METRICS_FILE).write_text("\n".join(lines) + '\n{"time": 4')
    with caplog.at_level(logging.WARNING):
        path = write_report([tmp_path / "node-0", tmp_path / "node-1"], tmp_path / "out")
    rows = table(path.read_text())
    assert set(rows) == {"node-0", "node-1"}
    assert rows["node-1"]["restarts"] == "1"
    assert rows["node-1"]["last eval accuracy"] == "0.9000"
    log = tmp_path / "node-1" / METRICS_FILE
    warnings = [r.getMessage() for r in caplog.records]
    assert [w.split(" skipped")[0] for w in warnings] == [f"{log}: line 2", f"{log}: line 3"]
    assert "an eval record without a loss and an accuracy" in warnings[1]


def test_a_null_loss_reads_as_not_a_number(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path / "node-0" / METRICS_FILE)
    log.write("start", node_id=A)
    log.write("eval", step=0, loss=math.nan, accuracy=0.1, distance_rms=-1.0)
    log.close()
    path = write_report([tmp_path / "node-0"], tmp_path / "out")
    assert table(path.read_text())["node-0"]["last eval loss"] == "-"
