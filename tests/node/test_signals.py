"""SIGINT and SIGTERM stop a real ``murmur run`` process at any moment, promptly, with exit code
0 and a state dir a node can start from again. Each test waits for its phase by the log line
that announces it, then sends the signal."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from node.daemon.checkpoint import CHECKPOINT_FILE, load_checkpoint
from node.daemon.node import SUMMARY_FILE
from node.security.identity import KEY_FILE

#: How long a stop may take at most before the test calls it a hang. Before the fix a node
#: that was joining a dead address left after 64 s, and ignored SIGTERM for minutes.
STOP_DEADLINE_S = 15.0
PHASE_TIMEOUT_S = 90.0
TESTS = Path(__file__).resolve().parent


class Run:
    """One ``murmur run`` process whose log (stderr) is read line by line."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.log: list[str] = []

    async def wait_for_line(self, text: str) -> str:
        """Read the log until a line holding ``text``; fails loudly if it never comes."""
        assert self.proc.stderr is not None
        async with asyncio.timeout(PHASE_TIMEOUT_S):
            while True:
                raw = await self.proc.stderr.readline()
                assert raw, f"the node exited before {text!r}:\n" + "".join(self.log)
                line = raw.decode(errors="replace")
                self.log.append(line)
                if text in line:
                    return line

    async def ready(self) -> dict[str, str]:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), PHASE_TIMEOUT_S)
        assert line, "the node exited:\n" + "".join(self.log)
        event: dict[str, str] = json.loads(line)
        return event

    async def stop(self, sig: signal.Signals) -> tuple[int, float]:
        """Send ``sig``; the exit code and how long the node took to exit."""
        started = time.monotonic()
        self.proc.send_signal(sig)
        assert self.proc.stderr is not None
        rest = await asyncio.wait_for(self.proc.stderr.read(), STOP_DEADLINE_S)
        self.log.append(rest.decode(errors="replace"))
        code = await asyncio.wait_for(self.proc.wait(), STOP_DEADLINE_S)
        return code, time.monotonic() - started


@pytest.fixture
async def start(tmp_path: Path) -> AsyncIterator[object]:
    runs: list[Run] = []

    async def run(name: str, *args: str) -> Run:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "node",
            "--log-level",
            "DEBUG",
            "run",
            "--insecure",
            "--listen",
            "127.0.0.1:0",
            "--device",
            "cpu",
            "--threads",
            "1",
            "--state-dir",
            str(tmp_path / name),
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        runs.append(Run(proc))
        return runs[-1]

    yield run
    for r in runs:
        if r.proc.returncode is None:
            r.proc.kill()
            await r.proc.wait()


@pytest.fixture
def dead_address() -> Iterator[str]:
    """An address where nothing listens (bound, so that nobody else takes it meanwhile)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{s.getsockname()[1]}"


def assert_valid_state_dir(state_dir: Path) -> None:
    """What a stop leaves is what a node can start from: its key, and a checkpoint and summary
    that read back (if it wrote them)."""
    assert (state_dir / KEY_FILE).exists()
    if (state_dir / CHECKPOINT_FILE).exists():
        load_checkpoint(state_dir / CHECKPOINT_FILE)
    if (state_dir / SUMMARY_FILE).exists():
        json.loads((state_dir / SUMMARY_FILE).read_text())


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
async def test_a_signal_stops_a_node_joining_a_dead_address(
    start, dead_address: str, tmp_path: Path, sig: signal.Signals
) -> None:
    node = await start("a", "--join", dead_address, "--wait-timeout", "300")
    await node.wait_for_line(f"waiting for {dead_address} to answer")
    code, took = await node.stop(sig)
    assert code == 0, "".join(node.log)
    assert "Traceback" not in "".join(node.log)
    assert took < STOP_DEADLINE_S
    assert_valid_state_dir(tmp_path / "a")


async def test_a_signal_stops_a_node_waiting_for_members(start, tmp_path: Path) -> None:
    node = await start("a", "--wait-members", "3", "--wait-timeout", "300")
    await node.wait_for_line("waiting for members")
    code, _ = await node.stop(signal.SIGTERM)
    assert code == 0, "".join(node.log)
    assert "Traceback" not in "".join(node.log)
    assert_valid_state_dir(tmp_path / "a")


@pytest.mark.e2e  # two processes with a 50M-parameter model each
async def test_a_signal_stops_a_node_pulling_the_model(start, tmp_path: Path) -> None:
    big = f"{TESTS / 'big_task.py'}:make_task"
    seed = await start("seed", "--task", big, "--steps", "1")
    address = (await seed.ready())["address"]
    joiner = await start("joiner", "--task", big, "--join", address)
    await joiner.wait_for_line("pulling the swarm's model")
    code, _ = await joiner.stop(signal.SIGINT)
    assert code == 0, "".join(joiner.log)
    assert "Traceback" not in "".join(joiner.log)
    assert_valid_state_dir(tmp_path / "joiner")
    # The swarm's node goes on, and stops cleanly too.
    assert (await seed.stop(signal.SIGTERM))[0] == 0


async def test_a_signal_stops_a_node_while_it_trains(start, tmp_path: Path) -> None:
    node = await start("a", "--eval-every", "50")
    await node.wait_for_line("step 100 eval_loss")
    code, _ = await node.stop(signal.SIGINT)
    assert code == 0, "".join(node.log)
    assert_valid_state_dir(tmp_path / "a")
    assert load_checkpoint(tmp_path / "a" / CHECKPOINT_FILE).meta["step"] >= 100


@pytest.mark.e2e  # a node writing 50 MB checkpoints back to back
async def test_a_signal_stops_a_node_writing_a_checkpoint(start, tmp_path: Path) -> None:
    medium = f"{TESTS / 'medium_task.py'}:make_task"
    node = await start("a", "--task", medium, "--checkpoint-interval", "0.2")
    await node.wait_for_line("writing a checkpoint")
    code, _ = await node.stop(signal.SIGTERM)
    assert code == 0, "".join(node.log)
    assert "Traceback" not in "".join(node.log)
    assert_valid_state_dir(tmp_path / "a")
