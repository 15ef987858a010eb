"""examples/murmur.service runs a command line that ``murmur run`` accepts, with the config
file beside it, and restarts and stops the node as the README says."""

from __future__ import annotations

import configparser
import shlex
from pathlib import Path

from node.cli.commands.run import build_node_config
from node.cli.main import make_parser

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
README = EXAMPLES.parent / "README.md"


def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # systemd keys are cased
    parser.read_string((EXAMPLES / "murmur.service").read_text())
    return parser


def test_the_units_command_line_is_one_murmur_run_accepts() -> None:
    service = unit()["Service"]
    argv = shlex.split(service["ExecStart"])
    assert argv[0] == "/usr/local/bin/murmur"
    assert argv[1] == "run"
    # The unit reads the installed copy of examples/murmur.toml; read the example itself.
    at = argv.index("--config")
    assert argv[at + 1] == "/etc/murmur/node.toml"
    argv[at + 1] = str(EXAMPLES / "murmur.toml")
    cfg = build_node_config(make_parser().parse_args(argv[1:]))
    assert cfg.state_dir == Path("/var/lib") / service["StateDirectory"]
    assert cfg.listen == "0.0.0.0:7070"
    assert cfg.join == ("10.0.0.5:7070", "10.0.0.6:7070")
    assert (cfg.shard_index, cfg.shard_count) == (1, 4)


def test_the_unit_restarts_on_failure_and_stops_with_sigterm() -> None:
    service = unit()["Service"]
    assert service["Restart"] == "on-failure"
    assert service["KillSignal"] == "SIGTERM"
    assert service["KillMode"] == "mixed"
    assert int(service["TimeoutStopSec"]) >= 30
    assert int(service["RestartSec"]) > 0
    assert unit()["Install"]["WantedBy"] == "multi-user.target"


def test_the_readme_says_how_to_use_the_unit() -> None:
    text = README.read_text()
    assert "examples/murmur.service" in text
    assert "/etc/murmur/node.toml" in text
