"""What an insider's flood of membership records costs a real node: its step rate and gossip
rounds under the flood, as ratios to the same node without it, in one run.

    python -m bench.insider_flood [--seconds 20] [--step-time 0.02] [--repeats 2]

Two real node processes train over mutual TLS on loopback (paced devices, ``--step-time``);
an insider with one valid certificate of the swarm's CA (tests/e2e/insider.py) joins, then
takes turns: quiet, a flood of forged records (identities of its own making, each record signed
by its own key: no certificate, the insider's certificate pasted on, a broken signature), quiet,
and a flood of its own valid records at ever newer incarnations (each costs the node a signature
check, and no honest node would blame it). Each flood sends membership messages of 31 records
to the attacked node from 4 concurrent loops, as fast as it answers. The insider runs in this
process, on the same two cores as the nodes (a real one would bring its own CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from node.cli.swarm import NodeProcess, SwarmConfig, node_argv, provision
from node.config import GossipConfig
from node.security.pki import issue_node
from node.telemetry.status import NodeStatus
from node.transport.grpc import GrpcTransport, GrpcTransportConfig
from tests.e2e.insider import Insider
from tests.node.helpers import poll


@dataclass(frozen=True)
class Rates:
    steps_per_s: float
    rounds_per_s: float
    cpu: float  # CPU seconds the node used per second of wall time
    slowest_status_s: float
    rejected: dict[str, int]  # refusals the node counted meanwhile, by reason


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def rates(
    transport: GrpcTransport,
    address: str,
    pid: int,
    seconds: float,
    work: asyncio.Task[int] | None,
) -> Rates:
    """The node's steps and rounds per second over ``seconds``, and the slowest Status answer."""
    slowest = 0.0

    async def ask() -> NodeStatus:
        nonlocal slowest
        started = time.monotonic()
        s = await transport.call_status(address, 30.0)
        slowest = max(slowest, time.monotonic() - started)
        return s

    first, t0, cpu0 = await ask(), time.monotonic(), cpu_seconds(pid)
    deadline = t0 + seconds
    while time.monotonic() < deadline:
        await asyncio.sleep(1.0)
        await ask()
    last, t1, cpu1 = await ask(), time.monotonic(), cpu_seconds(pid)
    if work is not None:
        await work
    rejected = {k: v - first.rejected.get(k, 0) for k, v in last.rejected.items()}
    return Rates(
        (last.step - first.step) / (t1 - t0),
        (last.rounds - first.rounds) / (t1 - t0),
        (cpu1 - cpu0) / (t1 - t0),
        slowest,
        {k: v for k, v in rejected.items() if v},
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--step-time", type=float, default=0.02)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    cfg = SwarmConfig(
        nodes=2, steps=10**8, step_time=args.step_time, gossip=GossipConfig(codec="int8")
    )
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        procs = [NodeProcess(i, workdir / f"node-{i}") for i in range(2)]
        tls = provision(cfg, workdir, [p.state_dir for p in procs])
        issue_node(workdir / "ca", workdir / "insider", "insider")
        transport = GrpcTransport(GrpcTransportConfig(tls=tls))
        insiders: list[Insider] = []
        rows = []
        try:
            for p in procs:
                join = procs[0].address if p.index else None
                await p.start(node_argv(cfg, p.index, p.state_dir, join), 120)
            attacked = procs[0].address
            assert procs[0].proc is not None
            pid = procs[0].proc.pid

            async def training() -> bool:
                return (await transport.call_status(attacked, 30.0)).step >= 100

            await poll(training, "the nodes to train", 300.0)
            for repeat in range(args.repeats):
                for kind in ("forged", "valid"):
                    # A fresh insider (certificate) each time: the one before is banned.
                    name = f"insider-{repeat}-{kind}"
                    issue_node(workdir / "ca", workdir / name, name)
                    insider = Insider(workdir / name)
                    insiders.append(insider)
                    await insider.serve()
                    await insider.join(attacked)
                    quiet = await rates(transport, attacked, pid, args.seconds, None)
                    flood = asyncio.create_task(insider.flood([attacked], args.seconds, kind))
                    loud = await rates(transport, attacked, pid, args.seconds, flood)
                    rows.append((repeat, kind, quiet, loud, flood.result(), dict(insider.counts)))
        finally:
            for insider in insiders:
                await insider.close()
            await transport.close(0)
            for p in procs:
                await p.stop(30)
    print(
        "| repeat | flood | records sent | steps/s quiet | steps/s flood | ratio | rounds/s "
        "quiet | rounds/s flood | ratio | node CPU quiet | node CPU flood | slowest Status | "
        "refused under flood |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for repeat, kind, quiet, loud, sent, _ in rows:
        print(
            f"| {repeat} | {kind} | {sent} | {quiet.steps_per_s:.1f} | "
            f"{loud.steps_per_s:.1f} | {loud.steps_per_s / quiet.steps_per_s:.3f} | "
            f"{quiet.rounds_per_s:.1f} | {loud.rounds_per_s:.1f} | "
            f"{loud.rounds_per_s / max(quiet.rounds_per_s, 1e-9):.3f} | "
            f"{100 * quiet.cpu:.0f}% | {100 * loud.cpu:.0f}% | "
            f"{loud.slowest_status_s:.2f} s | {json.dumps(loud.rejected)} |"
        )
    for repeat, kind, _, _, _, counts in rows:
        print(f"insider {repeat} {kind}: {json.dumps(counts)}")


if __name__ == "__main__":
    asyncio.run(main())
