"""The testbed's CI check: run docker/compose.yml through a crash and a restart, and judge it.

``scripts/testbed ci`` (``make test-testbed``) runs it once Docker, the images and the teardown
are in place, with the compose settings in the environment (NODES, STEPS, MQTT_PORT, ...)::

    python -m tests.testbed.check --compose "docker-compose -p P -f docker/compose.yml" \\
        --nodes 2 --steps 15000 --broker 127.0.0.1:18830 --report-dir murmur-runs/testbed-ci

It listens to the broker the nodes report to from the start, brings the testbed up, and then:
once one node (``node-1``; with nodes in the home, behind its NAT router, a node they name as a
relay) has written a checkpoint mid-run, kills its container (SIGKILL) and, once the broker and
the other nodes have seen it go (and the home's nodes name another relay), starts the container
again. It checks that
the node resumed from its checkpoint (its log says at which step), rejoined (the others list it
alive with a new incarnation, and it gossips again), that every node reaches the accuracy target,
that the straggler was still training when the first fast node was done, that the broker
received every node's status, and (with ``--prometheus``) that the testbed's Prometheus scraped
every node (:mod:`tests.testbed.prometheus`); then it stops the testbed (each node writes its
final checkpoint and exits 0) and writes the report with ``murmur report``.

Everything it waits for is announced (a status on the broker, a line in a container's log, a
container's exit) except the checkpoint, which only the metrics log in the node's state dir
tells: that one is polled. Every wait has a deadline and fails by name.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiomqtt

from node.cli.report import REPORT_FILE
from node.telemetry.mqtt import make_client
from node.telemetry.mqtt_messages import OFFLINE, ONLINE, MqttConfig, parse_status
from tests.testbed.prometheus import SCRAPED, scraped_nodes

T = TypeVar("T")

VICTIM = "node-1"
#: The entry point's line naming the node, and the node's own lines that the check reads.
NAMED = re.compile(r"murmur-entrypoint: node (\S+) at (\S+)")
RESUMED = re.compile(r"resuming from \S+ at step (\d+)")
BROKER_UP = re.compile(r"mosquitto version \S+ running")


class CheckFailed(AssertionError):
    pass


def check(ok: bool, what: str) -> None:
    if not ok:
        raise CheckFailed(what)


@dataclass(frozen=True)
class CheckConfig:
    compose: tuple[str, ...]
    nodes: int  # replicas of the `node` service; the testbed has two more (seed, straggler)
    steps: int
    broker: str  # host:port the broker is published on
    target: float
    report_dir: Path
    prometheus: str | None = None  # host:port of the testbed's Prometheus; None: not checked
    homes: int = 0  # replicas of the `home` service, behind the home router
    swarm: str = "testbed"
    start_timeout_s: float = 180.0
    event_timeout_s: float = 120.0
    run_timeout_s: float = 600.0

    @property
    def project(self) -> str:
        return self.compose[self.compose.index("-p") + 1]

    @property
    def names(self) -> list[str]:
        return [
            "seed",
            "straggler",
            *(f"node-{k}" for k in range(1, self.nodes + 1)),
            *self.home_names,
        ]

    @property
    def home_names(self) -> list[str]:
        return [f"home-{k}" for k in range(1, self.homes + 1)]


@dataclass
class Board:
    """Every message the broker delivered, and a way to wait for the next one."""

    cfg: MqttConfig
    statuses: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    online: dict[str, bool] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def receive(self, topic: str, payload: bytes) -> None:
        parsed = self.cfg.parse_topic(topic)
        if parsed is None:
            return
        node_id, kind = parsed
        if kind == "status":
            status = parse_status(payload)
            check(status is not None, f"a malformed status on {topic}: {payload[:200]!r}")
            assert status is not None
            self.statuses.setdefault(node_id, []).append(status)
        elif kind == "online" and payload in (ONLINE, OFFLINE):
            self.online[node_id] = payload == ONLINE
        self.changed.set()

    def last(self, node_id: str) -> dict[str, Any]:
        return self.statuses[node_id][-1]

    async def wait(self, ok: Callable[[], bool], what: str, timeout_s: float) -> None:
        """Until ``ok()`` holds, checked on every message from the broker."""
        try:
            async with asyncio.timeout(timeout_s):
                while not ok():
                    self.changed.clear()
                    await self.changed.wait()
        except TimeoutError:
            raise CheckFailed(f"timed out after {timeout_s:.0f} s waiting for {what}") from None


async def listen(board: Board, connected: asyncio.Event) -> None:
    """Subscribe to the swarm's status and online topics (the broker has said it runs)."""
    try:
        async with make_client(board.cfg) as client:
            await client.subscribe(board.cfg.topic("+", "status"), qos=1)
            await client.subscribe(board.cfg.topic("+", "online"), qos=1)
            connected.set()
            async for message in client.messages:
                if isinstance(message.payload, bytes | bytearray):
                    board.receive(message.topic.value, bytes(message.payload))
    except aiomqtt.MqttError as err:
        lost = "lost the broker" if connected.is_set() else f"no broker at {board.cfg.broker}"
        raise CheckFailed(f"{lost}: {err}") from err


def run(*argv: str, timeout_s: float = 300.0, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )
    if done.returncode != 0:
        raise CheckFailed(f"`{shlex.join(argv)}` exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done.stdout


def logs(container: str, since: float | None = None) -> str:
    argv = ["docker", "logs", *(["--since", f"{since:.3f}"] if since else []), container]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    return done.stdout + done.stderr


async def poll(probe: Callable[[], T | None], what: str, timeout_s: float) -> T:
    """Call ``probe`` (on a thread) every half second until it returns something: for what
    nothing announces."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = await asyncio.to_thread(probe)
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise CheckFailed(f"timed out after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(0.5)


async def follow_log(
    container: str, pattern: re.Pattern[str], since: float, timeout_s: float
) -> re.Match[str]:
    """The first line the container prints from ``since`` on that matches ``pattern``."""
    proc = await asyncio.create_subprocess_exec(
        "docker",
        "logs",
        "--follow",
        "--since",
        f"{since:.3f}",
        container,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(timeout_s):
            while line := await proc.stdout.readline():
                if found := pattern.search(line.decode(errors="replace")):
                    return found
        raise CheckFailed(f"{container}'s log ended without {pattern.pattern!r}")
    except TimeoutError:
        raise CheckFailed(
            f"timed out after {timeout_s:.0f} s waiting for {pattern.pattern!r} in {container}"
        ) from None
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


@dataclass(frozen=True)
class TestbedNode:
    name: str
    container: str
    node_id: str
    address: str  # as its entry point advertises it


def find_nodes(cfg: CheckConfig) -> dict[str, TestbedNode] | None:
    """Each node's container and id, from what its container printed: the entry point's line
    naming it, then the node's ``ready`` line; None until every node has printed both."""
    out = run(
        "docker", "ps", "-a", "--filter", f"label=com.docker.compose.project={cfg.project}",
        "--format", '{{.ID}} {{.Label "com.docker.compose.service"}}',
    )  # fmt: skip
    found: dict[str, TestbedNode] = {}
    for container, service in (line.split() for line in out.splitlines()):
        if service not in ("seed", "straggler", "node", "home"):
            continue
        text = logs(container)
        if "Traceback" in text:
            raise CheckFailed(f"{service} container {container} failed:\n{text[-3000:]}")
        named = NAMED.search(text)
        ready = [json.loads(x) for x in text.splitlines() if x.startswith('{"event": "ready"')]
        if named and ready:
            found[named[1]] = TestbedNode(named[1], container, ready[0]["node_id"], named[2])
    return found if sorted(found) == sorted(cfg.names) else None


def checkpoint_step(node: TestbedNode) -> int:
    """The last checkpoint the node's metrics log records (-1 for none)."""
    out = run("docker", "exec", node.container, "cat", f"/state/{node.name}/metrics.jsonl")
    steps = [r["step"] for r in map(json.loads, out.splitlines()) if r["event"] == "checkpoint"]
    return steps[-1] if steps else -1


def report_rows(markdown: str) -> dict[str, dict[str, str]]:
    """The report's table of nodes, by state dir name."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| node |"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    header, body = rows[0], rows[2:]
    return {row[1]: dict(zip(header, row, strict=True)) for row in body}


def member(status: dict[str, Any], node_id: str) -> dict[str, Any] | None:
    return next((m for m in status["members"] if m["node_id"] == node_id), None)


def rejoined(
    board: Board, node_id: str, others: Iterable[str], since: float, incarnation: int
) -> bool:
    """Whether ``node_id``, back since ``since`` (wall-clock), has gossiped since, every one of
    ``others`` lists it alive with an incarnation above ``incarnation``, and one mixes with it."""
    mine = [s for s in board.statuses[node_id] if s["time"] > since and s["online"]]
    if not mine or mine[-1]["rounds"] == 0 or not mine[-1]["neighbours"]:
        return False  # it has not gossiped since it came back
    others = list(others)
    views = [member(board.last(i), node_id) for i in others]
    return all(
        m is not None and m["status"] == "alive" and m["incarnation"] > incarnation for m in views
    ) and any(
        any(n["node_id"] == node_id and n["in_mix"] for n in board.last(i)["neighbours"])
        for i in others
    )


@dataclass
class Run:
    """One run of the testbed, phase by phase; each phase checks what it is about."""

    cfg: CheckConfig
    board: Board
    nodes: dict[str, TestbedNode] = field(default_factory=dict)  # by name
    summary: dict[str, Any] = field(default_factory=dict)
    t0: float = field(default_factory=time.monotonic)
    #: The node killed and restarted, and the home's nodes that named it a relay then.
    victim: str = VICTIM
    relayed_by_victim: list[str] = field(default_factory=list)

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f} s] {text}", flush=True)

    @property
    def ids(self) -> set[str]:
        return {n.node_id for n in self.nodes.values()}

    def name(self, node_id: str) -> str:
        return next(n.name for n in self.nodes.values() if n.node_id == node_id)

    def last(self, node_id: str) -> dict[str, Any]:
        return self.board.last(node_id)

    async def start(self) -> None:
        cfg = self.cfg
        self.say(
            f"starting the testbed: seed, straggler, {cfg.nodes} nodes and {cfg.homes} behind "
            "the home router"
        )
        up = [*cfg.compose, "up", "-d", "--scale", f"node={cfg.nodes}", "--scale"]
        up.append(f"home={cfg.homes}")
        await asyncio.to_thread(run, *up, timeout_s=cfg.start_timeout_s)
        self.nodes = await poll(lambda: find_nodes(cfg), "every node to start", cfg.start_timeout_s)
        await self.board.wait(
            lambda: self.ids <= set(self.board.statuses), "every node's status", cfg.start_timeout_s
        )
        named = ", ".join(f"{n.name} {n.node_id[:8]}" for n in self.nodes.values())
        self.say(f"every node is up and reporting: {named}")

    async def watch_straggler(self) -> None:
        """Where the straggler is when the first fast node is done: nobody waited for it."""
        straggler = self.nodes["straggler"].node_id
        fast = self.ids - {straggler}
        await self.board.wait(
            lambda: any(self.last(i)["training_done"] for i in fast),
            "a fast node to finish",
            self.cfg.run_timeout_s,
        )
        step = self.last(straggler)["step"]
        self.summary["straggler_step_when_first_fast_node_done"] = step
        check(step < self.cfg.steps, "the straggler was done when the first fast node was")

    async def check_prometheus(self) -> None:
        """Prometheus scrapes every node: each one's series of SCRAPED are there."""
        server = self.cfg.prometheus
        assert server is not None
        # Nobody can dial the nodes in the home, Prometheus included.
        ids = {n.node_id for n in self.nodes.values() if n.name not in self.cfg.home_names}
        instances = await poll(
            lambda: scraped_nodes(server, ids),
            f"Prometheus at {server} to hold every node's {', '.join(SCRAPED)}",
            self.cfg.event_timeout_s,
        )
        self.summary["prometheus_targets"] = len(instances)
        self.say(f"Prometheus scraped every node ({len(instances)} targets, {len(SCRAPED)} series)")

    def relays_of(self, node_id: str) -> tuple[str, ...]:
        """The relays the seed's last status names for ``node_id`` (none: reached directly)."""
        record = member(self.last(self.nodes["seed"].node_id), node_id)
        return tuple(record["relays"]) if record is not None else ()

    async def choose_victim(self) -> None:
        """The node to kill: node-1, or with a home, a node (not the seed) that the home's
        nodes name as a relay, so that its death is also a relay's."""
        homes = self.cfg.home_names
        if not homes:
            return
        ids = [self.nodes[h].node_id for h in homes]
        await self.board.wait(
            lambda: all(self.relays_of(i) for i in ids),
            "the seed to know the relays of every node in the home",
            self.cfg.event_timeout_s,
        )
        by_address = {n.address: n.name for n in self.nodes.values()}
        named = {
            h: [by_address.get(r, r) for r in self.relays_of(self.nodes[h].node_id)] for h in homes
        }
        self.say("the home's relays: " + "; ".join(f"{h} {', '.join(r)}" for h, r in named.items()))
        relays = sorted({r for rs in named.values() for r in rs if r.startswith("node-")})
        relays = relays or sorted({r for rs in named.values() for r in rs if r != "seed"})
        check(bool(relays), f"the home's nodes name no relay but the seed: {named}")
        self.victim = relays[0]
        self.relayed_by_victim = [h for h, rs in named.items() if self.victim in rs]

    async def crash_and_restart(self) -> None:
        """Kill the victim's container once it has a checkpoint from well into its run, wait for
        the swarm to see it die (and the home's nodes, if it was their relay, to name another),
        start the container again, and see it resume and rejoin."""
        cfg, board = self.cfg, self.board
        await self.choose_victim()
        victim = self.nodes[self.victim]
        vid = victim.node_id
        others = self.ids - {vid}
        await board.wait(
            lambda: self.last(vid)["step"] >= cfg.steps // 4,
            f"{self.victim} to reach step {cfg.steps // 4}",
            cfg.run_timeout_s,
        )
        saved = await poll(
            lambda: step if (step := checkpoint_step(victim)) > 0 else None,
            f"a checkpoint of {self.victim}",
            cfg.event_timeout_s,
        )
        reported = self.last(vid)["step"]
        check(not self.last(vid)["training_done"], f"{self.victim} was done before it was killed")
        incarnation = max(m["incarnation"] for i in others if (m := member(self.last(i), vid)))
        await asyncio.to_thread(run, "docker", "kill", victim.container)
        await asyncio.to_thread(run, "docker", "wait", victim.container)
        self.say(f"killed {self.victim} (last reported step {reported}, a checkpoint at {saved})")

        await board.wait(
            lambda: board.online.get(vid) is False,
            f"the broker to see {self.victim} go (its will)",
            cfg.event_timeout_s,
        )
        await board.wait(
            lambda: all(
                (m := member(self.last(i), vid)) is None or m["status"] == "dead" for i in others
            ),
            f"every other node to find {self.victim} dead",
            cfg.event_timeout_s,
        )
        if self.relayed_by_victim:
            await board.wait(
                lambda: (
                    not any(
                        victim.address in self.relays_of(self.nodes[h].node_id)
                        for h in self.relayed_by_victim
                    )
                ),
                f"{', '.join(self.relayed_by_victim)} to name a relay other than {self.victim}",
                cfg.event_timeout_s,
            )
            self.say(f"{', '.join(self.relayed_by_victim)} named another relay")
        self.say(f"the broker and every other node saw {self.victim} die; starting it again")

        restarted_at = time.time()
        await asyncio.to_thread(run, "docker", "start", victim.container)
        resumed = await follow_log(victim.container, RESUMED, restarted_at, cfg.event_timeout_s)
        step = int(resumed[1])
        check(step > 0, f"{self.victim} started again from step 0, not from its checkpoint")
        check(step >= saved, f"{self.victim} resumed at step {step}, before its checkpoint {saved}")

        await board.wait(
            lambda: rejoined(board, vid, others, restarted_at, incarnation),
            f"{self.victim} to rejoin and gossip again",
            cfg.event_timeout_s,
        )
        first = next(s for s in board.statuses[vid] if s["time"] > restarted_at)
        check(first["step"] >= step, f"{self.victim}'s first status after it came back: {first}")
        self.say(f"{self.victim} resumed at step {step} and rejoined: all list it alive, gossiping")
        self.summary |= {"victim": self.victim, "killed_after_step": reported}
        self.summary |= {"checkpoint_step": saved, "relay_of": self.relayed_by_victim}
        self.summary["resumed_at_step"] = step

    async def finish(self) -> None:
        """Every node spends its budget and reaches the target."""
        cfg = self.cfg
        await self.board.wait(
            lambda: all(self.last(i)["training_done"] for i in self.ids),
            "every node to spend its step budget",
            cfg.run_timeout_s,
        )
        final = {self.name(i): self.last(i) for i in self.ids}
        accuracy = {n: s["eval_accuracy"] for n, s in final.items()}
        self.say("every node is done: " + ", ".join(f"{n} {a:.4f}" for n, a in accuracy.items()))
        for name, s in final.items():
            check(s["step"] == cfg.steps, f"{name} stopped at step {s['step']}")
            check(
                accuracy[name] >= cfg.target, f"{name} reached {accuracy[name]:.4f} < {cfg.target}"
            )
        self.summary["accuracy"] = {n: round(a, 4) for n, a in accuracy.items()}

    async def stop_and_report(self) -> None:
        """A clean stop: every node leaves, says goodbye on the broker (which stays up to hear
        it), writes its final checkpoint and exits 0. Then ``murmur report`` on the state."""
        cfg = self.cfg
        stop = [*cfg.compose, "stop", "-t", "60", "seed", "straggler", "node", "home"]
        await asyncio.to_thread(run, *stop, timeout_s=300)
        for n in self.nodes.values():
            code = run("docker", "inspect", "-f", "{{.State.ExitCode}}", n.container).strip()
            check(code == "0", f"{n.name} exited {code} on SIGTERM:\n{logs(n.container)[-3000:]}")
        await self.board.wait(
            lambda: all(self.board.online.get(i) is False for i in self.ids),
            "every node's goodbye on the broker",
            cfg.event_timeout_s,
        )
        counts = {self.name(i): len(self.board.statuses[i]) for i in self.ids}
        check(all(c >= 2 for c in counts.values()), f"status messages per node: {counts}")
        self.summary["status_messages"] = counts

        cfg.report_dir.mkdir(parents=True, exist_ok=True)
        out = {"REPORT_DIR": str(cfg.report_dir.resolve())}
        await asyncio.to_thread(run, *cfg.compose, "run", "--rm", "report", timeout_s=300, env=out)
        report = (cfg.report_dir / REPORT_FILE).read_text()
        for plot in ("accuracy.png", "distance.png", "loss.png"):
            path = cfg.report_dir / "plots" / plot
            check(path.stat().st_size > 10_000, f"plot {plot} is empty")
        rows = report_rows(report)
        check(sorted(rows) == sorted(cfg.names), f"the report's nodes: {sorted(rows)}")
        restarts = {name: row["restarts"] for name, row in rows.items()}
        check(
            restarts == {n: "1" if n == self.victim else "0" for n in cfg.names},
            f"restarts: {restarts}",
        )
        self.say(f"report: {cfg.report_dir / REPORT_FILE}")


async def drive(cfg: CheckConfig, board: Board) -> dict[str, Any]:
    testbed = Run(cfg, board)
    await testbed.start()
    side = [asyncio.create_task(testbed.watch_straggler())]
    if cfg.prometheus is not None:
        side.append(asyncio.create_task(testbed.check_prometheus()))
    try:
        await testbed.crash_and_restart()
        await testbed.finish()
        await asyncio.gather(*side)
    finally:
        for task in side:
            task.cancel()
    await testbed.stop_and_report()
    testbed.summary["seconds"] = round(time.monotonic() - testbed.t0, 1)
    return testbed.summary


async def main_async(cfg: CheckConfig) -> int:
    board = Board(MqttConfig(url=f"mqtt://{cfg.broker}", swarm=cfg.swarm))
    connected = asyncio.Event()
    started = time.time()
    await asyncio.to_thread(run, *cfg.compose, "up", "-d", "broker")
    try:
        # mosquitto says so once its listeners are open.
        broker = (await asyncio.to_thread(run, *cfg.compose, "ps", "-q", "broker")).strip()
        await follow_log(broker, BROKER_UP, started - 1, cfg.start_timeout_s)
    except CheckFailed as err:
        print(f"testbed check FAILED: {err}", file=sys.stderr, flush=True)
        return 1
    listener = asyncio.create_task(listen(board, connected))
    driver = asyncio.create_task(drive(cfg, board))
    try:
        done, _ = await asyncio.wait({listener, driver}, return_when=asyncio.FIRST_COMPLETED)
        if listener in done:
            listener.result()  # raises why it stopped
        summary = driver.result()
    except CheckFailed as err:
        print(f"testbed check FAILED: {err}", file=sys.stderr, flush=True)
        return 1
    finally:
        for task in (listener, driver):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, CheckFailed):
            await asyncio.gather(listener, driver, return_exceptions=True)
    print("testbed check passed: " + json.dumps(summary, sort_keys=True), flush=True)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--compose", required=True, help="the compose command, with -p and -f")
    p.add_argument("--nodes", type=int, default=2, help="replicas of the node service")
    p.add_argument("--homes", type=int, default=0, help="replicas of the home service")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--broker", required=True, metavar="HOST:PORT")
    p.add_argument("--target", type=float, default=0.93, help="accuracy every node must reach")
    p.add_argument("--report-dir", type=Path, required=True)
    p.add_argument("--prometheus", metavar="HOST:PORT", help="the testbed's Prometheus, checked")
    args = p.parse_args()
    cfg = CheckConfig(
        compose=tuple(shlex.split(args.compose)),
        nodes=args.nodes,
        steps=args.steps,
        broker=args.broker,
        target=args.target,
        report_dir=args.report_dir,
        prometheus=args.prometheus,
        homes=args.homes,
    )
    return asyncio.run(main_async(cfg))


if __name__ == "__main__":
    sys.exit(main())
