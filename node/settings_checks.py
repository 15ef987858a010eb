"""The parts of ``murmur run``'s settings that come after each source is read
(:mod:`node.settings_sources`): where a value came from, the error that names it, and the checks
that involve several keys, run on the merged settings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from node.settings import BRIDGE_CODEC_NAMES, SCHEDULE_NAMES, RunSettings

__all__ = ["Origin", "SettingsError", "check_together", "toml_repr"]


class SettingsError(ValueError):
    """A setting was refused; the message says where, which, what it was and what was wanted."""


@dataclass(frozen=True)
class Origin:
    """Where one value came from, to say so when it is refused."""

    where: str  # "b.toml line 3", "the environment", "the command line"
    label: str  # the key as the user wrote it: "wait-members", "MURMUR_STEPS", "--steps"
    raw: Any
    kind: Literal["file", "env", "flag"]

    def show(self) -> str:
        if self.kind == "flag":
            return f"{self.label} {self.raw}" if self.raw is not True else self.label
        if self.kind == "env":
            return f"{self.label}={self.raw}"
        return f"{self.where}: {self.label} = {toml_repr(self.raw)}"


def toml_repr(value: Any) -> str:
    """``value`` as a TOML file would spell it, to quote a refused value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(map(toml_repr, value)) + "]"
    if isinstance(value, dict):
        return "{...}"
    return str(value)


def check_together(s: RunSettings, origins: Mapping[str, Origin]) -> None:
    """The checks that involve several keys, on the merged settings."""

    def said(key: str) -> str:
        origin = origins.get(key)
        return f" ({origin.show()})" if origin else " (the default)"

    if s.shard_index >= s.shard_count:
        raise SettingsError(
            f"shard {s.shard_index}/{s.shard_count} is out of range: need 0 <= i < n; "
            f"shard_index {s.shard_index}{said('shard_index')}, "
            f"shard_count {s.shard_count}{said('shard_count')}"
        )
    g = s.gossip
    if g.max_local_steps is not None and g.max_local_steps < g.local_steps:
        raise SettingsError(
            f"max_local_steps {g.max_local_steps}{said('gossip.max_local_steps')} is below "
            f"local_steps {g.local_steps}{said('gossip.local_steps')}: the most local steps "
            "between two rounds cannot be fewer than the least"
        )
    if g.topology in SCHEDULE_NAMES and g.pace != "link":
        raise SettingsError(
            f"topology {g.topology}{said('gossip.topology')} sends each round to some links "
            f"only, which needs a copy of the model per link, and pace is "
            f"{g.pace}{said('gossip.pace')}: add --pace link"
        )
    bridged = g.bridge_codec is not None or g.bridge_period > 1
    if bridged and g.pace != "link":
        raise SettingsError(
            f"a codec or a period of their own for the links between regions (bridge_codec "
            f"{g.bridge_codec}{said('gossip.bridge_codec')}, bridge_period "
            f"{g.bridge_period}{said('gossip.bridge_period')}) needs a copy of the model per "
            f"link, and pace is {g.pace}{said('gossip.pace')}: add --pace link"
        )
    if g.bridge_codec is not None and g.codec not in (*BRIDGE_CODEC_NAMES, "auto"):  # auto: int8
        raise SettingsError(
            f"bridge_codec {g.bridge_codec}{said('gossip.bridge_codec')} with codec "
            f"{g.codec}{said('gossip.codec')}: the links inside a region must send one of "
            f"{', '.join(BRIDGE_CODEC_NAMES[:-1])} or {BRIDGE_CODEC_NAMES[-1]} too (the "
            "codecs a delta may name)"
        )
    if s.mqtt_discovery and s.mqtt is None:
        raise SettingsError(
            f"MQTT discovery{said('mqtt_discovery')} needs a broker: give --mqtt URL"
        )
    if s.mqtt is not None:
        from node.telemetry.mqtt_messages import MqttConfig

        try:
            MqttConfig(url=s.mqtt, swarm=s.swarm, prefix=s.mqtt_prefix)
        except ValueError as err:
            raise SettingsError(f"{err}{said('mqtt')}") from None
