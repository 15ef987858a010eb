"""Digits with a training loss that turns NaN on a schedule: for the trainer's rollback.

``make_task`` diverges for good from the 20th step of a node's life on; ``make_task_once``
only at its 30th step. The model is digits' own, so these resume digits checkpoints.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from node.tasks import Shard, Task
from node.tasks.digits import make_task as make_digits


def poisoned(task: Task, bad: Callable[[int], bool]) -> Task:
    """``task`` whose n-th training loss (evaluations not counted) is NaN when ``bad(n)``."""
    calls = 0
    clean = task.loss

    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        nonlocal calls
        value = clean(output, target)
        if task.model.training:
            calls += 1
            if bad(calls):
                return value * float("nan")
        return value

    return dataclasses.replace(task, loss=loss)


def make_task(shard: Shard) -> Task:
    return poisoned(make_digits(shard), lambda n: n >= 20)


def make_task_once(shard: Shard) -> Task:
    return poisoned(make_digits(shard), lambda n: n == 30)
