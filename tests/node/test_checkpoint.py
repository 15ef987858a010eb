"""Checkpoints: written atomically, read back exactly."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from node.checkpoint import atomic_write, load_checkpoint, save_checkpoint


def test_a_checkpoint_round_trips(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2)
    public = torch.randn(8)
    path = tmp_path / "sub" / "ckpt.safetensors"
    save_checkpoint(path, model.state_dict(), public, {"step": 5, "node_id": "abc"})
    state, got_public, meta = load_checkpoint(path)
    assert set(state) == {"weight", "bias"}
    assert torch.equal(state["weight"], model.weight.detach())
    assert torch.equal(got_public, public)
    assert meta == {"step": 5, "node_id": "abc"}


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
        save_checkpoint(tmp_path / "c", {"murmur.public_copy": torch.zeros(1)}, torch.zeros(1), {})
