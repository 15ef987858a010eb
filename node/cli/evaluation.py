"""Judging a finished run from its artefacts: checkpoints, summaries and a reference run.

Everything here reads what the nodes wrote to their state dirs, so the report describes the
models as they were saved, not as some process remembers them.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from node.daemon.checkpoint import CHECKPOINT_FILE, load_checkpoint
from node.daemon.statedir import METRICS_FILE, SUMMARY_FILE
from node.daemon.trainer import Trainer, TrainerConfig
from node.tasks.base import Shard, Task, evaluate_task, load_task
from node.telemetry.events import read_metrics

__all__ = [
    "NodeResult",
    "RunReport",
    "average_states",
    "distances_to_average",
    "evaluate_run",
    "parameter_names",
    "train_reference",
]


@dataclass(frozen=True)
class NodeResult:
    node_id: str
    shard: int
    steps: int
    rounds: int
    loss: float
    accuracy: float
    #: The node's own evaluation when its step budget ran out, before the settling rounds.
    trained_accuracy: float
    bytes_sent: int
    bytes_sent_fp32: int
    trained_loss: float = math.nan

    @property
    def compression_ratio(self) -> float:
        return self.bytes_sent / self.bytes_sent_fp32 if self.bytes_sent_fp32 else 1.0


@dataclass(frozen=True)
class RunReport:
    nodes: tuple[NodeResult, ...]
    averaged_loss: float
    averaged_accuracy: float
    #: Mean squared distance of the node models from their average, (1/n) Σ ||x_i - x̄||².
    consensus_distance: float
    reference_accuracy: float | None = None
    reference_steps: int | None = None
    #: What the task is judged by (node/tasks/base.py Metric) and its target, if any.
    metric: str = "accuracy"
    target: float | None = None
    reference_loss: float | None = None

    def to_json(self) -> str:
        data = asdict(self)
        for node, result in zip(data["nodes"], self.nodes, strict=True):
            node["compression_ratio"] = result.compression_ratio
        # Strict JSON: a NaN (an accuracy a loss-judged task has not) is null.
        return json.dumps(_nulls(data), indent=2, allow_nan=False)

    def to_markdown(self) -> str:
        if self.metric != "accuracy":
            return self._loss_markdown()
        lines = [
            "| node | shard | steps | rounds | eval accuracy after training | "
            "final eval accuracy | final eval loss | sent | vs fp32 |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in self.nodes:
            lines.append(
                f"| {r.node_id[:8]} | {r.shard} | {r.steps} | {r.rounds} | "
                f"{r.trained_accuracy:.4f} | {r.accuracy:.4f} | {r.loss:.4f} | "
                f"{r.bytes_sent / 2**20:.2f} MiB | {100 * r.compression_ratio:.1f}% |"
            )
        avg_acc, avg_loss = self.averaged_accuracy, self.averaged_loss
        lines += [
            "",
            f"- averaged model: accuracy {avg_acc:.4f}, loss {avg_loss:.4f}",
            f"- consensus distance (mean squared distance from the average): "
            f"{self.consensus_distance:.3e}",
            f"- worst node accuracy: {min(r.accuracy for r in self.nodes):.4f}",
        ]
        if self.reference_accuracy is not None:
            lines.append(
                f"- one process on all the data, same number of samples ({self.reference_steps} "
                f"steps): accuracy {self.reference_accuracy:.4f}"
            )
        return "\n".join(lines)

    def _loss_markdown(self) -> str:
        ppl = self.metric == "perplexity"
        lines = [
            "| node | shard | steps | rounds | eval loss after training | final eval loss | "
            + ("final perplexity | " if ppl else "")
            + "sent | vs fp32 |",
            "|---|---:|---:|---:|---:|---:|" + ("---:|" if ppl else "") + "---:|---:|",
        ]
        for r in self.nodes:
            cells = [
                r.node_id[:8],
                str(r.shard),
                str(r.steps),
                str(r.rounds),
                f"{r.trained_loss:.4f}",
                f"{r.loss:.4f}",
                *([f"{_exp(r.loss):.3f}"] if ppl else []),
                f"{r.bytes_sent / 2**20:.2f} MiB",
                f"{100 * r.compression_ratio:.1f}%",
            ]
            lines.append("| " + " | ".join(cells) + " |")
        avg = f"eval loss {self.averaged_loss:.4f}"
        if ppl:
            avg += f", perplexity {_exp(self.averaged_loss):.3f}"
        worst = max(r.loss for r in self.nodes)
        lines += [
            "",
            f"- averaged model: {avg}",
            f"- consensus distance (mean squared distance from the average): "
            f"{self.consensus_distance:.3e}",
            f"- worst node eval loss: {worst:.4f}",
        ]
        if self.target is not None:
            hit = sum(r.loss <= self.target for r in self.nodes)
            lines.append(
                f"- target eval loss {self.target:g}: averaged model "
                f"{'reached' if self.averaged_loss <= self.target else 'not reached'}; "
                f"{hit} of {len(self.nodes)} nodes' final models reached it"
            )
        if self.reference_loss is not None:
            ref = f"eval loss {self.reference_loss:.4f}"
            if ppl:
                ref += f", perplexity {_exp(self.reference_loss):.3f}"
            lines.append(
                f"- one process on all the data, same number of samples ({self.reference_steps} "
                f"steps): {ref}"
            )
        return "\n".join(lines)


def _exp(loss: float) -> float:
    return math.exp(min(loss, 700.0))


def _nulls(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _nulls(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_nulls(v) for v in value]
    return value


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) else math.nan


def _build_task(task_spec: str, seed: int, shard: Shard) -> Task:
    torch.manual_seed(seed)  # the same initial model as every node
    return load_task(task_spec)(shard)


def parameter_names(task_spec: str) -> list[str]:
    """The task's parameter names in the order the nodes gossip them (buffers left out).

    Raises:
        ValueError: the task cannot be found.
    """
    return [name for name, _ in _build_task(task_spec, 0, Shard()).model.named_parameters()]


def distances_to_average(
    states: Sequence[Mapping[str, torch.Tensor]], names: Sequence[str]
) -> torch.Tensor:
    """Each node's squared distance ||x_i - x̄||² from the average of the nodes' parameters.

    Only the tensors in ``names`` count: they are what gossip moves; buffers stay local.
    Returns a float64 tensor of shape (n_nodes,).
    """
    flat = torch.stack(
        [torch.cat([s[name].flatten().double() for name in names]) for s in states]
    )  # (n_nodes, numel)
    return ((flat - flat.mean(dim=0)) ** 2).sum(dim=1)


def average_states(states: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The entry-wise mean of several models' state dicts (computed in float64)."""
    return {
        key: torch.stack([s[key].double() for s in states]).mean(dim=0).to(states[0][key].dtype)
        for key in states[0]
    }


def evaluate_run(
    state_dirs: list[Path], task_spec: str, seed: int, device: torch.device | str = "cpu"
) -> RunReport:
    """Evaluate every node's final checkpoint and their average on the task's eval data."""
    device = torch.device(device)
    task = _build_task(task_spec, seed, Shard())
    model = task.model.to(device)
    results, states = [], []
    for state_dir in state_dirs:
        ckpt = load_checkpoint(state_dir / CHECKPOINT_FILE)
        state, meta = dict(ckpt.model), ckpt.meta
        summary = json.loads((state_dir / SUMMARY_FILE).read_text())
        # The evaluations of training, not those a finished node goes on making as it gossips.
        records = read_metrics(state_dir / METRICS_FILE)
        evals = [r for r in records if r["event"] == "eval" and not r.get("after_budget")]
        model.load_state_dict(state)
        loss, acc = evaluate_task(task, device)
        states.append(state)
        results.append(
            NodeResult(
                node_id=meta["node_id"],
                shard=int(meta["shard"][0]),
                steps=int(meta["step"]),
                rounds=int(summary["rounds"]),
                loss=loss,
                accuracy=acc,
                trained_accuracy=_number(evals[-1]["accuracy"]) if evals else math.nan,
                bytes_sent=int(summary["bytes_sent"]),
                bytes_sent_fp32=int(summary["bytes_sent_fp32"]),
                trained_loss=_number(evals[-1]["loss"]) if evals else math.nan,
            )
        )
    names = [name for name, _ in model.named_parameters()]
    distance = float(distances_to_average(states, names).mean())
    model.load_state_dict(average_states(states))
    avg_loss, avg_acc = evaluate_task(task, device)
    return RunReport(
        tuple(results), avg_loss, avg_acc, distance, metric=task.metric, target=task.target
    )


def train_reference(
    task_spec: str, seed: int, steps: int, device: torch.device | str = "cpu"
) -> tuple[float, float]:
    """(eval loss, accuracy) of one process trained on all the data for ``steps`` steps (the
    reference; accuracy NaN for a task judged by its loss)."""
    device = torch.device(device)
    task = _build_task(task_spec, seed, Shard())
    task.model.to(device)
    trainer = Trainer(
        task,
        device,
        threading.Lock(),
        # Alone, nothing moves its model after the budget: no evaluations after it.
        TrainerConfig(steps=steps, eval_every=steps, seed=seed, idle_eval_interval_s=None),
    )
    trainer.start()
    trainer.join()
    if trainer.error is not None:
        raise trainer.error
    assert trainer.last_eval is not None
    return trainer.last_eval.loss, trainer.last_eval.accuracy
