"""Prometheus metrics: the node's status, as text a Prometheus server scrapes from ``/metrics``;
and on the same port the health checks an orchestrator probes, ``/healthz`` and ``/readyz``.

A scrape asks the node's event loop for one :class:`NodeStatus` and turns it into metric
families (:mod:`node.telemetry.status_metrics`, which says what they are and how they are
named), so every figure in one scrape comes from the same moment and nothing is kept twice.

``/healthz`` answers 200 while the node's event loop runs a coroutine scheduled on it within
:data:`HEALTH_TIMEOUT_S` (503 when the loop is wedged or gone): liveness. ``/readyz`` answers 200
once the node says it is ready (joined, training, its links up) and 503 with the reason on one
line otherwise: readiness. Both go through the event loop as a scrape does.

Beside the status (``murmur_build_info`` among its families): the node's histograms
(:mod:`node.telemetry.histograms`), and the client library's process and Python runtime metrics
(``process_*``: CPU seconds, resident memory, open files; ``python_info``, ``python_gc_*``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Iterator
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
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
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from node.telemetry.histograms import NodeHistograms
from node.telemetry.status import NodeStatus
from node.telemetry.status_metrics import _gauge, status_metrics

__all__ = ["MetricsServer", "MetricsTls", "metrics_host", "status_metrics"]

#: How long a scrape waits for the node's status before it reports nothing.
SCRAPE_TIMEOUT_S = 5.0
#: How long a health check waits for the event loop: a loop that cannot run a no-op for this
#: long is wedged as far as an orchestrator is concerned (a probe's timeout must exceed it).
HEALTH_TIMEOUT_S = 2.0


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
