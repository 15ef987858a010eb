"""The swarm's config and its node processes, for ``murmur swarm`` (node/cli/swarm.py).

``SwarmConfig`` and ``SwarmError``; ``NodeProcess``, one ``murmur run`` child on loopback;
``node_argv``, its arguments; and ``provision``, a throwaway CA with the run's certificates.
node/cli/swarm.py runs the swarm with them and re-exports them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from gossip.topology import block_region
from node.config import GossipConfig
from node.security.pki import CA_CERT_FILE, TlsFiles, init_ca, issue_node, load_tls

__all__ = [
    "NodeProcess",
    "SwarmConfig",
    "SwarmError",
    "node_argv",
    "provision",
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
