"""Per-node step rate with gossip on, as a ratio to the same nodes with gossip off, same run.

    python -m bench.step_rate [--nodes 4] [--steps 1500] [--task digits] [--compress int8]
        [--step-time SECONDS] [--local-steps H]

Both halves start the same number of real node processes on this machine, so they compete for
the same cores: with gossip off every node trains alone (no join); with gossip on they form a
swarm over gRPC on loopback. A node's step rate is its training steps over the wall time of its
training (``samples_per_s`` / batch size, from the summary it writes when stopped).

Without ``--step-time`` every node trains flat out, so the nodes share this machine's cores and
whatever CPU gossip uses comes out of training. With it each node emulates a device of that pace
(``murmur run --step-time``), the case of separate devices whose network work runs in the time a
step leaves over: what overlap of gossip with training means there.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from bench.swarms import train_to_the_end
from node.cli.swarm import SwarmConfig
from node.config import GossipConfig
from node.tasks import Shard, load_task


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--task", default="digits")
    parser.add_argument("--compress", default="int8")
    parser.add_argument("--step-time", type=float, default=0.0)
    parser.add_argument("--local-steps", type=int, default=1)
    args = parser.parse_args()
    cfg = SwarmConfig(
        nodes=args.nodes,
        steps=args.steps,
        task=args.task,
        eval_every=10**9,
        step_time=args.step_time,
        gossip=GossipConfig(codec=args.compress, local_steps=args.local_steps),
        insecure=True,  # the cost of TLS is measured on its own
    )
    batch = load_task(args.task)(Shard()).batch_size
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        off = await train_to_the_end(cfg, Path(tmp) / "off", together=False)
        on = await train_to_the_end(cfg, Path(tmp) / "on", together=True)
        wall = time.monotonic() - t0
    rate_off = [r["samples_per_s"] / batch for r in off]
    rate_on = [r["samples_per_s"] / batch for r in on]
    ratio = statistics.mean(rate_on) / statistics.mean(rate_off)
    rounds = statistics.mean(r["rounds"] for r in on)
    print(
        f"# {args.nodes} nodes x {args.steps} steps, task {args.task}, codec {args.compress}, "
        f"step time {args.step_time * 1000:.0f} ms, H={args.local_steps} "
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
