"""Watching a swarm of ``NodeProcess`` children from a test: each node's Status, a wait until
the statuses of all of them satisfy a condition, and every node's model fetched at once; and a
swarm over mutual TLS started and stopped around a test (:func:`mtls_swarm`).
Shared by tests/e2e/test_churn.py, test_partition.py, test_regions.py and test_schedules.py."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import torch

from node.cli.swarm import NodeProcess, SwarmConfig, node_argv, provision
from node.telemetry.status import NodeStatus
from node.transport.base import Rejected, Unreachable
from node.transport.grpc import GrpcTransport, GrpcTransportConfig
from tests.node.helpers import poll

__all__ = ["mtls_swarm", "pull_models", "status", "wait_for"]

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


@contextlib.asynccontextmanager
async def mtls_swarm(
    cfg: SwarmConfig, workdir: Path, extra: list[str], timeout_s: float
) -> AsyncIterator[tuple[list[NodeProcess], GrpcTransport]]:
    """``cfg.nodes`` ``murmur run`` processes over mutual TLS (certificates from
    ``provision``), started one after another, each joining through the first, with ``extra``
    flags; and a transport with the swarm's credentials to call them. Stopped at the end."""
    procs = [NodeProcess(i, workdir / f"node-{i}") for i in range(cfg.nodes)]
    tls = provision(cfg, workdir, [p.state_dir for p in procs])
    transport = GrpcTransport(GrpcTransportConfig(tls=tls))
    try:
        for p in procs:
            join = procs[0].address if p.index else None
            await p.start(node_argv(cfg, p.index, p.state_dir, join) + extra, timeout_s)
        yield procs, transport
    finally:
        for p in procs:
            await p.stop(10.0)
