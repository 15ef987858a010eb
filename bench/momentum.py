"""AdamW's first moment carried by gossip as part of the model: the nodes mix their momentum.

Under exact averaging of the models, eight AdamWs on eight non-iid shards end 3-8% above one
AdamW on the mean gradient (bench/optimizer_gap.py, ``local``): each node's first moment follows
its own shard, and AdamW's per-coordinate steps along eight different momenta do not average to
its step along their mean. Mixing the first moments as the models are mixed was meant to
remove that: the first moment is linear in the gradients, so the mean of the nodes' moments is
the moment of the mean gradient, and after a mix each node's is nearer that mean. The second
moments stay each node's own (the mean of squared small-batch gradients is larger than the
square of the mean gradient, and mixing it shrank the steps: ``moments`` in
bench/optimizer_gap.py).

Measured, it does not close the gap (bench/RESULTS.md, "Mixing AdamW's first moment"): without
the floor below, its gain in idealised gossip was a step of lr / eps on coordinates a node's
shard never touches, and with the floor it is gone; so the node's text task keeps AdamW.

Here each node's first moment lives in the model, as :class:`bench.tracking.Tracked`'s frozen
parameter beside each trained one, so the daemon's flat vector (node/daemon/flat.py) carries it
through the same codecs, replicas and error feedback as the model, at twice the bytes of a
round. :class:`MixedMomentumAdamW` reads it into AdamW's state before each step and writes it
back after. ``make_task`` is the text task with both, for the simulator
(``--task bench.momentum:make_task:size=1m,...``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from bench.tracking import Tracked, carrying
from node.tasks import text
from node.tasks.base import Shard, Task
from node.tasks.schedules import decay_groups

__all__ = ["MixedMomentumAdamW", "make_task"]


class MixedMomentumAdamW(torch.optim.AdamW):
    """AdamW over ``model``'s trained parameters whose first moment (``exp_avg``) is the frozen
    parameter beside each one, which gossip mixes between steps.

    The second moment stays the node's own, floored at the mixed first moment's square: where a
    node's shard gives a coordinate no gradient (a byte its text never holds), its own second
    moment is near zero while the mixed first moment is not, and m / sqrt(v) would step that
    coordinate by the learning rate over epsilon. With the floor, as for a node's own moments
    (v ≥ m², by convexity), no coordinate steps much more than the learning rate."""

    def __init__(self, model: Tracked, weight_decay: float = 0.1, **kwargs: Any) -> None:
        self._moment = {id(p): m for p, m in model.pairs()}
        super().__init__(decay_groups(model.inner.parameters(), weight_decay), **kwargs)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                if p.grad is not None and "exp_avg" in state:
                    m, v = state["exp_avg"], state["exp_avg_sq"]
                    m.copy_(self._moment[id(p)])
                    torch.maximum(v, m * m, out=v)
        loss: float | None = super().step(closure)
        for group in self.param_groups:
            for p in group["params"]:
                if "exp_avg" in self.state[p]:
                    self._moment[id(p)].copy_(self.state[p]["exp_avg"])
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
    """The text task (these options as ``text``'s) with its AdamW's first moment in the model,
    mixed by gossip: its model wrapped in :class:`Tracked`, its optimizer
    :class:`MixedMomentumAdamW`."""
    task = text.make_task(shard, size, seq_len, batch_size, lr, warmup, split=split)
    return carrying(task, lambda model: MixedMomentumAdamW(model, lr=lr, betas=(0.9, 0.95)))
