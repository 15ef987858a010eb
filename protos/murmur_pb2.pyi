from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MemberStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ALIVE: _ClassVar[MemberStatus]
    SUSPECT: _ClassVar[MemberStatus]
    DEAD: _ClassVar[MemberStatus]
    LEFT: _ClassVar[MemberStatus]

class SwimKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PING: _ClassVar[SwimKind]
    ACK: _ClassVar[SwimKind]
    PING_REQ: _ClassVar[SwimKind]
    NACK: _ClassVar[SwimKind]
    PUSH_PULL: _ClassVar[SwimKind]
    PUSH_PULL_REPLY: _ClassVar[SwimKind]
ALIVE: MemberStatus
SUSPECT: MemberStatus
DEAD: MemberStatus
LEFT: MemberStatus
PING: SwimKind
ACK: SwimKind
PING_REQ: SwimKind
NACK: SwimKind
PUSH_PULL: SwimKind
PUSH_PULL_REPLY: SwimKind

class ParamSpec(_message.Message):
    __slots__ = ("name", "shape", "dtype")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    def __init__(self, name: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ...) -> None: ...

class TaskFingerprint(_message.Message):
    __slots__ = ("params", "codec", "block_size", "fraction")
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    FRACTION_FIELD_NUMBER: _ClassVar[int]
    params: _containers.RepeatedCompositeFieldContainer[ParamSpec]
    codec: str
    block_size: int
    fraction: float
    def __init__(self, params: _Optional[_Iterable[_Union[ParamSpec, _Mapping]]] = ..., codec: _Optional[str] = ..., block_size: _Optional[int] = ..., fraction: _Optional[float] = ...) -> None: ...

class Member(_message.Message):
    __slots__ = ("node_id", "address", "incarnation", "status", "public_key", "signature", "certificate", "accuser", "accuser_signature", "relays", "paused", "region")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    ACCUSER_FIELD_NUMBER: _ClassVar[int]
    ACCUSER_SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    RELAYS_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    incarnation: int
    status: MemberStatus
    public_key: bytes
    signature: bytes
    certificate: bytes
    accuser: str
    accuser_signature: bytes
    relays: _containers.RepeatedScalarFieldContainer[str]
    paused: bool
    region: str
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., incarnation: _Optional[int] = ..., status: _Optional[_Union[MemberStatus, str]] = ..., public_key: _Optional[bytes] = ..., signature: _Optional[bytes] = ..., certificate: _Optional[bytes] = ..., accuser: _Optional[str] = ..., accuser_signature: _Optional[bytes] = ..., relays: _Optional[_Iterable[str]] = ..., paused: _Optional[bool] = ..., region: _Optional[str] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("protocol_version", "self", "fingerprint", "members", "revocations", "unreachable")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SELF_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    REVOCATIONS_FIELD_NUMBER: _ClassVar[int]
    UNREACHABLE_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    self: Member
    fingerprint: TaskFingerprint
    members: _containers.RepeatedCompositeFieldContainer[Member]
    revocations: bytes
    unreachable: bool
    def __init__(self_, protocol_version: _Optional[int] = ..., self: _Optional[_Union[Member, _Mapping]] = ..., fingerprint: _Optional[_Union[TaskFingerprint, _Mapping]] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., revocations: _Optional[bytes] = ..., unreachable: _Optional[bool] = ...) -> None: ...

class SwimMessage(_message.Message):
    __slots__ = ("protocol_version", "kind", "sender", "sender_address", "seq", "target", "updates", "revocations")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    SENDER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    REVOCATIONS_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    kind: SwimKind
    sender: str
    sender_address: str
    seq: int
    target: str
    updates: _containers.RepeatedCompositeFieldContainer[Member]
    revocations: bytes
    def __init__(self, protocol_version: _Optional[int] = ..., kind: _Optional[_Union[SwimKind, str]] = ..., sender: _Optional[str] = ..., sender_address: _Optional[str] = ..., seq: _Optional[int] = ..., target: _Optional[str] = ..., updates: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., revocations: _Optional[bytes] = ...) -> None: ...

class SwimReply(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class PullModelRequest(_message.Message):
    __slots__ = ("protocol_version", "requester", "have")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUESTER_FIELD_NUMBER: _ClassVar[int]
    HAVE_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    requester: str
    have: bytes
    def __init__(self, protocol_version: _Optional[int] = ..., requester: _Optional[str] = ..., have: _Optional[bytes] = ...) -> None: ...

class ModelChunk(_message.Message):
    __slots__ = ("numel", "offset", "data", "step", "same")
    NUMEL_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    SAME_FIELD_NUMBER: _ClassVar[int]
    numel: int
    offset: int
    data: bytes
    step: int
    same: bool
    def __init__(self, numel: _Optional[int] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., step: _Optional[int] = ..., same: _Optional[bool] = ...) -> None: ...

class EncodedTensor(_message.Message):
    __slots__ = ("codec", "numel", "block_size", "scales", "data")
    CODEC_FIELD_NUMBER: _ClassVar[int]
    NUMEL_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    SCALES_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    codec: str
    numel: int
    block_size: int
    scales: bytes
    data: bytes
    def __init__(self, codec: _Optional[str] = ..., numel: _Optional[int] = ..., block_size: _Optional[int] = ..., scales: _Optional[bytes] = ..., data: _Optional[bytes] = ...) -> None: ...

class Delta(_message.Message):
    __slots__ = ("protocol_version", "sender", "seq", "step", "payload", "session", "degree")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    DEGREE_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    sender: str
    seq: int
    step: int
    payload: EncodedTensor
    session: int
    degree: int
    def __init__(self, protocol_version: _Optional[int] = ..., sender: _Optional[str] = ..., seq: _Optional[int] = ..., step: _Optional[int] = ..., payload: _Optional[_Union[EncodedTensor, _Mapping]] = ..., session: _Optional[int] = ..., degree: _Optional[int] = ...) -> None: ...

class DeltaAck(_message.Message):
    __slots__ = ("replica_seq",)
    REPLICA_SEQ_FIELD_NUMBER: _ClassVar[int]
    replica_seq: int
    def __init__(self, replica_seq: _Optional[int] = ...) -> None: ...

class SnapshotChunk(_message.Message):
    __slots__ = ("protocol_version", "sender", "seq", "numel", "offset", "data", "session", "degree", "digest")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    NUMEL_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    DEGREE_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    sender: str
    seq: int
    numel: int
    offset: int
    data: bytes
    session: int
    degree: int
    digest: bytes
    def __init__(self, protocol_version: _Optional[int] = ..., sender: _Optional[str] = ..., seq: _Optional[int] = ..., numel: _Optional[int] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., session: _Optional[int] = ..., degree: _Optional[int] = ..., digest: _Optional[bytes] = ...) -> None: ...

class SnapshotAck(_message.Message):
    __slots__ = ("replica_seq",)
    REPLICA_SEQ_FIELD_NUMBER: _ClassVar[int]
    replica_seq: int
    def __init__(self, replica_seq: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NeighbourStatus(_message.Message):
    __slots__ = ("node_id", "address", "replica_seq", "silent_s", "in_mix", "bytes_sent", "deltas_sent", "snapshots_sent", "distance_rms", "weight", "bytes_received", "region", "codec")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    REPLICA_SEQ_FIELD_NUMBER: _ClassVar[int]
    SILENT_S_FIELD_NUMBER: _ClassVar[int]
    IN_MIX_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    DELTAS_SENT_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_SENT_FIELD_NUMBER: _ClassVar[int]
    DISTANCE_RMS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    replica_seq: int
    silent_s: float
    in_mix: bool
    bytes_sent: int
    deltas_sent: int
    snapshots_sent: int
    distance_rms: float
    weight: float
    bytes_received: int
    region: str
    codec: str
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., replica_seq: _Optional[int] = ..., silent_s: _Optional[float] = ..., in_mix: _Optional[bool] = ..., bytes_sent: _Optional[int] = ..., deltas_sent: _Optional[int] = ..., snapshots_sent: _Optional[int] = ..., distance_rms: _Optional[float] = ..., weight: _Optional[float] = ..., bytes_received: _Optional[int] = ..., region: _Optional[str] = ..., codec: _Optional[str] = ...) -> None: ...

class NodeStatus(_message.Message):
    __slots__ = ("node_id", "address", "device", "codec", "step", "step_budget", "training_done", "train_loss", "eval_accuracy", "rounds", "bytes_sent", "bytes_sent_fp32", "bytes_received", "samples_per_s", "neighbours", "members", "rejected", "samples", "eval_loss", "eval_step", "eval_age_s", "member_counts", "sessions", "relayed_bytes", "rounds_skipped", "relay_faults", "budget_bytes", "budget_period_s", "budget_left_bytes", "budget_resets_in_s", "paused", "pause_reason", "held_s", "region")
    class RejectedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class MemberCountsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    STEP_BUDGET_FIELD_NUMBER: _ClassVar[int]
    TRAINING_DONE_FIELD_NUMBER: _ClassVar[int]
    TRAIN_LOSS_FIELD_NUMBER: _ClassVar[int]
    EVAL_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FP32_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_S_FIELD_NUMBER: _ClassVar[int]
    NEIGHBOURS_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    EVAL_LOSS_FIELD_NUMBER: _ClassVar[int]
    EVAL_STEP_FIELD_NUMBER: _ClassVar[int]
    EVAL_AGE_S_FIELD_NUMBER: _ClassVar[int]
    MEMBER_COUNTS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    RELAYED_BYTES_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    RELAY_FAULTS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    BUDGET_PERIOD_S_FIELD_NUMBER: _ClassVar[int]
    BUDGET_LEFT_BYTES_FIELD_NUMBER: _ClassVar[int]
    BUDGET_RESETS_IN_S_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    PAUSE_REASON_FIELD_NUMBER: _ClassVar[int]
    HELD_S_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    device: str
    codec: str
    step: int
    step_budget: int
    training_done: bool
    train_loss: float
    eval_accuracy: float
    rounds: int
    bytes_sent: int
    bytes_sent_fp32: int
    bytes_received: int
    samples_per_s: float
    neighbours: _containers.RepeatedCompositeFieldContainer[NeighbourStatus]
    members: _containers.RepeatedCompositeFieldContainer[Member]
    rejected: _containers.ScalarMap[str, int]
    samples: int
    eval_loss: float
    eval_step: int
    eval_age_s: float
    member_counts: _containers.ScalarMap[str, int]
    sessions: int
    relayed_bytes: int
    rounds_skipped: int
    relay_faults: int
    budget_bytes: int
    budget_period_s: float
    budget_left_bytes: int
    budget_resets_in_s: float
    paused: bool
    pause_reason: str
    held_s: float
    region: str
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., device: _Optional[str] = ..., codec: _Optional[str] = ..., step: _Optional[int] = ..., step_budget: _Optional[int] = ..., training_done: _Optional[bool] = ..., train_loss: _Optional[float] = ..., eval_accuracy: _Optional[float] = ..., rounds: _Optional[int] = ..., bytes_sent: _Optional[int] = ..., bytes_sent_fp32: _Optional[int] = ..., bytes_received: _Optional[int] = ..., samples_per_s: _Optional[float] = ..., neighbours: _Optional[_Iterable[_Union[NeighbourStatus, _Mapping]]] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., rejected: _Optional[_Mapping[str, int]] = ..., samples: _Optional[int] = ..., eval_loss: _Optional[float] = ..., eval_step: _Optional[int] = ..., eval_age_s: _Optional[float] = ..., member_counts: _Optional[_Mapping[str, int]] = ..., sessions: _Optional[int] = ..., relayed_bytes: _Optional[int] = ..., rounds_skipped: _Optional[int] = ..., relay_faults: _Optional[int] = ..., budget_bytes: _Optional[int] = ..., budget_period_s: _Optional[float] = ..., budget_left_bytes: _Optional[int] = ..., budget_resets_in_s: _Optional[float] = ..., paused: _Optional[bool] = ..., pause_reason: _Optional[str] = ..., held_s: _Optional[float] = ..., region: _Optional[str] = ...) -> None: ...

class ControlRequest(_message.Message):
    __slots__ = ("action",)
    class Action(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        QUERY: _ClassVar[ControlRequest.Action]
        PAUSE: _ClassVar[ControlRequest.Action]
        RESUME: _ClassVar[ControlRequest.Action]
    QUERY: ControlRequest.Action
    PAUSE: ControlRequest.Action
    RESUME: ControlRequest.Action
    ACTION_FIELD_NUMBER: _ClassVar[int]
    action: ControlRequest.Action
    def __init__(self, action: _Optional[_Union[ControlRequest.Action, str]] = ...) -> None: ...

class ControlReply(_message.Message):
    __slots__ = ("paused", "reason")
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    paused: bool
    reason: str
    def __init__(self, paused: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class SessionFrame(_message.Message):
    __slots__ = ("call", "method", "message", "has_message", "end", "code", "details", "reason", "address", "nonce", "certificate", "signature", "origin_certificate", "origin_signature", "origin_seq", "via")
    CALL_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    HAS_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_SEQ_FIELD_NUMBER: _ClassVar[int]
    VIA_FIELD_NUMBER: _ClassVar[int]
    call: int
    method: str
    message: bytes
    has_message: bool
    end: bool
    code: int
    details: str
    reason: str
    address: str
    nonce: bytes
    certificate: bytes
    signature: bytes
    origin_certificate: bytes
    origin_signature: bytes
    origin_seq: int
    via: str
    def __init__(self, call: _Optional[int] = ..., method: _Optional[str] = ..., message: _Optional[bytes] = ..., has_message: _Optional[bool] = ..., end: _Optional[bool] = ..., code: _Optional[int] = ..., details: _Optional[str] = ..., reason: _Optional[str] = ..., address: _Optional[str] = ..., nonce: _Optional[bytes] = ..., certificate: _Optional[bytes] = ..., signature: _Optional[bytes] = ..., origin_certificate: _Optional[bytes] = ..., origin_signature: _Optional[bytes] = ..., origin_seq: _Optional[int] = ..., via: _Optional[str] = ...) -> None: ...

class ForwardRequest(_message.Message):
    __slots__ = ("to", "call")
    TO_FIELD_NUMBER: _ClassVar[int]
    CALL_FIELD_NUMBER: _ClassVar[int]
    to: str
    call: SessionFrame
    def __init__(self, to: _Optional[str] = ..., call: _Optional[_Union[SessionFrame, _Mapping]] = ...) -> None: ...
