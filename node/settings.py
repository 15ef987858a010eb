"""The settings of ``murmur run`` as one typed schema (pydantic, strict types): the TOML file,
the ``MURMUR_*`` environment variables and the flags all go through it
(:mod:`node.settings_sources` reads and checks them), so that a wrong type, a value out of range
or an unknown key is refused before anything starts.

This module imports neither torch nor the node, so ``murmur --help`` stays fast and can show
every default from here; :func:`node.config.node_config` turns validated settings into the
frozen per-component configs the rest of the code uses.

Keys: in a file, a field's name (``wait_members``), the same with dashes (``wait-members``), or
its flag's name (``compress`` for ``gossip.codec``, ``steps`` for ``trainer.steps``,
``shard = "1/4"``), at the top level or in the field's table. In the environment, the field's
path (``MURMUR_WAIT_MEMBERS``, ``MURMUR_GOSSIP__CODEC``) or a flag's name (``MURMUR_STEPS``).
"""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ByteSize,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_settings import NoDecode

from gossip.swim_messages import check_region
from node.daemon.pacing import MIN_UPLOAD_RATE

__all__ = [
    "ATTACKS",
    "BRIDGE_CODEC_NAMES",
    "CODEC_NAMES",
    "ENV_NOT_SETTINGS",
    "ENV_PREFIX",
    "FLAG_KEYS",
    "SCHEDULE_NAMES",
    "SECTIONS",
    "TOPOLOGY_NAMES",
    "GossipSettings",
    "MembershipSettings",
    "RunSettings",
    "TrainerSettings",
    "default_of",
    "description_of",
    "keys",
]

#: The codecs of ``gossip/codecs.py`` (``none`` is fp32; ``auto`` one per link), named here so
#: that the CLI need not import torch to list them; a test checks that they agree.
CODEC_NAMES = (
    "none", "fp32", "fp16", "int8", "int4", "sign", "topk", "randk", "dct-topk", "auto"
)  # fmt: skip
#: The graphs of ``gossip/topology.py`` (likewise checked by a test).
TOPOLOGY_NAMES = (
    "ring", "exponential", "random-regular", "regional", "one-peer-exponential", "epidemic"
)  # fmt: skip
#: Of those, the time-varying schedules over a copy per link (``gossip/schedules.py``).
SCHEDULE_NAMES = ("one-peer-exponential", "epidemic")
#: The codecs a delta may name (``gossip/codecs.py`` ``AUTO_CODECS``): a bridge's, and then
#: the others' too.
BRIDGE_CODEC_NAMES = ("fp16", "int8", "int4", "sign")
#: Test-only attacks a node can mount on its neighbours (``GossipConfig.attack``).
ATTACKS = ("scale", "flip", "random", "huge", "spike")
ENV_PREFIX = "MURMUR_"
#: Variables with the prefix that are not settings: the testbed's (its entry point reads
#: MURMUR_NAME, and in Swarm mode MURMUR_CERTS and MURMUR_CERTS_TIMEOUT; docker/compose.yml
#: and docker/stack.yml MURMUR_IMAGE).
ENV_NOT_SETTINGS = frozenset(
    {"MURMUR_NAME", "MURMUR_IMAGE", "MURMUR_CERTS", "MURMUR_CERTS_TIMEOUT"}
)

_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


def _check_address(address: str) -> str:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{address!r} is not host:port (e.g. 0.0.0.0:7070)")
    return address


def _check_device(device: str) -> str:
    if not _DEVICE.fullmatch(device):
        raise ValueError(f"unknown device {device!r}: use auto, cpu, cuda, cuda:N or mps")
    return device


def _addresses(value: object) -> object:
    """A list of addresses; a string is one address (or several, comma-separated, as an
    environment variable holds them)."""
    if isinstance(value, str):
        return tuple(a.strip() for a in value.split(",") if a.strip())
    if isinstance(value, list):
        return tuple(value)
    return value


Address = Annotated[str, AfterValidator(_check_address)]
Addresses = Annotated[tuple[Address, ...], NoDecode, BeforeValidator(_addresses)]
# Paths come as strings from every source; a strict Path would refuse them all.
PathSetting = Annotated[Path, Field(strict=False)]
Positive = Annotated[float, Field(gt=0)]
AtLeastOne = Annotated[int, Field(ge=1)]
Fraction = Annotated[float, Field(ge=0, lt=1)]


#: The words that turn an optional setting off (its value None), in a file, the environment or a
#: flag alike: TOML has no null, and ``--wait-timeout none`` reads better than a huge number.
OFF_WORDS = ("none", "off")


def _allows_none(annotation: Any) -> bool:
    return annotation is type(None) or any(_allows_none(a) for a in typing.get_args(annotation))


class _Schema(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _off(cls, value: Any, info: ValidationInfo) -> Any:
        """``none`` or ``off`` for a setting that may be None (a literal such as the codec
        ``none`` is a value of its own, and stays one)."""
        field = cls.model_fields.get(info.field_name or "")
        if (
            isinstance(value, str)
            and value.strip().lower() in OFF_WORDS
            and field is not None
            and _allows_none(field.annotation)
        ):
            return None
        return value


class TrainerSettings(_Schema):
    """``[trainer]``: :class:`node.daemon.trainer.TrainerConfig` (its ``seed`` is the node's)."""

    steps: AtLeastOne | None = Field(None, description="local step budget")  # none: until stopped
    eval_every: AtLeastOne = Field(100, description="evaluate every this many steps")  # ~1 s
    step_time: Annotated[float, Field(ge=0)] = Field(  # 0: as fast as the device computes
        0.0, description="emulate a device whose step takes at least this many seconds"
    )
    slowdown: Annotated[float, Field(ge=1)] = Field(  # 1: the device's own pace
        1.0, description="make every step this many times as long (a straggler)"
    )
    rollback_every: AtLeastOne = Field(  # a rollback loses at most this many steps
        50, description="keep a finite copy of model and optimizer every this many steps"
    )
    max_rollbacks: Annotated[int, Field(ge=0)] = Field(  # diverging again at once: no healing
        3, description="rollbacks in a row before the trainer gives up"
    )
    idle_eval_interval_s: Positive | None = Field(  # a fresh figure every few status messages
        5.0, description="after the step budget, evaluate at most this often (none: stop)"
    )


def _per_second(value: object) -> object:
    """A rate as users write it: ``2MB/s`` is ``2MB`` a second."""
    if isinstance(value, str) and value.strip().lower().endswith("/s"):
        return value.strip()[:-2]
    return value


#: Bytes per second, with units (200KB, 2MiB, 2MB/s): pydantic's ByteSize.
UploadRate = Annotated[ByteSize, BeforeValidator(_per_second), Field(ge=MIN_UPLOAD_RATE)]

#: Seconds in a budget's period, by the unit users write (``500MB/day``, ``2GB/30d``).
PERIOD_UNITS = {
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "min": 60.0,
    "minute": 60.0,
    "h": 3600.0,
    "hour": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
    "w": 604800.0,
    "week": 604800.0,
}
_BYTES = TypeAdapter(ByteSize)
_PERIOD = re.compile(r"^\s*(\d+(?:\.\d+)?)?\s*([a-z]+?)s?\s*$")


def parse_budget(value: object) -> object:
    """``BYTES/PERIOD`` (``500MB/day``, ``2GiB/week``, ``50MB/6h``) as (bytes, seconds)."""
    if not isinstance(value, str):
        return value
    amount, slash, period = value.partition("/")
    if not slash:
        raise ValueError(f"a byte budget is BYTES/PERIOD, such as 500MB/day; got {value!r}")
    try:
        nbytes = int(_BYTES.validate_python(amount.strip()))
    except ValidationError:
        raise ValueError(
            f"{amount.strip()!r} in the byte budget {value!r} is not a size (500MB, 2GiB)"
        ) from None
    found = _PERIOD.match(period.lower())
    if found is None or found.group(2) not in PERIOD_UNITS:
        raise ValueError(
            f"unknown period {period!r} in the byte budget {value!r}: a number (optional) and "
            f"one of {', '.join(sorted(PERIOD_UNITS))}"
        )
    count = float(found.group(1)) if found.group(1) else 1.0
    return (nbytes, count * PERIOD_UNITS[found.group(2)])


def _positive_budget(value: tuple[int, float]) -> tuple[int, float]:
    nbytes, period_s = value
    if nbytes <= 0 or period_s <= 0:
        raise ValueError("a byte budget needs a positive number of bytes and a positive period")
    return value


#: A byte budget per period: (bytes, seconds).
ByteBudgetSpec = Annotated[
    tuple[int, float], BeforeValidator(parse_budget), AfterValidator(_positive_budget)
]


class GossipSettings(_Schema):
    """``[gossip]``: :class:`node.config.GossipConfig`."""

    topology: Literal[
        "ring", "exponential", "random-regular", "regional", "one-peer-exponential", "epidemic"
    ] = Field(  # TOPOLOGY_NAMES
        "exponential",
        description="the gossip graph over the members' ids (one-peer-exponential and "
        "epidemic: a schedule over the exponential graph's links; need pace link)",
    )  # log2(n) neighbours: mixes fast at a small degree (Assran et al. 2019)
    degree: AtLeastOne = Field(
        4,
        description="neighbours per node for random-regular; bridges between each two regions "
        "for regional",
    )
    fanout: AtLeastOne = Field(
        2, description="with the epidemic topology, the links each round goes to"
    )  # EL's s: 2 agreed in 17-18 rounds at 64 to 1,024 nodes (bench/RESULTS.md)
    bridge_codec: Literal["fp16", "int8", "int4", "sign"] | None = Field(  # BRIDGE_CODEC_NAMES
        None,
        description="codec of the links between regions, the others keeping codec (int8 "
        "when codec is auto; needs pace link; none: one codec)",
    )  # sign across slow links, int8 inside: HALoS's cheap slow tier
    bridge_period: AtLeastOne = Field(
        1,
        description="a link between regions carries a delta in one round of every this many "
        "(needs pace link above 1)",
    )  # 10: a tenth of the rounds cross, as HALoS's global syncs are rarer than its local
    region: Annotated[str, AfterValidator(check_region)] = Field(
        "", description="this node's region, for the regional topology"
    )
    codec: Literal[
        "none", "fp32", "fp16", "int8", "int4", "sign", "topk", "randk", "dct-topk", "auto"
    ] = Field(  # CODEC_NAMES
        "auto",
        description="codec of the model deltas (auto: fp16, int8, int4 or sign, by measurement "
        "of the links; one per link with pace link)",
    )  # int8 where compute sets the pace, int4 or sign where bytes do (gossip/codec_choice.py)
    compress_fraction: Annotated[float, Field(gt=0, le=1)] = Field(
        0.01, description="share of each block the sparse codecs (topk, randk, dct-topk) send"
    )  # CHOCO-SGD's top-1%; an index fits a byte
    block_size: Annotated[int, Field(ge=8, multiple_of=8)] = Field(
        256, description="values per quantization scale"
    )  # scales cost 4 bytes per block: 1.6% of int8's bytes
    gamma: Annotated[float, Field(gt=0, le=1)] | None = Field(
        None, description="consensus step size (none: by codec)"
    )  # harsher codecs need a smaller one (Koloskova et al. 2019)
    local_steps: AtLeastOne = Field(1, description="least local steps between gossip rounds")
    max_local_steps: AtLeastOne | None = Field(
        None,
        description="most local steps between gossip rounds: the trainer waits there for its "
        "links (none: no bound)",
    )  # at least local_steps
    idle_round_interval_s: Positive | None = Field(
        0.1, description="seconds between rounds once training is over (none: no rounds then)"
    )
    trigger: bool = Field(  # idle gossip falls to the heartbeat: about 1% of the bytes
        True, description="gossip only when the change or the neighbours' news is worth it"
    )
    trigger_threshold: Annotated[float, Field(gt=0, lt=1)] = Field(
        0.1, description="worth it: over this fraction of the model's recent movement"
    )  # a tenth of a training round's movement is not worth a full delta
    heartbeat_s: Positive = Field(
        12.0, description="with the trigger, gossip at least this often"
    )  # 0.4 of the silence limit: two lost heartbeats are no silence
    link_queue: AtLeastOne = Field(16, description="deltas queued per neighbour")
    silence_limit_s: Positive = Field(
        30.0, description="a neighbour silent this long leaves the mix"
    )  # about 3 SWIM suspicions
    call_timeout_s: Positive = Field(10.0, description="deadline of each call to a peer")
    seed: Annotated[int, Field(ge=0)] = Field(0, description="seeds random-regular graphs")
    robust: bool = Field(False, description="Byzantine-robust mixing (ClippedGossip)")
    byzantine_fraction: Fraction = Field(
        0.25, description="with robust: share of neighbour weight assumed Byzantine"
    )
    attack: Literal["scale", "flip", "random", "huge", "spike"] | None = Field(
        None, description="tests only"
    )
    outer_lr: Positive | None = Field(
        None, description="DiLoCo-style outer Nesterov step's learning rate (none: off)"
    )
    outer_momentum: Fraction = Field(0.9, description="momentum of the outer step")
    max_upload_rate: UploadRate | None = Field(
        None,
        description="bytes a second the node sends at most, all links and overhead together "
        "(200KB/s, 2MiB/s; none: no cap)",
    )  # membership keeps a tenth of it; at least 16kB/s
    byte_budget: ByteBudgetSpec | None = Field(
        None,
        description="bytes the node may send per period (500MB/day, 2GiB/week), spread over "
        "it; heartbeats only once spent (none: no budget)",
    )  # for metered links; membership is outside it
    pace: Literal["node", "link"] = Field(
        "node",
        description="node: a round waits for every link; link: a public copy per link, each "
        "link at its own pace (a copy of the model per link in memory)",
    )


def _hours(value: object) -> object:
    from node.daemon.power import parse_hours  # light: no torch

    return parse_hours(value) if isinstance(value, str) else value


#: A daily window of local time, ``22:00-06:00``, as minutes after midnight (start, end).
ActiveHours = Annotated[tuple[int, int], BeforeValidator(_hours)]
Percent = Annotated[float, Field(gt=0, le=100)]


class PowerSettings(_Schema):
    """``[power]``: :class:`node.config.PowerConfig`, when the device's state pauses the node."""

    pause_on_battery_below: Percent | None = Field(
        None, description="pause while on battery below this charge, in percent (none: never)"
    )  # resumes 5 points above it, or on AC
    pause_above_temp: Annotated[float, Field(gt=0)] | None = Field(
        None, description="pause while the hottest thermal zone is above this, in °C (none: never)"
    )  # resumes 5 °C below it
    only_on_ac: bool = Field(False, description="pause while the device runs on battery")
    active_hours: ActiveHours | None = Field(
        None, description="train only in these hours of local time, 22:00-06:00 (none: always)"
    )
    sysfs_root: PathSetting = Field(
        Path("/sys"), description="where power_supply and thermal are read (tests: a fake tree)"
    )
    poll_interval_s: Positive = Field(5.0, description="seconds between readings of the device")


class MembershipSettings(_Schema):
    """``[membership]``: :class:`gossip.swim.SwimConfig` (gossip/ stays free of pydantic)."""

    period_s: Positive = Field(1.0, description="membership protocol period in seconds")
    ping_timeout: Annotated[float, Field(gt=0, lt=1)] = Field(
        0.4, description="fraction of a period to wait for a direct ack"
    )
    indirect_probes: Annotated[int, Field(ge=0)] = Field(
        4, description="members asked to ping a silent one"
    )
    suspicion_mult: Positive = Field(5.0, description="suspicion timeout in periods (x log n)")
    suspicion_max_mult: Positive = Field(
        6.0, description="a suspicion with one accuser lasts this many times the minimum"
    )
    confirmations: Annotated[int, Field(ge=0)] = Field(
        3, description="accusers besides the first that bring a suspicion to its minimum"
    )
    max_health: Annotated[int, Field(ge=0)] = Field(
        8, description="Lifeguard's local health cap: probes slow down at most this much + 1"
    )
    retransmit_mult: Positive = Field(6.0, description="piggybacks per update (x log n)")
    max_piggyback: Annotated[int, Field(ge=0)] = Field(8, description="updates per message")
    reconnect_interval_s: Positive = Field(
        5.0, description="seconds between push-pulls with a member held dead"
    )
    forget_after_s: Positive = Field(
        86_400.0, description="how long dead and departed members are remembered"
    )  # Serf reconnects failed members for 24 h
    push_pull_interval_s: Positive = Field(
        15.0, description="seconds between full-state swaps with a random live member"
    )
    max_members: AtLeastOne = Field(4096, description="the most members a view holds")
    max_push_pull: Annotated[int, Field(ge=2)] = Field(
        512, description="the most records one push-pull carries"
    )
    max_pending: AtLeastOne = Field(256, description="updates waiting to be piggybacked")
    new_members_per_s: Positive = Field(
        2.0, description="members new to us that one relayer may introduce per second"
    )
    new_members_burst: AtLeastOne = Field(64, description="... and at once")


class RunSettings(_Schema):
    """Everything ``murmur run`` takes: :class:`node.config.NodeConfig`'s fields.

    pydantic-settings reads the ``MURMUR_*`` variables of these fields
    (:func:`node.settings_sources.load_settings` calls its source on a mapping; nothing reads
    the environment on construction).
    """

    listen: Address = Field("127.0.0.1:7070", description="host:port to serve on; port 0 picks one")
    advertise: Address | None = Field(None, description="host:port others should dial")
    join: Addresses = Field((), description="a node to join through")
    state_dir: PathSetting = Field(
        Path("murmur-state"), description="key, checkpoint and metrics log"
    )
    device: Annotated[str, AfterValidator(_check_device)] = Field(
        "auto", description="auto, cpu, cuda[:N] or mps"
    )  # auto: CUDA, then MPS, then the CPU
    task: Annotated[str, Field(min_length=1)] = Field(
        "digits", description="a built-in task, module:factory or file.py:factory"
    )
    shard_index: Annotated[int, Field(ge=0)] = Field(0, description="this node's shard")
    shard_count: AtLeastOne = Field(1, description="how many shards the data is cut into")
    alpha: Positive | None = Field(None, description="Dirichlet alpha for non-iid shards")
    seed: Annotated[int, Field(ge=0)] = Field(
        0, description="the swarm's seed (the same on every node)"
    )
    threads: AtLeastOne | None = Field(
        None, description="torch intra-op threads (none: torch's default)"
    )
    wait_members: AtLeastOne = Field(
        1, description="start training once this many members (self included) are known"
    )  # 1: a first node starts at once
    wait_timeout_s: Annotated[float, Field(ge=0)] | None = Field(
        60.0, description="seconds to wait for a join and for members, then go on (none: for ever)"
    )
    snapshot_grace_s: Annotated[float, Field(ge=0)] = Field(
        10.0,
        description="once our edges are up, seconds to wait for neighbours' own copies "
        "(at least as long as ours took), then start without them",
    )
    checkpoint_interval_s: Positive | None = Field(
        30.0, description="seconds between checkpoints (none: only the one at the stop)"
    )
    summary_interval_s: Annotated[float, Field(ge=0)] = Field(  # a line per 10 s reads well
        10.0, description="seconds between summary lines in the log; 0 for none"
    )
    insecure: bool = Field(False, description="plain TCP instead of mutual TLS")
    tls_dir: PathSetting | None = Field(
        None, description="where node_key.pem, node_cert.pem and ca_cert.pem are"
    )
    metrics_port: Annotated[int, Field(ge=0, le=65535)] | None = Field(
        None, description="serve Prometheus metrics on this port (none: off)"
    )
    metrics_host: Annotated[str, Field(min_length=1)] | None = Field(  # the metrics name the node
        None, description="address the metrics server binds (none: the listen host, or loopback)"
    )
    metrics_tls: bool = Field(
        False, description="serve the metrics over HTTPS, only to certificates of the swarm's CA"
    )
    mqtt: str | None = Field(None, description="publish status to this broker, mqtt://host:port")
    mqtt_discovery: bool = Field(False, description="announce and join through the broker")
    mqtt_prefix: str = Field("murmur", description="the MQTT topics' prefix")
    mqtt_interval_s: Positive = Field(2.0, description="seconds between status messages")
    swarm: str = Field("default", description="the swarm's name on the broker")
    trainer: TrainerSettings = TrainerSettings()
    gossip: GossipSettings = GossipSettings()
    membership: MembershipSettings = MembershipSettings()
    power: PowerSettings = PowerSettings()


SECTIONS: dict[str, type[_Schema]] = {
    "trainer": TrainerSettings,
    "gossip": GossipSettings,
    "membership": MembershipSettings,
    "power": PowerSettings,
}

#: Flag names (without ``--``) whose key is not simply the flag with underscores; a config file
#: takes them as keys too. ``shard`` is ``shard_index`` and ``shard_count`` together.
FLAG_KEYS: dict[str, str] = {
    "wait-timeout": "wait_timeout_s",
    "snapshot-grace": "snapshot_grace_s",
    "checkpoint-interval": "checkpoint_interval_s",
    "summary-interval": "summary_interval_s",
    "idle-eval-interval": "trainer.idle_eval_interval_s",
    "mqtt-interval": "mqtt_interval_s",
    "swim-period": "membership.period_s",
    "steps": "trainer.steps",
    "eval-every": "trainer.eval_every",
    "slowdown": "trainer.slowdown",
    "step-time": "trainer.step_time",
    "topology": "gossip.topology",
    "fanout": "gossip.fanout",
    "bridge-compress": "gossip.bridge_codec",
    "bridge-period": "gossip.bridge_period",
    "degree": "gossip.degree",
    "region": "gossip.region",
    "compress": "gossip.codec",
    "block-size": "gossip.block_size",
    "compress-fraction": "gossip.compress_fraction",
    "gamma": "gossip.gamma",
    "local-steps": "gossip.local_steps",
    "max-local-steps": "gossip.max_local_steps",
    "trigger-threshold": "gossip.trigger_threshold",
    "heartbeat": "gossip.heartbeat_s",
    "outer-lr": "gossip.outer_lr",
    "outer-momentum": "gossip.outer_momentum",
    "max-upload-rate": "gossip.max_upload_rate",
    "byte-budget": "gossip.byte_budget",
    "pace": "gossip.pace",
    "robust": "gossip.robust",
    "byzantine-fraction": "gossip.byzantine_fraction",
    "attack": "gossip.attack",
    "pause-on-battery-below": "power.pause_on_battery_below",
    "pause-above-temp": "power.pause_above_temp",
    "only-on-ac": "power.only_on_ac",
    "active-hours": "power.active_hours",
    "sysfs-root": "power.sysfs_root",
    "power-poll-interval": "power.poll_interval_s",
}


def keys() -> list[str]:
    """Every setting's dotted key (``listen``, ``trainer.steps``, ...)."""
    out = [k for k in RunSettings.model_fields if k not in SECTIONS]
    for name, section in SECTIONS.items():
        out += [f"{name}.{k}" for k in section.model_fields]
    return out


def default_of(key: str) -> Any:
    """The default of a dotted key, for help texts."""
    section, dot, name = key.rpartition(".")
    model: type[BaseModel] = SECTIONS[section] if dot else RunSettings
    return model.model_fields[name].default


def description_of(key: str) -> str:
    section, dot, name = key.rpartition(".")
    model: type[BaseModel] = SECTIONS[section] if dot else RunSettings
    return model.model_fields[name].description or ""
