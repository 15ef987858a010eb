"""What a node counts about itself, and its metrics log (JSON lines in the state dir)."""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

__all__ = ["Counters", "MetricsLog", "read_metrics"]


@dataclass
class Counters:
    """Node-wide totals. Bytes are serialized message sizes (gRPC framing not included)."""

    bytes_sent: int = 0
    #: What the same messages would have taken with fp32 payloads.
    bytes_sent_fp32: int = 0
    bytes_received: int = 0
    rounds: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    #: Bytes received, by sender.
    received_from: Counter[str] = field(default_factory=Counter)


class MetricsLog:
    """Appends one JSON object per line to ``path``; each gets a wall-clock ``time``."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file: TextIO | None = path.open("a", buffering=1)

    def write(self, event: str, **fields: Any) -> None:
        if self._file is not None:
            self._file.write(json.dumps({"time": time.time(), "event": event, **fields}) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Every record of a metrics log, skipping a torn last line (from a crash mid-write)."""
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records
