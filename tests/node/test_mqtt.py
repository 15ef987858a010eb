"""MQTT telemetry and discovery against a real mosquitto broker, with real node processes where
a node is killed or its broker goes away."""

from __future__ import annotations

import asyncio
import io
import json
import random
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

import aiomqtt
import pytest

from node.cli.monitor import MonitorConfig, SwarmBoard, run_monitor
from node.config import NodeConfig
from node.daemon.node import Node
from node.runtime import Runtime
from node.telemetry.mqtt import Backoff, MqttBridge
from node.telemetry.mqtt_messages import (
    MqttConfig,
    parse_address,
    parse_broker_url,
    parse_status,
    status_payload,
)
from node.telemetry.status import NodeStatus
from node.transport.base import Rejected, Unreachable
from node.transport.grpc import GrpcTransport
from tests.mqtt_broker import MosquittoBroker, free_port
from tests.node.helpers import config, poll

TIMEOUT_S = 30.0

#: The status payload's documented keys (README, node/telemetry/mqtt.py) and their JSON types.
SCHEMA: dict[str, tuple[type, ...]] = {
    "node_id": (str,),
    "address": (str,),
    "device": (str,),
    "codec": (str,),
    "online": (bool,),
    "time": (float,),
    "step": (int,),
    "step_budget": (int,),
    "training_done": (bool,),
    "train_loss": (float, type(None)),
    "eval_loss": (float, type(None)),
    "eval_accuracy": (float,),
    "eval_step": (int,),
    "eval_age_s": (float,),
    "interval_s": (float,),
    "rounds": (int,),
    "bytes_sent": (int,),
    "bytes_sent_fp32": (int,),
    "bytes_received": (int,),
    "samples_per_s": (float,),
    "neighbours": (list,),
    "members": (list,),
    "rejected": (dict,),
}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[MosquittoBroker]:
    b = MosquittoBroker(tmp_path)
    b.start()
    yield b
    b.stop()


# -- pure parts -------------------------------------------------------------------------------


def test_broker_urls() -> None:
    b = parse_broker_url("mqtt://user:p%40ss@example.org:1884")
    assert (b.host, b.port, b.username, b.password) == ("example.org", 1884, "user", "p@ss")
    assert str(b) == "mqtt://example.org:1884"  # the password stays out of logs
    assert parse_broker_url("mqtt://10.0.0.1").port == 1883
    for bad in ("http://h:1", "mqtt://", "mqtt://h:99999", "mqtt://h:1/x", "h:1"):
        with pytest.raises(ValueError, match="MQTT URL"):
            parse_broker_url(bad)


def test_config_refuses_wildcards_in_topics() -> None:
    for swarm in ("a/b", "+", "x#", ""):
        with pytest.raises(ValueError, match="swarm"):
            MqttConfig(url="mqtt://h", swarm=swarm)
    cfg = MqttConfig(url="mqtt://h", swarm="s", prefix="org/murmur")
    assert cfg.topic("abc", "status") == "org/murmur/s/abc/status"
    assert cfg.parse_topic("org/murmur/s/abc/online") == ("abc", "online")
    assert cfg.parse_topic("org/murmur/other/abc/online") is None
    assert cfg.parse_topic("org/murmur/s/abc/weather") is None


def test_node_config_checks_its_mqtt_settings() -> None:
    with pytest.raises(ValueError, match="discovery needs a broker"):
        NodeConfig(mqtt_discovery=True)
    with pytest.raises(ValueError, match="MQTT URL"):
        NodeConfig(mqtt="tcp://broker:1883")
    with pytest.raises(ValueError, match="swarm"):
        NodeConfig(mqtt="mqtt://broker", swarm="a/b")
    cfg = NodeConfig(mqtt="mqtt://broker", mqtt_discovery=True, swarm="lab", mqtt_prefix="x/y")
    mqtt = cfg.mqtt_config()
    assert mqtt is not None
    assert (mqtt.discovery, mqtt.topic("n", "online")) == (True, "x/y/lab/n/online")
    assert NodeConfig().mqtt_config() is None


def test_backoff_doubles_to_the_cap_with_jitter() -> None:
    backoff = Backoff(0.5, 4.0, random.Random(1))
    delays = [backoff.next() for _ in range(6)]
    for delay, base in zip(delays, [0.5, 1.0, 2.0, 4.0, 4.0, 4.0], strict=True):
        assert 0.5 * base <= delay <= min(4.0, 1.5 * base)
    backoff.reset()
    assert backoff.next() <= 0.75


def test_addresses_are_validated() -> None:
    assert parse_address(b"10.0.0.5:7070") == "10.0.0.5:7070"
    assert parse_address(b"[::1]:7070") == "[::1]:7070"
    for bad in (b"", b"host", b"host:0", b"host:70000", b":7070", b"a b:1", b"\xff:1"):
        assert parse_address(bad) is None


def _status(**overrides: Any) -> NodeStatus:
    base: dict[str, Any] = dict(
        node_id="n" * 32,
        address="127.0.0.1:1",
        device="cpu",
        codec="int8",
        step=0,
        step_budget=0,
        training_done=False,
        train_loss=float("nan"),
        eval_accuracy=-1.0,
        rounds=0,
        bytes_sent=0,
        bytes_sent_fp32=0,
        bytes_received=0,
        samples_per_s=0.0,
    )
    return NodeStatus(**{**base, **overrides})


def test_a_status_before_the_first_step_is_valid_json() -> None:
    payload = status_payload(_status(), online=True, now=12.5, interval_s=2.0)
    data = json.loads(payload, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert (data["train_loss"], data["eval_loss"], data["eval_step"]) == (None, None, -1)
    assert (data["online"], data["time"], data["interval_s"]) == (True, 12.5, 2.0)
    assert parse_status(payload) == data
    for bad in (b"{", b"[]", b'{"node_id": 1}', json.dumps({**data, "step": True}).encode()):
        assert parse_status(bad) is None


def test_the_board_takes_liveness_from_the_online_topic() -> None:
    board = SwarmBoard(MqttConfig(url="mqtt://h", swarm="s"))
    a, b = "a" * 32, "b" * 32
    for node_id, step in ((a, 10), (b, 20)):
        payload = status_payload(_status(node_id=node_id, step=step), True, 100.0, 2.0)
        board.receive(f"murmur/s/{node_id}/status", payload, now=100.0)
    board.receive(f"murmur/s/{b}/online", b"false")  # killed: its status still says online
    board.receive(f"murmur/s/{a}/status", b"{not json")
    board.receive(f"murmur/s/{a}/online", b"perhaps")
    board.receive(f"murmur/s/{b}/status", status_payload(_status(node_id=a), True, 0.0, 2.0))
    board.receive(f"murmur/other/{a}/online", b"false")
    assert [(s["node_id"], s["step"], s["online"]) for s in board.statuses(103.0)] == [
        (a, 10, True),
        (b, 20, False),
    ]
    rows = board.table(now=103.0, width=100).splitlines()
    assert rows[0].startswith("swarm s: 2 nodes, 1 online, 1 offline; mqtt://h:1883")
    [row_a] = [r.split() for r in rows if r.startswith(a[:12])]
    [row_b] = [r.split() for r in rows if r.startswith(b[:12])]
    assert row_a[1:3] == ["127.0.0.1:1", "online"]
    assert row_b[2] == "offline"
    assert row_b[-1] == "3.0s"  # last seen
    board.receive(f"murmur/s/{b}/status", b"")  # a retained status deleted by hand
    assert [s["node_id"] for s in json.loads(board.to_json(103.0))] == [a]


# -- one node in this process -----------------------------------------------------------------


@asynccontextmanager
async def subscribed(url: str, *filters: str) -> AsyncIterator[aiomqtt.Client]:
    b = parse_broker_url(url)
    async with aiomqtt.Client(b.host, b.port) as client:
        for f in filters:
            await client.subscribe(f, qos=1)
        yield client


async def next_message(
    client: aiomqtt.Client, ok: Callable[[str, bytes], bool], timeout_s: float = TIMEOUT_S
) -> tuple[str, bytes]:
    """The next message whose (topic, payload) is ``ok``."""
    async with asyncio.timeout(timeout_s):
        async for message in client.messages:
            assert isinstance(message.payload, bytes)
            if ok(message.topic.value, message.payload):
                return message.topic.value, message.payload
    raise AssertionError("the broker closed the connection")


async def retained(url: str, topic_filter: str) -> dict[str, bytes]:
    """Every retained message under ``topic_filter``, by topic."""
    marker = "murmur-tests/marker"
    got: dict[str, bytes] = {}
    async with subscribed(url, topic_filter, marker) as client:
        # The broker sends a subscription's retained messages before anything published after.
        await client.publish(marker, b"", qos=1)
        async with asyncio.timeout(TIMEOUT_S):
            async for message in client.messages:
                if message.topic.value == marker:
                    return got
                assert message.retain
                assert isinstance(message.payload, bytes)
                got[message.topic.value] = message.payload
    raise AssertionError("the broker closed the connection")


def check_schema(status: dict[str, Any]) -> None:
    missing = SCHEMA.keys() - status.keys()
    assert not missing, f"missing keys {missing}"
    for key, types in SCHEMA.items():
        assert isinstance(status[key], types), f"{key} is {status[key]!r}"
    for n in status["neighbours"]:
        assert isinstance(n["node_id"], str)
        assert isinstance(n["bytes_sent"], int)
    for m in status["members"]:
        assert {"node_id", "address", "incarnation", "status"} <= m.keys()


async def test_status_messages_follow_the_documented_schema(
    tmp_path: Path, broker: MosquittoBroker
) -> None:
    cfg = config(tmp_path / "n", mqtt=broker.url, mqtt_interval_s=0.2, swarm="lab")
    async with subscribed(broker.url, "murmur/lab/+/status", "murmur/lab/+/online") as sub:
        node = await Node.create(cfg)
        await node.start()
        try:
            mine = f"murmur/lab/{node.node_id}"
            _, online = await next_message(sub, lambda t, _: t == f"{mine}/online")
            assert online == b"true"
            # A status from after the first evaluation (step 100) carries every figure.
            _, payload = await next_message(
                sub, lambda t, p: t == f"{mine}/status" and json.loads(p)["eval_accuracy"] >= 0
            )
            status = json.loads(payload)
            check_schema(status)
            assert status["node_id"] == node.node_id
            assert status["address"] == node.address
            assert status["online"] is True
            assert status["step"] >= 100
            assert abs(status["time"] - time.time()) < 10
            assert [m["node_id"] for m in status["members"]] == [node.node_id]
        finally:
            await node.stop()
        # A clean stop says offline, then a last status that says so too.
        await next_message(sub, lambda t, p: t == f"{mine}/online" and p == b"false")
        _, last = await next_message(sub, lambda t, _: t == f"{mine}/status")
        assert json.loads(last)["online"] is False
    # All of it is retained, for whoever connects later.
    got = await retained(broker.url, f"{mine}/+")
    assert set(got) == {f"{mine}/online", f"{mine}/status"}
    assert got[f"{mine}/online"] == b"false"
    assert json.loads(got[f"{mine}/status"])["node_id"] == node.node_id


async def test_discovery_ignores_bad_announcements_and_joins_live_members(
    tmp_path: Path, broker: MosquittoBroker
) -> None:
    cfg = MqttConfig(url=broker.url, swarm="d", discovery=True, interval_s=0.5)
    joined: list[tuple[str, str]] = []
    news = asyncio.Event()

    async def join(node_id: str, address: str) -> None:
        joined.append((node_id, address))
        news.set()

    async def status() -> NodeStatus:
        return _status(node_id="me" * 16)

    async with subscribed(broker.url) as pub:
        # Before the bridge connects: a live member, and a dead one whose address stayed.
        await pub.publish(cfg.topic("early", "address"), b"127.0.0.1:7001", qos=1, retain=True)
        await pub.publish(cfg.topic("early", "online"), b"true", qos=1, retain=True)
        await pub.publish(cfg.topic("dead", "address"), b"127.0.0.1:7002", qos=1, retain=True)
        await pub.publish(cfg.topic("dead", "online"), b"false", qos=1, retain=True)
        bridge = MqttBridge(cfg, "me" * 16, "127.0.0.1:7000", status, Runtime.on_loop(), join)
        bridge.start()
        try:
            assert await bridge.announced() == ["127.0.0.1:7001"]
            bridge.follow()
            await asyncio.wait_for(news.wait(), TIMEOUT_S)
            assert joined == [("early", "127.0.0.1:7001")]
            for topic, payload in [
                (cfg.topic("junk", "address"), b"not an address"),
                (cfg.topic("junk", "address"), b"\xff\xfe:1"),
                (cfg.topic("junk", "online"), b"yes"),
                (cfg.topic("early", "online"), b"maybe"),
                (cfg.topic("junk2", "address"), b"127.0.0.1:7003"),  # online never said
                ("murmur/other-swarm/x/address", b"127.0.0.1:7004"),
                (cfg.topic("late", "address"), b"127.0.0.1:7005"),
                (cfg.topic("late", "online"), b"true"),
            ]:
                await pub.publish(topic, payload, qos=1)
            # One publisher's messages arrive in order: the junk was handled before "late".
            await until_news(lambda: len(joined) == 2, news)
            assert joined[1] == ("late", "127.0.0.1:7005")
        finally:
            await bridge.stop()
    # A clean stop clears the address (an empty retained message deletes the retained one).
    got = await retained(broker.url, cfg.topic("me" * 16, "+"))
    assert set(got) == {cfg.topic("me" * 16, "online"), cfg.topic("me" * 16, "status")}
    assert got[cfg.topic("me" * 16, "online")] == b"false"


async def test_nodes_that_started_apart_merge_when_the_broker_comes(
    tmp_path: Path, broker: MosquittoBroker
) -> None:
    broker.stop()
    cfgs = [
        config(tmp_path / name, mqtt=broker.url, mqtt_discovery=True, mqtt_interval_s=0.5)
        for name in ("a", "b")
    ]
    nodes = [await Node.create(cfg) for cfg in cfgs]
    try:
        # No broker, no --join: each starts a swarm of its own.
        await asyncio.gather(*(node.start() for node in nodes))
        assert [len(node.peers.view) for node in nodes] == [1, 1]
        broker.start()
        ids = {node.node_id for node in nodes}

        def one_swarm(node: Node) -> Callable[[], bool]:
            return lambda: {m.node_id for m in node.peers.view.members} == ids

        # Each hears the other's announcement once it reconnects, and joins it.
        for node in nodes:
            await node.wait_until(one_swarm(node), TIMEOUT_S)
    finally:
        for node in nodes:
            await node.stop(grace_s=0)


async def until_news(done: Callable[[], bool], news: asyncio.Event) -> None:
    async with asyncio.timeout(TIMEOUT_S):
        while not done():
            news.clear()
            await news.wait()


# -- real node processes ----------------------------------------------------------------------


class Proc:
    """``murmur run`` in a child process; its log goes to a file (it may be long)."""

    def __init__(self, proc: asyncio.subprocess.Process, log: Path) -> None:
        self.proc = proc
        self.log = log

    async def event(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), TIMEOUT_S * 2)
        assert line, "the node exited:\n" + self.log.read_text()
        event: dict[str, Any] = json.loads(line)
        return event

    async def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(self.proc.wait(), TIMEOUT_S)


class Launch(Protocol):
    async def __call__(
        self, name: str, *args: str, log_level: str = ...
    ) -> tuple[Proc, dict[str, Any]]: ...


@pytest.fixture
async def procs(tmp_path: Path) -> AsyncIterator[Launch]:
    started: list[Proc] = []

    async def run(name: str, *args: str, log_level: str = "INFO") -> tuple[Proc, dict[str, Any]]:
        log = tmp_path / f"{name}.log"
        with log.open("wb") as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "node",
                "--log-level",
                log_level,
                "run",
                "--listen",
                "127.0.0.1:0",
                "--device",
                "cpu",
                "--threads",
                "1",
                "--state-dir",
                str(tmp_path / name),
                "--insecure",
                *args,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
            )
        p = Proc(proc, log)
        started.append(p)
        ready = await p.event()
        assert ready["event"] == "ready"
        return p, ready

    yield run
    for p in started:
        if p.proc.returncode is None:
            p.proc.kill()
            await p.proc.wait()


async def node_status(address: str) -> NodeStatus | None:
    transport = GrpcTransport()
    try:
        return await transport.call_status(address, 5.0)
    except (Unreachable, Rejected):
        return None
    finally:
        await transport.close(0)


def mqtt_warnings(log: Path) -> list[str]:
    return [ln for ln in log.read_text().splitlines() if "WARNING node.telemetry.mqtt" in ln]


@pytest.mark.timeout(120)
async def test_discovery_forms_a_swarm_without_join_and_monitor_sees_it(
    broker: MosquittoBroker, procs: Launch
) -> None:
    flags = ["--mqtt", broker.url, "--mqtt-discovery", "--swarm", "disc", "--mqtt-interval", "0.5"]
    flags += ["--wait-members", "3", "--steps", "50", "--swim-period", "0.3"]
    readies = []
    for i in range(3):  # no --join anywhere: the first starts alone, the others hear of it
        _, ready = await procs(f"n{i}", *flags, "--shard", f"{i}/3")
        readies.append(ready)
    ids = {r["node_id"] for r in readies}

    async def all_know_all() -> bool:
        statuses = [await node_status(r["address"]) for r in readies]
        return all(
            s is not None and {m.node_id for m in s.members if m.live} == ids for s in statuses
        )

    await poll(all_know_all, "every node to know all three members", TIMEOUT_S)

    async def monitor_sees_three() -> list[dict[str, Any]] | None:
        cmd = ["monitor", "--mqtt", broker.url, "--swarm", "disc", "--once", "--timeout", "0.5"]
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "node", *cmd, "--json", stdout=asyncio.subprocess.PIPE
        )
        out, _ = await asyncio.wait_for(proc.communicate(), TIMEOUT_S)
        assert proc.returncode == 0
        statuses: list[dict[str, Any]] = json.loads(out)
        done = len(statuses) == 3 and all(len(s["members"]) == 3 for s in statuses)
        return statuses if done else None

    statuses = await poll(
        monitor_sees_three, "the monitor to see three nodes that know all", TIMEOUT_S
    )
    assert statuses is not None
    assert {s["node_id"] for s in statuses} == ids
    assert all(s["online"] for s in statuses)
    for s in statuses:
        check_schema(s)


@pytest.mark.timeout(60)
async def test_the_last_will_marks_a_killed_node_offline(
    broker: MosquittoBroker, procs: Launch
) -> None:
    async with subscribed(broker.url, "fleet/default/+/+") as sub:
        p, ready = await procs("n", "--mqtt", broker.url, "--mqtt-prefix", "fleet")
        topic = f"fleet/default/{ready['node_id']}/online"
        await next_message(sub, lambda t, m: t == topic and m == b"true")
        await next_message(sub, lambda t, _: t == topic.replace("online", "status"))
        p.proc.kill()  # SIGKILL: no goodbye; the broker sees the connection drop
        await next_message(sub, lambda t, m: t == topic and m == b"false")
    cmd = ["monitor", "--mqtt", broker.url, "--mqtt-prefix", "fleet", "--once", "--timeout", "0.5"]
    for extra in ([], ["--hide-departed", "--width", "60"]):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "node", *cmd, *extra, stdout=asyncio.subprocess.PIPE
        )
        out, _ = await asyncio.wait_for(proc.communicate(), TIMEOUT_S)
        text = out.decode()
        row = [ln for ln in text.splitlines() if ln.startswith(ready["node_id"][:8])]
        if extra:  # the departed node is left out, and the title says so
            assert not row, text
            assert all(len(line) <= 60 for line in text.splitlines()), text
            assert text.startswith("swarm default: 1 node, 1 offline, 1 departed hidden; mqtt")
        else:
            assert len(row) == 1, text
            assert " offline " in row[0]


@pytest.mark.timeout(90)
async def test_training_goes_on_without_the_broker_and_telemetry_comes_back(
    broker: MosquittoBroker, procs: Launch
) -> None:
    p, ready = await procs("n", "--mqtt", broker.url, "--mqtt-interval", "0.3")
    status_topic = f"murmur/default/{ready['node_id']}/status"
    async with subscribed(broker.url, status_topic) as sub:
        await next_message(sub, lambda *_: True)
    broker.stop(kill=True)

    async def step() -> int:
        s = await node_status(ready["address"])
        assert s is not None, "the node stopped answering"
        return s.step

    down_at = await step()

    # A thousand steps is seconds on a slow machine: the node keeps training through an outage
    # long enough for it to notice and to retry.
    async def trained_on() -> bool:
        return await step() > down_at + 1000

    await poll(trained_on, "training to go on without the broker", TIMEOUT_S)
    # Taken before the start: the node may reconnect and publish within the moment between the
    # broker's start and the next line (a status 5 ms before a time taken after it, once).
    restarted = time.time()
    broker.start()
    async with subscribed(broker.url, status_topic) as sub:
        _, payload = await next_message(sub, lambda *_: True)
    status = json.loads(payload)
    assert status["time"] >= restarted  # the broker kept nothing: this is a fresh one
    assert status["step"] > down_at + 1000
    assert await p.stop() == 0
    assert len(mqtt_warnings(p.log)) == 1, p.log.read_text()
    assert "is back after" in p.log.read_text()


@pytest.mark.timeout(60)
async def test_a_broker_that_does_not_exist_costs_one_warning(
    tmp_path: Path, procs: Launch
) -> None:
    nowhere = f"mqtt://127.0.0.1:{free_port()}"
    p, _ = await procs("n", "--mqtt", nowhere, "--steps", "100", log_level="DEBUG")
    trained = await p.event()
    assert trained["event"] == "trained"
    assert trained["step"] == 100

    async def tried_thrice() -> bool:
        return p.log.read_text().count("MQTT: next try in") >= 3

    await poll(tried_thrice, "the node to try the broker three times", TIMEOUT_S)
    assert await p.stop() == 0
    warnings = mqtt_warnings(p.log)
    assert len(warnings) == 1
    assert "telemetry paused" in warnings[0]


@pytest.mark.timeout(120)
async def test_a_node_killed_while_the_broker_was_down_shows_as_stale(
    tmp_path: Path, procs: Launch
) -> None:
    """Issue 13: the broker crashes (its retained messages saved, as a production broker
    keeps them), a node is killed meanwhile, the broker comes back. The killed node's last
    will never reached it: its retained flag says online for good. The monitor calls it stale,
    and a node that lived on online."""
    broker = MosquittoBroker(tmp_path, persistent=True)
    broker.start()
    try:
        flags = ["--mqtt", broker.url, "--mqtt-interval", "0.3", "--swarm", "crash"]
        dead, dead_ready = await procs("dead", *flags)
        _, live_ready = await procs("live", *flags)
        topic = f"murmur/crash/{dead_ready['node_id']}"
        async with subscribed(broker.url, f"{topic}/status") as sub:
            await next_message(sub, lambda *_: True)
        heard = time.time()

        async def saved() -> bool:  # the broker saves every second; then it may crash
            return broker.db.exists() and broker.db.stat().st_mtime > heard

        await poll(saved, "the broker to save its retained messages", TIMEOUT_S)
        broker.stop(kill=True)
        dead.proc.kill()
        await dead.proc.wait()
        broker.start()
        restarted = time.time()
        got = await retained(broker.url, f"{topic}/+")
        assert got[f"{topic}/online"] == b"true"  # the will never came: online for good
        live_status = f"murmur/crash/{live_ready['node_id']}/status"
        async with subscribed(broker.url, live_status) as sub:
            await next_message(sub, lambda _, p: json.loads(p)["time"] > restarted)

        # The monitor, a minute on: the live node's statuses keep coming, the dead one's not.
        # Only a status heard while it listens is fresh a minute on (the retained one is as old
        # as its time): 5 s leaves a node every 0.3 s room to be late on a loaded machine (at
        # 1 s this failed once in make check).
        out = io.StringIO()
        mqtt = MqttConfig(url=broker.url, swarm="crash")
        cfg = MonitorConfig(mqtt, once=True, timeout_s=5.0, width=80)
        assert await run_monitor(cfg, out, clock=lambda: time.time() + 60) == 0
    finally:
        broker.stop()
    text = out.getvalue()
    assert all(len(line) <= 80 for line in text.splitlines()), text
    rows = {
        ln[:8]: ln.split()
        for ln in text.splitlines()
        if ln[:8] in (dead_ready["node_id"][:8], live_ready["node_id"][:8])
    }
    assert "stale" in rows[dead_ready["node_id"][:8]], text
    assert "online" in rows[live_ready["node_id"][:8]], text
    assert text.startswith("swarm crash: 2 nodes, 1 online, 1 stale; ")
