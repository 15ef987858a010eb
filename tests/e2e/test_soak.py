"""A soak (issue 13): six real nodes over mutual TLS, each in its own network namespace on one
bridge, every one publishing its status to a real mosquitto, train digits through a seeded
schedule of overlapping faults: kill -9 and restarts of random nodes (the same command line and
state dir), a 3|3 partition that heals, 10% packet loss on every link for a stretch, and the
broker stopped and started again while the nodes run.

Then, everything healed: every node's view holds all six alive within ``ONE_VIEW_S``, every node
reaches the target accuracy within ``TARGET_S``, the broker holds every node's status again, and
each node exits 0 on SIGTERM. Throughout, each node's Status is polled twice a second: within a
life its step never goes back, and across a kill it goes back by no more than one checkpoint
interval allows (and never past the newest checkpoint the node wrote). No log of any life holds
a traceback, and no state dir holds a temporary or damaged file after the clean stop (each
killed node's dir gets the half-written temporary file a kill during a write leaves, if its
kill left none). The schedule and the times measured are printed (run with ``-s``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import random
import re
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiomqtt
import pytest

from gossip.swim import Status
from node.cli.swarm import NodeProcess, SwarmConfig, node_argv, provision
from node.config import GossipConfig
from node.daemon.checkpoint import CHECKPOINT_FILE
from node.daemon.node import METRICS_FILE
from node.telemetry.mqtt_messages import MqttConfig, parse_status
from node.telemetry.status import NodeStatus
from node.transport.base import Rejected, Unreachable
from node.transport.grpc import GrpcTransport, GrpcTransportConfig
from tests.impair import Impairment
from tests.mqtt_broker import MosquittoBroker
from tests.netns import Testnet
from tests.node.helpers import poll

pytestmark = pytest.mark.e2e  # needs root, as the e2e stage runs: Testnet says so otherwise

PREFIX, SUBNET = "soak", "10.79.52"
SEED = 13
N = 6
#: Each host is a namespace of this test's own, so a fixed port collides with nobody, and a
#: restarted node comes back at its address, as a service on a host does.
PORT = 7000
TARGET = 0.93  # the digits accuracy the acceptance test holds every node to
CHECKPOINT_S = 3.0  # --checkpoint-interval: several writes per life, some cut by a kill
STEP_TIME_S = 0.05  # --step-time: at most 20 steps a second, so one interval is few steps
#: Capturing and writing a checkpoint, between one interval's end and the next one's start.
WRITE_S = 1.0
#: The most steps a kill may cost: those of one checkpoint interval at the fastest pace.
STEPS_PER_INTERVAL = math.ceil((CHECKPOINT_S + WRITE_S) / STEP_TIME_S)
LOSS = 0.1
ONE_VIEW_S = 30.0  # issue 13: one view of all live members within 30 s
TARGET_S = 90.0  # from one view to every node at the target
START_S = 120.0  # a node's start on two busy cores (torch's import alone takes seconds)
CFG = SwarmConfig(
    nodes=N,
    steps=5000,  # bounded, and more than the soak's ~4 minutes at 20 steps a second
    alpha=0.5,
    eval_every=100,  # each node's Status carries its accuracy on the shared held-out set
    gossip=GossipConfig(),  # the defaults a user gets (--compress auto, the trigger)
    start_timeout_s=45.0,  # --wait-timeout: a restart in a split waits for its members this long
)


@dataclass(frozen=True)
class Event:
    at_s: float  # from the start of the soak
    what: str  # kill, restart, split, heal, loss, clean, broker-stop, broker-start
    node: int = -1
    groups: tuple[tuple[int, ...], ...] = ()

    def __str__(self) -> str:
        arg = f" node {self.node}" if self.node >= 0 else ""
        arg += f" {'|'.join(''.join(map(str, g)) for g in self.groups)}" if self.groups else ""
        return f"{self.at_s:6.1f} s  {self.what}{arg}"


def schedule(seed: int) -> list[Event]:
    """Overlapping faults over about 100 s: loss first, a 3|3 split inside it, the broker down
    from inside the split to past its end, and five kills of five distinct nodes: one before
    the split, one in it, one while the broker is down, and two on a healed network, the second
    while the first is still down."""
    rng = random.Random(seed)
    loss_at = rng.uniform(5, 15)
    split_at = loss_at + rng.uniform(5, 15)
    split_s = rng.uniform(18, 25)
    broker_at = split_at + rng.uniform(5, 12)
    broker_s = rng.uniform(15, 25)
    loss_s = split_at + split_s - loss_at + rng.uniform(5, 15)
    hosts = rng.sample(range(N), N)
    groups = (tuple(sorted(hosts[:3])), tuple(sorted(hosts[3:])))
    kill_at = [
        rng.uniform(2, loss_at + 3),
        rng.uniform(split_at + 2, split_at + split_s - 8),
        rng.uniform(broker_at + 2, broker_at + broker_s - 5),
        rng.uniform(broker_at + broker_s + 10, broker_at + broker_s + 20),
    ]
    kill_at.append(kill_at[-1] + rng.uniform(1, 3))
    events = [
        Event(loss_at, "loss"),
        Event(loss_at + loss_s, "clean"),
        Event(split_at, "split", groups=groups),
        Event(split_at + split_s, "heal"),
        Event(broker_at, "broker-stop"),
        Event(broker_at + broker_s, "broker-start"),
    ]
    for at, node in zip(kill_at, rng.sample(range(N), len(kill_at)), strict=True):
        events += [Event(at, "kill", node), Event(at + rng.uniform(3, 8), "restart", node)]
    return sorted(events, key=lambda e: e.at_s)


@dataclass
class Life:
    """One run of one node's process: the steps its Status showed, in order."""

    steps: list[int] = field(default_factory=list)
    killed_at: float | None = None
    ready_at: float | None = None


class Soak:
    """The swarm under the schedule, and the watch on it."""

    def __init__(self, net: Testnet, broker: MosquittoBroker, workdir: Path) -> None:
        self.net, self.broker, self.workdir = net, broker, workdir
        self.procs = [NodeProcess(i, workdir / f"node-{i}") for i in range(N)]
        tls = provision(CFG, workdir, [p.state_dir for p in self.procs])  # mutual TLS
        self.transport = GrpcTransport(GrpcTransportConfig(tls=tls))
        self.argvs: list[list[str]] = []
        self.lives: list[list[Life]] = [[Life()] for _ in range(N)]
        self.up = [False] * N  # polled: started and not killed
        self.logs = workdir / "logs"  # each earlier life's node.log (a start truncates it)
        self.logs.mkdir()
        self.t0 = time.monotonic()
        self.notes: list[str] = []
        self.broker_back_s = math.nan

    def note(self, text: str) -> None:
        self.notes.append(f"{time.monotonic() - self.t0:6.1f} s  {text}")

    def argv(self, i: int, join: str | None) -> list[str]:
        argv = node_argv(CFG, i, self.procs[i].state_dir, join, N)
        argv[argv.index("--listen") + 1] = f"{self.net.address(i)}:{PORT}"
        extra = ["--checkpoint-interval", str(CHECKPOINT_S), "--step-time", str(STEP_TIME_S)]
        extra += ["--mqtt", self.broker.url, "--mqtt-interval", "1"]
        return [*self.net.exec_argv(i), *argv, *extra]

    async def start(self) -> None:
        self.argvs = [self.argv(0, None)]
        await self.procs[0].start(self.argvs[0], START_S)
        self.argvs += [self.argv(i, self.procs[0].address) for i in range(1, N)]
        await asyncio.gather(*(p.start(self.argvs[p.index], START_S) for p in self.procs[1:]))
        self.up = [True] * N

    async def kill(self, i: int) -> None:
        p = self.procs[i]
        self.up[i] = False
        assert p.proc is not None
        p.proc.send_signal(signal.SIGKILL)
        assert await p.stop(10) == -signal.SIGKILL, f"node {i} had exited before its kill"
        self.lives[i][-1].killed_at = time.monotonic()
        (p.state_dir / "node.log").rename(self.logs / f"node-{i}-life-{len(self.lives[i])}.log")
        # What a kill during a checkpoint write leaves (a write takes milliseconds of every
        # interval, so a random kill rarely does): the restart must clear it.
        left = sorted(f.name for f in stray_files(p.state_dir))
        if left:
            self.note(f"node {i}'s kill left {left}")
        else:
            whole = (p.state_dir / CHECKPOINT_FILE).read_bytes()
            (p.state_dir / f".{CHECKPOINT_FILE}.killed.tmp").write_bytes(whole[: len(whole) // 2])

    async def restart(self, i: int) -> None:
        self.lives[i].append(Life())
        await self.procs[i].start(self.argvs[i], START_S)  # the same command line
        self.lives[i][-1].ready_at = time.monotonic()
        self.up[i] = True

    async def status(self, i: int) -> NodeStatus | None:
        try:
            return await self.transport.call_status(self.procs[i].address, 5.0)
        except (Unreachable, Rejected):
            return None

    async def poll(self) -> list[NodeStatus | None]:
        """Every live node's Status now (None where it did not answer or is down)."""
        for i, p in enumerate(self.procs):
            if self.up[i] and p.exited:
                raise AssertionError(f"node {i} exited:\n{p.log_tail()}")
        asked = [(i, len(self.lives[i])) for i in range(N) if self.up[i]]
        got = await asyncio.gather(*(self.status(i) for i, _ in asked))
        out: list[NodeStatus | None] = [None] * N
        for (i, life), s in zip(asked, got, strict=True):
            if s is not None:
                assert s.node_id == self.procs[i].node_id
                self.lives[i][life - 1].steps.append(s.step)
                out[i] = s
        return out

    async def watch(self) -> None:
        """Poll until cancelled; note each time the swarm stops or starts being one view of
        all six alive (every node up, answering, and holding all six alive)."""
        ids = {p.node_id for p in self.procs}
        whole = True
        while True:
            got = await self.poll()
            now = all(
                s is not None and {m.node_id for m in s.members if m.status is Status.ALIVE} == ids
                for s in got
            )
            if now != whole:
                self.note("one view of all six alive" if now else "no longer one view")
                whole = now
            await asyncio.sleep(0.5)  # a polling period, not a wait for an event

    async def broker_back(self) -> None:
        """Note when the restarted broker holds every node's status again."""
        began = time.monotonic()
        ids = {p.node_id for p in self.procs}

        async def check() -> bool:
            got = await retained_statuses(self.broker.url)
            return ids <= got.keys()

        await poll(check, "every node's status on the restarted broker", 60)
        self.broker_back_s = time.monotonic() - began
        self.note(f"every node's status on the broker again, {self.broker_back_s:.1f} s after")

    async def every(self, ok: Callable[[NodeStatus], bool], what: str, timeout_s: float) -> None:
        async def check() -> bool:
            got = await self.poll()
            return all(s is not None and ok(s) for s in got)

        await poll(check, what, timeout_s)

    async def run(self, events: list[Event], impair: Impairment) -> None:
        """Play the schedule; restarts run beside it (a start takes seconds)."""
        restarts: list[asyncio.Task[None]] = []
        began = time.monotonic()
        actions: dict[str, Callable[[Event], Awaitable[object]]] = {
            "kill": lambda e: self.kill(e.node),
            "split": lambda e: asyncio.to_thread(self.net.split, e.groups),
            "heal": lambda e: asyncio.to_thread(self.net.heal),
            "loss": lambda e: asyncio.to_thread(impair.set, LOSS, 0.0),
            "clean": lambda e: asyncio.to_thread(impair.clear),
            "broker-stop": lambda e: asyncio.to_thread(self.broker.stop, True),
            "broker-start": lambda e: asyncio.to_thread(self.broker.start),
        }
        for e in events:
            await asyncio.sleep(max(0.0, began + e.at_s - time.monotonic()))  # the schedule
            self.note(str(e).split("s  ", 1)[1])
            if e.what == "restart":
                restarts.append(asyncio.create_task(self.restart(e.node)))
            else:
                await actions[e.what](e)
            if e.what == "broker-start":
                restarts.append(asyncio.create_task(self.broker_back()))
        await asyncio.gather(*restarts)
        self.note("every restarted node ready, the broker holds every status")


def log_texts(soak: Soak) -> dict[str, str]:
    paths = sorted(soak.logs.glob("*.log")) + [p.state_dir / "node.log" for p in soak.procs]
    return {str(path): path.read_text(errors="replace") for path in paths}


def checkpoint_steps(state_dir: Path) -> list[list[int]]:
    """The steps of the checkpoints each life wrote, from the metrics log (a line a kill cut
    short is skipped: it is the only kind a kill makes)."""
    lives: list[list[int]] = []
    for line in (state_dir / METRICS_FILE).read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == "start":
            lives.append([])
        elif record.get("event") == "checkpoint":
            lives[-1].append(int(record["step"]))
    return lives


async def retained_statuses(url: str) -> dict[str, dict[str, object]]:
    """Every node's retained status on the broker, by node id."""
    cfg = MqttConfig(url)
    marker = "murmur-tests/soak-marker"
    got: dict[str, dict[str, object]] = {}
    b = cfg.broker
    async with aiomqtt.Client(b.host, b.port) as client:
        await client.subscribe(cfg.topic("+", "status"), qos=1)
        await client.subscribe(marker, qos=1)
        # The broker sends a subscription's retained messages before anything published after.
        await client.publish(marker, b"", qos=1)
        async with asyncio.timeout(10):
            async for message in client.messages:
                if message.topic.value == marker:
                    return got
                parsed = cfg.parse_topic(message.topic.value)
                status = (
                    parse_status(message.payload) if isinstance(message.payload, bytes) else None
                )
                if parsed is not None and status is not None:
                    got[parsed[0]] = status
    raise AssertionError("the broker closed the connection")


def stray_files(state_dir: Path) -> list[Path]:
    """Temporary files (node/daemon/checkpoint.py's ``.<name>.*.tmp``, node/security/identity.py's
    ``<name>.tmp``) and checkpoints moved aside as damaged (``*.corrupt-<time>``)."""
    return [p for p in state_dir.rglob("*") if p.name.endswith(".tmp") or ".corrupt-" in p.name]


@pytest.mark.timeout(420)
async def test_a_seeded_soak_of_kills_a_split_loss_and_broker_loss_ends_in_one_healthy_swarm(
    tmp_path: Path,
) -> None:
    events = schedule(SEED)
    with Testnet(PREFIX, N, SUBNET) as net, Impairment(net) as impair:
        broker = MosquittoBroker(tmp_path, host=f"{SUBNET}.254")  # the bridge: every host's
        await asyncio.to_thread(broker.start)
        soak = Soak(net, broker, tmp_path)
        watcher: asyncio.Task[None] | None = None
        try:
            await soak.start()
            await soak.every(lambda s: s.step >= 20, "every node training", START_S)
            soak.note("every node training")
            watcher = asyncio.create_task(soak.watch())
            soak_at = time.monotonic()
            await soak.run(events, impair)
            healed_at = time.monotonic()
            watcher.cancel()
            ids = {p.node_id for p in soak.procs}

            def one_view(s: NodeStatus) -> bool:
                return {m.node_id for m in s.members if m.status is Status.ALIVE} == ids

            await soak.every(one_view, f"one view of all {N} alive", ONE_VIEW_S)
            one_view_s = time.monotonic() - healed_at
            soak.note("one view of all six alive")
            await soak.every(
                lambda s: s.eval_accuracy >= TARGET, f"every node at {TARGET}", TARGET_S
            )
            target_s = time.monotonic() - healed_at
            soak.note(f"every node at accuracy {TARGET} or more")
            accuracy = sorted(round(s.eval_accuracy, 3) for s in await soak.poll() if s)
            steps = [s.step if s else -1 for s in await soak.poll()]

            async def on_broker() -> dict[str, dict[str, object]] | None:
                got = await retained_statuses(broker.url)
                fresh = all(
                    i in got and got[i]["online"] is True and int(str(got[i]["step"])) > 0
                    for i in ids
                )
                return got if fresh else None

            await poll(on_broker, "every node's status on the restarted broker", 30)
        finally:
            if watcher is not None:
                watcher.cancel()
            codes = await asyncio.gather(*(p.stop(60) for p in soak.procs))
            await soak.transport.close(0)
            broker.stop()
    soak_s = healed_at - soak_at
    print(f"\nsoak, seed {SEED}, {soak_s:.0f} s of faults; the schedule:")
    print("\n".join(f"  {e}" for e in events))
    print("what happened (from the test's start):")
    print("\n".join(f"  {n}" for n in soak.notes))

    assert codes == [0] * N, codes  # SIGTERM: each left politely and wrote its state
    tracebacks = [path for path, text in log_texts(soak).items() if "Traceback" in text]
    assert not tracebacks, f"tracebacks in {tracebacks}"
    strays = [f for p in soak.procs for f in stray_files(p.state_dir)]
    assert not strays, f"left in the state dirs: {strays}"

    print(f"steps per checkpoint interval at most {STEPS_PER_INTERVAL}; across each kill:")
    for i, p in enumerate(soak.procs):
        lives = soak.lives[i]
        written = checkpoint_steps(p.state_dir)
        assert len(written) == len(lives), (i, len(written), len(lives))
        for n, life in enumerate(lives):
            assert life.steps == sorted(life.steps), f"node {i} life {n + 1} stepped back"
        for n, (old, new) in enumerate(itertools.pairwise(lives)):
            # The new life's log: set aside if it was killed too, else the last node.log.
            new_log = soak.logs / f"node-{i}-life-{n + 2}.log"
            text = (new_log if new_log.exists() else p.state_dir / "node.log").read_text()
            resumed = re.search(r"resuming from \S+ at step (\d+)", text)
            at = int(resumed.group(1)) if resumed else 0
            before = max(old.steps, default=0)
            newest = max((s for life_ in written[: n + 1] for s in life_), default=0)
            assert new.ready_at is not None
            assert old.killed_at is not None
            print(
                f"  node {i}: step {before} seen before the kill, resumed at {at} (newest "
                f"checkpoint written {newest}); back {before - at}; ready "
                f"{new.ready_at - old.killed_at:.1f} s after the kill"
            )
            assert at >= newest, f"node {i} resumed at {at}, before its checkpoint at {newest}"
            assert before - at <= STEPS_PER_INTERVAL, f"node {i} went back {before - at} steps"
            assert min(new.steps) >= at
    print(
        f"one view {one_view_s:.1f} s after the last fault ended (bound {ONE_VIEW_S:g}), every "
        f"node at {TARGET} {target_s:.1f} s after it; accuracy {accuracy}; steps {steps}"
    )
