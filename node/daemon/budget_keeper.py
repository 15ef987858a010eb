"""The byte budget's file: what a node spent in the current period, kept in its state dir, so
that a restart (or a crash) does not hand it a whole budget again.

The file is small and written atomically every :data:`SAVE_EVERY_S` while the spending changes,
and at the stop; a crash loses at most that much of the count. A file of another period, or
one that cannot be read, is set aside with a line in the log and the period starts afresh.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from gossip.budget import ByteBudget
from node.daemon.checkpoint import atomic_write

__all__ = ["BUDGET_FILE", "SAVE_EVERY_S", "BudgetKeeper"]

log = logging.getLogger(__name__)

BUDGET_FILE = "budget.json"
#: Seconds between two writes of the file while the node spends.
SAVE_EVERY_S = 5.0


class BudgetKeeper:
    """Args:
    budget: the node's byte budget.
    state_dir: where the file lives.
    sleep: how the keeper waits between writes.
    """

    def __init__(
        self, budget: ByteBudget, state_dir: Path, sleep: Callable[[float], Awaitable[None]]
    ) -> None:
        self.budget = budget
        self.path = state_dir / BUDGET_FILE
        self._sleep = sleep
        self._written: float | None = None

    def load(self) -> None:
        """Take this period's spending from the file, if it holds this period's."""
        try:
            saved = json.loads(self.path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as err:
            log.warning("could not read %s (%s): the budget starts afresh", self.path, err)
            return
        if isinstance(saved, dict) and self.budget.restore(saved):
            log.info(
                "byte budget: %.0f of %d bytes spent in this period (from %s)",
                self.budget.spent,
                self.budget.cfg.nbytes,
                self.path,
            )

    def save(self) -> None:
        """Write the file if the spending changed since the last write."""
        saved = self.budget.saved()
        if saved["spent"] == self._written:
            return
        try:
            atomic_write(self.path, json.dumps(saved, sort_keys=True).encode())
        except OSError as err:
            log.warning("could not write %s: %s", self.path, err.strerror or err)
            return
        self._written = saved["spent"]

    async def run(self) -> None:
        while True:
            await self._sleep(SAVE_EVERY_S)
            self.save()
