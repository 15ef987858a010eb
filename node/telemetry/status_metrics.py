"""Prometheus metric families of a node's status: what a scrape of ``/metrics`` turns one
:class:`NodeStatus` into (the server, and the health checks beside it, are
:mod:`node.telemetry.metrics`).

Names follow Prometheus conventions: base units in the name (``_bytes``, ``_seconds``,
``_ratio``), ``_total`` on counters. Per-neighbour figures carry a ``neighbour`` label (the
neighbour's node id); counters of a neighbour that stopped being one disappear with it, and the
node-wide ``_total`` counters keep counting.

Among them ``murmur_build_info`` (versions and device, always 1).
"""

from __future__ import annotations

import math
import platform
from functools import cache
from importlib.metadata import PackageNotFoundError, version

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gossip.swim import Status
from node.telemetry.status import NodeStatus

__all__ = ["build_versions", "status_metrics"]


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
