"""What a node counts about itself, and its metrics log (JSON lines in the state dir)."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from node.telemetry.histograms import NodeHistograms

__all__ = ["Counters", "MetricsLog", "json_safe", "read_metrics"]

log = logging.getLogger(__name__)

#: Bad lines of one log reported one by one; past this, one line says how many more there were.
MAX_BAD_LINE_WARNINGS = 10
#: How much of a bad line a warning quotes.
QUOTE_CHARS = 60


@dataclass
class Counters:
    """Node-wide totals. Bytes are serialized message sizes (gRPC framing not included)."""

    bytes_sent: int = 0
    #: What the same messages would have taken with fp32 payloads.
    bytes_sent_fp32: int = 0
    #: Snapshots sent (a whole x̂ each, or its digest: the first message of every new link),
    #: and their part of ``bytes_sent``.
    snapshots_sent: int = 0
    snapshot_bytes_sent: int = 0
    bytes_received: int = 0
    rounds: int = 0
    #: Rounds begun but not made: nothing worth its bytes to send (the event trigger), or no
    #: neighbour to send to.
    rounds_skipped: int = 0
    #: Seconds the trainer was held at the bound on local steps (``--max-local-steps``),
    #: waiting for its links to take the next round.
    held_s: float = 0.0
    rejected: Counter[str] = field(default_factory=Counter)
    #: Bytes received, by sender.
    received_from: Counter[str] = field(default_factory=Counter)
    #: Distributions of what the node counts (round time, delta size), for the scrape.
    histograms: NodeHistograms = field(default_factory=NodeHistograms)


def json_safe(value: Any) -> Any:
    """``value`` with NaN and infinities replaced by None: strict JSON has no such numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


class MetricsLog:
    """Appends one JSON object per line to ``path``; each gets a wall-clock ``time``.

    Non-finite numbers are written as ``null``. A log whose last line was torn (a crash
    mid-write) is continued on a fresh line, so the torn record does not swallow the next one.
    A write that fails (a full disk) is dropped with one warning until a write succeeds again:
    the log must never stop the node.
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file: BinaryIO | None = path.open("ab")
        self._failing = False
        # A torn last line (or a write that failed half way) needs a newline before the next.
        self._torn = self._file.tell() > 0 and _last_byte(path) != b"\n"

    def write(self, event: str, **fields: Any) -> None:
        if self._file is None:
            return
        record = json_safe({"time": time.time(), "event": event, **fields})
        line = json.dumps(record, allow_nan=False).encode() + b"\n"
        try:
            self._file.write(b"\n" + line if self._torn else line)
            self._file.flush()
        except OSError as err:
            self._torn = True
            if not self._failing:
                log.warning(
                    "cannot write to %s (%s); dropping records until it can", self.path, err
                )
                self._failing = True
            return
        self._torn = False
        if self._failing:
            log.info("writing to %s again", self.path)
            self._failing = False

    def close(self) -> None:
        if self._file is not None:
            # What could not be flushed is lost, as with a failed write.
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None


def _last_byte(path: Path) -> bytes:
    with path.open("rb") as f:
        f.seek(-1, 2)
        return f.read(1)


def _parse(line: str) -> tuple[dict[str, Any] | None, str]:
    """A record, or None and what is wrong with the line."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        # A line torn by a crash, continued by the next life's first record (logs written
        # before MetricsLog started torn logs on a fresh line): keep the whole record.
        at = line.rfind('{"time"')
        if at > 0:
            tail, _ = _parse(line[at:])
            if tail is not None:
                return tail, ""
        return None, f"not JSON ({err.msg} at column {err.colno})"
    if not isinstance(record, dict):
        return None, f"a JSON {type(record).__name__}, not an object"
    if not isinstance(record.get("event"), str):
        return None, "no event"
    if not isinstance(record.get("time"), int | float) or isinstance(record["time"], bool):
        return None, "no time"
    return record, ""


def read_metrics(
    path: Path, check: Callable[[dict[str, Any]], str] = lambda record: ""
) -> list[dict[str, Any]]:
    """Every record of a metrics log.

    A line that is not a record, or one for which ``check`` says what is wrong with it, is
    skipped with a warning naming the file and the line; a torn last line (a crash mid-write)
    is skipped quietly.
    """
    lines = path.read_text(errors="replace").splitlines()
    complete = path.stat().st_size == 0 or _last_byte(path) == b"\n"
    records, bad = [], 0
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        record, why = _parse(line)
        if record is not None:
            why = check(record)
        if record is not None and not why:
            records.append(record)
            continue
        if number == len(lines) and not complete:
            log.info("%s: line %d is torn (the node stopped mid-write); skipped", path, number)
            continue
        bad += 1
        if bad <= MAX_BAD_LINE_WARNINGS:
            quote = line[:QUOTE_CHARS] + ("..." if len(line) > QUOTE_CHARS else "")
            log.warning("%s: line %d skipped: %s: %r", path, number, why, quote)
    if bad > MAX_BAD_LINE_WARNINGS:
        log.warning("%s: %d more bad lines skipped", path, bad - MAX_BAD_LINE_WARNINGS)
    return records
