"""Restarts: remembered members first, then ``--join``, then the broker; a start that fails
changes nothing on disk; a diverged node keeps its last finite checkpoint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gossip.swim import SwimConfig
from node.daemon.checkpoint import CHECKPOINT_FILE, PREVIOUS_FILE, load_checkpoint
from node.daemon.node import SUMMARY_FILE, JoinError, Node
from node.daemon.trainer import Diverged
from node.transport.memory import MemoryNetwork, MemoryTransport
from tests.node.helpers import config, memory_swarm

TIMEOUT_S = 60.0
SETTINGS: dict[str, Any] = {"trainer.steps": 100_000, "membership": SwimConfig(period_s=0.2)}
DIVERGING = str(Path(__file__).with_name("diverging_task.py")) + ":make_task"


def files(state_dir: Path) -> dict[str, bytes]:
    """What a start must not change: the checkpoints and the summary, byte for byte."""
    names = (CHECKPOINT_FILE, PREVIOUS_FILE, SUMMARY_FILE)
    return {n: (state_dir / n).read_bytes() for n in names if (state_dir / n).exists()}


async def restart(network: MemoryNetwork, state_dir: Path, **settings: Any) -> Node:
    cfg = config(state_dir, listen="mem:0", shard_index=2, shard_count=3, **settings)
    return await Node.create(cfg, transport=MemoryTransport(network))


async def stop_trained(node: Node) -> None:
    await node.wait_until(lambda: node.trainer.step > 20, TIMEOUT_S)
    await node.stop()


async def test_a_node_restarted_after_its_seed_died_rejoins_through_whom_it_remembers(
    tmp_path: Path,
) -> None:
    network = MemoryNetwork()
    async with memory_swarm(tmp_path, 3, SETTINGS, network) as (seed, other, me):
        await stop_trained(me)
        await seed.stop()
        # The same command line as before: --join names the seed, which is gone.
        again = await restart(network, tmp_path / "node-2", join=(seed.address,), **SETTINGS)
        try:
            await again.start()
            assert again.resumed is not None
            await again.wait_until(lambda: other.node_id in again.peers.links, TIMEOUT_S)
        finally:
            await again.stop(grace_s=0)


async def test_remembered_members_come_before_the_join_address(tmp_path: Path) -> None:
    network = MemoryNetwork()
    async with memory_swarm(tmp_path, 3, SETTINGS, network) as (_, other, me):
        await stop_trained(me)
        # A live node of another swarm (another codec) at the --join address refuses us for
        # good; asked first, it would end the start.
        stranger = await Node.create(
            config(tmp_path / "stranger", listen="mem:0", **{"gossip.codec": "int4"}),
            transport=MemoryTransport(network),
        )
        async with stranger:
            again = await restart(network, tmp_path / "node-2", join=(stranger.address,))
            try:
                await again.start()
                assert other.node_id in again.peers.view
                assert stranger.node_id not in again.peers.view
            finally:
                await again.stop(grace_s=0)


async def test_when_every_way_fails_the_start_says_each_and_changes_nothing(
    tmp_path: Path,
) -> None:
    network = MemoryNetwork()
    async with memory_swarm(tmp_path, 3, SETTINGS, network) as nodes:
        await stop_trained(nodes[2])
        for n in nodes[:2]:
            await n.stop()
    state_dir = tmp_path / "node-2"
    before = files(state_dir)
    again = await restart(network, state_dir, join=("mem:404",), wait_timeout_s=0.5)
    with pytest.raises(JoinError) as failed:
        await again.start()
    await again.stop()
    message = str(failed.value)
    assert message.startswith("could not join the swarm through any of: the 2 remembered member")
    assert "; --join mem:404: mem:404 did not answer" in message
    assert files(state_dir) == before
    members = load_checkpoint(state_dir / CHECKPOINT_FILE).meta["members"]
    assert {m["node_id"] for m in members} == {n.node_id for n in nodes[:2]}


async def test_a_first_start_that_fails_writes_no_checkpoint(tmp_path: Path) -> None:
    node = await Node.create(
        config(tmp_path, listen="mem:0", join=("mem:404",), wait_timeout_s=0.3),
        transport=MemoryTransport(MemoryNetwork()),
    )
    with pytest.raises(JoinError, match="did not answer"):
        await node.start()
    await node.stop()
    assert files(tmp_path) == {}
    # The metrics log tells the story: a start and a stop.
    events = [
        json.loads(line)["event"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
    ]
    assert events == ["start", "stop"]


async def test_a_node_stopped_while_it_waits_for_members_writes_nothing(tmp_path: Path) -> None:
    node = await Node.create(
        config(tmp_path, listen="mem:0", wait_members=3, checkpoint_interval_s=0.05),
        transport=MemoryTransport(MemoryNetwork()),
    )
    await node.start()
    # Several checkpoint intervals pass while it waits.
    with pytest.raises(TimeoutError):
        await node.wait_until(node.trainer.done.is_set, 0.5)
    await node.stop()
    assert files(tmp_path) == {}


async def test_a_node_that_finds_nobody_goes_on_alone_and_still_remembers_them(
    tmp_path: Path,
) -> None:
    network = MemoryNetwork()
    async with memory_swarm(tmp_path, 3, SETTINGS, network) as nodes:
        await stop_trained(nodes[2])
        for n in nodes[:2]:
            await n.stop()
    state_dir = tmp_path / "node-2"
    again = await restart(network, state_dir, wait_timeout_s=0.5, **{"trainer.steps": 10_000})
    step = again.trainer.step
    await again.start()  # no --join: the swarm may be gone, and this node goes on alone
    await again.wait_until(lambda: again.trainer.step > step + 10, TIMEOUT_S)
    await again.stop()
    ckpt = load_checkpoint(state_dir / CHECKPOINT_FILE)
    assert ckpt.meta["step"] > step + 10
    assert {m["node_id"] for m in ckpt.meta["members"]} == {n.node_id for n in nodes[:2]}
    assert load_checkpoint(state_dir / PREVIOUS_FILE).meta["step"] == step


async def test_a_diverged_node_keeps_its_last_finite_checkpoint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    network = MemoryNetwork()
    async with memory_swarm(tmp_path, 3, SETTINGS, network) as nodes:
        await stop_trained(nodes[2])
    state_dir = tmp_path / "node-2"
    before = files(state_dir)
    started = load_checkpoint(state_dir / CHECKPOINT_FILE).meta["step"]
    # Its loss turns NaN from its 20th step on, and rollbacks cannot fix that.
    again = await restart(
        network, state_dir, task=DIVERGING, checkpoint_interval_s=0.05, wait_timeout_s=0.5
    )
    await again.start()
    err = await again.wait_failed()
    await again.stop()
    assert isinstance(err, Diverged)
    assert "again after 3 rollbacks in a row" in str(err)
    assert again.trainer.rollbacks == 3
    assert files(state_dir)[SUMMARY_FILE] != before[SUMMARY_FILE]
    # A periodic checkpoint may land in the finite steps before the loss turns NaN, or after a
    # rollback to them; none may hold a non-finite value (load_checkpoint checks every one).
    if (state_dir / PREVIOUS_FILE).exists():
        load_checkpoint(state_dir / PREVIOUS_FILE)
    assert load_checkpoint(state_dir / CHECKPOINT_FILE).meta["step"] >= started
    summary = json.loads(
        (state_dir / SUMMARY_FILE).read_text(), parse_constant=lambda c: pytest.fail(c)
    )
    assert summary["step"] == again.trainer.step
    assert f"{state_dir / CHECKPOINT_FILE} stays as it was" in caplog.text
    rollbacks = [
        json.loads(line)
        for line in (state_dir / "metrics.jsonl").read_text().splitlines()
        if "rollback" in line
    ]
    assert [r["loss"] for r in rollbacks] == [None] * 3  # NaN, in strict JSON
