"""docker/stack.yml (the testbed in Docker Swarm mode) beside docker/compose.yml, and the entry
point's part of it, without Docker: the stage that runs it is ``make test-testbed``."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from node.settings import ENV_NOT_SETTINGS

ROOT = Path(__file__).resolve().parents[1]
STACK = ROOT / "docker" / "stack.yml"
COMPOSE = ROOT / "docker" / "compose.yml"


def load(path: Path) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text())
    assert isinstance(doc, dict)
    return doc


def test_the_stack_runs_the_compose_testbeds_nodes_with_a_volume_per_slot() -> None:
    stack, compose = load(STACK), load(COMPOSE)
    services = stack["services"]
    # The same node: the same flags as in the compose testbed, and the same services.
    assert stack["x-node"]["command"] == compose["x-node"]["command"]
    for name in ("broker", "certs", "seed", "node", "straggler"):
        assert name in services, name
        assert services[name]["deploy"]["endpoint_mode"] == "dnsrr", name
    # Each replica of `node` is named by its slot, on a volume of the slot's own.
    node = services["node"]
    assert node["environment"]["MURMUR_NAME"] == "node-{{.Task.Slot}}"
    mounts = dict(v.split(":", 1) for v in node["volumes"])
    assert mounts["node-state"] == "/state"
    assert mounts["certs"] == "/certs:ro"
    assert "{{.Task.Slot}}" in stack["volumes"]["node-state"]["name"]
    # The CA key stays in the certs service's volume: no node mounts it.
    assert "ca:/ca" in services["certs"]["volumes"]
    for name in ("seed", "node", "straggler"):
        assert not any(v.startswith("ca:") for v in services[name]["volumes"]), name
        assert services[name]["environment"]["MURMUR_CERTS"] == "/certs"
    # Both are the entry point's, not the node's settings, which refuse unknown MURMUR_*.
    assert {"MURMUR_NAME", "MURMUR_CERTS", "MURMUR_CERTS_TIMEOUT"} <= ENV_NOT_SETTINGS


def take_certs(source: Path, state: Path, timeout_s: int = 0) -> subprocess.CompletedProcess[str]:
    """docker/entrypoint's take_certs, run alone. As root it gives the files to the image's
    murmur user, whom this machine lacks: chown does nothing here."""
    text = (ROOT / "docker" / "entrypoint").read_text()
    function = re.search(r"^take_certs\(\) \{\n.*?^\}\n", text, re.DOTALL | re.MULTILINE)
    assert function is not None
    script = 'say() { echo "$*" >&2; }\nchown() { :; }\n' + function[0]
    script += 'take_certs "$1" "$2"\n'
    env = {**os.environ, "MURMUR_CERTS_TIMEOUT": str(timeout_s)}
    argv = ["bash", "-c", script, "take", str(source), str(state)]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)


def test_a_node_copies_its_files_once_and_keeps_its_own_key(tmp_path: Path) -> None:
    share, state = tmp_path / "certs" / "node-1", tmp_path / "state" / "node-1"
    share.mkdir(parents=True)
    for name, text in [("node_key.pem", "key 1"), ("node_cert.pem", "cert 1")]:
        (share / name).write_text(text)
    (share / "testbed.toml").write_text("shard_index = 2\n")
    done = take_certs(share, state)
    assert done.returncode == 0, done.stderr
    taken = sorted(p.name for p in state.iterdir())
    assert taken == ["node_cert.pem", "node_key.pem", "testbed.toml"]
    # Provisioned again: a new certificate is taken, but the node's key is its identity.
    (share / "node_key.pem").write_text("key 2")
    (share / "node_cert.pem").write_text("cert 2")
    done = take_certs(share, state)
    assert done.returncode == 0, done.stderr
    assert (state / "node_cert.pem").read_text() == "cert 2"
    assert (state / "node_key.pem").read_text() == "key 1"


def test_a_node_whose_files_never_come_says_so(tmp_path: Path) -> None:
    done = take_certs(tmp_path / "certs" / "node-9", tmp_path / "state" / "node-9", timeout_s=1)
    assert done.returncode == 1
    assert "waiting for" in done.stderr
    assert f"no {tmp_path}/certs/node-9/testbed.toml after 1 s" in done.stderr
