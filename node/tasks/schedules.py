"""Optimizers and learning-rate schedules that real tasks need, as the factories a Task takes.

Both build on torch's own: ``torch.optim.AdamW`` (Loshchilov and Hutter, 2019) and a
``LambdaLR`` whose factor is linear warmup then cosine decay (Loshchilov and Hutter, 2017,
SGDR; the schedule nanoGPT and most GPT recipes use). A ``LambdaLR``'s state is its step count
and base rates, which the node checkpoints with the optimizer's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from node.tasks.base import OptimizerFactory, ScheduleFactory

__all__ = ["adamw", "decay_groups", "warmup_cosine", "warmup_cosine_factor"]


def adamw(
    lr: float = 1e-3,
    weight_decay: float = 0.1,
    betas: tuple[float, float] = (0.9, 0.95),
) -> OptimizerFactory:
    """AdamW with weight decay on matrices only (weights of linear layers and embeddings), not
    on biases and norm gains, as GPT-2 and nanoGPT train (decaying a gain or a bias only pulls
    it towards zero, which no one wants).

    Returns:
        A factory of the optimizer from the model's parameters (``Task.optimizer``).
    """

    def make(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.AdamW(decay_groups(params, weight_decay), lr=lr, betas=betas)

    return make


def decay_groups(params: Iterable[nn.Parameter], weight_decay: float) -> list[dict[str, Any]]:
    """The parameter groups of :func:`adamw`: ``weight_decay`` on matrices, none on biases and
    gains (a group left empty is left out)."""
    params = list(params)
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return [g for g in groups if g["params"]]


def warmup_cosine_factor(
    step: int, warmup: int, total: int | None, min_ratio: float = 0.1
) -> float:
    """The factor on the base learning rate at ``step`` (counted from 0): linear from 1/warmup
    to 1 over ``warmup`` steps, then cosine down to ``min_ratio`` at ``total``, and flat after
    it; without a ``total`` (no step budget), flat at 1 after the warmup."""
    if step < warmup:
        return (step + 1) / warmup
    if total is None or total <= warmup:
        return 1.0 if total is None else min_ratio
    progress = min(1.0, (step - warmup) / (total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def warmup_cosine(warmup: int = 100, min_ratio: float = 0.1) -> ScheduleFactory:
    """Linear warmup over ``warmup`` steps, then cosine decay to ``min_ratio`` of the base rate
    at the end of the node's step budget (``--steps``); without a budget, constant after the
    warmup.

    Returns:
        A factory of the schedule from the optimizer and the step budget (``Task.schedule``).
    """
    if warmup < 0 or not 0 <= min_ratio <= 1:
        raise ValueError("warmup must be >= 0 and min_ratio in [0, 1]")

    def make(
        optimizer: torch.optim.Optimizer, steps: int | None
    ) -> torch.optim.lr_scheduler.LRScheduler:
        def factor(step: int) -> float:
            return warmup_cosine_factor(step, warmup, steps, min_ratio)

        return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)

    return make
