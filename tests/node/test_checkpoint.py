"""Checkpoints: written atomically, read back exactly."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from node.checkpoint import Checkpoint, atomic_write, load_checkpoint, save_checkpoint

MakeOptimizer = Callable[[Iterator[torch.nn.Parameter]], torch.optim.Optimizer]


@pytest.mark.parametrize(
    "make_optimizer",
    [
        lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
        lambda params: torch.optim.Adam(params, lr=0.1),
    ],
    ids=["sgd-momentum", "adam"],
)
def test_a_checkpoint_round_trips_with_the_optimizer_state(
    tmp_path: Path, make_optimizer: MakeOptimizer
) -> None:
    model = torch.nn.Linear(3, 2)
    optimizer = make_optimizer(model.parameters())
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(4, 3)).pow(2).sum().backward()
        optimizer.step()
    public = torch.randn(8)
    path = tmp_path / "sub" / "ckpt.safetensors"
    save_checkpoint(
        path, Checkpoint(model.state_dict(), public, optimizer.state_dict(), {"step": 5})
    )
    got = load_checkpoint(path)
    assert set(got.model) == {"weight", "bias"}
    assert torch.equal(got.model["weight"], model.weight.detach())
    assert torch.equal(got.public, public)
    assert got.meta == {"step": 5}
    # A fresh optimizer loaded from the checkpoint takes the very same next step.
    again = torch.nn.Linear(3, 2)
    again.load_state_dict(got.model)
    restored = make_optimizer(again.parameters())
    assert got.optimizer is not None
    restored.load_state_dict(dict(got.optimizer))
    batch = torch.randn(4, 3)
    for m, opt in ((model, optimizer), (again, restored)):
        opt.zero_grad()
        m(batch).pow(2).sum().backward()
        opt.step()
    assert torch.equal(model.weight, again.weight)


def test_a_failed_write_leaves_the_old_file_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "data"
    atomic_write(path, b"old")

    def power_cut(fd: int) -> None:
        raise OSError("power cut")

    monkeypatch.setattr(os, "fsync", power_cut)
    with pytest.raises(OSError, match="power cut"):
        atomic_write(path, b"new")
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]


def test_a_model_tensor_may_not_shadow_the_public_copy(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"murmur\.public_copy"):
        save_checkpoint(
            tmp_path / "c", Checkpoint({"murmur.public_copy": torch.zeros(1)}, torch.zeros(1))
        )


def test_overlapping_writers_each_land_whole(tmp_path: Path) -> None:
    path = tmp_path / "data"
    payloads = [bytes([i]) * (1 << 20) for i in range(8)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda data: atomic_write(path, data), payloads * 4))
    assert path.read_bytes() in payloads
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]
