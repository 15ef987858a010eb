"""Checkpoints: the model (safetensors) and the public copy, written atomically.

A checkpoint is written to a temporary file in the same folder, flushed to disk, then renamed
over the old one, and the folder itself is synced: a power cut at any moment leaves either the
old checkpoint or the new one, never a torn file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save

__all__ = ["CHECKPOINT_FILE", "atomic_write", "load_checkpoint", "save_checkpoint"]

CHECKPOINT_FILE = "checkpoint.safetensors"
PUBLIC_KEY = "murmur.public_copy"
META_KEY = "murmur"


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that readers see the old or the new bytes, nothing else."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def save_checkpoint(
    path: Path,
    model_state: Mapping[str, torch.Tensor],
    public_copy: torch.Tensor,
    meta: Mapping[str, Any],
) -> None:
    """Write the model's state dict, the public copy x̂ and JSON metadata to ``path``."""
    if PUBLIC_KEY in model_state:
        raise ValueError(f"the model has a tensor named {PUBLIC_KEY}")
    # safetensors refuses tensors that share storage, and ours are views of one flat buffer.
    tensors = {name: t.detach().cpu().clone().contiguous() for name, t in model_state.items()}
    tensors[PUBLIC_KEY] = public_copy.detach().cpu().clone()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, save(tensors, metadata={META_KEY: json.dumps(dict(meta))}))


def load_checkpoint(path: Path) -> tuple[dict[str, torch.Tensor], torch.Tensor, dict[str, Any]]:
    """(model state dict, public copy, metadata) from a checkpoint file."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = json.loads((f.metadata() or {}).get(META_KEY, "{}"))
    tensors = load_file(str(path))
    public = tensors.pop(PUBLIC_KEY)
    return tensors, public, meta
