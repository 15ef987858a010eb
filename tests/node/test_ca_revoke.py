"""``murmur ca revoke`` takes a full node id, or a unique prefix of an id the CA issued (the 8 or
12 characters that logs, status and monitor print), and refuses anything else, writing nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from node.security.pki import ISSUED_FILE, init_ca, resolve_node_id
from node.security.revocation import REVOKED_FILE


def murmur(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "node", *map(str, args)], capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def ca(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A CA that issued nodes a and b: (its dir, name -> node id)."""
    assert murmur("ca", "init", tmp_path / "ca").returncode == 0
    ids = {}
    for name in ("a", "b"):
        out = murmur("ca", "issue", tmp_path / "ca", name, "--out", tmp_path / name)
        assert out.returncode == 0, out.stderr
        ids[name] = out.stdout.split("node id ")[1].strip()
    return tmp_path / "ca", ids


def revoked(ca_dir: Path) -> list[str]:
    ids: list[str] = json.loads((ca_dir / REVOKED_FILE).read_text())["revoked"]
    return ids


def test_a_short_id_as_logs_print_it_revokes_that_node(ca: tuple[Path, dict[str, str]]) -> None:
    ca_dir, ids = ca
    out = murmur("ca", "revoke", ca_dir, ids["a"][:8])
    assert out.returncode == 0, out.stderr
    assert f"revoked {ids['a']} (a)" in out.stdout
    assert revoked(ca_dir) == [ids["a"]]
    out = murmur("ca", "revoke", ca_dir, ids["b"][:12].upper())  # as typed from a table
    assert out.returncode == 0, out.stderr
    assert sorted(revoked(ca_dir)) == sorted(ids.values())


def test_a_full_id_is_taken_as_it_is(ca: tuple[Path, dict[str, str]]) -> None:
    ca_dir, _ = ca
    elsewhere = "0123456789abcdef" * 2  # issued before the CA kept its list, say
    out = murmur("ca", "revoke", ca_dir, elsewhere)
    assert out.returncode == 0, out.stderr
    assert f"revoked {elsewhere} (not issued by this CA)" in out.stdout
    assert revoked(ca_dir) == [elsewhere]


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("node-a", "'node-a' is not a node id: those are 32 hex characters"),
        ("abc", "'abc' is too short: give at least 4 characters"),
        ("0" * 33, "is not a node id"),
        ("ffffffff", "no node that"),
    ],
)
def test_anything_else_is_refused_and_nothing_written(
    ca: tuple[Path, dict[str, str]], given: str, message: str
) -> None:
    ca_dir, ids = ca
    if any(i.startswith(given) for i in ids.values()):
        pytest.fail(f"the test's prefix {given} happens to start an issued id")  # 1 in 4 billion
    out = murmur("ca", "revoke", ca_dir, ids["a"], given)
    assert out.returncode == 2
    assert message in out.stderr
    assert not (ca_dir / REVOKED_FILE).exists()  # not even the valid id went in


def test_a_prefix_of_several_issued_ids_is_refused(tmp_path: Path) -> None:
    init_ca(tmp_path / "ca")
    # The list as `murmur ca issue` writes it, with two ids that share their first characters.
    both = {"abcd" + "0" * 28: "x", "abcd" + "1" * 28: "y"}
    (tmp_path / "ca" / ISSUED_FILE).write_text(
        json.dumps(
            {i: {"name": n, "not_after": "2030-01-01T00:00:00+00:00"} for i, n in both.items()}
        )
    )
    with pytest.raises(
        ValueError, match=r"abcd starts several issued ids: .* give more characters"
    ):
        resolve_node_id(tmp_path / "ca", "abcd")
    assert resolve_node_id(tmp_path / "ca", "abcd1") == "abcd" + "1" * 28
