"""The Prometheus endpoint, scraped over HTTP and read with Prometheus's own text parser."""

from __future__ import annotations

import asyncio
import urllib.request
from functools import partial
from pathlib import Path

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from node.node import Node
from tests.node.helpers import memory_swarm

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
    assert info["codec"] == "int8"
