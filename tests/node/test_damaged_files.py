"""Files never trap a node: a damaged checkpoint is moved aside and the node falls back to the
previous one, or starts afresh and pulls the swarm's model; leftovers of a killed write go.

(The same table against real ``murmur run`` processes is in tests/e2e/test_damaged_files.py.)
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from node.daemon.checkpoint import CHECKPOINT_FILE, PREVIOUS_FILE, load_checkpoint
from node.daemon.node import Node
from node.transport.memory import MemoryNetwork, MemoryTransport
from tests.node.damage import DAMAGES
from tests.node.helpers import config

TIMEOUT_S = 60.0


async def train_alone(state_dir: Path, steps: int) -> None:
    """One life of a node that starts a swarm of its own, trains ``steps`` and stops."""
    cfg = config(state_dir, listen="mem:0", **{"trainer.steps": steps})
    node = await Node.create(cfg, transport=MemoryTransport(MemoryNetwork()))
    async with node:
        await node.wait_until(node.training_finished.is_set, TIMEOUT_S)


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state dir whose checkpoint is at step 20 and whose previous one is at step 10."""
    state_dir = tmp_path_factory.mktemp("trained")

    async def make() -> None:
        await train_alone(state_dir, 10)
        await train_alone(state_dir, 20)

    asyncio.run(make())
    return state_dir


@pytest.fixture
def state_dir(trained_dir: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "state"
    shutil.copytree(trained_dir, copy)
    return copy


def corrupt_files(state_dir: Path) -> list[str]:
    return sorted(p.name for p in state_dir.glob("*.corrupt-*"))


async def create(state_dir: Path) -> Node:
    return await Node.create(config(state_dir, listen="mem:0"), MemoryTransport(MemoryNetwork()))


def test_a_node_keeps_its_last_two_checkpoints(trained_dir: Path) -> None:
    assert load_checkpoint(trained_dir / CHECKPOINT_FILE).meta["step"] == 20
    assert load_checkpoint(trained_dir / PREVIOUS_FILE).meta["step"] == 10


@pytest.mark.parametrize("damage", DAMAGES.values(), ids=DAMAGES.keys())
async def test_a_damaged_checkpoint_is_moved_aside_for_the_previous_one(
    state_dir: Path, damage: Callable[[Path], None], caplog: pytest.LogCaptureFixture
) -> None:
    path = state_dir / CHECKPOINT_FILE
    damage(path)
    with caplog.at_level(logging.INFO):
        node = await create(state_dir)
    assert node.resumed is not None
    assert node.resumed.meta["step"] == 10
    assert node.trainer.step == 10
    assert not path.exists()
    [moved] = corrupt_files(state_dir)
    assert moved.startswith(f"{CHECKPOINT_FILE}.corrupt-")
    [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert line.startswith(f"damaged checkpoint {path}: ")
    assert moved in line
    assert "\n" not in line
    assert len(line) < 400
    assert f"resuming from {state_dir / PREVIOUS_FILE} at step 10" in caplog.text


@pytest.mark.parametrize("damage", DAMAGES.values(), ids=DAMAGES.keys())
async def test_with_both_checkpoints_damaged_a_node_starts_afresh(
    state_dir: Path, damage: Callable[[Path], None], caplog: pytest.LogCaptureFixture
) -> None:
    damage(state_dir / CHECKPOINT_FILE)
    damage(state_dir / PREVIOUS_FILE)
    node = await create(state_dir)
    assert node.resumed is None
    assert node.trainer.step == 0
    assert len(corrupt_files(state_dir)) == 2
    assert f"no usable checkpoint in {state_dir}: starting afresh" in caplog.text


async def test_a_node_without_a_usable_checkpoint_pulls_the_swarms_model(
    state_dir: Path, tmp_path: Path
) -> None:
    DAMAGES["garbage"](state_dir / CHECKPOINT_FILE)
    (state_dir / PREVIOUS_FILE).unlink()
    network = MemoryNetwork()
    seed = await Node.create(
        config(tmp_path / "seed", listen="mem:0", **{"trainer.steps": 30}),
        MemoryTransport(network),
    )
    async with seed:
        await seed.wait_until(seed.training_finished.is_set, TIMEOUT_S)
        cfg = config(state_dir, listen="mem:0", join=(seed.address,), **{"trainer.steps": 0})
        node = await Node.create(cfg, MemoryTransport(network))
        async with node:
            # It pulled the seed's model (the seed no longer trains, so its model holds).
            assert torch.equal(node.flat.flat, seed.flat.flat)
    records = (state_dir / "metrics.jsonl").read_text()
    assert '"event": "pulled_model"' in records


async def test_stale_temp_files_of_a_killed_write_are_removed_on_start(state_dir: Path) -> None:
    stale = [
        state_dir / f".{CHECKPOINT_FILE}.k2j4h1.tmp",
        state_dir / ".summary.json.x9a.tmp",
    ]
    for tmp in stale:
        tmp.write_bytes(b"half a model")
    others = state_dir / ".node_key.pem.tmp"  # not a file the checkpoint code writes
    others.write_bytes(b"")
    node = await create(state_dir)
    assert node.resumed is not None
    assert node.resumed.meta["step"] == 20
    assert not any(tmp.exists() for tmp in stale)
    assert others.exists()


async def test_a_checkpoint_of_another_task_is_refused_not_moved(state_dir: Path) -> None:
    cfg = config(state_dir, listen="mem:0", **{"gossip.codec": "int4"})
    with pytest.raises(ValueError, match="holds a checkpoint of another task or codec"):
        await Node.create(cfg, MemoryTransport(MemoryNetwork()))
    assert corrupt_files(state_dir) == []
    assert load_checkpoint(state_dir / CHECKPOINT_FILE).meta["step"] == 20
