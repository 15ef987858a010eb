"""A cheap built-in task: multinomial logistic regression on synthetic Gaussian classes.

Ten classes in 32 dimensions, each a unit Gaussian around a mean drawn once (scale 0.5, so the
classes overlap and the best linear model scores about 0.85); 330 parameters, a step costs tens
of microseconds. It is the task that lets ``murmur simulate`` run a thousand nodes on one
machine, and the daemon runs it too (``--task logistic``), so the two can be compared on it.

The data are fixed by :data:`DATA_SEED` (every node, every run, the same); the training pool
has :data:`EXAMPLES_PER_SHARD` examples per shard, split by ``shard.split`` (iid, or non-iid by
label with a Dirichlet ``alpha``) like the other tasks. The pool, its split and the evaluation
set are built once per process and shared: a node keeps only its own shard (a copy of its
rows), and the simulator's thousand nodes share one evaluation set instead of a thousand.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.utils.data import TensorDataset

from node.tasks.base import Shard, Task

__all__ = ["CLASSES", "FEATURES", "make_task"]

FEATURES = 32
CLASSES = 10
MEAN_SCALE = 0.5
EXAMPLES_PER_SHARD = 128
MIN_TRAIN_EXAMPLES = 4096
EVAL_EXAMPLES = 2000
DATA_SEED = 0
LR = 0.05
MOMENTUM = 0.9
BATCH_SIZE = 16


@functools.cache
def _means() -> torch.Tensor:
    gen = torch.Generator().manual_seed(DATA_SEED)
    return torch.randn(CLASSES, FEATURES, generator=gen) * MEAN_SCALE  # (classes, features)


def _draw(n: int, salt: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(DATA_SEED * 1_000_003 + salt)
    y = torch.randint(0, CLASSES, (n,), generator=gen)
    x = _means()[y] + torch.randn(n, FEATURES, generator=gen)
    return x, y


@functools.lru_cache(maxsize=2)
def _pool(count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The training pool for ``count`` shards: (examples, features) and (examples,) labels."""
    return _draw(max(MIN_TRAIN_EXAMPLES, EXAMPLES_PER_SHARD * count), salt=1)


@functools.lru_cache(maxsize=4)
def _parts(count: int, alpha: float | None, seed: int) -> tuple[torch.Tensor, ...]:
    _, y = _pool(count)
    return tuple(Shard(0, count, alpha, seed).split_all(y))


@functools.cache
def eval_set() -> TensorDataset:
    """The held-out examples every node evaluates on (shared, not copied)."""
    return TensorDataset(*_draw(EVAL_EXAMPLES, salt=2))


def _optimizer(params: object) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)  # type: ignore[arg-type]


def make_task(shard: Shard) -> Task:
    x, y = _pool(shard.count)
    # Split once for every shard of this process (the simulator asks for thousands).
    mine = _parts(shard.count, shard.alpha, shard.seed)[shard.index]
    return Task(
        model=nn.Linear(FEATURES, CLASSES),
        train=TensorDataset(x[mine].clone(), y[mine].clone()),
        eval=eval_set(),
        batch_size=BATCH_SIZE,
        optimizer=_optimizer,
    )
