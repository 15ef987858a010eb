"""A TLS handshake that fails on join is a refusal with its cause, at once: not a minute of
retries ending in "did not answer". Certificates are made by ``murmur ca``, as users make them."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from node.daemon.node import JoinError, Node
from node.security.identity import KEY_FILE
from node.security.pki import CA_CERT_FILE, CERT_FILE, TlsFiles, issue_node
from node.transport.grpc import GrpcTransport, GrpcTransportConfig
from tests.node.helpers import config

#: Far below the join's own deadline (an hour here): a refusal must come at once.
REFUSAL_S = 20.0


def murmur_ca(*args: str | Path) -> None:
    subprocess.run([sys.executable, "-m", "node", "ca", *map(str, args)], check=True, timeout=60)


def files(directory: Path, key_from: Path | None = None) -> TlsFiles:
    """A dir's TLS files as they are, unchecked (so an expired or misfit set can be presented)."""
    return TlsFiles(
        ((key_from or directory) / KEY_FILE).read_bytes(),
        (directory / CERT_FILE).read_bytes(),
        (directory / CA_CERT_FILE).read_bytes(),
    )


Start = Callable[..., Awaitable[Node]]


@pytest.fixture
async def start(tmp_path: Path) -> AsyncIterator[Start]:
    nodes: list[Node] = []

    async def make(name: str, tls: TlsFiles | None, **overrides: object) -> Node:
        """A node on real gRPC: mutual TLS with ``tls``, plain TCP without."""
        transport = GrpcTransport(GrpcTransportConfig(tls=tls))
        cfg = config(tmp_path / name, wait_timeout_s=None, **overrides)
        node = await Node.create(cfg, transport=transport)
        nodes.append(node)
        return node

    yield make
    for n in nodes:
        await n.stop(grace_s=0)


@pytest.fixture
def ca(tmp_path: Path) -> Path:
    murmur_ca("init", tmp_path / "ca")
    murmur_ca("issue", tmp_path / "ca", "seed", "--out", tmp_path / "seed")
    return tmp_path / "ca"


async def refusal(node: Node, address: str) -> str:
    async with asyncio.timeout(REFUSAL_S):
        with pytest.raises(JoinError) as info:
            await node.peers.introductions.join([address], None)
    return str(info.value)


async def test_a_node_from_another_ca_is_refused_at_once(
    start: Start, ca: Path, tmp_path: Path
) -> None:
    seed = await start("seed", files(tmp_path / "seed"))
    await seed.start()
    murmur_ca("init", tmp_path / "other-ca")
    murmur_ca("issue", tmp_path / "other-ca", "stranger", "--out", tmp_path / "stranger")
    stranger = await start("stranger", files(tmp_path / "stranger"))
    await stranger.transport.serve(stranger.service, "127.0.0.1:0")
    said = await refusal(stranger, seed.address)
    assert f"{seed.address} refused us" in said
    assert "its certificate is not from this swarm's CA" in said


async def test_an_expired_certificate_is_refused_at_once(
    start: Start, ca: Path, tmp_path: Path
) -> None:
    seed = await start("seed", files(tmp_path / "seed"))
    await seed.start()
    # The node itself refuses to start on an expired certificate; a peer whose clock runs
    # ahead sees one all the same.
    long_ago = datetime.now(UTC) - timedelta(days=30)
    issue_node(ca, tmp_path / "old", "old", days=1, not_before=long_ago)
    old = await start("old", files(tmp_path / "old"))
    said = await refusal(old, seed.address)
    assert "closed the connection in the handshake: it refused this node's certificate" in said


async def test_a_certificate_for_another_key_is_refused_at_once(
    start: Start, ca: Path, tmp_path: Path
) -> None:
    seed = await start("seed", files(tmp_path / "seed"))
    await seed.start()
    murmur_ca("issue", ca, "a", "--out", tmp_path / "a")
    murmur_ca("issue", ca, "b", "--out", tmp_path / "b")
    misfit = await start("misfit", files(tmp_path / "a", key_from=tmp_path / "b"))
    said = await refusal(misfit, seed.address)
    assert "does this node's key fit its certificate?" in said


async def test_plain_tcp_and_tls_say_so_both_ways(start: Start, ca: Path, tmp_path: Path) -> None:
    tls_node = await start("seed", files(tmp_path / "seed"))
    await tls_node.start()
    plain_node = await start("plain", None)
    await plain_node.start()
    said = await refusal(plain_node, tls_node.address)
    assert "or it runs mutual TLS and this node plain TCP (--insecure)" in said
    murmur_ca("issue", ca, "c", "--out", tmp_path / "c")
    tls_joiner = await start("c", files(tmp_path / "c"))
    said = await refusal(tls_joiner, plain_node.address)
    assert f"{plain_node.address} speaks plain TCP (it runs --insecure)" in said


async def test_murmur_run_against_a_tls_node_over_plain_tcp_exits_at_once(
    start: Start, ca: Path, tmp_path: Path
) -> None:
    seed = await start("seed", files(tmp_path / "seed"))
    await seed.start()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "node",
        "run",
        "--insecure",
        "--listen",
        "127.0.0.1:0",
        "--state-dir",
        str(tmp_path / "joiner"),
        "--device",
        "cpu",
        "--join",
        seed.address,
        "--wait-timeout",
        "none",  # it must be refused, not time out
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 60.0)
    assert proc.returncode == 2
    text = err.decode()
    assert f"{seed.address} refused us" in text
    assert "it runs mutual TLS and this node plain TCP (--insecure)" in text
    assert "ssl_transport_security" not in text  # gRPC's own log lines stay quiet
    assert "did not answer" not in text
