"""Pausing real node processes: each device policy driven through a fake sysfs tree, by hand
with ``murmur ctl`` (the node's own certificate, another node's, an admin's), and with SIGUSR1
and SIGUSR2.

Four ``murmur run`` processes over mutual TLS. Node 1 pauses on battery below 20%; node 2 only
on AC and above 80 °C; node 3 is outside its active hours from the start. A paused node stays a
live member of every view, is in no one's neighbours, takes no steps and sends no gossip bytes;
after a pause of more than ``PULL_AFTER_PAUSE_S`` it pulls the swarm's model and its accuracy is
back with the others' within a few evaluations.
"""

from __future__ import annotations

import asyncio
import inspect
import signal
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest

from gossip.swim import Status
from node.cli.swarm import NodeProcess, SwarmConfig, node_argv, provision
from node.config import GossipConfig
from node.daemon.node import PULL_AFTER_PAUSE_S
from node.daemon.power import format_hours, minute_of_day
from node.telemetry.status import NodeStatus
from node.transport.grpc import GrpcTransport, GrpcTransportConfig
from tests.e2e.watch import wait_for

pytestmark = pytest.mark.e2e

CFG = SwarmConfig(nodes=4, steps=1_000_000, alpha=None, eval_every=100, gossip=GossipConfig())
EXTRA = ["--swim-period", "0.5", "--power-poll-interval", "0.2"]
TIMEOUT_S = 120.0


def supply(root: Path, name: str, kind: str, **files: object) -> None:
    folder = root / "class" / "power_supply" / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "type").write_text(kind + "\n")
    for key, value in files.items():
        (folder / key).write_text(f"{value}\n")


def thermal(root: Path, celsius: float) -> None:
    zone = root / "class" / "thermal" / "thermal_zone0"
    zone.mkdir(parents=True, exist_ok=True)
    (zone / "temp").write_text(f"{int(celsius * 1000)}\n")


def live_paused(s: NodeStatus, node_id: str) -> bool:
    """Whether ``s``'s view holds ``node_id`` as a live member that is paused."""
    return any(
        m.node_id == node_id and m.status in (Status.ALIVE, Status.SUSPECT) and m.paused
        for m in s.members
    )


async def act(what: Callable[[], object]) -> None:
    """Do ``what``, and wait for it if it is a coroutine."""
    done = what()
    if inspect.isawaitable(done):
        await done


def neighbour_ids(s: NodeStatus) -> set[str]:
    return {n.node_id for n in s.neighbours}


async def ctl(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "node",
        "ctl",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), TIMEOUT_S)
    return proc.returncode or 0, out.decode()


@pytest.mark.timeout(600)
async def test_each_policy_ctl_and_signals_pause_and_resume_real_nodes(tmp_path: Path) -> None:
    procs = [NodeProcess(i, tmp_path / f"node-{i}") for i in range(CFG.nodes)]
    tls = provision(CFG, tmp_path, [p.state_dir for p in procs])
    transport = GrpcTransport(GrpcTransportConfig(tls=tls))
    laptop, board = tmp_path / "laptop-sys", tmp_path / "board-sys"
    supply(laptop, "AC", "Mains", online=0)
    supply(laptop, "BAT0", "Battery", capacity=90, status="Discharging")
    supply(board, "ADP1", "Mains", online=1)
    thermal(board, 45.0)
    later = (minute_of_day(datetime.now()) + 120) % (24 * 60)  # two to three hours from now
    hours = format_hours((later, (later + 60) % (24 * 60)))
    policies = {
        1: ["--sysfs-root", str(laptop), "--pause-on-battery-below", "20"],
        2: ["--sysfs-root", str(board), "--only-on-ac", "--pause-above-temp", "80"],
        3: ["--active-hours", hours],
    }
    try:
        for p in procs:
            join = procs[0].address if p.index else None
            argv = node_argv(CFG, p.index, p.state_dir, join, 3) + EXTRA
            await p.start(argv + policies.get(p.index, []), TIMEOUT_S)
        a, laptop_node, board_node, night = procs
        running = [a, laptop_node, board_node]

        # Node 3 is outside its active hours: paused from the start, a member all the same.
        await wait_for(
            transport,
            procs,
            lambda ss: (
                all(s.step >= 300 for s in ss[:3])
                and ss[3].paused
                and all(live_paused(s, night.node_id) for s in ss[:3])
            ),
            "three nodes training beside the one outside its hours",
            TIMEOUT_S,
        )
        s3 = (await wait_for(transport, [night], lambda ss: True, "status", TIMEOUT_S))[0]
        assert "outside the active hours" in s3.pause_reason
        assert s3.step == 0
        assert s3.bytes_sent == 0

        async def paused_then_resumed(
            p: NodeProcess,
            reason: str,
            pause: Callable[[], object],
            resume: Callable[[], object],
            long: bool = False,
        ) -> None:
            """``pause()`` pauses ``p`` for ``reason``; while paused it takes no steps and sends
            no gossip, and nobody counts it as a neighbour; ``resume()`` brings it back."""
            await act(pause)
            got = await wait_for(
                transport,
                running,
                lambda ss: (
                    ss[running.index(p)].paused
                    and all(
                        live_paused(s, p.node_id) and p.node_id not in neighbour_ids(s)
                        for s in ss
                        if s.node_id != p.node_id
                    )
                ),
                f"node {p.index} to pause ({reason}) and leave every topology",
                TIMEOUT_S,
            )
            mine = got[running.index(p)]
            assert reason in mine.pause_reason, mine.pause_reason
            began = time.monotonic()
            # Watched while the others go on: no step and no gossip byte from the paused one.
            held_s = PULL_AFTER_PAUSE_S + 1 if long else 1.0
            steps = {s.node_id: s.step for s in got}

            def still(ss: list[NodeStatus]) -> bool:
                me = ss[running.index(p)]
                assert me.paused
                assert me.step == mine.step, (me.step, mine.step)
                assert me.bytes_sent == mine.bytes_sent
                return time.monotonic() - began >= held_s and all(
                    s.step > steps[s.node_id] for s in ss if s.node_id != p.node_id
                )

            await wait_for(transport, running, still, f"node {p.index} held paused", TIMEOUT_S)
            await act(resume)
            back = await wait_for(
                transport,
                running,
                lambda ss: (
                    not ss[running.index(p)].paused
                    and ss[running.index(p)].step > mine.step
                    and any(p.node_id in neighbour_ids(s) for s in ss if s.node_id != p.node_id)
                ),
                f"node {p.index} to resume",
                TIMEOUT_S,
            )
            if long:  # caught up: the pulled model, then a few evaluations of its own
                assert "started from the model of" in p.log_tail(200)
                resumed_at = back[running.index(p)].step

                def caught_up(ss: list[NodeStatus]) -> bool:
                    me = ss[running.index(p)]
                    worst = min(s.eval_accuracy for s in ss if s.node_id != p.node_id)
                    return me.eval_step > resumed_at and me.eval_accuracy >= worst - 0.05

                got = await wait_for(transport, running, caught_up, "the accuracy back", TIMEOUT_S)
                me = got[running.index(p)]
                print(  # for the README's figure
                    f"paused {time.monotonic() - began:.1f} s; accuracy {me.eval_accuracy:.3f} "
                    f"at step {me.eval_step} ({me.eval_step - resumed_at} after the resume); "
                    f"the others' {[round(s.eval_accuracy, 3) for s in got if s is not me]}"
                )

        # Battery: 10% on battery pauses; 22% holds the pause (hysteresis); 30% ends it.
        await paused_then_resumed(
            laptop_node,
            "on battery at 10%",
            lambda: supply(laptop, "BAT0", "Battery", capacity=10, status="Discharging"),
            lambda: supply(laptop, "BAT0", "Battery", capacity=30, status="Discharging"),
        )
        # Off AC, long enough that the node pulls the swarm's model when it is back.
        await paused_then_resumed(
            board_node,
            "not on AC",
            lambda: supply(board, "ADP1", "Mains", online=0),
            lambda: supply(board, "ADP1", "Mains", online=1),
            long=True,
        )
        # Too hot.
        await paused_then_resumed(
            board_node, "°C", lambda: thermal(board, 85.0), lambda: thermal(board, 60.0)
        )

        # By hand: the node's own certificate may, another node's may not, an admin's may.
        code, out = await ctl("pause", a.address, "--tls-dir", str(laptop_node.state_dir))
        assert code == 1, out
        assert "may not control" in out, out
        code, out = await ctl("query", a.address, "--tls-dir", str(a.state_dir))
        assert code == 0, out
        assert "runs" in out, out
        admin = tmp_path / "admin"
        issue = [sys.executable, "-m", "node", "ca", "issue", str(tmp_path / "ca"), "ops"]
        made = await asyncio.create_subprocess_exec(
            *issue, "--admin", "--out", str(admin), stdout=asyncio.subprocess.DEVNULL
        )
        assert await made.wait() == 0

        async def ctl_ok(action: str, tls_dir: Path, said: str) -> None:
            code, out = await ctl(action, a.address, "--tls-dir", str(tls_dir))
            assert code == 0, out
            assert said in out, out

        # Paused with its own certificate, resumed with the admin's.
        await paused_then_resumed(
            a,
            "by hand",
            lambda: ctl_ok("pause", a.state_dir, "is paused: paused by hand"),
            lambda: ctl_ok("resume", admin, "runs"),
        )

        # Signals: SIGUSR1 pauses, SIGUSR2 resumes.
        assert laptop_node.proc is not None
        proc = laptop_node.proc
        await paused_then_resumed(
            laptop_node,
            "by hand",
            lambda: proc.send_signal(signal.SIGUSR1),
            lambda: proc.send_signal(signal.SIGUSR2),
        )
    finally:
        for p in procs:
            await p.stop(30)
        await transport.close(0)
