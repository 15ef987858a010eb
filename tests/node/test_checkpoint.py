"""Checkpoints: written atomically, read back exactly, damage found and moved aside."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save

from node.daemon.checkpoint import (
    CHECKPOINT_FILE,
    PREVIOUS_FILE,
    Checkpoint,
    CheckpointError,
    atomic_write,
    check_fits,
    load_checkpoint,
    quarantine,
    remove_stale_temp_files,
    restore_latest,
    save_checkpoint,
)
from tests.node.damage import DAMAGES

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


def test_the_file_is_safetensors_whatever_the_tensors_dtype_shape_or_storage(
    tmp_path: Path,
) -> None:
    """The checkpoint is streamed tensor by tensor without safetensors' writer: views of one
    flat buffer (as a model's parameters are), every dtype, 0-d and empty tensors come back
    exactly through safetensors' own reader, with the metadata."""
    flat = torch.arange(12, dtype=torch.float32)
    model = {
        "a": flat[:6].view(2, 3),
        "b": flat[6:],  # shares a's storage
        "half": torch.randn(5).half(),
        "bf16": torch.randn(3, 1).bfloat16(),
        "f64": torch.randn(2, dtype=torch.float64),
        "count": torch.tensor(7),  # 0-d int64
        "mask": torch.tensor([True, False, True]),
        "i8": torch.tensor([-128, 0, 127], dtype=torch.int8),
        "empty": torch.zeros(0, 4),
        "strided": torch.randn(4, 4).t(),  # not contiguous
    }
    path = tmp_path / "ckpt.safetensors"
    save_checkpoint(path, Checkpoint(model, torch.randn(9), None, {"step": 3}))
    raw = load_file(str(path))
    for name, tensor in model.items():
        assert raw[name].dtype == tensor.dtype, name
        assert torch.equal(raw[name], tensor), name
    with safe_open(str(path), framework="pt") as f:
        assert json.loads((f.metadata() or {})["murmur"]) == {"step": 3}
    got = load_checkpoint(path)  # the checksum agrees
    assert torch.equal(got.model["b"], flat[6:])


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


def small_checkpoint() -> Checkpoint:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 3)).pow(2).sum().backward()
    optimizer.step()
    return Checkpoint(model.state_dict(), torch.randn(8), optimizer.state_dict(), {"step": 3})


@pytest.mark.parametrize(
    ("damage", "cause"),
    [
        ("truncated", "unreadable"),
        ("empty", "unreadable"),
        ("garbage", "unreadable"),
        ("nan-filled", "holds non-finite values"),
        ("directory", "a directory, not a checkpoint file"),
        ("bad-metadata", "unreadable (Expecting"),
        ("flipped-bytes", "checksum mismatch"),
    ],
)
def test_a_damaged_checkpoint_fails_to_load_with_one_line_naming_it(
    tmp_path: Path, damage: str, cause: str
) -> None:
    path = tmp_path / "ckpt.safetensors"
    save_checkpoint(path, small_checkpoint())
    DAMAGES[damage](path)
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(path)
    assert caught.value.path == path
    assert caught.value.cause.startswith(cause)
    assert str(caught.value).startswith(f"{path}: ")
    assert "\n" not in str(caught.value)
    assert len(str(caught.value)) < 400


def test_the_checksum_covers_the_metadata(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.safetensors"
    save_checkpoint(path, small_checkpoint())
    data = path.read_bytes()
    assert data.count(b'\\"step\\": 3') == 1
    path.write_bytes(data.replace(b'\\"step\\": 3', b'\\"step\\": 7'))
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        load_checkpoint(path)


def test_a_checkpoint_from_before_checksums_still_loads(tmp_path: Path) -> None:
    ckpt = small_checkpoint()
    tensors = {k: v.clone() for k, v in ckpt.model.items()} | {"murmur.public_copy": ckpt.public}
    path = tmp_path / "old.safetensors"
    path.write_bytes(save(tensors, metadata={"murmur": json.dumps({"step": 3})}))
    got = load_checkpoint(path)
    assert got.meta == {"step": 3}
    assert torch.equal(got.public, ckpt.public)


def test_writing_keeps_the_checkpoint_before(tmp_path: Path) -> None:
    path, previous = tmp_path / "c", tmp_path / "c.previous"
    for step in (1, 2, 3):
        save_checkpoint(
            path, dataclasses.replace(small_checkpoint(), meta={"step": step}), previous
        )
    assert load_checkpoint(path).meta == {"step": 3}
    assert load_checkpoint(previous).meta == {"step": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c", "c.previous"]


def test_restore_falls_back_to_the_previous_checkpoint_then_to_none(tmp_path: Path) -> None:
    current, previous = tmp_path / CHECKPOINT_FILE, tmp_path / PREVIOUS_FILE
    for step in (1, 2):
        save_checkpoint(
            current, dataclasses.replace(small_checkpoint(), meta={"step": step}), previous
        )
    got, path = restore_latest(tmp_path)
    assert path == current
    assert got is not None
    assert got.meta == {"step": 2}

    def refuse_step_2(ckpt: Checkpoint, path: Path) -> None:
        if ckpt.meta["step"] == 2:
            raise CheckpointError(path, "does not fit")

    got, path = restore_latest(tmp_path, refuse_step_2)
    assert path == previous
    assert got is not None
    assert got.meta == {"step": 1}
    DAMAGES["empty"](previous)
    assert restore_latest(tmp_path) == (None, None)
    assert len(list(tmp_path.glob(f"{CHECKPOINT_FILE}.corrupt-*"))) == 1
    assert len(list(tmp_path.glob(f"{PREVIOUS_FILE}.corrupt-*"))) == 1
    assert sorted(p.name for p in tmp_path.iterdir() if ".corrupt-" not in p.name) == []


def test_two_damaged_files_in_one_second_are_both_kept(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    for p in (first, second):
        p.write_bytes(b"junk")
    moved = [quarantine(first)]
    second.rename(first)
    moved.append(quarantine(first))
    assert moved[0] != moved[1]
    assert all(p.read_bytes() == b"junk" for p in moved)


def test_only_the_temp_files_of_the_given_names_are_removed(tmp_path: Path) -> None:
    mine = tmp_path / ".checkpoint.safetensors.a1b2.tmp"
    theirs = tmp_path / ".node_key.pem.c3.tmp"
    for p in (mine, theirs):
        p.write_bytes(b"x")
    assert remove_stale_temp_files(tmp_path, ["checkpoint.safetensors"]) == [mine]
    assert theirs.exists()


def test_a_checkpoint_that_does_not_fit_the_model_says_what_does_not(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2)
    ckpt = small_checkpoint()
    assert ckpt.optimizer is not None

    def optimizer() -> torch.optim.Optimizer:
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    path = tmp_path / "c"
    check_fits(ckpt, model, optimizer, path)
    state = {i: dict(s) for i, s in ckpt.optimizer["state"].items()}
    state[0]["momentum_buffer"] = torch.zeros(7)
    bad_buffer = dataclasses.replace(ckpt, optimizer={**ckpt.optimizer, "state": state})
    cases = [
        (dataclasses.replace(ckpt, model={"weight": ckpt.model["weight"]}), "missing ['bias']"),
        (dataclasses.replace(ckpt, public=torch.zeros(3)), "public copy is not 8 float32"),
        (dataclasses.replace(ckpt, meta={"members": [{"node_id": 1}]}), "member list"),
        (bad_buffer, "optimizer's momentum_buffer does not fit"),
        (dataclasses.replace(ckpt, optimizer={"state": {}}), "optimizer state does not fit"),
    ]
    for bad, cause in cases:
        with pytest.raises(CheckpointError, match=re.escape(cause)):
            check_fits(bad, model, optimizer, path)
