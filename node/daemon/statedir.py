"""The state dir's keeper: what a node reads from its state dir at start and writes there.

A node resumes from the newest usable checkpoint (a damaged one is moved aside, see
node/daemon/checkpoint.py; one of another task is refused), writes a checkpoint every
``checkpoint_interval_s`` and a final one with ``summary.json`` when it stops, and watches
``revoked.json`` for a new revocation list. A node that never started training writes no
checkpoint, and a node whose training diverged keeps its last finite one: what is on disk is
always a state worth resuming from.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch

from gossip.messages import ParamSpec, TaskFingerprint
from gossip.replicas import GossipState
from gossip.swim import Swim
from node.config import NodeConfig
from node.daemon.budget_keeper import BUDGET_FILE
from node.daemon.checkpoint import (
    CHECKPOINT_FILE,
    PREVIOUS_FILE,
    Checkpoint,
    atomic_write,
    check_fits,
    remove_stale_temp_files,
    restore_latest,
    save_checkpoint,
)
from node.daemon.trainer import Diverged, Rollback, Trainer
from node.security.identity import write_atomic
from node.security.revocation import REVOKED_FILE, Revocations, read_revocations_file
from node.tasks.base import Task
from node.telemetry.console import CheckpointProgress
from node.telemetry.events import MetricsLog, json_safe
from node.telemetry.status import NodeStatus, status_to_json

__all__ = [
    "METRICS_FILE",
    "REVOCATIONS_POLL_S",
    "SUMMARY_FILE",
    "StateKeeper",
    "check_resumable",
    "checkpoint_nbytes",
    "keep_revocations",
    "remembered",
    "restore",
    "revocations_path",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

SUMMARY_FILE = "summary.json"
METRICS_FILE = "metrics.jsonl"
#: How often a node looks for a new revocation list in its state dir.
REVOCATIONS_POLL_S = 2.0


class Worker(Protocol):
    """Where the gossip state lives (node/daemon/gossiper.py): a capture runs there."""

    def run(self, fn: Callable[[], T]) -> Awaitable[T]: ...


def remembered(resumed: Checkpoint | None, node_id: str) -> list[dict[str, str]]:
    """The other members the checkpoint we resumed from knew."""
    members = resumed.meta.get("members", []) if resumed is not None else []
    return [m for m in members if m["node_id"] != node_id]


class StateKeeper:
    """Args:
    cfg: the node's configuration (its state dir, task, codec, shard, intervals).
    node_id: whose state this is.
    fingerprint: the task and codec, written into each checkpoint.
    task: the model a checkpoint captures.
    model_lock: held by the trainer for each step; a capture takes it, so it sees one moment.
    trainer: the optimizer, schedule and step that go with the model.
    state: the public copy, session and sequence number that go with them.
    swim: the members a checkpoint remembers.
    worker: the gossip worker, where a periodic capture runs.
    resumed: the checkpoint this life started from (its members are remembered).
    sleep: how the periodic tasks wait.
    """

    def __init__(
        self,
        cfg: NodeConfig,
        node_id: str,
        fingerprint: TaskFingerprint,
        task: Task,
        model_lock: threading.Lock,
        trainer: Trainer,
        state: GossipState,
        swim: Swim,
        worker: Worker,
        resumed: Checkpoint | None,
        sleep: Callable[[float], Awaitable[None]],
    ) -> None:
        self.cfg = cfg
        self.node_id = node_id
        self.fingerprint = fingerprint
        self.task = task
        self.model_lock = model_lock
        self.trainer = trainer
        self.state = state
        self.swim = swim
        self.worker = worker
        self.resumed = resumed
        self.sleep = sleep
        #: Set by the node when it starts: where the checkpoint and stop records go.
        self.metrics: MetricsLog | None = None
        self._checkpoint_lock = threading.Lock()
        self._final_written = False
        self._save_failing = False  # a write failed (a full disk): warn once, not every time
        self.progress = CheckpointProgress(cfg.state_dir / CHECKPOINT_FILE)

    def capture(self) -> Checkpoint:
        """One consistent moment: the model and optimizer between two steps (the trainer holds
        the model lock for each), with the public copy and the step that go with them.

        Runs on the gossip worker, or after it stopped, so the public copy is not moving.
        """
        with self.model_lock:
            model = {
                k: v.detach().to("cpu", copy=True) for k, v in self.task.model.state_dict().items()
            }
            optimizer = copy.deepcopy(self.trainer.optimizer.state_dict())
            schedule = self.trainer.schedule
            schedule_state = copy.deepcopy(schedule.state_dict()) if schedule else None
            step = self.trainer.step
        members: list[dict[str, Any]] = [
            {"node_id": r.node_id, "address": r.address}
            for r in self.swim.live_members()
            if r.node_id != self.node_id
        ]
        # Nobody known alive now (the swarm is away, say): a restart still tries whom we knew.
        members = members or remembered(self.resumed, self.node_id)
        meta = {
            "node_id": self.node_id,
            "step": step,
            "session": self.state.session,
            "seq": self.state.seq,
            "codec": self.cfg.gossip.codec,
            "fingerprint": self.fingerprint.digest(),
            "task": self.cfg.task,
            "shard": [self.cfg.shard_index, self.cfg.shard_count],
            "members": members,
        }
        public = self.state.public.to("cpu", copy=True)
        return Checkpoint(model, public, optimizer, meta, schedule_state)

    def trained(self) -> bool:
        """Whether this life of the node got to training (it joined, or started the swarm, and
        its members and links were ready or it stopped waiting for them). Before that, its
        state is the checkpoint it resumed from, or a model nobody trained: nothing to write."""
        return self.trainer.started

    async def write_checkpoint(self) -> None:
        """Write the checkpoint now (atomically: a crash at any moment leaves a readable one),
        unless the node has nothing worth keeping (see :meth:`save`)."""
        if not self.trained():
            return
        log.debug("node %s writing a checkpoint", self.node_id[:8])
        ckpt = await self.worker.run(self.capture)
        wrote = await self.progress.run(
            f"node {self.node_id[:8]} writing a checkpoint",
            checkpoint_nbytes(ckpt),
            lambda: self.save(ckpt),
            final=False,
        )
        if wrote and self.metrics is not None:
            self.metrics.write("checkpoint", step=int(ckpt.meta["step"]))

    def save(self, ckpt: Checkpoint, final: bool = False) -> bool:
        """Write ``ckpt``, keeping the checkpoint before it; returns whether it wrote.

        It does not write once the final checkpoint is written (a periodic write that was
        under way when the node stopped must not land on top of it with an older state), nor
        a model that diverged: the last finite checkpoint stays. A write that fails (a full
        disk) leaves the old checkpoint, and warns once until a write succeeds again.
        """
        path = self.cfg.state_dir / CHECKPOINT_FILE
        with self._checkpoint_lock:
            if self._final_written:
                return False
            if isinstance(self.trainer.error, Diverged) or not ckpt.is_finite():
                log.error(
                    "node %s: the model is not finite (training diverged); %s stays as it was",
                    self.node_id[:8],
                    path,
                )
                return False
            try:
                save_checkpoint(path, ckpt, self.cfg.state_dir / PREVIOUS_FILE)
            except OSError as err:
                if not self._save_failing:
                    log.warning(
                        "could not write the checkpoint %s (%s); the old one stays, training "
                        "goes on, and this is not said again until a write succeeds",
                        path,
                        err.strerror or err,
                    )
                self._save_failing = True
                return False
            if self._save_failing:
                log.info("wrote the checkpoint %s again (step %d)", path, ckpt.meta["step"])
            self._save_failing = False
            self._final_written = final
            return True

    async def checkpoint_periodically(self) -> None:
        interval_s = self.cfg.checkpoint_interval_s
        if interval_s is None:  # only the final checkpoint, at the stop
            return
        while True:
            await self.sleep(interval_s)
            await self.write_checkpoint()

    async def write_final_state(self, nbytes: int, status: Callable[[], NodeStatus]) -> None:
        """The final checkpoint (``nbytes`` estimates it when no checkpoint was written yet),
        with progress lines if it lasts; then the summary (``status()`` at that moment)."""
        await self.progress.run(
            f"node {self.node_id[:8]} writing the final checkpoint",
            self.progress.estimate(nbytes),
            lambda: self._write_final_state(status),
            final=True,
        )

    def _write_final_state(self, status: Callable[[], NodeStatus]) -> None:
        """The final checkpoint and summary, if this life got to training (a start that fails
        changes nothing on disk but the metrics log); the ``stop`` record in any case."""
        trained = self.trained()
        if trained:
            self.save(self.capture(), final=True)
        else:
            log.info("node %s never trained in this run: no checkpoint written", self.node_id[:8])
        # Strict JSON: a loss that is NaN (no step yet) is null.
        summary = json_safe(json.loads(status_to_json(status())))
        if trained:
            text = json.dumps(summary, indent=2, sort_keys=True, allow_nan=False)
            try:
                atomic_write(self.cfg.state_dir / SUMMARY_FILE, text.encode())
            except OSError as err:
                log.warning("could not write %s: %s", SUMMARY_FILE, err.strerror or err)
        if self.metrics is not None:
            self.metrics.write("stop", **summary)

    def rolled_back(self, rollback: Rollback, record: bool) -> None:
        """The trainer went back to its last finite state: say so, and (``record``) write it
        to the metrics log."""
        log.warning(
            "node %s: training loss became %s at step %d; rolled back to the model and "
            "optimizer of step %d (%d in a row, at most %d)",
            self.node_id[:8],
            rollback.loss,
            rollback.step,
            rollback.to_step,
            rollback.in_a_row,
            self.cfg.trainer.max_rollbacks,
        )
        if self.metrics is not None and record:
            self.metrics.write(
                "rollback", step=rollback.step, to_step=rollback.to_step, loss=rollback.loss
            )

    # -- revocations --------------------------------------------------------------------------

    async def watch_revocations(self, adopt: Callable[[bytes, str], object]) -> None:
        """Look at ``revoked.json`` in the state dir every few seconds: an operator (or a
        deployment tool) drops a new list there, and this node ``adopt``s and spreads it."""
        seen = b""
        path = revocations_path(self.cfg)
        stray = self.cfg.tls_dir / REVOKED_FILE if self.cfg.tls_dir else None
        if stray is not None and stray != path and stray.exists():
            log.warning("ignoring %s: revocation lists are read from %s", stray, path)
        while True:
            blob = await asyncio.to_thread(read_revocations_file, path)
            if blob != seen:
                seen = blob
                adopt(blob, str(path))
            await self.sleep(REVOCATIONS_POLL_S)


def revocations_path(cfg: NodeConfig) -> Path:
    """The one place a node reads (and keeps) its revocation list: the state dir, which is
    the node's own and writable, whatever ``--tls-dir`` says."""
    return cfg.state_dir / REVOKED_FILE


def keep_revocations(path: Path, revocations: Revocations) -> None:
    """Keep an adopted list at ``path`` (:func:`revocations_path`), so that a restart starts
    from it."""
    with contextlib.suppress(OSError):
        if not path.exists() or path.read_bytes() != revocations.blob:
            write_atomic(path, revocations.blob, mode=0o644)


def checkpoint_nbytes(ckpt: Checkpoint) -> int:
    """The tensor bytes of a checkpoint (model, public copy, optimizer state): about its size
    on disk."""
    tensors = [*ckpt.model.values(), ckpt.public]
    if ckpt.optimizer is not None:
        for per_param in ckpt.optimizer.get("state", {}).values():
            tensors += [v for v in per_param.values() if isinstance(v, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


def check_resumable(
    ckpt: Checkpoint, fingerprint: TaskFingerprint, cfg: NodeConfig, path: Path
) -> None:
    """A checkpoint from another task or codec cannot be resumed: say so rather than guess.
    It is whole, and someone's: it is refused, not moved aside as a damaged one would be."""
    if ckpt.meta.get("fingerprint") != fingerprint.digest():
        raise ValueError(
            f"{path} holds a checkpoint of another task or codec "
            f"(task {ckpt.meta.get('task')!r}, codec {ckpt.meta.get('codec')!r}); "
            "use another --state-dir, or remove the checkpoint to start afresh"
        )


def restore(cfg: NodeConfig, task: Task) -> tuple[Checkpoint | None, Path | None]:
    """The newest usable checkpoint in the state dir, after removing stale temporary files."""
    if not cfg.state_dir.is_dir():
        return None, None
    for tmp in remove_stale_temp_files(cfg.state_dir, (CHECKPOINT_FILE, SUMMARY_FILE, BUDGET_FILE)):
        log.info("removed %s, left by a write that was interrupted", tmp)
    specs = tuple(
        ParamSpec(name, tuple(p.shape), str(p.dtype).removeprefix("torch."))
        for name, p in task.model.named_parameters()
    )
    g = cfg.gossip
    fingerprint = TaskFingerprint.of(specs, g.swarm_codec())

    def check(ckpt: Checkpoint, path: Path) -> None:
        check_resumable(ckpt, fingerprint, cfg, path)
        check_fits(ckpt, task.model, task.make_optimizer, path)

    return restore_latest(cfg.state_dir, check)
