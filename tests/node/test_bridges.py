"""A codec and a period of their own for the links between regions (``--bridge-compress``,
``--bridge-period``, with ``--pace link``): the flags reach ``murmur run``, ``murmur swarm`` and
``murmur simulate``, bad combinations are refused with the fix, and daemons over the in-memory
transport and simulated nodes send across regions with the bridge codec in one round of P while
the links inside keep theirs every round, every replica exact.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gossip.topology import block_region, crosses
from node.cli.commands.run import build_node_config
from node.cli.commands.shared import gossip_config
from node.cli.main import main, make_parser
from node.cli.swarm import SwarmConfig, node_argv
from node.config import GossipConfig
from node.daemon.node import Node
from node.settings_sources import SettingsError, load_settings
from node.sim import NetConfig, SimConfig, Simulation
from node.telemetry.status import format_status
from tests.node.helpers import memory_swarm, refusals_past_joining
from tests.node.test_auto_codec_node import link_replicas_exact, links_settled

TIMEOUT_S = 60.0
BRIDGED = GossipConfig(
    topology="regional", degree=1, pace="link", bridge_codec="sign", bridge_period=4
)


def test_the_flags_reach_each_command() -> None:
    argv = ["--topology", "regional", "--degree", "1", "--pace", "link"]
    argv += ["--bridge-compress", "sign", "--bridge-period", "4"]
    assert build_node_config(make_parser().parse_args(["run", *argv])).gossip == BRIDGED
    assert gossip_config(make_parser().parse_args(["simulate", *argv])) == BRIDGED
    swarm_argv = node_argv(SwarmConfig(gossip=BRIDGED), 1, Path("/tmp/n1"), "127.0.0.1:1")
    assert build_node_config(make_parser().parse_args(swarm_argv[3:])).gossip == BRIDGED
    assert BRIDGED.swarm_codec().name == "auto"  # every delta names its codec
    assert BRIDGED.link_gamma is not None
    assert set(BRIDGED.link_gamma) == {"int8", "sign"}


@pytest.mark.parametrize(
    ("flags", "fix"),
    [
        ({"gossip.bridge_codec": "sign"}, "add --pace link"),
        ({"gossip.bridge_period": "10"}, "add --pace link"),
        (
            {"gossip.bridge_codec": "sign", "gossip.pace": "link", "gossip.codec": "topk"},
            "must send one of fp16, int8, int4 or sign too",
        ),
    ],
)
def test_bad_combinations_are_refused_with_the_fix(flags: dict[str, Any], fix: str) -> None:
    labels = {k: "--" + k.removeprefix("gossip.").replace("_", "-") for k in flags}
    with pytest.raises(SettingsError, match=fix):
        load_settings(environ={}, flags=flags, flag_labels=labels)


def test_simulate_refuses_a_bridge_codec_without_a_copy_per_link(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["simulate", "--bridge-compress", "sign", "--nodes", "2", "--quiet"]) == 2
    assert "add --pace link" in capsys.readouterr().err


def test_simulated_bridges_send_their_codec_one_round_in_p() -> None:
    cfg = SimConfig(
        nodes=16,
        duration_s=5.0,
        eval_every_s=5.0,
        gossip=GossipConfig(
            topology="regional",
            degree=2,
            pace="link",
            trigger=False,
            bridge_codec="sign",
            bridge_period=5,
            idle_round_interval_s=None,
        ),
        steps=150,
        net=NetConfig(regions=4),
    )
    sim = Simulation(cfg)
    summary = sim.run()
    sim.events.run_until(sim.events.now() + 30.0)  # training is over: the last deltas land
    nodes = {n.node_id: n for n in sim.nodes.values()}
    region_of = {i: n.swim.region for i, n in nodes.items()}
    across = inside = 0
    for i, n in nodes.items():
        for j, replica in n.state.replicas.items():
            named = "sign" if crosses(region_of, i, j) else "int8"
            assert replica.codec == named, (i, j, replica.codec)
        for j, link in n.links.items():
            if crosses(region_of, i, j):
                across += 1
                assert 0 < link.machine.stats.deltas_sent <= n.counters.rounds // 5 + 1
            else:
                inside += 1
                assert link.machine.stats.deltas_sent > n.counters.rounds // 2
    assert across > 0
    assert inside > 0
    assert link_replicas_exact(nodes)
    assert summary.final.avg_accuracy >= cfg.target_accuracy


async def test_daemons_bridge_regions_with_their_codec_and_period(tmp_path: Path) -> None:
    settings = {
        "trainer.steps": 200,
        "gossip.topology": "regional",
        "gossip.degree": 1,
        "gossip.pace": "link",
        "gossip.bridge_codec": "sign",
        "gossip.bridge_period": 4,
        "gossip.trigger": False,
        "gossip.idle_round_interval_s": None,
    }

    def region(i: int) -> dict[str, Any]:
        return {"gossip.region": block_region(i, 6, 2)}

    async with memory_swarm(tmp_path, 6, settings, each=region) as nodes:
        for n in nodes:
            await n.wait_until(n.training_finished.is_set, TIMEOUT_S)
        by_id: dict[str, Node] = {n.node_id: n for n in nodes}
        region_of = {n.node_id: block_region(i, 6, 2) for i, n in enumerate(nodes)}
        await nodes[0].wait_until(lambda: links_settled(by_id), TIMEOUT_S)
        bridges = 0
        for n in nodes:
            status = await n.status()
            shown = {s.node_id: s.codec for s in status.neighbours}
            for j, link in n.peers.links.items():
                if crosses(region_of, n.node_id, j):
                    bridges += 1
                    assert shown[j] == "sign"
                    assert n.state.replicas[j].codec == "sign"
                    assert 0 < link.stats.deltas_sent <= n.counters.rounds // 4 + 1
                else:
                    assert shown[j] == "int8"
            assert "sign" in format_status(status) or not any(
                crosses(region_of, n.node_id, j) for j in n.peers.links
            )
            assert n.trainer.last_eval is not None
            assert n.trainer.last_eval.accuracy >= 0.85
            assert refusals_past_joining(n) == {}
        assert bridges == 2  # one bridge, seen from both of its ends
