"""A task plug-in of your own: a small CNN on synthetic "bars" images, with every option used.

Run two nodes on it from the repository's root, each in its own terminal (over plain TCP on
loopback; for mutual TLS, give each a certificate from `murmur ca issue` instead of --insecure):

    murmur run --task examples/custom_task.py:make_task --listen 127.0.0.1:7070 --insecure \\
        --state-dir /tmp/a --shard 0/2 --wait-members 2 --steps 300
    murmur run --task examples/custom_task.py:make_task --listen 127.0.0.1:7071 --insecure \\
        --state-dir /tmp/b --shard 1/2 --wait-members 2 --steps 300 --join 127.0.0.1:7070

The factory receives a ``Shard`` (this node's index and the shard count, plus the ``--alpha``
and ``--seed`` flags through ``shard.split``) and returns a ``Task``. The node seeds torch with the
swarm's seed right before calling it, so every node builds the same initial model; data the
factory generates must come from its own seeded generator, as below, so that every node sees the
same data set and only the split differs.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from torch.utils.data import TensorDataset

from node.tasks import Shard, Task

SIZE = 12  # images are SIZE x SIZE
CLASSES = 4  # horizontal, vertical, diagonal, anti-diagonal bar


def _bars(n: int, seed: int) -> TensorDataset:
    """Noisy images of a bar in one of four orientations; the label is the orientation."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, CLASSES, (n,), generator=g)
    offsets = torch.randint(-3, 4, (n,), generator=g)
    images = 0.5 * torch.randn(n, 1, SIZE, SIZE, generator=g)
    r = torch.arange(SIZE)
    for k in range(n):
        o, label = int(offsets[k]), int(labels[k])
        line = (r + o).clamp(0, SIZE - 1)
        if label == 0:
            images[k, 0, line[SIZE // 2], :] += 2.0
        elif label == 1:
            images[k, 0, :, line[SIZE // 2]] += 2.0
        elif label == 2:
            images[k, 0, r, (r + o) % SIZE] += 2.0
        else:
            images[k, 0, r, (SIZE - 1 - r + o) % SIZE] += 2.0
    return TensorDataset(images, labels)


def _adam(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=3e-3)


def make_task(shard: Shard) -> Task:
    train = _bars(2000, seed=1)  # the same on every node...
    mine = shard.split(train.tensors[1])  # ...cut by the node's --shard and --alpha
    model = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * (SIZE // 2) ** 2, CLASSES),
    )
    return Task(
        model=model,
        train=TensorDataset(*(t[mine] for t in train.tensors)),
        eval=_bars(500, seed=2),
        loss=nn.functional.cross_entropy,
        batch_size=64,
        optimizer=_adam,
    )
