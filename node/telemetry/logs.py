"""The console log: text for people, or one JSON object per line for log shippers; and gRPC's
own C-core logging, off unless asked for."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any, TextIO

__all__ = ["LOG_FORMATS", "LOG_LEVELS", "JsonFormatter", "quiet_grpc", "setup_logging"]

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (ISO 8601, UTC), ``level``, ``logger``,
    ``message``, and ``exception`` when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out)


def quiet_grpc(environ: dict[str, str] | os._Environ[str] = os.environ) -> None:
    """Silence gRPC's C-core logging (raw ``E1201 ... add_port.cc`` lines on stderr), whose
    failures murmur reports itself, unless the user set ``GRPC_VERBOSITY``. Must run before
    grpc is imported: the core reads the variable once."""
    environ.setdefault("GRPC_VERBOSITY", "NONE")


def setup_logging(level: str, fmt: str, stream: TextIO = sys.stderr) -> None:
    """Log at ``level`` (one of :data:`LOG_LEVELS`) to ``stream`` in ``fmt`` (text or json)."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
