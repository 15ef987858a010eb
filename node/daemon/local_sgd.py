"""Local SGD itself, without the thread: the trainer's config, what its evaluations and rollbacks
report, the endless batch stream and one step (node/daemon/trainer.py runs them on a thread of
its own; the simulator, node/sim, steps with them too)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, TensorDataset

from node.tasks.base import Task

__all__ = [
    "IDLE_EVAL_SHARE",
    "Diverged",
    "EvalResult",
    "Rollback",
    "TrainerConfig",
    "batches",
    "train_step",
]


@dataclass(frozen=True)
class TrainerConfig:
    """Args:
    steps: local step budget; None trains until stopped.
    eval_every: evaluate on the task's eval data every this many steps (and at the end).
    seed: seeds batch order (each node passes its own).
    step_time: emulate a device whose step takes at least this many seconds: a step that
        computes faster waits out the rest. Gives each node of a swarm on one machine a pace of
        its own, as separate devices have, instead of all of them sharing the cores.
    slowdown: make each step this many times as long as it naturally takes (its compute time,
        or ``step_time`` when that is longer), by waiting after it (>= 1; emulates a slow device
        in tests, benchmarks and the testbed).
    rollback_every: keep an in-memory copy of the model and optimizer every this many steps
        whose loss was finite; a loss that turns non-finite rolls back to the last one.
    max_rollbacks: rollbacks in a row (with no new finite copy between them) before the
        trainer gives up with :class:`Diverged`.
    idle_eval_interval_s: once the step budget is spent, evaluate at most this often (and at
        most a tenth of the time, for a model whose evaluation is slow), so that the accuracy a
        node reports follows its model as gossip keeps mixing it; the trainer's thread then
        runs until :meth:`Trainer.request_stop`. None: the thread ends with the budget (a
        trainer alone, whose model nothing else moves).
    """

    steps: int | None = None
    eval_every: int = 100
    seed: int = 0
    step_time: float = 0.0
    slowdown: float = 1.0
    rollback_every: int = 50  # a rollback loses at most this many steps; a copy costs ~1 step
    max_rollbacks: int = 3  # a model that diverges again at once is not healed by retrying
    # A status goes out every 2 s (MQTT) and a summary line every 10 s: a fresh figure for
    # every few of them is enough; one evaluation of digits takes ~0.2 ms (median, 1 thread).
    idle_eval_interval_s: float | None = 5.0

    def __post_init__(self) -> None:
        if self.idle_eval_interval_s is not None and not self.idle_eval_interval_s > 0:
            raise ValueError(
                f"idle_eval_interval_s must be positive, got {self.idle_eval_interval_s}"
            )
        if self.slowdown < 1:
            raise ValueError(f"slowdown must be at least 1, got {self.slowdown}")
        if self.step_time < 0:
            raise ValueError(f"step_time must not be negative, got {self.step_time}")
        if self.rollback_every < 1:
            raise ValueError(f"rollback_every must be at least 1, got {self.rollback_every}")
        if self.max_rollbacks < 0:
            raise ValueError(f"max_rollbacks must not be negative, got {self.max_rollbacks}")

    def idle_eval_wait(self, eval_s: float) -> float:
        """Seconds to wait, after the budget, after an evaluation that took ``eval_s``: the
        interval, or longer for a model so big that its evaluation would take more than
        :data:`IDLE_EVAL_SHARE` of the time."""
        interval = self.idle_eval_interval_s or 0.0
        return max(interval, eval_s * (1 - IDLE_EVAL_SHARE) / IDLE_EVAL_SHARE)

    def wait_after(self, compute_s: float) -> float:
        """Seconds to wait after a step that computed for ``compute_s``."""
        return max(compute_s, self.step_time) * self.slowdown - compute_s


#: After the budget, an evaluation takes at most this share of the time (its wait grows to
#: ``(1 - share) / share`` times its own duration), whatever ``idle_eval_interval_s`` says.
IDLE_EVAL_SHARE = 0.1


@dataclass(frozen=True)
class EvalResult:
    """One evaluation on the task's eval data.

    Args:
        step: the step of the model it saw.
        loss: mean loss on the eval data.
        accuracy: top-1 accuracy on the eval data.
        time: when it ended, on the trainer's clock.
        after_budget: made after the step budget was spent (the model then moves by gossip
            alone).
    """

    step: int
    loss: float
    accuracy: float
    time: float = 0.0
    after_budget: bool = False


@dataclass(frozen=True)
class Rollback:
    """The training loss turned non-finite at ``step``; the model and optimizer went back to
    those of ``to_step`` (the step counter goes on: it counts the steps taken)."""

    step: int
    to_step: int
    loss: float
    #: Rollbacks in a row, this one included (reset once a new finite copy is kept).
    in_a_row: int


class Diverged(FloatingPointError):
    """Training diverged and there was no finite state to go back to, or going back kept
    failing: the node stops, and keeps its last finite checkpoint."""


def batches(task: Task, device: torch.device, seed: int) -> Iterator[tuple[torch.Tensor, ...]]:
    """Endless shuffled batches; epochs reshuffle. Tensor datasets are sliced on the device."""
    gen = torch.Generator().manual_seed(seed)
    data = task.train
    if isinstance(data, TensorDataset):
        tensors = [t.to(device) for t in data.tensors]
        n = len(tensors[0])
        while True:
            order = torch.randperm(n, generator=gen).to(device)
            for start in range(0, n, task.batch_size):
                idx = order[start : start + task.batch_size]
                yield tuple(t[idx] for t in tensors)
    else:
        loader = DataLoader(data, batch_size=task.batch_size, shuffle=True, generator=gen)
        while True:
            for batch in loader:
                yield tuple(t.to(device) for t in batch)


def train_step(
    task: Task,
    optimizer: torch.optim.Optimizer,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    schedule: torch.optim.lr_scheduler.LRScheduler | None = None,
) -> float:
    """One local SGD step of ``task.model`` on a batch, then one step of the learning-rate
    schedule, if any; returns the batch's loss.

    The daemon's trainer thread and the simulator (node/sim) both step with this.
    """
    optimizer.zero_grad(set_to_none=True)
    loss = task.loss(task.model(inputs), targets)
    loss.backward()  # type: ignore[no-untyped-call]
    optimizer.step()
    if schedule is not None:
        schedule.step()
    return float(loss.detach())
