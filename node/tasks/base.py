"""The task interface: what a plug-in gives the node, and how the node finds it.

A task is made by a factory ``factory(shard: Shard, **options) -> Task``. The node seeds torch
with the swarm's seed just before calling it, so that every node builds the same initial model.
The factory uses ``shard.index`` and ``shard.count`` (or ``shard.split(labels)``, which does iid
or Dirichlet non-iid splitting by the node's flags) to pick this node's part of the training data.

Options ride in the task spec itself, after its last colon: ``text:size=10m,seq_len=128`` or
``my.module:make_task:hidden=128``. Each becomes a keyword argument of the factory, converted to
the type of that parameter's default (int, float, bool or str). Keeping them in the one string
means that everything that names a task (flags, config files, checkpoints, ``murmur swarm``'s
child processes, the report that rebuilds the task) names its options too.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

__all__ = [
    "METRICS",
    "Metric",
    "Shard",
    "Task",
    "TaskFactory",
    "evaluate",
    "evaluate_task",
    "load_task",
    "parse_task_spec",
]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
#: Makes the learning-rate schedule from the optimizer and the node's step budget (None: no
#: budget, train until stopped). Stepped once per local step, after the optimizer.
ScheduleFactory = Callable[
    [torch.optim.Optimizer, int | None], torch.optim.lr_scheduler.LRScheduler
]
#: What a task is judged by: top-1 ``accuracy`` (higher is better), or its eval ``loss`` (lower
#: is better); ``perplexity`` is a loss that is a mean cross-entropy in nats, shown as exp(loss).
Metric = Literal["accuracy", "loss", "perplexity"]
METRICS: tuple[Metric, ...] = ("accuracy", "loss", "perplexity")


@dataclass(frozen=True)
class Shard:
    """Which part of the data this node trains on.

    Args:
        index: this node's shard, 0 <= index < count.
        count: how many shards the data is cut into.
        alpha: None for iid shards; else the concentration of a Dirichlet distribution over
            labels (smaller is more skewed: 0.1 gives each node a few classes, 100 is near iid).
        seed: seeds the split, so every node computes the same partition.
    """

    index: int = 0
    count: int = 1
    alpha: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise ValueError(f"shard index {self.index} is not in [0, {self.count})")
        if self.alpha is not None and self.alpha <= 0:
            raise ValueError(f"Dirichlet alpha must be positive, got {self.alpha}")

    def split(self, labels: Sequence[int] | np.ndarray | torch.Tensor) -> torch.Tensor:
        """Indices (int64) of this shard's examples among ``labels``."""
        return self.split_all(labels)[self.index]

    def split_all(self, labels: Sequence[int] | np.ndarray | torch.Tensor) -> list[torch.Tensor]:
        """The indices of every shard's examples (one split costs as much as all of them)."""
        y = np.asarray(labels.cpu() if isinstance(labels, torch.Tensor) else labels)
        parts = (
            _iid_parts(len(y), self.count, self.seed)
            if self.alpha is None
            else _dirichlet_parts(y, self.count, self.alpha, self.seed)
        )
        return [torch.as_tensor(np.sort(p), dtype=torch.int64) for p in parts]


def _iid_parts(n: int, count: int, seed: int) -> list[np.ndarray]:
    perm = np.random.default_rng(seed).permutation(n)
    return list(np.array_split(perm, count))


def _dirichlet_parts(y: np.ndarray, count: int, alpha: float, seed: int) -> list[np.ndarray]:
    """Label-skewed split (Hsu, Qi and Brown 2019): class c goes to nodes in Dir(alpha) shares.

    Redrawn until every shard holds at least a few examples, so that no node starves.
    """
    rng = np.random.default_rng(seed)
    min_size = max(1, min(10, len(y) // (4 * count)))
    for _ in range(1000):
        parts: list[list[int]] = [[] for _ in range(count)]
        for c in np.unique(y):
            idx = rng.permutation(np.flatnonzero(y == c))
            shares = rng.dirichlet(np.full(count, alpha))
            cuts = (np.cumsum(shares)[:-1] * len(idx)).astype(int)
            for node, chunk in enumerate(np.split(idx, cuts)):
                parts[node].extend(chunk.tolist())
        if min(len(p) for p in parts) >= min_size:
            return [np.asarray(p, dtype=np.int64) for p in parts]
    raise RuntimeError(f"could not split {len(y)} examples into {count} shards of >= {min_size}")


def _default_optimizer(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


@dataclass
class Task:
    """What a factory returns.

    Args:
        model: the model; murmur moves it to the node's device and gossips its parameters.
        train: this node's training examples, yielding (input, target) pairs.
        eval: the evaluation examples (the same on every node, so accuracies compare).
        loss: loss(output, target); cross-entropy by default.
        batch_size: examples per local step.
        optimizer: makes the local optimizer from the parameters; SGD with momentum by default
            (``node.tasks.schedules.adamw`` makes AdamW).
        schedule: makes the learning-rate schedule (a torch ``LRScheduler``) from the optimizer
            and the step budget; None keeps the optimizer's rate. ``node.tasks.schedules``
            has warmup + cosine. The node steps it after every local step and checkpoints it.
        metric: what the task is judged by (see :data:`Metric`): ``accuracy`` evaluates top-1
            over the output's columns; ``loss`` and ``perplexity`` only the loss.
        target: the value of ``metric`` counted as reached: an accuracy to reach, or an eval
            loss to get down to (``loss``, ``perplexity``); None: no target.
        eval_batch_size: examples per forward pass when evaluating (large outputs, such as a
            language model's logits, need smaller ones).
    """

    model: nn.Module
    train: Dataset[Any]
    eval: Dataset[Any]
    loss: LossFn = field(default=nn.functional.cross_entropy)
    batch_size: int = 32
    optimizer: OptimizerFactory | None = None
    schedule: ScheduleFactory | None = None
    metric: Metric = "accuracy"
    target: float | None = None
    eval_batch_size: int = 1024

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"unknown metric {self.metric!r}; known: {', '.join(METRICS)}")
        if self.batch_size < 1 or self.eval_batch_size < 1:
            raise ValueError("batch sizes must be at least 1")

    def make_optimizer(self) -> torch.optim.Optimizer:
        return (self.optimizer or _default_optimizer)(self.model.parameters())

    def make_schedule(
        self, optimizer: torch.optim.Optimizer, steps: int | None
    ) -> torch.optim.lr_scheduler.LRScheduler | None:
        """The learning-rate schedule for ``optimizer`` over a budget of ``steps``, if any."""
        return None if self.schedule is None else self.schedule(optimizer, steps)


TaskFactory = Callable[[Shard], Task]

BUILTIN = {
    "digits": "node.tasks.digits:make_task",
    "logistic": "node.tasks.logistic:make_task",
    "mnist1d": "node.tasks.mnist1d:make_task",
    "text": "node.tasks.text:make_task",
}


def parse_task_spec(spec: str) -> tuple[str, dict[str, str]]:
    """Split ``name[:key=value,...]`` into the task's name and its options (as strings).

    The options are what follows the last colon when it holds an ``=`` (a module, a factory
    and a path never do).

    Raises:
        ValueError: an option is not ``key=value``, or one is given twice.
    """
    base, sep, tail = spec.rpartition(":")
    if not sep or "=" not in tail:
        return spec, {}
    options: dict[str, str] = {}
    for item in tail.split(","):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key.isidentifier():
            raise ValueError(f"task {spec!r}: option {item!r} is not key=value")
        if key in options:
            raise ValueError(f"task {spec!r}: option {key!r} is given twice")
        options[key] = value.strip()
    return base, options


def _convert(spec: str, key: str, value: str, default: Any) -> Any:
    """``value`` as the type of the parameter's default (a string when it has none)."""
    try:
        if isinstance(default, bool):
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(value)
            return value.lower() in ("true", "1", "yes")
        if isinstance(default, int):
            return int(value)
        if isinstance(default, float):
            return float(value)
    except ValueError:
        kind = {bool: "true or false", int: "an integer"}.get(type(default), "a number")
        raise ValueError(f"task {spec!r}: option {key}={value!r} is not {kind}") from None
    return value


def _bind_options(spec: str, factory: Callable[..., Task], options: Mapping[str, str]) -> Any:
    """The factory with ``options`` bound as keyword arguments, each checked and converted."""
    params = inspect.signature(factory).parameters
    named = {
        n: p
        for n, p in params.items()
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and n != next(iter(params), None)
    }
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    kwargs = {}
    for key, value in options.items():
        if key not in named and not takes_any:
            known = ", ".join(named) or "none"
            raise ValueError(f"task {spec!r}: unknown option {key!r} (it takes: {known})")
        default = named[key].default if key in named else inspect.Parameter.empty
        kwargs[key] = _convert(
            spec, key, value, None if default is inspect.Parameter.empty else default
        )
    return functools.partial(factory, **kwargs)


def load_task(spec: str) -> TaskFactory:
    """Find a task factory: a built-in name, ``package.module:factory`` or ``path/file.py:factory``,
    each optionally followed by ``:key=value,...`` options (bound to the factory's keywords).

    Raises:
        ValueError: the spec is malformed, names nothing callable, or gives an option the
            factory does not take (or of the wrong type).
    """
    full = spec
    spec, options = parse_task_spec(spec)
    spec = BUILTIN.get(spec, spec)
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        known = ", ".join(BUILTIN)
        raise ValueError(f"task {spec!r}: expected a built-in ({known}) or module:factory")
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_file():
            raise ValueError(f"task {spec!r}: no file {path}")
        mod_spec = importlib.util.spec_from_file_location(f"murmur_task_{path.stem}", path)
        if mod_spec is None or mod_spec.loader is None:
            raise ValueError(f"task {spec!r}: cannot load {path}")
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[mod_spec.name] = module
        mod_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ValueError(f"task {spec!r}: cannot import {module_name}: {exc}") from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"task {spec!r}: {module_name} has no callable {attr!r}")
    if options:
        return _bind_options(full, factory, options)  # type: ignore[no-any-return]
    return factory  # type: ignore[no-any-return]


def _eval_batches(data: Dataset[Any], batch_size: int) -> Iterable[tuple[torch.Tensor, ...]]:
    """In order; tensor datasets are sliced directly (no DataLoader: the simulator evaluates
    a thousand small models at a time, and its per-batch overhead would dominate)."""
    if isinstance(data, TensorDataset):
        n = len(data.tensors[0])
        for start in range(0, n, batch_size):
            yield tuple(t[start : start + batch_size] for t in data.tensors)
    else:
        yield from DataLoader(data, batch_size=batch_size)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    data: Dataset[Any],
    loss_fn: LossFn,
    device: torch.device,
    batch_size: int = 1024,
    top1: bool = True,
) -> tuple[float, float]:
    """(mean loss, accuracy) of ``model`` on ``data``; accuracy is top-1 over output columns,
    or NaN when ``top1`` is off (a task judged by its loss)."""
    was_training = model.training
    model.eval()
    total_loss, correct, count = 0.0, 0, 0
    for inputs, targets in _eval_batches(data, batch_size):
        inputs, targets = inputs.to(device), targets.to(device)
        out = model(inputs)
        total_loss += float(loss_fn(out, targets)) * len(targets)
        if top1:
            correct += int((out.argmax(dim=1) == targets).sum())
        count += len(targets)
    model.train(was_training)
    if not count:
        return float("nan"), float("nan")
    return total_loss / count, correct / count if top1 else float("nan")


def evaluate_task(task: Task, device: torch.device) -> tuple[float, float]:
    """(mean eval loss, accuracy) of the task's model on its eval data, as its metric asks
    (accuracy NaN for a task judged by its loss)."""
    return evaluate(
        task.model,
        task.eval,
        task.loss,
        device,
        task.eval_batch_size,
        top1=task.metric == "accuracy",
    )
