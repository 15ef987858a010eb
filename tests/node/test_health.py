"""``/healthz`` and ``/readyz`` on the metrics port: real nodes, real HTTP requests."""

from __future__ import annotations

import asyncio
import concurrent.futures
import ssl
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from node.daemon.node import Node
from node.telemetry.metrics import HEALTH_TIMEOUT_S
from node.transport.memory import MemoryNetwork, MemoryTransport
from tests.node.helpers import config, metrics_client, poll, tls_metrics_node

TIMEOUT_S = 30.0


def get(url: str, context: ssl.SSLContext | None = None) -> tuple[int, str]:
    """The status code and body of a GET (an error status is an answer too)."""
    try:
        with urllib.request.urlopen(url, timeout=10, context=context) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def url(node: Node, path: str) -> str:
    assert node.metrics_server is not None
    return f"http://127.0.0.1:{node.metrics_server.port}{path}"


async def memory_node(tmp_path: Path, network: MemoryNetwork, name: str, **kw: object) -> Node:
    cfg = config(
        tmp_path / name,
        listen="mem:0",
        metrics_port=0,
        metrics_host="127.0.0.1",
        wait_members=2,
        **kw,
    )
    node = await Node.create(cfg, transport=MemoryTransport(network))
    await node.start()
    return node


async def test_ready_only_once_joined_and_training_with_links_up(tmp_path: Path) -> None:
    network = MemoryNetwork()
    first = await memory_node(tmp_path, network, "a", shard_count=2, **{"trainer.steps": 100_000})
    second: Node | None = None
    try:
        # Alone, waiting for a second member: alive, but not ready.
        assert await asyncio.to_thread(get, url(first, "/healthz")) == (200, "ok\n")
        code, body = await asyncio.to_thread(get, url(first, "/readyz"))
        assert code == 503
        assert body.startswith("not training yet"), body
        assert body.count("\n") == 1, body
        started_early = first.trainer.started
        assert not started_early

        second = await memory_node(
            tmp_path, network, "b", join=(first.address,), shard_index=1, shard_count=2
        )

        async def ready() -> bool:
            code, body = await asyncio.to_thread(get, url(first, "/readyz"))
            return code == 200 and body == "ok\n"

        await poll(ready, "the first node's /readyz to answer 200", TIMEOUT_S)
        # What 200 claims holds.
        hood = first.peers.neighbourhood
        assert first.trainer.started
        assert len(hood.links) == 1
        assert hood.links_up() == 1
        # /metrics is served as before beside the health checks.
        code, text = await asyncio.to_thread(get, url(first, "/metrics"))
        assert code == 200
        assert "murmur_up 1.0" in text
    finally:
        if second is not None:
            await second.stop(grace_s=0)
        await first.stop(grace_s=0)


async def test_healthz_is_503_while_the_event_loop_is_wedged(tmp_path: Path) -> None:
    node = await memory_node(tmp_path, MemoryNetwork(), "a")
    released = threading.Event()

    def probe() -> tuple[int, str]:
        try:
            return get(url(node, "/healthz"))
        finally:
            released.set()

    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            answer = pool.submit(probe)
            # Wedge the loop: block it (not sleep) until the probe has its answer.
            assert released.wait(TIMEOUT_S), "the probe never answered"
            code, body = answer.result()
        assert code == 503
        assert body == f"the node's event loop did not answer within {HEALTH_TIMEOUT_S:g} s\n"
        # The loop runs again: alive again.
        assert await asyncio.to_thread(get, url(node, "/healthz")) == (200, "ok\n")
    finally:
        await node.stop(grace_s=0)


async def test_health_checks_over_mutual_tls(tmp_path: Path) -> None:
    node = await tls_metrics_node(tmp_path)
    base = url(node, "").replace("http:", "https:")

    try:
        mine = metrics_client(tmp_path, tmp_path / "me")
        assert await asyncio.to_thread(get, base + "/healthz", mine) == (200, "ok\n")
        code, body = await asyncio.to_thread(get, base + "/readyz", mine)
        assert code == 503
        assert body.startswith("not training yet")
        refused = (ssl.SSLError, urllib.error.URLError, ConnectionError)
        with pytest.raises(refused):
            await asyncio.to_thread(get, base + "/healthz", metrics_client(tmp_path, None))
    finally:
        await node.stop(grace_s=0)
