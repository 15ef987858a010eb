"""A node's view of itself and its neighbours, as served by the Status RPC and shown by the CLI."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from gossip.swim import MemberRecord, Status

__all__ = [
    "MAX_STATUS_MEMBERS",
    "NeighbourStatus",
    "NodeStatus",
    "format_status",
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


@dataclass(frozen=True)
class NodeStatus:
    node_id: str
    address: str
    device: str
    codec: str
    step: int
    step_budget: int  # 0: no budget
    training_done: bool
    loss: float
    accuracy: float  # -1 before the first evaluation
    rounds: int
    bytes_sent: int
    bytes_sent_fp32: int
    bytes_received: int
    samples_per_s: float
    samples: int = 0
    neighbours: tuple[NeighbourStatus, ...] = ()
    #: The first members this node knows of (itself, the live, then the dead and departed),
    #: at most MAX_STATUS_MEMBERS.
    members: tuple[MemberRecord, ...] = ()
    rejected: dict[str, int] = field(default_factory=dict)
    #: Every member this node knows of, by status ("alive", "suspect", "dead", "left").
    member_counts: dict[str, int] = field(default_factory=dict)

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


def status_to_json(status: NodeStatus) -> str:
    data = asdict(status)
    for member in data["members"]:  # keys, signatures, certificates are for nodes, not readers
        del member["public_key"], member["signature"], member["certificate"]
    return json.dumps(data, indent=2, sort_keys=True)


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_status(s: NodeStatus) -> str:
    """A readable multi-line table of one node's view."""
    budget = f"/{s.step_budget}" if s.step_budget else ""
    acc = f"{s.accuracy:.3f}" if s.accuracy >= 0 else "-"
    lines = [
        f"node {s.node_id[:12]} at {s.address} ({s.device}, codec {s.codec})",
        f"  step {s.step}{budget}{' (done)' if s.training_done else ''}  loss {s.loss:.4f}  "
        f"accuracy {acc}  {s.samples_per_s:.0f} samples/s  rounds {s.rounds}",
        f"  sent {_fmt_bytes(s.bytes_sent)} ({100 * s.compression_ratio:.1f}% of fp32)  "
        f"received {_fmt_bytes(s.bytes_received)}",
    ]
    if s.rejected:
        lines.append("  rejected: " + ", ".join(f"{k} {v}" for k, v in sorted(s.rejected.items())))
    lines.append(f"  neighbours ({len(s.neighbours)}):")
    lines.append(
        f"    {'node':12} {'address':21} {'seq':>6} {'silent':>7} {'mix':>3} "
        f"{'distance':>9} {'sent':>10}"
    )
    for n in s.neighbours:
        silent = f"{n.silent_s:.1f}s" if n.silent_s >= 0 else "never"
        dist = f"{n.distance_rms:.2e}" if n.distance_rms >= 0 else "-"
        lines.append(
            f"    {n.node_id[:12]:12} {n.address:21} {n.replica_seq:>6} {silent:>7} "
            f"{'yes' if n.in_mix else 'no':>3} {dist:>9} {_fmt_bytes(n.bytes_sent):>10}"
        )
    lines.append(f"  members ({s.live_members} live):")
    for m in s.members:
        mark = "" if m.status is Status.ALIVE else f" ({m.status})"
        lines.append(f"    {m.node_id[:12]:12} {m.address:21} incarnation {m.incarnation}{mark}")
    known = sum(s.member_counts.values())
    if known > len(s.members):
        lines.append(f"    ... and {known - len(s.members)} more")
    return "\n".join(lines)
