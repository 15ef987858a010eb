"""A held trainer (node/daemon/trainer.py :meth:`Trainer.hold`, the bound on local steps) takes
no step until it is released, and a stop ends it while held."""

from __future__ import annotations

import threading
import time

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


def test_a_held_trainer_takes_its_next_step_only_after_its_release() -> None:
    at_bound, released = threading.Event(), threading.Event()
    released_by_step_6: list[bool] = []

    def after_step(step: int) -> None:  # on the trainer's thread, as the scheduler holds it
        if step == 5:
            trainer.hold()
            at_bound.set()
        elif step == 6:
            released_by_step_6.append(released.is_set())

    cfg = TrainerConfig(steps=10, eval_every=100)
    trainer = Trainer(task(), torch.device("cpu"), threading.Lock(), cfg, after_step=after_step)
    trainer.start()
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
    at_bound = threading.Event()

    def after_step(step: int) -> None:
        if step == 3:
            trainer.hold()
            at_bound.set()

    cfg = TrainerConfig(steps=1_000, eval_every=10_000)
    trainer = Trainer(task(), torch.device("cpu"), threading.Lock(), cfg, after_step=after_step)
    trainer.start()
    assert at_bound.wait(TIMEOUT_S)
    trainer.request_stop()
    trainer.join(TIMEOUT_S)
    assert not trainer.running  # the thread ended: join did not time out on a held loop
    assert trainer.step == 3


def test_throughput_leaves_out_the_time_held() -> None:
    """Held for half a second, far longer than ten steps of a tiny model take: samples per
    second over the training time only comes out well above samples over the whole run."""
    hold_s = 0.5
    at_bound = threading.Event()

    def after_step(step: int) -> None:
        if step == 5:
            trainer.hold()
            at_bound.set()

    cfg = TrainerConfig(steps=10, eval_every=100)
    trainer = Trainer(task(), torch.device("cpu"), threading.Lock(), cfg, after_step=after_step)
    began = time.perf_counter()
    trainer.start()
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
