"""Pauses in the simulator, as the daemon pauses (tests/node/test_pause.py): out of every
topology, a member still, no steps and no gossip while paused, a pull after a long pause."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from node.cli.main import main
from node.config import GossipConfig
from node.daemon.pause import PULL_AFTER_PAUSE_S
from node.sim import SimConfig, Simulation
from node.sim.run import JSONL_FILE

BASE = SimConfig(
    nodes=8,
    duration_s=20.0,
    eval_every_s=4.0,
    gossip=GossipConfig(topology="exponential", codec="int8"),
)


def test_a_paused_node_is_out_of_every_topology_idle_and_comes_back_after_a_pull() -> None:
    sim = Simulation(BASE)
    sim.events.run_until(3.0)
    node = next(iter(sim.nodes.values()))
    others = [n for n in sim.nodes.values() if n is not node]
    assert any(node.node_id in n.neighbours for n in others)
    node.pause()
    sim.events.run_until(5.0)
    step, sent, rounds = node.step, node.counters.bytes_sent, node.counters.rounds
    assert node.neighbours == frozenset()
    for n in others:
        assert node.node_id not in n.neighbours
        record = n.swim.record(node.node_id)
        assert record is not None
        assert record.live
        assert record.paused
    sim.events.run_until(5.0 + PULL_AFTER_PAUSE_S)
    assert (node.step, node.counters.bytes_sent, node.counters.rounds) == (step, sent, rounds)
    assert sim.sample().paused == 1
    pulled = sim.pull_bytes
    node.resume()  # paused for longer than PULL_AFTER_PAUSE_S: a pull first
    sim.events.run_until(5.0 + PULL_AFTER_PAUSE_S + 3.0)
    assert sim.pull_bytes > pulled
    assert not node.paused
    assert any(node.node_id in n.neighbours for n in others)
    assert node.step > step
    sample = sim.sample()
    assert sample.paused == 0
    assert sample.worst_accuracy >= BASE.target_accuracy - 0.05


def test_a_short_pause_comes_back_without_a_pull() -> None:
    sim = Simulation(BASE)
    sim.events.run_until(3.0)
    node = next(iter(sim.nodes.values()))
    node.pause()
    sim.events.run_until(4.0)
    pulled = sim.pull_bytes
    node.resume()
    sim.events.run_until(6.0)
    assert sim.pull_bytes == pulled
    assert not node.paused
    assert node.neighbours


def test_a_share_of_the_swarm_paused_at_any_time_still_trains_to_the_target() -> None:
    cfg = dataclasses.replace(BASE, nodes=12, duration_s=30.0, paused_fraction=0.3, pause_mean_s=6)
    sim = Simulation(cfg)
    summary = sim.run()
    shares = [s.paused / 12 for s in sim.samples]
    assert 0.1 < sum(shares) / len(shares) < 0.5, shares
    assert summary.target_avg_s is not None
    # The non-iid shards level off near 0.81, at the target's own height: with a third of them
    # paused the mean model stays on that plateau (0.80-0.81 by seed here, 0.7995 on one CI
    # machine's floats), so once reached it is held to the target less the plateau's wobble.
    assert min(s.avg_accuracy for s in sim.samples[1:]) >= cfg.target_accuracy - 0.02
    assert sim.pull_bytes > 0  # pauses longer than PULL_AFTER_PAUSE_S ended with a pull


def test_simulate_takes_pauses_and_refuses_a_bad_share(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", "--nodes", "8", "--duration", "4", "--eval-every", "2", "--quiet"]
    code = main([*argv, "--paused-fraction", "0.25", "--pause-mean", "3", "--out", str(tmp_path)])
    assert code == 0
    records = [json.loads(line) for line in (tmp_path / JSONL_FILE).read_text().splitlines()]
    assert records[0]["paused_fraction"] == 0.25
    assert "paused" in records[1]
    assert main([*argv, "--paused-fraction", "1", "--out", str(tmp_path)]) == 2
    assert "paused_fraction" in capsys.readouterr().err
