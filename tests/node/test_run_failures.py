"""``murmur run`` as a real process when training diverges: the reason in one line, exit 1, no
``trained`` event, and the checkpoint on disk untouched."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from node.daemon.checkpoint import CHECKPOINT_FILE, PREVIOUS_FILE, load_checkpoint
from tests.node.test_damaged_files import train_alone

TIMEOUT_S = 120.0
DIVERGING = str(Path(__file__).with_name("diverging_task.py")) + ":make_task"
ARGS = ["--listen", "127.0.0.1:0", "--device", "cpu", "--threads", "1", "--insecure"]


async def test_a_diverged_node_exits_1_without_trained_and_keeps_its_checkpoint(
    tmp_path: Path,
) -> None:
    state_dir = tmp_path / "state"
    await train_alone(state_dir, 10)
    await train_alone(state_dir, 20)
    started = load_checkpoint(state_dir / CHECKPOINT_FILE).meta["step"]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "node",
        "run",
        *ARGS,
        "--state-dir",
        str(state_dir),
        "--task",
        DIVERGING,  # its loss is NaN from the 20th step on: rollbacks cannot help
        "--steps",
        "200",
        "--checkpoint-interval",
        "0.05",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT_S)
    log = err.decode()
    assert proc.returncode == 1, log
    events = [json.loads(line)["event"] for line in out.decode().splitlines()]
    assert events == ["ready"]
    assert "Traceback" not in log
    assert log.count("rolled back to the model and optimizer of step 20") == 3
    [reason] = [line for line in log.splitlines() if "failed:" in line]
    assert reason.endswith(
        "training loss became nan at step 43 again after 3 rollbacks in a row (to step 20)"
    )
    # A periodic checkpoint may land in the finite steps before the loss turns NaN, or after a
    # rollback to them; none may hold a non-finite value (load_checkpoint checks every one).
    if (state_dir / PREVIOUS_FILE).exists():
        load_checkpoint(state_dir / PREVIOUS_FILE)
    assert load_checkpoint(state_dir / CHECKPOINT_FILE).meta["step"] >= started
