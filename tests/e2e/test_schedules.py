"""A time-varying schedule and bridges of their own with real node processes: six ``murmur run``
processes over mutual TLS in two regions, ``--topology one-peer-exponential --pace link
--bridge-compress sign --bridge-period 4``, and one killed with SIGKILL.

Every node's links must be the exponential graph's, each round going to few of them (rounds
against deltas sent), its links across regions sending sign and those inside int8, and the
swarm must train. After the kill -9 the survivors' links follow the new view, the schedule's
classes with them, and they train on.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from gossip.topology import block_region, crosses, exponential
from node.cli.swarm import SwarmConfig
from node.config import GossipConfig
from node.telemetry.status import NodeStatus
from tests.e2e.watch import mtls_swarm, wait_for

pytestmark = pytest.mark.e2e

CFG = SwarmConfig(
    nodes=6,
    steps=1_000_000,
    alpha=None,
    eval_every=100,
    regions=2,
    gossip=GossipConfig(
        topology="one-peer-exponential", pace="link", bridge_codec="sign", bridge_period=4
    ),
)
EXTRA = ["--swim-period", "0.5"]
TIMEOUT_S = 120.0


def on_graph(ids: set[str], ss: list[NodeStatus]) -> bool:
    """Whether every node links to exactly its neighbours in the exponential graph of ``ids``."""
    graph = exponential(ids)
    return all({n.node_id for n in s.neighbours} == graph.neighbours(s.node_id) for s in ss)


@pytest.mark.timeout(600)
async def test_real_nodes_follow_the_schedule_and_bridge_codec_through_a_kill(
    tmp_path: Path,
) -> None:
    async with mtls_swarm(CFG, tmp_path, EXTRA, TIMEOUT_S) as (procs, transport):
        region_of = {p.node_id: block_region(p.index, CFG.nodes, CFG.regions) for p in procs}
        got = await wait_for(
            transport,
            procs,
            lambda ss: on_graph(set(region_of), ss) and all(s.step >= 200 for s in ss),
            "six nodes training on the exponential graph's links",
            TIMEOUT_S,
        )
        for s in got:
            assert s.codec == "int8"  # the node's own; the bridges show theirs per neighbour
            for n in s.neighbours:
                across = crosses(region_of, s.node_id, n.node_id)
                assert n.codec == ("sign" if across else "int8"), (across, n.codec)
            # Four links each (±1, ±2 on a ring of six), and a round goes to two at most
            # (a heartbeat to all four, the rare round when nothing else was worth sending).
            sent = sum(n.deltas_sent for n in s.neighbours)
            assert len(s.neighbours) == 4
            assert 0 < sent < 3 * s.rounds, (sent, s.rounds)
        victim = procs[-1]
        assert victim.proc is not None
        victim.proc.send_signal(signal.SIGKILL)
        survivors = [p for p in procs if p is not victim]
        left = {p.node_id for p in survivors}
        steps = {s.node_id: s.step for s in got}
        after = await wait_for(
            transport,
            survivors,
            lambda ss: on_graph(left, ss) and all(s.step >= steps[s.node_id] + 200 for s in ss),
            "the survivors to train on over the new graph",
            TIMEOUT_S,
        )
        assert all(s.eval_accuracy >= 0.8 for s in after), [s.eval_accuracy for s in after]
