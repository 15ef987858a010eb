"""The text every machine with Python has: the standard library's own sources and docstrings,
cut into shards by package (non-iid: each node reads its own kind of text) and a held-out set
that is the same on every node.

Files are the ``*.py`` files under ``sysconfig``'s stdlib directory, test suites left out
(``test``, ``tests``, ``idle_test``), in sorted order of their relative paths. A file's
*package* is the first component of its path (``email/mime/text.py`` is ``email``; a top-level
module is its own). About one file in :data:`HOLDOUT_EVERY` (chosen by a hash of its path, so
every package loses some) is held out for evaluation and never trained on. The packages are
dealt to the shards largest first, each to the shard with the fewest bytes so far, which
balances the bytes while keeping each package whole: one node gets ``asyncio`` and ``json``,
another ``encodings`` (mostly codec tables), another ``unittest`` and ``pydoc_data`` (prose).

The corpus is a function of the Python version (3.11.7's: about 650 files, 11.5 MB): nodes of
one swarm must run the same minor version to share the held-out set; :func:`corpus_digest`
names it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HOLDOUT_EVERY", "Corpus", "corpus_digest", "load_corpus"]

#: One file in this many is held out (a 5% evaluation split).
HOLDOUT_EVERY = 20
#: Folders that hold test suites (not the library's text) or installed third-party code.
SKIPPED_DIRS = frozenset({"test", "tests", "idle_test", "__pycache__", "site-packages"})


@dataclass(frozen=True)
class Corpus:
    """Relative paths of the training files, by package, and of the held-out files."""

    root: Path
    packages: dict[str, tuple[str, ...]]
    sizes: dict[str, int]  # bytes per package
    held_out: tuple[str, ...]

    def shard_packages(self, count: int) -> list[list[str]]:
        """Each shard's packages: largest first, each to the lightest shard so far.

        Raises:
            ValueError: more shards than packages.
        """
        if count > len(self.packages):
            raise ValueError(f"{count} shards, but the corpus has {len(self.packages)} packages")
        loads = [0] * count
        shards: list[list[str]] = [[] for _ in range(count)]
        for name in sorted(self.packages, key=lambda n: (-self.sizes[n], n)):
            lightest = min(range(count), key=lambda i: (loads[i], i))
            shards[lightest].append(name)
            loads[lightest] += self.sizes[name]
        return [sorted(s) for s in shards]

    def read(self, paths: Sequence[str]) -> bytes:
        """The files' bytes, one after another, each ending in a newline."""
        parts = []
        for rel in paths:
            data = (self.root / rel).read_bytes()
            parts.append(data if data.endswith(b"\n") else data + b"\n")
        return b"".join(parts)

    def shard_text(self, index: int, count: int) -> bytes:
        names = self.shard_packages(count)[index]
        return self.read([p for name in names for p in self.packages[name]])

    def all_training_text(self) -> bytes:
        return self.read([p for name in sorted(self.packages) for p in self.packages[name]])

    def held_out_text(self) -> bytes:
        return self.read(self.held_out)


def _held_out(rel: str) -> bool:
    return int(hashlib.sha256(rel.encode()).hexdigest()[:8], 16) % HOLDOUT_EVERY == 0


@functools.cache
def load_corpus(root: Path | None = None) -> Corpus:
    """List the stdlib's files (no reading yet) and split them; cached per process.

    Raises:
        FileNotFoundError: the stdlib directory holds no Python files.
    """
    root = root or Path(sysconfig.get_paths()["stdlib"])
    files: list[str] = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        rel_dir = Path(folder).relative_to(root)
        files.extend((rel_dir / n).as_posix() for n in names if n.endswith(".py"))
    if not files:
        raise FileNotFoundError(f"no Python sources under {root}")
    packages: dict[str, list[str]] = {}
    sizes: dict[str, int] = {}
    held_out = []
    for rel in sorted(files):
        if _held_out(rel):
            held_out.append(rel)
            continue
        name = rel.split("/", 1)[0].removesuffix(".py")
        packages.setdefault(name, []).append(rel)
        sizes[name] = sizes.get(name, 0) + (root / rel).stat().st_size
    return Corpus(root, {k: tuple(v) for k, v in packages.items()}, sizes, tuple(held_out))


def corpus_digest(corpus: Corpus) -> str:
    """A short hash of the held-out set's bytes: equal on two nodes iff they evaluate alike."""
    return hashlib.sha256(corpus.held_out_text()).hexdigest()[:16]
