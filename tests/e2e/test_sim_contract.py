"""One scenario, two carriers: the simulator against real nodes over real gRPC on localhost.

Four nodes, the exponential graph (complete at four), int8, the logistic task on non-iid
shards, the same seeds, 300 local steps of 20 ms each and then idle rounds. The simulator's
network is set to loopback's delays. What must agree, and why each could fail:

* bytes per delta: the simulator counts what its links send with the daemon's wire sizes; a
  simulator that counted another size, codec or block size would be off by hundreds of bytes.
* every round reaches every neighbour: deltas (or the snapshot covering them) per link per
  round of the sender, in both; a link model that dropped or duplicated rounds would not.
* rounds per local step: both pace rounds by the same rule (RoundPacer: a round per step
  while the links are idle). The daemon's gossip worker shares two busy cores with three other
  nodes and may fall behind, skipping rounds: so the daemon's share is allowed to be lower, down
  to half, and the simulator's (which never lacks CPU) must be near one.
* the averaged model reaches the target accuracy, and the consensus distance falls below the
  threshold, in both; a simulator that mixed differently (wrong weights, no mixing of stale
  replicas) would leave its nodes apart.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from gossip.messages import SnapshotHeader
from gossip.simulate import consensus_distance
from node import wire
from node.config import GossipConfig
from node.node import Node
from node.sim import NetConfig, SimConfig, Simulation
from node.tasks.base import Shard, evaluate
from node.tasks.logistic import make_task
from tests.node.helpers import config

pytestmark = pytest.mark.e2e

N, STEPS, STEP_S = 4, 300, 0.02
SETTLE_ROUNDS = 20
TARGET, THRESHOLD = 0.8, 1e-2
GOSSIP = GossipConfig(topology="exponential", codec="int8", idle_round_interval_s=0.05)


def averaged_accuracy(models: list[torch.Tensor]) -> float:
    probe = make_task(Shard(0, N, 0.5, 0))
    flat = torch.cat([p.detach().view(-1) for p in probe.model.parameters()])
    assert flat.numel() == models[0].numel()
    mean = torch.stack(models).mean(dim=0)
    offset = 0
    with torch.no_grad():
        for p in probe.model.parameters():
            p.copy_(mean[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
    return evaluate(probe.model, probe.eval, probe.loss, torch.device("cpu"))[1]


def relative_distance(models: list[torch.Tensor]) -> float:
    mean = torch.stack(models).mean(dim=0)
    cd = consensus_distance({str(i): m for i, m in enumerate(models)})
    return cd / float(mean.double().pow(2).sum())


def delta_bytes(bytes_sent: int, deltas: int, snapshots: int, header: SnapshotHeader) -> float:
    """Mean bytes per delta of one link, its snapshots' bytes taken away."""
    return (bytes_sent - snapshots * wire.snapshot_nbytes(header)) / deltas


async def run_real(tmp_path: Path) -> dict[str, object]:
    nodes: list[Node] = []
    try:
        for i in range(N):
            cfg = config(
                tmp_path / f"node-{i}",
                task="logistic",
                alpha=0.5,
                seed=0,
                shard_index=i,
                shard_count=N,
                wait_members=N,
                join=(nodes[0].address,) if nodes else (),
                **{
                    "trainer.steps": STEPS,
                    "trainer.step_time": STEP_S,
                    "trainer.eval_every": STEPS,
                    "gossip.topology": GOSSIP.topology,
                    "gossip.codec": GOSSIP.codec,
                    "gossip.idle_round_interval_s": GOSSIP.idle_round_interval_s,
                },
            )
            node = await Node.create(cfg)  # over gRPC: the helper's config is plain TCP
            nodes.append(node)
            await node.start()

        async def rounds_when_trained(node: Node) -> int:
            await node.training_finished.wait()
            return node.counters.rounds

        async with asyncio.timeout(120):
            trained_rounds = await asyncio.gather(*map(rounds_when_trained, nodes))
        for node, before in zip(nodes, trained_rounds, strict=True):

            def settled(n: Node = node, r: int = before + SETTLE_ROUNDS) -> bool:
                return n.counters.rounds >= r

            await node.wait_until(settled, 60)
        models = [await n.gossiper.model_copy() for n in nodes]
        links = [(n, link) for n in nodes for link in n.peers.links.values()]
        header = SnapshotHeader(nodes[0].node_id, nodes[0].state.session, 1, models[0].numel(), 3)
        return {
            "models": models,
            "rounds_per_step": [r / STEPS for r in trained_rounds],
            "delta_bytes": [
                delta_bytes(
                    link.stats.bytes_sent,
                    link.stats.deltas_sent,
                    link.stats.snapshots_sent,
                    header,
                )
                for _, link in links
            ],
            "per_round": [
                (link.stats.deltas_sent + link.stats.snapshots_sent) / n.counters.rounds
                for n, link in links
            ],
            "degrees": [len(n.peers.links) for n in nodes],
        }
    finally:
        for node in nodes:
            await node.stop(grace_s=0)


def run_sim() -> dict[str, object]:
    cfg = SimConfig(
        nodes=N,
        task="logistic",
        alpha=0.5,
        seed=0,
        step_time_s=STEP_S,
        steps=STEPS,
        duration_s=STEPS * STEP_S + (SETTLE_ROUNDS + 10) * GOSSIP.idle_round_interval_s,
        eval_every_s=STEPS * STEP_S,
        gossip=GOSSIP,
        net=NetConfig(latency_s=(0.0002, 0.001), bandwidth_bps=1e9),
    )
    sim = Simulation(cfg)
    sim.events.run_until(STEPS * STEP_S + STEP_S / 2)
    trained = sim.sample()
    sim.events.run_until(cfg.duration_s)
    nodes = list(sim.nodes.values())
    models = [n.flat.flat.clone() for n in nodes]
    header = SnapshotHeader(nodes[0].node_id, nodes[0].state.session, 1, models[0].numel(), 3)
    links = [(n, link) for n in nodes for link in n.links.values()]
    return {
        "models": models,
        "rounds_per_step": [trained.rounds_per_node / STEPS],
        "delta_bytes": [
            delta_bytes(
                link.stats.bytes_sent, link.stats.deltas_sent, link.stats.snapshots_sent, header
            )
            for _, link in links
        ],
        "per_round": [
            (link.stats.deltas_sent + link.stats.snapshots_sent) / n.counters.rounds
            for n, link in links
        ],
        "degrees": [len(n.links) for n in nodes],
    }


@pytest.mark.timeout(300)
async def test_the_simulator_and_real_nodes_over_grpc_agree(tmp_path: Path) -> None:
    real = await run_real(tmp_path)
    sim = await asyncio.to_thread(run_sim)
    for run in (real, sim):
        assert run["degrees"] == [N - 1] * N
        models = run["models"]
        assert isinstance(models, list)
        assert averaged_accuracy(models) >= TARGET
        assert relative_distance(models) <= THRESHOLD
        for share in run["per_round"]:  # type: ignore[attr-defined]
            assert 0.9 <= share <= 1.01
    # Sizes differ only by the varints of step and sequence numbers: a byte or two.
    real_bytes = real["delta_bytes"]
    sim_bytes = sim["delta_bytes"]
    assert isinstance(real_bytes, list)
    assert isinstance(sim_bytes, list)
    assert max(real_bytes) - min(sim_bytes) <= 4
    assert max(sim_bytes) - min(real_bytes) <= 4
    # 330 values in two int8 blocks of 256 (512 bytes) with their scales and a header: more than
    # the payload, less than an fp32 delta's 1,320 bytes of values alone.
    assert min(sim_bytes) > 512
    assert max(sim_bytes) < 4 * 330
    sim_shares = sim["rounds_per_step"]
    assert isinstance(sim_shares, list)
    assert 0.95 <= sim_shares[0] <= 1.0
    for share in real["rounds_per_step"]:  # type: ignore[attr-defined]
        # At most one idle round can slip in as training ends.
        assert 0.5 <= share <= 1.0 + 1 / STEPS
