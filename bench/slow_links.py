"""Slow links: how soon the averaged model reaches a target, murmur (int8, 1-bit, fp32) against
the all-reduce baseline, every node in its own network namespace behind a shaped link.

    .venv/bin/python -m bench.slow_links [--nodes 4] [--rate 20mbit] [--delay 20ms] [--loss 0]
        [--target 0.9] [--limit 300] [--systems int8,sign,fp32,all-reduce] [--window S]

With ``--window S`` a murmur system runs S seconds from the moment every node trains (its first
checkpoint: start-up, which model pulls and snapshots on slow links make long and uneven, is
left out), and a second table gives, over that window: the seconds until the averaged model
and until the worst node reached the target (the issue-17 measure), the worst node's accuracy
and the nodes' relative distance at its end, and the bytes each node put on its link.

A murmur system is ``CODEC`` (the static exponential graph, one public copy), or ``CODEC@GRAPH``
with a copy per link (``--pace link``): ``int8@link`` on the static exponential graph,
``int8@one-peer-exponential`` or ``int8@epidemic`` for a time-varying schedule over its links.
Either may end in ``/RATE``: the nodes run with ``--max-upload-rate RATE`` (bytes a second),
``auto/1250000`` for half of a 20 Mbit/s link.

Needs root (namespaces and tc). Each node gets namespace ``mmb-n<i>`` with an ``eth0`` on a bridge
in the root namespace; ``scripts/shape-link`` shapes both directions of its link (the node's
uplink inside the namespace, its downlink on the bridge side): netem where the kernel has it,
else the rate alone through tbf, and then the delay and loss in user space (tests/impair.py's
NFQUEUE workers, on what each node receives; iptables and the dev extra's fnfqueue). The
table's title says which.
Everything the bench makes is named ``mmb-*`` and removed at the end, on failure too, and before
it starts (left over from a run that was killed).

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
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bench.allreduce import AllReduceConfig, run_allreduce
from bench.swarms import start_swarm
from node.cli.evaluation import average_states
from node.cli.swarm import NodeProcess, SwarmConfig
from node.config import GossipConfig
from node.daemon.checkpoint import CHECKPOINT_FILE, load_checkpoint
from node.tasks import Shard, load_task
from node.tasks.base import evaluate
from tests.impair import Impairment

TASK = "bench.wide_task:make_task"
PREFIX = "mmb"
SUBNET = "10.77.0"
SHAPE = str(Path(__file__).resolve().parent.parent / "scripts" / "shape-link")


def sh(*argv: str, check: bool = True) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def succeeds(*argv: str) -> bool:
    return subprocess.run(argv, capture_output=True, check=False).returncode == 0


@dataclass
class Testnet:
    """``n`` namespaces on one bridge, each link shaped."""

    n: int
    rate: str
    delay: str
    loss: str
    applied: str = ""
    #: Names of everything made start with this (another bench may use its own at once).
    name: str = PREFIX
    subnet: str = SUBNET
    #: Delay and loss in user space (tests/impair.py's NFQUEUE workers, on each host's receive
    #: side) where the kernel has no netem; None where netem applied them, or none were asked.
    impairment: Impairment | None = field(default=None, repr=False)

    def namespace(self, i: int) -> str:
        return f"{self.name}-n{i}"

    def address(self, i: int) -> str:
        return f"{self.subnet}.{i + 1}"

    def exec_argv(self, i: int) -> list[str]:
        """What to put before a command line to run it on host ``i``."""
        return ["ip", "netns", "exec", self.namespace(i)]

    def sent_bytes(self, i: int) -> int:
        """What node ``i`` put on the wire: its link's bytes as they arrive at the bridge."""
        return int(Path(f"/sys/class/net/{self.name}-v{i}/statistics/rx_bytes").read_text())

    def __enter__(self) -> Testnet:
        self.clean()
        try:
            self._build()
        except BaseException:
            self.clean()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.clean()

    def _build(self) -> None:
        bridge = f"{self.name}-br"
        sh("ip", "link", "add", bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{self.subnet}.254/24", "dev", bridge)
        sh("ip", "link", "set", bridge, "up")
        # A Docker engine on this host drops forwarded bridge traffic unless told otherwise.
        if _bridge_filtered():
            sh("iptables", "-I", "FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT")
        shaping = []
        for i in range(self.n):
            ns, outside, inside = self.namespace(i), f"{self.name}-v{i}", f"{self.name}-p{i}"
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
            sh("ip", "link", "set", inside, "netns", ns)
            sh(*self.exec_argv(i), "ip", "link", "set", inside, "name", "eth0")
            sh(*self.exec_argv(i), "ip", "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            sh(*self.exec_argv(i), "ip", "link", "set", "eth0", "up")
            sh(*self.exec_argv(i), "ip", "link", "set", "lo", "up")
            sh("ip", "link", "set", outside, "master", bridge, "up")
            up = ["--rate", self.rate, "--delay", self.delay, "--loss", self.loss]
            shaping.append(sh(*self.exec_argv(i), SHAPE, "eth0", *up))
            sh(SHAPE, outside, "--rate", self.rate)  # the downlink: the rate only
        self.applied = shaping[0]
        delay_s, loss = _seconds(self.delay), _fraction(self.loss)
        if self.applied.startswith("applied tbf") and (delay_s > 0 or loss > 0):
            # No netem: tbf holds the rate, and the delay and loss go in user space, before
            # any process opens a connection (tests/impair.py turns segmentation offload off).
            self.impairment = Impairment(self, "nfqueue").__enter__()
            self.impairment.set(loss, delay_s)
            self.applied = (
                f"applied tbf: rate {self.rate}; in user space (no netem): delay {self.delay}"
                f" and loss {self.loss or 0} on what each host receives"
            )

    def clean(self) -> None:
        if self.impairment is not None:
            self.impairment.close()
            self.impairment = None
        for ns in sh("ip", "netns", "list", check=False).splitlines():
            name = ns.split()[0] if ns.split() else ""
            if name.startswith(f"{self.name}-n"):
                sh("ip", "netns", "del", name, check=False)  # takes its veth pair along
        bridge = f"{self.name}-br"
        if Path(f"/sys/class/net/{bridge}").exists():
            if _bridge_filtered():
                rule = ["FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT"]
                while succeeds("iptables", "-D", *rule):
                    pass
            sh("ip", "link", "del", bridge, check=False)


def _seconds(delay: str) -> float:
    """``20ms``, ``500us`` or ``0.5s`` in seconds (``0`` or empty: none)."""
    for unit, scale in (("ms", 1e-3), ("us", 1e-6), ("s", 1.0)):
        if delay.endswith(unit):
            return float(delay[: -len(unit)]) * scale
    if delay in ("", "0"):
        return 0.0
    raise ValueError(f"a delay needs its unit (20ms, 0.5s), got {delay!r}")


def _fraction(loss: str) -> float:
    """``1%`` or ``0.01`` as a fraction."""
    if not loss:
        return 0.0
    return float(loss[:-1]) / 100 if loss.endswith("%") else float(loss)


def _bridge_filtered() -> bool:
    flag = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
    return succeeds("which", "iptables") and flag.exists() and flag.read_text().strip() == "1"


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
            if reached is not None and "target_s" not in window:
                window["target_s"] = t - window["t0"]
            if worst >= target and "worst_target_s" not in window:
                window["worst_target_s"] = t - window["t0"]
            window.update(worst=worst, distance=distance, acc=acc)
            if t - window["t0"] >= window_s:
                wire = [net.sent_bytes(i) - b for i, b in enumerate(window["wire0"])]
                window["wire_bytes"] = sum(wire) / net.n
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
        name = "all-reduce (fp32 gradients)" if system == "all-reduce" else f"murmur {system}"
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
                f"| murmur {system} | {when} | {w['acc']:.3f} / {w['worst']:.3f} | "
                f"{w['distance']:.2g} | {w['wire_bytes'] / 1e6:.1f} |"
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
