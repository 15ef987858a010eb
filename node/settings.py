"""The settings of ``murmur run`` as one typed schema (pydantic, strict types): the TOML file,
the ``MURMUR_*`` environment variables and the flags all go through it
(:mod:`node.settings_sources` reads and checks them), so that a wrong type, a value out of range
or an unknown key is refused before anything starts.

This module holds the top of the schema (:class:`RunSettings`), the names of the choices the CLI
lists, and the index of keys and flags; the tables (``[gossip]``, ...) and their strict base are
in :mod:`node.settings_sections`, the kinds of value (addresses, rates, byte budgets, hours) in
:mod:`node.settings_values`.

None of them imports torch or the node, so ``murmur --help`` stays fast and can show every
default from here; :func:`node.config.node_config` turns validated settings into the frozen
per-component configs the rest of the code uses.

Keys: in a file, a field's name (``wait_members``), the same with dashes (``wait-members``), or
its flag's name (``compress`` for ``gossip.codec``, ``steps`` for ``trainer.steps``,
``shard = "1/4"``), at the top level or in the field's table. In the environment, the field's
path (``MURMUR_WAIT_MEMBERS``, ``MURMUR_GOSSIP__CODEC``) or a flag's name (``MURMUR_STEPS``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, Field

from node.settings_sections import (
    GossipSettings,
    MembershipSettings,
    PowerSettings,
    Schema,
    TrainerSettings,
)
from node.settings_values import (
    Address,
    Addresses,
    AtLeastOne,
    Device,
    PathSetting,
    Positive,
    parse_budget,
)

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
    "parse_budget",
]

#: The codecs of ``gossip/codecs.py`` (``none`` is fp32; ``auto`` one per link), named here so
#: that the CLI need not import torch to list them; a test checks that they agree.
CODEC_NAMES = (
    "none", "fp32", "fp16", "int8", "int4", "sign", "topk", "randk", "dct-topk", "auto"
)  # fmt: skip
#: The graphs of ``gossip/topology.py`` (likewise checked by a test).
TOPOLOGY_NAMES = (
    "auto", "ring", "exponential", "expander", "random-regular", "regional",
    "one-peer-exponential", "epidemic",
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


class RunSettings(Schema):
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
    device: Device = Field(
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


SECTIONS: dict[str, type[Schema]] = {
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
