"""Evaluation after the step budget: a read, at a bounded rate, and progress for big writes."""

from __future__ import annotations

import asyncio
import copy
import logging
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from node.daemon.trainer import EvalResult, Trainer, TrainerConfig
from node.tasks.base import Task
from node.telemetry.console import CheckpointProgress
from node.telemetry.progress import TickerConfig

TIMEOUT_S = 30.0
INTERVAL_S = 0.05
AFTER_BUDGET = 4


def task() -> Task:
    """Batch norm (buffers a forward pass in train mode would move) and dropout (which would
    draw from torch's generator): an evaluation that changes either is no read."""
    torch.manual_seed(0)
    x, y = torch.randn(64, 5), torch.randint(0, 3, (64,))
    model = nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 3))
    return Task(model=model, train=TensorDataset(x, y), eval=TensorDataset(x, y), batch_size=16)


def test_a_finished_trainer_evaluates_at_most_every_interval_and_changes_nothing() -> None:
    t = task()
    lock = threading.Lock()
    results: list[EvalResult] = []
    enough = threading.Event()
    frozen: dict[str, Any] = {}

    def on_eval(result: EvalResult) -> None:
        results.append(result)
        if sum(r.after_budget for r in results) >= AFTER_BUDGET:
            enough.set()

    def on_done() -> None:  # on the trainer's thread, before any evaluation after the budget
        with lock:
            frozen["model"] = copy.deepcopy(t.model.state_dict())
            frozen["optimizer"] = copy.deepcopy(trainer.optimizer.state_dict())
            frozen["rng"] = torch.get_rng_state()

    cfg = TrainerConfig(steps=6, eval_every=3, idle_eval_interval_s=INTERVAL_S)
    trainer = Trainer(t, torch.device("cpu"), lock, cfg, on_eval=on_eval, on_done=on_done)
    trainer.start()
    try:
        assert enough.wait(TIMEOUT_S), f"only {len(results)} evaluations"
        assert trainer.done.is_set()
        assert not trainer.running  # training is over, though the thread still evaluates
    finally:
        trainer.request_stop()
        trainer.join(TIMEOUT_S)
    assert trainer.error is None
    during = [r for r in results if not r.after_budget]
    after = [r for r in results if r.after_budget]
    assert [r.step for r in during] == [3, 6]
    assert all(r.step == 6 for r in after)
    gaps = [b.time - a.time for a, b in zip([during[-1], *after], after, strict=False)]
    assert min(gaps) >= INTERVAL_S * 0.99, gaps  # never more often than the interval
    # A read: parameters, buffers, optimizer state and torch's generator are as they were.
    assert trainer.step == 6
    model = t.model.state_dict()
    assert all(torch.equal(model[k], v) for k, v in frozen["model"].items())
    assert str(trainer.optimizer.state_dict()) == str(frozen["optimizer"])
    assert torch.equal(torch.get_rng_state(), frozen["rng"])
    assert t.model.training  # back in train mode
    # The same model scores the same every time.
    assert len({(r.loss, r.accuracy) for r in after}) == 1


def test_a_trainer_stopped_before_its_budget_does_not_go_on_evaluating() -> None:
    t = task()
    stepped = threading.Event()
    results: list[EvalResult] = []
    cfg = TrainerConfig(steps=10**9, eval_every=10**9, idle_eval_interval_s=INTERVAL_S)
    trainer = Trainer(
        t,
        torch.device("cpu"),
        threading.Lock(),
        cfg,
        after_step=lambda step: stepped.set(),
        on_eval=results.append,
    )
    trainer.start()
    assert stepped.wait(TIMEOUT_S)
    trainer.request_stop()
    trainer.join(TIMEOUT_S)
    assert trainer.done.is_set()
    assert results == []  # the node was stopped, not finished: no evaluation at all


def test_a_slow_evaluation_waits_nine_times_its_length() -> None:
    cfg = TrainerConfig(idle_eval_interval_s=5.0)
    assert cfg.idle_eval_wait(0.01) == 5.0  # digits: a few ms, the interval rules
    assert cfg.idle_eval_wait(2.0) == pytest.approx(18.0)  # a big model: 10% of the time


async def test_a_trainer_without_an_idle_interval_ends_with_its_budget() -> None:
    results: list[EvalResult] = []
    cfg = TrainerConfig(steps=4, eval_every=2, idle_eval_interval_s=None)
    trainer = Trainer(task(), torch.device("cpu"), threading.Lock(), cfg, on_eval=results.append)
    trainer.start()
    # Nobody asks it to stop (the reference run of murmur swarm): its thread ends by itself.
    try:
        await asyncio.wait_for(asyncio.to_thread(trainer.join), TIMEOUT_S)
    finally:
        trainer.request_stop()
    assert trainer.done.is_set()
    assert [(r.step, r.after_budget) for r in results] == [(2, False), (4, False)]


def test_the_idle_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="idle_eval_interval_s must be positive"):
        TrainerConfig(idle_eval_interval_s=0)


async def test_a_long_checkpoint_write_says_how_long_it_runs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spoke = threading.Event()

    class Spoke(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "so far" in record.getMessage():
                spoke.set()

    def slow_write() -> str:  # a write that lasts until its progress has been reported
        assert spoke.wait(TIMEOUT_S)
        return "written"

    fast = TickerConfig(first_s=0.0, every_s=3600.0, growth=1.0, max_s=3600.0)
    progress = CheckpointProgress(tmp_path / "checkpoint.safetensors", poll_s=0.01, ticks=fast)
    handler = Spoke()
    logging.getLogger("node.telemetry.console").addHandler(handler)
    try:
        with caplog.at_level(logging.INFO, logger="node.telemetry.console"):
            got = await progress.run("writing the final checkpoint", 3 * 2**30, slow_write, True)
            # A quick periodic write says nothing.
            await progress.run("writing a checkpoint", 10, lambda: "ok", False)
    finally:
        logging.getLogger("node.telemetry.console").removeHandler(handler)
    assert got == "written"
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0].startswith("writing the final checkpoint (3.00 GiB): ")
    assert messages[0].endswith("so far, no estimate yet (the first write)")
    assert messages[-1].startswith("writing the final checkpoint: 3.00 GiB in ")
    assert not [m for m in messages if m.startswith("writing a checkpoint")]
    assert progress.rate is not None  # the next write's estimate


EXIT_SCRIPT = """
import atexit, threading, torch
from tests.node.test_idle_eval import task
from node.daemon.trainer import Trainer, TrainerConfig

seen = {}
# Registered first, so it runs after the trainer's own hook (atexit runs last in, first out).
atexit.register(lambda: print("trainer alive at exit:", seen["t"].is_alive(), flush=True))
cfg = TrainerConfig(steps=3, eval_every=3, idle_eval_interval_s=0.01)
trainer = Trainer(task(), torch.device("cpu"), threading.Lock(), cfg)
trainer.start()
assert trainer.done.wait(30)
seen["t"] = trainer._thread
"""


def test_a_trainer_still_evaluating_is_stopped_before_the_interpreter_exits() -> None:
    """A daemon thread inside torch when the interpreter ends is killed there, which aborts
    the process; the trainer's exit hook stops it first, and the process exits cleanly."""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "trainer alive at exit: False" in done.stdout
