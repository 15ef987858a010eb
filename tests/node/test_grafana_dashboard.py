"""The testbed's Grafana dashboard (docker/grafana) asks only for what nodes export: every
metric and label its queries name is in a real node's scrape. (Grafana itself cannot run here:
its image comes only from a registry.)"""

from __future__ import annotations

import json
import re
from functools import partial
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.metrics_core import Metric

from tests.node.helpers import memory_swarm
from tests.node.test_metrics import TIMEOUT_S, everyone_mixes, scrape

GRAFANA = Path(__file__).resolve().parents[2] / "docker" / "grafana"
#: What PromQL adds to a histogram's or counter's family name.
SUFFIXES = ("_total", "_bucket", "_sum", "_count")
#: Labels that Prometheus adds to every series it scrapes.
TARGET_LABELS = {"instance", "job"}


def legend_labels() -> dict[str, set[str]]:
    """The labels each query's legend names, which the query must keep."""
    dashboard: dict[str, Any] = json.loads((GRAFANA / "dashboards" / "murmur.json").read_text())
    return {
        t["expr"]: set(re.findall(r"\{\{(\w+)\}\}", t["legendFormat"]))
        for p in dashboard["panels"]
        for t in p["targets"]
    }


def len_name(family: Metric) -> int:
    return len(family.name)


def test_every_panel_reads_the_provisioned_prometheus() -> None:
    dashboard = json.loads((GRAFANA / "dashboards" / "murmur.json").read_text())
    source = yaml.safe_load(
        (GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )
    [prometheus] = source["datasources"]
    assert prometheus["url"] == "http://prometheus:9090"  # the compose service
    titles = [p["title"] for p in dashboard["panels"]]
    assert len(set(titles)) == len(titles)
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == prometheus["uid"], panel["title"]
        assert panel["targets"], panel["title"]
    # What the testbed's issue asks to see, each in a panel of its own.
    wanted = ["accuracy", "loss", "distance", "rounds", "per node", "per link", "members"]
    wanted += ["rejected", "steps", "device"]
    for word in wanted:
        assert any(word in t.lower() for t in titles), word


async def test_every_metric_and_label_the_dashboard_asks_for_is_exported(tmp_path: Path) -> None:
    settings = {"metrics_port": 0, "metrics_host": "127.0.0.1", "trainer.steps": 100_000}
    async with memory_swarm(tmp_path, 2, settings) as nodes:
        node = nodes[0]
        await node.wait_until(lambda: node.trainer.step >= 20, TIMEOUT_S)
        await node.wait_until(partial(everyone_mixes, node), TIMEOUT_S)
        families = await scrape(node)

    samples: dict[str, set[str]] = {}  # sample name: the labels it has
    for family in families.values():
        samples.setdefault(family.name, set())
        for s in family.samples:
            samples.setdefault(s.name, set()).update(s.labels)
    asked: dict[str, set[str]] = {}
    for expr, legend in legend_labels().items():
        names = re.findall(r"\bmurmur_\w+", expr)
        by = re.findall(r"by \(([^)]*)\)", expr)
        labels = legend | {x.strip() for group in by for x in group.split(",")}
        for name in names:
            asked.setdefault(name, set()).update(labels - {"le"} - TARGET_LABELS)
    assert asked
    for name, labels in asked.items():
        prefixes = [f for f in families.values() if name.startswith(f.name)]
        assert prefixes, f"the dashboard asks for {name}, which no node exports"
        family = max(prefixes, key=len_name)
        if name.removeprefix(family.name) not in ("", *SUFFIXES):
            raise AssertionError(f"{name} is not a series of {family.name}")
        if family.samples:  # a family with no samples yet (no rejections) shows no series
            assert name in samples, f"{family.name} exports no {name}"
            assert labels <= samples[name], f"{name} has {samples[name]}, asked {labels}"


def test_every_legend_names_labels_its_query_keeps() -> None:
    for expr, labels in legend_labels().items():
        kept = re.search(r"(?:sum|max|min|avg) by \(([^)]*)\)", expr)
        if kept is not None:
            assert labels <= {x.strip() for x in kept[1].split(",")}, expr
        elif re.match(r"(?:sum|max|min|avg)\(", expr):
            assert not labels, expr  # an aggregate without `by` keeps no label
