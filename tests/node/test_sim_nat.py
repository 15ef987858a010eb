"""Nodes behind NAT in the simulator (node/sim/nat.py): the daemon's rules on simulated time.
No edge joins two nodes nobody can dial, membership for them goes through their relays, and
when a relay crashes the nodes behind it name another."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from node.cli.main import main
from node.config import GossipConfig
from node.sim import NetConfig, SimConfig, Simulation
from node.sim.run import JSONL_FILE

CFG = SimConfig(
    nodes=24,
    steps=0,  # gossip alone, a round every 0.1 s: consensus from models of their own
    duration_s=4.0,
    eval_every_s=1.0,
    independent_init=True,
    gossip=GossipConfig(topology="exponential", degree=4, codec="int8"),
    net=NetConfig(behind_nat=0.5),
)


def dialable_edges_only(sim: Simulation) -> bool:
    for node in sim.nodes.values():
        if not node.behind_nat:
            continue
        for j in node.neighbourhood.neighbours:
            member = node.view.get(j)
            if member is not None and sim.nodes[member.address].behind_nat:
                return False
    return True


def test_nodes_behind_nat_get_dialable_neighbours_and_are_reached_through_relays() -> None:
    sim = Simulation(CFG)
    sim.run()
    last = sim.samples[-1]
    behind = [n for n in sim.nodes.values() if n.behind_nat]
    assert len(behind) == 12 == last.behind_nat
    assert dialable_edges_only(sim)
    for node in behind:
        relays = node.swim.relays
        assert relays, node.address
        assert all(not sim.nodes[r].behind_nat for r in relays)
        assert set(relays) <= node.sessions()
        # Everyone else's view names the same relays (the record is the node's own claim).
        for other in sim.nodes.values():
            record = other.swim.record(node.node_id)
            assert record is not None
            assert record.relays == relays
    assert last.relayed_bytes_per_node > 0
    # Members try a node's relays each in an order of its own: no one relay carries it all.
    assert 0.5 <= last.busiest_relay_share < 0.95
    assert last.partial_views == 0
    assert last.relative_distance < CFG.consensus_threshold


def test_all_reachable_relays_nothing() -> None:
    sim = Simulation(dataclasses.replace(CFG, net=NetConfig()))
    sim.run()
    last = sim.samples[-1]
    assert last.behind_nat == 0
    assert last.relayed_bytes_per_node == 0
    assert last.busiest_relay_share == 0
    assert all(not n.swim.relays for n in sim.nodes.values())


def test_when_relays_crash_the_nodes_behind_them_name_others() -> None:
    sim = Simulation(dataclasses.replace(CFG, duration_s=2.0))
    sim.run()
    behind = [n for n in sim.nodes.values() if n.behind_nat]
    crashed = sorted({r for n in behind for r in n.swim.relays})[:3]
    named = [n for n in behind if set(n.swim.relays) & set(crashed)]
    assert named
    for address in crashed:
        sim.crash(sim.nodes[address])
    sim.events.run_until(sim.clock.now() + 30.0)
    for node in behind:
        assert node.swim.relays
        assert not set(node.swim.relays) & set(crashed), node.address
        for other in sim.nodes.values():
            record = other.swim.record(node.node_id)
            assert record is not None
            assert record.relays == node.swim.relays
    assert dialable_edges_only(sim)


def test_a_share_of_one_is_refused() -> None:
    with pytest.raises(ValueError, match="behind_nat"):
        NetConfig(behind_nat=1.0)


def test_simulate_takes_behind_nat(tmp_path: Path) -> None:
    argv = ["simulate", "--nodes", "8", "--duration", "2", "--behind-nat", "0.5"]
    assert main([*argv, "--out", str(tmp_path), "--quiet"]) == 0
    records = [json.loads(line) for line in (tmp_path / JSONL_FILE).read_text().splitlines()]
    samples = [r for r in records if r["record"] == "sample"]
    assert samples[-1]["behind_nat"] == 4
    assert samples[-1]["relayed_bytes_per_node"] > 0
