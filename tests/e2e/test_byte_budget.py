"""The byte budget measured from outside (issue 17): four ``murmur run`` processes over mutual
TLS, each in its own network namespace, with ``--byte-budget`` of a few seconds' period. What
each sends is read from its link's interface counter at each turn of a period (by a thread woken
at the turns of the wall clock the periods are aligned to, not by the test's event loop, which a
loaded machine delays by a large share of a second): over every whole period no node sends more
than its budget,
membership and the wire's overhead included, each uses most of it, and the swarm still reaches
the target.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import threading
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


class TurnReader:
    """Reads every node's counter at each turn of a period, from its own thread: a read is
    late by the thread's wake-up only (:attr:`late_s`, the most seen), a few milliseconds,
    in which a node spending its budget evenly sends a few hundred bytes."""

    def __init__(self, net: Testnet) -> None:
        self._net = net
        self._stop = threading.Event()
        #: At each turn read (the turn's time, each node's counter).
        self.turns: list[tuple[float, list[int]]] = []
        self.late_s = 0.0
        self._thread = threading.Thread(target=self._run, name="turn-reader", daemon=True)

    def _run(self) -> None:
        turn = math.ceil(time.time() / PERIOD_S) * PERIOD_S
        while not self._stop.wait(max(0.0, turn - time.time())):
            counts = [sent_bytes(self._net, i) for i in range(N)]
            self.late_s = max(self.late_s, time.time() - turn)
            self.turns.append((turn, counts))
            turn += PERIOD_S

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def periods(self, i: int) -> list[int]:
        """Bytes node ``i`` sent in each whole period read."""
        return [b[1][i] - a[1][i] for a, b in itertools.pairwise(self.turns)]


@pytest.mark.timeout(600)
async def test_no_node_sends_more_than_its_budget_in_any_period(tmp_path: Path) -> None:
    procs = [NodeProcess(i, tmp_path / f"node-{i}") for i in range(N)]
    with Testnet(PREFIX, N, SUBNET) as net:

        def argv(i: int, join: str | None) -> list[str]:
            line = node_argv(CFG, i, procs[i].state_dir, join, N)
            line[line.index("--listen") + 1] = f"{net.address(i)}:0"
            return [*net.exec_argv(i), *line, "--byte-budget", f"{BUDGET}B/{PERIOD_S:g}s"]

        provision(CFG, tmp_path, [p.state_dir for p in procs])  # mutual TLS
        reader = TurnReader(net)
        try:
            await procs[0].start(argv(0, None), 120)
            await asyncio.gather(
                *(p.start(argv(p.index, procs[0].address), 120) for p in procs[1:])
            )
            reader.start()  # from when every node runs

            async def trained() -> dict[int, dict[str, float]] | None:
                """Every node past its step budget and at the target, and the periods seen."""
                finals = {p.index: last_eval(p) for p in procs}
                done = all(
                    r is not None and r["step"] == CFG.steps and r["accuracy"] >= TARGET
                    for r in finals.values()
                )
                enough = len(reader.periods(0)) >= PERIODS
                return (
                    {i: r for i, r in finals.items() if r is not None} if done and enough else None
                )

            finals = await poll(trained, "every node at the target, and whole periods", 420)
        finally:
            reader.stop()
            codes = await asyncio.gather(*(p.stop(60) for p in procs))
    periods = {i: reader.periods(i) for i in range(N)}
    print(
        f"\nbudget {BUDGET} B per {PERIOD_S:g} s; bytes on the interface in each whole period, "
        f"per node: {periods} (read at most {reader.late_s * 1e3:.1f} ms after a turn); "
        "final accuracy "
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
