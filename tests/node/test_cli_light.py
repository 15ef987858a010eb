"""The commands that need no model start without torch: help, ``--version``, ``status``,
``monitor`` and ``ca`` (``bench/cli_startup.py`` measures what that saves)."""

from __future__ import annotations

import argparse
import json
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

#: Runs ``murmur ARGV`` in a fresh interpreter, then prints the heavy modules it imported.
PROBE = """
import json, sys
from node.cli.main import main
try:
    code = main(sys.argv[1:])
except SystemExit as exit:
    code = exit.code
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "sklearn", "matplotlib"))
print(json.dumps({"code": code, "heavy": heavy[:5]}))
"""


def probe(*argv: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120
    )
    assert out.stdout.strip(), out.stderr
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["--version"],
        ["run", "--help"],
        ["status", "--help"],
        ["monitor", "--help"],
        ["ca", "--help"],
        ["swarm", "--help"],
        ["simulate", "--help"],
        ["report", "--help"],
    ],
)
def test_help_and_version_import_no_torch(argv: list[str]) -> None:
    assert probe(*argv) == {"code": 0, "heavy": []}


def test_status_ca_and_a_refused_config_import_no_torch(tmp_path: Path) -> None:
    with socket.socket() as dead:
        dead.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{dead.getsockname()[1]}"
        assert probe("status", address, "--insecure", "--timeout", "0.5") == {
            "code": 1,
            "heavy": [],
        }
    assert probe("ca", "init", str(tmp_path / "ca")) == {"code": 0, "heavy": []}
    assert probe("ca", "issue", str(tmp_path / "ca"), "a") == {"code": 0, "heavy": []}
    (tmp_path / "bad.toml").write_text("steps = 0\n")
    assert probe("run", "--config", str(tmp_path / "bad.toml")) == {"code": 2, "heavy": []}


def test_version_and_log_options_anywhere_on_the_line() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "node", "--version"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0
    assert out.stdout.startswith("murmur ")
    for argv in (
        ["--log-level", "debug", "ca", "--help"],
        ["ca", "--log-level", "WARNING", "--help"],
        ["ca", "init", "--log-format", "json", "--help"],
    ):
        assert probe(*argv)["code"] == 0, argv
    bad = subprocess.run(
        [sys.executable, "-m", "node", "run", "--log-level", "LOUD"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2
    assert "invalid choice: 'LOUD'" in bad.stderr
    assert "Traceback" not in bad.stderr


#: Runs ``murmur ARGV`` as if ``MODULE`` were not installed.
WITHOUT = """
import sys
sys.modules[sys.argv[1]] = None  # an import of it fails, as when it is not installed
from node.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize(
    ("module", "argv", "extra"),
    [
        ("matplotlib", ["report", "."], "pip install 'murmur[plots]'"),
        ("matplotlib", ["simulate", "--nodes", "2"], "pip install 'murmur[plots]'"),
        ("matplotlib", ["swarm", "--nodes", "2"], "pip install 'murmur[plots]'"),
        (
            "sklearn",
            ["run", "--insecure", "--device", "cpu", "--listen", "127.0.0.1:0"],
            "the digits task needs sklearn, which is not installed: pip install 'murmur[digits]'",
        ),
    ],
)
def test_a_command_needing_an_extra_names_it(
    tmp_path: Path, module: str, argv: list[str], extra: str
) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            WITHOUT,
            module,
            *argv,
            *(["--state-dir", str(tmp_path)] if argv[0] == "run" else []),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 2, out.stderr
    assert extra in out.stderr
    assert "Traceback" not in out.stderr


def _parsers(
    parser: argparse.ArgumentParser, name: str = "murmur"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _parsers(sub, f"{name} {sub_name}")


def test_every_flag_has_help_with_its_default_and_a_clean_metavar() -> None:
    from node.cli.main import make_parser

    seen = 0
    for name, parser in _parsers(make_parser()):
        text = parser.format_help()
        assert "." not in "".join(re.findall(r"--[\w-]+ ([A-Z_.]+)", text)), (name, text)
        for action in parser._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS:
                continue
            if isinstance(action, argparse._HelpAction | argparse._VersionAction):
                continue
            seen += 1
            flag = action.option_strings[0]
            assert action.help, f"{name} {flag} has no help"
            shown = parser._get_formatter()._expand_help(action)  # as --help prints it
            assert shown.count("(default") == 1, f"{name} {flag}: {shown}"
    assert seen > 80
