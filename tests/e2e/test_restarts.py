"""Restarts of real ``murmur run`` processes with the same command line: a dead seed does not
keep a node out, and a start that fails changes nothing on disk."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from node.daemon.checkpoint import CHECKPOINT_FILE, load_checkpoint
from tests.e2e.processes import Processes, murmur, processes

pytestmark = pytest.mark.e2e


@pytest.fixture
async def start() -> AsyncIterator[Processes]:
    async with processes() as started:
        yield started


COMMON = ["--wait-members", "3", "--swim-period", "0.5", "--step-time", "0.01"]


async def test_a_node_restarted_after_its_seed_died_rejoins_the_others(
    tmp_path: Path, start: Processes
) -> None:
    seed = await start(*murmur("--state-dir", str(tmp_path / "a"), *COMMON))
    seed_address = (await seed.event())["address"]
    same = ["--state-dir", str(tmp_path / "c"), "--join", seed_address, *COMMON]
    b = await start(*murmur("--state-dir", str(tmp_path / "b"), "--join", seed_address, *COMMON))
    b_ready = await b.event()
    c = await start(*murmur(*same))
    await c.event()
    await c.line_with("step 100 eval_loss")
    code, _ = await c.stop()
    assert code == 0
    members = load_checkpoint(tmp_path / "c" / CHECKPOINT_FILE).meta["members"]
    assert {m["address"] for m in members} == {seed_address, b_ready["address"]}
    seed.proc.send_signal(signal.SIGKILL)
    await seed.proc.wait()

    # The same command line: its --join names the dead seed; b, which it remembers, is alive.
    again = await start(*murmur(*same, "--wait-members", "2", "--wait-timeout", "5"))
    assert (await again.event())["event"] == "ready"
    await again.line_with("step 200 eval_loss")
    # It found b and its link up: it did not give up waiting and train alone.
    assert "starts training with" not in "\n".join(again.lines)
    assert "resuming from" in "\n".join(again.lines)
    code, log = await again.stop()
    assert code == 0, log
    assert "Traceback" not in log
    assert (await b.stop())[0] == 0


async def test_a_start_that_finds_nobody_exits_2_and_changes_nothing(
    tmp_path: Path, start: Processes
) -> None:
    first = await start(*murmur("--state-dir", str(tmp_path / "a"), "--steps", "20"))
    address = (await first.event())["address"]
    node = await start(
        *murmur("--state-dir", str(tmp_path / "b"), "--join", address, "--steps", "20")
    )
    await node.event()
    assert (await node.event())["event"] == "trained"
    assert (await node.stop())[0] == 0
    assert (await first.stop())[0] == 0
    before = (tmp_path / "b" / CHECKPOINT_FILE).read_bytes()
    again = await start(
        *murmur("--state-dir", str(tmp_path / "b"), "--join", address, "--wait-timeout", "1")
    )
    code = await again.proc.wait()
    log = await again.rest()
    assert code == 2, log
    assert "could not join the swarm through any of: the 1 remembered member(s)" in log
    assert f"--join {address}: {address} did not answer" in log
    assert (tmp_path / "b" / CHECKPOINT_FILE).read_bytes() == before
