"""The testbed's check in Docker Swarm mode: deploy docker/stack.yml, crash a task, and judge it.

``scripts/testbed ci`` runs it after the compose check, on a single-node swarm of the same
engine, with the same images::

    python -m tests.testbed.swarm_check --stack murmur-ci --nodes 2 --steps 30000 \\
        --broker 127.0.0.1:18830

It deploys the stack, listens to the broker the nodes report to, and once every node is up and
``node-1`` has written a checkpoint mid-run, kills its container (SIGKILL) and leaves the rest to
the orchestrator. It checks that Swarm started a new task in the same slot, that the new task is
the same node (same id: its key came from the slot's own volume) and resumed from its checkpoint
(its log says at which step), that it rejoined (the others list it alive with a new incarnation,
and it gossips again), that every node reaches the accuracy target, that every node says goodbye
when its service is removed, and that every slot's volume holds that slot's node alone.

Everything it waits for is announced (a status on the broker, a line in a container's log)
except the checkpoint and the orchestrator's new task, which are polled. Every wait has a
deadline and fails by name.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node.telemetry.mqtt_messages import MqttConfig
from tests.testbed.check import (
    BROKER_UP,
    NAMED,
    RESUMED,
    Board,
    CheckFailed,
    TestbedNode,
    check,
    checkpoint_step,
    follow_log,
    listen,
    logs,
    member,
    poll,
    rejoined,
    run,
)

STACK_FILE = Path(__file__).resolve().parents[2] / "docker" / "stack.yml"
VICTIM = "node-1"


@dataclass(frozen=True)
class SwarmConfig:
    stack: str
    nodes: int  # replicas of the `node` service; the stack has two more (seed, straggler)
    steps: int
    broker: str  # host:port the broker is published on
    target: float
    image: str = "murmur-node:latest"
    swarm: str = "testbed"
    start_timeout_s: float = 180.0
    event_timeout_s: float = 120.0
    run_timeout_s: float = 600.0

    @property
    def names(self) -> list[str]:
        return ["seed", "straggler", *(f"node-{k}" for k in range(1, self.nodes + 1))]

    def service(self, name: str) -> str:
        return f"{self.stack}_{name}"

    def env(self) -> dict[str, str]:
        """What docker/stack.yml reads from the environment."""
        return {
            "STACK": self.stack,
            "NODES": str(self.nodes),
            "STEPS": str(self.steps),
            "MQTT_PORT": self.broker.rsplit(":", 1)[1],
            "MURMUR_IMAGE": self.image,
            "CHECKPOINT_INTERVAL": "2",
        }


def containers(cfg: SwarmConfig, service: str) -> list[tuple[str, str]]:
    """The running containers of one of the stack's services: (id, task name), where a task's
    name is SERVICE.SLOT.TASK_ID."""
    out = run(
        "docker", "ps", "--filter", f"label=com.docker.swarm.service.name={cfg.service(service)}",
        "--format", '{{.ID}} {{.Label "com.docker.swarm.task.name"}}',
    )  # fmt: skip
    return [(c, task) for c, task in (line.split() for line in out.splitlines())]


def node_in(container: str) -> TestbedNode | None:
    """The node a container runs, from its entry point's line naming it and the node's ``ready``
    line; None until it has printed both."""
    text = logs(container)
    if "Traceback" in text:
        raise CheckFailed(f"container {container} failed:\n{text[-3000:]}")
    named = NAMED.search(text)
    ready = [json.loads(x) for x in text.splitlines() if x.startswith('{"event": "ready"')]
    if not (named and ready):
        return None
    return TestbedNode(named[1], container, ready[0]["node_id"], named[2])


def find_nodes(cfg: SwarmConfig) -> dict[str, TestbedNode] | None:
    found = {}
    for service in ("seed", "straggler", "node"):
        for container, _ in containers(cfg, service):
            if (n := node_in(container)) is not None:
                found[n.name] = n
    return found if sorted(found) == sorted(cfg.names) else None


@dataclass
class SwarmRun:
    cfg: SwarmConfig
    board: Board
    nodes: dict[str, TestbedNode] = field(default_factory=dict)  # by name
    summary: dict[str, Any] = field(default_factory=dict)
    t0: float = field(default_factory=time.monotonic)

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f} s] {text}", flush=True)

    @property
    def ids(self) -> set[str]:
        return {n.node_id for n in self.nodes.values()}

    def last(self, node_id: str) -> dict[str, Any]:
        return self.board.last(node_id)

    async def start(self) -> None:
        cfg = self.cfg
        self.nodes = await poll(lambda: find_nodes(cfg), "every task to start", cfg.start_timeout_s)
        await self.board.wait(
            lambda: self.ids <= set(self.board.statuses), "every node's status", cfg.start_timeout_s
        )
        named = ", ".join(f"{n.name} {n.node_id[:8]}" for n in self.nodes.values())
        self.say(f"every task is up and reporting: {named}")

    async def crash(self) -> None:
        """Kill node-1's container once it has a checkpoint from well into its run; Swarm starts
        a new task in its slot, which must be the same node, resumed and rejoined."""
        cfg, board = self.cfg, self.board
        victim = self.nodes[VICTIM]
        vid = victim.node_id
        others = self.ids - {vid}
        await board.wait(
            lambda: self.last(vid)["step"] >= cfg.steps // 4,
            f"{VICTIM} to reach step {cfg.steps // 4}",
            cfg.run_timeout_s,
        )
        saved = await poll(
            lambda: step if (step := checkpoint_step(victim)) > 0 else None,
            f"a checkpoint of {VICTIM}",
            cfg.event_timeout_s,
        )
        reported = self.last(vid)["step"]
        check(not self.last(vid)["training_done"], f"{VICTIM} was done before it was killed")
        incarnation = max(m["incarnation"] for i in others if (m := member(self.last(i), vid)))
        killed_at = time.time()
        await asyncio.to_thread(run, "docker", "kill", victim.container)
        self.say(f"killed {VICTIM}'s task (last reported step {reported}, a checkpoint at {saved})")

        def new_task() -> str | None:
            slot = f"{cfg.service('node')}.{VICTIM.rsplit('-', 1)[1]}."
            fresh = [c for c, task in containers(cfg, "node") if task.startswith(slot)]
            return next((c for c in fresh if c != victim.container), None)

        container = await poll(new_task, f"Swarm to start a new task for {VICTIM}'s slot", 60.0)
        resumed = await follow_log(container, RESUMED, killed_at, cfg.event_timeout_s)
        step = int(resumed[1])
        check(step >= saved > 0, f"{VICTIM} resumed at step {step}, not at its checkpoint {saved}")
        again = await poll(lambda: node_in(container), f"{VICTIM}'s new task to be ready", 60.0)
        check(again.node_id == vid, f"{VICTIM}'s slot now runs {again.node_id}, not {vid}")
        check(again.name == VICTIM, f"the new task of {VICTIM}'s slot calls itself {again.name}")
        self.nodes[VICTIM] = again

        await board.wait(
            lambda: rejoined(board, vid, others, killed_at, incarnation),
            f"{VICTIM} to rejoin and gossip again",
            cfg.event_timeout_s,
        )
        self.say(f"Swarm restarted {VICTIM}: same id, resumed at step {step}, rejoined")
        self.summary |= {"killed_after_step": reported, "checkpoint_step": saved}
        self.summary["resumed_at_step"] = step

    async def finish(self) -> None:
        cfg = self.cfg
        await self.board.wait(
            lambda: all(self.last(i)["training_done"] for i in self.ids),
            "every node to spend its step budget",
            cfg.run_timeout_s,
        )
        by_id = {n.node_id: n.name for n in self.nodes.values()}
        accuracy = {by_id[i]: self.last(i)["eval_accuracy"] for i in self.ids}
        self.say("every node is done: " + ", ".join(f"{n} {a:.4f}" for n, a in accuracy.items()))
        for i in self.ids:
            s = self.last(i)
            check(s["step"] == cfg.steps, f"{by_id[i]} stopped at step {s['step']}")
            check(s["eval_accuracy"] >= cfg.target, f"{by_id[i]} reached {s['eval_accuracy']:.4f}")
        self.summary["accuracy"] = {n: round(a, 4) for n, a in accuracy.items()}

    async def stop(self) -> None:
        """Remove the node services: every node gets SIGTERM and says goodbye on the broker,
        which stays up to hear it. Then every slot's volume holds its own node's dir alone."""
        cfg = self.cfg
        services = [cfg.service(n) for n in ("seed", "straggler", "node")]
        await asyncio.to_thread(run, "docker", "service", "rm", *services)
        await self.board.wait(
            lambda: all(self.board.online.get(i) is False for i in self.ids),
            "every node's goodbye on the broker",
            cfg.event_timeout_s,
        )
        held = {}
        for k in range(1, cfg.nodes + 1):
            volume = f"{cfg.stack}_node-state-{k}"
            out = await asyncio.to_thread(
                run, "docker", "run", "--rm", "--network", "none", "-v", f"{volume}:/s",
                "--entrypoint", "ls", cfg.image, "/s",
            )  # fmt: skip
            held[volume] = out.split()
            check(held[volume] == [f"node-{k}"], f"{volume} holds {held[volume]}")
        self.summary["volumes"] = held
        self.say("every node said goodbye; every slot's volume holds its own node: " + str(held))


async def drive(cfg: SwarmConfig, board: Board) -> dict[str, Any]:
    testbed = SwarmRun(cfg, board)
    await testbed.start()
    await testbed.crash()
    await testbed.finish()
    await testbed.stop()
    testbed.summary["seconds"] = round(time.monotonic() - testbed.t0, 1)
    return testbed.summary


async def main_async(cfg: SwarmConfig) -> int:
    board = Board(MqttConfig(url=f"mqtt://{cfg.broker}", swarm=cfg.swarm))
    connected = asyncio.Event()
    started = time.time()
    # The image is this host's own: no registry to ask for its digest.
    deploy = ["docker", "stack", "deploy", "--resolve-image", "never", "-c", str(STACK_FILE)]
    deploy.append(cfg.stack)
    listener: asyncio.Task[None] | None = None
    driver: asyncio.Task[dict[str, Any]] | None = None
    try:
        await asyncio.to_thread(run, *deploy, env=cfg.env())
        broker = await poll(
            lambda: next((c for c, _ in containers(cfg, "broker")), None),
            "the broker's task",
            cfg.start_timeout_s,
        )
        await follow_log(broker, BROKER_UP, started - 1, cfg.start_timeout_s)
        listener = asyncio.create_task(listen(board, connected))
        driver = asyncio.create_task(drive(cfg, board))
        done, _ = await asyncio.wait({listener, driver}, return_when=asyncio.FIRST_COMPLETED)
        if listener in done:
            listener.result()  # raises why it stopped
        summary = driver.result()
    except CheckFailed as err:
        print(f"swarm check FAILED: {err}", file=sys.stderr, flush=True)
        return 1
    finally:
        tasks = [t for t in (listener, driver) if t is not None]
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, CheckFailed):
            await asyncio.gather(*tasks, return_exceptions=True)
    print("swarm check passed: " + json.dumps(summary, sort_keys=True), flush=True)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stack", required=True, help="the stack's name")
    p.add_argument("--nodes", type=int, default=2, help="replicas of the node service")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--broker", required=True, metavar="HOST:PORT")
    p.add_argument("--target", type=float, default=0.93, help="accuracy every node must reach")
    p.add_argument("--image", default=os.environ.get("MURMUR_IMAGE", "murmur-node:latest"))
    args = p.parse_args()
    cfg = SwarmConfig(
        stack=args.stack,
        nodes=args.nodes,
        steps=args.steps,
        broker=args.broker,
        target=args.target,
        image=args.image,
    )
    return asyncio.run(main_async(cfg))


if __name__ == "__main__":
    sys.exit(main())
