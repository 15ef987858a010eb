"""The bound on local steps between rounds (issue 17, ``--max-local-steps``): a fast trainer on a
slow link takes as many steps between rounds as the link leaves it time for, unless bounded;
bounded, it waits at the bound for its links, and says how long it waited."""

from __future__ import annotations

from pathlib import Path

import pytest

from gossip.messages import Delta
from gossip.pacing import RoundPacer
from node.cli.swarm import SwarmConfig, node_argv
from node.config import GossipConfig
from node.daemon.node import Node
from node.telemetry.status import format_status
from node.transport.memory import MemoryNetwork
from tests.node.helpers import memory_swarm

TIMEOUT_S = 120.0
STEPS = 120
LINK_S = 0.03  # every delta takes this long to arrive: a slow link next to a step


def slow_deltas(caller: str, callee: str, message: object) -> float:
    return LINK_S if isinstance(message, Delta) else 0.0


def steps_per_round(node: Node) -> float:
    begun = node.counters.rounds + node.counters.rounds_skipped
    return node.trainer.step / max(begun, 1)


async def run(tmp_path: Path, bound: int | None) -> list[tuple[float, float, str]]:
    settings = {
        "trainer.steps": STEPS,
        "gossip.max_local_steps": bound,
        "gossip.trigger": False,  # every round the links allow is made
        "gossip.idle_round_interval_s": None,
    }
    async with memory_swarm(tmp_path, 2, settings, MemoryNetwork(delay=slow_deltas)) as nodes:
        for node in nodes:
            await node.wait_until(node.training_finished.is_set, TIMEOUT_S)
        seen = []
        for node in nodes:
            status = await node.status()
            seen.append((steps_per_round(node), status.held_s, format_status(status)))
        return seen


async def test_a_bounded_trainer_waits_for_its_links_and_says_so(tmp_path: Path) -> None:
    free = await run(tmp_path / "free", None)
    bounded = await run(tmp_path / "bounded", 2)
    # Unbounded, the slow link leaves the trainer time for more than two steps a round ...
    assert all(per_round > 2.5 for per_round, _, _ in free), free
    assert all(held_s == 0 for _, held_s, _ in free)
    # ... bounded at two, it takes at most two (the last round may still be under way), and
    # the time it waited is in its status.
    for per_round, held_s, shown in bounded:
        assert per_round <= 2 * (1 + 2 / STEPS), bounded
        assert held_s > 0
        assert f"held {held_s:.1f} s" in shown


def test_murmur_swarm_hands_the_bound_to_its_nodes() -> None:
    argv = node_argv(SwarmConfig(gossip=GossipConfig(max_local_steps=8)), 1, Path("s"), None)
    assert argv[argv.index("--max-local-steps") + 1] == "8"
    assert "--max-local-steps" not in node_argv(SwarmConfig(), 1, Path("s"), None)


@pytest.mark.parametrize("make", [GossipConfig, RoundPacer])
def test_a_bound_below_the_least_local_steps_is_refused(make: type) -> None:
    with pytest.raises(ValueError, match=r"max_local_steps \(3\) must be at least local_steps"):
        make(local_steps=4, max_local_steps=3)
