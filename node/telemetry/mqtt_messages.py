"""The MQTT topics and payloads of murmur's telemetry and discovery, and their settings.

Every topic of a node is under ``{prefix}/{swarm}/{node_id}/`` (``murmur/default/...`` unless
``--mqtt-prefix`` and ``--swarm`` say otherwise), and every message is retained with QoS 1, so a
dashboard or a node that connects later learns the whole swarm at once:

============  =========================  ==================================================
topic         payload                    published
============  =========================  ==================================================
``online``    ``true`` or ``false``      ``true`` on every (re)connection; ``false`` on a
                                         clean stop, and as the connection's last will,
                                         which the broker publishes when the node vanishes
                                         (killed, or silent for 1.5 keepalives)
``status``    JSON, see below            on every (re)connection, then every ``interval_s``;
                                         a last one with ``"online": false`` on a clean stop
``address``   ``host:port``              with discovery only, on every (re)connection;
                                         cleared (an empty retained message) on a clean stop
============  =========================  ==================================================

The status is the node's ``murmur status --json`` (:func:`node.telemetry.status.status_to_json`)
with three more keys, ``"online"`` (bool), ``"time"`` (Unix seconds when published) and
``"interval_s"`` (seconds until the next one); numbers that are not finite (the loss before the
first step) are ``null``. The ``online`` topic is the authority on a clean stop and on a death the
broker saw, but a node killed while the broker was down keeps both its retained ``true`` and its
retained status for good: readers (``murmur monitor``) call a status older than a few ``interval_s``
stale.

Discovery reads ``{prefix}/{swarm}/+/address`` and ``.../+/online``: a member counts as announced
while it has an address and its last word on ``online`` was ``true``, so a killed node's stale
address is not joined. :mod:`node.telemetry.mqtt` is the client that publishes and reads all this.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from node.telemetry.status import NodeStatus, finite, status_to_json

__all__ = [
    "KINDS",
    "OFFLINE",
    "ONLINE",
    "STATUS_SCHEMA",
    "Broker",
    "MqttConfig",
    "parse_address",
    "parse_broker_url",
    "parse_status",
    "status_payload",
]

ONLINE = b"true"
OFFLINE = b"false"
KINDS = ("online", "status", "address")

#: Keys of a status payload that readers (``murmur monitor``) rely on, with their JSON types.
STATUS_SCHEMA: dict[str, tuple[type, ...]] = {
    "node_id": (str,),
    "address": (str,),
    "online": (bool,),
    "time": (int, float),
    "step": (int,),
    "step_budget": (int,),
    "training_done": (bool,),
    "train_loss": (int, float, type(None)),
    "eval_loss": (int, float, type(None)),
    "eval_accuracy": (int, float),
    "eval_step": (int,),
    "rounds": (int,),
    "bytes_sent": (int,),
    "bytes_sent_fp32": (int,),
    "bytes_received": (int,),
    "neighbours": (list,),
    "members": (list,),
}


@dataclass(frozen=True)
class Broker:
    host: str
    port: int
    username: str | None = None
    password: str | None = None

    def __str__(self) -> str:  # never the password: this goes into logs
        return f"mqtt://{self.host}:{self.port}"


def parse_broker_url(url: str) -> Broker:
    """``mqtt://[user[:password]@]host[:port]`` (port 1883 by default).

    Raises:
        ValueError: the URL is not of that form.
    """
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as err:
        raise ValueError(f"MQTT URL {url!r}: {err}") from None
    if parts.scheme != "mqtt" or not parts.hostname:
        raise ValueError(f"MQTT URL {url!r} is not mqtt://host[:port]")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"MQTT URL {url!r}: a path, query or fragment means nothing here")
    return Broker(
        parts.hostname,
        port or 1883,
        unquote(parts.username) if parts.username else None,
        unquote(parts.password) if parts.password else None,
    )


def _check_topic(name: str, value: str) -> None:
    levels = value.split("/")
    if not value or any(not level or set(level) & {"+", "#"} for level in levels):
        raise ValueError(f"MQTT {name} {value!r}: needs non-empty topic levels without + or #")


@dataclass(frozen=True)
class MqttConfig:
    """Args:
    url: the broker, ``mqtt://[user[:password]@]host[:port]``.
    swarm: the swarm's name on the broker (one topic level).
    prefix: the topics' first levels.
    interval_s: seconds between two status messages.
    discovery: announce this node's address and join the members announced.
    discovery_wait_s: how long a node with nothing else to join through waits for the broker
        to tell it the members already announced.
    backoff_min_s, backoff_max_s: delay before the first reconnection, and the cap as it doubles.
    keepalive_s: the broker publishes the last will after 1.5 of these without a word.
    timeout_s: deadline of each exchange with the broker, and of the goodbye on stop.
    """

    url: str
    swarm: str = "default"
    prefix: str = "murmur"
    interval_s: float = 2.0
    discovery: bool = False
    discovery_wait_s: float = 5.0
    backoff_min_s: float = 0.5
    backoff_max_s: float = 30.0
    keepalive_s: int = 10
    timeout_s: float = 5.0

    def __post_init__(self) -> None:
        parse_broker_url(self.url)
        _check_topic("prefix", self.prefix)
        _check_topic("swarm name", self.swarm)
        if "/" in self.swarm:
            raise ValueError(f"MQTT swarm name {self.swarm!r}: one topic level, no /")
        if self.interval_s <= 0:
            raise ValueError("the MQTT interval must be positive")
        if not 0 < self.backoff_min_s <= self.backoff_max_s:
            raise ValueError("MQTT back-off: need 0 < min <= max")

    @property
    def broker(self) -> Broker:
        return parse_broker_url(self.url)

    def topic(self, node_id: str, kind: str) -> str:
        """``kind`` is ``online``, ``status`` or ``address``; ``node_id`` may be ``+``."""
        return f"{self.prefix}/{self.swarm}/{node_id}/{kind}"

    def parse_topic(self, topic: str) -> tuple[str, str] | None:
        """(node id, kind) of one of this swarm's topics; None for any other topic."""
        rest = topic.removeprefix(f"{self.prefix}/{self.swarm}/")
        node_id, _, kind = rest.partition("/")
        if rest == topic or not node_id or kind not in KINDS:
            return None
        return node_id, kind


def status_payload(status: NodeStatus, online: bool, now: float, interval_s: float) -> bytes:
    """The JSON published on a node's ``status`` topic (see the module docstring)."""
    data = json.loads(status_to_json(status))
    data["online"] = online
    data["time"] = now
    data["interval_s"] = interval_s
    return json.dumps(finite(data), separators=(",", ":"), allow_nan=False).encode()


def _has_type(value: Any, types: tuple[type, ...]) -> bool:
    # JSON true is no number, though Python's bool is an int.
    return isinstance(value, types) and (bool in types or not isinstance(value, bool))


def parse_status(payload: bytes) -> dict[str, Any] | None:
    """A status payload, if it is a JSON object with :data:`STATUS_SCHEMA`'s keys and types."""
    try:
        data = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict):
        return None
    # Nodes before the figures were labelled said "loss" (the training loss) and "accuracy".
    if "train_loss" not in data and "loss" in data:
        data["train_loss"] = data.pop("loss")
    if "eval_accuracy" not in data and "accuracy" in data:
        data["eval_accuracy"] = data.pop("accuracy")
        data.setdefault("eval_loss", None)
        evaluated = isinstance(data["eval_accuracy"], int | float) and data["eval_accuracy"] >= 0
        data.setdefault("eval_step", 0 if evaluated else -1)
    if all(_has_type(data.get(k, ...), types) for k, types in STATUS_SCHEMA.items()):
        return data
    return None


def parse_address(payload: bytes) -> str | None:
    """A ``host:port`` announcement, or None if the payload is not one."""
    try:
        text = payload.decode()
    except UnicodeDecodeError:
        return None
    host, sep, port = text.rpartition(":")
    if not sep or not host or len(text) > 300 or any(c.isspace() for c in text):
        return None
    if not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return text
