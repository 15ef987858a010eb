"""The Prometheus endpoint, scraped over HTTP and read with Prometheus's own text parser."""

from __future__ import annotations

import asyncio
import ssl
import urllib.error
import urllib.request
from functools import partial
from pathlib import Path

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from node.daemon.node import Node
from node.telemetry.metrics import metrics_host
from node.telemetry.status import MAX_STATUS_MEMBERS, format_status
from node.transport import wire
from tests.node.helpers import (
    config,
    fixed_identity,
    memory_swarm,
    metrics_client,
    signed_record,
    tls_metrics_node,
)

TIMEOUT_S = 60.0


async def scrape(node: Node) -> dict[str, Metric]:
    assert node.metrics_server is not None
    url = f"http://127.0.0.1:{node.metrics_server.port}/metrics"

    def get() -> str:
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.headers["Content-Type"].startswith("text/plain")
            return str(response.read().decode())

    # Off the event loop: a scrape asks this very loop for the node's status.
    text = await asyncio.to_thread(get)
    return {m.name: m for m in text_string_to_metric_families(text)}


def value(metric: Metric, suffix: str = "", **labels: str) -> float:
    [sample] = [s for s in metric.samples if s.name == metric.name + suffix and s.labels == labels]
    return float(sample.value)


def everyone_mixes(node: Node) -> bool:
    return len(node.state.replicas) == len(node.peers.links) > 0


async def test_a_scrape_reads_the_nodes_training_gossip_and_membership(tmp_path: Path) -> None:
    settings = {"metrics_port": 0, "metrics_host": "127.0.0.1", "trainer.steps": 100_000}
    async with memory_swarm(tmp_path, 3, settings) as nodes:
        node = nodes[0]
        await node.wait_until(lambda: node.trainer.step >= 50, TIMEOUT_S)
        await node.wait_until(partial(everyone_mixes, node), TIMEOUT_S)
        metrics = await scrape(node)

    assert value(metrics["murmur_up"]) == 1.0
    counters = [m for m in metrics.values() if m.type == "counter"]
    assert {m.name for m in counters} >= {
        "murmur_training_steps",
        "murmur_training_samples",
        "murmur_gossip_rounds",
        "murmur_gossip_rounds_skipped",
        "murmur_training_held_seconds",
        "murmur_relayed_bytes",
        "murmur_relay_faults",
        "murmur_sent_bytes",
        "murmur_received_bytes",
        "murmur_rejected_messages",
        "murmur_neighbour_sent_bytes",
        "murmur_neighbour_received_bytes",
    }
    for m in counters:  # counters are exposed with _total, as Prometheus wants them
        assert all(s.name.endswith(("_total", "_created")) for s in m.samples), m.name
    assert value(metrics["murmur_training_steps"], "_total") >= 50
    assert value(metrics["murmur_training_samples"], "_total") >= 50 * 32
    assert value(metrics["murmur_members"], status="alive") == 3
    assert value(metrics["murmur_members"], status="dead") == 0
    others = {n.node_id for n in nodes[1:]}
    for peer in others:
        assert value(metrics["murmur_neighbour_sent_bytes"], "_total", neighbour=peer) > 0
        assert value(metrics["murmur_neighbour_received_bytes"], "_total", neighbour=peer) > 0
        assert value(metrics["murmur_neighbour_in_mix"], neighbour=peer) == 1
        assert value(metrics["murmur_neighbour_staleness_seconds"], neighbour=peer) >= 0
        assert value(metrics["murmur_neighbour_distance_rms"], neighbour=peer) >= 0
    assert value(metrics["murmur_distance_to_neighbours_rms"]) >= 0
    info = metrics["murmur_node_info"].samples[0].labels
    assert info["node_id"] == node.node_id
    assert info["codec"] == "auto"


def bound_host(node: Node) -> str:
    assert node.metrics_server is not None
    return str(node.metrics_server.server.server_address[0])


@pytest.mark.parametrize(
    ("listen", "host"), [("127.0.0.1:0", "127.0.0.1"), ("0.0.0.0:0", "127.0.0.1")]
)
async def test_metrics_bind_the_listen_host_or_loopback_unless_told(
    tmp_path: Path, listen: str, host: str
) -> None:
    node = await Node.create(config(tmp_path, listen=listen, metrics_port=0, wait_members=2))
    await node.start()
    try:
        assert bound_host(node) == host
    finally:
        await node.stop(grace_s=0)
    assert metrics_host("10.1.2.3:7070") == "10.1.2.3"
    assert metrics_host("[::]:7070") == "127.0.0.1"


async def test_metrics_over_mutual_tls_serve_only_certificates_of_the_swarm(
    tmp_path: Path,
) -> None:
    node = await tls_metrics_node(tmp_path)
    assert node.metrics_server is not None
    url = f"https://127.0.0.1:{node.metrics_server.port}/metrics"

    def get(cert_dir: Path | None) -> str:
        context = metrics_client(tmp_path, cert_dir)
        with urllib.request.urlopen(url, timeout=10, context=context) as response:
            return str(response.read().decode())

    try:
        text = await asyncio.to_thread(get, tmp_path / "me")
        assert "murmur_up 1.0" in text
        # An SSL alert, a URLError or a reset, depending on when the server hangs up.
        refused = (ssl.SSLError, urllib.error.URLError, ConnectionError)
        with pytest.raises(refused):
            await asyncio.to_thread(get, None)  # no client certificate
        with pytest.raises(refused):
            await asyncio.to_thread(  # plain HTTP
                lambda: urllib.request.urlopen(url.replace("https", "http"), timeout=10).read()
            )
    finally:
        await node.stop(grace_s=0)
    with pytest.raises(ValueError, match="--metrics-tls"):
        config(tmp_path, metrics_tls=True, insecure=True)


async def test_status_and_scrapes_stay_small_however_many_members_a_node_knows(
    tmp_path: Path,
) -> None:
    async with memory_swarm(tmp_path, 1, {"metrics_port": 0, "metrics_host": "127.0.0.1"}) as nodes:
        node = nodes[0]
        many = [
            signed_record(fixed_identity(1000 + i), f"10.0.{i // 250}.{i % 250}:7070")
            for i in range(600)
        ]
        node.peers.swim.merge(many)  # without a CA, any key may make up a member
        status = await node.status()
        assert len(status.members) == MAX_STATUS_MEMBERS
        assert status.members[0].node_id == node.node_id
        assert status.member_counts["alive"] == 601
        assert status.live_members == 601
        assert wire.status_to_pb(status).ByteSize() < 64 * 1024
        assert "... and 537 more" in format_status(status)
        metrics = await scrape(node)
        assert value(metrics["murmur_members"], status="alive") == 601
        back = wire.status_from_pb(wire.status_to_pb(status))
        assert back.member_counts == status.member_counts
        assert all(not m.certificate for m in back.members)
