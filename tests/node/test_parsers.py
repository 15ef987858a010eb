"""Everything parsed from the network or a dropped-in file has size and depth limits and a
schema: whatever the input, a parser answers or refuses with its one kind of error, never
anything else (a RecursionError from a nested blob once killed nodes), and quickly."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gossip.swim import MemberRecord, Status
from node.security.pki import CertificateRefused, NodeCertificates, init_ca
from node.security.revocation import MAX_BLOB_BYTES, MAX_REVOKED, parse_revocations, revoke
from node.security.signing import MemberVerifier
from node.transport import wire
from node.transport.base import Reason, Rejected
from protos import murmur_pb2 as pb

FEW = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ca_dir = tmp_path_factory.mktemp("parsers") / "ca"
    init_ca(ca_dir)
    return ca_dir


def ca_pem(ca: Path) -> bytes:
    return (ca / "ca_cert.pem").read_bytes()


# -- revocation lists -----------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=30,
)


@FEW
@given(blob=st.binary(max_size=512) | json_values.map(lambda v: json.dumps(v).encode()))
def test_any_blob_is_a_list_or_a_value_error(ca: Path, blob: bytes) -> None:
    with pytest.raises(ValueError, match=r"revocation list|CA"):
        parse_revocations(blob, ca_pem(ca))


@FEW
@given(
    field=st.sampled_from(["version", "revoked", "signature", "extra"]),
    value=json_values,
)
def test_a_signed_list_with_any_field_changed_is_refused(
    ca: Path, field: str, value: object
) -> None:
    good = json.loads(revoke_once(ca))
    changed = {**good, field: value}
    if changed == good:
        return
    with pytest.raises(ValueError, match="revocation list"):
        parse_revocations(json.dumps(changed).encode(), ca_pem(ca))


def revoke_once(ca: Path) -> bytes:
    path = ca / "revoked.json"
    if not path.exists():
        revoke(ca, ["a" * 32, "b" * 32])
    return path.read_bytes()


@pytest.mark.parametrize("depth", [10, 1000, 200_000])
def test_nesting_of_any_depth_is_refused_before_the_json_parser(ca: Path, depth: int) -> None:
    for opening, closing in ("[]", "{}"):
        blob = (opening * depth + closing * depth).encode()
        nested = b'{"version": 2, "revoked": ' + blob + b', "signature": ""}'
        for candidate in (blob, nested):
            with pytest.raises(ValueError, match=r"too large|one object holding one list"):
                parse_revocations(candidate, ca_pem(ca))


def test_a_list_past_the_limits_is_refused_by_size_and_count(ca: Path) -> None:
    with pytest.raises(ValueError, match="too large"):
        parse_revocations(b" " * (MAX_BLOB_BYTES + 1), ca_pem(ca))
    many = {"version": 1, "revoked": [f"{i:032x}" for i in range(MAX_REVOKED + 1)], "signature": ""}
    with pytest.raises(ValueError, match=f"at most {MAX_REVOKED}"):
        parse_revocations(json.dumps(many).encode(), ca_pem(ca))
    with pytest.raises(ValueError, match="not a node id"):
        revoke(ca, ["not an id!"])


def test_a_good_list_parses(ca: Path) -> None:
    parsed = parse_revocations(revoke_once(ca), ca_pem(ca))
    assert {"a" * 32, "b" * 32} <= parsed.node_ids
    assert parsed.version >= 1
    raw = json.loads(revoke_once(ca))
    assert base64.b64decode(raw["signature"])


# -- hellos and membership messages ---------------------------------------------------------

ids = st.text(alphabet="0123456789abcdef", min_size=0, max_size=40) | st.text(max_size=10)
members = st.builds(
    pb.Member,
    node_id=ids,
    address=st.sampled_from(["127.0.0.1:7070", "host:1", "nope", "[::1]:80", "a:0"]),
    incarnation=st.integers(0, 2**64 - 1),
    status=st.integers(0, 5),
    public_key=st.binary(max_size=200),
    signature=st.binary(max_size=120),
    certificate=st.binary(max_size=3000),
)


def _decoded_or_refused(decode: object, raw: bytes, message: type) -> None:
    try:
        parsed = message.FromString(raw)  # type: ignore[attr-defined]
    except DecodeError:
        return  # the transport refuses these before any decoding of ours
    try:
        decode(parsed)  # type: ignore[operator]
    except Rejected as err:
        reason = err.reason
        assert reason is Reason.MALFORMED


@FEW
@given(raw=st.binary(max_size=2048))
def test_any_bytes_are_a_hello_or_refused_as_malformed(raw: bytes) -> None:
    _decoded_or_refused(wire.hello_from_pb, raw, pb.Hello)


@FEW
@given(
    me=members,
    others=st.lists(members, max_size=5),
    revocations=st.binary(max_size=64),
    version=st.integers(0, 5),
)
def test_any_hello_decodes_within_its_limits_or_is_refused(
    me: pb.Member, others: list[pb.Member], revocations: bytes, version: int
) -> None:
    hello = pb.Hello(protocol_version=version, self=me, members=others, revocations=revocations)
    hello.fingerprint.codec = "int8"
    try:
        decoded = wire.hello_from_pb(hello)
    except Rejected as err:
        reason = err.reason
        assert reason is Reason.MALFORMED
        return
    for record in (decoded.self_, *decoded.members):
        assert len(record.public_key) <= wire.MAX_PUBLIC_KEY_BYTES
        assert len(record.signature) <= wire.MAX_SIGNATURE_BYTES
        assert len(record.certificate) <= wire.MAX_CERTIFICATE_BYTES


@FEW
@given(raw=st.binary(max_size=2048))
def test_any_bytes_are_a_membership_message_or_refused_as_malformed(raw: bytes) -> None:
    _decoded_or_refused(wire.swim_from_pb, raw, pb.SwimMessage)


def test_records_per_message_are_counted_before_any_is_decoded() -> None:
    member = pb.Member(node_id="a" * 32, address="127.0.0.1:1")
    limit = wire.MAX_SWIM_UPDATES
    swim = pb.SwimMessage(sender="b" * 32, sender_address="127.0.0.1:2", updates=[member] * limit)
    assert len(wire.swim_from_pb(swim)[1].updates) == limit
    swim.updates.append(member)
    with pytest.raises(Rejected, match=f"more than {limit} members"):
        wire.swim_from_pb(swim)
    hello = pb.Hello(self=member, members=[member] * (wire.MAX_MEMBERS + 1))
    hello.fingerprint.codec = "int8"
    with pytest.raises(Rejected, match=f"more than {wire.MAX_MEMBERS} members"):
        wire.hello_from_pb(hello)


# -- member records and certificates --------------------------------------------------------


@FEW
@given(
    node_id=ids,
    public_key=st.binary(max_size=128),
    signature=st.binary(max_size=96),
    certificate=st.binary(max_size=2048),
    status=st.sampled_from(list(Status)),
)
def test_any_member_record_is_admitted_or_dropped_never_an_error(
    ca: Path, node_id: str, public_key: bytes, signature: bytes, certificate: bytes, status: Status
) -> None:
    record = MemberRecord(node_id, "127.0.0.1:7070", 1, status, public_key, signature, certificate)
    for verifier in (MemberVerifier(ca_pem(ca)), MemberVerifier(None)):
        assert verifier(record) is False


@FEW
@given(data=st.binary(max_size=2048))
def test_any_bytes_are_a_certificate_or_refused(ca: Path, data: bytes) -> None:
    with pytest.raises(CertificateRefused):
        NodeCertificates(ca_pem(ca)).node_id(data)
