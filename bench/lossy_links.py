"""Lossy links: gossip rounds and training steps per second, clean against packet loss with delay
on every link, six real nodes over mutual TLS, one per network namespace.

    .venv/bin/python -m bench.lossy_links [--nodes 6] [--delay-ms 40] [--losses 0.05,0.1,0.2]
        [--window 15] [--settle 3] [--method auto]

Needs root. One swarm runs through the phases in turn: for each loss, clean links and then that
loss with the delay on every link, each way (tests/impair.py: netem where the kernel has it,
else iptables and an NFQUEUE delay worker), each measured over ``--window`` seconds after
``--settle``. Each lossy phase's ratios are against the clean phase just before it, so that the
load of a shared machine, which moves over minutes, weighs on both alike. Members seen dead by
anyone are counted per phase (each should be 0: no one is).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
import time
from pathlib import Path

from node.cli.swarm import SwarmConfig
from node.config import GossipConfig
from tests.e2e.netswarm import NetSwarm, Rates
from tests.impair import Impairment
from tests.netns import Testnet

PREFIX, SUBNET = "lossyb", "10.79.42"


async def run(args: argparse.Namespace) -> None:
    cfg = SwarmConfig(
        nodes=args.nodes,
        steps=10**7,  # trains until the bench stops it
        alpha=0.5,
        eval_every=10**7,  # no evaluations: they would take the cores the rates are made on
        gossip=GossipConfig(codec="int8"),
    )
    delay_s = args.delay_ms / 1000
    phases = [p for loss in args.losses for p in ((0.0, 0.0), (loss, delay_s))]
    results: list[tuple[float, float, Rates, int]] = []
    t0 = time.monotonic()
    with (
        Testnet(PREFIX, args.nodes, SUBNET) as net,
        Impairment(net, args.method) as links,
        tempfile.TemporaryDirectory() as tmp,
    ):
        swarm = NetSwarm(net, cfg, Path(tmp))
        try:
            await swarm.start()
            swarm.watch()
            for loss, delay in phases:
                links.set(loss, delay)
                await asyncio.sleep(args.settle)  # TCP and the links find the new pace
                seen = len(swarm.deaths)
                rates = await swarm.rates(args.window)
                links.check()
                results.append((loss, delay, rates, len(swarm.deaths) - seen))
                print(
                    f"loss {loss:g} delay {delay * 1e3:g} ms: {rates.rounds_per_s:.2f} rounds/s, "
                    f"{rates.steps_per_s:.1f} steps/s per node",
                    flush=True,
                )
        finally:
            codes = await swarm.stop()
    wall = time.monotonic() - t0
    print(
        f"\n# {args.nodes} nodes, digits, int8, mutual TLS, one namespace each; links impaired by "
        f"{links.method}; window {args.window:g} s after {args.settle:g} s; "
        f"load {os.getloadavg()[0]:.1f} at the end; {wall:.0f} s in all; exit codes {codes}"
    )
    print(
        "| loss each way | delay each way | rounds/s per node | vs clean before | "
        "steps/s per node | vs clean before | new deaths seen |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    base = results[0][2]
    for loss, delay, r, deaths in results:
        if loss == 0:
            base = r
        print(
            f"| {loss * 100:g}% | {delay * 1e3:g} ms | {r.rounds_per_s:.2f} | "
            f"{r.rounds_per_s / base.rounds_per_s:.2f} | {r.steps_per_s:.1f} | "
            f"{r.steps_per_s / base.steps_per_s:.2f} | {deaths} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=6)
    parser.add_argument("--delay-ms", type=float, default=40.0)
    parser.add_argument(
        "--losses", type=lambda s: [float(x) for x in s.split(",")], default=[0.05, 0.1, 0.2]
    )
    parser.add_argument("--window", type=float, default=15.0)
    parser.add_argument("--settle", type=float, default=3.0)
    parser.add_argument("--method", default="auto", choices=["auto", "netem", "nfqueue"])
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run(args))


if __name__ == "__main__":
    main()
