"""Local SGD on a worker thread, so that the event loop (and gossip) never waits for it."""

from __future__ import annotations

import atexit
import copy
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from gossip.clock import Clock
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


@dataclass(frozen=True)
class TrainerConfig:
    """Args:
    steps: local step budget; None trains until stopped.
    eval_every: evaluate on the task's eval data every this many steps (and at the end).
    seed: seeds batch order (each node passes its own).
    step_time: emulate a device whose step takes at least this many seconds: a step that
        computes faster waits out the rest. Gives each node of a swarm on one machine a pace of
        its own, as separate devices have, instead of all of them sharing the cores.
    slowdown: make each step this many times as long as it naturally takes (its compute time,
        or ``step_time`` when that is longer), by waiting after it (>= 1; emulates a slow device
        in tests, benchmarks and the testbed).
    rollback_every: keep an in-memory copy of the model and optimizer every this many steps
        whose loss was finite; a loss that turns non-finite rolls back to the last one.
    max_rollbacks: rollbacks in a row (with no new finite copy between them) before the
        trainer gives up with :class:`Diverged`.
    idle_eval_interval_s: once the step budget is spent, evaluate at most this often (and at
        most a tenth of the time, for a model whose evaluation is slow), so that the accuracy a
        node reports follows its model as gossip keeps mixing it; the trainer's thread then
        runs until :meth:`Trainer.request_stop`. None: the thread ends with the budget (a
        trainer alone, whose model nothing else moves).
    """

    steps: int | None = None
    eval_every: int = 100
    seed: int = 0
    step_time: float = 0.0
    slowdown: float = 1.0
    rollback_every: int = 50  # a rollback loses at most this many steps; a copy costs ~1 step
    max_rollbacks: int = 3  # a model that diverges again at once is not healed by retrying
    # A status goes out every 2 s (MQTT) and a summary line every 10 s: a fresh figure for
    # every few of them is enough; one evaluation of digits takes ~0.2 ms (median, 1 thread).
    idle_eval_interval_s: float | None = 5.0

    def __post_init__(self) -> None:
        if self.idle_eval_interval_s is not None and not self.idle_eval_interval_s > 0:
            raise ValueError(
                f"idle_eval_interval_s must be positive, got {self.idle_eval_interval_s}"
            )
        if self.slowdown < 1:
            raise ValueError(f"slowdown must be at least 1, got {self.slowdown}")
        if self.step_time < 0:
            raise ValueError(f"step_time must not be negative, got {self.step_time}")
        if self.rollback_every < 1:
            raise ValueError(f"rollback_every must be at least 1, got {self.rollback_every}")
        if self.max_rollbacks < 0:
            raise ValueError(f"max_rollbacks must not be negative, got {self.max_rollbacks}")

    def idle_eval_wait(self, eval_s: float) -> float:
        """Seconds to wait, after the budget, after an evaluation that took ``eval_s``: the
        interval, or longer for a model so big that its evaluation would take more than
        :data:`IDLE_EVAL_SHARE` of the time."""
        interval = self.idle_eval_interval_s or 0.0
        return max(interval, eval_s * (1 - IDLE_EVAL_SHARE) / IDLE_EVAL_SHARE)

    def wait_after(self, compute_s: float) -> float:
        """Seconds to wait after a step that computed for ``compute_s``."""
        return max(compute_s, self.step_time) * self.slowdown - compute_s


#: How long the interpreter's exit waits for a running trainer to stop (one step or one
#: evaluation).
_AT_EXIT_JOIN_S = 30.0

#: After the budget, an evaluation takes at most this share of the time (its wait grows to
#: ``(1 - share) / share`` times its own duration), whatever ``idle_eval_interval_s`` says.
IDLE_EVAL_SHARE = 0.1


@dataclass(frozen=True)
class EvalResult:
    """One evaluation on the task's eval data.

    Args:
        step: the step of the model it saw.
        loss: mean loss on the eval data.
        accuracy: top-1 accuracy on the eval data.
        time: when it ended, on the trainer's clock.
        after_budget: made after the step budget was spent (the model then moves by gossip
            alone).
    """

    step: int
    loss: float
    accuracy: float
    time: float = 0.0
    after_budget: bool = False


@dataclass(frozen=True)
class Rollback:
    """The training loss turned non-finite at ``step``; the model and optimizer went back to
    those of ``to_step`` (the step counter goes on: it counts the steps taken)."""

    step: int
    to_step: int
    loss: float
    #: Rollbacks in a row, this one included (reset once a new finite copy is kept).
    in_a_row: int


class Diverged(FloatingPointError):
    """Training diverged and there was no finite state to go back to, or going back kept
    failing: the node stops, and keeps its last finite checkpoint."""


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


def batches(task: Task, device: torch.device, seed: int) -> Iterator[tuple[torch.Tensor, ...]]:
    """Endless shuffled batches; epochs reshuffle. Tensor datasets are sliced on the device."""
    gen = torch.Generator().manual_seed(seed)
    data = task.train
    if isinstance(data, TensorDataset):
        tensors = [t.to(device) for t in data.tensors]
        n = len(tensors[0])
        while True:
            order = torch.randperm(n, generator=gen).to(device)
            for start in range(0, n, task.batch_size):
                idx = order[start : start + task.batch_size]
                yield tuple(t[idx] for t in tensors)
    else:
        loader = DataLoader(data, batch_size=task.batch_size, shuffle=True, generator=gen)
        while True:
            for batch in loader:
                yield tuple(t.to(device) for t in batch)


def train_step(
    task: Task,
    optimizer: torch.optim.Optimizer,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    schedule: torch.optim.lr_scheduler.LRScheduler | None = None,
) -> float:
    """One local SGD step of ``task.model`` on a batch, then one step of the learning-rate
    schedule, if any; returns the batch's loss.

    The daemon's trainer thread and the simulator (node/sim) both step with this.
    """
    optimizer.zero_grad(set_to_none=True)
    loss = task.loss(task.model(inputs), targets)
    loss.backward()  # type: ignore[no-untyped-call]
    optimizer.step()
    if schedule is not None:
        schedule.step()
    return float(loss.detach())


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
