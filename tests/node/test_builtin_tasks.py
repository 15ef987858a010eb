"""Task options, the mnist1d and text tasks, and the schedules real tasks use."""

from __future__ import annotations

import math
import random
import socket
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from node.tasks import Shard, Task, load_task
from node.tasks.base import evaluate_task, parse_task_spec
from node.tasks.schedules import adamw, warmup_cosine, warmup_cosine_factor
from node.tasks.stdlib_text import load_corpus

#: A text task small enough for the fast suite: the 1m model on windows of 32 bytes.
TINY_TEXT = "text:seq_len=32,batch_size=4,eval_windows=4"


# -- options ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "base", "options"),
    [
        ("digits", "digits", {}),
        ("text:size=10m", "text", {"size": "10m"}),
        ("text:size=3m, seq_len=64", "text", {"size": "3m", "seq_len": "64"}),
        ("my.mod:make_task", "my.mod:make_task", {}),
        ("my.mod:make_task:hidden=8", "my.mod:make_task", {"hidden": "8"}),
        ("/a/b.py:f:lr=0.1", "/a/b.py:f", {"lr": "0.1"}),
    ],
)
def test_a_task_spec_splits_into_its_name_and_options(
    spec: str, base: str, options: dict[str, str]
) -> None:
    assert parse_task_spec(spec) == (base, options)


def test_options_reach_a_plug_ins_factory_as_the_types_of_its_defaults(tmp_path: Path) -> None:
    path = tmp_path / "opts.py"
    path.write_text(
        "def factory(shard, hidden=4, lr=0.5, name='x', wide=False):\n"
        "    return (shard.index, hidden, lr, name, wide)\n"
    )
    made: object = load_task(f"{path}:factory:hidden=16,lr=1e-3,name=abc,wide=yes")(Shard(1, 2))
    assert made == (1, 16, 1e-3, "abc", True)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("digits:hidden=3", r"unknown option 'hidden' \(it takes: none\)"),
        ("text:sise=10m", r"unknown option 'sise' \(it takes: size, seq_len"),
        ("text:seq_len=long", r"option seq_len='long' is not an integer"),
        ("text:lr=fast", r"option lr='fast' is not a number"),
        ("text:size=1m,size=3m", "option 'size' is given twice"),
        ("text:size=1m,oops", "option 'oops' is not key=value"),
    ],
)
def test_a_bad_option_says_what_and_where(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_task(spec)


def test_a_bad_option_value_the_factory_refuses_says_so() -> None:
    with pytest.raises(ValueError, match="unknown size '2m'; known: 1m, 3m, 10m, 25m"):
        load_task("text:size=2m")(Shard())


# -- mnist1d ------------------------------------------------------------------------------------


def test_mnist1d_is_generated_here_without_the_network_and_leaves_global_rngs_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from node.tasks import mnist1d

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("the mnist1d task opened a socket")

    mnist1d.load_split.cache_clear()
    monkeypatch.setattr(socket, "socket", no_network)
    random.seed(7)
    np.random.seed(7)
    expected = (random.random(), np.random.rand())
    random.seed(7)
    np.random.seed(7)
    train, test = mnist1d.load_split()
    # make_dataset reseeds both global generators; the task puts them back.
    assert (random.random(), np.random.rand()) == expected
    assert train.tensors[0].shape == (4000, 40)
    assert test.tensors[0].shape == (1000, 40)
    assert sorted(torch.unique(test.tensors[1]).tolist()) == list(range(10))
    # The benchmark's own signals (seed 42, the package's defaults), on every machine.
    assert train.tensors[1][:8].tolist() == [2, 6, 4, 5, 6, 6, 6, 0]
    assert train.tensors[0][0, :4].tolist() == pytest.approx(
        [-0.33201, -0.47191, -0.77870, -1.00974], abs=1e-4
    )
    assert float(train.tensors[0].double().abs().sum()) == pytest.approx(118338.295, rel=1e-6)


def test_mnist1d_shards_by_label_and_names_its_extra_when_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from node.tasks import mnist1d

    tasks = []
    for i in range(4):
        torch.manual_seed(0)
        tasks.append(load_task("mnist1d")(Shard(i, 4, alpha=0.3, seed=0)))
    assert sum(len(t.train) for t in tasks) == 4000  # type: ignore[arg-type,misc]
    assert all(t.metric == "accuracy" and t.target == mnist1d.TARGET_ACCURACY for t in tasks)
    first = [p for p in tasks[0].model.parameters()]
    assert all(torch.equal(p, q) for p, q in zip(first, tasks[3].model.parameters(), strict=True))
    loss, acc = evaluate_task(tasks[0], torch.device("cpu"))
    assert 0.0 <= acc <= 0.3  # untrained: about chance
    assert loss > 2.0

    mnist1d.load_split.cache_clear()
    monkeypatch.setitem(sys.modules, "mnist1d.data", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r"pip install 'murmur\[tasks\]'"):
        load_task("mnist1d")(Shard())
    mnist1d.load_split.cache_clear()


# -- text ---------------------------------------------------------------------------------------


def test_the_corpus_deals_whole_packages_to_shards_and_holds_out_files_of_every_kind() -> None:
    corpus = load_corpus()
    shards = corpus.shard_packages(8)
    flat = [name for shard in shards for name in shard]
    assert sorted(flat) == sorted(corpus.packages)  # every package, once
    loads = [sum(corpus.sizes[n] for n in shard) for shard in shards]
    assert min(loads) > 0.5 * max(loads)  # balanced by bytes
    assert "asyncio" in corpus.packages
    assert corpus.held_out
    assert not set(corpus.held_out) & {p for files in corpus.packages.values() for p in files}
    kinds = {rel.split("/", 1)[0].removesuffix(".py") for rel in corpus.held_out}
    assert len(kinds) > 10  # drawn across the library, not from one package
    with pytest.raises(ValueError, match="shards, but the corpus has"):
        corpus.shard_packages(len(corpus.packages) + 1)


def _byte_mix(task: Task) -> torch.Tensor:
    data = task.train.data  # type: ignore[attr-defined]
    counts = torch.bincount(data.long(), minlength=256).double()
    return counts / counts.sum()


def test_text_shards_are_non_iid_by_package_and_share_one_eval_set() -> None:
    by_package, iid = [], []
    for i in range(4):
        torch.manual_seed(0)
        by_package.append(load_task(TINY_TEXT)(Shard(i, 4)))
        torch.manual_seed(0)
        iid.append(load_task(f"{TINY_TEXT},split=iid")(Shard(i, 4)))

    def spread(tasks: list[Task]) -> float:
        """Mean total-variation distance between two shards' byte distributions."""
        mixes = [_byte_mix(t) for t in tasks]
        pairs = [(a, b) for k, a in enumerate(mixes) for b in mixes[k + 1 :]]
        return float(np.mean([0.5 * (a - b).abs().sum().item() for a, b in pairs]))

    assert spread(by_package) > 3 * spread(iid)  # each node its own kind of text
    evals = [t.eval.tensors for t in by_package + iid]  # type: ignore[attr-defined]
    assert all(torch.equal(e[0], evals[0][0]) and torch.equal(e[1], evals[0][1]) for e in evals)
    # The target of every window is the window one byte on.
    x, y = evals[0]
    assert torch.equal(x[:, 1:], y[:, :-1])
    models = [t.model for t in by_package]
    assert all(
        torch.equal(p, q)
        for m in models[1:]
        for p, q in zip(models[0].parameters(), m.parameters(), strict=True)
    )
    assert all(t.metric == "perplexity" and t.target == 2.0 for t in by_package)


@pytest.mark.parametrize(
    ("size", "low", "high"), [("1m", 0.9e6, 1.2e6), ("10m", 9e6, 11e6), ("25m", 24e6, 27e6)]
)
def test_text_sizes_have_the_parameters_they_say(size: str, low: float, high: float) -> None:
    from node.tasks.text import SIZES, TinyGPT

    numel = sum(p.numel() for p in TinyGPT(SIZES[size]).parameters())
    assert low <= numel <= high


def test_the_text_model_is_causal_and_starts_near_a_uniform_guess() -> None:
    torch.manual_seed(0)
    task = load_task(TINY_TEXT)(Shard())
    x = task.eval.tensors[0][:2]  # type: ignore[attr-defined]
    task.model.eval()
    with torch.no_grad():
        out = task.model(x)
        changed = x.clone()
        changed[:, 20:] = (changed[:, 20:] + 1) % 256
        out2 = task.model(changed)
    assert out.shape == (2, 32, 256)
    assert torch.allclose(out[:, :20], out2[:, :20], atol=1e-5)  # no peeking ahead
    assert not torch.allclose(out[:, 20:], out2[:, 20:])
    loss, acc = evaluate_task(task, torch.device("cpu"))
    assert abs(loss - math.log(256)) < 0.3
    assert math.isnan(acc)  # judged by loss: no accuracy


# -- schedules and AdamW ------------------------------------------------------------------------


def test_warmup_then_cosine_to_the_floor_at_the_budget() -> None:
    assert warmup_cosine_factor(0, 10, 110) == pytest.approx(0.1)
    assert warmup_cosine_factor(9, 10, 110) == pytest.approx(1.0)
    assert warmup_cosine_factor(60, 10, 110, 0.1) == pytest.approx(0.55)
    assert warmup_cosine_factor(110, 10, 110, 0.1) == pytest.approx(0.1)
    assert warmup_cosine_factor(500, 10, 110, 0.1) == pytest.approx(0.1)
    assert warmup_cosine_factor(500, 10, None) == 1.0  # no budget: flat after the warmup
    model = torch.nn.Linear(4, 2)
    optimizer = adamw(lr=1e-2, weight_decay=0.1)(model.parameters())
    decays = sorted(g["weight_decay"] for g in optimizer.param_groups)
    assert decays == [0.0, 0.1]  # the bias is not decayed, the weight is
    schedule = warmup_cosine(warmup=10)(optimizer, 110)
    for _ in range(60):
        optimizer.step()
        schedule.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-2 * 0.55)
