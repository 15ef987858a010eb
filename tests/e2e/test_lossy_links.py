"""Lossy links (issue 13): six real nodes over mutual TLS, each in its own network namespace on
one bridge, start, join and train with 10% packet loss and 40 ms delay on every link, each way
(tests/impair.py: netem where the kernel has it, else iptables and an NFQUEUE delay worker).

Training goes on, every node reaches the target accuracy under loss, and no node ever sees a member
dead (each node's Status is polled twice a second throughout). Then the same swarm alternates clean
and lossy links, twice, and its gossip rounds per second under loss stay at least MIN_RATIO of
those on clean links (a round that waited on every TCP recovery of any link fell to 0.14, the bug
this guards against): alternated, so that the load of a shared machine, which moves over a minute,
weighs on both alike. Where the fallback delays packets in user space, the clean links go through
its workers too (no loss, 1 µs), so that the CPU the harness takes from the nodes on a small
machine weighs on both alike as well: netem costs a user nothing. The rates are printed (run with
``-s``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from node.cli.swarm import SwarmConfig
from node.config import GossipConfig
from node.telemetry.status import NodeStatus
from tests.e2e.netswarm import NetSwarm, Rates
from tests.impair import Impairment
from tests.netns import Testnet
from tests.node.helpers import poll

pytestmark = pytest.mark.e2e  # needs root, as the e2e stage runs: Testnet says so otherwise

PREFIX, SUBNET = "lossy", "10.79.41"
N = 6
LOSS, DELAY_S = 0.1, 0.04  # each way, on every link
TARGET = 0.93  # the digits accuracy the acceptance test holds every node to
WINDOW_S = 15.0  # each rate is averaged over this
SETTLE_S = 3.0  # after the links change, before a rate is measured: TCP finds the new pace
# Measured: 0.74 of clean at 18 and 13 rounds/s (issue 13's machine); on this round's machine
# 0.47-0.49 in three runs, at the last landed code as at this one, with lossy rates higher than
# then (22-26 rounds/s) and clean ones far higher (46-53): the clean rate is bound by the CPU
# there, the lossy one by TCP's recoveries. 0.4 keeps three times the bug's 0.14.
MIN_RATIO = 0.4
CFG = SwarmConfig(
    nodes=N,
    steps=10**6,  # trains until the test stops it
    alpha=0.5,
    eval_every=100,  # each node's Status carries its accuracy on the shared held-out set
    gossip=GossipConfig(codec="int8"),
)


async def every(
    swarm: NetSwarm, ok: Callable[[NodeStatus], bool], what: str, timeout_s: float
) -> None:
    async def check() -> bool:
        got = await swarm.poll()
        return all(s is not None and ok(s) for s in got)

    await poll(check, what, timeout_s)


@pytest.mark.timeout(300)
async def test_ten_percent_loss_and_40_ms_keep_rounds_going_and_no_false_deaths(
    tmp_path: Path,
) -> None:
    rates: dict[str, list[Rates]] = {"clean": [], "lossy": []}
    with Testnet(PREFIX, N, SUBNET) as net, Impairment(net) as links:
        links.set(LOSS, DELAY_S)
        swarm = NetSwarm(net, CFG, tmp_path)
        try:
            await swarm.start()
            swarm.watch()
            await every(swarm, lambda s: s.step >= 50, "every node training", 120)
            await every(
                swarm,
                lambda s: s.eval_accuracy >= TARGET,
                f"every node at accuracy {TARGET} or more under loss",
                150,
            )
            accuracy = sorted(round(s.eval_accuracy, 3) for s in swarm.last.values())
            clean = (0.0, 0.0) if links.method == "netem" else (0.0, 1e-6)
            for _ in range(2):
                for phase in ("clean", "lossy"):
                    links.set(*((LOSS, DELAY_S) if phase == "lossy" else clean))
                    await asyncio.sleep(SETTLE_S)  # a settling time, not a wait for an event
                    rates[phase].append(await swarm.rates(WINDOW_S))
            links.check()
        finally:
            codes = await swarm.stop()
        method = links.method
    clean_rate = sum(r.rounds_per_s for r in rates["clean"]) / 2
    lossy_rate = sum(r.rounds_per_s for r in rates["lossy"]) / 2
    print(
        f"\nlinks by {method}; accuracy under loss {accuracy}; rounds/s per node, clean "
        f"{[round(r.rounds_per_s, 2) for r in rates['clean']]}, at {LOSS:.0%} loss and "
        f"{DELAY_S * 1e3:g} ms each way {[round(r.rounds_per_s, 2) for r in rates['lossy']]} "
        f"({lossy_rate / clean_rate:.2f} of clean); steps/s per node, clean "
        f"{[round(r.steps_per_s, 1) for r in rates['clean']]}, lossy "
        f"{[round(r.steps_per_s, 1) for r in rates['lossy']]}"
    )
    assert codes == [0] * N, codes  # SIGTERM: each left politely and wrote its state
    assert not swarm.deaths, f"false deaths (observer, member): {swarm.deaths}"
    assert all(r.steps_per_s > 0 for r in rates["lossy"])  # training goes on
    ratio = lossy_rate / clean_rate
    assert ratio >= MIN_RATIO, f"rounds under loss {ratio:.2f} of the clean rate"
