"""The sparse codecs in the node: settings, the three commands' flags, training, the fingerprint."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import torch

from gossip.codecs import DEFAULT_FRACTION
from node.cli.commands.run import build_node_config
from node.cli.commands.shared import gossip_config
from node.cli.main import make_parser
from node.cli.swarm import SwarmConfig, node_argv
from node.config import DEFAULT_GAMMA, GossipConfig
from node.daemon.node import JoinError, Node
from node.sim import NetConfig, SimConfig, Simulation
from node.transport.memory import MemoryNetwork, MemoryTransport
from tests.node.helpers import (
    config,
    memory_swarm,
    refusals_past_joining,
    replica_matches_sender,
)

SPARSE = ["topk", "randk", "dct-topk"]
TIMEOUT_S = 60.0


def test_the_fraction_defaults_and_bad_settings_are_refused_clearly() -> None:
    assert GossipConfig(codec="topk").compress_fraction == DEFAULT_FRACTION == 0.01
    with pytest.raises(ValueError, match=r"fraction must be in \(0, 1\], got 0.0"):
        GossipConfig(codec="topk", compress_fraction=0.0)
    with pytest.raises(ValueError, match="block size of at least 504"):
        GossipConfig(codec="randk", compress_fraction=0.001)
    with pytest.raises(ValueError, match="at most 1024"):
        GossipConfig(codec="dct-topk", block_size=2048)
    # A dense codec does not use the fraction; any valid one is accepted with it.
    assert GossipConfig(codec="int8", compress_fraction=0.5).codec == "int8"


def test_every_codec_has_a_default_step_size() -> None:
    for codec in ["fp32", "fp16", "int8", "int4", "sign", *SPARSE]:
        assert 0 < GossipConfig(codec=codec).step_size <= 1
    assert set(DEFAULT_GAMMA) >= set(SPARSE)


def test_the_flags_reach_murmur_run() -> None:
    args = make_parser().parse_args(
        ["run", "--compress", "dct-topk", "--compress-fraction", "0.05", "--block-size", "64"]
    )
    g = build_node_config(args).gossip
    assert (g.codec, g.compress_fraction, g.block_size) == ("dct-topk", 0.05, 64)


def test_murmur_swarm_hands_the_fraction_to_its_nodes(tmp_path: Path) -> None:
    gossip = GossipConfig(codec="randk", compress_fraction=0.03125, block_size=512)
    argv = node_argv(SwarmConfig(gossip=gossip), 1, tmp_path, "127.0.0.1:1")
    assert argv[1:4] == ["-m", "node", "run"]
    assert build_node_config(make_parser().parse_args(argv[3:])).gossip == gossip


def test_murmur_simulate_takes_the_flags() -> None:
    args = make_parser().parse_args(
        ["simulate", "--compress", "topk", "--compress-fraction", "0.1"]
    )
    assert gossip_config(args) == GossipConfig(codec="topk", compress_fraction=0.1)


def _replicas_match(sim: Simulation) -> bool:
    by_id = {n.node_id: n for n in sim.nodes.values()}
    return all(
        replica.seq == by_id[peer].state.seq
        and torch.equal(replica.value, by_id[peer].state.public)
        for receiver in sim.nodes.values()
        for peer, replica in receiver.state.replicas.items()
    )


@pytest.mark.parametrize("codec", SPARSE)
def test_simulated_replicas_end_bit_identical_though_deltas_are_lost(codec: str) -> None:
    cfg = SimConfig(
        nodes=8,
        steps=60,
        gossip=GossipConfig(codec=codec, compress_fraction=0.1, idle_round_interval_s=None),
        net=NetConfig(loss=0.2),
    )
    sim = Simulation(cfg)
    sim.events.run_until(30.0)
    nodes = list(sim.nodes.values())
    assert all(n.step == 60 for n in nodes)
    assert all(len(n.state.replicas) == 5 for n in nodes)
    assert sum(link.stats.failures for n in nodes for link in n.links.values()) > 0
    assert _replicas_match(sim)


def test_a_simulated_swarm_trains_over_top_k() -> None:
    cfg = SimConfig(
        nodes=8,
        duration_s=8.0,  # 300 steps of 0.02 s, then a quiet swarm
        steps=300,
        eval_every_s=4.0,
        task="logistic",
        gossip=GossipConfig(codec="topk", compress_fraction=0.1, idle_round_interval_s=None),
    )
    sim = Simulation(cfg)
    summary = sim.run()
    assert summary.final.avg_accuracy >= cfg.target_accuracy
    assert _replicas_match(sim)


async def test_nodes_train_over_top_k_with_replicas_bit_identical(tmp_path: Path) -> None:
    async with memory_swarm(
        tmp_path,
        3,
        {"trainer.steps": 200, "gossip.codec": "topk", "gossip.idle_round_interval_s": None},
    ) as nodes:
        for n in nodes:
            await n.wait_until(n.training_finished.is_set, TIMEOUT_S)
        for receiver in nodes:
            for sender in nodes:
                if sender.node_id in receiver.peers.links:
                    await receiver.wait_until(
                        partial(replica_matches_sender, receiver, sender), TIMEOUT_S
                    )
        for n in nodes:
            assert n.trainer.last_eval is not None
            assert n.trainer.last_eval.accuracy >= 0.85
            assert n.counters.rounds > 20
            assert refusals_past_joining(n) == {}


async def test_a_node_refuses_a_swarm_with_another_fraction(tmp_path: Path) -> None:
    network = MemoryNetwork()
    settings = {"trainer.steps": 1, "gossip.codec": "topk"}
    async with memory_swarm(tmp_path / "a", 1, settings, network) as [first]:
        cfg = config(
            tmp_path / "b",
            listen="mem:0",
            join=(first.address,),
            **{"gossip.codec": "topk", "gossip.compress_fraction": 0.05},
        )
        other = await Node.create(cfg, transport=MemoryTransport(network))
        with pytest.raises(JoinError, match=r"compression fraction: we have 0\.01, you have 0\.05"):
            await other.start()
        await other.stop()
        assert first.counters.rejected == {"fingerprint": 1}
