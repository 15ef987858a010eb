"""The generated protobuf code is committed; it must be what protoc makes of the schema now."""

from __future__ import annotations

from pathlib import Path

from protos.generate import GENERATED, ROOT, generate


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    fresh = generate(tmp_path)
    for path in fresh:
        committed = ROOT / "protos" / path.name
        assert committed.read_bytes() == path.read_bytes(), (
            f"protos/{path.name} is stale: run `make protos`"
        )
    assert sorted(p.name for p in fresh) == sorted(GENERATED)
