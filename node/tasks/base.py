"""The task interface: what a plug-in gives the node, and how the node finds it.

A task is made by a factory ``factory(shard: Shard) -> Task``. The node seeds torch with the
swarm's seed just before calling it, so that every node builds the same initial model. The
factory uses ``shard.index`` and ``shard.count`` (or ``shard.split(labels)``, which does iid or
Dirichlet non-iid splitting by the node's flags) to pick this node's part of the training data.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

__all__ = ["Shard", "Task", "TaskFactory", "evaluate", "load_task"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


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
        optimizer: makes the local optimizer from the parameters; SGD with momentum by default.
    """

    model: nn.Module
    train: Dataset[Any]
    eval: Dataset[Any]
    loss: LossFn = field(default=nn.functional.cross_entropy)
    batch_size: int = 32
    optimizer: OptimizerFactory | None = None

    def make_optimizer(self) -> torch.optim.Optimizer:
        return (self.optimizer or _default_optimizer)(self.model.parameters())


TaskFactory = Callable[[Shard], Task]

BUILTIN = {"digits": "node.tasks.digits:make_task", "logistic": "node.tasks.logistic:make_task"}


def load_task(spec: str) -> TaskFactory:
    """Find a task factory: a built-in name, ``package.module:factory`` or ``path/file.py:factory``.

    Raises:
        ValueError: the spec is malformed or names nothing callable.
    """
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
) -> tuple[float, float]:
    """(mean loss, accuracy) of ``model`` on ``data``; accuracy is top-1 over output columns."""
    was_training = model.training
    model.eval()
    total_loss, correct, count = 0.0, 0, 0
    for inputs, targets in _eval_batches(data, batch_size):
        inputs, targets = inputs.to(device), targets.to(device)
        out = model(inputs)
        total_loss += float(loss_fn(out, targets)) * len(targets)
        correct += int((out.argmax(dim=1) == targets).sum())
        count += len(targets)
    model.train(was_training)
    return (total_loss / count, correct / count) if count else (float("nan"), float("nan"))
