"""``--compress auto`` in the node: the flags, the simulator's choice on fast and slow links,
and daemons over the in-memory transport whose links pick their codecs, keep each link's
replica bit-identical to its sender's copy, and show the pick in status, text and metrics."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import pytest
import torch

from gossip.codecs import AUTO_CODECS
from gossip.replicas import GossipState
from node.cli.commands.run import build_node_config
from node.cli.commands.shared import gossip_config
from node.cli.main import make_parser
from node.cli.swarm import SwarmConfig, node_argv
from node.config import GossipConfig
from node.daemon.node import Node
from node.sim import NetConfig, SimConfig, Simulation
from node.telemetry.metrics import status_metrics
from node.telemetry.status import format_status
from tests.node.helpers import memory_swarm, refusals_past_joining

AUTO = GossipConfig(codec="auto", pace="link")
TIMEOUT_S = 60.0


def test_the_flags_reach_each_command() -> None:
    argv = ["--compress", "auto", "--pace", "link"]
    assert build_node_config(make_parser().parse_args(["run", *argv])).gossip == AUTO
    assert gossip_config(make_parser().parse_args(["simulate", *argv])) == AUTO
    swarm_argv = node_argv(SwarmConfig(gossip=AUTO), 1, Path("/tmp/n1"), "127.0.0.1:1")
    assert build_node_config(make_parser().parse_args(swarm_argv[3:])).gossip == AUTO


class HasState(Protocol):
    """A daemon's node or a simulated one: both keep their gossip state here."""

    state: GossipState


def link_replicas_exact(nodes: Mapping[str, HasState]) -> bool:
    """Every replica is, to the bit, the copy its sender keeps for that link."""
    return all(
        torch.equal(replica.value, nodes[peer].state.copies[me].value)
        for me, node in nodes.items()
        for peer, replica in node.state.replicas.items()
    )


def links_settled(nodes: Mapping[str, HasState]) -> bool:
    """Every link is up both ways, and every replica exact: nothing is in flight."""
    return all(
        n.state.replicas.keys() == n.state.copies.keys() for n in nodes.values()
    ) and link_replicas_exact(nodes)


@pytest.mark.parametrize(
    ("bandwidth", "picks"),
    [
        (1.25e9, {"int8"}),  # 10 Gbit/s: a fixed cost sets the pace, int8 is within 15% of fp16
        # 80 kbit/s: bytes set it (a sign delta of the 4,810 values takes 70 ms; at 200 kbit/s,
        # four links sharing the uplink, sign and int4 measure within the hysteresis).
        (1e4, {"sign"}),
    ],
)
def test_simulated_links_pick_by_their_rate(bandwidth: float, picks: set[str]) -> None:
    cfg = SimConfig(
        nodes=6,
        duration_s=4.0,
        eval_every_s=4.0,
        task="digits",
        gossip=GossipConfig(codec="auto", pace="link", idle_round_interval_s=None),
        steps=200,
        net=NetConfig(latency_s=(0.001, 0.002), bandwidth_bps=bandwidth),
    )
    sim = Simulation(cfg)
    sim.events.run_until(100.0)  # 200 steps, then the last deltas land: nothing moves after
    nodes = {n.node_id: n for n in sim.nodes.values()}
    # A link whose last rounds probed the next larger codec is left out: that is no pick.
    settled = [
        (n, p, replica)
        for n in nodes.values()
        for p in n.state.copies
        if n.codecs is not None
        and p not in n.codecs.probing
        and (replica := nodes[p].state.replicas.get(n.node_id)) is not None
    ]
    assert len(settled) >= 20
    chosen = {n.state.codec_for(p).name for n, p, _ in settled}
    assert chosen <= picks
    sent = {replica.codec for _, _, replica in settled if replica.codec}  # "": a snapshot since
    assert sent == chosen  # what the last deltas named
    assert link_replicas_exact(nodes)


async def test_daemons_pick_a_codec_per_link_and_show_it(tmp_path: Path) -> None:
    settings = {
        "trainer.steps": 200,
        "gossip.codec": "auto",
        "gossip.pace": "link",
        "gossip.idle_round_interval_s": None,
    }
    async with memory_swarm(tmp_path, 3, settings) as nodes:
        for n in nodes:
            await n.wait_until(n.training_finished.is_set, TIMEOUT_S)
        by_id: dict[str, Node] = {n.node_id: n for n in nodes}
        await nodes[0].wait_until(lambda: links_settled(by_id), TIMEOUT_S)
        for n in nodes:
            status = await n.status()
            assert status.codec == "auto"
            picks = {nb.codec for nb in status.neighbours}
            assert picks <= set(AUTO_CODECS)
            assert len(status.neighbours) == 2
            assert picks == {n.state.codec_for(p).name for p in n.state.copies}
            shown = format_status(status)
            assert " codec" in shown.splitlines()[shown.splitlines().index("  neighbours (2):") + 1]
            metric = next(m for m in status_metrics(status) if m.name == "murmur_neighbour_codec")
            assert {s.labels["codec"] for s in metric.samples} == picks
            assert n.trainer.last_eval is not None
            assert n.trainer.last_eval.accuracy >= 0.85
            assert refusals_past_joining(n) == {}
