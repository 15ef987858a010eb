"""The simulator: small swarms on simulated time, checked for what the daemon guarantees."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from gossip.codecs import Encoded
from gossip.messages import Delta
from gossip.refusals import Reason
from gossip.swim import Status
from node.cli.main import main
from node.config import GossipConfig
from node.sim import NetConfig, SimConfig, Simulation
from node.sim.node import SimNode
from node.sim.run import JSONL_FILE, PLOT_FILE
from node.transport.base import Rejected

BASE = SimConfig(
    nodes=8,
    duration_s=4.0,
    eval_every_s=2.0,
    gossip=GossipConfig(topology="exponential", codec="int8"),
)


def replicas_match(nodes: list[SimNode]) -> bool:
    by_id = {n.node_id: n for n in nodes}
    for receiver in nodes:
        for peer_id, replica in receiver.state.replicas.items():
            sender = by_id[peer_id]
            if replica.session != sender.state.session or replica.seq != sender.state.seq:
                return False
            if not torch.equal(replica.value, sender.state.public):
                return False
    return True


def test_a_small_swarm_trains_to_the_target_and_agrees() -> None:
    sim = Simulation(BASE)
    summary = sim.run()
    final = summary.final
    assert final.live == 8
    assert final.avg_accuracy >= BASE.target_accuracy
    assert final.worst_accuracy >= BASE.target_accuracy - 0.05
    assert final.relative_distance <= BASE.consensus_threshold
    # Offsets 1, 2 and 4 on a ring of 8: 5 neighbours, each sent an int8 delta of 512 payload
    # bytes (two blocks of 256) per round.
    assert all(n.degree == 5 for n in sim.nodes.values())
    assert 5 * 512 < summary.bytes_per_node_per_round < 5 * 4 * 330
    # Each link opened with one snapshot, which went by the common starting model's name.
    assert final.snapshots_per_node == 5
    assert 0 < final.snapshot_bytes_per_node < 5 * 4 * 330


def test_rounds_are_paced_by_the_links_round_trips() -> None:
    fast = Simulation(dataclasses.replace(BASE, net=NetConfig(latency_s=(0.001, 0.001))))
    slow = Simulation(dataclasses.replace(BASE, net=NetConfig(latency_s=(0.5, 0.5))))
    fast.events.run_until(4.01)
    slow.events.run_until(4.01)
    f, s = fast.sample(), slow.sample()
    # Training starts once every edge is up both ways, a snapshot's round trip after the start
    # (as the daemon waits): 2 ms on the fast network, 1 s (50 steps) on the slow one.
    assert f.steps_per_node == 200
    assert s.steps_per_node == 150
    assert f.rounds_per_node >= 0.95 * f.steps_per_node  # a round every step
    # A link is busy with queue - window (14) of these small deltas unacknowledged: at most 14
    # rounds per 1 s round trip once it streams, besides a round per step during the first
    # snapshot's round trip.
    assert s.rounds_per_node <= 14 * 4.0 / 1.0 + 1.0 / 0.02 + 2


@pytest.mark.parametrize("loss", [0.0, 0.2])
def test_replicas_end_bit_identical_to_their_senders_even_when_deltas_are_lost(
    loss: float,
) -> None:
    cfg = dataclasses.replace(
        BASE,
        steps=60,
        gossip=dataclasses.replace(BASE.gossip, idle_round_interval_s=None),
        net=NetConfig(loss=loss),
    )
    sim = Simulation(cfg)
    sim.events.run_until(30.0)
    nodes = list(sim.nodes.values())
    assert all(n.step == 60 for n in nodes)
    assert all(len(n.state.replicas) == 5 for n in nodes)
    assert replicas_match(nodes)
    failures = sum(link.stats.failures for n in nodes for link in n.links.values())
    assert (failures > 0) == (loss > 0)  # losses broke streams, and snapshots repaired them


def test_a_crashed_node_leaves_every_view_and_its_neighbours_gossip_again() -> None:
    cfg = dataclasses.replace(BASE, nodes=16, duration_s=60.0)
    sim = Simulation(cfg)
    sim.events.run_until(3.0)
    victim = next(iter(sim.nodes.values()))
    sim.crash(victim)
    neighbours = [sim.nodes[m.address] for m in victim.view.neighbours("exponential").values()]
    deadline = 3.0 + cfg.membership.detection_deadline_s(16)
    sim.events.run_until(deadline)
    rounds = {n.node_id: n.counters.rounds for n in neighbours}
    for n in sim.nodes.values():
        assert n.swim.record(victim.node_id).status is Status.DEAD  # type: ignore[union-attr]
        assert victim.node_id not in n.links
    sim.events.run_until(deadline + 2.0)
    assert all(n.counters.rounds > rounds[n.node_id] + 10 for n in neighbours)


def test_a_joiner_pulls_the_model_links_and_is_known_to_everyone() -> None:
    cfg = dataclasses.replace(BASE, duration_s=30.0)
    sim = Simulation(cfg)
    sim.events.run_until(4.0)
    helper = next(iter(sim.nodes.values()))
    joiner = sim.join(helper)
    sim.events.run_until(4.5)
    assert joiner.pulled_from is not None
    assert joiner.training
    sim.events.run_until(12.0)
    everyone = list(sim.nodes.values())
    assert len(everyone) == 9
    for n in everyone:
        assert joiner.node_id in {m.node_id for m in n.view.members}
    assert set(joiner.links) == set(joiner.neighbours)
    assert all(link.healthy for link in joiner.links.values())
    sample = sim.sample()
    assert sample.worst_accuracy >= cfg.target_accuracy - 0.05


def test_a_joiner_trains_only_once_every_edge_is_up_both_ways() -> None:
    """As the daemon: a node links after its pull and starts training only when each of its
    neighbours took its public copy and it holds each neighbour's."""
    sim = Simulation(dataclasses.replace(BASE, duration_s=30.0))
    sim.events.run_until(2.0)
    joiner = sim.join(next(iter(sim.nodes.values())))
    at_start: list[tuple[float, bool, bool, int]] = []

    def watch() -> None:
        if joiner.training and not at_start:
            links = joiner.links.values()
            at_start.append(
                (
                    sim.clock.now(),
                    bool(links) and all(link.healthy for link in links),
                    set(joiner.state.replicas) == set(joiner.links),
                    joiner.step,
                )
            )

    sim.events.run_until(6.0, after_event=watch)
    [(started, links_up, replicas_held, steps)] = at_start
    assert 2.0 < started < 6.0
    assert links_up
    assert replicas_held
    assert steps == 0
    assert joiner.pulled_from is not None


def test_stragglers_step_slower_and_nobody_waits_for_them() -> None:
    cfg = dataclasses.replace(BASE, stragglers=0.5, straggler_slowdown=5.0, duration_s=4.0)
    sim = Simulation(cfg)
    sim.events.run_until(4.0)
    steps = sorted(n.step for n in sim.nodes.values())
    assert steps[0] <= 45  # 4 s at 0.1 s a step
    assert steps[-1] >= 195  # 4 s at 0.02 s a step


def test_simulate_writes_samples_a_summary_and_a_plot(tmp_path: Path) -> None:
    code = main(
        [
            "simulate",
            "--nodes",
            "6",
            "--duration",
            "3",
            "--eval-every",
            "1",
            "--topology",
            "ring",
            "--churn",
            "0.5",
            "--out",
            str(tmp_path),
            "--quiet",
        ]
    )
    assert code == 0
    records = [json.loads(line) for line in (tmp_path / JSONL_FILE).read_text().splitlines()]
    assert [r["record"] for r in records] == ["config"] + ["sample"] * 4 + ["summary"]
    assert [r["t"] for r in records[1:-1]] == [0.0, 1.0, 2.0, 3.0]
    assert records[0]["gossip"]["topology"] == "ring"
    assert records[-1]["nodes"] == 6
    assert (tmp_path / PLOT_FILE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_simulate_takes_robust_mixing_the_outer_step_and_attackers(tmp_path: Path) -> None:
    argv = ["simulate", "--nodes", "8", "--duration", "2", "--eval-every", "2", "--quiet"]
    argv += ["--robust", "--byzantine-fraction", "0.2", "--outer-lr", "0.7"]
    argv += ["--attackers", "0.125", "--attack", "flip", "--out", str(tmp_path)]
    assert main(argv) == 0
    records = [json.loads(line) for line in (tmp_path / JSONL_FILE).read_text().splitlines()]
    config, final = records[0], records[-2]
    assert config["attackers"] == 0.125
    assert config["gossip"]["robust"] is True
    assert config["gossip"]["outer_lr"] == 0.7
    assert config["gossip"]["attack"] == "flip"
    assert final["live"] == 7  # the attacker is not sampled


@pytest.mark.parametrize("given", [["--attack", "flip"], ["--attackers", "0.1"]])
def test_simulate_refuses_an_attack_without_attackers_and_the_reverse(
    given: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "--nodes", "4", *given, "--out", str(tmp_path), "--quiet"]) == 2
    assert "give both or neither" in capsys.readouterr().err


def test_a_simulated_node_refuses_bad_input_as_the_daemon_does() -> None:
    """Its inbound path is the daemon's (node/daemon/inbound.py): a delta that does not decode is
    refused with the daemon's reason, counted, changes nothing, and a sender that keeps at it is
    banned, as node/security/penalties.py bans it in the daemon."""
    sim = Simulation(dataclasses.replace(BASE, duration_s=2.0))
    sim.events.run_until(1.0)
    a, b = list(sim.nodes.values())[:2]
    assert b.node_id in a.links
    replica = a.state.replicas[b.node_id]
    before = (replica.seq, replica.value.clone())
    good = Delta(b.node_id, b.state.session, replica.seq + 1, 0, replica_payload(b), 5)
    codes = b"\x80" * len(good.payload.data)  # -128: outside int8's levels
    bad = dataclasses.replace(good, payload=dataclasses.replace(good.payload, data=codes))
    reasons = []
    for k in range(10):
        try:
            a.rpc_push_delta(bad, (b.node_id, -k), 600)  # a fresh stream each time
        except Rejected as err:
            reasons.append(err.reason)
    assert reasons[:8] == [Reason.BAD_PAYLOAD] * 8
    assert reasons[8:] == [Reason.BANNED] * 2  # the penalties' threshold is 8
    assert a.counters.rejected[Reason.BAD_PAYLOAD] == 8
    assert replica.seq == before[0]
    assert torch.equal(replica.value, before[1])


def replica_payload(node: SimNode) -> Encoded:
    """A well-formed payload of ``node``'s codec (zeros)."""
    return node.state.codec.encode(torch.zeros(node.state.numel))
