"""The settings schema of ``murmur run`` (node/settings.py): every bad value is refused before
anything starts, saying where it came from, which key, what it was and what was expected."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from gossip.codecs import AUTO_CODECS, CODECS
from gossip.schedules import SCHEDULES
from gossip.swim import SwimConfig
from gossip.topology import TOPOLOGIES
from node.cli.commands.shared import GAMMA_DEFAULTS_HELP
from node.config import ATTACKS, GossipConfig, NodeConfig, PowerConfig, node_config
from node.config_gossip import DEFAULT_GAMMA
from node.daemon.trainer import TrainerConfig
from node.settings import (
    ATTACKS as SETTINGS_ATTACKS,
)
from node.settings import (
    BRIDGE_CODEC_NAMES,
    CODEC_NAMES,
    ENV_PREFIX,
    SCHEDULE_NAMES,
    TOPOLOGY_NAMES,
    RunSettings,
    default_of,
    keys,
)
from node.settings_sources import SettingsError, load_settings

# (what the file says, what the message must say). Each is a TOML file on its own.
BAD_FILES = [
    ('insecure = "false"\n', 'line 1: insecure = "false": expected true or false, not the string'),
    ('insecure = "yes"\n', 'insecure = "yes": expected true or false'),
    (
        "[gossip]\nlocal_steps = 2.5\n",
        "line 2: [gossip] local_steps = 2.5: expected a whole number",
    ),
    (
        'shard_count = "4"\n',
        'shard_count = "4": expected a whole number, not the string "4" (write',
    ),
    ("listen = 7070\n", "listen = 7070: expected a string, in quotes"),
    ('listen = "7070"\n', "'7070' is not host:port"),
    ('join = ["127.0.0.1"]\n', "'127.0.0.1' is not host:port"),
    ('[trainer]\nsteps = "20"\n', 'line 2: [trainer] steps = "20": expected a whole number'),
    ("[trainer]\nsteps = -5\n", "[trainer] steps = -5: must be at least 1"),
    ("eval-every = 0\n", "eval-every = 0: must be at least 1"),
    ("threads = 0\n", "threads = 0: must be at least 1"),
    ("wait_members = 0\n", "wait_members = 0: must be at least 1"),
    ('compress = "int9"\n', "compress = \"int9\": expected one of 'none', 'fp32'"),
    ("[gossip]\nblock_size = 100\n", "block_size = 100: must be a multiple of 8"),
    ('device = "tpu"\n', "unknown device 'tpu'"),
    ("shard_index = 2\nshard_count = 2\n", "shard 2/2 is out of range: need 0 <= i < n"),
    ('shard = "3"\n', 'shard = "3": expected I/N'),
    ("listen = \n", "not valid TOML: Invalid value (at line 1, column 10)"),
    ('[gossip]\ncodex = "int8"\n', "line 2: unknown key gossip.codex; did you mean gossip.codec?"),
    ("wait_member = 2\n", "line 1: unknown key wait_member; did you mean wait_members?"),
    ("stpes = 2\n", "unknown key stpes; did you mean trainer.steps?"),
    ("[trainer]\nsteps = 5\n[trainer.more]\nx = 1\n", "unknown key trainer.more"),
    ("gossip = 3\n", "gossip must be a table, [gossip]"),
    ("mqtt_discovery = true\n", "MQTT discovery"),
    ('[gossip]\nregion = "a|b"\n', "line 2: [gossip] region = \"a|b\": region 'a|b': expected"),
]


@pytest.mark.parametrize(("text", "message"), BAD_FILES)
def test_a_bad_config_file_is_refused_with_where_what_and_why(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "node.toml"
    path.write_text(text)
    with pytest.raises(SettingsError) as info:
        load_settings(path, environ={})
    assert message in str(info.value)
    if "out of range" not in message and "MQTT" not in message:
        assert str(path) in str(info.value)  # the file is named


# Flags as argparse leaves them: strings by dotted key.
BAD_FLAGS = [
    ({"trainer.eval_every": "0"}, "--eval-every 0: must be at least 1"),
    ({"trainer.steps": "-5"}, "--steps -5: must be at least 1"),
    ({"threads": "0"}, "--threads 0: must be at least 1"),
    ({"wait_members": "0"}, "--wait-members 0: must be at least 1"),
    ({"gossip.local_steps": "2.5"}, "--local-steps 2.5: expected a whole number"),
    ({"wait_timeout_s": "soon"}, "--wait-timeout soon: expected a number"),
    ({"gossip.gamma": "1.5"}, "--gamma 1.5: must be at most 1"),
    ({"metrics_port": "70000"}, "--metrics-port 70000: must be at most 65535"),
    ({"shard": "3/2"}, "shard 3/2 is out of range"),
    (
        {"gossip.local_steps": "4", "gossip.max_local_steps": "2"},
        "max_local_steps 2 (--max-local-steps 2) is below local_steps 4 (--local-steps 4)",
    ),
    ({"join": ["127.0.0.1:7070", "nowhere"]}, "'nowhere' is not host:port"),
    ({"gossip.region": "eu west"}, "--region eu west: region 'eu west': expected up to 63"),
]

LABELS = {
    "trainer.eval_every": "--eval-every",
    "trainer.steps": "--steps",
    "threads": "--threads",
    "wait_members": "--wait-members",
    "gossip.local_steps": "--local-steps",
    "gossip.max_local_steps": "--max-local-steps",
    "wait_timeout_s": "--wait-timeout",
    "gossip.gamma": "--gamma",
    "metrics_port": "--metrics-port",
    "gossip.region": "--region",
}


@pytest.mark.parametrize(("flags", "message"), BAD_FLAGS)
def test_a_bad_flag_is_refused_by_the_same_schema(flags: dict[str, object], message: str) -> None:
    with pytest.raises(SettingsError) as info:
        load_settings(environ={}, flags=flags, flag_labels=LABELS)
    assert message in str(info.value)


BAD_ENVIRONMENT = [
    ({"MURMUR_TRAINER__STEPS": "-5"}, "MURMUR_TRAINER__STEPS=-5: must be at least 1"),
    ({"MURMUR_INSECURE": "perhaps"}, "MURMUR_INSECURE=perhaps: expected true or false"),
    ({"MURMUR_STEP": "5"}, "unknown setting MURMUR_STEP; did you mean MURMUR_TRAINER__STEPS?"),
    ({"MURMUR_GOSSIP__CODEX": "int8"}, "did you mean MURMUR_GOSSIP__CODEC?"),
]


@pytest.mark.parametrize(("environ", "message"), BAD_ENVIRONMENT)
def test_a_bad_environment_variable_is_refused(environ: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError) as info:
        load_settings(environ=environ)
    assert message in str(info.value)


def test_a_file_may_use_flag_names_and_a_string_for_one_join_address(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text(
        'join = "127.0.0.1:7070"\nwait-members = 3\ncompress = "int4"\nshard = "1/4"\n'
        "steps = 50\nswim-period = 0.5\n[trainer]\neval-every = 25\n[gossip]\nblock-size = 64\n"
    )
    cfg = node_config(load_settings(path, environ={}))
    assert cfg.join == ("127.0.0.1:7070",)
    assert (cfg.wait_members, cfg.shard_index, cfg.shard_count) == (3, 1, 4)
    assert cfg.gossip.codec == "int4"
    assert cfg.gossip.block_size == 64
    assert (cfg.trainer.steps, cfg.trainer.eval_every) == (50, 25)
    assert cfg.membership.period_s == 0.5


def test_flags_override_the_environment_which_overrides_the_file(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text('listen = "0.0.0.0:1"\nseed = 1\n[trainer]\nsteps = 10\neval_every = 5\n')
    environ = {"MURMUR_SEED": "2", "MURMUR_TRAINER__STEPS": "20", "MURMUR_NAME": "ignored"}
    s = load_settings(path, environ=environ, flags={"trainer.steps": "30"})
    assert s.listen == "0.0.0.0:1"  # the file alone
    assert s.seed == 2  # the environment over the file
    assert s.trainer.steps == 30  # the flag over both
    assert s.trainer.eval_every == 5  # a table's other keys stay
    # The environment takes flag names too, and a comma-separated list of join addresses.
    s = load_settings(environ={"MURMUR_STEPS": "7", "MURMUR_JOIN": "a:1, b:2", "MURMUR_GAMMA": "1"})
    assert (s.trainer.steps, s.join, s.gossip.gamma) == (7, ("a:1", "b:2"), 1.0)


def test_the_schema_covers_every_field_of_the_frozen_configs_with_their_defaults() -> None:
    """A field added to a config and not to the schema (or a default changed on one side
    only) fails here, not silently at a user's."""
    not_settings = {"trainer.seed"}  # the node derives it from the swarm's seed and its shard
    components: dict[str, Any] = {
        "": NodeConfig(),
        "trainer.": TrainerConfig(),
        "gossip.": GossipConfig(),
        "membership.": SwimConfig(),
        "power.": PowerConfig(),
    }
    expected: dict[str, object] = {}
    for prefix, cfg in components.items():
        for f in dataclasses.fields(cfg):
            if f.name not in ("trainer", "gossip", "membership", "power"):
                expected[prefix + f.name] = getattr(cfg, f.name)
    for key in not_settings:
        expected.pop(key)
    assert set(keys()) == set(expected)
    for key, value in expected.items():
        assert default_of(key) == value, key
    assert node_config(RunSettings()) == NodeConfig()


def test_the_names_the_cli_lists_without_torch_are_the_cores() -> None:
    assert set(CODEC_NAMES) == {"none", "auto", *CODECS}
    assert set(TOPOLOGY_NAMES) == set(TOPOLOGIES)
    assert SCHEDULE_NAMES == SCHEDULES
    assert BRIDGE_CODEC_NAMES == AUTO_CODECS
    assert SETTINGS_ATTACKS == ATTACKS


def test_the_gamma_help_gives_the_cores_defaults() -> None:
    parts = GAMMA_DEFAULTS_HELP.removeprefix("by codec: ").split(", ")
    shown = {
        codec: float(gamma)
        for gamma, codecs in (part.split(" ") for part in parts)
        for codec in codecs.split("/")
    }
    assert shown == {c: DEFAULT_GAMMA[c] for c in ("fp32", "fp16", "int8", "int4", "sign")}


def test_only_variables_with_the_prefix_are_read() -> None:
    s = load_settings(environ={"STEPS": "5", "HOME": "/x", ENV_PREFIX + "NAME": "node-1"})
    assert s == RunSettings()


def test_none_or_off_turns_an_optional_setting_off_in_a_file_the_environment_or_a_flag(
    tmp_path: Path,
) -> None:
    path = tmp_path / "node.toml"
    path.write_text('wait-timeout = "none"\n[trainer]\nidle_eval_interval_s = "off"\n')
    environ = {"MURMUR_CHECKPOINT_INTERVAL": "None"}
    cfg = node_config(load_settings(path, environ=environ, flags={"gossip.gamma": "off"}))
    assert cfg.wait_timeout_s is None
    assert cfg.trainer.idle_eval_interval_s is None
    assert cfg.checkpoint_interval_s is None
    assert cfg.gossip.gamma is None
    # A literal whose value is the word stays that value, and a setting that cannot be off
    # says what it expects.
    assert load_settings(flags={"gossip.codec": "none"}, environ={}).gossip.codec == "none"
    with pytest.raises(SettingsError, match="--eval-every none: expected a whole number"):
        load_settings(flags={"trainer.eval_every": "none"}, environ={})
