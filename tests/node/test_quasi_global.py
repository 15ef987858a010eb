"""bench/quasi_global.py's optimizer: what bench/RESULTS.md says of it holds (share 0 is
torch's AdamW, to rounding; a move between steps is replayed in the next step, a share of it
times β1), and its task factory builds the text task with it."""

from __future__ import annotations

import torch

from bench.quasi_global import QuasiGlobalAdamW, make_task
from node.tasks.base import Shard

LR, B1 = 1e-2, 0.9


def pair(share: float) -> tuple[torch.nn.Parameter, QuasiGlobalAdamW]:
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(6, 4))
    return w, QuasiGlobalAdamW([w], lr=LR, betas=(B1, 0.95), weight_decay=0.1, mix_share=share)


def test_at_share_zero_it_is_torchs_adamw_whatever_moves_the_model() -> None:
    w, opt = pair(0.0)
    twin = torch.nn.Parameter(w.detach().clone())
    adamw = torch.optim.AdamW([twin], lr=LR, betas=(B1, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(1)
    for _ in range(6):
        grad = torch.randn(6, 4, generator=gen)
        w.grad, twin.grad = grad.clone(), grad.clone()
        opt.step()
        adamw.step()
        move = torch.randn(6, 4, generator=gen) * 1e-2  # what a mix would add
        with torch.no_grad():
            w.add_(move)
            twin.add_(move)
    assert torch.allclose(w, twin, rtol=1e-6, atol=1e-7), (w - twin).abs().max()


def test_a_move_between_steps_is_replayed_by_a_share_of_beta1_in_the_next_step() -> None:
    share, t = 0.5, 5
    runs = []
    for moved in (False, True):
        w, opt = pair(share)
        for _ in range(t):
            w.grad = torch.ones_like(w)  # so that AdamW's denominator stays 1
            opt.step()
        move = torch.full_like(w, 1e-3) if moved else torch.zeros_like(w)
        with torch.no_grad():
            w.add_(move)
        before = w.detach().clone()
        w.grad = torch.ones_like(w)
        opt.step()
        runs.append(before - w.detach())  # the second step's own move, decay included
    replay = runs[0] - runs[1]
    # A move of +1e-3 after step t is replayed in step t + 1 as a further share·β1·1e-3, less
    # the change of the first moment's bias correction; decay moves it back by lr·wd·1e-3.
    bias = (1 - B1**t) / (1 - B1 ** (t + 1))
    expected = torch.full_like(replay, share * B1 * bias * 1e-3 - LR * 0.1 * 1e-3)
    assert torch.allclose(replay, expected, rtol=1e-3, atol=1e-9), (replay, expected)


def test_the_task_factory_trains_the_text_task_with_it() -> None:
    task = make_task(Shard(0, 2), size="1m", seq_len=16, batch_size=2, mix_share=0.3)
    opt = task.make_optimizer()
    assert isinstance(opt, QuasiGlobalAdamW)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    assert all(g["mix_share"] == 0.3 for g in opt.param_groups)
