"""Local SGD on a worker thread, so that the event loop (and gossip) never waits for it.

The :class:`Trainer` lives here. Its config, what it reports (evaluations, rollbacks, divergence),
its batch stream and one step of training live in node/daemon/local_sgd.py, and import from here
as well."""

from __future__ import annotations

import atexit
import copy
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from gossip.clock import Clock
from node.daemon.local_sgd import IDLE_EVAL_SHARE as IDLE_EVAL_SHARE
from node.daemon.local_sgd import (
    Diverged,
    EvalResult,
    Rollback,
    TrainerConfig,
    batches,
    train_step,
)
from node.runtime import SystemClock
from node.tasks.base import Task, evaluate_task

__all__ = [
    "Diverged",
    "EvalResult",
    "Rollback",
    "Trainer",
    "TrainerConfig",
    "batches",
    "train_step",
]

log = logging.getLogger(__name__)


#: How long the interpreter's exit waits for a running trainer to stop (one step or one
#: evaluation).
_AT_EXIT_JOIN_S = 30.0


@dataclass(frozen=True)
class _FiniteState:
    """An in-memory copy of the model (parameters and buffers) and the optimizer, on the CPU."""

    step: int
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]


def _cpu_copy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _cpu_copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_cpu_copy(v) for v in value)
    return copy.deepcopy(value)


class Trainer:
    """Runs the task's local steps on a thread of its own.

    Each step (forward, backward, optimizer) holds ``model_lock``: the consensus step writes the
    same parameters in place and must not land between a forward pass and its backward pass
    (autograd would find its saved tensors changed). The lock is never held while waiting on
    the network.

    Args:
        task: the model must already sit on ``device``, parameters flattened.
        model_lock: shared with whoever else writes the parameters.
        after_step: called from the training thread after every step, with the step number and
            without the lock; it must not block (it may :meth:`hold` the trainer instead).
        on_eval: called from the training thread after every evaluation: every ``eval_every``
            steps, at the end of the budget, and then every ``idle_eval_interval_s`` until
            stopped.
        on_done: called from the training thread when training ends (budget spent, stopped or
            failed); evaluations may follow it.
        on_rollback: called from the training thread after each rollback.
        on_step_time: called from the training thread after every step, with its seconds
            (compute, and the wait of a slowdown; not the evaluations).
    """

    def __init__(
        self,
        task: Task,
        device: torch.device,
        model_lock: threading.Lock,
        cfg: TrainerConfig,
        after_step: Callable[[int], None] = lambda step: None,
        on_eval: Callable[[EvalResult], None] = lambda result: None,
        on_done: Callable[[], None] = lambda: None,
        start_step: int = 0,
        on_rollback: Callable[[Rollback], None] = lambda rollback: None,
        clock: Clock | None = None,
        on_step_time: Callable[[float], None] = lambda seconds: None,
    ) -> None:
        if len(task.train) == 0:  # type: ignore[arg-type]
            raise ValueError("this node's training shard is empty")
        self.task = task
        self.device = device
        self.cfg = cfg
        self.model_lock = model_lock
        #: Stamps each evaluation (the node's runtime clock, so that status ages agree with it).
        self.clock: Clock = clock or SystemClock()
        self.optimizer = task.make_optimizer()
        #: The task's learning-rate schedule over the step budget (checkpointed with the rest).
        self.schedule = task.make_schedule(self.optimizer, cfg.steps)
        self._after_step = after_step
        self._on_eval = on_eval
        self._on_done = on_done
        self._on_rollback = on_rollback
        self._on_step_time = on_step_time
        # The last two finite states: when going back to the newest fails at once, the one
        # before it may still hold.
        self._finite: deque[_FiniteState] = deque(maxlen=2)
        self._rollbacks_in_a_row = 0
        #: Rollbacks over the trainer's life.
        self.rollbacks = 0
        self._stop = threading.Event()
        # Clear while paused: the loop waits for it between two steps.
        self._going = threading.Event()
        self._going.set()
        # Clear while held (:meth:`hold`): the loop waits for it before its next step.
        self._released = threading.Event()
        self._released.set()
        self._thread = threading.Thread(target=self._run, name="trainer", daemon=True)
        self.step = start_step
        self.samples = 0
        self.loss = math.nan
        self.last_eval: EvalResult | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._started_at = 0.0
        self._ended_at = 0.0
        # Seconds spent paused or held, and when the wait under way began (0: none): they are
        # no training time, so throughput leaves them out.
        self._waited_s = 0.0
        self._waiting_since = 0.0

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self._started_at = time.perf_counter()
        # Stopped before the interpreter ends: a daemon thread still inside torch when it
        # does is killed there, and that aborts the process ("terminate called without an
        # active exception"), whatever the exit status was to be.
        atexit.register(self._stop_at_exit)
        self._thread.start()

    def _stop_at_exit(self) -> None:
        self.request_stop()
        self.join(_AT_EXIT_JOIN_S)

    def request_stop(self) -> None:
        self._stop.set()
        self._going.set()  # a paused loop wakes, and ends
        self._released.set()  # and so does a held one

    def pause(self) -> None:
        """Take no more steps until :meth:`resume` (the step under way ends first). The step
        count, the optimizer and the schedule stand still meanwhile."""
        self._going.clear()

    def resume(self) -> None:
        self._going.set()

    def hold(self) -> None:
        """Take no more steps until :meth:`release`: the gossip rounds are behind (the bound
        on local steps between rounds, node/daemon/rounds.py). Apart from a pause: either
        keeps the loop waiting, and the status says paused only for a pause."""
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    @property
    def paused(self) -> bool:
        return not self._going.is_set()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread: the end of the budget, or with ``idle_eval_interval_s`` set,
        the stop that :meth:`request_stop` asks for."""
        if self._thread.ident is not None:  # never started: nothing to wait for
            self._thread.join(timeout)

    @property
    def started(self) -> bool:
        """Whether :meth:`start` was called (the thread may have ended since)."""
        return self._thread.ident is not None

    @property
    def running(self) -> bool:
        """Training: started, and neither done nor stopped (evaluations may go on after)."""
        return self._thread.is_alive() and not self.done.is_set()

    @property
    def samples_per_s(self) -> float:
        """Training throughput over the time spent training: a device's own slowness
        (``step_time``) counts, time paused or held (:meth:`pause`, :meth:`hold`) does not."""
        now = time.perf_counter()
        end = self._ended_at or now
        since = self._waiting_since
        waited = self._waited_s + (now - since if since and not self._ended_at else 0.0)
        elapsed = end - self._started_at - waited
        return self.samples / elapsed if self._started_at and elapsed > 0 else 0.0

    def _wait(self, event: threading.Event) -> None:
        """Wait for ``event`` (a resume, a release, or the stop that sets both), timed."""
        self._waiting_since = time.perf_counter()
        try:
            event.wait()
        finally:
            self._waited_s += time.perf_counter() - self._waiting_since
            self._waiting_since = 0.0

    def evaluate(self, after_budget: bool = False) -> EvalResult:
        """Evaluate the model as it is now. A read: under the model lock (so no mixing lands
        half way), without autograd, in eval mode, which leaves parameters, buffers and the
        optimizer as they were."""
        with self.model_lock, torch.no_grad():
            loss, acc = evaluate_task(self.task, self.device)
            step = self.step
        result = EvalResult(step, loss, acc, self.clock.now(), after_budget)
        self.last_eval = result
        return result

    def _evaluate_after_budget(self) -> None:
        """Once the budget is spent gossip still mixes the model toward the neighbours', so
        keep evaluating it, at a low rate, until stopped: the accuracy the node reports is its
        model's, not the one it had when it stopped stepping."""
        wait = self.cfg.idle_eval_wait(0.0)
        while not self._stop.wait(wait):
            began = time.perf_counter()
            try:
                result = self.evaluate(after_budget=True)
            except Exception:  # training is over: a failed evaluation only ends evaluating
                log.exception("evaluation after the step budget failed; no more evaluations")
                return
            self._on_eval(result)
            wait = self.cfg.idle_eval_wait(time.perf_counter() - began)

    def _train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        with self.model_lock:
            loss = train_step(self.task, self.optimizer, inputs, targets, self.schedule)
            # Under the lock, so that whoever holds it sees a step count that fits the model.
            self.step += 1
        return loss

    # -- rollback -----------------------------------------------------------------------------

    def _keep_finite(self) -> None:
        """Copy the model and optimizer, if every value is finite (between two steps)."""
        with self.model_lock:
            state = self.task.model.state_dict()
            if not all(
                not t.is_floating_point() or bool(torch.isfinite(t).all()) for t in state.values()
            ):
                return
            self._finite.append(
                _FiniteState(self.step, _cpu_copy(state), _cpu_copy(self.optimizer.state_dict()))
            )
        self._rollbacks_in_a_row = 0

    def _roll_back(self, loss: float) -> None:
        """Go back to the last finite state, or raise :class:`Diverged` when there is none or
        going back keeps failing."""
        self._rollbacks_in_a_row += 1
        what = f"training loss became {loss} at step {self.step}"
        if not self._finite:
            raise Diverged(f"{what}, and there is no finite state to go back to")
        if self._rollbacks_in_a_row > self.cfg.max_rollbacks:
            raise Diverged(
                f"{what} again after {self.cfg.max_rollbacks} rollbacks in a row "
                f"(to step {self._finite[-1].step})"
            )
        if self._rollbacks_in_a_row > 1 and len(self._finite) > 1:
            self._finite.pop()  # the newest did not hold: go further back
        state = self._finite[-1]
        with self.model_lock:
            # In place: the parameters are views of the flat buffer that gossip mixes.
            self.task.model.load_state_dict(state.model)
            self.optimizer.load_state_dict(_cpu_copy(state.optimizer))
        self.rollbacks += 1
        self._on_rollback(Rollback(self.step, state.step, loss, self._rollbacks_in_a_row))

    # -- the loop -----------------------------------------------------------------------------

    def _run(self) -> None:
        finished = False
        try:
            self.task.model.train()
            stream = batches(self.task, self.device, self.cfg.seed)
            budget = self.cfg.steps
            self._keep_finite()
            kept = self.step
            while not self._stop.is_set() and (budget is None or self.step < budget):
                if not self._going.is_set():
                    self._wait(self._going)
                    continue  # stopped, or resumed: look again
                if not self._released.is_set():
                    self._wait(self._released)
                    continue  # stopped, or released: look again
                began = time.perf_counter()
                inputs, targets = next(stream)
                loss = self._train_step(inputs, targets)
                self.samples += len(targets)
                if not math.isfinite(loss):
                    self._roll_back(loss)
                    kept = self.step  # a new copy only after as many finite steps again
                    continue
                self.loss = loss if math.isnan(self.loss) else 0.9 * self.loss + 0.1 * loss
                if self.step - kept >= self.cfg.rollback_every:
                    self._keep_finite()
                    kept = self.step
                self._after_step(self.step)
                # Let a thread that waits for the model lock (the gossip worker) have it: Python
                # would otherwise hand the lock straight back to this loop, starving gossip.
                time.sleep(0)
                wait = self.cfg.wait_after(time.perf_counter() - began)
                if wait > 0:
                    # Outside the model lock: a slow device is slow to compute, and its gossip
                    # worker still mixes meanwhile. Wakes at once when the node stops.
                    self._stop.wait(wait)
                self._on_step_time(time.perf_counter() - began)
                if self.step % self.cfg.eval_every == 0:
                    self._on_eval(self.evaluate())
            finished = budget is not None and self.step >= budget
            if finished and (self.last_eval is None or self.last_eval.step != self.step):
                self._on_eval(self.evaluate())
        except Diverged as exc:  # one line from the node says why; a traceback would not
            self.error = exc
        except BaseException as exc:  # surfaced by the node, which stops on it
            log.exception("trainer failed")
            self.error = exc
        finally:
            self._ended_at = time.perf_counter()
            self.done.set()
            self._on_done()
        if finished and self.error is None and self.cfg.idle_eval_interval_s is not None:
            self._evaluate_after_budget()
        atexit.unregister(self._stop_at_exit)
