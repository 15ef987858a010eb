"""Runs the commands that the README, docstrings and ``--help`` show, exactly as written, in a
sandbox: ``python -m tests.doc_commands PLAN.json`` under ``unshare --net --mount`` (root), as
``tests/test_docs.py`` does. Inside: a network namespace of its own (so the fixed ports of the
examples, 7070 and up, collide with nothing, and 10.0.0.5, the README's "other machine", is an
address of this one), a fresh /tmp for each block, ``broker`` resolving to a mosquitto on port
1883, and a HOME for ``~`` (one per story: the README's blocks share theirs).

The plan is a list of blocks, each a list of shell commands. In a block, ``murmur run`` and
``murmur monitor`` without ``--once`` are daemons, as a user runs them in a terminal of their
own: each is started and waited for until it prints its first line on stdout (the ready line,
the first table); any other command must end with exit code 0. At a block's end its daemons get
SIGTERM and must exit 0. Prints one JSON object: every command with its exit code and output.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

READY_TIMEOUT_S = 120.0
COMMAND_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0

_DAEMON = re.compile(r"^(\w+=\S+\s+)*murmur\s+(run|monitor)\b")


def is_daemon(command: str) -> bool:
    return bool(_DAEMON.match(command)) and "--once" not in command


def sandbox(root: Path) -> subprocess.Popen[bytes]:
    """Loopback up with 10.0.0.5 on it, ``broker`` in /etc/hosts, a broker on port 1883; the
    sandbox's own files under ``root`` (a tmpfs), since each block gets a fresh /tmp."""
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    subprocess.run(["ip", "addr", "add", "10.0.0.5/32", "dev", "lo"], check=True)
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(root)], check=True)
    hosts = root / "hosts"
    hosts.write_text("127.0.0.1 localhost broker\n")
    subprocess.run(["mount", "--bind", str(hosts), "/etc/hosts"], check=True)
    conf = root / "mosquitto.conf"
    conf.write_text("listener 1883 0.0.0.0\nallow_anonymous true\npersistence false\n")
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])
    mosquitto = shutil.which("mosquitto", path=path)
    assert mosquitto, "mosquitto is not installed (scripts/ensure-mosquitto)"
    broker = subprocess.Popen(
        [mosquitto, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:  # waiting for the event itself: the broker's port taking connections
        try:
            socket.create_connection(("127.0.0.1", 1883), timeout=0.5).close()
            return broker
        except OSError:
            assert broker.poll() is None, "mosquitto exited"
            assert time.monotonic() < deadline, "mosquitto did not start listening"
            time.sleep(0.05)


def block_env(root: Path, home: str) -> dict[str, str]:
    """A fresh /tmp, and the HOME called ``home`` (blocks of one story share theirs)."""
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", "/tmp"], check=True)
    (root / home).mkdir(exist_ok=True)
    env = {**os.environ, "HOME": str(root / home)}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def first_line(proc: subprocess.Popen[bytes], timeout_s: float) -> bytes:
    """The daemon's first line on stdout (b"" if it exited or stayed silent)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    line = b""
    while not line.endswith(b"\n") and time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 1)
            if not chunk:
                break
            line += chunk
    return line


def run_block(commands: list[str], env: dict[str, str], cwd: str) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    daemons: list[tuple[dict[str, Any], subprocess.Popen[bytes]]] = []
    for command in commands:
        entry: dict[str, Any] = {"command": command}
        results.append(entry)
        if is_daemon(command):
            proc = subprocess.Popen(
                ["bash", "-c", command],
                env=env,
                cwd=cwd,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
            entry["first_line"] = first_line(proc, READY_TIMEOUT_S).decode(errors="replace")
            daemons.append((entry, proc))
            if not entry["first_line"]:
                break
            continue
        done = subprocess.run(
            ["bash", "-c", command],
            env=env,
            cwd=cwd,
            capture_output=True,
            timeout=COMMAND_TIMEOUT_S,
        )
        entry.update(
            code=done.returncode,
            stdout=done.stdout.decode(errors="replace")[-2000:],
            stderr=done.stderr.decode(errors="replace")[-2000:],
        )
        if done.returncode != 0:
            break
    for entry, proc in reversed(daemons):
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # bash and the command it runs
        try:
            out, err = proc.communicate(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            entry["hung"] = True
        entry.update(
            code=proc.returncode,
            stdout=out.decode(errors="replace")[-2000:],
            stderr=err.decode(errors="replace")[-3000:],
        )
    return results


def main() -> None:
    plan = json.loads(Path(sys.argv[1]).read_text())
    root = Path("/mnt/murmur-docs")
    broker = sandbox(root)
    out = []
    try:
        for block in plan["blocks"]:
            env = block_env(root, block["home"])
            results = run_block(block["commands"], env, plan["cwd"])
            out.append({"name": block["name"], "results": results})
    finally:
        broker.terminate()
        broker.wait()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
