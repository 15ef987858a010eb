"""Regions with real node processes: ``--region`` in each node's signed record, ``--topology
regional`` over mutual TLS, and a bridge between the regions killed with SIGKILL.

Six ``murmur run`` processes in two regions of three (``murmur swarm --regions 2`` hands them
out the same way), one bridge between the regions (``--degree 1``). Every node's neighbours
must be the regional graph of the regions its records name, its status must show its own region
and its neighbours', and the swarm must train. When the bridge's end in one region is killed,
the survivors pick another member to bridge the regions, so no region is cut off.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from gossip.topology import block_region, crosses, regional
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
    gossip=GossipConfig(topology="regional", degree=1),
)
EXTRA = ["--swim-period", "0.5"]
TIMEOUT_S = 120.0


def follows(graph_of: dict[str, str], ss: list[NodeStatus]) -> bool:
    """Whether every node's neighbours are its regional graph's, with their regions shown."""
    graph = regional(graph_of, bridges=1)
    return all(
        {n.node_id for n in s.neighbours} == graph.neighbours(s.node_id)
        and all(n.region == graph_of[n.node_id] for n in s.neighbours)
        for s in ss
    )


@pytest.mark.timeout(600)
async def test_real_nodes_keep_to_their_regions_and_rebridge_after_a_kill(
    tmp_path: Path,
) -> None:
    async with mtls_swarm(CFG, tmp_path, EXTRA, TIMEOUT_S) as (procs, transport):
        region_of = {p.node_id: block_region(p.index, CFG.nodes, CFG.regions) for p in procs}
        got = await wait_for(
            transport,
            procs,
            lambda ss: follows(region_of, ss) and all(s.step >= 200 for s in ss),
            "six nodes training on the regional graph",
            TIMEOUT_S,
        )
        for s in got:
            assert s.region == region_of[s.node_id]
            # Each view holds every member's region, from the member's own signed record.
            assert {m.node_id: m.region for m in s.members if m.live} == region_of
        bridge = [
            p
            for p in procs
            if any(crosses(region_of, p.node_id, n.node_id) for n in got[p.index].neighbours)
        ]
        assert len(bridge) == 2  # one edge across: one end in each region
        victim = bridge[-1]
        assert victim.proc is not None
        killed_at = time.monotonic()
        victim.proc.send_signal(signal.SIGKILL)
        survivors = [p for p in procs if p is not victim]
        left = {i: r for i, r in region_of.items() if i != victim.node_id}
        steps = {s.node_id: s.step for s in got}
        bridged = await wait_for(
            transport, survivors, lambda ss: follows(left, ss), "a new bridge", TIMEOUT_S
        )
        print(f"regions bridged again {time.monotonic() - killed_at:.1f} s after the kill -9")
        edges = {frozenset((s.node_id, n.node_id)) for s in bridged for n in s.neighbours}
        assert sum(crosses(left, *e) for e in edges) == 1
        after = await wait_for(
            transport,
            survivors,
            lambda ss: follows(left, ss) and all(s.step >= steps[s.node_id] + 200 for s in ss),
            "the survivors to train on, bridged",
            TIMEOUT_S,
        )
        assert all(s.eval_accuracy >= 0.8 for s in after), [s.eval_accuracy for s in after]
