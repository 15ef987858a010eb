"""The tables of ``murmur run``'s settings, one model each (``[trainer]``, ``[gossip]``,
``[membership]``, ``[power]``), and the strict base that they and :class:`node.settings.RunSettings`
share: strict types, unknown keys refused, frozen, and ``none``/``off`` for an optional value.

The literals of choices here (codecs, topologies, bridge codecs, attacks) are the names of
:mod:`node.settings` (``CODEC_NAMES``, ...), which a test checks against the core's; the value
types are :mod:`node.settings_values`'. Like the schema, this imports neither torch nor the node.
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from gossip.swim_messages import check_region
from node.settings_values import (
    ActiveHours,
    AtLeastOne,
    ByteBudgetSpec,
    Fraction,
    PathSetting,
    Percent,
    Positive,
    UploadRate,
)

__all__ = [
    "OFF_WORDS",
    "GossipSettings",
    "MembershipSettings",
    "PowerSettings",
    "Schema",
    "TrainerSettings",
]

#: The words that turn an optional setting off (its value None), in a file, the environment or a
#: flag alike: TOML has no null, and ``--wait-timeout none`` reads better than a huge number.
OFF_WORDS = ("none", "off")


def _allows_none(annotation: Any) -> bool:
    return annotation is type(None) or any(_allows_none(a) for a in typing.get_args(annotation))


class Schema(BaseModel):
    """The base of every table: strict, closed and frozen; ``none`` or ``off`` turns an optional
    setting off."""

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


class TrainerSettings(Schema):
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


class GossipSettings(Schema):
    """``[gossip]``: :class:`node.config.GossipConfig`."""

    topology: Literal[
        "auto",
        "ring",
        "exponential",
        "expander",
        "random-regular",
        "regional",
        "one-peer-exponential",
        "epidemic",
    ] = Field(  # TOPOLOGY_NAMES
        "auto",
        description="the gossip graph over the members' ids (auto: exponential up to 64 "
        "members, expander above; one-peer-exponential and epidemic: a schedule over the "
        "exponential graph's links; need pace link)",
    )  # about 2 log2(n) neighbours either way: mixes fast at a small degree
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
    link_window_s: Annotated[float, Field(ge=0)] = Field(
        0.5, description="seconds of a link's pace that may wait in line on it"
    )  # see gossip/outbox.py: time, not bytes, is what makes a round stale
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


class PowerSettings(Schema):
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


class MembershipSettings(Schema):
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
