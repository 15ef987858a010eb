"""Slow links: how soon the averaged model reaches a target, murmur (int8, 1-bit, fp32) against
the all-reduce baseline, every node in its own network namespace behind a shaped link.

    .venv/bin/python -m bench.slow_links [--nodes 4] [--rate 20mbit] [--delay 20ms] [--loss 0]
        [--target 0.9] [--limit 300] [--systems int8,sign,fp32,all-reduce] [--window S]

With ``--window S`` a murmur system runs S seconds from the moment every node trains (its first
checkpoint: start-up, which model pulls and snapshots on slow links make long and uneven, is
left out), and a second table gives, over that window: the seconds until the averaged model
and until the worst node reached the target (the issue-17 measure), the worst node's accuracy
and the nodes' relative distance at the first read after it, and the bytes each node put on its
link in it. Checkpoints are read one after the other, so the times are as fine as a read of all
of them (a few seconds on a busy machine): a time past the window is that first read's.

A murmur system is ``CODEC`` (the static exponential graph, one public copy), or ``CODEC@GRAPH``
with a copy per link (``--pace link``): ``int8@link`` on the static exponential graph,
``int8@one-peer-exponential`` or ``int8@epidemic`` for a time-varying schedule over its links.
Either may end in ``/RATE``: the nodes run with ``--max-upload-rate RATE`` (bytes a second),
``auto/1250000`` for half of a 20 Mbit/s link.

``hivemind`` (or ``hivemind/SAMPLES``) runs the peer system users would pick instead on the
same task, shards and links: one hivemind peer a namespace (bench/hivemind_peer.py, local
updates, parameters averaged in 8 bits every SAMPLES samples of the swarm, 4096 by default),
under the Python of ``--hivemind-python`` (``make hivemind-env`` makes it). It runs for
``--window`` seconds from the moment every peer trains. Its peers evaluate their own models
every second: its time to target in the first table is the worst peer's, its "averaged"
accuracy the peers' mean, its rounds its epochs (one averaging each), and the node's count of
bytes is left empty (the interface's is there).

Needs root: the network is bench/testnet.py's (a namespace per node on one bridge, both
directions of every link shaped; the delay and loss in user space where the kernel has no
netem), named ``mmb-*``. The table's title says how the links were shaped.

The task is the wide MLP on digits (bench/wide_task.py, about 1.1M parameters), so that a model
on the wire takes seconds at edge rates. murmur nodes write a checkpoint every ``--poll`` seconds;
the bench averages the latest ones and evaluates that model, which gives the averaged model's
accuracy over time. The all-reduce workers hold one model and evaluate it every other step. Bytes
per node are counted twice: by the node (model bytes it sent) and outside it, on the bridge side
of its link (everything it put on the wire: gossip, membership, gRPC framing, TCP/IP headers).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.allreduce import AllReduceConfig, run_allreduce
from bench.hivemind_peer import PYTHON as HIVEMIND_PYTHON
from bench.hivemind_peer import run_hivemind
from bench.swarms import start_swarm
from bench.testnet import Testnet
from node.cli.evaluation import average_states
from node.cli.swarm import NodeProcess, SwarmConfig
from node.config import GossipConfig
from node.daemon.checkpoint import CHECKPOINT_FILE, load_checkpoint
from node.tasks import Shard, load_task
from node.tasks.base import evaluate

TASK = "bench.wide_task:make_task"


class AveragedModel:
    """Evaluates the average of the nodes' latest checkpoints."""

    def __init__(self, dirs: list[Path]) -> None:
        self.dirs = dirs
        self.task = _task()

    def accuracy(self) -> float | None:
        read = self.read()
        return None if read is None else read[0]

    def read(self) -> tuple[float, float, float] | None:
        """The averaged model's accuracy, the worst node's, and the nodes' relative distance
        (Σ||x_i - x̄||² / n||x̄||²); None until every node has a checkpoint."""
        paths = [d / CHECKPOINT_FILE for d in self.dirs]
        if not all(p.exists() for p in paths):
            return None
        states = []
        for p in paths:
            try:
                states.append(dict(load_checkpoint(p).model))
            except (OSError, ValueError, RuntimeError):
                # The checkpoint appears, or is replaced, between our exists() and our read
                # (safetensors says so with a RuntimeError).
                return None
        mean = average_states(states)
        accuracies = []
        for state in [*states, mean]:
            self.task.model.load_state_dict(state)
            _, acc = evaluate(self.task.model, self.task.eval, self.task.loss, torch.device("cpu"))
            accuracies.append(acc)
        flat = [torch.cat([s[k].double().flatten() for k in mean]) for s in states]
        centre = torch.stack(flat).mean(0)
        spread = sum(float((f - centre).pow(2).sum()) for f in flat) / len(flat)
        return accuracies[-1], min(accuracies[:-1]), spread / float(centre.pow(2).sum())


def _close_window(window: dict[str, Any], net: Testnet) -> None:
    wire = [net.sent_bytes(i) - b for i, b in enumerate(window["wire0"])]
    window["wire_bytes"] = sum(wire) / net.n


def _task() -> Any:
    torch.manual_seed(0)
    return load_task(TASK)(Shard())


def murmur_gossip(system: str) -> GossipConfig:
    """``CODEC``, ``CODEC@GRAPH`` or either with ``/RATE`` (see the module's docstring) as the
    nodes' gossip settings."""
    system, _, cap = system.partition("/")
    rate = float(cap) if cap else None
    codec, _, graph = system.partition("@")
    if not graph:
        return GossipConfig(codec=codec, max_upload_rate=rate)
    topology = "exponential" if graph == "link" else graph
    return GossipConfig(codec=codec, topology=topology, pace="link", max_upload_rate=rate)


async def murmur_run(
    net: Testnet,
    system: str,
    target: float,
    limit_s: float,
    poll_s: float,
    workdir: Path,
    window_s: float | None = None,
) -> dict[str, Any]:
    cfg = SwarmConfig(
        nodes=net.n,
        steps=10**7,  # trains until the bench stops it
        task=TASK,
        alpha=0.5,
        eval_every=10**7,  # the bench evaluates the averaged model instead
        gossip=murmur_gossip(system),
        insecure=True,  # plain TCP, so the interface counts compare with the node's own
    )

    def hook(i: int, argv: list[str]) -> list[str]:
        argv = list(argv)
        argv[argv.index("--listen") + 1] = f"{net.address(i)}:7070"
        return [*net.exec_argv(i), *argv, "--checkpoint-interval", str(poll_s)]

    before = [net.sent_bytes(i) for i in range(net.n)]
    # Start-up on slow links (model pulls from the first node, a snapshot per link) takes
    # from seconds to minutes; the limit bounds it too.
    procs: list[NodeProcess] = await start_swarm(
        cfg, workdir, together=True, hook=hook, start_timeout_s=limit_s
    )
    watcher = AveragedModel([p.state_dir for p in procs])
    started = time.monotonic()
    reached, curve = None, []
    window: dict[str, Any] = {}
    try:
        while time.monotonic() - started < limit_s:
            await asyncio.sleep(poll_s)  # checkpoints come every poll_s: nothing to wait on
            read = await asyncio.to_thread(watcher.read)
            if read is None:
                continue
            acc, worst, distance = read
            t = time.monotonic() - started
            curve.append((round(t, 1), round(acc, 4)))
            if acc >= target and reached is None:
                reached = t
            if window_s is None:
                if reached is not None:
                    break
                continue
            if not window:  # every node trains: the window opens
                window = {"t0": t, "wire0": [net.sent_bytes(i) for i in range(net.n)]}
                # The bytes are read when the window closes, not at the next poll: on a busy
                # machine evaluating every node's checkpoint takes seconds.
                asyncio.get_running_loop().call_later(window_s, _close_window, window, net)
            if reached is not None and "target_s" not in window:
                window["target_s"] = t - window["t0"]
            if worst >= target and "worst_target_s" not in window:
                window["worst_target_s"] = t - window["t0"]
            window.update(worst=worst, distance=distance, acc=acc)
            if "wire_bytes" in window:
                window["last_read_s"] = t - window["t0"]
                break
    finally:
        await asyncio.gather(*(p.stop(60) for p in procs))
    summaries = [json.loads((p.state_dir / "summary.json").read_text()) for p in procs]
    wire = [net.sent_bytes(i) - before[i] for i in range(net.n)]
    return {
        "reached_s": reached,
        "accuracy": curve[-1][1] if curve else float("nan"),
        "steps": sum(s["step"] for s in summaries) / net.n,
        "rounds": sum(s["rounds"] for s in summaries) / net.n,
        "node_bytes": sum(s["bytes_sent"] for s in summaries) / net.n,
        "wire_bytes": sum(wire) / net.n,
        "curve": curve,
        "window": window,
    }


async def allreduce_run(
    net: Testnet, target: float, limit_s: float, workdir: Path
) -> dict[str, Any]:
    cfg = AllReduceConfig(
        world=net.n, steps=10**7, task=TASK, alpha=0.5, eval_every=2, target=target, limit_s=limit_s
    )
    before = [net.sent_bytes(i) for i in range(net.n)]
    results = await run_allreduce(
        cfg,
        workdir,
        master=f"{net.address(0)}:29500",
        prefix=net.exec_argv,
        env=lambda rank: {"GLOO_SOCKET_IFNAME": "eth0"},
        timeout_s=limit_s + 300,
    )
    wire = [net.sent_bytes(i) - before[i] for i in range(net.n)]
    evals = results[0]["evals"]
    hit = [e["t"] for e in evals if e["accuracy"] >= target]
    return {
        "reached_s": hit[0] if hit else None,
        "accuracy": evals[-1]["accuracy"],
        "steps": results[0]["steps"],
        "rounds": results[0]["steps"],
        "node_bytes": sum(r["bytes_sent_model"] for r in results) / net.n,
        "wire_bytes": sum(wire) / net.n,
        "curve": [(round(e["t"], 1), round(e["accuracy"], 4)) for e in evals],
    }


def _name(system: str) -> str:
    return system if system.startswith("hivemind") else f"murmur {system}"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--rate", default="20mbit")
    parser.add_argument("--delay", default="20ms")
    parser.add_argument("--loss", default="0")
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--limit", type=float, default=300.0, help="seconds per system")
    parser.add_argument("--poll", type=float, default=2.0)
    parser.add_argument("--systems", default="int8,sign,fp32,all-reduce")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--window", type=float, help="seconds each murmur system runs once every node trains"
    )
    parser.add_argument("--hivemind-python", type=Path, default=HIVEMIND_PYTHON)
    args = parser.parse_args()
    results: dict[str, dict[str, Any]] = {}
    t0 = time.monotonic()
    net = Testnet(args.nodes, args.rate, args.delay, args.loss)
    with net, tempfile.TemporaryDirectory() as tmp:
        print(f"links: {net.applied}", flush=True)
        for system in args.systems.split(","):
            workdir = Path(tmp) / system
            if system == "all-reduce":
                results[system] = await allreduce_run(net, args.target, args.limit, workdir)
            elif system.startswith("hivemind"):
                batch = int(system.partition("/")[2] or 4096)
                results[system] = await run_hivemind(
                    net,
                    batch,
                    args.target,
                    args.window or args.limit,
                    args.limit,
                    workdir,
                    args.hivemind_python,
                )
            else:
                results[system] = await murmur_run(
                    net, system, args.target, args.limit, args.poll, workdir, args.window
                )
            r = results[system]
            print(f"{system}: reached {r['reached_s']} s, accuracy {r['accuracy']}", flush=True)
    wall = time.monotonic() - t0
    print(
        f"\n# {args.nodes} nodes, wide MLP (1.1M parameters), links: {net.applied}; "
        f"target {args.target} for the averaged model, limit {args.limit:.0f} s "
        f"({wall:.0f} s in all)"
    )
    print(
        "| system | time to target (s) | vs all-reduce | steps per node | rounds per node | "
        "MB sent per node (node's count) | MB per node (interface) | accuracy at the end |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    base = results.get("all-reduce", {}).get("reached_s")
    for system, r in results.items():
        reached = r["reached_s"]
        when = f"{reached:.0f}" if reached is not None else f"not in {args.limit:.0f}"
        ratio = f"{reached / base:.2f}" if reached is not None and base else "-"
        name = "all-reduce (fp32 gradients)" if system == "all-reduce" else _name(system)
        print(
            f"| {name} | {when} | {ratio} | {r['steps']:.0f} | {r['rounds']:.0f} | "
            f"{r['node_bytes'] / 1e6:.1f} | {r['wire_bytes'] / 1e6:.1f} | {r['accuracy']:.3f} |"
        )
    if args.window is not None:
        print(
            f"\n# the {args.window:.0f} s after every node trains (first checkpoint of all)\n"
            "| system | target s (averaged / worst node) | accuracy (averaged / worst node) | "
            "relative distance | MB per node (interface) |\n|---|---:|---:|---:|---:|"
        )
        for system, r in results.items():
            w = r.get("window") or {}
            if "wire_bytes" not in w:
                continue  # all-reduce, or a murmur run that never had every node train
            when = " / ".join(
                f"{w[key]:.0f}" if key in w else "-" for key in ("target_s", "worst_target_s")
            )
            print(
                f"| {_name(system)} | {when} | {w['acc']:.3f} / {w['worst']:.3f} | "
                f"{w['distance']:.2g} | {w['wire_bytes'] / 1e6:.1f} |"
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
