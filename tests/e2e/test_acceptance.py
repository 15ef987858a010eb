"""The acceptance run of a working swarm: 8 real node processes, non-iid shards, int8 gossip.

Gated on results, not on time: each node trains a fixed number of steps, however long it takes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

NODES, STEPS = 8, 600


@pytest.mark.timeout(900)
def test_eight_nodes_on_non_iid_shards_match_one_process_on_all_the_data(tmp_path: Path) -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "node",
            "swarm",
            "--nodes",
            str(NODES),
            "--topology",
            "exponential",
            "--compress",
            "int8",
            "--alpha",
            "0.5",
            "--steps",
            str(STEPS),
            "--workdir",
            str(tmp_path),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=850,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads((tmp_path / "report.json").read_text())
    nodes = report["nodes"]
    assert len(nodes) == NODES
    assert {n["steps"] for n in nodes} == {STEPS}
    for n in nodes:
        # Each node's own model, both when its budget ran out and after the last rounds. At the
        # end of its budget the node of the hardest shard (2) may still be mixing its way in:
        # its lowest figure, over ten runs on two cores (and four at the last commit that
        # landed, the same spread), was 0.908-0.969, below 0.93 in two of the ten. After the
        # last rounds every node was at 0.966 or more.
        assert n["trained_accuracy"] >= 0.90, n
        assert n["accuracy"] >= 0.93, n
        # int8 with per-block scales: at most 30% of what fp32 payloads would have taken.
        assert n["compression_ratio"] <= 0.30, n
    # The test set has 359 points, so 0.025 is 9 of them. Measured against the reference's
    # 0.9833: 0.9666-0.9805 over six runs on two cores (three at the commit before the relay
    # checks, three after: the same spread), and 0.9666 once in CI.
    assert report["averaged_accuracy"] >= report["reference_accuracy"] - 0.025
    # After the last rounds the nodes hold one model, and stopping them keeps it one. A stop
    # used to pull them apart: as members left, each node's view took back neighbours whose
    # copies it had parked at start-up, and mixed with those minutes-old copies before their
    # senders confirmed them. The final checkpoints were then 0.09-0.9 apart (squared
    # distance from their average; 7e-5 now) and the nodes' eval losses 0.086-0.218.
    assert report["consensus_distance"] < 1e-3
    losses = [n["loss"] for n in nodes]
    # One model up to the last rounds' disagreement: at a distance of 1.0e-4 the eval losses
    # were 0.0891-0.0910 (2.1% apart, make check on 2026-12-07), far from the 2.5 times of the
    # defect above.
    assert max(losses) <= 1.05 * min(losses), losses
    assert report["reference_steps"] == NODES * STEPS
    assert "averaged model" in run.stdout
    # The history over time, beside report.md.
    assert "| node | dir | shard |" in (tmp_path / "run-report.md").read_text()
    plots = {p.name for p in (tmp_path / "plots").iterdir()}
    assert plots == {"loss.png", "accuracy.png", "distance.png"}
