"""A node's history as its metrics log tells it: one session per start, evaluations over time.

A node that restarts on the same state dir appends to the same log, so the log is cut into
sessions at each ``start`` record. Counters (rounds, bytes) start from zero in every session;
steps do not, since a restarted node resumes from its checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

from node.daemon.statedir import METRICS_FILE
from node.telemetry.events import read_metrics

__all__ = [
    "EvalPoint",
    "NodeHistory",
    "Session",
    "parse_history",
    "read_history",
    "record_problem",
]


@dataclass(frozen=True)
class EvalPoint:
    time: float  # unix seconds
    step: int
    loss: float
    accuracy: float
    #: RMS of x_i - x̂_j averaged over the node's neighbours' replicas; -1 when it had none.
    distance_rms: float


@dataclass(frozen=True)
class Session:
    """One life of a node: from a ``start`` record to the next one or the end of the log."""

    started: float  # unix seconds
    ended: float  # unix seconds of its last record
    evals: tuple[EvalPoint, ...]
    #: The last step logged (evaluation, checkpoint or stop); -1 when none was.
    step: int
    rounds: int
    bytes_sent: int
    bytes_sent_fp32: int
    pulled_model: bool
    #: It ended with a ``stop`` record; otherwise the process died, or is still running.
    stopped: bool


@dataclass(frozen=True)
class NodeHistory:
    state_dir: Path
    node_id: str
    sessions: tuple[Session, ...]
    #: What the task is judged by (``accuracy``, ``loss`` or ``perplexity``), as its ``start``
    #: records say; logs from before tasks declared it are of accuracy tasks.
    metric: str = "accuracy"
    #: The task's target for that metric; None when it declares none.
    target: float | None = None

    @property
    def evals(self) -> list[EvalPoint]:
        return [e for s in self.sessions for e in s.evals]

    @property
    def restarts(self) -> int:
        return len(self.sessions) - 1

    @property
    def step(self) -> int:
        return max((s.step for s in self.sessions), default=-1)

    @property
    def rounds(self) -> int:
        return sum(s.rounds for s in self.sessions)

    @property
    def bytes_sent(self) -> int:
        return sum(s.bytes_sent for s in self.sessions)

    @property
    def bytes_sent_fp32(self) -> int:
        return sum(s.bytes_sent_fp32 for s in self.sessions)

    @property
    def pulled_model(self) -> bool:
        return any(s.pulled_model for s in self.sessions)

    @property
    def first_time(self) -> float:
        return self.sessions[0].started

    @property
    def last_time(self) -> float:
        return self.sessions[-1].ended


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_number(value: Any) -> bool:
    # A non-finite number is logged as null.
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


def record_problem(record: Mapping[str, Any]) -> str:
    """What keeps ``record`` out of a history ("" when nothing does)."""
    event = record["event"]
    if event == "eval" and not _is_count(record.get("step")):
        return "an eval record without a step"
    if event == "eval" and not all(
        k in record and _is_number(record[k]) for k in ("loss", "accuracy")
    ):
        return "an eval record without a loss and an accuracy"
    if event in ("checkpoint", "stop") and "step" in record and not _is_count(record["step"]):
        return f"a {event} record whose step is not a count"
    for key in ("rounds", "bytes_sent", "bytes_sent_fp32"):
        if key in record and not _is_count(record[key]):
            return f"its {key} is not a count"
    if "distance_rms" in record and not _is_number(record["distance_rms"]):
        return "its distance_rms is not a number"
    if "node_id" in record and not isinstance(record["node_id"], str):
        return "its node_id is not a string"
    return ""


def _float(value: Any, default: float = math.nan) -> float:
    return default if value is None else float(value)


def _session(records: Sequence[Mapping[str, Any]]) -> Session:
    evals = tuple(
        EvalPoint(
            time=float(r["time"]),
            step=int(r["step"]),
            loss=_float(r["loss"]),
            accuracy=_float(r["accuracy"]),
            distance_rms=_float(r.get("distance_rms"), -1.0),
        )
        for r in records
        if r["event"] == "eval"
    )
    with_step = [r for r in records if r["event"] in ("eval", "checkpoint", "stop") and "step" in r]
    # The stop record holds the session's final counters; without one (a crash), the last
    # evaluation holds the latest the log knows.
    counted = [r for r in records if r["event"] in ("eval", "stop")]
    last = counted[-1] if counted else {}
    return Session(
        started=float(records[0]["time"]),
        ended=float(records[-1]["time"]),
        evals=evals,
        step=int(with_step[-1]["step"]) if with_step else -1,
        rounds=int(last.get("rounds", 0)),
        bytes_sent=int(last.get("bytes_sent", 0)),
        bytes_sent_fp32=int(last.get("bytes_sent_fp32", 0)),
        pulled_model=any(r["event"] == "pulled_model" for r in records),
        stopped=records[-1]["event"] == "stop",
    )


def parse_history(state_dir: Path, records: list[dict[str, Any]]) -> NodeHistory:
    """Cut a metrics log's records (each passing :func:`record_problem`) into sessions.

    Raises:
        ValueError: there are no records.
    """
    if not records:
        raise ValueError(f"{state_dir}: the metrics log is empty")
    cuts = [i for i, r in enumerate(records) if r["event"] == "start" and i > 0]
    bounds = [0, *cuts, len(records)]
    sessions = tuple(_session(records[a:b]) for a, b in pairwise(bounds))
    ids = [r["node_id"] for r in records if r["event"] in ("start", "stop") and "node_id" in r]
    starts = [r for r in records if r["event"] == "start" and isinstance(r.get("metric"), str)]
    metric = starts[-1]["metric"] if starts else "accuracy"
    target = starts[-1].get("target") if starts else None
    return NodeHistory(
        state_dir,
        ids[0] if ids else state_dir.name,
        sessions,
        metric,
        float(target) if _is_number(target) and target is not None else None,
    )


def read_history(state_dir: Path) -> NodeHistory:
    """Read the metrics log in ``state_dir``; a bad line is skipped with a warning.

    Raises:
        FileNotFoundError: there is no metrics log.
        ValueError: it holds no records.
    """
    return parse_history(state_dir, read_metrics(state_dir / METRICS_FILE, record_problem))
