"""Shared fixtures: every child process a test starts is reaped, whatever happens, and no test
leaves a trainer thread running."""

from __future__ import annotations

import os
import signal
import threading
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


#: How long a trainer a test asked to stop may take to end (one evaluation or step).
TRAINER_END_S = 30.0


@pytest.fixture(autouse=True)
def no_trainer_left_running() -> Iterator[None]:
    """A trainer past its budget keeps evaluating until asked to stop. One left running when
    the interpreter exits is killed inside torch's C++ code, which aborts the whole pytest
    process ("terminate called without an active exception") after every test passed."""
    before = set(threading.enumerate())
    yield
    left = [t for t in threading.enumerate() if t.name == "trainer" and t not in before]
    for thread in left:
        thread.join(TRAINER_END_S)
    running = [t for t in left if t.is_alive()]
    assert not running, f"the test left {len(running)} trainer thread(s) running: stop them"
