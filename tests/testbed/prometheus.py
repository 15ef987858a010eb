"""The testbed's Prometheus, read through its HTTP API: has it scraped every node?

Used by :mod:`tests.testbed.check`; Prometheus's query API is documented at
https://prometheus.io/docs/prometheus/latest/querying/api/ (``GET /api/v1/query``).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

__all__ = ["SCRAPED", "query", "scraped_nodes"]

#: What every node's scrape must have put in Prometheus: who it is, the build it runs, its
#: counters, a per-link figure and its histograms (node/telemetry/status_metrics.py, histograms.py).
SCRAPED = (
    "murmur_build_info",
    "murmur_training_steps_total",
    "murmur_gossip_rounds_total",
    "murmur_neighbour_sent_bytes_total",
    "murmur_members",
    "murmur_gossip_round_seconds_bucket",
    "murmur_received_delta_bytes_count",
    "process_resident_memory_bytes",
)


def query(server: str, promql: str) -> list[dict[str, Any]]:
    """The result vector of an instant query to the Prometheus at ``server`` (host:port).

    Raises:
        OSError: Prometheus does not answer (yet).
        ValueError: it answered something other than a successful vector.
    """
    url = f"http://{server}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.load(response)
    if body.get("status") != "success" or body["data"]["resultType"] != "vector":
        raise ValueError(f"Prometheus answered {promql!r} with {body}")
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def scraped_nodes(server: str, node_ids: set[str]) -> dict[str, str] | None:
    """Each node's scrape target (``instance``), once Prometheus holds every series of
    :data:`SCRAPED` from every one of ``node_ids``; None until then (or while it does not
    answer)."""
    try:
        info = query(server, "murmur_node_info")
        instances = {s["metric"]["node_id"]: s["metric"]["instance"] for s in info}
        if not node_ids <= set(instances):
            return None
        wanted = {instances[i] for i in node_ids}
        for name in SCRAPED:
            if not wanted <= {s["metric"]["instance"] for s in query(server, name)}:
                return None
    except (OSError, urllib.error.URLError):
        return None
    return {i: instances[i] for i in node_ids}
