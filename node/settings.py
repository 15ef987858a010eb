"""The settings of ``murmur run``: one typed schema that the TOML file, the ``MURMUR_*``
environment variables and the flags all go through, so that a wrong type, a value out of range
or an unknown key is refused before anything starts, saying where it came from.

Sources, lowest first: the defaults, ``--config FILE``, the environment, the flags. Each source
is validated on its own (pydantic, strict types: ``insecure = "false"`` is a string, not a bool;
``local_steps = 2.5`` is not an integer), so an error names the file and line, the variable or
the flag, the key, the value and what was expected. The sources are then merged, and the checks
that involve several keys run on the result. This module imports neither torch nor the node, so
``murmur --help`` stays fast; :func:`node.config.node_config` turns the result into the frozen
per-component configs the rest of the code uses.

Keys: in a file, a field's name (``wait_members``), the same with dashes (``wait-members``), or
its flag's name (``compress`` for ``gossip.codec``, ``steps`` for ``trainer.steps``,
``shard = "1/4"``), at the top level or in the field's table. In the environment, the field's
path: ``MURMUR_WAIT_MEMBERS``, ``MURMUR_GOSSIP__CODEC``, ``MURMUR_TRAINER__STEPS``.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic_settings import EnvSettingsSource, NoDecode
from pydantic_settings.sources.utils import parse_env_vars

__all__ = [
    "ATTACKS",
    "CODEC_NAMES",
    "ENV_PREFIX",
    "FLAG_KEYS",
    "TOPOLOGY_NAMES",
    "GossipSettings",
    "MembershipSettings",
    "RunSettings",
    "SettingsError",
    "TrainerSettings",
    "default_of",
    "load_settings",
]

#: The codecs of ``gossip/codecs.py`` (``none`` is fp32), named here so that the CLI need not
#: import torch to list them; a test checks that they agree.
CODEC_NAMES = ("none", "fp32", "fp16", "int8", "int4", "sign")
#: The graphs of ``gossip/topology.py`` (likewise checked by a test).
TOPOLOGY_NAMES = ("ring", "exponential", "random-regular")
#: Test-only attacks a node can mount on its neighbours (``GossipConfig.attack``).
ATTACKS = ("scale", "flip", "random")
ENV_PREFIX = "MURMUR_"
#: Variables with the prefix that are not settings: the testbed's (its entry point reads
#: MURMUR_NAME, docker/compose.yml MURMUR_IMAGE).
ENV_NOT_SETTINGS = frozenset({"MURMUR_NAME", "MURMUR_IMAGE"})

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


class _Schema(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class TrainerSettings(_Schema):
    """``[trainer]``: :class:`node.trainer.TrainerConfig` (its ``seed`` is the node's)."""

    steps: AtLeastOne | None = Field(None, description="local step budget")  # none: until stopped
    eval_every: AtLeastOne = Field(100, description="evaluate every this many steps")  # ~1 s
    step_time: Annotated[float, Field(ge=0)] = Field(  # 0: as fast as the device computes
        0.0, description="emulate a device whose step takes at least this many seconds"
    )
    slowdown: Annotated[float, Field(ge=1)] = Field(  # 1: the device's own pace
        1.0, description="make every step this many times as long (a straggler)"
    )


class GossipSettings(_Schema):
    """``[gossip]``: :class:`node.config.GossipConfig`."""

    topology: Literal["ring", "exponential", "random-regular"] = Field(
        "exponential", description="the gossip graph over the members' ids"
    )  # log2(n) neighbours: mixes fast at a small degree (Assran et al. 2019)
    degree: AtLeastOne = Field(4, description="neighbours per node for random-regular")
    codec: Literal["none", "fp32", "fp16", "int8", "int4", "sign"] = Field(
        "int8", description="codec of the model deltas"
    )  # a quarter of fp32's bytes, and CHOCO converges as with fp32
    block_size: Annotated[int, Field(ge=8, multiple_of=8)] = Field(
        256, description="values per quantization scale"
    )  # scales cost 4 bytes per block: 1.6% of int8's bytes
    gamma: Annotated[float, Field(gt=0, le=1)] | None = Field(
        None, description="consensus step size (none: by codec)"
    )  # harsher codecs need a smaller one (Koloskova et al. 2019)
    local_steps: AtLeastOne = Field(1, description="least local steps between gossip rounds")
    idle_round_interval_s: Positive = Field(
        0.1, description="seconds between rounds once training is over"
    )
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
    attack: Literal["scale", "flip", "random"] | None = Field(None, description="tests only")
    outer_lr: Positive | None = Field(
        None, description="DiLoCo-style outer Nesterov step's learning rate (none: off)"
    )
    outer_momentum: Fraction = Field(0.9, description="momentum of the outer step")


class MembershipSettings(_Schema):
    """``[membership]``: :class:`gossip.swim.SwimConfig` (gossip/ stays free of pydantic)."""

    period_s: Positive = Field(1.0, description="membership protocol period in seconds")
    ping_timeout: Annotated[float, Field(gt=0, lt=1)] = Field(
        0.4, description="fraction of a period to wait for a direct ack"
    )
    indirect_probes: Annotated[int, Field(ge=0)] = Field(
        3, description="members asked to ping a silent one"
    )
    suspicion_mult: Positive = Field(5.0, description="suspicion timeout in periods (x log n)")
    retransmit_mult: Positive = Field(6.0, description="piggybacks per update (x log n)")
    max_piggyback: Annotated[int, Field(ge=0)] = Field(8, description="updates per message")
    forget_after_s: Positive = Field(
        120.0, description="how long dead and departed members are remembered"
    )


class RunSettings(_Schema):
    """Everything ``murmur run`` takes: :class:`node.config.NodeConfig`'s fields.

    pydantic-settings reads the ``MURMUR_*`` variables of these fields (:func:`load_settings`
    calls its source on a mapping; nothing reads the environment on construction).
    """

    listen: Address = Field("127.0.0.1:7070", description="host:port to serve on; port 0 picks one")
    advertise: Address | None = Field(
        None, description="host:port others should dial (none: the bound address)"
    )
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
    wait_timeout_s: Annotated[float, Field(ge=0)] = Field(
        60.0, description="seconds to wait for a join and for members, then go on"
    )
    checkpoint_interval_s: Positive = Field(30.0, description="seconds between checkpoints")
    insecure: bool = Field(False, description="plain TCP instead of mutual TLS")
    tls_dir: PathSetting | None = Field(
        None, description="node_key.pem, node_cert.pem, ca_cert.pem (none: the state dir)"
    )
    metrics_port: Annotated[int, Field(ge=0, le=65535)] | None = Field(
        None, description="serve Prometheus metrics on this port (none: off)"
    )
    metrics_host: Annotated[str, Field(min_length=1)] = Field(
        "0.0.0.0", description="address the metrics server binds"
    )
    mqtt: str | None = Field(None, description="publish status to this broker, mqtt://host:port")
    mqtt_discovery: bool = Field(False, description="announce and join through the broker")
    mqtt_prefix: str = Field("murmur", description="the MQTT topics' prefix")
    mqtt_interval_s: Positive = Field(2.0, description="seconds between status messages")
    swarm: str = Field("default", description="the swarm's name on the broker")
    trainer: TrainerSettings = TrainerSettings()
    gossip: GossipSettings = GossipSettings()
    membership: MembershipSettings = MembershipSettings()


SECTIONS: dict[str, type[_Schema]] = {
    "trainer": TrainerSettings,
    "gossip": GossipSettings,
    "membership": MembershipSettings,
}

#: Flag names (without ``--``) whose key is not simply the flag with underscores; a config file
#: takes them as keys too. ``shard`` is ``shard_index`` and ``shard_count`` together.
FLAG_KEYS: dict[str, str] = {
    "wait-timeout": "wait_timeout_s",
    "checkpoint-interval": "checkpoint_interval_s",
    "mqtt-interval": "mqtt_interval_s",
    "swim-period": "membership.period_s",
    "steps": "trainer.steps",
    "eval-every": "trainer.eval_every",
    "slowdown": "trainer.slowdown",
    "step-time": "trainer.step_time",
    "topology": "gossip.topology",
    "degree": "gossip.degree",
    "compress": "gossip.codec",
    "block-size": "gossip.block_size",
    "gamma": "gossip.gamma",
    "local-steps": "gossip.local_steps",
    "outer-lr": "gossip.outer_lr",
    "outer-momentum": "gossip.outer_momentum",
    "robust": "gossip.robust",
    "byzantine-fraction": "gossip.byzantine_fraction",
    "attack": "gossip.attack",
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
        return f"{self.where}: {self.label} = {_toml_repr(self.raw)}"


def _toml_repr(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(map(_toml_repr, value)) + "]"
    if isinstance(value, dict):
        return "{...}"
    return str(value)


def _names() -> dict[str, str]:
    """Every name a key may go by (normalised to underscores) -> its dotted key."""
    out: dict[str, str] = {}
    for key in keys():
        out[key] = key
        leaf = key.rpartition(".")[2]
        if "." not in key:
            out[leaf] = key
    for flag, key in FLAG_KEYS.items():
        out[flag.replace("-", "_")] = key
    return out


def _nearest(name: str, section: str | None) -> str | None:
    """The dotted key nearest to a name nobody knows, if one is near."""
    n = name.replace("-", "_")
    if section is not None:
        in_section = [k.rpartition(".")[2] for k in keys() if k.startswith(section + ".")]
        close = difflib.get_close_matches(n, in_section, n=1, cutoff=0.6)
        if close:
            return f"{section}.{close[0]}"
    names = _names()
    leaves = {k.rpartition(".")[2]: k for k in keys() if "." in k}
    close = difflib.get_close_matches(n, [*names, *leaves], n=1, cutoff=0.6)
    if not close:
        return None
    return names.get(close[0]) or leaves[close[0]]


def _suggest(name: str, section: str | None) -> str:
    """ "; did you mean X?" for the nearest known key, or nothing."""
    key = _nearest(name, section)
    return f"; did you mean {key}?" if key else ""


def _resolve(name: str, section: str | None) -> str | None:
    """The dotted key that ``name`` (in ``[section]``, or at the top) means; None if none."""
    n = name.replace("-", "_")
    if section is not None:
        if f"{section}.{n}" in keys():
            return f"{section}.{n}"
        flagged = FLAG_KEYS.get(name.replace("_", "-"))
        return flagged if flagged and flagged.startswith(section + ".") else None
    if n == "shard":
        return "shard"
    return _names().get(n)


def _split_shard(text: object, origin: Origin) -> tuple[object, object]:
    index, sep, count = str(text).partition("/")
    if not isinstance(text, str) or not sep or not index.isdigit() or not count.isdigit():
        raise SettingsError(f"{origin.show()}: expected I/N, e.g. 1/4")
    return index, count


def _put(tree: dict[str, Any], key: str, value: Any) -> None:
    section, dot, name = key.rpartition(".")
    (tree.setdefault(section, {}) if dot else tree)[name] = value


def _line_of(lines: list[str], section: str | None, name: str) -> int | None:
    table = None
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        header = re.fullmatch(r"\[\s*([\w.-]+)\s*\]\s*(#.*)?", stripped)
        if header:
            table = header.group(1)
        elif table == section and re.match(rf"""["']?{re.escape(name)}["']?\s*=""", stripped):
            return number
    return None


def _file_source(path: Path) -> tuple[dict[str, Any], dict[str, Origin]]:
    """The file's values as a tree of dotted keys, and where each came from."""
    try:
        text = path.read_text()
    except OSError as err:
        raise SettingsError(f"{path}: cannot read the config file: {err.strerror}") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise SettingsError(f"{path}: not valid TOML: {err}") from None
    lines = text.splitlines()
    tree: dict[str, Any] = {}
    origins: dict[str, Origin] = {}

    def add(section: str | None, name: str, value: Any) -> None:
        line = _line_of(lines, section, name)
        where = f"{path} line {line}" if line else str(path)
        label = f"[{section}] {name}" if section else name
        origin = Origin(where, label, value, "file")
        key = _resolve(name, section)
        if key is None:
            dotted = f"{section}.{name}" if section else name
            raise SettingsError(f"{where}: unknown key {dotted}{_suggest(name, section)}")
        if key == "shard":
            index, count = _split_shard(value, origin)
            for k, v in (("shard_index", int(str(index))), ("shard_count", int(str(count)))):
                _put(tree, k, v)
                origins[k] = origin
            return
        _put(tree, key, value)
        origins[key] = origin

    for name, value in raw.items():
        if name in SECTIONS:
            if not isinstance(value, dict):
                raise SettingsError(f"{path}: {name} must be a table, [{name}]")
            for sub, sub_value in value.items():
                add(name, sub, sub_value)
        else:
            add(None, name, value)
    return tree, origins


def _env_name(key: str) -> str:
    return ENV_PREFIX + key.replace(".", "__").upper()


class _Environment(EnvSettingsSource):
    """pydantic-settings' reader of the environment, on a given mapping (tests pass theirs)."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(
            RunSettings,  # type: ignore[arg-type]  # its fields are all a source needs
            case_sensitive=False,
            env_prefix=ENV_PREFIX,
            env_nested_delimiter="__",
        )

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(self._environ, self.case_sensitive, False, None)


def _env_source(environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, Origin]]:
    """The ``MURMUR_*`` variables, read by pydantic-settings. A variable may also be named after
    a flag (``MURMUR_STEPS``, ``MURMUR_COMPRESS``); an unknown one is refused."""
    known = {_env_name(k): k for k in keys()}
    ours: dict[str, str] = {}
    origins: dict[str, Origin] = {}
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in ENV_NOT_SETTINGS:
            continue
        rest = upper.removeprefix(ENV_PREFIX).lower()
        key = known.get(upper) or _resolve(rest.replace("__", "."), None)
        if key is None:
            near = _nearest(rest.replace("__", "."), None)
            hint = f"; did you mean {_env_name(near)}?" if near else ""
            raise SettingsError(f"the environment: unknown setting {name}{hint}")
        if key == "shard":
            index, count = _split_shard(environ[name], Origin("", name, environ[name], "env"))
            ours[_env_name("shard_index")], ours[_env_name("shard_count")] = str(index), str(count)
            for k in ("shard_index", "shard_count"):
                origins[k] = Origin("the environment", name, environ[name], "env")
            continue
        ours[_env_name(key)] = environ[name]
        origins[key] = Origin("the environment", name, environ[name], "env")
    tree = _Environment(ours)()
    return tree, origins


def _flag_source(
    flags: Mapping[str, Any], labels: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, Origin]]:
    """Flags as argparse left them (strings, lists of strings, True for a switch)."""
    tree: dict[str, Any] = {}
    origins: dict[str, Origin] = {}
    for key, value in flags.items():
        label = labels.get(key, "--" + key.rpartition(".")[2].replace("_", "-"))
        shown = " ".join(value) if isinstance(value, list) else value
        origin = Origin("the command line", label, shown, "flag")
        if key == "shard":
            index, count = _split_shard(value, origin)
            for k, v in (("shard_index", index), ("shard_count", count)):
                _put(tree, k, v)
                origins[k] = origin
            continue
        _put(tree, key, value)
        origins[key] = origin
    return tree, origins


_PROBLEMS = {
    "int_type": "expected a whole number",
    "int_parsing": "expected a whole number",
    "int_from_float": "expected a whole number",
    "float_type": "expected a number",
    "float_parsing": "expected a number",
    "bool_type": "expected true or false",
    "bool_parsing": "expected true or false",
    "string_type": "expected a string, in quotes",
    "tuple_type": "expected a list",
    "list_type": "expected a list",
    "model_type": "expected a table",
    "dict_type": "expected a table",
    "greater_than_equal": "must be at least {ge}",
    "greater_than": "must be more than {gt}",
    "less_than_equal": "must be at most {le}",
    "less_than": "must be less than {lt}",
    "multiple_of": "must be a multiple of {multiple_of}",
    "literal_error": "expected one of {expected}",
    "string_too_short": "must not be empty",
}


def _problem(error: Mapping[str, Any], origin: Origin | None) -> str:
    kind = str(error["type"])
    template = _PROBLEMS.get(kind)
    if template is None:
        text = str(error["msg"]).removeprefix("Value error, ")
    else:
        text = template.format(**error.get("ctx", {}))
    raw = origin.raw if origin else None
    if origin is not None and origin.kind == "file":
        if isinstance(raw, str) and kind.endswith("_type") and kind != "string_type":
            text += f", not the string {_toml_repr(raw)} (write it without quotes)"
        elif kind.endswith("_type"):
            text += f", not {type(raw).__name__} {_toml_repr(raw)}"
    return text


def _validate(
    model: type[RunSettings],
    tree: dict[str, Any],
    origins: Mapping[str, Origin],
    strict: bool,
) -> dict[str, Any]:
    """Validate one source on its own; returns the values it set, typed.

    A file's values are typed, and validated strictly; the environment's and the flags' are
    strings, which are parsed (``"20"`` is 20 there, ``"2.5"`` still no integer).
    """
    try:
        settings = model.model_validate(tree, strict=strict)
    except ValidationError as err:
        problems = []
        for e in err.errors():
            loc = [str(part) for part in e["loc"] if not isinstance(part, int)]
            key = ".".join(loc[:2]) if loc and loc[0] in SECTIONS else (loc[0] if loc else "")
            origin = origins.get(key)
            where = origin.show() if origin else key
            problems.append(f"{where}: {_problem(e, origin)}")
        raise SettingsError("\n".join(dict.fromkeys(problems))) from None
    dumped: dict[str, Any] = settings.model_dump(exclude_unset=True)
    return dumped


def _merge(base: dict[str, Any], top: dict[str, Any]) -> None:
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key].update(value)
        else:
            base[key] = value


def _check_together(s: RunSettings, origins: Mapping[str, Origin]) -> None:
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
    if s.mqtt_discovery and s.mqtt is None:
        raise SettingsError(
            f"MQTT discovery{said('mqtt_discovery')} needs a broker: give --mqtt URL"
        )
    if s.mqtt is not None:
        from node.mqtt_messages import MqttConfig

        try:
            MqttConfig(url=s.mqtt, swarm=s.swarm, prefix=s.mqtt_prefix)
        except ValueError as err:
            raise SettingsError(f"{err}{said('mqtt')}") from None


def load_settings(
    config_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
    flag_labels: Mapping[str, str] | None = None,
) -> RunSettings:
    """The settings of ``murmur run`` from its sources, each validated, then merged.

    Args:
        config_file: the ``--config`` TOML file, if any.
        environ: the environment (``os.environ`` when None).
        flags: the flags given, by dotted key (``trainer.steps``; ``shard`` as ``I/N``), as
            argparse parsed them: strings, lists of strings, True for a switch.
        flag_labels: how each flag's key is spelled on the command line (``--steps``).

    Raises:
        SettingsError: a value was refused; its message says where, which, what and why.
    """
    origins: dict[str, Origin] = {}
    merged: dict[str, Any] = {}
    sources = []
    if config_file is not None:
        sources.append((*_file_source(config_file), True))
    sources.append((*_env_source(os.environ if environ is None else environ), False))
    sources.append((*_flag_source(flags or {}, flag_labels or {}), False))
    for tree, source_origins, strict in sources:
        _merge(merged, _validate(RunSettings, tree, source_origins, strict))
        origins.update(source_origins)
    settings = RunSettings.model_validate(merged)
    _check_together(settings, origins)
    return settings
