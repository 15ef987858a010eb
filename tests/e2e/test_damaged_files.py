"""Files never trap a real ``murmur run`` process: every kind of damaged checkpoint, a
checkpoint with no good one before it, and a full disk under a running node.

The full disk is real: the node's state dir is a 2 MiB tmpfs mounted in a mount namespace of its
own (``unshare``), which this test fills up through ``/proc/PID/root`` while the node runs.
"""

from __future__ import annotations

import asyncio
import errno
import re
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from node.daemon.checkpoint import CHECKPOINT_FILE, PREVIOUS_FILE, load_checkpoint
from tests.e2e.processes import Processes, murmur, processes
from tests.node.damage import DAMAGES
from tests.node.test_damaged_files import train_alone

pytestmark = pytest.mark.e2e


@pytest.fixture
async def start() -> AsyncIterator[Processes]:
    async with processes() as started:
        yield started


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state dir whose checkpoint is at step 20 and whose previous one is at step 10."""
    state_dir = tmp_path_factory.mktemp("trained")

    async def make() -> None:
        await train_alone(state_dir, 10)
        await train_alone(state_dir, 20)

    asyncio.run(make())
    return state_dir


@pytest.mark.parametrize("damage", DAMAGES.values(), ids=DAMAGES.keys())
async def test_a_node_process_falls_back_to_the_previous_checkpoint(
    trained_dir: Path, tmp_path: Path, damage: Callable[[Path], None], start: Processes
) -> None:
    state_dir = tmp_path / "state"
    shutil.copytree(trained_dir, state_dir)
    path = state_dir / CHECKPOINT_FILE
    damage(path)
    node = await start(*murmur("--state-dir", str(state_dir), "--steps", "40"))
    assert (await node.event())["event"] == "ready"
    trained = await node.event()
    assert (trained["event"], trained["step"]) == ("trained", 40)
    code, log = await node.stop()
    assert code == 0, log
    assert "Traceback" not in log
    [line] = [line for line in log.splitlines() if "damaged checkpoint" in line]
    assert f"damaged checkpoint {path}: " in line
    assert f"moved it to {CHECKPOINT_FILE}.corrupt-" in line
    assert f"resuming from {state_dir / PREVIOUS_FILE} at step 10" in log
    assert len(list(state_dir.glob(f"{CHECKPOINT_FILE}.corrupt-*"))) == 1
    assert load_checkpoint(path).meta["step"] == 40


async def test_without_a_good_checkpoint_a_node_process_starts_afresh_from_the_swarm(
    trained_dir: Path, tmp_path: Path, start: Processes
) -> None:
    seed = await start(*murmur("--state-dir", str(tmp_path / "seed"), "--steps", "30"))
    address = (await seed.event())["address"]
    assert (await seed.event())["event"] == "trained"
    state_dir = tmp_path / "state"
    shutil.copytree(trained_dir, state_dir)
    DAMAGES["nan-filled"](state_dir / CHECKPOINT_FILE)  # what a diverged node used to write
    DAMAGES["truncated"](state_dir / PREVIOUS_FILE)
    node = await start(*murmur("--state-dir", str(state_dir), "--join", address, "--steps", "5"))
    assert (await node.event())["event"] == "ready"
    assert (await node.event())["step"] == 5  # from step 0 again
    code, log = await node.stop()
    assert code == 0, log
    assert "Traceback" not in log
    assert log.count("damaged checkpoint") == 2
    assert "holds non-finite values" in log
    assert f"no usable checkpoint in {state_dir}: starting afresh" in log
    assert f"started from the model of {address}" in log
    assert load_checkpoint(state_dir / CHECKPOINT_FILE).meta["step"] == 5
    assert (await seed.stop())[0] == 0


def _can_mount_in_a_namespace() -> bool:
    probe = ["unshare", "--mount", "--map-root-user", "true"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def fill(folder: Path) -> Path:
    """Fill the file system of ``folder`` to the last byte; returns the ballast file."""
    ballast = folder / "ballast"
    chunk = b"\0" * 65536
    with ballast.open("wb", buffering=0) as f:
        while True:
            try:
                f.write(chunk)
            except OSError as err:
                if err.errno != errno.ENOSPC:
                    raise
                if len(chunk) == 1:
                    return ballast
                chunk = chunk[: len(chunk) // 2]


@pytest.mark.skipif(not _can_mount_in_a_namespace(), reason="needs unshare --mount (user ns)")
async def test_a_full_disk_keeps_the_old_checkpoint_and_training_goes_on(
    tmp_path: Path, start: Processes
) -> None:
    mount = tmp_path / "state"
    mount.mkdir()
    script = 'mount -t tmpfs -o size=2m files-full "$0" && exec "$@"'
    node = await start(
        "unshare",
        "--mount",
        "--map-root-user",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
        str(mount),
        *murmur("--state-dir", str(mount), "--checkpoint-interval", "0.2"),
        "--step-time",
        "0.01",
        "--eval-every",
        "25",
    )
    assert (await node.event())["event"] == "ready"
    # The node's view of its state dir: the tmpfs, visible only in its mount namespace.
    state_dir = Path(f"/proc/{node.proc.pid}/root") / mount.relative_to("/")
    path = state_dir / CHECKPOINT_FILE
    await node.line_with("step 25 eval_loss")
    await node.line_with("step 50 eval_loss")  # a few checkpoint intervals later: one is written
    assert path.is_file()
    ballast = fill(state_dir)
    warning = await node.line_with("could not write the checkpoint")
    assert "No space left on device" in warning
    kept = path.read_bytes()
    step = load_checkpoint(path).meta["step"]
    # Training goes on (several checkpoint intervals), the old checkpoint stays, no warning
    # again, and the failed writes leave no temporary files behind.
    evals = [await node.line_with(" eval_loss ") for _ in range(3)]
    steps = [int(re.search(r" step (\d+) eval_loss ", line)[1]) for line in evals]  # type: ignore[index]
    assert step < steps[0] < steps[1] < steps[2]
    assert path.read_bytes() == kept
    assert not list(state_dir.glob(".*.tmp"))
    ballast.unlink()
    await node.line_with("wrote the checkpoint")
    assert load_checkpoint(path).meta["step"] > step
    code, log = await node.stop()
    assert code == 0, log
    assert log.count("could not write the checkpoint") == 1
    assert "Traceback" not in log
