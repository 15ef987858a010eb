"""Watching a swarm of ``NodeProcess`` children from a test: each node's Status, a wait until
the statuses of all of them satisfy a condition, and every node's model fetched at once.
Shared by tests/e2e/test_churn.py and tests/e2e/test_partition.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import torch

from node.cli.swarm import NodeProcess
from node.telemetry.status import NodeStatus
from node.transport.base import Rejected, Unreachable
from node.transport.grpc import GrpcTransport
from tests.node.helpers import poll

__all__ = ["pull_models", "status", "wait_for"]

STATUS_S = 5.0  # one Status call


async def status(transport: GrpcTransport, p: NodeProcess) -> NodeStatus | None:
    """Node ``p``'s Status, or None when it does not answer (down, starting, cut off)."""
    try:
        return await transport.call_status(p.address, STATUS_S)
    except (Unreachable, Rejected):
        return None


async def wait_for(
    transport: GrpcTransport,
    procs: list[NodeProcess],
    ok: Callable[[list[NodeStatus]], bool],
    what: str,
    timeout_s: float,
) -> list[NodeStatus]:
    """Poll the nodes' Status until all answer and ``ok(statuses)`` holds; a node that exits
    fails at once, with its log."""

    async def check() -> list[NodeStatus] | None:
        for p in procs:
            assert not p.exited, f"node {p.index} exited:\n{p.log_tail()}"
        got = await asyncio.gather(*(status(transport, p) for p in procs))
        statuses = [s for s in got if s is not None]
        return statuses if len(statuses) == len(procs) and ok(statuses) else None

    return await poll(check, what, timeout_s)


async def pull_models(
    transport: GrpcTransport, procs: list[NodeProcess], requester: str
) -> dict[str, torch.Tensor]:
    """Every node's current parameters by node id, fetched at (nearly) the same moment."""

    async def one(p: NodeProcess) -> torch.Tensor:
        chunks = transport.call_pull_model(p.address, requester, 30.0)
        parts = [torch.frombuffer(bytearray(c.data), dtype=torch.float32) async for c in chunks]
        return torch.cat(parts)

    models = await asyncio.gather(*(one(p) for p in procs))
    return {p.node_id: m for p, m in zip(procs, models, strict=True)}
