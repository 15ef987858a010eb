"""The byte budget measured from outside (issue 17): four ``murmur run`` processes over mutual
TLS, each in its own network namespace, with ``--byte-budget`` of a few seconds' period. What
each sends is read from its link's interface counter, every quarter of a second, on the wall
clock the periods are aligned to: over every whole period no node sends more than its budget,
membership and the wire's overhead included, each uses most of it, and the swarm still reaches
the target.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from pathlib import Path

import pytest

from node.cli.swarm import NodeProcess, SwarmConfig, node_argv, provision
from node.config import GossipConfig
from tests.e2e.test_upload_cap import last_eval, sent_bytes
from tests.netns import Testnet
from tests.node.helpers import poll

pytestmark = pytest.mark.e2e  # needs root, as the e2e stage runs: Testnet says so otherwise

PREFIX, SUBNET = "bud", "10.79.24"
N = 4
PERIOD_S = 8.0
BUDGET = 400_000  # bytes a period: 50 kB/s, a sixth of what the upload cap's test allows
SAMPLE_S = 0.25
TARGET = 0.9
PERIODS = 3  # whole periods measured, at least
CFG = SwarmConfig(
    nodes=N,
    steps=1500,
    eval_every=100,
    alpha=0.5,
    step_time=0.01,  # training lasts about as long as two periods
    gossip=GossipConfig(codec="int8"),
)


def per_period(samples: list[tuple[float, int]]) -> list[int]:
    """Bytes sent in each whole period between the first sample and the last (periods turn
    at multiples of PERIOD_S on the wall clock); from the samples nearest the turns."""
    first = math.ceil(samples[0][0] / PERIOD_S)
    last = math.floor(samples[-1][0] / PERIOD_S)
    turns = [k * PERIOD_S for k in range(first, last + 1)]

    def at(t: float) -> int:
        return min(samples, key=lambda s: abs(s[0] - t))[1]

    return [at(b) - at(a) for a, b in itertools.pairwise(turns)]


@pytest.mark.timeout(600)
async def test_no_node_sends_more_than_its_budget_in_any_period(tmp_path: Path) -> None:
    procs = [NodeProcess(i, tmp_path / f"node-{i}") for i in range(N)]
    samples: dict[int, list[tuple[float, int]]] = {i: [] for i in range(N)}
    with Testnet(PREFIX, N, SUBNET) as net:

        def argv(i: int, join: str | None) -> list[str]:
            line = node_argv(CFG, i, procs[i].state_dir, join, N)
            line[line.index("--listen") + 1] = f"{net.address(i)}:0"
            return [*net.exec_argv(i), *line, "--byte-budget", f"{BUDGET}B/{PERIOD_S:g}s"]

        provision(CFG, tmp_path, [p.state_dir for p in procs])  # mutual TLS
        sampling = True
        sampler: asyncio.Task[None] | None = None

        async def sample() -> None:
            while sampling:
                now = time.time()  # the budget's periods are the wall clock's
                for i in range(N):
                    samples[i].append((now, sent_bytes(net, i)))
                await asyncio.sleep(SAMPLE_S)

        try:
            await procs[0].start(argv(0, None), 120)
            await asyncio.gather(
                *(p.start(argv(p.index, procs[0].address), 120) for p in procs[1:])
            )
            sampler = asyncio.create_task(sample())  # from when every node runs

            async def trained() -> dict[int, dict[str, float]] | None:
                """Every node past its step budget and at the target, and the periods seen."""
                finals = {p.index: last_eval(p) for p in procs}
                done = all(
                    r is not None and r["step"] == CFG.steps and r["accuracy"] >= TARGET
                    for r in finals.values()
                )
                enough = len(per_period(samples[0])) >= PERIODS if samples[0] else False
                return (
                    {i: r for i, r in finals.items() if r is not None} if done and enough else None
                )

            finals = await poll(trained, "every node at the target, and whole periods", 420)
        finally:
            sampling = False
            codes = await asyncio.gather(*(p.stop(60) for p in procs))
            if sampler is not None:
                await sampler
    periods = {i: per_period(s) for i, s in samples.items()}
    print(
        f"\nbudget {BUDGET} B per {PERIOD_S:g} s; bytes on the interface in each whole period, "
        f"per node: {periods}; final accuracy "
        f"{ {i: round(r['accuracy'], 3) for i, r in finals.items()} }"
    )
    assert codes == [0] * N, codes
    for i, spent in periods.items():
        assert len(spent) >= PERIODS, (i, spent)
        # Everything on the interface, membership and the wire's overhead included (measured:
        # 0.92-0.95 of the budget in the periods that trained).
        assert max(spent) <= BUDGET, (i, spent)
        assert max(spent) >= 0.5 * BUDGET, (i, spent)  # a budget that bit, used
    for i, record in finals.items():
        assert record["accuracy"] >= TARGET, (i, record)
