"""One slow neighbour among six real nodes (issue 17): every node in its own network namespace
over mutual TLS, and one of them (the last) behind a shaped link (tc tbf through
scripts/shape-link, both ways) for half of the time. What is measured is the deltas a second on
each link, from each node's Status: the *fast links* are those of the slow node's neighbours to
their other neighbours, the *slow links* those of its neighbours to it.

The phases alternate, unshaped and shaped, twice, so that the load of a shared machine, which
moves over a minute, weighs on both alike. Shared by tests/e2e/test_slow_neighbour.py (``--pace
link``: the fast links keep their rate) and bench/slow_neighbour.py (both paces side by side).
"""

from __future__ import annotations

import asyncio
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from node.cli.swarm import SwarmConfig
from node.config import GossipConfig
from tests.e2e.netswarm import LinkRates, NetSwarm
from tests.netns import Testnet
from tests.node.helpers import poll

__all__ = ["Phases", "measure"]

SHAPE = str(Path(__file__).resolve().parents[2] / "scripts" / "shape-link")
N = 6
SLOW = N - 1  # the host behind the slow link
T = TypeVar("T")
SETTLE_S = 3.0  # after the link changes, before a rate is measured: TCP finds the new pace


@dataclass
class Phases:
    """Per phase ("fast" or "slow"), one entry per repeat: the mean deltas a second over the fast
    links and over the slow links."""

    fast_links: dict[str, list[float]] = field(default_factory=lambda: {"fast": [], "slow": []})
    slow_links: dict[str, list[float]] = field(default_factory=lambda: {"fast": [], "slow": []})
    #: Per phase, one entry per repeat: the codecs of the fast links and of the slow links at
    #: the end of the phase (under ``--compress auto`` each link's own pick).
    fast_codecs: dict[str, list[list[str]]] = field(
        default_factory=lambda: {"fast": [], "slow": []}
    )
    slow_codecs: dict[str, list[list[str]]] = field(
        default_factory=lambda: {"fast": [], "slow": []}
    )
    codes: list[int] = field(default_factory=list)

    def ratio(self) -> float:
        """The fast links' rate while the slow node's link is shaped, over their rate while not."""
        return sum(self.fast_links["slow"]) / sum(self.fast_links["fast"])

    def slow_share(self) -> float:
        """While shaped: the slow links' rate over the fast links' rate."""
        return sum(self.slow_links["slow"]) / sum(self.fast_links["slow"])


def _shape(net: Testnet, rate: str | None) -> None:
    """The slow host's uplink (inside its namespace) and downlink (the bridge's end of its veth)
    at ``rate``, or unshaped for None."""
    how = ["--rate", rate] if rate else ["--clear"]
    for argv in (
        [*net.exec_argv(SLOW), SHAPE, "eth0", *how],
        [SHAPE, f"{net.prefix}-v{SLOW}", *how],
    ):
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")


def _split(links: dict[tuple[int, int], T]) -> tuple[list[T], list[T]]:
    """(fast links, slow links): the values of each kind in ``links``."""
    near = {i for (i, j) in links if j == SLOW}  # the slow node's neighbours
    fast = [r for (i, j), r in sorted(links.items()) if i in near and j != SLOW]
    slow = [r for (i, j), r in sorted(links.items()) if i in near and j == SLOW]
    if not fast or not slow:
        raise AssertionError(f"no fast or no slow links to measure among {sorted(links)}")
    return fast, slow


def _means(rates: LinkRates) -> tuple[float, float]:
    """(fast links, slow links): the mean deltas a second of each kind in ``rates``."""
    fast, slow = _split(rates)
    return sum(fast) / len(fast), sum(slow) / len(slow)


async def _usual_codecs(swarm: NetSwarm, readings: int = 5) -> dict[tuple[int, int], str]:
    """Each link's codec as most of ``readings`` Status reads half a second apart found it:
    ``auto`` explores now and then (a few deltas of another codec), and one read may land on
    that."""
    seen: dict[tuple[int, int], list[str]] = {}
    for k in range(readings):
        if k:
            await asyncio.sleep(0.5)  # a sampling period, not a wait for an event
        for link, codec in (await swarm.link_codecs()).items():
            seen.setdefault(link, []).append(codec)
    return {link: Counter(codecs).most_common(1)[0][0] for link, codecs in seen.items()}


async def measure(
    pace: str,
    workdir: Path,
    *,
    rate: str = "1mbit",
    codec: str = "fp32",
    window_s: float = 12.0,
    repeats: int = 2,
    prefix: str = "slown",
    subnet: str = "10.79.47",
) -> Phases:
    """Start the swarm with ``--pace pace``, let every node train, then alternate the slow
    host's link unshaped and at ``rate`` ``repeats`` times, measuring each phase over
    ``window_s``. The swarm is stopped with SIGTERM at the end (its exit codes in ``codes``)."""
    cfg = SwarmConfig(
        nodes=N,
        steps=10**6,  # trains until stopped
        alpha=0.5,
        eval_every=100,
        gossip=GossipConfig(codec=codec, pace=pace),
    )
    out = Phases()
    with Testnet(prefix, N, subnet) as net:
        swarm = NetSwarm(net, cfg, workdir)
        try:
            await swarm.start()

            async def training() -> bool:
                got = await swarm.poll()
                return all(s is not None and s.step >= 50 for s in got)

            await poll(training, "every node training", 120)
            for _ in range(repeats):
                for phase in ("fast", "slow"):
                    _shape(net, rate if phase == "slow" else None)
                    await asyncio.sleep(SETTLE_S)  # a settling time, not a wait for an event
                    fast, slow = _means(await swarm.link_rates(window_s))
                    out.fast_links[phase].append(fast)
                    out.slow_links[phase].append(slow)
                    fast_codecs, slow_codecs = _split(await _usual_codecs(swarm))
                    out.fast_codecs[phase].append(fast_codecs)
                    out.slow_codecs[phase].append(slow_codecs)
        finally:
            out.codes = await swarm.stop()
    return out
