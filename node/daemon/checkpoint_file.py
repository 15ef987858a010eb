"""The checkpoint file on disk: one safetensors file, written atomically, with a checksum.

A checkpoint is written to a temporary file in the same folder, flushed to disk, then renamed
over the old one (which first becomes the previous checkpoint), and the folder itself is synced:
a power cut at any moment leaves a whole checkpoint, never a torn one. A SHA-256 over every
tensor (name, dtype, shape, bytes) and the metadata travels in the header and is checked on load,
so flipped bits are found instead of trained on.

This module holds what is purely about bytes on disk: the names murmur reserves in the file,
:func:`atomic_write`, the streamed safetensors writer, the checksum, and how an optimizer's state
is split into tensors and JSON. What a checkpoint holds, and how one is saved, loaded, checked
and moved aside, is in :mod:`node.daemon.checkpoint`.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import torch

__all__ = [
    "CHECKSUM_KEY",
    "META_KEY",
    "OPTIM_KEY",
    "OPTIM_PREFIX",
    "PUBLIC_KEY",
    "SCHEDULE_KEY",
    "atomic_write",
]

PUBLIC_KEY = "murmur.public_copy"
OPTIM_PREFIX = "murmur.optimizer."
META_KEY = "murmur"
OPTIM_KEY = "murmur.optimizer"
SCHEDULE_KEY = "murmur.schedule"
CHECKSUM_KEY = "murmur.sha256"


def atomic_write(
    path: Path, data: bytes | Callable[[BinaryIO], None], previous: Path | None = None
) -> None:
    """Replace ``path`` with ``data`` so that readers see the old or the new bytes, nothing else.

    ``data`` is the bytes, or a function that writes them to the file it is given (so that a
    large file never has to be in memory whole).

    Each write goes through a temporary file of its own, so writers that overlap (a periodic
    checkpoint still being written when the final one starts) never trip over each other. With
    ``previous``, the old file is renamed there once the new bytes are on disk (a crash between
    the two renames leaves the old file as ``previous``, which readers fall back to). A failed
    write (a full disk, say) removes its temporary file and leaves everything as it was.
    """
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            if isinstance(data, bytes):
                f.write(data)
            else:
                data(f)
            f.flush()
            os.fsync(f.fileno())
        if previous is not None and path.is_file():
            os.replace(path, previous)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


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


def _checksum(tensors: Mapping[str, torch.Tensor], meta: Mapping[str, str]) -> str:
    """SHA-256 over every tensor's name, dtype, shape and bytes, then the metadata, in name
    order: independent of the file's layout, and a flip in any of them changes it."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name]
        h.update(json.dumps([name, str(t.dtype), list(t.shape)]).encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().data)
    for key in sorted(k for k in meta if k != CHECKSUM_KEY):
        h.update(json.dumps([key, meta[key]]).encode())
    return h.hexdigest()


#: torch's dtypes as the safetensors format names them.
_SAFETENSORS_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def _write_safetensors(
    f: BinaryIO, tensors: Mapping[str, torch.Tensor], meta: dict[str, str]
) -> None:
    """Write ``tensors`` to ``f`` in the safetensors format, one tensor at a time: an 8-byte
    little-endian header length, a JSON header (each tensor's dtype, shape and byte range, and
    ``__metadata__``) padded with spaces to 8 bytes, then the bytes in the header's order.

    ``safetensors.torch.save`` builds the whole file as one bytes object, and ``save_file``
    first copies every tensor into bytes too, and both refuse tensors that share storage (a
    model's views of one flat buffer), which needed a clone of each: a 25M-parameter node's
    checkpoint cost three copies of model, optimizer and public copy at once. Here a CPU tensor
    is written from its own memory; a tensor on an accelerator is copied to the CPU one at a
    time. The file is read back with safetensors itself
    (:func:`node.daemon.checkpoint.load_checkpoint`).
    """
    header: dict[str, Any] = {"__metadata__": meta}
    offset = 0
    names = sorted(tensors)
    for name in names:
        t = tensors[name]
        if t.dtype not in _SAFETENSORS_DTYPES:
            raise ValueError(f"tensor {name} has dtype {t.dtype}, which a checkpoint cannot hold")
        size = t.numel() * t.element_size()
        header[name] = {
            "dtype": _SAFETENSORS_DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    f.write(struct.pack("<Q", len(blob)))
    f.write(blob)
    for name in names:
        t = tensors[name].cpu().contiguous()
        if t.numel():
            f.write(t.reshape(-1).view(torch.uint8).numpy().data)
