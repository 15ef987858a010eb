"""``murmur report``: plots and a markdown summary of a run, made from its nodes' state dirs.

Everything comes from what the nodes wrote: the metrics logs give the history (loss, accuracy,
distance to the neighbours, restarts, model pulls); the checkpoints, where there are any, give
each node's exact distance to the average of the final models.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from node.cli.evaluation import distances_to_average, parameter_names
from node.cli.history import EvalPoint, NodeHistory, read_history
from node.cli.plots import plot_metric
from node.daemon.checkpoint import CHECKPOINT_FILE, Checkpoint, CheckpointError, load_checkpoint
from node.daemon.statedir import METRICS_FILE

__all__ = [
    "PLOTS_DIR",
    "REPORT_FILE",
    "FinalDistances",
    "default_out_dir",
    "final_distances",
    "run_metric",
    "write_report",
]

#: Named so that a report written into a ``murmur swarm`` workdir leaves its report.md alone.
REPORT_FILE = "run-report.md"
PLOTS_DIR = "plots"

DISTANCE_NOTE = (
    "The metrics logs hold no models, so the distance to the swarm's average over time cannot "
    "be computed from them. This plot shows what each node logged at every evaluation: the RMS "
    "of x_i - x̂_j averaged over its neighbours' public copies x̂_j. By the triangle inequality "
    "that is an upper bound on the node's RMS distance to the average of its neighbours' "
    "copies; it is not its distance to the average of the whole swarm."
)


@dataclass(frozen=True)
class FinalDistances:
    """How far each final model is from the average of them all."""

    #: RMS over the parameters of x_i - x̄, per state dir (the units of the distance plot).
    rms: Mapping[Path, float]
    #: (1/n) Σ ||x_i - x̄||², the consensus distance that ``murmur swarm``'s report.md gives.
    mean_squared: float


def final_distances(checkpoints: Mapping[Path, Checkpoint]) -> FinalDistances:
    """Each checkpoint's distance to the average of all of them, over the parameters only.

    The parameters are told from buffers (which are not gossiped) by building the task the
    checkpoints name, as the nodes did.

    Raises:
        ValueError: the checkpoints are of different tasks or codecs, or the task cannot be
            built here.
    """
    metas = [c.meta for c in checkpoints.values()]
    if len({m.get("fingerprint") for m in metas}) != 1:
        raise ValueError("the checkpoints are of different tasks or codecs")
    task = metas[0].get("task")
    if not isinstance(task, str):
        raise ValueError("the checkpoints do not say which task they are of")
    try:
        names = parameter_names(task)
    # A plug-in's factory may fail in any way (its data may be elsewhere); the report goes on.
    except Exception as err:
        raise ValueError(f"cannot build task {task!r} here to find its parameters: {err}") from err
    models = [c.model for c in checkpoints.values()]
    if any(name not in m for m in models for name in names):
        raise ValueError(f"the checkpoints do not hold every parameter of task {task!r}")
    squared = distances_to_average(models, names)
    numel = sum(models[0][name].numel() for name in names)
    rms = {d: math.sqrt(float(sq) / numel) for d, sq in zip(checkpoints, squared, strict=True)}
    return FinalDistances(rms, float(squared.mean()))


def default_out_dir(state_dirs: Sequence[Path]) -> Path:
    """The state dirs' common parent (for ``run/node-0 run/node-1``, ``run``)."""
    return Path(os.path.commonpath([d.resolve().parent for d in state_dirs]))


def _read(state_dirs: Sequence[Path]) -> tuple[list[NodeHistory], list[str]]:
    histories, skipped = [], []
    for state_dir in dict.fromkeys(d.resolve() for d in state_dirs):  # once each, in order
        if not (state_dir / METRICS_FILE).is_file():
            skipped.append(f"skipped `{state_dir}`: no {METRICS_FILE}")
            continue
        try:
            histories.append(read_history(state_dir))
        except (ValueError, OSError) as err:  # bad lines are skipped; this is a whole bad log
            skipped.append(f"skipped `{state_dir}`: {_short(err)}")
    return histories, skipped


def _short(err: BaseException, limit: int = 200) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _checkpoints(histories: Sequence[NodeHistory]) -> tuple[dict[Path, Checkpoint], list[str]]:
    found, notes = {}, []
    for h in histories:
        path = h.state_dir / CHECKPOINT_FILE
        if not path.is_file():
            continue
        try:
            found[h.state_dir] = load_checkpoint(path)
        except CheckpointError as err:
            notes.append(f"unusable checkpoint `{path}` ({err.cause}): left out")
    return found, notes


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None or math.isnan(x) else format(x, spec)


def _perplexity(loss: float | None) -> float | None:
    return None if loss is None or math.isnan(loss) else math.exp(min(loss, 700.0))


def _judged(metric: str) -> list[str]:
    """The columns that say how good a node's model is, by the task's metric."""
    if metric == "accuracy":
        return ["last eval loss", "last eval accuracy", "best eval accuracy"]
    if metric == "perplexity":
        return ["last eval loss", "last eval perplexity", "best eval loss"]
    return ["last eval loss", "best eval loss"]


def _judged_cells(h: NodeHistory, metric: str) -> list[str]:
    evals = h.evals
    last = evals[-1] if evals else None
    cells = [_fmt(last.loss if last else None, ".4f")]
    if metric == "accuracy":
        cells.append(_fmt(last.accuracy if last else None, ".4f"))
        cells.append(_fmt(max(e.accuracy for e in evals) if evals else None, ".4f"))
        return cells
    if metric == "perplexity":
        cells.append(_fmt(_perplexity(last.loss) if last else None, ".3f"))
    finite = [e.loss for e in evals if not math.isnan(e.loss)]
    cells.append(_fmt(min(finite) if finite else None, ".4f"))
    return cells


def _row(
    h: NodeHistory, ckpt: Checkpoint | None, distance: float | None, dist: bool, metric: str
) -> str:
    shard = ckpt.meta.get("shard") if ckpt else None
    ratio = h.bytes_sent / h.bytes_sent_fp32 if h.bytes_sent_fp32 else None
    cells = [
        h.node_id[:8],
        h.state_dir.name,
        f"{shard[0]}/{shard[1]}" if isinstance(shard, list) and len(shard) == 2 else "-",
        str(h.step) if h.step >= 0 else "-",
        *_judged_cells(h, metric),
        str(h.rounds),
        f"{h.bytes_sent / 2**20:.2f} MiB",
        "-" if ratio is None else f"{100 * ratio:.1f}%",
        str(h.restarts),
        "yes" if h.pulled_model else "no",
    ]
    if dist:
        cells.append(_fmt(distance, ".3e"))
    return "| " + " | ".join(cells) + " |"


#: Rows of the table of accuracy and distance over time.
TIMELINE_ROWS = 10


def _at(h: NodeHistory, t: float, metric: str = "accuracy") -> str:
    """The node's last evaluation at or before ``t`` as "accuracy / distance" (eval loss for a
    task judged by its loss); "down" between a life that ended (a crash or a stop) and the next
    one."""
    for k in range(len(h.sessions) - 1, -1, -1):
        session = h.sessions[k]
        if session.started > t:
            continue
        if t > session.ended and k < len(h.sessions) - 1:
            return "down"
        evals = [e for e in session.evals if e.time <= t]
        if not evals:
            return "-"
        e = evals[-1]
        distance = "-" if e.distance_rms < 0 else f"{e.distance_rms:.1e}"
        value = e.accuracy if metric == "accuracy" else e.loss
        return f"{_fmt(value, '.3f')} / {distance}"
    return "-"


def _timeline(
    histories: Sequence[NodeHistory], t0: float, t_end: float, metric: str = "accuracy"
) -> list[str]:
    """Every node's accuracy and distance to its neighbours at evenly spaced moments of the run:
    the plots' numbers, for reading and diffing."""
    times = [t0 + (t_end - t0) * (k + 1) / TIMELINE_ROWS for k in range(TIMELINE_ROWS)]
    lines = [
        "| time (s) | " + " | ".join(h.node_id[:8] for h in histories) + " |",
        "|---:|" + "---:|" * len(histories),
    ]
    for t in times:
        lines.append(f"| {t - t0:.0f} | " + " | ".join(_at(h, t, metric) for h in histories) + " |")
    return lines


def _markdown(
    histories: Sequence[NodeHistory],
    checkpoints: Mapping[Path, Checkpoint],
    distances: FinalDistances | None,
    notes: Sequence[str],
) -> str:
    t0 = min(h.first_time for h in histories)
    t_end = max(h.last_time for h in histories)
    began = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t0))
    metric = run_metric(histories)
    header = [
        "node",
        "dir",
        "shard",
        "steps",
        *_judged(metric),
        "rounds",
        "sent",
        "vs fp32",
        "restarts",
        "pulled model",
    ]
    if distances is not None:
        header.append("distance to average (RMS)")
    lines = [
        "# murmur run report",
        "",
        f"{len(histories)} node(s); the logs begin {began} and span {t_end - t0:.0f} s.",
        "",
        "| " + " | ".join(header) + " |",
        "|---|---|---|" + "---:|" * (len(header) - 3),
    ]
    for h in histories:
        distance = distances.rms.get(h.state_dir) if distances else None
        lines.append(_row(h, checkpoints.get(h.state_dir), distance, distances is not None, metric))
    judged = "accuracy" if metric == "accuracy" else "loss"
    lines += [
        "",
        f"- last eval loss and {metric}: the last evaluation in the node's metrics log, on the "
        "task's eval data. A node evaluates while it trains and, once its step budget is spent, "
        "every few seconds while gossip still mixes its model (`--idle-eval-interval`), so "
        f"this is its model at the end of the log; best {judged}: its best evaluation. "
        "Rounds and bytes sent are summed over restarts (a restarted node counts from zero "
        "again); steps are not, since it resumes.",
    ]
    if metric == "perplexity":
        lines.append("- perplexity: exp(eval loss), the loss being the mean cross-entropy in nats.")
    lines += _target_lines(histories, t0, metric)
    if distances is not None:
        lines.append(
            f"- distance to average: RMS over the parameters of x_i - x̄, where x̄ is the "
            f"average of the {len(distances.rms)} checkpoints in the state dirs (the final ones, "
            f"for nodes that stopped cleanly); mean squared distance (1/n) Σ ||x_i - x̄||² = "
            f"{distances.mean_squared:.3e}."
        )
    lines += [f"- {note}" for note in notes]
    lines += ["", "## Loss", "", f"![eval loss per node]({PLOTS_DIR}/loss.png)", ""]
    if metric in ("accuracy", "perplexity"):
        title = metric.capitalize()
        lines += [f"## {title}", "", f"![eval {metric} per node]({PLOTS_DIR}/{metric}.png)", ""]
    lines += [
        "## Distance to the neighbours",
        "",
        DISTANCE_NOTE,
        "",
        f"![distance to the neighbours per node]({PLOTS_DIR}/distance.png)",
        "",
        "## Over time",
        "",
        f"Each node's last evaluation at that moment: {judged.replace('loss', 'eval loss')}"
        " / distance to the neighbours (as plotted above); `down` while a node that restarted "
        "later was not running, `-` before its first evaluation.",
        "",
        *_timeline(histories, t0, t_end, metric),
    ]
    return "\n".join(lines) + "\n"


def run_metric(histories: Sequence[NodeHistory]) -> str:
    """What the run's task is judged by, as its nodes' logs say (the first node's, should they
    disagree: a swarm trains one task)."""
    return histories[0].metric if histories else "accuracy"


def _target_lines(histories: Sequence[NodeHistory], t0: float, metric: str) -> list[str]:
    """When each node's own evaluation first met the task's target, if it declares one."""
    target = histories[0].target
    if target is None:
        return []
    better = ">=" if metric == "accuracy" else "<="

    def reached(e: EvalPoint) -> bool:
        value = e.accuracy if metric == "accuracy" else e.loss
        return value >= target if metric == "accuracy" else value <= target

    times = [next((e.time - t0 for e in h.evals if reached(e)), None) for h in histories]
    got = [t for t in times if t is not None]
    what = "accuracy" if metric == "accuracy" else "eval loss"
    if not got:
        return [f"- target ({what} {better} {target:g}): no node reached it"]
    worst = f"the last at {max(got):.0f} s" if len(got) == len(times) else "not all did"
    return [
        f"- target ({what} {better} {target:g}): {len(got)} of {len(times)} nodes reached it; "
        f"the first at {min(got):.0f} s, {worst} (seconds since the run's first record)"
    ]


def write_report(state_dirs: Sequence[Path], out_dir: Path) -> Path:
    """Plot the run's history and summarise it: ``out_dir/run-report.md``, with
    ``plots/loss.png``, ``plots/distance.png`` and, by the task's metric, ``plots/accuracy.png``
    or ``plots/perplexity.png`` beside it.

    State dirs without a metrics log are skipped, with a line in the report saying so.

    Returns:
        The markdown file's path.

    Raises:
        ValueError: none of the state dirs holds a metrics log with records.
    """
    histories, notes = _read(state_dirs)
    if not histories:
        raise ValueError(
            f"no state dir holds a metrics log ({METRICS_FILE}) with records: "
            + "; ".join(notes or ["no state dirs given"])
        )
    checkpoints, ckpt_notes = _checkpoints(histories)
    notes += ckpt_notes
    distances = None
    if checkpoints:
        try:
            distances = final_distances(checkpoints)
        except ValueError as err:
            notes.append(f"no distance to the average of the final models: {err}")
    else:
        notes.append("no checkpoints in the state dirs: no distance to the final average")
    plots = out_dir / PLOTS_DIR
    plots.mkdir(parents=True, exist_ok=True)
    t0 = min(h.first_time for h in histories)

    def rms(e: EvalPoint) -> float | None:
        return e.distance_rms if e.distance_rms >= 0 else None

    plot_metric(histories, t0, lambda e: e.loss, plots / "loss.png", "Eval loss", "loss", True)
    metric = run_metric(histories)
    if metric == "accuracy":
        plot_metric(
            histories, t0, lambda e: e.accuracy, plots / "accuracy.png", "Eval accuracy", metric
        )
    elif metric == "perplexity":
        plot_metric(
            histories,
            t0,
            lambda e: _perplexity(e.loss),
            plots / "perplexity.png",
            "Eval perplexity (exp of the eval loss)",
            metric,
            True,
        )
    plot_metric(
        histories,
        t0,
        rms,
        plots / "distance.png",
        "Distance to the neighbours (upper bound on the distance to their average)",
        r"RMS of $x_i - \hat{x}_j$, mean over neighbours",
        True,
    )
    path = out_dir / REPORT_FILE
    path.write_text(_markdown(histories, checkpoints, distances, notes))
    return path
