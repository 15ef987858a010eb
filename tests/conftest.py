"""Shared fixtures: every child process a test starts is reaped, whatever happens."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
import torch

torch.set_num_threads(1)  # many nodes share two cores in CI; intra-op threads only contend


def _children() -> set[int]:
    """Pids of this process's children (Linux /proc)."""
    me = os.getpid()
    pids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:
            pids.add(int(entry))
    return pids


@pytest.fixture(scope="session", autouse=True)
def reap_stray_children() -> Iterator[None]:
    before = _children()
    yield
    for pid in _children() - before:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
