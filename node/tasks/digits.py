"""The built-in task: scikit-learn's 8x8 digits, standardised, a small MLP. No download."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from node.extras import require
from node.tasks.base import Shard, Task

#: Fixed: every node, every run, the same 80/20 split.
SPLIT_SEED = 0
TEST_FRACTION = 0.2


def load_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits: (1797, 64) pixel values and (1797,) labels.

    Reads the data file scikit-learn ships, without importing ``sklearn.datasets`` (which pulls
    in SciPy and costs seconds at every node start); falls back to ``load_digits``.
    """
    require("sklearn", "digits", "the digits task")
    spec = importlib.util.find_spec("sklearn")
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = Path(root) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            data = np.loadtxt(path, delimiter=",")
            return data[:, :-1], data[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return x, y


def load_split() -> tuple[TensorDataset, TensorDataset]:
    """(train, test): 1438 and 359 examples, features standardised with the train statistics."""
    x, y = load_arrays()
    order = np.random.default_rng(SPLIT_SEED).permutation(len(y))
    n_test = round(len(y) * TEST_FRACTION)
    test, train = order[:n_test], order[n_test:]
    mean = x[train].mean(axis=0)
    std = x[train].std(axis=0)
    std[std == 0] = 1.0  # border pixels that are always blank
    xs = torch.as_tensor((x - mean) / std, dtype=torch.float32)
    ys = torch.as_tensor(y, dtype=torch.int64)
    return TensorDataset(xs[train], ys[train]), TensorDataset(xs[test], ys[test])


def make_model(hidden: int = 64) -> nn.Module:
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def make_task(shard: Shard) -> Task:
    train, test = load_split()
    mine = shard.split(train.tensors[1])
    return Task(
        model=make_model(),
        train=TensorDataset(train.tensors[0][mine], train.tensors[1][mine]),
        eval=test,
        batch_size=32,
    )
