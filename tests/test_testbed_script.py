"""scripts/testbed's CI stage where Docker cannot run: it says so at once, before it installs a
package or builds an image."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Long enough for bash and a `docker info` that finds no engine; far shorter than installing.
QUICK_S = 20.0


def without_docker(tmp_path: Path, command: str) -> tuple[list[str], dict[str, str], str]:
    """argv and environment to run ``scripts/testbed COMMAND`` where no engine answers (a socket
    nobody listens on) and none could start, and the cause the script should name: as root,
    without the capabilities dockerd needs (what an unprivileged container has)."""
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/none.sock", "TESTBED_PROJECT": "ops-t"}
    if os.geteuid() != 0:
        return ["bash", "scripts/testbed", command], env, "starting one needs root"
    capsh = shutil.which("capsh")
    assert capsh, "capsh (libcap2-bin) drops the capabilities here"
    argv = [
        capsh,
        "--drop=cap_sys_admin,cap_net_admin",
        "--",
        "-c",
        f"bash scripts/testbed {command}",
    ]
    return argv, env, "unprivileged container (no CAP_SYS_ADMIN or CAP_NET_ADMIN)"


def test_the_ci_stage_in_an_unprivileged_container_names_the_cause_at_once(tmp_path: Path) -> None:
    argv, env, cause = without_docker(tmp_path, "ci")
    began = time.monotonic()
    done = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=QUICK_S, check=False
    )
    assert done.returncode == 1, done.stderr
    assert "cannot run Docker here" in done.stderr
    assert cause in " ".join(done.stderr.split())
    assert "installing" not in done.stderr  # nothing was installed, nothing built
    assert "base image" not in done.stderr
    assert time.monotonic() - began < QUICK_S


def test_preparing_ahead_where_docker_cannot_run_does_nothing_and_fails_nothing(
    tmp_path: Path,
) -> None:
    # scripts/check runs this in the background; where the testbed stage could not run, the
    # stage itself must be the one to say why, so the prepare installs and builds nothing.
    argv, env, _ = without_docker(tmp_path, "prepare")
    done = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=QUICK_S, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "nothing to do ahead" in done.stderr
    assert "installing" not in done.stderr
    assert "base image" not in done.stderr
