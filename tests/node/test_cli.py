"""The ``murmur`` command as users run it: real processes, real sockets, real signals."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from node.daemon.checkpoint import CHECKPOINT_FILE, load_checkpoint
from node.daemon.node import SUMMARY_FILE
from node.security.pki import init_ca, issue_node

TIMEOUT_S = 120.0


class NodeProcess:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def event(self) -> dict[str, Any]:
        """The next JSON line the node prints on stdout."""
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), TIMEOUT_S)
        assert line, "the node exited: " + await self.stderr()
        event: dict[str, Any] = json.loads(line)
        return event

    async def stderr(self) -> str:
        assert self.proc.stderr is not None
        return (await self.proc.stderr.read()).decode(errors="replace")

    async def stop(self, sig: signal.Signals) -> int:
        self.proc.send_signal(sig)
        return await asyncio.wait_for(self.proc.wait(), TIMEOUT_S)


async def murmur(*args: str) -> NodeProcess:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "node",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    return NodeProcess(proc)


async def murmur_done(*args: str) -> tuple[int, str, str]:
    """Run ``murmur ARGS`` to its end: (exit code, stdout, stderr)."""
    proc = (await murmur(*args)).proc
    out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT_S)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.fixture
async def processes() -> AsyncIterator[list[NodeProcess]]:
    started: list[NodeProcess] = []
    yield started
    for p in started:
        if p.proc.returncode is None:
            p.proc.kill()
            await p.proc.wait()


@pytest.mark.timeout(240)
async def test_two_nodes_train_report_and_stop_cleanly(
    tmp_path: Path, processes: list[NodeProcess]
) -> None:
    common = ["--listen", "127.0.0.1:0", "--device", "cpu", "--threads", "1", "--wait-members", "2"]
    # Mutual TLS, as a user would set it up: a swarm CA, a certificate per node and one to ask with.
    init_ca(tmp_path / "ca")
    for name in ("a", "b", "me"):
        issue_node(tmp_path / "ca", tmp_path / name, name)
    a = await murmur(
        "run",
        *common,
        "--state-dir",
        str(tmp_path / "a"),
        "--shard",
        "0/2",
        "--steps",
        "150",
        "--compress",
        "int4",
    )
    processes.append(a)
    ready_a = await a.event()
    assert ready_a["event"] == "ready"
    # The second node takes its codec and shard from a config file, its step budget from a flag.
    (tmp_path / "b.toml").write_text(
        'shard_index = 1\nshard_count = 2\n[gossip]\ncodec = "int4"\n[trainer]\nsteps = 10\n'
    )
    b = await murmur(
        "run",
        *common,
        "--state-dir",
        str(tmp_path / "b"),
        "--config",
        str(tmp_path / "b.toml"),
        "--join",
        ready_a["address"],
        "--steps",
        "150",
    )
    processes.append(b)
    ready_b = await b.event()
    for p in (a, b):
        trained = await p.event()
        assert trained["event"] == "trained"
        assert trained["step"] == 150
        assert trained["accuracy"] > 0.8

    me = ["--tls-dir", str(tmp_path / "me")]
    code, out, err = await murmur_done("status", ready_b["address"], "--json", *me)
    assert code == 0, err
    status = json.loads(out)
    assert status["node_id"] == ready_b["node_id"]
    assert status["codec"] == "int4"
    assert status["step"] == 150
    assert [n["node_id"] for n in status["neighbours"]] == [ready_a["node_id"]]
    assert {m["node_id"] for m in status["members"]} == {ready_a["node_id"], ready_b["node_id"]}
    code, out, _ = await murmur_done("status", ready_b["address"], *me)
    assert code == 0
    assert "neighbours (1)" in out
    code, _, err = await murmur_done("status", ready_b["address"], "--insecure", "--timeout", "2")
    assert code == 1  # a TLS node does not talk plain TCP, and says so
    assert "it runs mutual TLS, so ask it with --tls-dir DIR" in err

    assert await a.stop(signal.SIGTERM) == 0
    assert await b.stop(signal.SIGINT) == 0
    for name, ready in (("a", ready_a), ("b", ready_b)):
        ckpt = load_checkpoint(tmp_path / name / CHECKPOINT_FILE)
        state, meta = ckpt.model, ckpt.meta
        assert meta["node_id"] == ready["node_id"]
        assert meta["step"] == 150
        assert set(state) == {"0.weight", "0.bias", "2.weight", "2.bias"}
        assert json.loads((tmp_path / name / SUMMARY_FILE).read_text())["step"] == 150


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--shard", "3/2"], "need 0 <= i < n"),
        (["--device", "cuda", "--insecure"], "no CUDA device"),
        (["--device", "tpu", "--insecure"], "unknown device"),
        (["--task", "no.such:thing", "--insecure"], "cannot import no.such"),
        (["--listen", "nowhere"], "is not host:port"),
        (["--step-time", "-1", "--insecure"], "--step-time -1: must be at least 0"),
        (["--eval-every", "0", "--insecure"], "--eval-every 0: must be at least 1"),
        (["--steps", "-5", "--insecure"], "--steps -5: must be at least 1"),
        (["--threads", "0", "--insecure"], "--threads 0: must be at least 1"),
        (["--wait-members", "0", "--insecure"], "--wait-members 0: must be at least 1"),
        (["--join", "127.0.0.1:9", "--wait-timeout", "0.5", "--insecure"], "did not answer"),
        ([], "murmur ca issue"),  # no certificate, and no --insecure
    ],
)
async def test_bad_invocations_exit_2_and_say_why(
    tmp_path: Path, args: list[str], message: str
) -> None:
    code, _, err = await murmur_done(
        "run", "--state-dir", str(tmp_path), "--listen", "127.0.0.1:0", *args
    )
    assert code == 2
    assert message in err


async def test_a_config_file_with_a_typo_is_refused(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text('[gossip]\ncodex = "int8"\n')
    code, _, err = await murmur_done("run", "--config", str(tmp_path / "bad.toml"))
    assert code == 2
    assert "unknown key gossip.codex; did you mean gossip.codec?" in err


async def test_a_bad_setting_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """``insecure = "false"`` once ran a node over plain TCP: now nothing starts at all."""
    (tmp_path / "bad.toml").write_text(f'state_dir = "{tmp_path / "state"}"\ninsecure = "false"\n')
    code, out, err = await murmur_done("run", "--config", str(tmp_path / "bad.toml"))
    assert code == 2
    assert out == ""  # no ready line
    assert f'{tmp_path / "bad.toml"} line 2: insecure = "false": expected true or false' in err
    assert not (tmp_path / "state").exists()
    assert "Traceback" not in err


async def test_status_of_nobody_fails_clearly() -> None:
    code, _, err = await murmur_done("status", "127.0.0.1:9", "--timeout", "1", "--insecure")
    assert code == 1
    assert "UNAVAILABLE" in err


async def test_a_metrics_port_in_use_is_named(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, _, err = await murmur_done(
            "run",
            "--insecure",
            "--state-dir",
            str(tmp_path),
            "--listen",
            "127.0.0.1:0",
            "--device",
            "cpu",
            "--metrics-host",
            "127.0.0.1",
            "--metrics-port",
            str(port),
        )
    assert code == 2
    assert f"cannot serve metrics on 127.0.0.1:{port}: Address already in use" in err


async def test_a_listen_port_in_use_is_named_without_grpcs_own_lines(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        code, _, err = await murmur_done(
            "run",
            "--insecure",
            "--state-dir",
            str(tmp_path),
            "--device",
            "cpu",
            "--listen",
            address,
        )
    assert code == 2
    assert f"cannot listen on {address}: the port is taken" in err
    assert "add_port.cc" not in err  # gRPC's C-core logging is off unless asked for


async def test_json_logs_are_one_object_per_line(tmp_path: Path, dead_port: int) -> None:
    code, _, err = await murmur_done(
        "run",
        "--log-format",
        "json",
        "--insecure",
        "--state-dir",
        str(tmp_path),
        "--listen",
        "127.0.0.1:0",
        "--device",
        "cpu",
        "--join",
        f"127.0.0.1:{dead_port}",
        "--wait-timeout",
        "0.5",
    )
    assert code == 2
    records = [json.loads(line) for line in err.splitlines()]
    assert {"time", "level", "logger", "message"} <= set(records[0])
    assert any(r["level"] == "ERROR" and "did not answer" in r["message"] for r in records)


@pytest.fixture
def dead_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]
