"""``murmur report``: plots and a markdown summary from the state dirs of a run."""

from __future__ import annotations

import asyncio
import json
import struct
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from node.cli.evaluation import parameter_names
from node.cli.main import main
from node.cli.report import PLOTS_DIR, REPORT_FILE, write_report
from node.daemon.checkpoint import CHECKPOINT_FILE, Checkpoint, save_checkpoint
from node.daemon.node import METRICS_FILE
from tests.node.helpers import memory_swarm

T0 = 1_700_000_000.0
MIB = 2**20
PLOTS = ("loss.png", "accuracy.png", "distance.png")


def write_log(state_dir: Path, records: list[tuple[float, str, dict[str, Any]]]) -> None:
    """A metrics log as ``MetricsLog`` writes it, but with chosen times (offsets from T0)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with (state_dir / METRICS_FILE).open("w") as f:
        for t, event, fields in records:
            f.write(json.dumps({"time": T0 + t, "event": event, **fields}) + "\n")


def start(t: float, node_id: str) -> tuple[float, str, dict[str, Any]]:
    return t, "start", {"node_id": node_id, "address": "127.0.0.1:7070"}


def ev(
    t: float, step: int, acc: float, rounds: int, mib: float
) -> tuple[float, str, dict[str, Any]]:
    fields = {
        "step": step,
        "loss": 2.0 * (1 - acc) + 0.01,
        "accuracy": acc,
        "train_loss": 0.5,
        "rounds": rounds,
        "bytes_sent": int(mib * MIB),
        "bytes_sent_fp32": int(4 * mib * MIB),
        "distance_rms": 0.1 / (1 + t),
        "members": 3,
    }
    return t, "eval", fields


def stop(t: float, node_id: str, step: int, rounds: int, mib: float) -> tuple[float, str, Any]:
    fields = {
        "node_id": node_id,
        "step": step,
        "rounds": rounds,
        "bytes_sent": int(mib * MIB),
        "bytes_sent_fp32": int(4 * mib * MIB),
    }
    return t, "stop", fields


def tables(markdown: str) -> list[list[str]]:
    """The report's tables, each as its lines."""
    found: list[list[str]] = []
    previous = ""
    for line in markdown.splitlines():
        if line.startswith("|"):
            if not previous.startswith("|"):
                found.append([])
            found[-1].append(line)
        previous = line
    return found


def table(markdown: str) -> dict[str, dict[str, str]]:
    """The report's node table: one dict per row (by state dir name), keyed by column."""
    rows = [line for line in tables(markdown)[0] if line.startswith("| ")]
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows[1:]]
    return {r[1]: dict(zip(header, r, strict=True)) for r in cells}


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def assert_plots(out: Path) -> None:
    for name in PLOTS:
        width, height = png_size(out / PLOTS_DIR / name)
        assert 600 <= width <= 2000
        assert 300 <= height <= 1200
        assert (out / PLOTS_DIR / name).stat().st_size > 10_000  # lines, not a blank canvas


A, B, C = "a" * 64, "b" * 64, "c" * 64


def test_a_report_of_three_nodes_one_restarting(tmp_path: Path) -> None:
    write_log(
        tmp_path / "node-0",
        [
            start(0, A),
            ev(10, 100, 0.50, 10, 1.0),
            ev(20, 200, 0.80, 20, 2.0),
            ev(30, 300, 0.90, 30, 3.0),
            stop(35, A, 300, 32, 3.5),
        ],
    )
    write_log(
        tmp_path / "node-1",
        [
            start(1, B),
            (2, "pulled_model", {"source": "127.0.0.1:7070", "source_step": 5}),
            ev(11, 100, 0.60, 11, 1.0),
            ev(21, 200, 0.95, 21, 2.0),
            ev(31, 300, 0.93, 31, 3.0),
            stop(36, B, 300, 33, 3.25),
        ],
    )
    # Dies after step 150 (no stop record), restarts 10 s later on the same state dir; its
    # counters start again from zero, its steps do not.
    write_log(
        tmp_path / "node-2",
        [
            start(2, C),
            ev(12, 100, 0.55, 9, 0.5),
            (14, "checkpoint", {"step": 150}),
            start(24, C),
            ev(30, 200, 0.85, 4, 0.25),
            ev(38, 300, 0.91, 15, 1.0),
            stop(40, C, 300, 16, 1.5),
        ],
    )
    (tmp_path / "node-3").mkdir()  # never started: no metrics log

    dirs = [tmp_path / f"node-{i}" for i in range(4)]
    path = write_report(dirs, tmp_path / "out")

    assert path == tmp_path / "out" / REPORT_FILE
    assert_plots(tmp_path / "out")
    markdown = path.read_text()
    rows = table(markdown)
    assert set(rows) == {"node-0", "node-1", "node-2"}
    assert rows["node-0"]["node"] == "aaaaaaaa"
    assert [rows[d]["last eval accuracy"] for d in ("node-0", "node-1", "node-2")] == [
        "0.9000",
        "0.9300",
        "0.9100",
    ]
    assert rows["node-1"]["best eval accuracy"] == "0.9500"
    assert [rows[d]["restarts"] for d in ("node-0", "node-1", "node-2")] == ["0", "0", "1"]
    assert [rows[d]["pulled model"] for d in ("node-0", "node-1", "node-2")] == ["no", "yes", "no"]
    assert rows["node-2"]["steps"] == "300"
    assert rows["node-2"]["rounds"] == str(9 + 16)  # the crashed life's last eval, then stop
    assert rows["node-2"]["sent"] == "2.00 MiB"
    assert rows["node-1"]["vs fp32"] == "25.0%"
    assert rows["node-0"]["shard"] == "-"  # no checkpoint says
    assert "distance to average (RMS)" not in rows["node-0"]
    assert f"skipped `{tmp_path / 'node-3'}`: no {METRICS_FILE}" in markdown
    assert "the logs begin 2023-11-14 22:13:20 UTC and span 40 s" in markdown
    for name in PLOTS:
        assert f"]({PLOTS_DIR}/{name})" in markdown

    # Over time, every 4 s of the 40 s: accuracy / distance to the neighbours as last evaluated,
    # and node-2 down from its last record before the crash (14 s) until it started again.
    over_time = tables(markdown)[1]
    assert over_time[0] == "| time (s) | aaaaaaaa | bbbbbbbb | cccccccc |"
    cells = {row.split("|")[1].strip(): row.split("|")[2:5] for row in over_time[2:]}
    assert list(cells) == [str(t) for t in range(4, 41, 4)]
    at = {t: [c.strip() for c in row] for t, row in cells.items()}
    assert at["4"] == ["-", "-", "-"]
    assert at["12"] == ["0.500 / 9.1e-03", "0.600 / 8.3e-03", "0.550 / 7.7e-03"]
    assert at["16"][2] == at["20"][2] == "down"
    assert at["24"][2] == "-"  # started again, not evaluated yet
    assert at["40"] == ["0.900 / 3.2e-03", "0.930 / 3.1e-03", "0.910 / 2.6e-03"]


def digits_state(value: float) -> dict[str, torch.Tensor]:
    names = parameter_names("digits")
    shapes = {"0.weight": (64, 64), "0.bias": (64,), "2.weight": (10, 64), "2.bias": (10,)}
    assert sorted(names) == sorted(shapes)
    return {name: torch.full(shapes[name], value) for name in names}


def test_final_distances_come_from_the_checkpoints(tmp_path: Path) -> None:
    # Every parameter is 0 on one node and 2 on the other: both are exactly 1 from the average.
    for i, (node_id, value) in enumerate(((A, 0.0), (B, 2.0))):
        write_log(tmp_path / f"node-{i}", [start(i, node_id), ev(10, 100, 0.9, 10, 1.0)])
        meta = {"node_id": node_id, "task": "digits", "fingerprint": "f", "shard": [i, 2]}
        model = digits_state(value)
        public = torch.cat([t.flatten() for t in model.values()])
        save_checkpoint(
            tmp_path / f"node-{i}" / CHECKPOINT_FILE, Checkpoint(model, public, None, meta)
        )

    markdown = write_report([tmp_path / "node-0", tmp_path / "node-1"], tmp_path).read_text()

    rows = table(markdown)
    assert [rows[d]["shard"] for d in ("node-0", "node-1")] == ["0/2", "1/2"]
    assert [rows[d]["distance to average (RMS)"] for d in ("node-0", "node-1")] == ["1.000e+00"] * 2
    numel = 64 * 64 + 64 + 10 * 64 + 10
    assert f"(1/n) Σ ||x_i - x̄||² = {numel:.3e}" in markdown


def test_checkpoints_of_different_tasks_give_no_distance(tmp_path: Path) -> None:
    for i, fingerprint in enumerate(("f", "g")):
        write_log(tmp_path / f"node-{i}", [start(i, A if i else B), ev(10, 100, 0.9, 10, 1.0)])
        meta = {"task": "digits", "fingerprint": fingerprint}
        save_checkpoint(
            tmp_path / f"node-{i}" / CHECKPOINT_FILE,
            Checkpoint(digits_state(0.0), torch.zeros(1), None, meta),
        )
    markdown = write_report([tmp_path / "node-0", tmp_path / "node-1"], tmp_path).read_text()
    assert "distance to average (RMS)" not in table(markdown)["node-0"]
    assert "no distance to the average of the final models: the checkpoints are of" in markdown


def test_state_dirs_without_metrics_logs_are_refused(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / METRICS_FILE).write_text("")
    with pytest.raises(ValueError, match="no state dir holds a metrics log"):
        write_report([tmp_path / "a", tmp_path / "b"], tmp_path)
    assert not (tmp_path / REPORT_FILE).exists()


async def murmur_report(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "node",
        "report",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_murmur_report_on_a_real_run(tmp_path: Path) -> None:
    settings = {"trainer.steps": 40, "trainer.eval_every": 10}
    async with memory_swarm(tmp_path, 3, settings) as nodes:
        for n in nodes:
            await n.wait_until(n.training_finished.is_set, 60)
        ids = [n.node_id for n in nodes]
    # Leaving the block stopped every node: each wrote its final checkpoint and stop record.

    code, out, err = await murmur_report(*(str(tmp_path / f"node-{i}") for i in range(3)))

    assert code == 0, err
    check_real_report(tmp_path, out, ids)


def check_real_report(run: Path, out: str, ids: list[str]) -> None:
    assert out.strip() == f"report: {run.resolve() / REPORT_FILE}"
    assert_plots(run)
    rows = table((run / REPORT_FILE).read_text())
    assert [rows[f"node-{i}"]["node"] for i in range(3)] == [i[:8] for i in ids]
    assert {r["steps"] for r in rows.values()} == {"40"}
    assert [rows[f"node-{i}"]["shard"] for i in range(3)] == ["0/3", "1/3", "2/3"]
    # The first node started the swarm; the others joined through it and pulled its model.
    assert [rows[f"node-{i}"]["pulled model"] for i in range(3)] == ["no", "yes", "yes"]
    assert {r["restarts"] for r in rows.values()} == {"0"}
    for row in rows.values():
        assert 0.0 < float(row["last eval accuracy"]) <= float(row["best eval accuracy"]) <= 1.0
        assert int(row["rounds"]) > 0
        assert 0.0 <= float(row["distance to average (RMS)"]) < 0.1


@pytest.mark.parametrize(
    ("make", "message"),
    [
        ("empty", "no state dir holds a metrics log (metrics.jsonl)"),
        ("missing", "not a directory"),
    ],
)
def test_murmur_report_on_bad_input_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: str, message: str
) -> None:
    target = tmp_path / "state"
    if make == "empty":
        target.mkdir()
    code = main(["report", str(target), "--out", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert code == 2
    assert f"murmur report: {message}" in err
    assert out == ""
    assert not (tmp_path / "out" / REPORT_FILE).exists()
