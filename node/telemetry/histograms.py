"""Distributions an operator reads from the Prometheus endpoint: how long training steps and
gossip rounds take and how big the deltas a node receives are, as Prometheus histograms
(``_bucket``, ``_sum``, ``_count``; base units in the name).

Counters and gauges in a scrape come from one :class:`~node.telemetry.status.NodeStatus`; a
distribution cannot, since it is made of every sample since the start. So the node observes
each sample where it happens, into its own :class:`NodeHistograms` (one registry per node: a
process may run several nodes, as the tests and the simulator do), and the metrics server
collects them beside the status.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

__all__ = ["DELTA_BUCKETS_BYTES", "ROUND_BUCKETS_S", "STEP_BUCKETS_S", "NodeHistograms"]

#: A round is one quantize-and-mix on the gossip worker, plus its wait for the worker: from
#: about a millisecond (a small model on a fast CPU) to seconds (a big one, or a busy worker).
ROUND_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: A step is one batch forward and backward, and the optimizer's update: from under a
#: millisecond (a tiny model) to seconds (a large one on a small CPU, or a --slowdown).
STEP_BUCKETS_S = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
#: Deltas range from a few hundred bytes (a top-k payload of a tiny model) to tens of MiB (an
#: int8 delta of a model with tens of millions of parameters): powers of 4 from 256 B to 64 MiB.
DELTA_BUCKETS_BYTES = tuple(float(256 * 4**i) for i in range(10))


class NodeHistograms(Collector):
    """One node's histograms; ``observe`` is thread-safe, and a scrape on the metrics server's
    thread may collect meanwhile."""

    def __init__(self) -> None:
        self._registry = CollectorRegistry(auto_describe=False)
        #: Seconds from a gossip round's start to its delta being ready, the wait for the
        #: gossip worker included (CHOCO-SGD's q = Q(x - x̂) and its mixing step; Koloskova et
        #: al. 2019).
        self.round_seconds = Histogram(
            "murmur_gossip_round_seconds",
            "Seconds from a gossip round's start to its delta being ready (waiting for the "
            "gossip worker included).",
            buckets=ROUND_BUCKETS_S,
            registry=self._registry,
        )
        #: Seconds of each local training step: its compute, and the wait of a --slowdown.
        self.step_seconds = Histogram(
            "murmur_training_step_seconds",
            "Seconds of each local training step (its compute, and a --slowdown's wait).",
            buckets=STEP_BUCKETS_S,
            registry=self._registry,
        )
        #: Serialized size of each delta received from a neighbour (snapshots not included).
        self.delta_bytes = Histogram(
            "murmur_received_delta_bytes",
            "Serialized size of each gossip delta received (snapshots not included).",
            buckets=DELTA_BUCKETS_BYTES,
            registry=self._registry,
        )

    def collect(self) -> Iterator[Metric]:
        yield from self._registry.collect()
