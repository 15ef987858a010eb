"""Pausing a node: by hand and by its device's policy; out of the topology, still a member;
back in on resume, after a pull of the swarm's model when the pause was long.

Real nodes on the in-memory transport (tests/node/helpers.py); the device is a fake sysfs tree.
tests/e2e/test_pause.py drives the same through real processes.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from node.daemon import node as node_module
from node.daemon.node import Node
from node.daemon.pause import HAND, Pauser
from node.daemon.power import PausePolicy
from node.daemon.service import NodeService
from node.runtime import Runtime
from node.security.pki import NodeCertificates, init_ca, is_admin_certificate, issue_node
from node.telemetry.metrics import status_metrics
from node.telemetry.mqtt_messages import status_payload
from node.telemetry.status import NodeStatus, format_status
from node.transport.base import ControlCaller, Rejected
from node.transport.memory import MemoryNetwork, MemoryTransport
from tests.node.helpers import memory_swarm

SETTINGS = {"trainer.steps": None, "trainer.eval_every": 50}


def battery(root: Path, pct: int, status: str = "Discharging") -> None:
    bat = root / "class" / "power_supply" / "BAT0"
    bat.mkdir(parents=True, exist_ok=True)
    (bat / "type").write_text("Battery\n")
    (bat / "capacity").write_text(f"{pct}\n")
    (bat / "status").write_text(status + "\n")


def gauge(status: NodeStatus, name: str) -> float:
    return next(m.samples[0].value for m in status_metrics(status) if m.name == name)


def neighbours_of(node: Node) -> frozenset[str]:
    return node.peers.neighbourhood.neighbours


async def test_a_paused_node_leaves_the_topology_stays_a_member_and_comes_back(
    tmp_path: Path,
) -> None:
    async with memory_swarm(tmp_path, 4, SETTINGS) as nodes:
        a, b, c, d = nodes
        others = [a, b, d]
        await a.wait_until(lambda: all(n.trainer.step >= 100 for n in nodes), 60)
        assert any(c.node_id in neighbours_of(n) for n in others)

        paused, reason = await c.control("pause")
        assert paused
        assert "by hand" in reason
        # Out of everyone's topology (its neighbours renormalise over the others), its own too:
        # the pings go out before its own graph is redrawn on the gossip worker, which may be
        # busy with a round, so the others can drop it first ...
        await a.wait_until(
            lambda: (
                all(c.node_id not in neighbours_of(n) for n in others)
                and neighbours_of(c) == frozenset()
            ),
            30,
        )
        assert c.peers.links == {}
        # ... still a live member of every view, which says it is paused ...
        for n in others:
            record = n.peers.swim.record(c.node_id)
            assert record is not None
            assert record.live
            assert record.paused
        # ... trains nothing, and sends no model bytes.
        step, sent = c.trainer.step, c.counters.bytes_sent
        await a.wait_until(lambda: all(n.trainer.step >= step + 200 for n in others), 60)
        assert c.trainer.step <= step + 1  # the step under way when it paused
        assert c.counters.bytes_sent == sent
        status = await c.status()
        assert status.paused
        assert "by hand" in status.pause_reason
        assert "PAUSED" in format_status(status)
        assert gauge(status, "murmur_paused") == 1
        assert json.loads(status_payload(status, online=True, now=0.0, interval_s=5.0))["paused"]
        seen_by_a = await a.status()
        assert gauge(seen_by_a, "murmur_paused") == 0
        assert f"{c.node_id[:12]}" in format_status(seen_by_a)
        line = next(x for x in format_status(seen_by_a).splitlines() if c.node_id[:12] in x)
        assert "(paused)" in line  # the members table of a node that is not paused

        paused, reason = await c.control("resume")
        assert (paused, reason) == (False, "")
        await a.wait_until(lambda: any(c.node_id in neighbours_of(n) for n in others), 30)
        await a.wait_until(lambda: c.trainer.step >= step + 50, 60)
        assert c.counters.bytes_sent > sent
        assert not (await c.status()).paused


async def test_a_long_pause_ends_with_a_pull_of_the_swarms_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(node_module, "PULL_AFTER_PAUSE_S", 0.0)  # every pause counts as long
    async with memory_swarm(tmp_path, 3, SETTINGS) as nodes:
        a, _, c = nodes
        await a.wait_until(lambda: all(n.trainer.step >= 100 for n in nodes), 60)
        await c.control("pause")
        await c.pauser.settled()
        session = c.state.session
        await c.control("resume")
        await c.pauser.settled()
        # Adopting a pulled model starts a new log, so that the neighbours resync from it.
        assert c.state.session != session
        assert c.metrics is not None
        c.metrics.close()
        records = [json.loads(line) for line in c.metrics.path.read_text().splitlines()]
        events = [r["event"] for r in records]
        assert events.index("pause") < events.index("resume")
        assert [r for r in records if r["event"] == "resume"][-1]["paused_s"] >= 0


async def test_a_resume_by_hand_leaves_the_policys_pause_standing(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    battery(root, 10)
    told: list[tuple[bool, float]] = []

    async def on_change(paused: bool, lasted_s: float) -> None:
        told.append((paused, lasted_s))

    pauser = Pauser(PausePolicy(battery_below=20), root, 1.0, Runtime.on_loop(), on_change)
    await pauser.check()
    assert pauser.paused
    assert "battery at 10%" in pauser.reason
    pauser.by_hand(True)
    await pauser.settled()
    assert set(pauser.reasons) == {"battery", HAND}
    pauser.by_hand(False)
    await pauser.settled()
    assert pauser.paused
    assert set(pauser.reasons) == {"battery"}
    battery(root, 22)  # above the threshold, below it plus the hysteresis: still paused
    await pauser.check()
    assert set(pauser.reasons) == {"battery"}
    battery(root, 26)
    await pauser.check()
    assert pauser.reasons == {}
    battery(root, 5, "Charging")  # charging: on AC, so the battery rule does not apply
    await pauser.check()
    assert pauser.reasons == {}
    assert [paused for paused, _ in told] == [True, False]  # told once per change


async def test_only_the_node_itself_or_an_admin_may_control_it(tmp_path: Path) -> None:
    async with memory_swarm(tmp_path, 1, SETTINGS) as nodes:
        (node,) = nodes
        service: NodeService = node.service
        me = node.node_id
        assert await service.rpc_control("query", ControlCaller(tls=True, node_id=me)) == (
            False,
            "",
        )
        with pytest.raises(Rejected, match="may not control"):
            await service.rpc_control("pause", ControlCaller(tls=True, node_id="f" * 64))
        assert node.pauser.reasons == {}
        admin = ControlCaller(tls=True, node_id="f" * 64, admin=True)
        assert (await service.rpc_control("pause", admin))[0]
        with pytest.raises(Rejected, match="own machine"):
            await service.rpc_control("resume", ControlCaller(tls=False, local=False))
        assert set(node.pauser.reasons) == {"hand"}
        assert await service.rpc_control("resume", ControlCaller(tls=False, local=True)) == (
            False,
            "",
        )


def test_an_admin_certificate_says_so_and_a_node_certificate_does_not(tmp_path: Path) -> None:
    from cryptography import x509

    init_ca(tmp_path / "ca")
    issue_node(tmp_path / "ca", tmp_path / "admin", "ops", admin=True)
    issue_node(tmp_path / "ca", tmp_path / "node", "n")
    load = x509.load_pem_x509_certificate
    assert is_admin_certificate(load((tmp_path / "admin" / "node_cert.pem").read_bytes()))
    assert not is_admin_certificate(load((tmp_path / "node" / "node_cert.pem").read_bytes()))
    # What the server asks of a caller's certificate (PEM, as gRPC hands it over).
    certs = NodeCertificates((tmp_path / "ca" / "ca_cert.pem").read_bytes())
    assert certs.is_admin((tmp_path / "admin" / "node_cert.pem").read_bytes())
    assert not certs.is_admin((tmp_path / "node" / "node_cert.pem").read_bytes())
    assert not certs.is_admin(b"not a certificate")


async def test_a_joiner_pulls_the_model_from_members_that_are_not_paused(tmp_path: Path) -> None:
    network = MemoryNetwork()
    async with memory_swarm(tmp_path, 3, SETTINGS, network) as nodes:
        a, b, c = nodes
        await a.wait_until(lambda: all(n.trainer.step >= 100 for n in nodes), 60)
        await b.control("pause")
        await b.pauser.settled()
        await a.wait_until(lambda: all(b.node_id in n.peers.view.paused for n in (a, c)), 30)
        cfg = dataclasses.replace(
            a.cfg,
            state_dir=tmp_path / "joiner",
            shard_index=0,
            join=(b.address,),  # through the paused member
            wait_members=1,
        )
        joiner = await Node.create(cfg, transport=MemoryTransport(network))
        try:
            await joiner.start()
            assert joiner.metrics is not None
            joiner.metrics.close()
            lines = joiner.metrics.path.read_text().splitlines()
            (pulled,) = [r for r in map(json.loads, lines) if r["event"] == "pulled_model"]
            assert pulled["source"] != b.address
            assert pulled["agreed_with"] != b.address
        finally:
            await joiner.stop(grace_s=0)


async def test_the_first_reading_is_said_and_a_rule_with_nothing_to_read_is_warned_of(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "sys"
    battery(root, 80, "Charging")

    async def on_change(paused: bool, lasted_s: float) -> None:
        raise AssertionError("nothing pauses here")

    policy = PausePolicy(battery_below=20, above_temp=80)
    pauser = Pauser(policy, root, 1.0, Runtime.on_loop(), on_change)
    with caplog.at_level("INFO", logger="node.daemon.pause"):
        await pauser.check()
        await pauser.check()
    said = [r.getMessage() for r in caplog.records]
    assert sum("battery 80%" in line for line in said) == 1  # once, at the first reading
    assert any("--pause-above-temp is set" in line and "never pauses" in line for line in said)
    assert not any("--pause-on-battery-below is set" in line for line in said)
