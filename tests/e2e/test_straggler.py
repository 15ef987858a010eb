"""A straggler five times slower than the rest: nobody waits for it, and everyone gets there.

Judged by step counts, not wall time: when the fast nodes have spent their budgets, the
straggler has done a fraction of its own (a barrier would have held them to its pace), and once
it finishes too, every node meets the acceptance run's accuracy.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from node.cli.evaluation import evaluate_run
from node.cli.swarm import NodeProcess, SwarmConfig, node_argv, provision
from node.config import GossipConfig
from node.telemetry.status import NodeStatus
from node.transport.base import Rejected, Unreachable
from node.transport.grpc import GrpcTransport, GrpcTransportConfig

pytestmark = pytest.mark.e2e

NODES, STEPS, SLOWDOWN = 4, 600, 5.0
CFG = SwarmConfig(
    nodes=NODES,
    steps=STEPS,
    alpha=0.5,
    eval_every=100,
    gossip=GossipConfig(codec="int8"),
    slowdowns={NODES - 1: SLOWDOWN},  # the last node is the straggler
)
TIMEOUT_S = 600.0


async def statuses(transport: GrpcTransport, procs: list[NodeProcess]) -> list[NodeStatus]:
    async def one(p: NodeProcess) -> NodeStatus:
        try:
            return await transport.call_status(p.address, 5.0)
        except (Unreachable, Rejected) as err:
            raise AssertionError(f"node {p.index} did not answer: {err}\n{p.log_tail()}") from err

    return list(await asyncio.gather(*(one(p) for p in procs)))


@pytest.mark.timeout(900)
async def test_the_fast_nodes_do_not_wait_for_a_straggler(tmp_path: Path) -> None:
    procs = [NodeProcess(i, tmp_path / f"node-{i}") for i in range(NODES)]
    *fast, straggler = procs
    tls = provision(CFG, tmp_path, [p.state_dir for p in procs])
    transport = GrpcTransport(GrpcTransportConfig(tls=tls))
    try:
        for p in procs:
            argv = node_argv(CFG, p.index, p.state_dir, procs[0].address if p.index else None)
            await p.start(argv, 120)
        async with asyncio.timeout(TIMEOUT_S):  # each node says when its budget is spent
            await asyncio.gather(*(p.trained.wait() for p in fast))
            [lagging] = await statuses(transport, [straggler])
            await straggler.trained.wait()
        # The fast nodes spent their budgets while the straggler, which steps at a fifth of
        # their pace, had done well under half of its own: nobody waited for it.
        assert lagging.step < 0.4 * STEPS, lagging.step
        assert not lagging.training_done
    finally:
        codes = await asyncio.gather(*(p.stop(60) for p in procs))
        await transport.close(0)
    assert codes == [0] * NODES
    report = await asyncio.to_thread(
        evaluate_run, [p.state_dir for p in procs], CFG.task, CFG.seed, "cpu"
    )
    for n in report.nodes:
        assert n.steps == STEPS
        assert n.accuracy >= 0.93, n
