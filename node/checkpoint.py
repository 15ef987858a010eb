"""Checkpoints: the model, the optimizer, the public copy and facts about the node, in one
safetensors file, written atomically.

A checkpoint is written to a temporary file in the same folder, flushed to disk, then renamed
over the old one, and the folder itself is synced: a power cut at any moment leaves either the
old checkpoint or the new one, never a torn file.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save

__all__ = ["CHECKPOINT_FILE", "Checkpoint", "atomic_write", "load_checkpoint", "save_checkpoint"]

CHECKPOINT_FILE = "checkpoint.safetensors"
PUBLIC_KEY = "murmur.public_copy"
OPTIM_PREFIX = "murmur.optimizer."
META_KEY = "murmur"
OPTIM_KEY = "murmur.optimizer"


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that readers see the old or the new bytes, nothing else.

    Each write goes through a temporary file of its own, so writers that overlap (a periodic
    checkpoint still being written when the final one starts) never trip over each other.
    """
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
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


@dataclass(frozen=True)
class Checkpoint:
    """One consistent moment of a node.

    Args:
        model: the model's state dict.
        public: the public copy x̂ (what the neighbours' replicas of this node hold).
        optimizer: the optimizer's state dict (``torch.optim.Optimizer.state_dict``), if any.
        meta: JSON-able facts: step, node id, task fingerprint, members, ...
    """

    model: Mapping[str, torch.Tensor]
    public: torch.Tensor
    optimizer: Mapping[str, Any] | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)


def _flatten_optimizer(state: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], Any]:
    """Split an optimizer state dict into tensors (for safetensors) and the rest (for JSON)."""
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for index, per_param in state["state"].items():
        for key, value in per_param.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{OPTIM_PREFIX}{index}.{key}"] = value
            else:
                scalars.setdefault(str(index), {})[key] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], rest: Any) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for name in [n for n in tensors if n.startswith(OPTIM_PREFIX)]:
        index, _, key = name.removeprefix(OPTIM_PREFIX).partition(".")
        state.setdefault(int(index), {})[key] = tensors.pop(name)
    for index, values in rest["scalars"].items():
        state.setdefault(int(index), {}).update(values)
    return {"state": state, "param_groups": rest["param_groups"]}


def save_checkpoint(path: Path, ckpt: Checkpoint) -> None:
    """Write ``ckpt`` to ``path`` atomically (one safetensors file)."""
    for name in ckpt.model:
        if name == PUBLIC_KEY or name.startswith(OPTIM_PREFIX):
            raise ValueError(f"the model has a tensor named {name}, which murmur reserves")
    # safetensors refuses tensors that share storage, and ours are views of one flat buffer.
    tensors = {name: t.detach().cpu().clone().contiguous() for name, t in ckpt.model.items()}
    tensors[PUBLIC_KEY] = ckpt.public.detach().cpu().clone()
    meta = {META_KEY: json.dumps(dict(ckpt.meta))}
    if ckpt.optimizer is not None:
        optim_tensors, rest = _flatten_optimizer(ckpt.optimizer)
        tensors.update({k: v.detach().cpu().clone() for k, v in optim_tensors.items()})
        meta[OPTIM_KEY] = json.dumps(rest)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, save(tensors, metadata=meta))


def load_checkpoint(path: Path) -> Checkpoint:
    """Read a checkpoint written by :func:`save_checkpoint`."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        header = f.metadata() or {}
    tensors = load_file(str(path))
    public = tensors.pop(PUBLIC_KEY)
    optimizer = None
    if OPTIM_KEY in header:
        optimizer = _unflatten_optimizer(tensors, json.loads(header[OPTIM_KEY]))
    return Checkpoint(tensors, public, optimizer, json.loads(header.get(META_KEY, "{}")))
