"""Tasks judged by their loss (the text task), end to end: the schedule is stepped and
checkpointed, and the report, the swarm's tables and the simulator show loss and perplexity."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from node.cli.evaluation import evaluate_run
from node.cli.report import PLOTS_DIR, REPORT_FILE, write_report
from node.cli.swarm import SwarmConfig
from node.cli.swarm_view import progress_view
from node.cli.tables import render_text
from node.daemon.checkpoint import (
    CHECKPOINT_FILE,
    Checkpoint,
    CheckpointError,
    check_fits,
    load_checkpoint,
    save_checkpoint,
)
from node.daemon.node import METRICS_FILE, Node
from node.sim import SimConfig, Simulation
from node.sim.config import NetConfig
from node.tasks import Shard, load_task
from node.tasks.schedules import warmup_cosine_factor
from node.transport.memory import MemoryNetwork, MemoryTransport
from tests.node.helpers import config, memory_swarm
from tests.node.test_builtin_tasks import TINY_TEXT
from tests.node.test_console import data_rows, status
from tests.node.test_report import table

#: The tiny text task with a short warmup, so that a 20-step run is well into its cosine.
TASK = f"{TINY_TEXT},warmup=5"
STEPS = 20


async def test_a_text_swarm_steps_and_checkpoints_its_schedule_and_reports_perplexity(
    tmp_path: Path,
) -> None:
    settings = {"task": TASK, "trainer.steps": STEPS, "trainer.eval_every": 10}
    async with memory_swarm(tmp_path, 2, settings) as nodes:
        for n in nodes:
            await n.wait_until(n.training_finished.is_set, 90)
        lr = [g["lr"] for g in nodes[0].trainer.optimizer.param_groups]
    dirs = [tmp_path / "node-0", tmp_path / "node-1"]
    assert lr == pytest.approx([1e-3 * warmup_cosine_factor(STEPS, 5, STEPS)] * 2)

    ckpt = load_checkpoint(dirs[0] / CHECKPOINT_FILE)
    assert ckpt.schedule is not None
    assert ckpt.schedule["last_epoch"] == STEPS
    start = json.loads((dirs[0] / METRICS_FILE).read_text().splitlines()[0])
    assert (start["event"], start["metric"], start["target"]) == ("start", "perplexity", 2.0)

    # A restart resumes the schedule where it was, under a larger budget.
    resumed = await Node.create(
        config(dirs[0], task=TASK, listen="mem:0", **{"trainer.steps": 2 * STEPS}),
        transport=MemoryTransport(MemoryNetwork()),
    )
    schedule = resumed.trainer.schedule
    assert schedule is not None
    assert schedule.last_epoch == STEPS
    schedule.step()  # the next step's rate comes from the new budget's cosine
    expected = 1e-3 * warmup_cosine_factor(STEPS + 1, 5, 2 * STEPS)
    assert resumed.trainer.optimizer.param_groups[0]["lr"] == pytest.approx(expected)

    path = write_report(dirs, tmp_path)
    markdown = path.read_text()
    rows = table(markdown)
    for row in rows.values():
        loss = float(row["last eval loss"])
        assert float(row["last eval perplexity"]) == pytest.approx(math.exp(loss), rel=1e-3)
        assert loss < math.log(256)  # it learned something
        assert float(row["best eval loss"]) <= loss
    assert "last eval accuracy" not in markdown
    assert (tmp_path / PLOTS_DIR / "perplexity.png").stat().st_size > 10_000
    assert not (tmp_path / PLOTS_DIR / "accuracy.png").exists()
    assert "target (eval loss <= 2):" in markdown
    assert path.name == REPORT_FILE

    report = evaluate_run(dirs, TASK, seed=0)
    assert report.metric == "perplexity"
    assert math.isnan(report.averaged_accuracy)
    text = report.to_markdown()
    assert "final perplexity" in text
    assert f"perplexity {math.exp(report.averaged_loss):.3f}" in text
    assert json.loads(report.to_json())["averaged_accuracy"] is None  # strict JSON


def test_the_live_table_shows_a_loss_judged_tasks_eval_loss_and_no_accuracy() -> None:
    # The Status RPC carries the eval loss; a task judged by loss reports accuracy -1 (none).
    judged_by_loss = status(node_id="a" * 32, eval_loss=1.5, eval_accuracy=-1.0)
    not_yet = status(node_id="b" * 32, eval_step=-1, eval_accuracy=-1.0)
    text = render_text(progress_view(SwarmConfig(nodes=2), [judged_by_loss, not_yet], 1.0), 200)
    rows = data_rows(text, ["a" * 12, "b" * 12])
    assert rows["a" * 12][3:5] == ["1.5000", "-"]
    assert rows["b" * 12][3:5] == ["-", "-"]
    # A perplexity task shows exp(eval loss) where an accuracy task shows its accuracy.
    text = render_text(
        progress_view(SwarmConfig(nodes=2), [judged_by_loss, not_yet], 1.0, "perplexity"), 200
    )
    assert "ppl" in text.split()
    assert "acc" not in text.split()
    rows = data_rows(text, ["a" * 12, "b" * 12])
    assert rows["a" * 12][3:5] == ["1.5000", f"{math.exp(1.5):.2f}"]
    assert rows["b" * 12][3:5] == ["-", "-"]


def test_the_simulator_judges_a_text_swarm_by_its_loss() -> None:
    torch.manual_seed(0)
    # A node trains once its edges are up both ways (the snapshots of a 4 MB model take 3.4 s
    # at the default 10 Mbit/s): an unlimited uplink keeps the run short.
    cfg = SimConfig(
        nodes=2,
        task=TASK,
        alpha=None,
        steps=10,
        step_time_s=0.1,
        duration_s=2.0,
        eval_every_s=1.0,
        net=NetConfig(bandwidth_bps=math.inf),
    )
    summary = Simulation(cfg).run()
    assert (summary.metric, summary.target) == ("perplexity", 2.0)
    first, last = summary.final, summary
    assert last.final.avg_loss < math.log(256) - 0.3
    assert last.final.worst_loss >= last.final.avg_loss - 0.5
    assert math.isnan(first.avg_accuracy)
    assert summary.target_avg_s is None  # 10 steps of 4 windows are far from 2.0


def test_a_checkpoint_whose_schedule_has_no_step_count_is_damaged(tmp_path: Path) -> None:
    torch.manual_seed(0)
    task = load_task(TASK)(Shard())
    model = task.model
    numel = sum(p.numel() for p in model.parameters())
    state = {k: v.clone() for k, v in model.state_dict().items()}
    good = Checkpoint(state, torch.zeros(numel), None, {"step": 3}, {"last_epoch": 3})
    check_fits(good, model, task.make_optimizer, tmp_path / "c")
    bad = Checkpoint(state, torch.zeros(numel), None, {"step": 3}, {"base_lrs": [1e-3]})
    with pytest.raises(CheckpointError, match="its learning-rate schedule has no step count"):
        check_fits(bad, model, task.make_optimizer, tmp_path / "c")
    save_checkpoint(tmp_path / "c", good)
    assert load_checkpoint(tmp_path / "c").schedule == {"last_epoch": 3}
