"""A node counts the rounds it begins but does not make (issue 17): once its swarm has
converged and training is over, the event trigger finds nothing worth sending, and the status,
the scrape and ``murmur status`` say how many rounds were skipped."""

from __future__ import annotations

from pathlib import Path

from node.telemetry.status import format_status
from tests.node.helpers import memory_swarm

TIMEOUT_S = 60.0
SKIPPED = 50


async def test_a_converged_idle_node_skips_rounds_and_says_so(tmp_path: Path) -> None:
    settings = {"trainer.steps": 100, "gossip.idle_round_interval_s": 0.01}
    async with memory_swarm(tmp_path, 2, settings) as nodes:
        node = nodes[0]
        await node.wait_until(node.training_finished.is_set, TIMEOUT_S)
        await node.wait_until(lambda: node.counters.rounds_skipped >= SKIPPED, TIMEOUT_S)
        status = await node.status()
    assert status.rounds_skipped >= SKIPPED
    assert status.rounds > 0  # training made rounds: the skipped ones are the idle ones
    assert f"({status.rounds_skipped} skipped)" in format_status(status)


async def test_with_the_trigger_off_no_idle_round_is_skipped(tmp_path: Path) -> None:
    settings = {
        "trainer.steps": 100,
        "gossip.idle_round_interval_s": 0.01,
        "gossip.trigger": False,
    }
    async with memory_swarm(tmp_path, 2, settings) as nodes:
        node = nodes[0]
        await node.wait_until(node.training_finished.is_set, TIMEOUT_S)
        made = node.counters.rounds
        await node.wait_until(lambda: node.counters.rounds >= made + SKIPPED, TIMEOUT_S)
        assert node.counters.rounds_skipped == 0
