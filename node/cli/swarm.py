"""``murmur swarm``: N real node processes on loopback, live progress, and a final report.

The first node starts alone; each of the others joins through one random earlier node, as a
user joins a running swarm through any peer's address, and membership gossip (SWIM) tells
everyone about everyone. Every node waits until it knows all N members before training,
trains its step budget, then keeps gossiping. Once every node has finished, the swarm lets each
do a few more rounds (``settle_rounds``; with the event-triggered rule a node that falls quiet
first counts as settled), stops them all with SIGTERM (each writes its final
checkpoint), and judges the checkpoints.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import os
import random
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from gossip.topology import block_region
from node.cli.evaluation import RunReport, evaluate_run, train_reference
from node.cli.report import write_report
from node.cli.swarm_view import LiveView, progress_view
from node.config import GossipConfig
from node.daemon.statedir import METRICS_FILE
from node.security.pki import CA_CERT_FILE, TlsFiles, init_ca, issue_node, load_tls
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


class SwarmError(RuntimeError):
    """A node process failed to start or died."""


@dataclass(frozen=True)
class SwarmConfig:
    nodes: int = 8
    steps: int = 600
    duration_s: float | None = None
    task: str = "digits"
    alpha: float | None = 0.5
    seed: int = 0
    device: str = "cpu"
    eval_every: int = 100
    settle_rounds: int = 20
    workdir: Path | None = None
    baseline: bool = True
    progress: bool = True
    gossip: GossipConfig = field(default_factory=GossipConfig)
    start_timeout_s: float = 120.0
    stop_timeout_s: float = 60.0
    progress_interval_s: float = 1.0
    #: Plain TCP between the nodes instead of mutual TLS from a throwaway CA.
    insecure: bool = False
    #: Emulated device pace: every node's step takes at least this long (``--step-time``).
    step_time: float = 0.0
    #: Stragglers: node index -> how many times slower it steps (``--slowdown``).
    slowdowns: Mapping[int, float] = field(default_factory=dict)
    #: The nodes split into this many regions (gossip/topology.py ``block_region``); 0: none.
    regions: int = 0

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ValueError("a swarm needs at least one node")
        if not 0 <= self.regions <= self.nodes:
            raise ValueError(f"regions is {self.regions}: expected 0 (none) to {self.nodes}")
        if self.steps < 1:
            raise ValueError("steps must be at least 1")


class NodeProcess:
    """One ``murmur run`` child; its stderr goes to ``node.log`` in its state dir."""

    def __init__(self, index: int, state_dir: Path) -> None:
        self.index = index
        self.state_dir = state_dir
        self.proc: asyncio.subprocess.Process | None = None
        self.node_id = ""
        self.address = ""
        self._log: IO[bytes] | None = None
        self._drain: asyncio.Task[None] | None = None
        #: Set when the node says on stdout that it has spent its step budget.
        self.trained = asyncio.Event()

    async def start(self, argv: list[str], timeout_s: float) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._log = (self.state_dir / "node.log").open("wb")
        self.proc = await asyncio.create_subprocess_exec(
            *argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=self._log,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert self.proc.stdout is not None
        try:
            async with asyncio.timeout(timeout_s):
                line = await self.proc.stdout.readline()
        except TimeoutError:
            raise SwarmError(f"node {self.index} did not start within {timeout_s:g} s") from None
        if not line:
            await self.proc.wait()
            raise SwarmError(
                f"node {self.index} exited with {self.proc.returncode} before it was ready:\n"
                + self.log_tail()
            )
        ready = json.loads(line)
        self.node_id, self.address = ready["node_id"], ready["address"]
        self._drain = asyncio.create_task(self._drain_stdout())

    async def _drain_stdout(self) -> None:
        assert self.proc is not None
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            with contextlib.suppress(ValueError):
                if json.loads(line).get("event") == "trained":
                    self.trained.set()

    def log_tail(self, lines: int = 20) -> str:
        path = self.state_dir / "node.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    @property
    def exited(self) -> bool:
        return self.proc is not None and self.proc.returncode is not None

    async def stop(self, timeout_s: float) -> int:
        """SIGTERM, then wait; SIGKILL if it does not exit in time. Returns the exit code."""
        if self.proc is None:
            return 0
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(timeout_s):
                    await self.proc.wait()
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        if self._drain is not None:
            await self._drain
        if self._log is not None:
            self._log.close()
        assert self.proc.returncode is not None
        return self.proc.returncode


def node_argv(
    cfg: SwarmConfig,
    index: int,
    state_dir: Path,
    join: str | None,
    wait_members: int | None = None,
) -> list[str]:
    """``murmur run`` arguments for node ``index``, which starts training once it knows
    ``wait_members`` members (default: all ``cfg.nodes``)."""
    g = cfg.gossip
    argv = [
        sys.executable,
        "-m",
        "node",
        "run",
        "--listen",
        "127.0.0.1:0",
        "--state-dir",
        str(state_dir),
        "--task",
        cfg.task,
        "--shard",
        f"{index}/{cfg.nodes}",
        "--seed",
        str(cfg.seed),
        "--device",
        cfg.device,
        "--threads",
        "1",
        "--wait-members",
        str(cfg.nodes if wait_members is None else wait_members),
        "--wait-timeout",
        str(cfg.start_timeout_s),
        "--steps",
        str(cfg.steps),
        "--eval-every",
        str(cfg.eval_every),
        "--topology",
        g.topology,
        "--degree",
        str(g.degree),
        "--compress",
        g.codec,
        "--block-size",
        str(g.block_size),
        "--compress-fraction",
        str(g.compress_fraction),
        "--local-steps",
        str(g.local_steps),
    ]
    if g.topology == "epidemic":
        argv += ["--fanout", str(g.fanout)]
    if g.bridge_codec is not None:
        argv += ["--bridge-compress", g.bridge_codec]
    if g.bridge_period > 1:
        argv += ["--bridge-period", str(g.bridge_period)]
    if g.max_local_steps is not None:
        argv += ["--max-local-steps", str(g.max_local_steps)]
    if g.outer_lr is not None:
        argv += ["--outer-lr", str(g.outer_lr), "--outer-momentum", str(g.outer_momentum)]
    if g.gamma is not None:
        argv += ["--gamma", str(g.gamma)]
    if g.trigger:
        argv += ["--trigger-threshold", str(g.trigger_threshold), "--heartbeat", str(g.heartbeat_s)]
    else:
        argv.append("--no-trigger")
    if g.robust:
        argv += ["--robust", "--byzantine-fraction", str(g.byzantine_fraction)]
    if g.max_upload_rate is not None:
        argv += ["--max-upload-rate", f"{g.max_upload_rate:.0f}"]
    if g.byte_budget is not None:
        nbytes, period_s = g.byte_budget
        argv += ["--byte-budget", f"{nbytes}B/{period_s:g}s"]
    if g.pace != "node":
        argv += ["--pace", g.pace]
    if g.attack is not None and index == cfg.nodes - 1:
        argv += ["--attack", g.attack]  # testing robustness: the last node is the attacker
    if cfg.alpha is not None:
        argv += ["--alpha", str(cfg.alpha)]
    if join:
        argv += ["--join", join]
    if cfg.insecure:
        argv.append("--insecure")
    if cfg.step_time:
        argv += ["--step-time", str(cfg.step_time)]
    if cfg.regions:
        argv += ["--region", block_region(index, cfg.nodes, cfg.regions)]
    if index in cfg.slowdowns:
        argv += ["--slowdown", str(cfg.slowdowns[index])]
    return argv


def provision(cfg: SwarmConfig, workdir: Path, state_dirs: list[Path]) -> TlsFiles | None:
    """A throwaway CA for this run (in ``workdir/ca``), a certificate in every state dir, and
    one for the swarm runner itself, which it returns (None when ``cfg.insecure``)."""
    if cfg.insecure:
        return None
    ca_dir = workdir / "ca"
    if not (ca_dir / CA_CERT_FILE).exists():
        init_ca(ca_dir, name=f"murmur swarm {workdir.name}")
    for i, state_dir in enumerate(state_dirs):
        issue_node(ca_dir, state_dir, f"node-{i}")
    issue_node(ca_dir, workdir / "runner", "runner")
    return load_tls(workdir / "runner")


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
