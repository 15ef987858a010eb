"""The bound on local steps in the simulator, as in the daemon (tests/node/test_max_local_steps.py):
on links slow next to a step, a node takes many steps a round unless bounded; bounded, it waits
at the bound and counts the time."""

from __future__ import annotations

import dataclasses

from node.config import GossipConfig
from node.sim import SimConfig, Simulation
from node.sim.config import NetConfig

BASE = SimConfig(
    nodes=8,
    duration_s=5.0,
    eval_every_s=5.0,
    step_time_s=0.01,
    net=NetConfig(bandwidth_bps=2e4),  # a 160 kbit/s link: a delta takes several steps' time
    gossip=GossipConfig(topology="exponential", codec="int8", trigger=False),
)


def run(bound: int | None) -> tuple[list[float], list[float], list[int]]:
    """Steps per round made, seconds held and rounds made, by node."""
    cfg = dataclasses.replace(BASE, gossip=dataclasses.replace(BASE.gossip, max_local_steps=bound))
    sim = Simulation(cfg)
    sim.events.run_until(cfg.duration_s)
    nodes = list(sim.nodes.values())
    return (
        [n.step / max(n.counters.rounds, 1) for n in nodes],
        [n.counters.held_s for n in nodes],
        [n.counters.rounds for n in nodes],
    )


def test_a_bounded_simulated_node_waits_for_its_links() -> None:
    free, free_held, free_rounds = run(None)
    bounded, held, rounds = run(2)
    assert min(free) > 3, free
    assert free_held == [0.0] * len(free)
    assert max(bounded) <= 2.1, bounded
    assert min(held) > 0
    # The links set the pace of rounds either way: the bound costs steps, not rounds.
    assert sum(rounds) >= 0.9 * sum(free_rounds), (rounds, free_rounds)
