"""A held trainer (node/daemon/trainer.py :meth:`Trainer.hold`, the bound on local steps) takes
no step until it is released, and a stop ends it while held."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.data import TensorDataset

from node.daemon.trainer import Trainer, TrainerConfig
from node.tasks.base import Task

TIMEOUT_S = 30.0


def task() -> Task:
    torch.manual_seed(0)
    x, y = torch.randn(64, 5), torch.randint(0, 3, (64,))
    data = TensorDataset(x, y)
    return Task(model=nn.Linear(5, 3), train=data, eval=data, batch_size=16)


def held_at(
    at: int, steps: int, then: Callable[[int], None] = lambda step: None
) -> tuple[Trainer, threading.Event]:
    """A started trainer of ``steps`` that holds itself after step ``at``, from its own thread
    as the scheduler does; the event is set once it did. ``then`` sees every step after."""
    at_bound = threading.Event()

    def after_step(step: int) -> None:
        if step == at:
            trainer.hold()
            at_bound.set()
        then(step)

    cfg = TrainerConfig(steps=steps, eval_every=10 * steps)
    trainer = Trainer(task(), torch.device("cpu"), threading.Lock(), cfg, after_step=after_step)
    trainer.start()
    return trainer, at_bound


def test_a_held_trainer_takes_its_next_step_only_after_its_release() -> None:
    released = threading.Event()
    released_by_step_6: list[bool] = []

    def then(step: int) -> None:
        if step == 6:
            released_by_step_6.append(released.is_set())

    trainer, at_bound = held_at(5, 10, then)
    try:
        assert at_bound.wait(TIMEOUT_S)
        released.set()
        trainer.release()
        assert trainer.done.wait(TIMEOUT_S)
    finally:
        trainer.request_stop()
        trainer.join(TIMEOUT_S)
    assert trainer.error is None
    assert released_by_step_6 == [True]  # step 6 came after the release, not before
    assert trainer.step == 10
    assert not trainer.paused  # held is not paused: the status says paused for a pause only


def test_a_stop_ends_a_held_trainer() -> None:
    trainer, at_bound = held_at(3, 1_000)
    assert at_bound.wait(TIMEOUT_S)
    trainer.request_stop()
    trainer.join(TIMEOUT_S)
    assert not trainer.running  # the thread ended: join did not time out on a held loop
    assert trainer.step == 3


def test_throughput_leaves_out_the_time_held() -> None:
    """Held for half a second, far longer than ten steps of a tiny model take: samples per
    second over the training time only comes out well above samples over the whole run."""
    hold_s = 0.5
    began = time.perf_counter()
    trainer, at_bound = held_at(5, 10)
    try:
        assert at_bound.wait(TIMEOUT_S)
        threading.Event().wait(hold_s)  # the hold's length: time passing, not an event awaited
        trainer.release()
        assert trainer.done.wait(TIMEOUT_S)
    finally:
        trainer.request_stop()
        trainer.join(TIMEOUT_S)
    whole = trainer.samples / (time.perf_counter() - began)
    assert trainer.samples_per_s > 2 * whole, (trainer.samples_per_s, whole)
