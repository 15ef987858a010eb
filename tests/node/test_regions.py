"""Regions (``--region``, ``--topology regional``): each node's region travels in its own record,
the topology keeps most edges inside a region and ``--degree`` bridges between each two, and
status, ``murmur status`` and the metrics show them.

Real nodes on the in-memory transport (tests/node/helpers.py).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gossip.clock import ManualClock
from gossip.events import EventQueue, Network
from gossip.topology import block_region, crosses, regional
from node.cli.main import main
from node.cli.swarm import SwarmConfig, node_argv
from node.config import GossipConfig
from node.daemon.node import Node
from node.sim import NetConfig, SimConfig, Simulation
from node.telemetry.metrics import status_metrics
from node.telemetry.status import format_status
from tests.node.helpers import memory_swarm

N = 6
REGIONS = 2
SETTINGS = {"trainer.steps": None, "gossip.topology": "regional", "gossip.degree": 1}


def region(i: int) -> dict[str, Any]:
    return {"gossip.region": block_region(i, N, REGIONS)}


def neighbours_of(node: Node) -> frozenset[str]:
    return node.peers.neighbourhood.neighbours


async def test_a_regional_swarm_keeps_its_edges_inside_regions_and_shows_them(
    tmp_path: Path,
) -> None:
    async with memory_swarm(tmp_path, N, SETTINGS, each=region) as nodes:
        region_of = {n.node_id: block_region(i, N, REGIONS) for i, n in enumerate(nodes)}
        graph = regional(region_of, bridges=1)
        await nodes[0].wait_until(
            lambda: all(
                neighbours_of(n) == graph.neighbours(n.node_id) and n.trainer.step >= 50
                for n in nodes
            ),
            60,
        )
        # Every view knows every member's region from the member's own record.
        for n in nodes:
            assert n.peers.view.regions == region_of
        # One bridge between the two regions, and each region's members linked among
        # themselves: of 6 nodes in two regions of 3, 3 edges inside each and 1 across.
        edges = {frozenset((n.node_id, j)) for n in nodes for j in neighbours_of(n)}
        across = [e for e in edges if crosses(region_of, *e)]
        assert len(across) == 1
        assert len(edges) == 2 * 3 + 1

        for n in nodes:
            status = await n.status()
            assert status.region == region_of[n.node_id]
            assert {s.node_id: s.region for s in status.neighbours} == {
                j: region_of[j] for j in neighbours_of(n)
            }
            text = format_status(status)
            assert f"region {status.region})" in text.splitlines()[0]
            metrics = {m.name: m for m in status_metrics(status)}
            info = metrics["murmur_node_info"].samples[0].labels
            assert info["region"] == status.region
            bridging = sum(region_of[j] != status.region for j in neighbours_of(n))
            assert metrics["murmur_neighbours_across_regions"].samples[0].value == bridging


def test_murmur_swarm_gives_each_node_its_region_in_contiguous_blocks() -> None:
    cfg = SwarmConfig(nodes=6, regions=2, gossip=GossipConfig(topology="regional"))
    argv = [node_argv(cfg, i, Path("s"), None) for i in range(6)]
    assert [a[a.index("--region") + 1] for a in argv] == ["r0"] * 3 + ["r1"] * 3
    assert "--region" not in node_argv(SwarmConfig(nodes=6), 0, Path("s"), None)
    with pytest.raises(ValueError, match="regions is 7"):
        SwarmConfig(nodes=6, regions=7)


def two_regions() -> tuple[ManualClock, EventQueue, Network]:
    """a and b in one region, c in another; uplinks of 1 kB/s, 10 ms, 10x slower across."""
    clock = ManualClock()
    events = EventQueue(clock)
    region = {"a": "r0", "b": "r0", "c": "r1"}
    net = Network(
        events,
        lambda s, d: 0.01,
        bandwidth_bps=1_000.0,
        slowdown=lambda s, d: 10.0 if region[s] != region[d] else 1.0,
    )
    return clock, events, net


def test_a_message_between_regions_takes_the_slowdown_times_longer() -> None:
    clock, events, net = two_regions()
    arrived: dict[str, float] = {}

    def at(dst: str) -> Callable[[], None]:
        return lambda: arrived.update({dst: clock.now()})

    net.send("a", "b", 100, at("b"))
    net.send("a", "c", 100, at("c"))
    events.run_until(10.0)
    assert arrived["b"] == pytest.approx(0.1 + 0.01)
    # Behind the first on a's uplink, then ten times its uplink time.
    assert arrived["c"] == pytest.approx(0.1 + 1.0 + 0.01)


def test_a_slow_path_slows_only_what_goes_down_it() -> None:
    clock, events, net = two_regions()
    arrived: dict[str, list[float]] = {"b": [], "c": []}

    def at(dst: str) -> Callable[[], None]:
        return lambda: arrived[dst].append(clock.now())

    net.send("a", "c", 100, at("c"))  # 0.1 s on a's uplink, 1 s down the slow path
    net.send("a", "b", 100, at("b"))  # behind it on the uplink only
    net.send("a", "c", 100, at("c"))  # behind the first on the slow path
    assert net.backlog_s("a") == pytest.approx(0.3)  # the uplink is free after its own time
    events.run_until(10.0)
    assert arrived["b"] == [pytest.approx(0.2 + 0.01)]
    assert arrived["c"] == [pytest.approx(1.0 + 0.01), pytest.approx(2.0 + 0.01)]
    net.send("a", "c", 100, at("c"))  # at 10 s: the slow path is busy until 11 s
    net.forget("a")
    net.send("a", "c", 100, at("c"))  # a gone and back: its old queues hold nothing up
    events.run_until(20.0)
    assert arrived["c"][-2:] == [pytest.approx(11.01), pytest.approx(11.01)]


def test_a_simulated_regional_swarm_keeps_its_edges_inside_regions_and_trains() -> None:
    cfg = SimConfig(
        nodes=16,
        duration_s=6.0,
        eval_every_s=3.0,
        gossip=GossipConfig(topology="regional", degree=1),
        net=NetConfig(regions=4, cross_region_slowdown=10.0),
    )
    sim = Simulation(cfg)
    summary = sim.run()
    nodes = list(sim.nodes.values())
    region_of = {n.node_id: n.swim.region for n in nodes}
    assert sorted(set(region_of.values())) == ["r0", "r1", "r2", "r3"]
    graph = regional(region_of, bridges=1)
    assert all(set(n.state.replicas) == graph.neighbours(n.node_id) for n in nodes)
    edges = {frozenset((i, j)) for i in region_of for j in graph.neighbours(i)}
    assert sum(crosses(region_of, *e) for e in edges) == 6  # one bridge per pair of regions
    assert summary.final.avg_accuracy >= cfg.target_accuracy
    flat = Simulation(dataclasses.replace(cfg, gossip=GossipConfig(topology="exponential")))
    flat.run()
    flat_edges = {frozenset((n.node_id, j)) for n in flat.nodes.values() for j in n.state.replicas}
    flat_regions = {n.node_id: n.swim.region for n in flat.nodes.values()}
    assert sum(crosses(flat_regions, *e) for e in flat_edges) > 6


def test_simulate_takes_regions_and_their_slowdown(tmp_path: Path) -> None:
    argv = ["simulate", "--nodes", "8", "--duration", "2", "--eval-every", "2", "--quiet"]
    argv += ["--regions", "2", "--cross-region-slowdown", "5", "--topology", "regional"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    config = json.loads((tmp_path / "sim.jsonl").read_text().splitlines()[0])
    assert config["net"]["regions"] == 2
    assert config["net"]["cross_region_slowdown"] == 5.0
    assert config["gossip"]["topology"] == "regional"
    assert main(["simulate", "--regions", "-1", "--out", str(tmp_path), "--quiet"]) == 2
