"""A node's view of itself and its neighbours, as served by the Status RPC and shown by the CLI."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from gossip.swim import MemberRecord, Status
from node.telemetry.progress import fmt_duration, fmt_size

__all__ = [
    "MAX_STATUS_MEMBERS",
    "NeighbourStatus",
    "NodeStatus",
    "eval_summary",
    "finite",
    "format_status",
    "format_summary",
    "status_to_json",
    "summarise_members",
]

#: Members a status names; the rest are only counted, so that a Status answer, a scrape and an
#: MQTT message stay small however many members a node knows.
MAX_STATUS_MEMBERS = 64


@dataclass(frozen=True)
class NeighbourStatus:
    node_id: str
    address: str
    replica_seq: int  # -1: no snapshot yet
    silent_s: float  # -1: never heard from
    in_mix: bool
    bytes_sent: int
    deltas_sent: int
    snapshots_sent: int
    distance_rms: float  # RMS of x_i - x̂_j; -1 when unknown
    weight: float = 0.0  # w_ij in the mix; 0 when out of it
    bytes_received: int = 0
    region: str = ""  # as the neighbour's record names it
    codec: str = ""  # what this node's deltas to it are encoded with (auto: the link's pick)


@dataclass(frozen=True)
class NodeStatus:
    node_id: str
    address: str
    device: str
    codec: str
    step: int
    step_budget: int  # 0: no budget
    training_done: bool
    #: Training loss, smoothed over about the last ten steps (NaN before the first step).
    train_loss: float
    #: Accuracy on the task's eval data at the last evaluation (-1 before the first).
    eval_accuracy: float
    rounds: int
    bytes_sent: int
    bytes_sent_fp32: int
    bytes_received: int
    samples_per_s: float
    samples: int = 0
    #: Loss on the task's eval data at the last evaluation (NaN before the first).
    eval_loss: float = math.nan
    #: The step of the model that evaluation saw (-1 before the first).
    eval_step: int = -1
    #: Seconds since that evaluation, when the status was made (-1 before the first).
    eval_age_s: float = -1.0
    neighbours: tuple[NeighbourStatus, ...] = ()
    #: The first members this node knows of (itself, the live, then the dead and departed),
    #: at most MAX_STATUS_MEMBERS.
    members: tuple[MemberRecord, ...] = ()
    rejected: dict[str, int] = field(default_factory=dict)
    #: Every member this node knows of, by status ("alive", "suspect", "dead", "left").
    member_counts: dict[str, int] = field(default_factory=dict)
    #: Dial-out sessions that nodes nobody can dial hold to this one now.
    sessions: int = 0
    #: Bytes of membership calls this node passed on for others, as their relay.
    relayed_bytes: int = 0
    #: Rounds begun but not made: nothing worth its bytes (the event trigger), or no neighbour.
    rounds_skipped: int = 0
    #: Seconds the trainer waited at the bound on local steps (``--max-local-steps``) for its
    #: links to take the next round.
    held_s: float = 0.0
    #: Behind NAT: the times a relay of this node was found to drop, hold back, alter or replay
    #: what it passed on (node/daemon/dialout.py).
    relay_faults: int = 0
    #: The byte budget (``--byte-budget``): bytes per period (0: no budget), the period in
    #: seconds, what is left of this period's, and seconds until the period turns.
    budget_bytes: int = 0
    budget_period_s: float = 0.0
    budget_left_bytes: int = 0
    budget_resets_in_s: float = 0.0
    #: Paused (its device's policy, ``murmur ctl pause``, SIGUSR1), and why ("; " between
    #: reasons): it trains and gossips nothing, and stays a member.
    paused: bool = False
    pause_reason: str = ""
    #: This node's region (``--region``); empty: none.
    region: str = ""

    @property
    def live_members(self) -> int:
        """Alive and suspect members, counted (itself included)."""
        if self.member_counts:
            return self.member_counts.get("alive", 0) + self.member_counts.get("suspect", 0)
        return sum(m.live for m in self.members)

    @property
    def compression_ratio(self) -> float:
        """Bytes sent as a fraction of what fp32 payloads would have taken."""
        return self.bytes_sent / self.bytes_sent_fp32 if self.bytes_sent_fp32 else 1.0


def summarise_members(
    records: Iterable[MemberRecord], me: str, limit: int = MAX_STATUS_MEMBERS
) -> tuple[tuple[MemberRecord, ...], dict[str, int]]:
    """The members a status names (``me`` first, then the live, then the others, each by id; at
    most ``limit``) and every member counted by status."""
    everyone = list(records)
    counts = Counter(str(r.status) for r in everyone)
    order = sorted(everyone, key=lambda r: (r.node_id != me, not r.live, r.node_id))
    return tuple(order[:limit]), {str(s): counts.get(str(s), 0) for s in Status}


def finite(value: Any) -> Any:
    """``value`` with NaN and infinities replaced by None, all the way down: JSON has no such
    numbers, and strict parsers refuse the bare ``NaN`` that Python would write."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def period_name(seconds: float) -> str:
    """A budget's period as users say it: ``day``, ``week``, ``hour``, else ``6h00m``."""
    names = {60.0: "minute", 3600.0: "hour", 86400.0: "day", 604800.0: "week"}
    return names.get(seconds, fmt_duration(seconds))


def status_to_json(status: NodeStatus) -> str:
    """The status as strict JSON (what ``murmur status --json`` prints): the dataclass's
    fields, with numbers that are not finite (a loss before the first step) as ``null``."""
    data = asdict(status)
    for member in data["members"]:  # keys and signatures (bytes) are for nodes, not readers
        for key in [k for k, v in member.items() if isinstance(v, bytes)]:
            del member[key]
    return json.dumps(finite(data), indent=2, sort_keys=True, allow_nan=False)


def _fmt(x: float, spec: str) -> str:
    return format(x, spec) if math.isfinite(x) else "-"


def eval_summary(s: NodeStatus) -> str:
    """``eval_loss L eval_accuracy A (step N, T s ago)``, or that there was none yet."""
    if s.eval_step < 0:
        return "eval: none yet"
    return (
        f"eval_loss {_fmt(s.eval_loss, '.4f')}  eval_accuracy {s.eval_accuracy:.4f} "
        f"(step {s.eval_step}, {s.eval_age_s:.0f} s ago)"
    )


def format_status(s: NodeStatus) -> str:
    """A readable multi-line table of one node's view."""
    budget = f"/{s.step_budget}" if s.step_budget else ""
    lines = [
        f"node {s.node_id[:12]} at {s.address} ({s.device}, codec {s.codec}"
        + (f", region {s.region})" if s.region else ")"),
        f"  step {s.step}{budget}{' (done)' if s.training_done else ''}  "
        f"{s.samples_per_s:.0f} samples/s  rounds {s.rounds} ({s.rounds_skipped} skipped)"
        + (f"  held {s.held_s:.1f} s" if s.held_s else ""),
        f"  train_loss {_fmt(s.train_loss, '.4f')}  {eval_summary(s)}",
        f"  sent {fmt_size(s.bytes_sent)} ({100 * s.compression_ratio:.1f}% of fp32)  "
        f"received {fmt_size(s.bytes_received)}",
    ]
    if s.paused:
        lines.append(f"  PAUSED: {s.pause_reason} (a member still; trains and gossips nothing)")
    if s.sessions or s.relayed_bytes:
        lines.append(
            f"  sessions held for nodes behind NAT {s.sessions}  "
            f"relayed {fmt_size(s.relayed_bytes)}"
        )
    if s.budget_bytes:
        lines.append(
            f"  byte budget {fmt_size(s.budget_left_bytes)} left of {fmt_size(s.budget_bytes)} "
            f"per {period_name(s.budget_period_s)}, whole again in "
            f"{fmt_duration(s.budget_resets_in_s)}"
            + ("  (spent: heartbeats only)" if s.budget_left_bytes == 0 else "")
        )
    if s.relay_faults:
        lines.append(f"  relays found misbehaving {s.relay_faults} (named no more)")
    if s.rejected:
        lines.append("  rejected: " + ", ".join(f"{k} {v}" for k, v in sorted(s.rejected.items())))
    regions = bool(s.region) or any(n.region for n in s.neighbours)
    per_link = any(n.codec and n.codec != s.codec for n in s.neighbours)  # auto picks per link
    lines.append(f"  neighbours ({len(s.neighbours)}):")
    lines.append(
        f"    {'node':12} {'address':21} {'seq':>6} {'silent':>7} {'mix':>3} "
        f"{'distance':>9} {'sent':>10}"
        + (" codec" if per_link else "")
        + (" region" if regions else "")
    )
    for n in s.neighbours:
        silent = f"{n.silent_s:.1f}s" if n.silent_s >= 0 else "never"
        dist = f"{n.distance_rms:.2e}" if n.distance_rms >= 0 else "-"
        lines.append(
            f"    {n.node_id[:12]:12} {n.address:21} {n.replica_seq:>6} {silent:>7} "
            f"{'yes' if n.in_mix else 'no':>3} {dist:>9} {fmt_size(n.bytes_sent):>10}"
            + (f" {n.codec or '-':5}" if per_link else "")
            + (f" {n.region or '-'}" if regions else "")
        )
    lines.append(f"  members ({s.live_members} live):")
    for m in s.members:
        mark = "" if m.status is Status.ALIVE else f" ({m.status})"
        if m.paused:
            mark += " (paused)"
        if m.region:
            mark += f" region {m.region}"
        lines.append(f"    {m.node_id[:12]:12} {m.address:21} incarnation {m.incarnation}{mark}")
    known = sum(s.member_counts.values())
    if known > len(s.members):
        lines.append(f"    ... and {known - len(s.members)} more")
    return "\n".join(lines)


def format_summary(s: NodeStatus, before: NodeStatus | None, elapsed_s: float) -> str:
    """The node's one-line summary for its log: progress, rates over the last ``elapsed_s``
    seconds (since ``before``, the status of the previous summary; None: since the start), the
    mix and the last evaluation, each figure labelled as ``murmur status`` labels it."""

    def rate(now: float, then: float) -> float:
        return max(0.0, now - then) / elapsed_s if elapsed_s > 0 else 0.0

    b = before
    budget = f"/{s.step_budget}" if s.step_budget else ""
    done = " (done)" if s.training_done else ""
    mixing = sum(n.in_mix for n in s.neighbours)
    parts = [
        f"node {s.node_id[:8]} step {s.step}{budget}{done}",
        f"{rate(s.samples, b.samples if b else 0):.0f} samples/s",
        f"rounds {s.rounds} ({rate(s.rounds, b.rounds if b else 0):.1f}/s)",
        f"sent {fmt_size(rate(s.bytes_sent, b.bytes_sent if b else 0))}/s",
        f"received {fmt_size(rate(s.bytes_received, b.bytes_received if b else 0))}/s",
        f"mix {mixing}/{len(s.neighbours)} neighbours",
        f"train_loss {_fmt(s.train_loss, '.4f')}",
    ]
    if s.eval_step < 0:
        parts.append("no eval yet")
    else:
        parts.append(
            f"eval_loss {_fmt(s.eval_loss, '.4f')} eval_accuracy {s.eval_accuracy:.4f} "
            f"(step {s.eval_step})"
        )
    return ", ".join(parts)
