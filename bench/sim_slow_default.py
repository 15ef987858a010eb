"""The default codec on slow links, against each codec picked by hand (issue 17).

    python -m bench.sim_slow_default [--nodes 4] [--duration 30] [--rate 20] [--delay 0.01]
        [--codecs auto,fp16,int8,int4,sign] [--jobs 2]

The issue's slow-link case in the daemon's simulator: every node's uplink ``--rate`` Mbit/s,
``--delay`` seconds one way, the 1.1M-parameter MLP on digits (bench/wide_task.py), non-iid
shards, one starting model (as joiners pull it), a local step every 20 ms, the defaults
otherwise (``--pace node``, the exponential graph, event-triggered rounds). Each codec runs in a
process of its own, ``--jobs`` at a time; times are simulated seconds, sampled every 0.5 s. The
table: seconds until the averaged model and the worst node reached 0.95, the worst node's
accuracy at the end, MB a node sent (deltas and snapshots, as the daemon counts them) and its
share of what the uplink could carry in the run, rounds a node made, and for ``auto`` the codec
each node's rounds ended on. A codec may end in ``/RATE``: its nodes run with
``--max-upload-rate RATE`` (bytes a second), e.g. ``sign/1250000`` for half of a 20 Mbit/s link;
and a codec may name its consensus step size: ``sign@0.3`` (``--gamma``).
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor

import torch

from node.config import GossipConfig
from node.sim import NetConfig, SimConfig, Simulation

HEADER = (
    "| codec | avg to 0.95 s | worst to 0.95 s | worst at end | MB/node | link share "
    "| rounds/node | ended on | wall s |\n|---|---:|---:|---:|---:|---:|---:|---|---:|"
)


def _secs(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def run(system: str, args: argparse.Namespace) -> str:
    torch.set_num_threads(1)
    rate = args.rate * 1e6 / 8
    spec, _, cap = system.partition("/")
    codec, _, gamma = spec.partition("@")
    cfg = SimConfig(
        nodes=args.nodes,
        task="bench.wide_task:make_task",
        seed=args.seed,
        duration_s=args.duration,
        eval_every_s=0.5,
        target_accuracy=0.95,
        step_time_s=0.02,
        gossip=GossipConfig(
            codec=codec,
            gamma=float(gamma) if gamma else None,
            max_upload_rate=float(cap) if cap else None,
        ),
        net=NetConfig(latency_s=(args.delay, args.delay), bandwidth_bps=rate),
    )
    began = time.perf_counter()
    sim = Simulation(cfg)
    s = sim.run()
    ended = Counter(n.state.codec_for("").name for n in sim.nodes.values())
    shown = ", ".join(f"{c} {k}" for c, k in sorted(ended.items())) if codec == "auto" else ""
    sent = s.bytes_per_node
    return (
        f"| {system} | {_secs(s.target_avg_s)} | {_secs(s.target_worst_s)} | "
        f"{s.final.worst_accuracy:.3f} | {sent / 1e6:.1f} | {sent / (rate * args.duration):.2f} | "
        f"{s.final.rounds_per_node:.0f} | {shown} | {time.perf_counter() - began:.0f} |"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--duration", type=float, default=30.0, help="simulated seconds")
    p.add_argument("--rate", type=float, default=20.0, help="uplink Mbit/s")
    p.add_argument("--delay", type=float, default=0.01, help="one-way delay, seconds")
    p.add_argument("--codecs", default="auto,fp16,int8,int4,sign")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=2)
    args = p.parse_args()
    codecs = args.codecs.split(",")
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(run, codecs, [args] * len(codecs)))
    print(
        f"{args.nodes} nodes, {args.rate:g} Mbit/s + {args.delay * 1e3:g} ms, {args.duration:g} s"
    )
    print(HEADER)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
