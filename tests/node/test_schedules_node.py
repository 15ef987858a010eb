"""Time-varying schedules in the node (``--topology one-peer-exponential``, ``--topology
epidemic --fanout S``, with ``--pace link``): the flags reach ``murmur run``, ``murmur swarm``
and ``murmur simulate``; a schedule without a copy per link is refused with the fix; daemons
over the in-memory transport and simulated nodes gossip over the exponential graph's links with
each round going to a few of them, train, and keep every link's replica exact.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gossip.topology import exponential
from node.cli.commands.run import build_node_config
from node.cli.commands.shared import gossip_config
from node.cli.main import main, make_parser
from node.cli.swarm import SwarmConfig, node_argv
from node.config import GossipConfig
from node.daemon.node import Node
from node.settings_sources import SettingsError, load_settings
from node.sim import SimConfig, Simulation
from tests.node.helpers import memory_swarm, refusals_past_joining
from tests.node.test_auto_codec_node import links_settled

TIMEOUT_S = 60.0
#: The most links one round goes to, by schedule (one-peer: both sides of the ring).
PER_ROUND = {"one-peer-exponential": 2, "epidemic": 2}


def test_the_flags_reach_each_command() -> None:
    argv = ["--topology", "epidemic", "--fanout", "3", "--pace", "link"]
    want = GossipConfig(topology="epidemic", fanout=3, pace="link")
    assert build_node_config(make_parser().parse_args(["run", *argv])).gossip == want
    assert gossip_config(make_parser().parse_args(["simulate", *argv])) == want
    swarm_argv = node_argv(SwarmConfig(gossip=want), 1, Path("/tmp/n1"), "127.0.0.1:1")
    assert build_node_config(make_parser().parse_args(swarm_argv[3:])).gossip == want
    assert want.schedule_config is not None
    assert want.schedule_config.fanout == 3
    assert GossipConfig().schedule_config is None


@pytest.mark.parametrize("kind", ["one-peer-exponential", "epidemic"])
def test_a_schedule_without_a_copy_per_link_is_refused_with_the_fix(
    kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "--topology", kind, "--nodes", "2", "--quiet"]) == 2
    assert "add --pace link" in capsys.readouterr().err
    with pytest.raises(SettingsError, match=r"--topology .*--pace link"):
        load_settings(
            environ={},
            flags={"gossip.topology": kind},
            flag_labels={"gossip.topology": "--topology"},
        )


@pytest.mark.parametrize("kind", ["one-peer-exponential", "epidemic"])
async def test_daemons_send_each_round_to_a_few_links_and_train(kind: str, tmp_path: Path) -> None:
    """Six daemons: every link of the exponential graph carries deltas both ways, yet a
    round goes to at most two of a node's four links, and the swarm trains as one."""
    settings = {
        "trainer.steps": 200,
        "gossip.topology": kind,
        "gossip.pace": "link",
        "gossip.trigger": False,  # no heartbeats (which go to every link): rounds alone
        "gossip.idle_round_interval_s": None,
    }
    async with memory_swarm(tmp_path, 6, settings) as nodes:
        for n in nodes:
            await n.wait_until(n.training_finished.is_set, TIMEOUT_S)
        by_id: dict[str, Node] = {n.node_id: n for n in nodes}
        graph = exponential(by_id)
        await nodes[0].wait_until(lambda: links_settled(by_id), TIMEOUT_S)
        for n in nodes:
            links = n.peers.links
            assert set(links) == graph.neighbours(n.node_id)
            sent = {peer: link.stats.deltas_sent for peer, link in links.items()}
            rounds = n.counters.rounds
            assert rounds > 20
            assert all(count > 0 for count in sent.values()), sent
            assert sum(sent.values()) <= PER_ROUND[kind] * rounds, (sent, rounds)
            assert sum(sent.values()) < len(links) * rounds
            assert n.trainer.last_eval is not None
            assert n.trainer.last_eval.accuracy >= 0.85
            assert refusals_past_joining(n) == {}


@pytest.mark.parametrize("kind", ["one-peer-exponential", "epidemic"])
def test_a_simulated_scheduled_swarm_trains_on_two_of_five_links_a_round(kind: str) -> None:
    cfg = SimConfig(
        nodes=8,
        duration_s=5.0,
        eval_every_s=5.0,
        gossip=GossipConfig(topology=kind, pace="link", trigger=False),
    )
    sim = Simulation(cfg)
    summary = sim.run()
    nodes = {n.node_id: n for n in sim.nodes.values()}
    graph = exponential(nodes)
    for n in nodes.values():
        assert set(n.state.copies) == graph.neighbours(n.node_id)
        assert len(n.links) == 5  # ±1, ±2 and 4 away on a ring of eight
        sent = [link.machine.stats.deltas_sent for link in n.links.values()]
        assert all(count > 0 for count in sent)
        assert sum(sent) <= PER_ROUND[kind] * n.counters.rounds
    assert summary.final.avg_accuracy >= cfg.target_accuracy
