"""A byte-level GPT on the standard library's sources, sharded by package; judged by loss.

The model is GPT-2's shape (Radford et al. 2019) at small sizes: token and position
embeddings, pre-norm transformer blocks with causal self-attention and a GELU MLP of 4x the
width, a final LayerNorm and an (untied) output layer over the 256 byte values, initialised as
GPT-2 is (normal with std 0.02, zero biases). The blocks are ``torch.nn.TransformerEncoderLayer``
with a causal mask: torch's own, well-kept implementation (its attention is
``scaled_dot_product_attention``), so the default install needs nothing more.
``transformers``' GPT-2 would bring the same model with a tokenizer stack, a hub client and
several seconds of import per node process, none of which a byte-level model uses.

Sizes (``--task text:size=10m``; parameters counted at ``seq_len`` 128):

| size | width | layers | heads | parameters | eval loss target |
|---|---:|---:|---:|---:|---:|
| 1m | 128 | 5 | 4 | 1.07M | 2.0 |
| 3m | 192 | 6 | 6 | 2.79M | 1.8 |
| 10m | 320 | 8 | 5 | 10.1M | 1.6 |
| 25m | 512 | 8 | 8 | 25.6M | 1.5 |

Training is AdamW (weight decay 0.1 on matrices) with linear warmup then cosine decay over the
node's step budget, batches of 16 windows of ``seq_len`` bytes. The loss is the mean
cross-entropy per byte in nats (perplexity is its exp; ln 256 = 5.55 is a uniform guess).
Evaluation is on ``eval_windows`` windows at fixed offsets of the held-out files, the same on
every node; each node trains on its own packages' files (``node/tasks/stdlib_text.py``), or,
with ``split=iid``, on every count-th 4 KiB block of all of them. ``--alpha`` does not apply.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812
from torch.utils.data import Dataset, TensorDataset

from node.tasks.base import Shard, Task
from node.tasks.schedules import adamw, warmup_cosine
from node.tasks.stdlib_text import load_corpus

__all__ = ["SIZES", "ByteWindows", "GPTConfig", "TinyGPT", "lm_loss", "make_task"]

VOCAB = 256
#: With ``split=iid``, shard i gets every count-th block of this many bytes of the whole corpus.
IID_BLOCK = 4096


@dataclass(frozen=True)
class GPTConfig:
    seq_len: int = 128
    width: int = 128
    layers: int = 5
    heads: int = 4
    #: The eval loss (nats per byte) counted as reached.
    target: float = 2.0


SIZES = {
    "1m": GPTConfig(width=128, layers=5, heads=4, target=2.0),
    "3m": GPTConfig(width=192, layers=6, heads=6, target=1.8),
    "10m": GPTConfig(width=320, layers=8, heads=5, target=1.6),
    "25m": GPTConfig(width=512, layers=8, heads=8, target=1.5),
}


class TinyGPT(nn.Module):
    """(batch, time) bytes as int64 -> (batch, time, 256) logits of the next byte."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        if cfg.width % cfg.heads:
            raise ValueError(f"width {cfg.width} is not a multiple of heads {cfg.heads}")
        self.seq_len = cfg.seq_len
        self.tokens = nn.Embedding(VOCAB, cfg.width)
        self.positions = nn.Embedding(cfg.seq_len, cfg.width)
        block = nn.TransformerEncoderLayer(
            cfg.width,
            cfg.heads,
            4 * cfg.width,
            dropout=0.0,  # small models on a few MB of text: the schedule, not dropout
            activation="gelu",
            batch_first=True,
            norm_first=True,
        )
        self.blocks = nn.TransformerEncoder(
            block, cfg.layers, norm=nn.LayerNorm(cfg.width), enable_nested_tensor=False
        )
        self.head = nn.Linear(cfg.width, VOCAB, bias=False)
        self.mask: torch.Tensor  # (seq_len, seq_len): 0 on and below the diagonal, -inf above
        mask = nn.Transformer.generate_square_subsequent_mask(cfg.seq_len)
        self.register_buffer("mask", mask, persistent=False)
        self._init_like_gpt2()

    def _init_like_gpt2(self) -> None:
        # TransformerEncoder deep-copies one block: without this every layer would start alike.
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
            else:
                nn.init.ones_(p)  # LayerNorm gains

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.seq_len:
            raise ValueError(f"a window of {t} bytes is longer than seq_len {self.seq_len}")
        pos = torch.arange(t, device=idx.device)
        x = self.tokens(idx) + self.positions(pos)  # (batch, time, width)
        mask = self.mask[:t, :t]
        x = self.blocks(x, mask=mask, is_causal=True)
        logits: torch.Tensor = self.head(x)
        return logits  # (batch, time, 256)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy per byte: logits (batch, time, 256), targets (batch, time)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class ByteWindows(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Windows of ``seq_len`` bytes of ``data`` (uint8) every ``seq_len`` bytes, each with the
    window one byte later as its target. Holds the bytes once, not the windows."""

    def __init__(self, data: torch.Tensor, seq_len: int) -> None:
        if len(data) <= seq_len:
            raise ValueError(f"{len(data)} bytes do not make one window of {seq_len}")
        self.data = data
        self.seq_len = seq_len

    def __len__(self) -> int:
        return (len(self.data) - 1) // self.seq_len

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = i * self.seq_len
        chunk = self.data[start : start + self.seq_len + 1].long()
        return chunk[:-1], chunk[1:]


def _bytes(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _eval_set(held_out: torch.Tensor, seq_len: int, windows: int) -> TensorDataset:
    """``windows`` windows at evenly spaced offsets of the held-out bytes (the same anywhere)."""
    last = len(held_out) - seq_len - 1
    starts = torch.linspace(0, last, windows).long()
    chunks = torch.stack([held_out[s : s + seq_len + 1].long() for s in starts.tolist()])
    return TensorDataset(chunks[:, :-1].contiguous(), chunks[:, 1:].contiguous())


def make_task(
    shard: Shard,
    size: str = "1m",
    seq_len: int = 128,
    batch_size: int = 16,
    lr: float = 1e-3,
    warmup: int = 100,
    eval_windows: int = 64,
    split: str = "package",
    target: float = math.nan,
) -> Task:
    """Options: ``size`` (1m, 3m, 10m, 25m), ``seq_len`` (128), ``batch_size`` (16), AdamW's
    ``lr`` (1e-3) and ``warmup`` steps (100), ``eval_windows`` (64), ``split`` (``package``:
    non-iid by package; ``iid``: every count-th 4 KiB block of the corpus), and the
    ``target`` eval loss (by size).
    """
    if size not in SIZES:
        raise ValueError(f"text: unknown size {size!r}; known: {', '.join(SIZES)}")
    if split not in ("package", "iid"):
        raise ValueError(f"text: split must be package or iid, got {split!r}")
    base = SIZES[size]
    cfg = GPTConfig(seq_len, base.width, base.layers, base.heads, base.target)
    corpus = load_corpus()
    if split == "package":
        train = _bytes(corpus.shard_text(shard.index, shard.count))
    else:  # every count-th block of the whole text: all kinds, in equal shares
        everything = _bytes(corpus.all_training_text())
        usable = len(everything) // IID_BLOCK * IID_BLOCK
        blocks = everything[:usable].view(-1, IID_BLOCK)  # (blocks, IID_BLOCK)
        train = blocks[shard.index :: shard.count].reshape(-1).clone()
    return Task(
        model=TinyGPT(cfg),
        train=ByteWindows(train, seq_len),
        eval=_eval_set(_bytes(corpus.held_out_text()), seq_len, eval_windows),
        loss=lm_loss,
        batch_size=batch_size,
        optimizer=adamw(lr=lr, weight_decay=0.1),
        schedule=warmup_cosine(warmup=warmup, min_ratio=0.1),
        metric="perplexity",
        target=cfg.target if math.isnan(target) else target,
        eval_batch_size=16,
    )
