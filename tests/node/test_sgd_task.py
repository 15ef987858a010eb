"""bench/sgd.py: the text task on SGD with Nesterov momentum, decay on matrices only."""

from __future__ import annotations

import torch

from bench.sgd import make_task
from node.tasks.base import Shard


def test_the_text_task_trains_on_nesterov_sgd() -> None:
    task = make_task(Shard(0, 8), size="1m", seq_len=16, batch_size=2, lr=0.3, warmup=2)
    opt = task.make_optimizer()
    assert isinstance(opt, torch.optim.SGD)
    assert all(g["nesterov"] and g["momentum"] == 0.9 and g["lr"] == 0.3 for g in opt.param_groups)
    decays = {p.dim() >= 2: g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    assert decays == {True: 1e-4, False: 0.0}
