"""Checkpoints: the model, the optimizer, the public copy and facts about the node, in one
safetensors file, written atomically, with a checksum, the one before it kept beside it.

This module holds the :class:`Checkpoint` type, :func:`save_checkpoint` and
:func:`load_checkpoint`, and what the node does with the files at its start (:func:`restore_latest`,
:func:`quarantine`, :func:`check_fits`, :func:`remove_stale_temp_files`). The file itself (its
format, its checksum, the atomic write) is in :mod:`node.daemon.checkpoint_file`.

A checkpoint that cannot be used (torn, empty, garbage, a directory in its place, metadata that
is not JSON, a wrong checksum, non-finite values, tensors that do not fit the model) is moved
aside as ``<name>.corrupt-<time>`` by :func:`restore_latest`, which then falls back to the
previous checkpoint, or to none: files never trap a node.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from gossip.codecs import all_finite
from node.daemon.checkpoint_file import (
    CHECKSUM_KEY,
    META_KEY,
    OPTIM_KEY,
    OPTIM_PREFIX,
    PUBLIC_KEY,
    SCHEDULE_KEY,
    _checksum,
    _flatten_optimizer,
    _unflatten_optimizer,
    _write_safetensors,
    atomic_write,
)

__all__ = [
    "CHECKPOINT_FILE",
    "PREVIOUS_FILE",
    "Checkpoint",
    "CheckpointError",
    "atomic_write",
    "check_fits",
    "load_checkpoint",
    "quarantine",
    "remove_stale_temp_files",
    "restore_latest",
    "save_checkpoint",
]

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint.safetensors"
#: The checkpoint before the current one: the fallback when the current one is damaged.
PREVIOUS_FILE = "checkpoint.previous.safetensors"
#: A cause longer than this is cut: the node says what is wrong in one readable line.
MAX_CAUSE_CHARS = 200


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used, and why (``cause``, one short line)."""

    def __init__(self, path: Path, cause: str) -> None:
        super().__init__(f"{path}: {cause}")
        self.path = path
        self.cause = cause


@dataclass(frozen=True)
class Checkpoint:
    """One consistent moment of a node.

    Args:
        model: the model's state dict.
        public: the public copy x̂ (what the neighbours' replicas of this node hold).
        optimizer: the optimizer's state dict (``torch.optim.Optimizer.state_dict``), if any.
        meta: JSON-able facts: step, node id, task fingerprint, members, ...
        schedule: the learning-rate schedule's state dict (``LRScheduler.state_dict``: its
            step count and base rates, JSON-able), if the task has a schedule.
    """

    model: Mapping[str, torch.Tensor]
    public: torch.Tensor
    optimizer: Mapping[str, Any] | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)
    schedule: Mapping[str, Any] | None = None

    def is_finite(self) -> bool:
        """Whether every floating-point value (model, public copy, optimizer) is finite."""
        return all(_finite(t) for t in self._tensors())

    def _tensors(self) -> Iterable[torch.Tensor]:
        yield from self.model.values()
        yield self.public
        if self.optimizer is not None:
            for per_param in self.optimizer.get("state", {}).values():
                yield from (v for v in per_param.values() if isinstance(v, torch.Tensor))


def _finite(t: torch.Tensor) -> bool:
    return not t.is_floating_point() or all_finite(t)


def save_checkpoint(path: Path, ckpt: Checkpoint, previous: Path | None = None) -> None:
    """Write ``ckpt`` to ``path`` atomically (one safetensors file, with its checksum).

    Args:
        previous: where the checkpoint that was at ``path`` goes (kept as a fallback).

    Raises:
        OSError: it could not be written (a full disk, say); ``path`` is as it was.
    """
    for name in ckpt.model:
        if name == PUBLIC_KEY or name.startswith(OPTIM_PREFIX):
            raise ValueError(f"the model has a tensor named {name}, which murmur reserves")
    tensors = {name: t.detach() for name, t in ckpt.model.items()}
    tensors[PUBLIC_KEY] = ckpt.public.detach()
    meta = {META_KEY: json.dumps(dict(ckpt.meta), allow_nan=False)}
    if ckpt.optimizer is not None:
        optim_tensors, rest = _flatten_optimizer(ckpt.optimizer)
        tensors.update({k: v.detach() for k, v in optim_tensors.items()})
        meta[OPTIM_KEY] = json.dumps(rest)
    if ckpt.schedule is not None:
        meta[SCHEDULE_KEY] = json.dumps(dict(ckpt.schedule), allow_nan=False)
    meta[CHECKSUM_KEY] = _checksum(tensors, meta)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: _write_safetensors(f, tensors, meta), previous)


def _short(err: BaseException) -> str:
    """One line saying what went wrong, whatever the library put in its message."""
    text = " ".join(str(err).split()) or type(err).__name__
    if isinstance(err, OSError) and err.strerror:
        text = err.strerror
    return text if len(text) <= MAX_CAUSE_CHARS else text[: MAX_CAUSE_CHARS - 3] + "..."


def load_checkpoint(path: Path) -> Checkpoint:
    """Read a checkpoint written by :func:`save_checkpoint`, checking its checksum (when it has
    one: older murmur wrote none) and that every value is finite.

    Raises:
        CheckpointError: it cannot be read or fails a check; the cause is one short line.
    """
    try:
        if path.is_dir():
            raise CheckpointError(path, "a directory, not a checkpoint file")
        with safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
        tensors = load_file(str(path))
        expected = header.get(CHECKSUM_KEY)
        if expected is not None and _checksum(tensors, header) != expected:
            raise CheckpointError(path, "checksum mismatch: the file changed after it was written")
        public = tensors.pop(PUBLIC_KEY, None)
        if public is None:
            raise CheckpointError(path, f"no {PUBLIC_KEY} tensor: not a murmur checkpoint")
        optimizer = None
        if OPTIM_KEY in header:
            optimizer = _unflatten_optimizer(tensors, json.loads(header[OPTIM_KEY]))
        meta = json.loads(header.get(META_KEY, "{}"))
        schedule = json.loads(header[SCHEDULE_KEY]) if SCHEDULE_KEY in header else None
        if schedule is not None and not isinstance(schedule, dict):
            raise CheckpointError(path, "its learning-rate schedule is not a JSON object")
        if not isinstance(meta, dict):
            raise CheckpointError(
                path, f"its metadata is a JSON {type(meta).__name__}, not an object"
            )
        if not isinstance(meta.get("step", 0), int) or meta.get("step", 0) < 0:
            raise CheckpointError(path, f"its step is {meta.get('step')!r}, not a count")
        ckpt = Checkpoint(tensors, public, optimizer, meta, schedule)
    except CheckpointError:
        raise
    except (OSError, SafetensorError, ValueError, KeyError, TypeError, AttributeError) as err:
        # json.JSONDecodeError is a ValueError: metadata that is not JSON lands here too.
        raise CheckpointError(path, f"unreadable ({_short(err)})") from err
    if not ckpt.is_finite():
        raise CheckpointError(path, "holds non-finite values (NaN or infinity)")
    return ckpt


def quarantine(path: Path) -> Path:
    """Move a damaged checkpoint (file or directory) aside, to ``<name>.corrupt-<UTC time>``,
    where the node never reads it again and an operator can still look at it.

    Raises:
        OSError: it could not be moved.
    """
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while os.path.lexists(target):  # two in one second: keep both
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
        n += 1
    os.rename(path, target)
    return target


def remove_stale_temp_files(folder: Path, names: Iterable[str]) -> list[Path]:
    """Remove the temporary files that :func:`atomic_write` leaves for ``names`` when a process
    is killed mid-write (each a full copy of the file). Only one node runs on a state dir, so
    at its start no write of its own is under way."""
    removed = []
    for name in names:
        for tmp in folder.glob(f".{name}.*.tmp"):
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
                removed.append(tmp)
    return removed


def restore_latest(
    state_dir: Path, check: Callable[[Checkpoint, Path], None] = lambda ckpt, path: None
) -> tuple[Checkpoint | None, Path | None]:
    """The newest usable checkpoint in ``state_dir``: the current one, else the previous one.

    Each one that cannot be used (it fails to load, or ``check`` raises :class:`CheckpointError`
    for it) is moved aside with one log line naming the file and the cause. Other errors from
    ``check`` (a checkpoint of another task: not damaged, but not ours) propagate.

    Returns:
        The checkpoint and the file it came from; ``(None, None)`` when there is none to use.
    """
    damaged = 0
    for path in (state_dir / CHECKPOINT_FILE, state_dir / PREVIOUS_FILE):
        if not os.path.lexists(path):
            continue
        try:
            ckpt = load_checkpoint(path)
            check(ckpt, path)
            return ckpt, path
        except CheckpointError as err:
            damaged += 1
            try:
                moved = f"moved it to {quarantine(path).name}"
            except OSError as move_err:
                moved = f"could not move it aside ({_short(move_err)})"
            log.error("damaged checkpoint %s: %s; %s", path, err.cause, moved)
    if damaged:
        log.warning("no usable checkpoint in %s: starting afresh", state_dir)
    return None, None


def check_fits(
    ckpt: Checkpoint,
    model: torch.nn.Module,
    make_optimizer: Callable[[], torch.optim.Optimizer],
    path: Path,
) -> None:
    """Raise :class:`CheckpointError` unless ``ckpt`` fits ``model`` and the optimizer that
    ``make_optimizer`` builds for it exactly (a checkpoint that says it is of this task but is
    not is damaged), and its member list is well formed."""
    expected = model.state_dict()
    if ckpt.model.keys() != expected.keys():
        missing = sorted(expected.keys() - ckpt.model.keys())
        extra = sorted(ckpt.model.keys() - expected.keys())
        raise CheckpointError(
            path, f"its tensors are not the model's (missing {missing}, extra {extra})"
        )
    for name, want in expected.items():
        got = ckpt.model[name]
        if got.shape != want.shape or got.dtype != want.dtype:
            raise CheckpointError(
                path,
                f"{name} is {got.dtype} {list(got.shape)}, the model's is "
                f"{want.dtype} {list(want.shape)}",
            )
    numel = sum(p.numel() for p in model.parameters())
    if ckpt.public.shape != (numel,) or ckpt.public.dtype != torch.float32:
        raise CheckpointError(path, f"its public copy is not {numel} float32 values")
    members = ckpt.meta.get("members", [])
    if not isinstance(members, list) or not all(
        isinstance(m, dict)
        and isinstance(m.get("node_id"), str)
        and isinstance(m.get("address"), str)
        for m in members
    ):
        raise CheckpointError(path, "its member list is malformed")
    if ckpt.schedule is not None and not isinstance(ckpt.schedule.get("last_epoch"), int):
        raise CheckpointError(path, "its learning-rate schedule has no step count")
    if ckpt.optimizer is None:
        return
    optimizer = make_optimizer()
    try:
        optimizer.load_state_dict(copy.deepcopy(dict(ckpt.optimizer)))
    except (ValueError, KeyError, TypeError, IndexError, RuntimeError) as err:
        raise CheckpointError(path, f"its optimizer state does not fit ({_short(err)})") from err
    # load_state_dict checks the groups, not the shapes of what it holds per parameter.
    for param, state in optimizer.state.items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != param.shape:
                raise CheckpointError(path, f"its optimizer's {key} does not fit the parameters")
