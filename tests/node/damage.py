"""Ways a checkpoint file gets damaged, shared by the in-process and the real-process tests.

Each takes the path of a good checkpoint and damages it in place as a crash, a full disk, a
bad disk, a careless operator or an older murmur (which wrote NaN models) would.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable
from pathlib import Path

import torch

from node.daemon.checkpoint import load_checkpoint, save_checkpoint

CHECKSUM_KEY = "murmur.sha256"


def _split(data: bytes) -> tuple[dict[str, object], bytes]:
    """A safetensors file's header (JSON) and its tensor data."""
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def _join(header: dict[str, object], body: bytes) -> bytes:
    blob = json.dumps(header).encode()
    return len(blob).to_bytes(8, "little") + blob + body


def truncated(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def empty(path: Path) -> None:
    path.write_bytes(b"")


def garbage(path: Path) -> None:
    path.write_bytes(random.Random(1).randbytes(4096))


def wrong_shape(path: Path) -> None:
    """A whole file with a valid checksum whose tensors are not the model's."""
    ckpt = load_checkpoint(path)
    name = sorted(ckpt.model)[0]
    model = {**ckpt.model, name: torch.zeros(3, 5)}
    save_checkpoint(path, dataclasses.replace(ckpt, model=model))


def nan_filled(path: Path) -> None:
    """What a diverged node wrote before murmur kept its last finite checkpoint."""
    ckpt = load_checkpoint(path)
    model = {k: torch.full_like(v, float("nan")) for k, v in ckpt.model.items()}
    save_checkpoint(path, dataclasses.replace(ckpt, model=model))


def directory(path: Path) -> None:
    path.unlink()
    path.mkdir()
    (path / "something").write_text("not a checkpoint")


def bad_metadata(path: Path) -> None:
    """Metadata that is not JSON, in a file without a checksum (as an older murmur wrote)."""
    header, body = _split(path.read_bytes())
    meta = header["__metadata__"]
    assert isinstance(meta, dict)
    del meta[CHECKSUM_KEY]
    meta["murmur"] = '{"step": 12, "members": [truncated'
    path.write_bytes(_join(header, body))


def flipped_bytes(path: Path) -> None:
    """64 bytes of the tensor data flipped: a file that loads, with wrong numbers in it."""
    header, body = _split(path.read_bytes())
    data = bytearray(body)
    rng = random.Random(2)
    for i in rng.sample(range(len(data)), 64):
        data[i] ^= 0xFF
    path.write_bytes(_join(header, bytes(data)))


#: name -> how to damage a checkpoint that way.
DAMAGES: dict[str, Callable[[Path], None]] = {
    "truncated": truncated,
    "empty": empty,
    "garbage": garbage,
    "wrong-shape": wrong_shape,
    "nan-filled": nan_filled,
    "directory": directory,
    "bad-metadata": bad_metadata,
    "flipped-bytes": flipped_bytes,
}
