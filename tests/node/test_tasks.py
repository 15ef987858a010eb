"""Tasks: sharding, finding factories, the built-in digits task."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from node.tasks import Shard, load_task
from node.tasks.digits import load_arrays, load_split

LABELS = np.repeat(np.arange(10), 100)


@pytest.mark.parametrize("alpha", [None, 0.1, 0.5, 100.0])
def test_shards_partition_the_data(alpha: float | None) -> None:
    parts = [Shard(i, 7, alpha, seed=3).split(LABELS) for i in range(7)]
    everything = torch.cat(parts)
    assert len(everything) == len(LABELS)
    assert len(set(everything.tolist())) == len(LABELS)
    assert all(len(p) >= 10 for p in parts)


def test_shards_are_the_same_on_every_node() -> None:
    assert torch.equal(
        Shard(2, 5, 0.5, seed=1).split(LABELS), Shard(2, 5, 0.5, seed=1).split(LABELS)
    )
    assert not torch.equal(
        Shard(2, 5, 0.5, seed=1).split(LABELS), Shard(2, 5, 0.5, seed=2).split(LABELS)
    )


def _label_skew(alpha: float | None) -> float:
    """Mean total-variation distance of each shard's label mix from the uniform mix."""
    distances = []
    for i in range(8):
        counts = np.bincount(LABELS[Shard(i, 8, alpha, seed=0).split(LABELS).numpy()], minlength=10)
        distances.append(0.5 * np.abs(counts / counts.sum() - 0.1).sum())
    return float(np.mean(distances))


def test_a_small_dirichlet_alpha_skews_labels_and_iid_does_not() -> None:
    assert _label_skew(None) < 0.2  # sampling noise only, with 125 examples a shard
    assert _label_skew(100.0) < 0.2
    assert _label_skew(0.5) > 0.3
    assert _label_skew(0.1) > _label_skew(0.5) + 0.1


def test_bad_shards_are_refused() -> None:
    with pytest.raises(ValueError, match=r"not in \[0, 3\)"):
        Shard(3, 3)
    with pytest.raises(ValueError, match="alpha must be positive"):
        Shard(0, 2, alpha=0.0)


def test_digits_reads_scikit_learns_data_and_splits_it_the_same_way_every_time() -> None:
    from sklearn.datasets import load_digits

    x, y = load_arrays()
    expected_x, expected_y = load_digits(return_X_y=True)
    assert np.array_equal(x, expected_x)
    assert np.array_equal(y, expected_y)
    train, test = load_split()
    assert (len(train), len(test)) == (1438, 359)
    again, _ = load_split()
    assert torch.equal(train.tensors[0], again.tensors[0])
    # Standardised with the training statistics.
    assert train.tensors[0].mean(dim=0).abs().max() < 1e-5


def test_every_node_builds_the_same_initial_model() -> None:
    factory = load_task("digits")
    models = []
    for i in range(3):
        torch.manual_seed(0)
        models.append(factory(Shard(i, 3, 0.5)).model)
    for a, b in zip(models[0].parameters(), models[2].parameters(), strict=True):
        assert torch.equal(a, b)


def test_tasks_load_from_a_module_or_a_file(tmp_path: Path) -> None:
    assert load_task("node.tasks.digits:make_task").__name__ == "make_task"
    path = tmp_path / "my_task.py"
    path.write_text("def factory(shard):\n    return shard.index\n")
    result: object = load_task(f"{path}:factory")(Shard(1, 2))
    assert result == 1


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nothing", "expected a built-in"),
        ("no.such.module:f", "cannot import no.such.module"),
        ("node.tasks.digits:missing", "has no callable 'missing'"),
        ("/no/such/file.py:f", "no file"),
    ],
)
def test_a_task_that_cannot_be_found_says_why(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_task(spec)


def test_the_logistic_task_splits_like_the_others_and_shares_one_eval_set() -> None:
    from node.tasks.logistic import CLASSES, make_task

    tasks = [load_task("logistic")(Shard(i, 8, 0.5, seed=0)) for i in range(8)]
    labels = [t.train.tensors[1] for t in tasks]  # type: ignore[attr-defined]
    assert sum(len(y) for y in labels) == 4096  # the pool's minimum, all of it, split
    assert all(t.eval is tasks[0].eval for t in tasks)  # one set, not eight copies
    mixes = [np.bincount(y.numpy(), minlength=CLASSES) / len(y) for y in labels]
    skew = np.mean([0.5 * np.abs(m - 1 / CLASSES).sum() for m in mixes])
    assert skew > 0.3  # Dirichlet(0.5): each shard leans on a few classes
    # Every node builds the same initial model from the same seed, as with the other tasks.
    torch.manual_seed(0)
    a = make_task(Shard(0, 8))
    torch.manual_seed(0)
    b = make_task(Shard(5, 8))
    assert all(
        torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True)
    )
