"""What a node reports outside the status: its evaluations (log lines and ``eval`` records of the
metrics log) and the metrics endpoint that serves its status."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from node.config import NodeConfig
from node.daemon.gossiper import Gossiper
from node.daemon.peers import Peers
from node.daemon.signals import Signals
from node.daemon.trainer import EvalResult, Trainer
from node.security.pki import CA_CERT_FILE, CERT_FILE, KEY_FILE
from node.telemetry.events import Counters, MetricsLog
from node.telemetry.histograms import NodeHistograms
from node.telemetry.metrics import MetricsServer, MetricsTls, metrics_host
from node.telemetry.status import NodeStatus

__all__ = ["EvalRecorder", "serve_metrics"]

log = logging.getLogger(__name__)


def serve_metrics(
    cfg: NodeConfig,
    status: Callable[[], Awaitable[NodeStatus]],
    readiness: Callable[[], str | None],
    histograms: NodeHistograms,
) -> MetricsServer | None:
    """The metrics endpoint (``/metrics``, ``/healthz``, ``/readyz``) if ``cfg`` asks for one.

    Raises:
        OSError: its address cannot be bound (said with the address).
    """
    if cfg.metrics_port is None:
        return None
    key_dir = cfg.tls_dir or cfg.state_dir
    tls = MetricsTls(key_dir / CERT_FILE, key_dir / KEY_FILE, key_dir / CA_CERT_FILE)
    host = cfg.metrics_host or metrics_host(cfg.listen)
    port = cfg.metrics_port
    try:
        tls_or_none = tls if cfg.metrics_tls else None
        return MetricsServer.start(status, host, port, tls_or_none, readiness, histograms)
    except OSError as err:
        raise OSError(f"cannot serve metrics on {host}:{port}: {err.strerror}") from err


class EvalRecorder:
    """Args:
    node_id: whose evaluations these are.
    trainer: the smoothed training loss beside each.
    counters: rounds and bytes so far.
    peers: how many members there are.
    gossiper: the distance to the neighbours' replicas.
    signals: where the record's writing runs (a background task).
    """

    def __init__(
        self,
        node_id: str,
        trainer: Trainer,
        counters: Counters,
        peers: Peers,
        gossiper: Gossiper,
        signals: Signals,
    ) -> None:
        self.node_id = node_id
        self.trainer = trainer
        self.counters = counters
        self.peers = peers
        self.gossiper = gossiper
        self.signals = signals
        #: Set by the node when it starts: where the ``eval`` records go.
        self.metrics: MetricsLog | None = None
        #: The last evaluation written to the metrics log (step, accuracy, loss to 4 digits).
        self._logged: tuple[int, float, str] | None = None

    def evaluated(self, result: EvalResult, record: bool) -> None:
        """Event loop: say ``result``, and (``record``) write it unless it is the last one
        again."""
        # After the budget the summary line carries the figures; a line per evaluation would
        # be one every few seconds for as long as the node runs.
        log.log(
            logging.DEBUG if result.after_budget else logging.INFO,
            "node %s step %d eval_loss %.4f eval_accuracy %.4f%s",
            self.node_id[:8],
            result.step,
            result.loss,
            result.accuracy,
            " (after the budget)" if result.after_budget else "",
        )
        # A model that gossip no longer moves evaluates the same every time: one record says it.
        key = (result.step, result.accuracy, f"{result.loss:.4g}")
        if self.metrics is not None and record and key != self._logged:
            self._logged = key
            self.signals.spawn(self._write(result), "log-eval")

    async def _write(self, result: EvalResult) -> None:
        """One ``eval`` record of the metrics log, with this node's distance to its neighbours
        (the RMS of x_i - x̂_j averaged over the neighbours it has replicas of; -1 without).
        ``loss`` and ``accuracy`` are on the eval data; ``train_loss`` is the smoothed
        training loss; ``after_budget`` marks the evaluations made once the budget was spent."""
        views = await self.gossiper.neighbour_views()
        distances = [v.distance_rms for v in views.values() if v.distance_rms >= 0]
        if self.metrics is not None:
            self.metrics.write(
                "eval",
                step=result.step,
                loss=result.loss,
                accuracy=result.accuracy,
                train_loss=self.trainer.loss,
                after_budget=result.after_budget,
                rounds=self.counters.rounds,
                bytes_sent=self.counters.bytes_sent,
                bytes_sent_fp32=self.counters.bytes_sent_fp32,
                distance_rms=sum(distances) / len(distances) if distances else -1.0,
                members=len(self.peers.view),
            )
