"""The upload cap measured from outside (issue 17): four ``murmur run`` processes over mutual
TLS, each in its own network namespace, with ``--max-upload-rate``. What each sends is read from
its link's interface counter (the bytes the host end of its veth receives), every quarter of a
second, while the swarm trains: over no window of 5 s does any node send more than the cap, and
every node still reaches the target.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from node.cli.swarm import NodeProcess, SwarmConfig, node_argv, provision
from node.config import GossipConfig
from node.daemon.node import METRICS_FILE
from tests.netns import Testnet
from tests.node.helpers import poll

pytestmark = pytest.mark.e2e  # needs root, as the e2e stage runs: Testnet says so otherwise

PREFIX, SUBNET = "cap", "10.79.23"
N = 4
CAP = 300_000  # bytes a second: about a round a second of int8 deltas of the digits MLP
WINDOW_S = 5.0
SAMPLE_S = 0.25
TARGET = 0.9
CFG = SwarmConfig(nodes=N, steps=3000, eval_every=100, alpha=0.5, gossip=GossipConfig(codec="int8"))


def sent_bytes(net: Testnet, i: int) -> int:
    """Bytes host ``i`` has sent: what the host end of its veth has received."""
    return int(Path(f"/sys/class/net/{net.prefix}-v{i}/statistics/rx_bytes").read_text())


def last_eval(p: NodeProcess) -> dict[str, float] | None:
    path = p.state_dir / METRICS_FILE
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    evals = [r for r in records if r.get("event") == "eval"]
    return evals[-1] if evals else None


def gossip_bytes(p: NodeProcess) -> int:
    """What the node counted as sent: its messages' own bytes (its stop record)."""
    path = p.state_dir / METRICS_FILE
    stops = [r for r in map(json.loads, path.read_text().splitlines()) if r.get("event") == "stop"]
    return int(stops[-1]["bytes_sent"])


def worst_window(samples: list[tuple[float, int]], window_s: float) -> float:
    """The most bytes a second over any window of at least ``window_s`` between two samples."""
    worst = 0.0
    for k, (t0, b0) in enumerate(samples):
        for t1, b1 in samples[k + 1 :]:
            if t1 - t0 >= window_s:
                worst = max(worst, (b1 - b0) / (t1 - t0))
                break
    return worst


@pytest.mark.timeout(600)
async def test_no_node_sends_more_than_its_cap_over_any_five_seconds(tmp_path: Path) -> None:
    procs = [NodeProcess(i, tmp_path / f"node-{i}") for i in range(N)]
    samples: dict[int, list[tuple[float, int]]] = {i: [] for i in range(N)}
    with Testnet(PREFIX, N, SUBNET) as net:

        def argv(i: int, join: str | None) -> list[str]:
            line = node_argv(CFG, i, procs[i].state_dir, join, N)
            line[line.index("--listen") + 1] = f"{net.address(i)}:0"
            return [*net.exec_argv(i), *line, "--max-upload-rate", f"{CAP}B/s"]

        provision(CFG, tmp_path, [p.state_dir for p in procs])  # mutual TLS
        sampling = True

        async def sample() -> None:
            while sampling:
                now = time.monotonic()
                for i in range(N):
                    samples[i].append((now, sent_bytes(net, i)))
                await asyncio.sleep(SAMPLE_S)

        sampler = asyncio.create_task(sample())
        try:
            await procs[0].start(argv(0, None), 120)
            await asyncio.gather(
                *(p.start(argv(p.index, procs[0].address), 120) for p in procs[1:])
            )

            async def trained() -> dict[int, dict[str, float]] | None:
                """Every node past its budget and at the target (evaluations go on after the
                budget, as gossip does: a capped swarm may still be mixing then)."""
                finals = {p.index: last_eval(p) for p in procs}
                done = all(
                    r is not None and r["step"] == CFG.steps and r["accuracy"] >= TARGET
                    for r in finals.values()
                )
                return {i: r for i, r in finals.items() if r is not None} if done else None

            finals = await poll(trained, "every node to reach the target past its budget", 420)
        finally:
            sampling = False
            await sampler
            codes = await asyncio.gather(*(p.stop(60) for p in procs))
    worst = {i: worst_window(s, WINDOW_S) for i, s in samples.items()}
    wire = {i: (s[-1][1] - s[0][1]) / gossip_bytes(procs[i]) for i, s in samples.items()}
    print(
        f"\ncap {CAP} B/s; most sent over any {WINDOW_S:g} s, per node (B/s): "
        f"{ {i: round(w) for i, w in worst.items()} }; interface bytes per gossip byte "
        f"{ {i: round(w, 3) for i, w in wire.items()} }; final accuracy "
        f"{ {i: round(r['accuracy'], 3) for i, r in finals.items()} }"
    )
    assert codes == [0] * N, codes
    for i, rate in worst.items():
        assert rate <= CAP, (i, rate)
        assert rate >= 0.5 * CAP  # it was a cap that bit, not a swarm with little to send
    for i, record in finals.items():
        assert record["accuracy"] >= TARGET, (i, record)
