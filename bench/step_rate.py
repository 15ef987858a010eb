"""Per-node step rate with gossip on, as a ratio to the same nodes with gossip off, same run.

    python -m bench.step_rate [--nodes 4] [--steps 1500] [--task digits] [--compress int8]

Both halves start the same number of real node processes on this machine, so they compete for
the same cores: with gossip off every node trains alone (no join); with gossip on they form a
swarm over gRPC on loopback. A node's step rate is its training steps over the wall time of its
training (``samples_per_s`` / batch size, from the summary it writes when stopped).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import tempfile
import time
from pathlib import Path

from node.config import GossipConfig
from node.swarm import NodeProcess, SwarmConfig, node_argv
from node.tasks import Shard, load_task
from node.transport.base import Rejected, Unreachable
from node.transport.grpc import GrpcTransport


async def run_nodes(cfg: SwarmConfig, workdir: Path, gossip: bool) -> list[dict[str, float]]:
    procs = [NodeProcess(i, workdir / f"node-{i}") for i in range(cfg.nodes)]
    transport = GrpcTransport()
    try:
        await procs[0].start(
            node_argv(cfg, 0, procs[0].state_dir, None, None if gossip else 1), 120
        )
        join = procs[0].address if gossip else None
        await asyncio.gather(
            *(
                p.start(node_argv(cfg, p.index, p.state_dir, join, None if gossip else 1), 120)
                for p in procs[1:]
            )
        )
        while True:  # a benchmark may poll: nothing here is asserted on timing
            done = 0
            for p in procs:
                with contextlib.suppress(Unreachable, Rejected):
                    done += (await transport.call_status(p.address, 5)).training_done
            if done == len(procs):
                break
            await asyncio.sleep(0.5)
    finally:
        await asyncio.gather(*(p.stop(60) for p in procs))
        await transport.close(0)
    out = []
    for p in procs:
        summary = json.loads((p.state_dir / "summary.json").read_text())
        out.append({"samples_per_s": summary["samples_per_s"], "rounds": summary["rounds"]})
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--task", default="digits")
    parser.add_argument("--compress", default="int8")
    args = parser.parse_args()
    cfg = SwarmConfig(
        nodes=args.nodes,
        steps=args.steps,
        task=args.task,
        eval_every=10**9,
        gossip=GossipConfig(codec=args.compress),
        insecure=True,  # the cost of TLS is measured on its own
    )
    batch = load_task(args.task)(Shard()).batch_size
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        off = await run_nodes(cfg, Path(tmp) / "off", gossip=False)
        on = await run_nodes(cfg, Path(tmp) / "on", gossip=True)
        wall = time.monotonic() - t0
    rate_off = [r["samples_per_s"] / batch for r in off]
    rate_on = [r["samples_per_s"] / batch for r in on]
    ratio = statistics.mean(rate_on) / statistics.mean(rate_off)
    rounds = statistics.mean(r["rounds"] for r in on)
    print(
        f"# {args.nodes} nodes x {args.steps} steps, task {args.task}, codec {args.compress} "
        f"({wall:.0f} s in all)"
    )
    print("| gossip | steps/s per node (mean) | min | max | rounds per node |")
    print("|---|---:|---:|---:|---:|")
    print(
        f"| off | {statistics.mean(rate_off):.1f} | {min(rate_off):.1f} | {max(rate_off):.1f} | 0 |"
    )
    print(
        f"| on | {statistics.mean(rate_on):.1f} | {min(rate_on):.1f} | {max(rate_on):.1f} | "
        f"{rounds:.0f} |"
    )
    print(f"\nstep rate with gossip on / off: {ratio:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
