"""Configuration of a node: one frozen dataclass per component, parsed once at the entry point.

This module holds :class:`NodeConfig`, :class:`PowerConfig` and :func:`node_config`; the gossip
section (:class:`GossipConfig`, its γ defaults and :func:`gossip_config`) is in
:mod:`node.config_gossip`, and re-exported here.

Users' settings (file, environment, flags) are checked by the schema in :mod:`node.settings`
first; the checks here guard the dataclasses that code builds directly."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gossip.robust import ATTACKS  # test-only attacks (GossipConfig.attack)
from gossip.swim import SwimConfig
from node.config_gossip import DEFAULT_GAMMA, SPARSE_GAMMA_PER_SHARE, GossipConfig, gossip_config
from node.daemon.power import SYSFS_ROOT, PausePolicy
from node.daemon.trainer import TrainerConfig
from node.settings import RunSettings
from node.telemetry.mqtt_messages import MqttConfig

__all__ = [
    "ATTACKS",
    "DEFAULT_GAMMA",
    "SPARSE_GAMMA_PER_SHARE",
    "GossipConfig",
    "NodeConfig",
    "PowerConfig",
    "gossip_config",
    "node_config",
]


@dataclass(frozen=True)
class PowerConfig:
    """When the device's state pauses the node (node/daemon/power.py, node/daemon/pause.py).

    Args:
        pause_on_battery_below: pause while on battery below this charge in percent (it
            resumes :data:`~node.daemon.power.BATTERY_HYSTERESIS_PCT` points above, or on AC).
        pause_above_temp: pause while the hottest thermal zone is above this, in °C (it
            resumes :data:`~node.daemon.power.THERMAL_HYSTERESIS_C` below).
        only_on_ac: pause while the device runs on battery.
        active_hours: train only inside this window of local time, (start, end) in minutes
            after midnight; it may wrap past midnight.
        sysfs_root: where ``class/power_supply`` and ``class/thermal`` are read.
        poll_interval_s: seconds between two readings.
    """

    pause_on_battery_below: float | None = None
    pause_above_temp: float | None = None
    only_on_ac: bool = False
    active_hours: tuple[int, int] | None = None
    sysfs_root: Path = SYSFS_ROOT
    poll_interval_s: float = 5.0

    def __post_init__(self) -> None:
        if self.pause_on_battery_below is not None and not 0 < self.pause_on_battery_below <= 100:
            raise ValueError("pause_on_battery_below is a percentage, above 0 and at most 100")
        if self.poll_interval_s <= 0:
            raise ValueError("poll_interval_s must be positive")
        if self.active_hours is not None and not all(0 <= m <= 24 * 60 for m in self.active_hours):
            raise ValueError(f"active_hours {self.active_hours} are not minutes of a day")

    @property
    def policy(self) -> PausePolicy:
        return PausePolicy(
            battery_below=self.pause_on_battery_below,
            above_temp=self.pause_above_temp,
            only_on_ac=self.only_on_ac,
            active_hours=self.active_hours,
        )


@dataclass(frozen=True)
class NodeConfig:
    """Everything one node needs, from flags or a TOML file.

    Args:
        listen: host:port to serve on (port 0 picks a free one).
        advertise: host:port others should dial; defaults to the bound listen address.
        join: addresses of nodes to join through.
        state_dir: where the node keeps its key, checkpoint and metrics log.
        device: auto, cpu, cuda, cuda:N or mps.
        task: a built-in task name, ``module:factory`` or ``path.py:factory``.
        shard_index, shard_count: this node's part of the data.
        alpha: Dirichlet concentration for non-iid shards; None for iid.
        seed: the swarm's seed (initial model, data split); every node must use the same.
        threads: torch intra-op threads; None leaves torch's default.
        wait_members: start training once this many members (self included) are known.
        wait_timeout_s: give up a join, and start training anyway, after this long (with a
            warning); None waits for ever (a node whose swarm must exist, as in a fleet).
        snapshot_grace_s: once every edge of ours is up, wait at most this long (or as long as
            ours took, if longer) for neighbours' own public copies, then start without them.
        checkpoint_interval_s: how often the node writes its checkpoint while it runs; None
            writes one only when it stops.
        insecure: plain TCP instead of mutual TLS (trusted networks only).
        tls_dir: where node_key.pem, node_cert.pem and ca_cert.pem are (``murmur ca issue``
            makes them); defaults to the state dir.
        metrics_port: serve Prometheus metrics on this port (0 picks one; None: no metrics).
        metrics_host: the address the metrics server binds; None: the listen host, or loopback
            when that is a wildcard (the metrics name the node and its address).
        metrics_tls: serve the metrics over HTTPS and only to clients with a certificate from
            the swarm's CA (the node's own TLS files).
        mqtt: an MQTT broker URL to publish status to (``node/telemetry/mqtt.py``); None for none.
        mqtt_discovery: also announce this node's address there and join the members announced.
        mqtt_prefix, swarm: the topics are ``{mqtt_prefix}/{swarm}/{node_id}/...``.
        mqtt_interval_s: seconds between two status messages.
        summary_interval_s: seconds between two summary lines in the log (step, rates, mix,
            last evaluation); 0 turns them off.
        membership: the SWIM protocol's settings (``[membership]`` in a config file).
        power: when the device's state pauses the node (``[power]``).
    """

    listen: str = "127.0.0.1:7070"
    advertise: str | None = None
    join: tuple[str, ...] = ()
    state_dir: Path = Path("murmur-state")
    device: str = "auto"
    task: str = "digits"
    shard_index: int = 0
    shard_count: int = 1
    alpha: float | None = None
    seed: int = 0
    threads: int | None = None
    wait_members: int = 1
    wait_timeout_s: float | None = 60.0
    snapshot_grace_s: float = 10.0
    checkpoint_interval_s: float | None = 30.0
    insecure: bool = False
    tls_dir: Path | None = None
    metrics_port: int | None = None
    metrics_host: str | None = None
    metrics_tls: bool = False
    mqtt: str | None = None
    mqtt_discovery: bool = False
    mqtt_prefix: str = "murmur"
    mqtt_interval_s: float = 2.0
    swarm: str = "default"
    # Often enough to follow a run by eye; 360 lines an hour per node.
    summary_interval_s: float = 10.0
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    gossip: GossipConfig = field(default_factory=GossipConfig)
    membership: SwimConfig = field(default_factory=SwimConfig)
    power: PowerConfig = field(default_factory=PowerConfig)

    def __post_init__(self) -> None:
        if not 0 <= self.shard_index < self.shard_count:
            raise ValueError(f"shard {self.shard_index}/{self.shard_count} is out of range")
        if self.checkpoint_interval_s is not None and self.checkpoint_interval_s <= 0:
            raise ValueError("checkpoint_interval_s must be positive (None: none while running)")
        if self.wait_timeout_s is not None and self.wait_timeout_s < 0:
            raise ValueError("wait_timeout_s must not be negative (None: wait for ever)")
        if self.summary_interval_s < 0:
            raise ValueError("summary_interval_s must not be negative (0 turns summaries off)")
        for address in (self.listen, *self.join, *filter(None, [self.advertise])):
            _check_address(address)
        if self.metrics_tls and self.insecure:
            raise ValueError("--metrics-tls needs the node's TLS files, so not --insecure")
        if self.mqtt_discovery and self.mqtt is None:
            raise ValueError("MQTT discovery needs a broker: give --mqtt URL")
        self.mqtt_config()  # raises on a bad URL, prefix or swarm name

    def mqtt_config(self) -> MqttConfig | None:
        """The MQTT bridge's settings; None without a broker."""
        if self.mqtt is None:
            return None
        return MqttConfig(
            url=self.mqtt,
            swarm=self.swarm,
            prefix=self.mqtt_prefix,
            interval_s=self.mqtt_interval_s,
            discovery=self.mqtt_discovery,
        )


def _check_address(address: str) -> None:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"address {address!r} is not host:port")


def node_config(settings: RunSettings) -> NodeConfig:
    """The frozen configs of a node from its validated settings (:mod:`node.settings`)."""
    values = settings.model_dump()
    sections = {name: values.pop(name) for name in ("trainer", "gossip", "membership", "power")}
    return NodeConfig(
        **values,
        trainer=TrainerConfig(**sections["trainer"]),
        gossip=GossipConfig(**sections["gossip"]),
        membership=SwimConfig(**sections["membership"]),
        power=PowerConfig(**sections["power"]),
    )
