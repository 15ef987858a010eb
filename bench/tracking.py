"""Gradient tracking carried by gossip as part of the model: AdamW on a tracked mean gradient.

Decentralized SGD on non-iid shards steps each node along its own shard's gradient; gossip
then pulls the models together, but every node's optimizer only ever sees its own gradients,
and AdamW's per-coordinate steps along eight different gradients do not average to its step
along their mean (bench/optimizer_gap.py measures that gap under exact averaging). Gradient
tracking (DIGing: Nedić, Olshevsky and Shi, SIAM J. Optim. 2017; with compressed gossip,
BEER: Zhao et al. 2022) gives each node a second vector y_i that gossip mixes like the model
and that each node corrects by its newest gradient's change:

    y_i ← y_i + g_i(t) − g_i(t−1)      (before the step; y_i starts at 0, g_i(−1) = 0)

Mixing preserves the nodes' sum of y (the mix's weights are symmetric), and each correction
adds what its node's gradient changed by, so the mean of the y_i is always the mean of the
newest gradients: each y_i tracks the mean gradient, and the node's AdamW steps on y_i.

Here y lives in the model: :class:`Tracked` holds a frozen parameter beside each trained one,
so the daemon's flat vector (node/daemon/flat.py gossips every parameter) carries y with the
model, through the same codecs, replicas and error feedback, at twice the bytes of a round.
:class:`TrackingAdamW` does the correction and steps on y. ``make_task`` is the text task with
both, for the simulator (``--task bench.tracking:make_task:size=1m,...``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn

from node.tasks import text
from node.tasks.base import Shard, Task
from node.tasks.schedules import decay_groups

__all__ = ["Tracked", "TrackingAdamW", "carrying", "make_task"]


class Tracked(nn.Module):
    """``inner`` with a tracker beside each of its parameters: a frozen parameter of the same
    shape, zero at the start, which gossip mixes like the rest and no gradient touches.
    ``forward`` is the inner model's, so evaluation does not see the trackers."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.trackers = nn.ParameterList(
            nn.Parameter(torch.zeros_like(p), requires_grad=False) for p in inner.parameters()
        )

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner(*args, **kwargs)

    def pairs(self) -> Iterator[tuple[nn.Parameter, nn.Parameter]]:
        """Each trained parameter with its tracker."""
        return zip(self.inner.parameters(), self.trackers, strict=True)


class TrackingAdamW(torch.optim.AdamW):
    """AdamW over ``model``'s trained parameters that steps on each one's tracker (the module
    docstring's y) after adding to it the change of the parameter's gradient since the last
    step. The last gradient is kept in the optimizer's state, so it is checkpointed with it."""

    def __init__(self, model: Tracked, weight_decay: float = 0.1, **kwargs: Any) -> None:
        self._tracker = {id(p): y for p, y in model.pairs()}
        super().__init__(decay_groups(model.inner.parameters(), weight_decay), **kwargs)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        raw = {}
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                y = self._tracker[id(p)]
                last = self.state[p].get("last_grad")
                y.add_(p.grad if last is None else p.grad - last)
                raw[p] = p.grad.clone()
                p.grad.copy_(y)
        loss: float | None = super().step(closure)
        for p, grad in raw.items():  # after the step: AdamW makes its state on an empty one
            self.state[p]["last_grad"] = grad
        return loss


def make_task(
    shard: Shard,
    size: str = "1m",
    seq_len: int = 128,
    batch_size: int = 16,
    lr: float = 1e-3,
    warmup: int = 100,
    split: str = "package",
) -> Task:
    """The text task (these options as ``text``'s) with gradient tracking: its model wrapped in
    :class:`Tracked`, its optimizer :class:`TrackingAdamW`."""
    task = text.make_task(shard, size, seq_len, batch_size, lr, warmup, split=split)
    return carrying(task, lambda model: TrackingAdamW(model, lr=lr, betas=(0.9, 0.95)))


def carrying(task: Task, optimizer: Callable[[Tracked], torch.optim.Optimizer]) -> Task:
    """``task`` with its model wrapped in :class:`Tracked` and ``optimizer`` of that wrapped
    model as its optimizer (which steps the inner model's parameters, not the carried ones)."""
    model = Tracked(task.model)

    def make(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        del params  # the trained ones are the inner model's; the carried ones are not stepped
        return optimizer(model)

    return dataclasses.replace(task, model=model, optimizer=make)
