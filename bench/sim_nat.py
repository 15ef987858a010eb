"""What nodes behind NAT cost a large swarm, in the simulator (node/sim/nat.py, issue 16).

    python -m bench.sim_nat [--sizes 1024] [--shares 0 0.5 0.9] [--topology exponential]
        [--duration 4] [--train]

Each run is bench/sim_scaling.py's swarm (logistic, int8, degree 4, links of 10-50 ms and
10 Mbit/s, every node from a model of its own) with a share of the nodes behind NAT: they name
two relays, the topology gives them only neighbours others can dial, and every membership
message for them from a member without a session to them goes through a relay. By default
gossip alone (a round every 0.1 s, no training), so that the rounds to consensus are the
mixing's own; ``--train`` trains as well.

Measured, beside the run with everyone reachable: rounds until the consensus distance fell
100x and 10⁴x, gossip and membership bytes per node, and the membership bytes relays passed
on, per node and per reachable node (who carries them), and of what was relayed for a node, the
share its busiest relay carried (1.0 if one relay carried all).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from typing import Any

from bench.sim_common import rounds_to, run_child, run_here
from bench.sim_scaling import config

HEADER = (
    "| topology | N | behind NAT | rounds to CD/100 | vs all | rounds to CD/10⁴ | vs all | "
    "gossip KiB / node | membership KiB / node | relayed KiB / node | "
    "relayed KiB / reachable node | busiest relay's share | rounds | wall s |\n"
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def row(n: int, topology: str, share: float, r: dict[str, Any], base: dict[str, Any] | None) -> str:
    samples = r["samples"]
    last = samples[-1]

    def rounds(factor: float) -> tuple[str, str]:
        got = rounds_to(samples, factor)
        ref = rounds_to(base["samples"], factor) if base is not None else None
        ratio = f"{got / ref:.2f}" if got is not None and ref else "—"
        return ("—" if got is None else f"{got:.0f}"), ratio

    r100, v100 = rounds(1e2)
    r10k, v10k = rounds(1e4)
    reachable = max(1, n - last["behind_nat"])
    relayed = last["relayed_bytes_per_node"]
    return (
        f"| {topology} | {n} | {share:.0%} | {r100} | {v100} | {r10k} | {v10k} | "
        f"{last['bytes_per_node'] / 1024:.0f} | {last['swim_bytes_per_node'] / 1024:.1f} | "
        f"{relayed / 1024:.1f} | {relayed * n / reachable / 1024:.1f} | "
        f"{last.get('busiest_relay_share', 0.0):.2f} | "
        f"{last['rounds_per_node']:.0f} | {r['wall_s']:.0f} |"
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", type=int, nargs="+", default=[1024])
    p.add_argument("--shares", type=float, nargs="+", default=[0.0, 0.5, 0.9])
    p.add_argument("--topology", default="exponential")
    p.add_argument("--duration", type=float, default=4.0)
    p.add_argument("--train", action="store_true", help="train as well (default: gossip alone)")
    p.add_argument("--one", nargs=5, metavar=("N", "TOPOLOGY", "DURATION", "TRAIN", "SHARE"))
    args = p.parse_args()
    if args.one:
        n, topology, duration, train, share = args.one
        cfg = config(int(n), topology, float(duration), gossip_only=train != "1")
        cfg = dataclasses.replace(cfg, net=dataclasses.replace(cfg.net, behind_nat=float(share)))
        print(json.dumps(run_here(cfg)))
        return
    started = time.perf_counter()
    print(HEADER, flush=True)
    for n in args.sizes:
        base = None
        for share in args.shares:
            one = [str(n), args.topology, str(args.duration), "1" if args.train else "0"]
            r = run_child("bench.sim_nat", [*one, str(share)])
            if share == 0:
                base = r
            print(row(n, args.topology, share, r, base), flush=True)
    print(f"\ntotal wall {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
