"""Slow links on the text task: time for the worst node to reach a target eval loss, murmur's
codecs against all-reduce, every node in its own network namespace behind a shaped link.

    .venv/bin/python -m bench.text_links [--nodes 4] [--rate 20mbit] [--target 3.0]
        [--limit 240] [--systems int8,sign,all-reduce] [--name tasks] [--subnet 10.78.0]
        [--task text:size=1m,seq_len=64,batch_size=8,warmup=20,eval_windows=16]

Needs root. The network is bench/testnet.py's (a bridge, a namespace per node, both
directions of each link shaped by ``scripts/shape-link``), with everything named ``--name``-*,
so that it runs beside other benches' namespaces. On a kernel without netem tbf applies the
rate and the delay goes in user space (see bench/testnet.py); the table says which. murmur
nodes write a checkpoint every ``--poll`` seconds; the bench evaluates every node's latest one
and records the worst (highest) eval loss; the all-reduce workers hold one model and evaluate
it every ``--ar-eval-every`` steps. Bytes per node: the node's own count, and the bridge side
of its link.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import torch

from bench.allreduce import AllReduceConfig, run_allreduce
from bench.swarms import start_swarm
from bench.testnet import Testnet
from node.cli.swarm import NodeProcess, SwarmConfig
from node.config import GossipConfig
from node.daemon.checkpoint import CHECKPOINT_FILE, load_checkpoint
from node.tasks import Shard, load_task
from node.tasks.base import evaluate_task

TASK = "text:size=1m,seq_len=64,batch_size=8,warmup=20,eval_windows=16"


class WorstNode:
    """Evaluates every node's latest checkpoint; the worst one's eval loss."""

    def __init__(self, dirs: list[Path], task: str) -> None:
        self.dirs = dirs
        torch.manual_seed(0)
        self.task = load_task(task)(Shard())

    def worst_loss(self) -> float | None:
        losses = []
        for d in self.dirs:
            try:
                state = dict(load_checkpoint(d / CHECKPOINT_FILE).model)
            except (OSError, ValueError):
                return None  # not written yet, or being replaced right now
            self.task.model.load_state_dict(state)
            losses.append(evaluate_task(self.task, torch.device("cpu"))[0])
        return max(losses)


async def murmur_run(
    net: Testnet, codec: str, args: argparse.Namespace, workdir: Path
) -> dict[str, Any]:
    cfg = SwarmConfig(
        nodes=net.n,
        steps=10**7,  # trains until the bench stops it
        task=args.task,
        alpha=None,
        eval_every=10**7,  # the bench evaluates the checkpoints instead
        gossip=GossipConfig(codec=codec),
        insecure=True,
    )

    def hook(i: int, argv: list[str]) -> list[str]:
        argv = list(argv)
        argv[argv.index("--listen") + 1] = f"{net.address(i)}:7070"
        return [*net.exec_argv(i), *argv, "--checkpoint-interval", str(args.poll)]

    before = [net.sent_bytes(i) for i in range(net.n)]
    procs: list[NodeProcess] = await start_swarm(cfg, workdir, together=True, hook=hook)
    watcher = WorstNode([p.state_dir for p in procs], args.task)
    started = time.monotonic()
    reached, curve = None, []
    try:
        while time.monotonic() - started < args.limit:
            await asyncio.sleep(args.poll)  # checkpoints come every poll s: nothing to wait on
            loss = await asyncio.to_thread(watcher.worst_loss)
            if loss is None:
                continue
            t = time.monotonic() - started
            curve.append((round(t, 1), round(loss, 4)))
            if loss <= args.target:
                reached = t
                break
    finally:
        await asyncio.gather(*(p.stop(60) for p in procs))
    summaries = [json.loads((p.state_dir / "summary.json").read_text()) for p in procs]
    wire = [net.sent_bytes(i) - before[i] for i in range(net.n)]
    return {
        "reached_s": reached,
        "worst_loss": curve[-1][1] if curve else float("nan"),
        "steps": sum(s["step"] for s in summaries) / net.n,
        "rounds": sum(s["rounds"] for s in summaries) / net.n,
        "node_bytes": sum(s["bytes_sent"] for s in summaries) / net.n,
        "wire_bytes": sum(wire) / net.n,
        "curve": curve,
    }


async def allreduce_run(net: Testnet, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    cfg = AllReduceConfig(
        world=net.n,
        steps=10**7,
        task=args.task,
        alpha=None,
        eval_every=args.ar_eval_every,
        target=args.target,
        limit_s=args.limit,
    )
    before = [net.sent_bytes(i) for i in range(net.n)]
    results = await run_allreduce(
        cfg,
        workdir,
        master=f"{net.address(0)}:29500",
        prefix=net.exec_argv,
        env=lambda rank: {"GLOO_SOCKET_IFNAME": "eth0"},
        timeout_s=args.limit + 600,
    )
    wire = [net.sent_bytes(i) - before[i] for i in range(net.n)]
    evals = results[0]["evals"]
    hit = [e["t"] for e in evals if e["loss"] <= args.target]
    return {
        "reached_s": hit[0] if hit else None,
        "worst_loss": evals[-1]["loss"],
        "steps": results[0]["steps"],
        "rounds": results[0]["steps"],
        "node_bytes": sum(r["bytes_sent_model"] for r in results) / net.n,
        "wire_bytes": sum(wire) / net.n,
        "curve": [(round(e["t"], 1), round(e["loss"], 4)) for e in evals],
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--rate", default="20mbit")
    parser.add_argument("--delay", default="20ms")
    parser.add_argument("--loss", default="0")
    parser.add_argument("--target", type=float, default=3.0)
    parser.add_argument("--limit", type=float, default=240.0, help="seconds per system")
    parser.add_argument("--poll", type=float, default=10.0)
    parser.add_argument("--ar-eval-every", type=int, default=5)
    parser.add_argument("--systems", default="int8,sign,all-reduce")
    parser.add_argument("--task", default=TASK)
    parser.add_argument("--name", default="tasks", help="prefix of namespaces and interfaces")
    parser.add_argument("--subnet", default="10.78.0")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    results: dict[str, dict[str, Any]] = {}
    t0 = time.monotonic()
    net = Testnet(args.nodes, args.rate, args.delay, args.loss, name=args.name, subnet=args.subnet)
    import tempfile

    with net, tempfile.TemporaryDirectory() as tmp:
        print(f"links: {net.applied}", flush=True)
        for system in args.systems.split(","):
            workdir = Path(tmp) / system
            if system == "all-reduce":
                results[system] = await allreduce_run(net, args, workdir)
            else:
                results[system] = await murmur_run(net, system, args, workdir)
            r = results[system]
            print(f"{system}: reached {r['reached_s']} s, worst {r['worst_loss']}", flush=True)
    wall = time.monotonic() - t0
    lines = [
        f"{args.nodes} nodes, {args.task}, links: {net.applied}; target eval loss "
        f"{args.target} for the worst node, limit {args.limit:.0f} s ({wall:.0f} s in all)",
        "",
        "| system | time to target (s) | vs all-reduce | steps per node | rounds per node | "
        "MB sent per node (node's count) | MB per node (interface) | worst eval loss at the end |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = results.get("all-reduce", {}).get("reached_s")
    for system, r in results.items():
        reached = r["reached_s"]
        when = f"{reached:.0f}" if reached is not None else f"not in {args.limit:.0f}"
        ratio = f"{reached / base:.2f}" if reached is not None and base else "-"
        name = "all-reduce (fp32 gradients)" if system == "all-reduce" else f"murmur {system}"
        lines.append(
            f"| {name} | {when} | {ratio} | {r['steps']:.0f} | {r['rounds']:.0f} | "
            f"{r['node_bytes'] / 1e6:.1f} | {r['wire_bytes'] / 1e6:.1f} | {r['worst_loss']:.3f} |"
        )
    print("\n".join(lines))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"table": lines, "results": results}, indent=1))


if __name__ == "__main__":
    asyncio.run(main())
