"""The README's commands for the built-in mnist1d and text tasks, run exactly as written (in a
fresh folder, as a user would), and what they must show."""

from __future__ import annotations

import json
import math
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_commands() -> list[str]:
    """The sh block of the README's "Built-in tasks" section."""
    text = README.read_text()
    section = text[text.index("## Built-in tasks") :]
    block = section[section.index("```sh\n") + 6 :]
    return block[: block.index("```")].strip().splitlines()


def murmur(command: str, cwd: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    argv = shlex.split(command)
    assert argv[0] == "murmur"
    return subprocess.run(
        [sys.executable, "-m", "node", *argv[1:]],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def test_the_readme_shows_these_commands() -> None:
    assert [c.split()[1:5] for c in readme_commands()] == [
        ["swarm", "--nodes", "4", "--task"],
        ["swarm", "--nodes", "4", "--task"],
        ["simulate", "--nodes", "8", "--task"],
    ]


@pytest.mark.timeout(1200)
def test_a_swarm_learns_mnist1d_to_its_target(tmp_path: Path) -> None:
    run = murmur(readme_commands()[0], tmp_path, 1150)
    assert run.returncode == 0, run.stderr[-4000:]
    (workdir,) = (tmp_path / "murmur-runs").iterdir()
    report = json.loads((workdir / "report.json").read_text())
    assert report["metric"] == "accuracy"
    assert report["averaged_accuracy"] >= report["target"] == 0.8
    assert all(n["accuracy"] >= 0.75 for n in report["nodes"])
    assert (workdir / "plots" / "accuracy.png").is_file()


@pytest.mark.timeout(1200)
def test_a_text_swarm_reports_eval_loss_and_perplexity(tmp_path: Path) -> None:
    run = murmur(readme_commands()[1], tmp_path, 1150)
    assert run.returncode == 0, run.stderr[-4000:]
    (workdir,) = (tmp_path / "murmur-runs").iterdir()
    report = json.loads((workdir / "report.json").read_text())
    assert report["metric"] == "perplexity"
    assert report["averaged_accuracy"] is None
    assert report["averaged_loss"] < math.log(256) - 1.5  # far below a uniform guess
    assert "ppl" in run.stdout.split()  # the live table's eval perplexity column
    assert "perplexity" in (workdir / "report.md").read_text()
    assert (workdir / "plots" / "perplexity.png").is_file()
    assert not (workdir / "plots" / "accuracy.png").exists()


@pytest.mark.timeout(1200)
def test_a_simulated_text_swarm_is_judged_by_its_loss(tmp_path: Path) -> None:
    run = murmur(readme_commands()[2], tmp_path, 1150)
    assert run.returncode == 0, run.stderr[-4000:]
    records = [
        json.loads(line)
        for line in (tmp_path / "murmur-sim" / "sim.jsonl").read_text().splitlines()
    ]
    summary = records[-1]
    assert (summary["record"], summary["metric"], summary["target"]) == (
        "summary",
        "perplexity",
        2.0,
    )
    assert summary["final"]["avg_loss"] < math.log(256) - 1.0
    assert "loss avg=" in run.stdout
