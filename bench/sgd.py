"""The text task on SGD with Nesterov momentum instead of AdamW: the optimizer CHOCO-SGD's
published reference trains with, under which averaging the nodes' models after a step is the
step of their mean gradient (the step is linear in the gradient), so all that separates gossip
from all-reduce is the codec and the consensus error. ``make_task`` is for the simulator and
bench/allreduce.py (``--task bench.sgd:make_task:size=1m,...,lr=0.1``; 0.1 was all-reduce's
best rate on the 1M model, bench/RESULTS.md "On the reference's optimizer").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import torch
from torch import nn

from node.tasks import text
from node.tasks.base import Shard, Task
from node.tasks.schedules import decay_groups

__all__ = ["make_task"]


def make_task(
    shard: Shard,
    size: str = "1m",
    seq_len: int = 128,
    batch_size: int = 16,
    lr: float = 0.1,
    warmup: int = 100,
    split: str = "package",
    momentum: float = 0.9,
    weight_decay: float = 1e-4,
) -> Task:
    """The text task (these options as ``text``'s) on SGD with Nesterov ``momentum`` and
    ``weight_decay`` on matrices only, as AdamW's is."""
    task = text.make_task(shard, size, seq_len, batch_size, lr, warmup, split=split)

    def make(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        groups = decay_groups(params, weight_decay)
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=True)

    return dataclasses.replace(task, optimizer=make)
