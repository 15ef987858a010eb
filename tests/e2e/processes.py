"""Real ``murmur run`` processes for e2e tests: stdout events and stderr lines as they come."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

TIMEOUT_S = 120.0
ARGS = ["--listen", "127.0.0.1:0", "--device", "cpu", "--threads", "1", "--insecure"]


class Proc:
    """A node process whose stdout events and stderr lines are read as they come."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []

    async def event(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), TIMEOUT_S)
        assert line, "the node exited:\n" + "\n".join(self.lines) + await self.rest()
        event: dict[str, Any] = json.loads(line)
        return event

    async def line_with(self, text: str) -> str:
        """The next stderr line holding ``text`` (earlier ones are kept in ``lines``)."""
        assert self.proc.stderr is not None
        async with asyncio.timeout(TIMEOUT_S):
            while True:
                raw = await self.proc.stderr.readline()
                assert raw, f"the node exited before saying {text!r}:\n" + "\n".join(self.lines)
                self.lines.append(raw.decode().rstrip("\n"))
                if text in self.lines[-1]:
                    return self.lines[-1]

    async def rest(self) -> str:
        assert self.proc.stderr is not None
        return (await self.proc.stderr.read()).decode(errors="replace")

    async def stop(self) -> tuple[int, str]:
        """SIGTERM; the exit code and the whole of stderr."""
        self.proc.send_signal(signal.SIGTERM)
        rest = await asyncio.wait_for(self.rest(), TIMEOUT_S)
        code = await asyncio.wait_for(self.proc.wait(), TIMEOUT_S)
        return code, "\n".join([*self.lines, rest])


class Processes:
    """Starts processes; :func:`processes` kills whatever is left of them at its end."""

    def __init__(self) -> None:
        self.started: list[Proc] = []

    async def __call__(self, *argv: str) -> Proc:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        self.started.append(Proc(proc))
        return self.started[-1]


@asynccontextmanager
async def processes() -> AsyncIterator[Processes]:
    started = Processes()
    try:
        yield started
    finally:
        for p in started.started:
            if p.proc.returncode is None:
                p.proc.kill()
                await p.proc.wait()


def murmur(*args: str) -> list[str]:
    return [sys.executable, "-m", "node", "run", *ARGS, *args]
