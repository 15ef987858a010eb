"""Prometheus metrics: the node's status, as text a Prometheus server scrapes from ``/metrics``;
and on the same port the health checks an orchestrator probes, ``/healthz`` and ``/readyz``.

A scrape asks the node's event loop for one :class:`NodeStatus` and turns it into metric
families, so every figure in one scrape comes from the same moment and nothing is kept twice.
Names follow Prometheus conventions: base units in the name (``_bytes``, ``_seconds``,
``_ratio``), ``_total`` on counters. Per-neighbour figures carry a ``neighbour`` label (the
neighbour's node id); counters of a neighbour that stopped being one disappear with it, and the
node-wide ``_total`` counters keep counting.

``/healthz`` answers 200 while the node's event loop runs a coroutine scheduled on it within
:data:`HEALTH_TIMEOUT_S` (503 when the loop is wedged or gone): liveness. ``/readyz`` answers 200
once the node says it is ready (joined, training, its links up) and 503 with the reason on one
line otherwise: readiness. Both go through the event loop as a scrape does.

Beside the status: ``murmur_build_info`` (versions and device, always 1), the node's histograms
(:mod:`node.telemetry.histograms`), and the client library's process and Python runtime metrics
(``process_*``: CPU seconds, resident memory, open files; ``python_info``, ``python_gc_*``).
"""

from __future__ import annotations

import asyncio
import math
import platform
from collections.abc import Awaitable, Callable, Iterable, Iterator
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from threading import Thread
from wsgiref.simple_server import WSGIServer
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gossip.swim import Status
from node.telemetry.histograms import NodeHistograms
from node.telemetry.status import NodeStatus

__all__ = ["MetricsServer", "MetricsTls", "metrics_host", "status_metrics"]

#: How long a scrape waits for the node's status before it reports nothing.
SCRAPE_TIMEOUT_S = 5.0
#: How long a health check waits for the event loop: a loop that cannot run a no-op for this
#: long is wedged as far as an orchestrator is concerned (a probe's timeout must exceed it).
HEALTH_TIMEOUT_S = 2.0


def _gauge(name: str, doc: str, value: float, labels: dict[str, str] | None = None) -> Metric:
    family = GaugeMetricFamily(name, doc, labels=list(labels or {}))
    family.add_metric(list((labels or {}).values()), value)
    return family


@cache
def build_versions() -> tuple[str, str, str]:
    """murmur's, Python's and torch's versions ("unknown" for a package not installed)."""

    def of(package: str) -> str:
        try:
            return version(package)
        except PackageNotFoundError:
            return "unknown"

    return of("murmur"), platform.python_version(), of("torch")


def status_metrics(s: NodeStatus) -> list[Metric]:
    """The metric families of one status."""
    out: list[Metric] = []
    build = GaugeMetricFamily(
        "murmur_build_info",
        "The software this node runs and its device (always 1).",
        labels=["version", "python", "torch", "device"],
    )
    build.add_metric([*build_versions(), s.device], 1.0)
    out.append(build)
    info = GaugeMetricFamily(
        "murmur_node_info",
        "Who this node is (always 1).",
        labels=["node_id", "address", "device", "codec", "region"],
    )
    info.add_metric([s.node_id, s.address, s.device, s.codec, s.region], 1.0)
    out.append(info)

    def counter(name: str, doc: str, value: float) -> None:
        family = CounterMetricFamily(name, doc)  # the client adds the _total suffix
        family.add_metric([], value)
        out.append(family)

    counter("murmur_training_steps", "Local training steps taken.", s.step)
    counter("murmur_training_samples", "Training examples seen.", s.samples)
    counter("murmur_gossip_rounds", "Gossip rounds made.", s.rounds)
    counter(
        "murmur_gossip_rounds_skipped",
        "Rounds begun but not made: nothing worth its bytes to send, or no neighbour.",
        s.rounds_skipped,
    )
    counter(
        "murmur_training_held_seconds",
        "Seconds the trainer waited at --max-local-steps for its links to take the next round.",
        s.held_s,
    )
    counter("murmur_sent_bytes", "Bytes of gossip messages sent.", s.bytes_sent)
    counter(
        "murmur_sent_fp32_equivalent_bytes",
        "Bytes the same messages would have taken with fp32 payloads.",
        s.bytes_sent_fp32,
    )
    counter("murmur_received_bytes", "Bytes of gossip messages received.", s.bytes_received)
    counter(
        "murmur_relayed_bytes",
        "Bytes of membership calls passed on for nodes nobody can dial, as their relay.",
        s.relayed_bytes,
    )
    counter(
        "murmur_relay_faults",
        "Times a relay of this node (behind NAT) dropped, held back, altered or replayed calls.",
        s.relay_faults,
    )
    out.append(
        _gauge(
            "murmur_sessions",
            "Dial-out sessions that nodes nobody can dial hold to this one.",
            s.sessions,
        )
    )
    out.append(
        _gauge(
            "murmur_paused",
            "1 while the node is paused (its device's policy, murmur ctl pause, SIGUSR1).",
            s.paused,
        )
    )
    if s.budget_bytes:  # only on a node with --byte-budget
        out.append(
            _gauge(
                "murmur_byte_budget_bytes",
                "Bytes the node may send per period of its byte budget (--byte-budget).",
                s.budget_bytes,
            )
        )
        out.append(
            _gauge(
                "murmur_byte_budget_remaining_bytes",
                "Bytes left of this period's budget (0: spent, heartbeats only).",
                s.budget_left_bytes,
            )
        )
        out.append(
            _gauge(
                "murmur_byte_budget_reset_seconds",
                "Seconds until the byte budget's period turns and the budget is whole again.",
                s.budget_resets_in_s,
            )
        )
    train_doc = "Training loss, smoothed over about the last ten steps (NaN before the first)."
    out.append(_gauge("murmur_train_loss", train_doc, s.train_loss))
    # The old name of the same figure, kept for dashboards that use it.
    out.append(_gauge("murmur_training_loss", "Deprecated: murmur_train_loss.", s.train_loss))
    evaluated = s.eval_step >= 0
    out.append(
        _gauge(
            "murmur_eval_loss",
            "Loss on the task's eval data at the last evaluation (NaN before the first).",
            s.eval_loss if evaluated else math.nan,
        )
    )
    out.append(
        _gauge(
            "murmur_eval_accuracy_ratio",
            "Accuracy on the task's eval data at the last evaluation (NaN before the first).",
            s.eval_accuracy if evaluated else math.nan,
        )
    )
    out.append(
        _gauge(
            "murmur_eval_step",
            "The training step of the model the last evaluation saw (NaN before the first).",
            s.eval_step if evaluated else math.nan,
        )
    )
    out.append(
        _gauge(
            "murmur_eval_age_seconds",
            "Seconds since the last evaluation (NaN before the first); after the step budget "
            "nodes go on evaluating every --idle-eval-interval seconds.",
            s.eval_age_s if evaluated else math.nan,
        )
    )
    out.append(_gauge("murmur_training_done", "1 once the step budget is spent.", s.training_done))
    out.append(
        _gauge("murmur_training_samples_per_second", "Training throughput.", s.samples_per_s)
    )

    rejected = CounterMetricFamily(
        "murmur_rejected_messages", "Inbound messages refused, by reason.", labels=["reason"]
    )
    for reason, count in sorted(s.rejected.items()):
        rejected.add_metric([reason], count)
    out.append(rejected)

    members = GaugeMetricFamily(
        "murmur_members", "Members this node knows, by status (itself included).", labels=["status"]
    )
    for status in Status:
        count = s.member_counts.get(str(status), sum(m.status is status for m in s.members))
        members.add_metric([str(status)], count)
    out.append(members)

    label = ["neighbour"]
    sent = CounterMetricFamily(
        "murmur_neighbour_sent_bytes", "Bytes sent to each neighbour.", labels=label
    )
    received = CounterMetricFamily(
        "murmur_neighbour_received_bytes", "Bytes received from each neighbour.", labels=label
    )
    staleness = GaugeMetricFamily(
        "murmur_neighbour_staleness_seconds",
        "Seconds since each neighbour's replica last changed (NaN: no replica yet).",
        labels=label,
    )
    distance = GaugeMetricFamily(
        "murmur_neighbour_distance_rms",
        "RMS of x_i minus each neighbour's public copy (NaN: no replica yet).",
        labels=label,
    )
    in_mix = GaugeMetricFamily(
        "murmur_neighbour_in_mix", "1 while the neighbour takes part in mixing.", labels=label
    )
    weight = GaugeMetricFamily(
        "murmur_neighbour_weight", "The neighbour's mixing weight w_ij.", labels=label
    )
    codec = GaugeMetricFamily(
        "murmur_neighbour_codec",
        "1 for the codec this node's deltas to each neighbour are encoded with (under "
        "--compress auto, the link's own pick).",
        labels=[*label, "codec"],
    )
    known = []
    for n in s.neighbours:
        if n.codec:
            codec.add_metric([n.node_id, n.codec], 1.0)
        sent.add_metric([n.node_id], n.bytes_sent)
        received.add_metric([n.node_id], n.bytes_received)
        staleness.add_metric([n.node_id], n.silent_s if n.silent_s >= 0 else math.nan)
        distance.add_metric([n.node_id], n.distance_rms if n.distance_rms >= 0 else math.nan)
        in_mix.add_metric([n.node_id], n.in_mix)
        weight.add_metric([n.node_id], n.weight)
        if n.distance_rms >= 0:
            known.append(n.distance_rms)
    out += [sent, received, staleness, distance, in_mix, weight, codec]
    out.append(
        _gauge(
            "murmur_distance_to_neighbours_rms",
            "Mean over neighbours of murmur_neighbour_distance_rms: an estimate of how far this "
            "node is from its neighbourhood (NaN: no replica yet).",
            sum(known) / len(known) if known else math.nan,
        )
    )
    out.append(_gauge("murmur_neighbours", "Neighbours this node links to.", len(s.neighbours)))
    out.append(
        _gauge(
            "murmur_neighbours_across_regions",
            "Neighbours whose region (--region) is not this node's.",
            sum(n.region != s.region for n in s.neighbours),
        )
    )
    return out


class _StatusCollector(Collector):
    """Collects by asking the node's event loop for its status (scrapes run on another thread)."""

    def __init__(
        self, status: Callable[[], Awaitable[NodeStatus]], loop: asyncio.AbstractEventLoop
    ) -> None:
        self._status = status
        self._loop = loop

    def collect(self) -> Iterator[Metric]:
        async def ask() -> NodeStatus:
            return await self._status()

        future = asyncio.run_coroutine_threadsafe(ask(), self._loop)
        try:
            status = future.result(SCRAPE_TIMEOUT_S)
        except (FutureTimeout, RuntimeError):  # the node is busy, or its loop has stopped
            future.cancel()
            yield _gauge("murmur_up", "1 when the scrape could read the node's status.", 0.0)
            return
        yield _gauge("murmur_up", "1 when the scrape could read the node's status.", 1.0)
        yield from status_metrics(status)


class _HealthApp:
    """``/healthz`` and ``/readyz`` in front of the metrics app, which serves every other path.

    Runs on the server's threads; each answer waits for the event loop, at most ``timeout_s``.
    """

    def __init__(
        self,
        metrics: WSGIApplication,
        loop: asyncio.AbstractEventLoop,
        readiness: Callable[[], str | None],
        timeout_s: float,
    ) -> None:
        self._metrics = metrics
        self._loop = loop
        self._readiness = readiness
        self._timeout_s = timeout_s

    def _on_loop(self, check: Callable[[], str | None]) -> str | None:
        """``check()`` run by the event loop: None when all is well, else why not."""

        async def ask() -> str | None:
            return check()

        try:
            future = asyncio.run_coroutine_threadsafe(ask(), self._loop)
        except RuntimeError:  # the loop is closed
            return "the node's event loop has stopped"
        try:
            return future.result(self._timeout_s)
        except FutureTimeout:
            future.cancel()
            return f"the node's event loop did not answer within {self._timeout_s:g} s"
        except RuntimeError:  # it stopped with the coroutine pending
            return "the node's event loop has stopped"

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/healthz":
            problem = self._on_loop(lambda: None)
        elif path == "/readyz":
            problem = self._on_loop(self._readiness)
        else:
            return self._metrics(environ, start_response)
        status = "503 Service Unavailable" if problem else "200 OK"
        body = f"{problem or 'ok'}\n".encode()
        headers = [
            ("Content-Type", "text/plain; charset=utf-8"),
            ("Content-Length", str(len(body))),
        ]
        start_response(status, headers)
        return [body]


@dataclass(frozen=True)
class MetricsTls:
    """Files for serving over HTTPS to clients of the swarm's CA only (mutual TLS)."""

    cert_file: Path
    key_file: Path
    ca_file: Path


def metrics_host(listen: str) -> str:
    """Where the metrics server binds unless told: the host the node listens on, or loopback
    when that is a wildcard (a scrape names the node and its address, so it is not for
    everyone on every interface)."""
    host = listen.rpartition(":")[0]
    if host in ("", "0.0.0.0", "::", "[::]"):
        return "127.0.0.1"
    return host.removeprefix("[").removesuffix("]")


@dataclass
class MetricsServer:
    """Serves ``/metrics``, ``/healthz`` and ``/readyz`` over HTTP (or HTTPS with client
    certificates) on its own thread.

    Usage: ``server = MetricsServer.start(node.status, host, port)``; ``server.stop()``.
    """

    server: WSGIServer
    thread: Thread

    @classmethod
    def start(
        cls,
        status: Callable[[], Awaitable[NodeStatus]],
        host: str,
        port: int,
        tls: MetricsTls | None = None,
        readiness: Callable[[], str | None] = lambda: None,
        histograms: NodeHistograms | None = None,
    ) -> MetricsServer:
        """Call from the node's event loop; ``port`` 0 picks a free one (see :attr:`port`).

        ``readiness`` runs on the event loop for each ``/readyz``: None when the node is ready,
        else the reason it is not (one line). ``histograms`` are served as they are (the
        node observes into them where each sample happens).

        Raises:
            OSError: the address cannot be bound.
        """
        registry = CollectorRegistry(auto_describe=False)
        loop = asyncio.get_running_loop()
        registry.register(_StatusCollector(status, loop))
        if histograms is not None:
            registry.register(histograms)
        # The process and runtime figures every Prometheus client serves by default; the
        # default registry is not ours (several nodes may share a process), so they join ours.
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
        if tls is None:
            server, thread = start_http_server(port, host, registry=registry)
        else:
            server, thread = start_http_server(
                port,
                host,
                registry=registry,
                certfile=str(tls.cert_file),
                keyfile=str(tls.key_file),
                client_cafile=str(tls.ca_file),
                client_auth_required=True,
            )
        # The health checks in front of prometheus_client's app, which serves every path.
        metrics = server.get_app()
        assert metrics is not None  # start_http_server set it
        server.set_app(_HealthApp(metrics, loop, readiness, HEALTH_TIMEOUT_S))
        return cls(server, thread)

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=SCRAPE_TIMEOUT_S)
