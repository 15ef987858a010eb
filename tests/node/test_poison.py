"""Poison at the door: a joiner adopts a pulled model only once a second member's agrees with
it, and a node refuses a snapshot that would put a replica absurdly far from its model."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import torch

from gossip.messages import ModelChunk
from node.daemon.node import METRICS_FILE, Node
from node.daemon.service import NodeService
from node.transport.base import iter_chunks
from node.transport.memory import MemoryNetwork, MemoryTransport
from tests.node.helpers import config, memory_swarm

TIMEOUT_S = 60.0
SETTLED = {"trainer.steps": 100, "gossip.idle_round_interval_s": None}


class Poisoner(NodeService):
    """A member that answers every pull with 1e38 everywhere: finite, and fatal to a model."""

    async def rpc_pull_model(
        self, protocol_version: int, requester: str, have: bytes = b""
    ) -> AsyncIterator[ModelChunk]:
        model, _ = await self.port.model_copy()
        values = torch.full_like(model, 1e38)
        for chunk in iter_chunks(values):
            yield ModelChunk(values.numel(), chunk.offset, chunk.data, 10**6)


async def start_poisoner(tmp_path: Path, network: MemoryNetwork, join: str, shard: int) -> Node:
    cfg = config(
        tmp_path / "poisoner",
        listen="mem:0",
        join=(join,),
        shard_index=shard,
        shard_count=shard + 2,
        **SETTLED,
    )
    node = await Node.create(cfg, transport=MemoryTransport(network))
    node.service = Poisoner(node.service.port, node.service.inbound)
    await node.start()
    return node


async def join_through(tmp_path: Path, network: MemoryNetwork, helper: str, shard: int) -> Node:
    cfg = config(
        tmp_path / "joiner",
        listen="mem:0",
        join=(helper,),
        shard_index=shard,
        shard_count=shard + 1,
        wait_members=shard + 1,
        **{"trainer.steps": 1_000_000},
    )
    joiner = await Node.create(cfg, transport=MemoryTransport(network))
    return joiner


def pulls(node: Node) -> list[dict[str, object]]:
    lines = (node.cfg.state_dir / METRICS_FILE).read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == "pulled_model"]


async def test_a_joiner_outvotes_a_member_that_serves_a_poisoned_model(tmp_path: Path) -> None:
    network = MemoryNetwork()
    async with memory_swarm(tmp_path, 3, SETTLED, network) as nodes:
        for n in nodes:
            await n.wait_until(n.training_finished.is_set, TIMEOUT_S)
        poisoner = await start_poisoner(tmp_path, network, nodes[0].address, 3)
        try:
            # The joiner asks the poisoner first (it is the member the joiner came through).
            joiner = await join_through(tmp_path, network, poisoner.address, 4)
            try:
                await joiner.start()
                pulled = joiner.flat.flat.clone() if joiner.trainer.step == 0 else None
                assert pulled is not None
                # One honest member's model, to the bit (they no longer train or mix).
                assert any(torch.equal(pulled, n.flat.flat) for n in nodes)
                [record] = pulls(joiner)
                assert record["source"] != poisoner.address
                assert record["agreed_with"] in {n.address for n in nodes}
            finally:
                await joiner.stop(grace_s=0)
        finally:
            await poisoner.stop(grace_s=0)


async def test_a_joiner_with_no_two_models_that_agree_starts_from_its_own(tmp_path: Path) -> None:
    network = MemoryNetwork()
    async with memory_swarm(tmp_path, 1, SETTLED, network) as nodes:
        await nodes[0].wait_until(nodes[0].training_finished.is_set, TIMEOUT_S)
        poisoner = await start_poisoner(tmp_path, network, nodes[0].address, 1)
        try:
            joiner = await join_through(tmp_path, network, poisoner.address, 2)
            session = joiner.state.session  # adopting a model starts a new one
            try:
                await joiner.start()
                assert joiner.state.session == session
                assert pulls(joiner) == []
                assert joiner.counters.rejected["implausible"] == 2  # both pulls, unadopted
            finally:
                await joiner.stop(grace_s=0)
        finally:
            await poisoner.stop(grace_s=0)


async def test_the_only_other_member_is_adopted_when_plausible(tmp_path: Path) -> None:
    network = MemoryNetwork()
    async with memory_swarm(tmp_path, 1, SETTLED, network) as nodes:
        await nodes[0].wait_until(nodes[0].training_finished.is_set, TIMEOUT_S)
        joiner = await join_through(tmp_path, network, nodes[0].address, 1)
        try:
            await joiner.start()
            [record] = pulls(joiner)
            assert record["source"] == nodes[0].address
            assert record["agreed_with"] is None
        finally:
            await joiner.stop(grace_s=0)
