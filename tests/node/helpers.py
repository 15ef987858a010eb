"""Building nodes for tests: small budgets, port 0, state in a temporary folder."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import torch

from node.config import GossipConfig, NodeConfig
from node.node import Node
from node.trainer import TrainerConfig
from node.transport.base import Transport
from node.transport.memory import MemoryNetwork, MemoryTransport


def config(state_dir: Path, **overrides: Any) -> NodeConfig:
    """A digits node on loopback port 0; ``trainer.*`` and ``gossip.*`` keys reach the sections."""
    trainer = {
        k.removeprefix("trainer."): v for k, v in overrides.items() if k.startswith("trainer.")
    }
    gossip = {k.removeprefix("gossip."): v for k, v in overrides.items() if k.startswith("gossip.")}
    top = {k: v for k, v in overrides.items() if "." not in k}
    base = NodeConfig(
        listen="127.0.0.1:0",
        state_dir=state_dir,
        device="cpu",
        wait_timeout_s=30.0,
        trainer=TrainerConfig(steps=200, eval_every=100),
        gossip=GossipConfig(idle_round_interval_s=0.05),
    )
    return dataclasses.replace(
        base,
        **top,
        trainer=dataclasses.replace(base.trainer, **trainer),
        gossip=dataclasses.replace(base.gossip, **gossip),
    )


@asynccontextmanager
async def memory_swarm(
    tmp_path: Path,
    n: int,
    settings: dict[str, Any] | None = None,
    network: MemoryNetwork | None = None,
) -> AsyncIterator[list[Node]]:
    """n nodes on one in-memory network, each joining through the first, all started.

    ``settings`` are :func:`config` overrides shared by every node.
    """
    network = network or MemoryNetwork()
    nodes: list[Node] = []
    try:
        for i in range(n):
            cfg = config(
                tmp_path / f"node-{i}",
                listen="mem:0",
                shard_index=i,
                shard_count=n,
                wait_members=n,
                join=(nodes[0].address,) if nodes else (),
                **(settings or {}),
            )
            transport: Transport = MemoryTransport(network)
            node = await Node.create(cfg, transport=transport)
            nodes.append(node)
            await node.start()
        yield nodes
    finally:
        for node in nodes:
            await node.stop(grace_s=0)


def replica_matches_sender(receiver: Node, sender: Node) -> bool:
    """Whether ``receiver`` holds ``sender``'s public copy as it is now, to the bit."""
    replica = receiver.state.replicas.get(sender.node_id)
    return (
        replica is not None
        and replica.session == sender.state.session
        and replica.seq == sender.state.seq
        and torch.equal(replica.value, sender.state.public)
    )
