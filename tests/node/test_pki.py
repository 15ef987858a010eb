"""The swarm CA and node certificates: what is written, what load_tls refuses, a real mTLS call."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import grpc.aio
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from node.security.identity import load_key, load_or_create_identity, node_id_of
from node.security.pki import (
    CA_CERT_FILE,
    CA_KEY_FILE,
    CERT_FILE,
    KEY_FILE,
    TLS_NAME,
    TlsFiles,
    init_ca,
    issue_node,
    load_tls,
    node_id_of_cert,
)
from protos import murmur_pb2 as pb
from protos import murmur_pb2_grpc as pb_grpc

CALL_TIMEOUT_S = 10.0
CLI_TIMEOUT_S = 120.0


@pytest.fixture
def ca_dir(tmp_path: Path) -> Path:
    init_ca(tmp_path / "ca")
    return tmp_path / "ca"


def cert_of(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_keys_are_private_even_over_a_stale_temp_file(ca_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "n"
    out.mkdir()
    # A crash may leave a world-readable temp file behind; the key written through it is 0600.
    stale = out / (KEY_FILE + ".tmp")
    stale.write_bytes(b"junk")
    stale.chmod(0o666)
    issue_node(ca_dir, out, "n")
    assert mode(ca_dir / CA_KEY_FILE) == 0o600
    assert mode(out / KEY_FILE) == 0o600
    assert not stale.exists()


def test_the_issued_certificate_is_bound_to_the_node_id(ca_dir: Path, tmp_path: Path) -> None:
    node_id = issue_node(ca_dir, tmp_path / "n", "worker-3")
    cert = cert_of(tmp_path / "n" / CERT_FILE)
    ca = cert_of(ca_dir / CA_CERT_FILE)
    cert.verify_directly_issued_by(ca)  # raises if the CA did not sign it
    assert (tmp_path / "n" / CA_CERT_FILE).read_bytes() == (ca_dir / CA_CERT_FILE).read_bytes()
    key = load_key(tmp_path / "n" / KEY_FILE)
    assert node_id == node_id_of(key.public_key())
    assert len(node_id) == 32
    assert node_id_of_cert((tmp_path / "n" / CERT_FILE).read_bytes()) == node_id
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == node_id
    assert cert.subject.get_attributes_for_oid(NameOID.PSEUDONYM)[0].value == "worker-3"
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [TLS_NAME]
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_reissuing_keeps_the_node_id(ca_dir: Path, tmp_path: Path) -> None:
    first = issue_node(ca_dir, tmp_path / "n", "n")
    first_cert = (tmp_path / "n" / CERT_FILE).read_bytes()
    again = issue_node(ca_dir, tmp_path / "n", "n", days=30)
    assert again == first
    assert (tmp_path / "n" / CERT_FILE).read_bytes() != first_cert


def test_issuing_into_a_state_dir_keeps_the_key_already_there(ca_dir: Path, tmp_path: Path) -> None:
    identity = load_or_create_identity(tmp_path / "state")
    assert issue_node(ca_dir, tmp_path / "state", "n") == identity.node_id


def test_a_ca_is_never_overwritten(ca_dir: Path) -> None:
    key = (ca_dir / CA_KEY_FILE).read_bytes()
    with pytest.raises(FileExistsError, match="already holds a CA"):
        init_ca(ca_dir)
    assert (ca_dir / CA_KEY_FILE).read_bytes() == key


def test_issuing_without_a_ca_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="murmur ca init"):
        issue_node(tmp_path / "nothing", tmp_path / "n", "n")


def test_a_key_of_another_kind_is_refused_with_what_to_do(tmp_path: Path) -> None:
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (tmp_path / KEY_FILE).write_bytes(pem)
    (tmp_path / KEY_FILE).chmod(0o600)
    with pytest.raises(ValueError, match=r"Ed25519.*remove the file.*another state dir"):
        load_or_create_identity(tmp_path)


def test_load_tls_returns_the_files(ca_dir: Path, tmp_path: Path) -> None:
    issue_node(ca_dir, tmp_path / "n", "n")
    files = load_tls(tmp_path / "n")
    assert files == TlsFiles(
        key_pem=(tmp_path / "n" / KEY_FILE).read_bytes(),
        cert_pem=(tmp_path / "n" / CERT_FILE).read_bytes(),
        ca_pem=(ca_dir / CA_CERT_FILE).read_bytes(),
    )


@pytest.mark.parametrize("missing", [KEY_FILE, CERT_FILE, CA_CERT_FILE])
def test_load_tls_names_a_missing_file(ca_dir: Path, tmp_path: Path, missing: str) -> None:
    issue_node(ca_dir, tmp_path / "n", "n")
    (tmp_path / "n" / missing).unlink()
    with pytest.raises(FileNotFoundError, match=rf"missing {missing}.*murmur ca issue.*--insecure"):
        load_tls(tmp_path / "n")


# The same name gives the same issuer name, so only the signature tells the CAs apart.
@pytest.mark.parametrize("other_name", ["murmur swarm", "another swarm"])
def test_load_tls_refuses_a_certificate_from_another_ca(
    ca_dir: Path, tmp_path: Path, other_name: str
) -> None:
    issue_node(ca_dir, tmp_path / "n", "n")
    init_ca(tmp_path / "other", name=other_name)
    shutil.copy(tmp_path / "other" / CA_CERT_FILE, tmp_path / "n" / CA_CERT_FILE)
    with pytest.raises(ValueError, match="was not issued by the CA in"):
        load_tls(tmp_path / "n")


def test_load_tls_refuses_a_certificate_for_another_key(ca_dir: Path, tmp_path: Path) -> None:
    issue_node(ca_dir, tmp_path / "n", "n")
    other = load_or_create_identity(tmp_path / "other")
    shutil.copy(tmp_path / "other" / KEY_FILE, tmp_path / "n" / KEY_FILE)
    with pytest.raises(
        ValueError, match=rf"is for node \w+, but {KEY_FILE} is node {other.node_id}"
    ):
        load_tls(tmp_path / "n")


@pytest.mark.parametrize(
    ("starts_in", "message"),
    [(timedelta(days=-10), "expired at"), (timedelta(days=2), "not valid yet")],
)
def test_load_tls_refuses_a_certificate_out_of_its_time(
    ca_dir: Path, tmp_path: Path, starts_in: timedelta, message: str
) -> None:
    issue_node(ca_dir, tmp_path / "n", "n", days=1, not_before=datetime.now(UTC) + starts_in)
    with pytest.raises(ValueError, match=message):
        load_tls(tmp_path / "n")


def test_load_tls_judges_validity_at_the_time_it_is_given(ca_dir: Path, tmp_path: Path) -> None:
    issue_node(ca_dir, tmp_path / "n", "n", days=1)
    load_tls(tmp_path / "n")
    with pytest.raises(ValueError, match="expired at"):
        load_tls(tmp_path / "n", now=datetime.now(UTC) + timedelta(days=2))


def murmur(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "node", *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


def test_the_ca_commands(tmp_path: Path) -> None:
    ca = tmp_path / "ca"
    done = murmur("ca", "init", str(ca), "--name", "test swarm")
    assert done.returncode == 0, done.stderr
    assert str(ca / CA_KEY_FILE) in done.stdout
    assert cert_of(ca / CA_CERT_FILE).subject.rfc4514_string() == "CN=test swarm"

    again = murmur("ca", "init", str(ca))
    assert again.returncode == 2
    assert "already holds a CA" in again.stderr

    issued = murmur("ca", "issue", str(ca), "node-a", "--days", "7")
    assert issued.returncode == 0, issued.stderr
    node_id = node_id_of_cert((ca / "node-a" / CERT_FILE).read_bytes())
    assert f"node id {node_id}" in issued.stdout
    cert = cert_of(ca / "node-a" / CERT_FILE)
    assert cert.not_valid_after_utc - cert.not_valid_before_utc == timedelta(days=7)
    load_tls(ca / "node-a")


@dataclass
class Peer:
    node_id: str
    tls: TlsFiles


def make_peer(ca_dir: Path, out: Path) -> Peer:
    node_id = issue_node(ca_dir, out, out.name)
    return Peer(node_id, load_tls(out))


class StatusServicer(pb_grpc.MurmurServicer):
    """Answers Status with its own id, and keeps the node ids of the clients it saw."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.client_ids: list[str] = []

    async def Status(  # noqa: N802 (the generated servicer's method name)
        self, request: pb.StatusRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.NodeStatus:
        (pem,) = context.auth_context()["x509_pem_cert"]
        self.client_ids.append(node_id_of_cert(pem))
        return pb.NodeStatus(node_id=self.node_id)


@dataclass
class TlsServer:
    address: str
    peer: Peer
    servicer: StatusServicer


@pytest.fixture
async def server(ca_dir: Path, tmp_path: Path) -> AsyncIterator[TlsServer]:
    peer = make_peer(ca_dir, tmp_path / "server")
    servicer = StatusServicer(peer.node_id)
    srv = grpc.aio.server()
    pb_grpc.add_MurmurServicer_to_server(servicer, srv)  # type: ignore[no-untyped-call]
    creds = grpc.ssl_server_credentials(
        [(peer.tls.key_pem, peer.tls.cert_pem)],
        root_certificates=peer.tls.ca_pem,
        require_client_auth=True,
    )
    port = srv.add_secure_port("127.0.0.1:0", creds)
    await srv.start()
    yield TlsServer(f"127.0.0.1:{port}", peer, servicer)
    await srv.stop(None)


async def call_status(address: str, creds: grpc.ChannelCredentials) -> pb.NodeStatus:
    options = [("grpc.ssl_target_name_override", TLS_NAME)]
    async with grpc.aio.secure_channel(address, creds, options=options) as channel:
        stub = pb_grpc.MurmurStub(channel)  # type: ignore[no-untyped-call]
        reply: pb.NodeStatus = await stub.Status(pb.StatusRequest(), timeout=CALL_TIMEOUT_S)
        return reply


async def test_mutual_tls_binds_both_ends_to_their_node_ids(
    server: TlsServer, ca_dir: Path, tmp_path: Path
) -> None:
    client = make_peer(ca_dir, tmp_path / "client")
    creds = grpc.ssl_channel_credentials(client.tls.ca_pem, client.tls.key_pem, client.tls.cert_pem)
    reply = await call_status(server.address, creds)
    assert reply.node_id == server.peer.node_id
    assert server.servicer.client_ids == [client.node_id]
    assert client.node_id != server.peer.node_id


async def test_mutual_tls_refuses_a_client_of_another_ca(server: TlsServer, tmp_path: Path) -> None:
    init_ca(tmp_path / "other-ca")
    stranger = make_peer(tmp_path / "other-ca", tmp_path / "stranger")
    # It trusts the server's CA, so only the server's check of the client can refuse it.
    creds = grpc.ssl_channel_credentials(
        server.peer.tls.ca_pem, stranger.tls.key_pem, stranger.tls.cert_pem
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call_status(server.address, creds)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert server.servicer.client_ids == []


async def test_mutual_tls_refuses_a_client_without_a_certificate(server: TlsServer) -> None:
    creds = grpc.ssl_channel_credentials(server.peer.tls.ca_pem)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call_status(server.address, creds)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert server.servicer.client_ids == []


def test_a_key_every_user_may_read_is_refused_and_one_its_group_may_is_warned_about(
    ca_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    issue_node(ca_dir, tmp_path / "n", "n")
    key = tmp_path / "n" / KEY_FILE
    key.chmod(0o644)
    with pytest.raises(ValueError, match=r"accessible to every user.*chmod 600"):
        load_tls(tmp_path / "n")
    with pytest.raises(ValueError, match="accessible to every user"):
        load_or_create_identity(tmp_path / "n")
    key.chmod(0o640)
    with caplog.at_level("WARNING"):
        load_tls(tmp_path / "n")
    assert "UNPROTECTED PRIVATE KEY" in caplog.text
    key.chmod(0o600)
    caplog.clear()
    load_tls(tmp_path / "n")
    assert "UNPROTECTED" not in caplog.text
    (ca_dir / CA_KEY_FILE).chmod(0o604)  # the CA's key too
    with pytest.raises(ValueError, match="accessible to every user"):
        issue_node(ca_dir, tmp_path / "m", "m")
