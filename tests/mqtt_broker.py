"""A real mosquitto broker for tests, on a free port (of loopback, or of ``host``), that can stop
and start again on the same port (a broker that goes away mid-run)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0


def mosquitto_binary() -> str:
    """The mosquitto executable; fails the test with what to do if there is none."""
    # Debian installs it in /usr/sbin, which is not on every user's PATH.
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])
    found = shutil.which("mosquitto", path=path)
    if found is None:
        pytest.fail(
            "mosquitto is not installed; run scripts/ensure-mosquitto (make test-fast does)",
            pytrace=False,
        )
    return found


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


class MosquittoBroker:
    """``start()`` and ``stop()`` as often as a test needs; the port stays the same.

    ``persistent``: retained messages and sessions are saved in ``workdir`` every second and
    loaded again on start, as a broker in production keeps them. ``host``: the address it
    listens on (a test network's bridge address, say, for nodes in namespaces).
    """

    def __init__(self, workdir: Path, persistent: bool = False, host: str = "127.0.0.1") -> None:
        self.binary = mosquitto_binary()
        self.workdir = workdir
        self.host = host
        self.port = free_port(host)
        self.proc: subprocess.Popen[bytes] | None = None
        self.conf = workdir / "mosquitto.conf"
        self.log = workdir / "mosquitto.log"
        self.db = workdir / "mosquitto.db"
        persistence = (
            # "user root": run as root, mosquitto would drop to its own user, who cannot write
            # into a test's folder (it ignores the line otherwise).
            f"persistence true\npersistence_location {workdir}/\nautosave_interval 1\nuser root\n"
            if persistent
            else "persistence false\n"
        )
        self.conf.write_text(f"listener {self.port} {host}\nallow_anonymous true\n{persistence}")

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    def start(self) -> None:
        """Start mosquitto and return once its port takes connections."""
        assert self.proc is None, "the broker runs already"
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [self.binary, "-c", str(self.conf)], stdout=log, stderr=subprocess.STDOUT
            )
        # Polling the port is waiting for the event itself: the listener being up.
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _accepts(self.host, self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"mosquitto did not start:\n{self.log.read_text()}", pytrace=False)
            time.sleep(0.02)

    def stop(self, kill: bool = False) -> None:
        """Stop mosquitto: SIGTERM, or SIGKILL with ``kill`` (it says goodbye to nobody)."""
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        if kill:
            proc.kill()
        else:
            proc.terminate()
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
