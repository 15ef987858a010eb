"""AdamW under exact averaging: N local AdamWs, averaged after every step, against all-reduce.

    .venv/bin/python -m bench.optimizer_gap [--nodes 8] [--steps 100] [--lr 1e-3]
        [--task text:size=1m,seq_len=64,batch_size=8,warmup=20]
        [--systems all-reduce,local,shared,swarm,quasi-global,tracking,momentum,...]
        [--graph exact|ring]
        [--mix-share 1.0] [--points 1] [--seed 0] [--threads 2] [--json PATH]

How much of the gap between gossip at its best and all-reduce is Adam's second moment (a
node's is of one gradient, all-reduce's of a mean of N)? Node i trains on shard i (the text
task's are non-iid by package unless the spec says ``split=iid``), its batches drawn beforehand
from a generator seeded 100 + i; every system starts from the same model (``--seed``) and sees
the same batches. Warmup (from the spec; 100 if it names none), then cosine to 0.1 of ``--lr``.
AdamW: betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on matrices.

- ``all-reduce``: one model, torch's AdamW on the mean of the nodes' gradients.
- ``local``: a model per node, each with torch's AdamW on its own batch, the models averaged
  exactly after every step: the best that any gossip can do. With ``--graph ring`` (for this
  and the systems below) the models are instead mixed by one synchronous step of fp32 gossip
  on a ring (a third to each neighbour) after every step.
- ``shared``: as ``local``, but every node divides by the root of the nodes' mean second moment
  (each keeps its own moments; the denominator is shared, as if second moments were gossiped).
- ``swarm``: as ``local``, but each node divides by sqrt(m̂² + max(v̂ - m̂², 0) / N), its estimate
  of the second moment of a mean of N gradients.
- ``quasi-global``: as ``local``, with bench/quasi_global.py's AdamW at ``--mix-share``: each
  node's momentum also takes in what the mix moved its model by.
- ``tracking``: gradient tracking: each node also mixes y_i, its running estimate of the mean
  gradient, and its AdamW steps on y_i (under exact averaging, all-reduce itself).
- ``momentum``: as ``local``, with each node's AdamW first moment mixed as the models are
  (``moments``: both moments; ``momentum-floored``: the denominator floored at the mixed first
  moment, as bench/momentum.py does in the simulator).

Printed: the eval loss of the (averaged) model at ``--points`` evenly spaced steps, the end's
against all-reduce's, and each system's wall seconds.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from bench.quasi_global import QuasiGlobalAdamW
from bench.tracking import Tracked, TrackingAdamW
from node.tasks.base import Shard, Task, evaluate, load_task, parse_task_spec
from node.tasks.schedules import decay_groups, warmup_cosine_factor

TASK = "text:size=1m,seq_len=64,batch_size=8,warmup=20"
SYSTEMS = (
    "all-reduce",
    "local",
    "shared",
    "swarm",
    "quasi-global",
    "tracking",
    "momentum",
    "moments",
    "momentum-floored",
)
BETAS = (0.9, 0.95)
EPS = 1e-8
WEIGHT_DECAY = 0.1
Batch = tuple[Tensor, Tensor]
#: (each node's bias-corrected first moment, each node's raw second moment, 1 - β2^t) of one
#: parameter -> each node's denominator.
Denominators = Callable[[list[Tensor], list[Tensor], float], list[Tensor]]


@dataclass(frozen=True)
class Setup:
    tasks: list[Task]  # node i's task, on shard i
    batches: list[list[Batch]]  # batches[step][node]
    lr: float
    warmup: int
    graph: str = "exact"
    mix_share: float = 1.0

    def lr_at(self, step: int) -> float:
        return self.lr * warmup_cosine_factor(step, self.warmup, len(self.batches), 0.1)


def adamw(model: nn.Module, lr: float, mix_share: float | None = None) -> torch.optim.Optimizer:
    """torch's AdamW, or with ``mix_share`` the quasi-global one (bench/quasi_global.py)."""
    groups = decay_groups(model.parameters(), WEIGHT_DECAY)
    if mix_share is None:
        return torch.optim.AdamW(groups, lr=lr, betas=BETAS)
    return QuasiGlobalAdamW(groups, lr=lr, betas=BETAS, eps=EPS, mix_share=mix_share)


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr


def mix(stacked: Tensor, graph: str) -> Tensor:
    """The nodes' tensors (stacked on dim 0) after the mix: their mean (``exact``), or one
    step of gossip on a ring (``ring``: a third to itself and to each neighbour)."""
    if graph == "exact":
        return stacked.mean(0, keepdim=True).expand_as(stacked)
    return (stacked + stacked.roll(1, 0) + stacked.roll(-1, 0)) / 3


def mix_in_place(tensors: Sequence[Tensor], graph: str) -> None:
    """Set each node's tensor to its value after :func:`mix`."""
    for t, x in zip(tensors, mix(torch.stack(list(tensors)), graph), strict=True):
        t.copy_(x)


class AllReduce:
    def __init__(self, setup: Setup) -> None:
        self.model = copy.deepcopy(setup.tasks[0].model)
        self.loss = setup.tasks[0].loss
        self.opt = adamw(self.model, setup.lr)

    def step(self, lr: float, batches: list[Batch]) -> None:
        set_lr(self.opt, lr)
        self.opt.zero_grad()
        for x, y in batches:
            (self.loss(self.model(x), y) / len(batches)).backward()  # type: ignore[no-untyped-call]
        self.opt.step()


class Averaged:
    """A model per node, each stepped on its own batch, then mixed: set to their mean
    (``exact``), or one step of gossip on a ring (``ring``: a third to each neighbour)."""

    def __init__(self, setup: Setup) -> None:
        self.models = [copy.deepcopy(setup.tasks[0].model) for _ in setup.tasks]
        self.loss = setup.tasks[0].loss
        self.graph = setup.graph
        self._mean = copy.deepcopy(setup.tasks[0].model)

    @property
    def model(self) -> nn.Module:
        """The nodes' averaged model."""
        with torch.no_grad():
            for mean, *params in zip(
                self._mean.parameters(), *(m.parameters() for m in self.models), strict=True
            ):
                mean.copy_(torch.stack(params).mean(0))
        return self._mean

    def step(self, lr: float, batches: list[Batch]) -> None:
        for model, (x, y) in zip(self.models, batches, strict=True):
            model.zero_grad()
            self.loss(model(x), y).backward()  # type: ignore[no-untyped-call]
        self.update(lr)
        with torch.no_grad():
            for params in zip(*(m.parameters() for m in self.models), strict=True):
                mix_in_place(params, self.graph)

    def update(self, lr: float) -> None:
        raise NotImplementedError


class Local(Averaged):
    def __init__(self, setup: Setup, mix_share: float | None = None) -> None:
        super().__init__(setup)
        self.opts = [adamw(m, setup.lr, mix_share) for m in self.models]

    def update(self, lr: float) -> None:
        for opt in self.opts:
            set_lr(opt, lr)
            opt.step()


class Tracking(Local):
    """``local`` with gradient tracking (bench/tracking.py): each model carries its tracker of
    the mean gradient, which the mix mixes with it, and its AdamW steps on that."""

    def __init__(self, setup: Setup) -> None:
        Averaged.__init__(self, setup)  # not Local's: its optimizers are torch's AdamW
        tracked = [Tracked(m) for m in self.models]
        self.models = list(tracked)
        self._mean = Tracked(self._mean)
        self.opts = [TrackingAdamW(m, WEIGHT_DECAY, lr=setup.lr, betas=BETAS) for m in tracked]


class Pooled(Averaged):
    """AdamW with each node's moments its own and its denominator from all nodes' moments."""

    def __init__(self, setup: Setup, denominators: Denominators) -> None:
        super().__init__(setup)
        self.denominators = denominators
        self.params = [list(m.parameters()) for m in self.models]
        self.decay = [WEIGHT_DECAY if p.dim() >= 2 else 0.0 for p in self.params[0]]
        self.m = [[torch.zeros_like(p) for p in ps] for ps in self.params]
        self.v = [[torch.zeros_like(p) for p in ps] for ps in self.params]
        self.t = 0

    @torch.no_grad()
    def update(self, lr: float) -> None:
        b1, b2 = BETAS
        self.t += 1
        for ps, ms, vs in zip(self.params, self.m, self.v, strict=True):
            for p, m, v in zip(ps, ms, vs, strict=True):
                grad = p.grad
                assert grad is not None
                m.lerp_(grad, 1 - b1)
                v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        for k, decay in enumerate(self.decay):
            m_hats = [ms[k] / (1 - b1**self.t) for ms in self.m]
            dens = self.denominators(m_hats, [vs[k] for vs in self.v], 1 - b2**self.t)
            for ps, m_hat, den in zip(self.params, m_hats, dens, strict=True):
                ps[k].mul_(1 - lr * decay)
                ps[k].addcdiv_(m_hat, den, value=-lr)


def shared_denominators(m_hats: list[Tensor], vs: list[Tensor], c2: float) -> list[Tensor]:
    den = (torch.stack(vs).mean(0) / c2).sqrt_().add_(EPS)
    return [den] * len(vs)


def swarm_denominators(m_hats: list[Tensor], vs: list[Tensor], c2: float) -> list[Tensor]:
    dens = []
    for m_hat, v in zip(m_hats, vs, strict=True):
        m2 = m_hat * m_hat
        var = (v / c2 - m2).clamp_(min=0)
        dens.append((m2 + var / len(vs)).sqrt_().add_(EPS))
    return dens


def own_denominators(m_hats: list[Tensor], vs: list[Tensor], c2: float) -> list[Tensor]:
    return [(v / c2).sqrt().add_(EPS) for v in vs]


def floored_denominators(m_hats: list[Tensor], vs: list[Tensor], c2: float) -> list[Tensor]:
    """Each node's own, floored at its (mixed) first moment, as bench/momentum.py does."""
    pairs = zip(m_hats, vs, strict=True)
    return [torch.maximum((v / c2).sqrt(), m.abs()).add_(EPS) for m, v in pairs]


class Moments(Pooled):
    """AdamW with each node's own denominator, whose moments (``m`` and, with ``second``,
    ``v``) the mix mixes as it mixes the models: as if the optimizer's state were gossiped."""

    def __init__(self, setup: Setup, second: bool, floor: bool = False) -> None:
        super().__init__(setup, floored_denominators if floor else own_denominators)
        self.second = second

    def step(self, lr: float, batches: list[Batch]) -> None:
        super().step(lr, batches)
        with torch.no_grad():
            for states in (self.m, self.v) if self.second else (self.m,):
                for tensors in zip(*states, strict=True):
                    mix_in_place(tensors, self.graph)


MAKERS: dict[str, Callable[[Setup], AllReduce | Averaged]] = {
    "all-reduce": AllReduce,
    "local": Local,
    "shared": lambda setup: Pooled(setup, shared_denominators),
    "swarm": lambda setup: Pooled(setup, swarm_denominators),
    "quasi-global": lambda setup: Local(setup, mix_share=setup.mix_share),
    "tracking": Tracking,
    "momentum": lambda setup: Moments(setup, second=False),
    "moments": lambda setup: Moments(setup, second=True),
    "momentum-floored": lambda setup: Moments(setup, second=False, floor=True),
}


def draw(task: Task, gen: torch.Generator) -> Batch:
    idx = torch.randint(len(task.train), (task.batch_size,), generator=gen)  # type: ignore[arg-type]
    xs, ys = zip(*(task.train[j] for j in idx.tolist()), strict=True)
    return torch.stack(xs), torch.stack(ys)


def make_setup(args: argparse.Namespace) -> Setup:
    factory = load_task(args.task)
    torch.manual_seed(args.seed)  # the initial model: node 0's
    tasks = [factory(Shard(i, args.nodes)) for i in range(args.nodes)]
    gens = [torch.Generator().manual_seed(100 + i) for i in range(args.nodes)]
    batches = [[draw(t, g) for t, g in zip(tasks, gens, strict=True)] for _ in range(args.steps)]
    warmup = int(parse_task_spec(args.task)[1].get("warmup", 100))
    return Setup(tasks, batches, args.lr, warmup, args.graph, args.mix_share)


def eval_loss(setup: Setup, model: nn.Module) -> float:
    task, cpu = setup.tasks[0], torch.device("cpu")
    return evaluate(model, task.eval, task.loss, cpu, task.eval_batch_size, top1=False)[0]


def warm_up(setup: Setup) -> None:
    """An untimed step and evaluation: the first system would pay torch's one-time costs."""
    system = AllReduce(setup)
    system.step(setup.lr_at(0), setup.batches[0])
    eval_loss(setup, system.model)


def run(name: str, setup: Setup, marks: Sequence[int]) -> dict[str, Any]:
    started = time.perf_counter()
    system = MAKERS[name](setup)
    curve = []
    for step, batches in enumerate(setup.batches):
        system.step(setup.lr_at(step), batches)
        if step + 1 in marks:
            curve.append((step + 1, eval_loss(setup, system.model)))
    seconds = time.perf_counter() - started
    print(f"  {name}: {curve[-1][1]:.4f} ({seconds:.0f} s)", flush=True)
    return {"system": name, "loss": curve[-1][1], "curve": curve, "wall_s": seconds}


def table(results: list[dict[str, Any]], marks: Sequence[int]) -> str:
    base = next((r["loss"] for r in results if r["system"] == "all-reduce"), None)
    losses = " | ".join(f"step {s}" for s in marks) if len(marks) > 1 else "eval loss"
    lines = [
        f"| system | {losses} | vs all-reduce | wall s |",
        "|---|" + "---:|" * (len(marks) + 2),
    ]
    for r in results:
        versus = f"{100 * (r['loss'] / base - 1):+.2f}%" if base else "-"
        cells = " | ".join(f"{loss:.4f}" for _, loss in r["curve"])
        lines.append(f"| {r['system']} | {cells} | {versus} | {r['wall_s']:.0f} |")
    return "\n".join(lines)


def systems(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = set(names) - set(SYSTEMS)
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"systems are {', '.join(SYSTEMS)}; got {text!r}")
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default=TASK)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--systems", type=systems, default=list(SYSTEMS))
    parser.add_argument("--points", type=int, default=1, help="evaluations along the run")
    parser.add_argument("--graph", choices=("exact", "ring"), default="exact")
    parser.add_argument("--mix-share", type=float, default=1.0, help="quasi-global's")
    parser.add_argument("--seed", type=int, default=0, help="seeds the initial model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    points = max(1, min(args.points, args.steps))
    marks = sorted({round(args.steps * k / points) for k in range(1, points + 1)})
    setup = make_setup(args)
    warm_up(setup)
    title = f"{args.task}, {args.nodes} nodes, {args.steps} steps, lr {args.lr:g}"
    print(title, flush=True)
    results = [run(name, setup, marks) for name in args.systems]
    print(f"\n{table(results, marks)}")
    if args.json:
        info = {k: v for k, v in vars(args).items() if k != "json"}
        args.json.write_text(json.dumps({"args": info, "results": results}, indent=1))


if __name__ == "__main__":
    main()
