"""A task with a 50M-parameter model and almost no data: for moving big models around."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from node.tasks import Shard, Task

WIDTH = 7071  # a WIDTH x WIDTH layer and its bias: 50.0M parameters


def make_task(shard: Shard) -> Task:
    data = TensorDataset(torch.zeros(4, WIDTH), torch.zeros(4, dtype=torch.long))
    return Task(model=nn.Linear(WIDTH, WIDTH), train=data, eval=data)
