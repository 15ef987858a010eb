"""What an operator reads from the Prometheus endpoint beside the node's status: the build-info
metric, the histograms of round time and delta size, and the process and runtime figures,
through a real scrape read with Prometheus's own text parser."""

from __future__ import annotations

import math
import platform
from importlib.metadata import version
from pathlib import Path

import torch
from prometheus_client.metrics_core import Metric

from node.daemon.node import Node
from tests.node.helpers import memory_swarm
from tests.node.test_metrics import TIMEOUT_S, scrape, value


def observed(node: Node, name: str) -> float:
    """How many samples the node's histogram ``name`` holds, read as a scrape collects it."""
    [family] = [m for m in node.counters.histograms.collect() if m.name == name]
    [count] = [s.value for s in family.samples if s.name == name + "_count"]
    return float(count)


def buckets(metric: Metric) -> list[tuple[float, float]]:
    """(upper bound, cumulative count) of each bucket, in order."""
    out = [
        (float(s.labels["le"]), float(s.value))
        for s in metric.samples
        if s.name == metric.name + "_bucket"
    ]
    return sorted(out)


def check_histogram(metric: Metric) -> tuple[float, float]:
    """The histogram's (count, sum), once its buckets are checked to add up as Prometheus
    requires: cumulative, never falling, the +Inf bucket equal to the count."""
    assert metric.type == "histogram", metric.name
    cumulative = buckets(metric)
    counts = [c for _, c in cumulative]
    assert counts == sorted(counts), metric.name
    assert cumulative[-1][0] == math.inf
    count, total = value(metric, "_count"), value(metric, "_sum")
    assert counts[-1] == count
    return count, total


async def test_a_scrape_serves_build_info_histograms_and_process_metrics(tmp_path: Path) -> None:
    settings = {"metrics_port": 0, "metrics_host": "127.0.0.1", "trainer.steps": 100_000}
    async with memory_swarm(tmp_path, 2, settings) as nodes:
        node = nodes[0]

        def gossiped(n: Node) -> bool:
            return n.counters.rounds >= 5 and observed(n, "murmur_received_delta_bytes") > 0

        await node.wait_until(lambda: gossiped(node), TIMEOUT_S)
        metrics = await scrape(node)
        rounds_after = node.counters.rounds
        received_after = node.counters.bytes_received

    [build] = metrics["murmur_build_info"].samples
    assert build.value == 1.0
    assert build.labels == {
        "version": version("murmur"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": "cpu",
    }

    # Each round made is observed once, in the callback that counts it; the histogram is
    # collected after the status, and the node went on meanwhile.
    count, total = check_histogram(metrics["murmur_gossip_round_seconds"])
    rounds = value(metrics["murmur_gossip_rounds"], "_total")
    assert 5 <= rounds <= count <= rounds_after
    assert 0 < total < TIMEOUT_S * count

    # Every step is observed once, after it is counted; the node trained on meanwhile.
    count, total = check_histogram(metrics["murmur_training_step_seconds"])
    steps = value(metrics["murmur_training_steps"], "_total")
    assert 5 <= steps - 1 <= count <= node.trainer.step
    assert 0 < total < TIMEOUT_S * count

    # Deltas only: their bytes are part of every byte received (snapshots are the rest). The
    # counter in the scrape was read before the histogram, so the bound is the count after it.
    count, total = check_histogram(metrics["murmur_received_delta_bytes"])
    assert count >= 1
    assert 0 < value(metrics["murmur_received_bytes"], "_total") <= received_after
    assert 0 < total <= received_after
    assert buckets(metrics["murmur_received_delta_bytes"])[0][1] == 0  # none under 256 bytes

    assert value(metrics["process_resident_memory_bytes"]) > 0
    assert value(metrics["process_cpu_seconds"], "_total") > 0
    assert metrics["python_info"].samples[0].labels["version"] == platform.python_version()
