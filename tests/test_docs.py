"""Every command the README, the docstrings and ``--help`` show is run exactly as written.

Commands are read from the README's ``sh`` blocks, the indented ``murmur`` lines of docstrings
(``examples/custom_task.py``'s) and the examples of ``murmur --help``, ``murmur run --help`` and
``murmur monitor --help``; ``tests/doc_commands.py`` runs them in a sandbox (its own network
namespace, /tmp and HOME; needs root, as CI has). ``make`` and ``docker`` lines are what CI's own
stages run (``make check``, ``make test-testbed``); everything else must be a murmur command.
The README's TOML example must pass the settings schema, and so must the files that the
testbed's ``docker/provision`` writes.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from node.cli.main import HELP_EXAMPLES
from node.settings_sources import load_settings
from tests.e2e.test_builtin_tasks import readme_commands

ROOT = Path(__file__).resolve().parents[1]
#: First words of shell lines that CI's other stages run (make check, make test-testbed).
OTHER_STAGES = ("make", "docker")


def logical_lines(text: str) -> list[str]:
    """Shell lines with their backslash continuations, as bash reads them (comment lines left
    out; comments after a command stay, bash drops them)."""
    out: list[str] = []
    for line in text.splitlines():
        if out and out[-1].endswith("\\"):
            out[-1] += "\n" + line
        elif line.strip() and not line.strip().startswith("#"):
            out.append(line.strip())
    return out


def first_word(command: str) -> str:
    words = [w for w in command.split() if not re.fullmatch(r"\w+=\S*", w)]
    return words[0] if words else ""


def readme_blocks() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    return [logical_lines(b) for b in re.findall(r"```sh\n(.*?)```", text, re.DOTALL)]


def docstring_commands(path: Path) -> list[str]:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    indented = "\n".join(line[4:] for line in doc.splitlines() if line.startswith("    "))
    return [c for c in logical_lines(indented) if first_word(c) == "murmur"]


def help_commands(epilog: str) -> list[str]:
    examples = epilog.split("\n\n")[0].removeprefix("examples:\n")
    return logical_lines(examples)


def plan() -> list[dict[str, object]]:
    blocks: list[dict[str, object]] = []
    for i, block in enumerate(readme_blocks()):
        for command in block:
            assert first_word(command) in ("murmur", *OTHER_STAGES), command
        murmur = [c for c in block if first_word(c) == "murmur"]
        if murmur == readme_commands():
            continue  # run as written, and their output checked, by tests/e2e/test_builtin_tasks.py
        if murmur:  # one story: the blocks share a HOME (~/swarm-ca is made once)
            blocks.append({"name": f"README block {i + 1}", "home": "readme", "commands": murmur})
    blocks.append(
        {
            "name": "examples/custom_task.py",
            "home": "custom",
            "commands": docstring_commands(ROOT / "examples" / "custom_task.py"),
        }
    )
    for name, epilog in HELP_EXAMPLES.items():
        home = name.replace(" ", "-")
        blocks.append({"name": f"{name} --help", "home": home, "commands": help_commands(epilog)})
    return blocks


def test_the_plan_holds_the_commands_users_meet_first() -> None:
    """The extraction finds what it should (a broken regex would test nothing)."""
    commands = [c for b in plan() for c in b["commands"]]  # type: ignore[attr-defined]
    assert "murmur ca init ~/swarm-ca" in commands
    assert any(c.startswith("murmur run --task examples/custom_task.py") for c in commands)
    assert any("--join 10.0.0.5:7070" in c for c in commands)
    assert any(c.startswith("murmur monitor --mqtt mqtt://broker:1883") for c in commands)
    assert sum(c.startswith("MURMUR_STEPS=300 murmur run") for c in commands) == 1


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_every_documented_command_runs_as_written(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("runs the commands in a network namespace of their own: needs root")
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"cwd": str(ROOT), "blocks": plan()}))
    done = subprocess.run(
        [
            "unshare",
            "--net",
            "--mount",
            "--fork",
            sys.executable,
            "-m",
            "tests.doc_commands",
            str(path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    blocks = json.loads(done.stdout)
    ran = 0
    for block, planned in zip(blocks, plan(), strict=True):
        results = block["results"]
        assert len(results) == len(planned["commands"]), (block["name"], results[-1])  # type: ignore[arg-type]
        for r in results:
            assert r["code"] == 0, f"{block['name']}: {r['command']}\n{r}"
            assert not r.get("hung"), r
            assert "Traceback" not in r["stderr"], r
            ran += 1
    # Some outcomes that say the commands did what their docs claim.
    by_command = {r["command"]: r for b in blocks for r in b["results"]}
    first = next(c for c in by_command if c.startswith("murmur run --listen 0.0.0.0:7070"))
    joiner = next(c for c in by_command if "--join 10.0.0.5:7070" in c)
    assert json.loads(by_command[joiner]["first_line"])["event"] == "ready"
    status = next(r for c, r in by_command.items() if c.startswith("murmur status 10.0.0.5"))
    assert json.loads(by_command[first]["first_line"])["node_id"][:8] in status["stdout"]
    assert ran == sum(len(p["commands"]) for p in plan())  # type: ignore[arg-type, misc]


def test_the_readme_config_example_passes_the_schema(tmp_path: Path) -> None:
    text = (ROOT / "README.md").read_text()
    (example,) = re.findall(r"```toml\n(.*?)```", text, re.DOTALL)
    path = tmp_path / "example.toml"
    path.write_text(example)
    settings = load_settings(path, environ={})
    assert settings.gossip.codec == "int4"
    assert settings.trainer.steps == 2000


def provision(tmp_path: Path, nodes: int, homes: int = 0) -> None:
    """docker/provision as the testbed's certs service runs it, its /ca and /state moved into
    ``tmp_path``."""
    script = (ROOT / "docker" / "provision").read_text()
    script = script.replace("/state/", f"{tmp_path}/state/")
    script = re.sub(r"(?<![\w/.])/ca(?=[/\s\"]|$)", f"{tmp_path}/ca", script)
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    env = {**os.environ, "PATH": path, "HOMES": str(homes)}
    subprocess.run(
        ["bash", "-c", script, "provision", str(nodes)], env=env, check=True, timeout=120
    )


def test_the_testbed_provisioning_writes_valid_configs(tmp_path: Path) -> None:
    """docker/provision as the testbed's certs service runs it (its /ca and /state moved into a
    temporary dir), and its testbed.toml files checked by `murmur run --config`'s schema."""
    provision(tmp_path, nodes=2)
    configs = sorted((tmp_path / "state").glob("*/testbed.toml"))
    assert [c.parent.name for c in configs] == ["node-1", "node-2", "seed", "straggler"]
    for path in configs:
        settings = load_settings(path, environ={})
        assert settings.shard_count == 4
        assert settings.wait_members == 4
    straggler = load_settings(tmp_path / "state" / "straggler" / "testbed.toml", environ={})
    assert straggler.trainer.slowdown == 3.0
    assert straggler.join == ("seed:7070",)


def test_the_testbed_provisioning_makes_the_homes_nodes_too(tmp_path: Path) -> None:
    """With HOMES (the nodes behind the testbed's home router), they get state dirs and shards
    of their own, and join through the seed as the others do."""
    provision(tmp_path, nodes=1, homes=2)
    names = sorted(c.parent.name for c in (tmp_path / "state").glob("*/testbed.toml"))
    assert names == ["home-1", "home-2", "node-1", "seed", "straggler"]
    shards = set()
    for name in names:
        settings = load_settings(tmp_path / "state" / name / "testbed.toml", environ={})
        assert settings.shard_count == 5
        shards.add(settings.shard_index)
    assert shards == set(range(5))
    home = load_settings(tmp_path / "state" / "home-2" / "testbed.toml", environ={})
    assert home.join == ("seed:7070",)
