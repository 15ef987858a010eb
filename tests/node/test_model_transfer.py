"""A 50M-parameter model moves from a node to a joiner in chunks, in bounded memory."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from node.daemon.node import Node
from tests.node.helpers import config


@pytest.mark.timeout(300)
async def test_a_50m_parameter_model_moves_with_the_receivers_memory_under_twice_its_size(
    tmp_path: Path,
) -> None:
    # The sender never trains (it waits for members that never come); it only serves.
    cfg = config(tmp_path, task="tests/node/big_task.py:make_task", wait_members=2)
    sender = await Node.create(cfg)
    numel = sender.flat.numel
    assert numel >= 50_000_000
    await sender.start()
    try:
        probe = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.node.pull_probe",
            sender.address,
            str(numel),
            stdout=subprocess.PIPE,
        )
        out, _ = await probe.communicate()
        assert probe.returncode == 0
        result = json.loads(out)
        expected_sum = float(sender.flat.flat.double().sum())
    finally:
        await sender.stop(grace_s=0)
    model_bytes = 4 * numel
    assert result["numel"] == numel
    assert result["sum"] == pytest.approx(expected_sum, rel=1e-9)
    grown = result["peak_bytes"] - result["baseline_bytes"]
    # The receiver's buffer is one model; the chunks in flight add little on top of it.
    assert grown < 2 * model_bytes, (grown / model_bytes, result)
    print(f"receiver grew by {grown / model_bytes:.2f} x the model ({model_bytes / 1e6:.0f} MB)")
