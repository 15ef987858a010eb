"""A wider model on the digits data (about 1.2M parameters), where compute per step matters."""

from __future__ import annotations

from torch import nn
from torch.utils.data import TensorDataset

from node.tasks import Shard, Task
from node.tasks.digits import load_split


def make_task(shard: Shard) -> Task:
    train, test = load_split()
    mine = shard.split(train.tensors[1])
    model = nn.Sequential(
        nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)
    )
    return Task(
        model=model,
        train=TensorDataset(train.tensors[0][mine], train.tensors[1][mine]),
        eval=test,
        batch_size=64,
    )
