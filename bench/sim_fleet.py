"""A fleet of devices in the simulator: a share on metered links with a byte budget, a share
paused at any moment (battery, heat, off AC), against the same swarm with neither (issue 17).

    python -m bench.sim_fleet [--nodes 256] [--duration 60] [--budgeted 0.2]
        [--budget 200kB/min] [--paused 0.3] [--pause-mean 20] [--step-time 0.02]
        [--topology auto] [--only fleet]

The swarm is ``murmur simulate``'s default (logistic, non-iid shards with alpha 0.5, int8, the
``auto`` graph, event-triggered rounds), one child process per run. Measured in each run:
when the averaged model and the worst node that is not paused reach the target, the final
accuracies, and what a node sends per day (the run's rate, times a day) for the budgeted
nodes and for the others. The two runs go in two child processes at once.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from bench.sim_common import run_child
from node.config import GossipConfig
from node.settings import parse_budget
from node.sim import SimConfig, Simulation

DAY_S = 86_400.0

HEADER = (
    "| run | N | budgeted | paused (mean) | avg to target s | worst to target s | "
    "final avg | final worst | MB/day budgeted node | MB/day other node | wall s |\n"
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def fleet_config(
    nodes: int,
    duration_s: float,
    budgeted: float,
    budget: str | None,
    paused: float,
    mean_s: float,
    step_s: float = 0.02,
    topology: str = "auto",
) -> SimConfig:
    spec = parse_budget(budget) if budget else None
    assert spec is None or isinstance(spec, tuple)
    gossip = GossipConfig(topology=topology, codec="int8", byte_budget=spec)
    return SimConfig(
        nodes=nodes,
        duration_s=duration_s,
        gossip=gossip,
        budgeted_fraction=budgeted if spec is not None else 1.0,
        paused_fraction=paused,
        pause_mean_s=mean_s,
        step_time_s=step_s,
    )


def run_one(cfg: SimConfig) -> dict[str, Any]:
    torch.set_num_threads(1)
    started = time.perf_counter()
    sim = Simulation(cfg)
    summary = sim.run()
    t = max(summary.final.t, 1e-9)
    budgeted = [n.counters.bytes_sent for n in sim.nodes.values() if n.budget is not None]
    others = [n.counters.bytes_sent for n in sim.nodes.values() if n.budget is None]

    def per_day(sent: list[int]) -> float | None:
        return sum(sent) / len(sent) / t * DAY_S if sent else None

    return {
        "summary": json.loads(summary.to_json()),
        "paused_mean": sum(s.paused for s in sim.samples) / len(sim.samples) / cfg.nodes,
        "budgeted_per_day": per_day(budgeted),
        "other_per_day": per_day(others),
        "budgeted": len(budgeted),
        "wall_s": time.perf_counter() - started,
    }


def row(name: str, n: int, r: dict[str, Any]) -> str:
    s = r["summary"]

    def secs(v: float | None) -> str:
        return "—" if v is None else f"{v:.1f}"

    def mb(v: float | None) -> str:
        return "—" if v is None else f"{v / 1e6:,.1f}"

    return (
        f"| {name} | {n} | {r['budgeted']} | {r['paused_mean']:.0%} | {secs(s['target_avg_s'])} | "
        f"{secs(s['target_worst_s'])} | {s['final']['avg_accuracy']:.3f} | "
        f"{s['final']['worst_accuracy']:.3f} | {mb(r['budgeted_per_day'])} | "
        f"{mb(r['other_per_day'])} | {r['wall_s']:.0f} |"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=256)
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--budgeted", type=float, default=0.2, help="share on metered links")
    p.add_argument("--budget", default="200kB/min", help="their byte budget")
    p.add_argument("--paused", type=float, default=0.3, help="share paused at any moment")
    p.add_argument("--pause-mean", type=float, default=20.0, help="mean pause, seconds")
    p.add_argument("--step-time", type=float, default=0.02, help="a device's step, seconds")
    p.add_argument("--topology", default="auto")
    p.add_argument("--only", choices=("neither", "fleet"), help="run only this one of the two")
    p.add_argument("--one", help=argparse.SUPPRESS)  # a child's run: the config as JSON
    args = p.parse_args()
    if args.one:
        given = json.loads(args.one)
        print(json.dumps(run_one(fleet_config(**given))))
        return
    print(HEADER, flush=True)
    plain = {"nodes": args.nodes, "duration_s": args.duration, "budgeted": 1.0, "budget": None}
    plain |= {"paused": 0.0, "mean_s": args.pause_mean, "step_s": args.step_time}
    plain |= {"topology": args.topology}
    fleet = plain | {"budgeted": args.budgeted, "budget": args.budget, "paused": args.paused}
    runs = {"neither": plain, "fleet": fleet}
    if args.only:
        runs = {args.only: runs[args.only]}
    with ThreadPoolExecutor(len(runs)) as pool:
        done = {
            k: pool.submit(run_child, "bench.sim_fleet", [json.dumps(v)], 4 * 3600)
            for k, v in runs.items()
        }
        for name, future in done.items():
            print(row(name, args.nodes, future.result()), flush=True)


if __name__ == "__main__":
    main()
