"""The event-triggered rule (gossip/trigger.py) against gossip on a timer (``--no-trigger``):
gossip bytes per node per minute once the swarm has converged and training has stopped, and
the time to target of the worst node while it trains; both settings in the same invocation.

    python -m bench.trigger_idle [--sim-nodes 16] [--procs 4] [--idle 60] [--codec int8]
        [--bandwidth BYTES_PER_S]

In the simulator (``murmur simulate``'s core) and with real node processes on loopback
(bench/swarms.py), the digits task, ``--codec`` (int8; ``auto`` is the default a user gets); in
the simulator every uplink carries ``--bandwidth`` bytes a second (the simulator's own default
without it). Bytes are the node's own gossip counter (deltas and
snapshots, as ``murmur status`` shows them), over ``--idle`` seconds that start ``--settle``
seconds after the last node's budget is spent; the time to target is, per node, the first
evaluation at or over ``--target`` accuracy, counted from the start of training.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.swarms import start_swarm
from node.cli.swarm import SwarmConfig, _poll
from node.config import GossipConfig
from node.sim import NetConfig, SimConfig, Simulation
from node.transport.grpc import GrpcTransport, GrpcTransportConfig


def gossip(trigger: bool, codec: str) -> GossipConfig:
    return GossipConfig(codec=codec, trigger=trigger)


def sim_run(args: argparse.Namespace, trigger: bool) -> dict[str, Any]:
    trained_s = args.steps * args.step_time
    start = trained_s + args.settle
    cfg = SimConfig(
        nodes=args.sim_nodes,
        task="digits",
        steps=args.steps,
        step_time_s=args.step_time,
        duration_s=start + args.idle,
        eval_every_s=0.5,
        target_accuracy=args.target,
        gossip=gossip(trigger, args.codec),
        net=NetConfig() if args.bandwidth is None else NetConfig(bandwidth_bps=args.bandwidth),
    )
    sim = Simulation(cfg)
    summary = sim.run()
    at = {round(s.t, 6): s for s in sim.samples}
    first, last = at[round(start, 6)], sim.samples[-1]
    per_min = (last.bytes_per_node - first.bytes_per_node) / (last.t - first.t) * 60
    rounds = (last.rounds_per_node - first.rounds_per_node) / (last.t - first.t) * 60
    return {
        "bytes_per_node_per_min": per_min,
        "rounds_per_node_per_min": rounds,
        "worst_target_s": summary.target_worst_s,
        "final_worst_accuracy": last.worst_accuracy,
        "final_relative_distance": last.relative_distance,
    }


def _eval_records(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record.get("event") in ("eval", "start"):
            out.append(record)
    return out


async def procs_run(args: argparse.Namespace, trigger: bool, workdir: Path) -> dict[str, Any]:
    cfg = SwarmConfig(
        nodes=args.procs,
        steps=args.steps,
        eval_every=20,
        step_time=args.step_time,
        gossip=gossip(trigger, args.codec),
        insecure=True,
        progress=False,
    )
    transport = GrpcTransport(GrpcTransportConfig())
    procs = await start_swarm(cfg, workdir, together=True)
    try:
        await asyncio.gather(*(p.trained.wait() for p in procs))
        await asyncio.sleep(args.settle)  # a benchmark's fixed window, not a wait for an event
        before = await _poll(transport, procs)
        t0 = time.monotonic()
        await asyncio.sleep(args.idle)
        after = await _poll(transport, procs)
        dt = time.monotonic() - t0
    finally:
        await asyncio.gather(*(p.stop(60) for p in procs))
        await transport.close(0)
    if any(s is None for s in before + after):
        raise RuntimeError("a node did not answer its status")
    sent = [a.bytes_sent - b.bytes_sent for a, b in zip(after, before, strict=True) if a and b]
    rounds = [a.rounds - b.rounds for a, b in zip(after, before, strict=True) if a and b]
    logs = [_eval_records(p.state_dir / "metrics.jsonl") for p in procs]
    # Training starts once every member is known: about when the last node started.
    began = max(r["time"] for records in logs for r in records if r["event"] == "start")
    reached: list[float | None] = []
    steps: list[int | None] = []
    for records in logs:
        hits = [
            r
            for r in records
            if r["event"] == "eval" and r["accuracy"] >= args.target and not r["after_budget"]
        ]
        reached.append(hits[0]["time"] - began if hits else None)
        steps.append(hits[0]["step"] if hits else None)
    return {
        "bytes_per_node_per_min": sum(sent) / len(sent) / dt * 60,
        "rounds_per_node_per_min": sum(rounds) / len(rounds) / dt * 60,
        "worst_target_s": None if None in reached else max(r for r in reached if r is not None),
        "targets_s": reached,
        "target_steps": steps,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sim-nodes", type=int, default=16)
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--step-time", type=float, default=0.02)
    parser.add_argument("--settle", type=float, default=20.0)
    parser.add_argument("--idle", type=float, default=60.0)
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--codec", default="int8")
    parser.add_argument("--bandwidth", type=float, help="the simulator's uplinks, bytes a second")
    parser.add_argument("--skip-sim", action="store_true")
    parser.add_argument("--skip-procs", action="store_true")
    args = parser.parse_args()
    results: dict[str, dict[str, Any]] = {}
    for trigger in () if args.skip_sim else (False, True):
        results[f"sim trigger={trigger}"] = sim_run(args, trigger)
        print(json.dumps({f"sim trigger={trigger}": results[f"sim trigger={trigger}"]}), flush=True)
    if not args.skip_procs:
        with tempfile.TemporaryDirectory() as tmp:
            for trigger in (False, True):
                key = f"procs trigger={trigger}"
                results[key] = await procs_run(args, trigger, Path(tmp) / key.replace(" ", "-"))
                print(json.dumps({key: results[key]}), flush=True)
    for where in ("sim", "procs"):
        off, on = results.get(f"{where} trigger=False"), results.get(f"{where} trigger=True")
        if off is None or on is None:
            continue
        ratio = on["bytes_per_node_per_min"] / off["bytes_per_node_per_min"]
        print(
            f"{where}: idle bytes/node/min off {off['bytes_per_node_per_min']:.0f}, "
            f"on {on['bytes_per_node_per_min']:.0f} ({ratio:.2%} of off); rounds/node/min "
            f"off {off['rounds_per_node_per_min']:.0f}, on {on['rounds_per_node_per_min']:.1f}; "
            f"worst node to {args.target} off {off['worst_target_s']} s, "
            f"on {on['worst_target_s']} s"
        )


if __name__ == "__main__":
    asyncio.run(main())
