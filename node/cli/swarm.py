"""``murmur swarm``: N real node processes on loopback, live progress, and a final report.

The first node starts alone; each of the others joins through one random earlier node, as a
user joins a running swarm through any peer's address, and membership gossip (SWIM) tells
everyone about everyone. Every node waits until it knows all N members before training,
trains its step budget, then keeps gossiping. Once every node has finished, the swarm lets each
do a few more rounds (``settle_rounds``; with the event-triggered rule a node that falls quiet
first counts as settled), stops them all with SIGTERM (each writes its final
checkpoint), and judges the checkpoints.

The config, the error and the node processes (``NodeProcess``, ``node_argv``, ``provision``)
are in node/cli/swarm_nodes.py; this module re-exports them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import random
import sys
import time
from pathlib import Path

from node.cli.evaluation import RunReport, evaluate_run, train_reference
from node.cli.report import write_report
from node.cli.swarm_nodes import NodeProcess, SwarmConfig, SwarmError, node_argv, provision
from node.cli.swarm_view import LiveView, progress_view
from node.daemon.statedir import METRICS_FILE
from node.telemetry.status import NodeStatus
from node.transport.base import Rejected, Unreachable
from node.transport.grpc import GrpcTransport, GrpcTransportConfig

__all__ = [
    "NodeProcess",
    "SwarmConfig",
    "SwarmError",
    "node_argv",
    "provision",
    "run_swarm",
]


async def _poll(transport: GrpcTransport, procs: list[NodeProcess]) -> list[NodeStatus | None]:
    async def one(p: NodeProcess) -> NodeStatus | None:
        try:
            return await transport.call_status(p.address, 5.0)
        except (Unreachable, Rejected):
            return None

    return list(await asyncio.gather(*(one(p) for p in procs)))


async def _supervise(cfg: SwarmConfig, procs: list[NodeProcess], transport: GrpcTransport) -> None:
    """Show progress until every node has trained and settled, or the duration is up."""
    progress = LiveView(cfg.progress)
    try:
        await _watch(cfg, procs, transport, progress)
    finally:
        progress.close()


async def _watch(
    cfg: SwarmConfig, procs: list[NodeProcess], transport: GrpcTransport, progress: LiveView
) -> None:
    started = time.monotonic()
    settle_from: dict[str, int] | None = None
    # With the trigger a settled node makes only heartbeats: quiet this long counts as settled.
    quiet_s = min(2.0, cfg.gossip.heartbeat_s / 2) if cfg.gossip.trigger else math.inf
    changed: dict[str, tuple[int, float]] = {}  # rounds, and when they last changed
    settled: set[str] = set()
    metric: str | None = None
    while True:
        metric = metric or _task_metric(procs[0].state_dir / METRICS_FILE)
        for p in procs:
            if p.exited:
                raise SwarmError(
                    f"node {p.index} exited early with {p.proc.returncode if p.proc else '?'}:\n"
                    + p.log_tail()
                )
        statuses = await _poll(transport, procs)
        elapsed = time.monotonic() - started
        finished = False
        known = [s for s in statuses if s is not None]
        if len(known) == len(procs) and all(s.training_done for s in known):
            rounds = {s.node_id: s.rounds for s in known}
            if settle_from is None:
                settle_from = rounds
            now = time.monotonic()
            for i, r in rounds.items():
                if changed.get(i, (None,))[0] != r:
                    changed[i] = (r, now)
                if r >= settle_from[i] + cfg.settle_rounds or now - changed[i][1] >= quiet_s:
                    settled.add(i)
            finished = settled >= rounds.keys()
        finished = finished or (cfg.duration_s is not None and elapsed >= cfg.duration_s)
        progress.show(progress_view(cfg, statuses, elapsed, metric or "accuracy"), force=finished)
        if finished:
            return
        await asyncio.sleep(cfg.progress_interval_s)


def _task_metric(log: Path) -> str | None:
    """What the task is judged by, from the ``start`` record of a node's metrics log (None
    until the node has written it)."""
    with contextlib.suppress(OSError), log.open("rb") as f:
        for line in f:
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and record.get("event") == "start":
                    metric = record.get("metric")
                    return metric if isinstance(metric, str) else "accuracy"
    return None


async def _start_all(cfg: SwarmConfig, procs: list[NodeProcess]) -> None:
    """Node i joins through a random node before it, as soon as that one is up: the starts
    overlap (the waits form a random tree, a few levels deep) instead of going one by one."""
    rng = random.Random(cfg.seed)
    up = [asyncio.Event() for _ in procs]

    async def start(p: NodeProcess) -> None:
        helper = procs[rng.randrange(p.index)] if p.index else None
        if helper is not None:
            await up[helper.index].wait()
        join = helper.address if helper else None
        await p.start(node_argv(cfg, p.index, p.state_dir, join), cfg.start_timeout_s)
        up[p.index].set()
        if cfg.progress:
            started = sum(e.is_set() for e in up)
            via = f" (joined through node {helper.index})" if helper else ""
            print(f"  node {p.index} up at {p.address}{via}: {started} of {cfg.nodes}", flush=True)

    tasks = [asyncio.create_task(start(p)) for p in procs]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def run_swarm(cfg: SwarmConfig) -> int:
    """Run the swarm to the end and print the report; returns the process exit code."""
    workdir = cfg.workdir or Path("murmur-runs") / time.strftime("%Y%m%d-%H%M%S")
    workdir.mkdir(parents=True, exist_ok=True)
    procs = [NodeProcess(i, workdir / f"node-{i}") for i in range(cfg.nodes)]
    tls = await asyncio.to_thread(provision, cfg, workdir, [p.state_dir for p in procs])
    transport = GrpcTransport(GrpcTransportConfig(tls=tls))
    print(f"murmur swarm: starting {cfg.nodes} nodes in {workdir}", flush=True)
    codes: list[int] = []
    try:
        await _start_all(cfg, procs)
        await _supervise(cfg, procs, transport)
    except SwarmError as err:
        print(f"murmur swarm: {err}", file=sys.stderr)
        return 1
    finally:
        codes = list(await asyncio.gather(*(p.stop(cfg.stop_timeout_s) for p in procs)))
        await transport.close(0)
    bad = [(p.index, c) for p, c in zip(procs, codes, strict=True) if c != 0]
    if bad:
        for index, code in bad:
            print(
                f"murmur swarm: node {index} exited with {code}:\n{procs[index].log_tail()}",
                file=sys.stderr,
            )
        return 1
    report = await asyncio.to_thread(_judge, cfg, [p.state_dir for p in procs])
    (workdir / "report.json").write_text(report.to_json())
    (workdir / "report.md").write_text(report.to_markdown() + "\n")
    print(report.to_markdown())
    print(f"\nreport: {workdir / 'report.md'}")
    # The history over time goes beside report.md (run-report.md and plots/), leaving it alone.
    try:
        history = await asyncio.to_thread(write_report, [p.state_dir for p in procs], workdir)
    except (ValueError, OSError) as err:
        print(f"murmur swarm: could not write the plots: {err}", file=sys.stderr)
        return 1
    with (workdir / "report.md").open("a") as f:
        f.write(f"\nPlots and each node's history: [{history.name}]({history.name})\n")
    print(f"plots: {history}")
    return 0


def _judge(cfg: SwarmConfig, state_dirs: list[Path]) -> RunReport:
    report = evaluate_run(state_dirs, cfg.task, cfg.seed, cfg.device)
    if not cfg.baseline:
        return report
    steps = sum(r.steps for r in report.nodes)  # same batch size: same number of samples
    loss, accuracy = train_reference(cfg.task, cfg.seed, steps, cfg.device)
    return dataclasses.replace(
        report, reference_accuracy=accuracy, reference_steps=steps, reference_loss=loss
    )
