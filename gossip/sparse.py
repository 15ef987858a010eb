"""Sparsifying codecs: top-k and random-k here, DCT top-k in :mod:`gossip.dct`; each per block.

Each keeps k = round(fraction * B) values (or DCT coefficients) of every block of B and sends
them as indices within the block plus values. With the public copy x̂ of
:class:`gossip.replicas.GossipState` they are CHOCO-SGD's sparsified gossip (Koloskova et al.
2019, §5: top-1% on ResNet-20), with the error feedback that makes a biased operator work: what
a round does not send stays in x - x̂ and is sent later. All three are contractive in the sense
CHOCO needs, ``E||C(x) - x||^2 <= (1 - k/B) ||x||^2`` per block.

Layouts (n values, block size B, nb = ceil(n / B) blocks zero-padded to nb * B, k per block;
an index is one byte when B <= 256, else two, little-endian; all arrays block after block):

========  ==================  ==========================================================
codec     scales              data
========  ==================  ==========================================================
topk      none                nb*k indices, ascending per block; nb*k bfloat16 values
randk     none                a uint64 seed; nb*k bfloat16 values at indices it derives
dct-topk  nb float32          nb*k coefficient indices, ascending per block; nb*k int8 codes
========  ==================  ==========================================================

Why these encodings: at 1% of a block of 256, choosing 3 of 256 positions carries
log2(C(256, 3)) / 3 = 7.1 bits an index, so a byte is close to the entropy (about log2(e / f)
bits for a fraction f) and needs no variable-length decoding. Values are bfloat16, float32's
range with 8 significant bits: no per-block scale (4 bytes per block, more than the 3 values it
would serve), nothing overflows or flushes to zero, and the rounding error is fed back like the
rest. random-k sends no indices at all: both ends derive them from the seed with integer
arithmetic that is the same on every platform (``randk_indices``).

dct-topk, DeMo's transform with an exact integer synthesis, is in :mod:`gossip.dct`, and what
the three share (:class:`SparseCodec`) in :mod:`gossip.sparse_base`; both are re-exported here,
with :data:`SPARSE_CODECS` for the registry.
"""

from __future__ import annotations

import numpy as np
import torch

from gossip.codec_base import Codec, _n_blocks, tensor_to_bytes
from gossip.dct import DctTopKCodec, dct_basis
from gossip.encoded import Encoded
from gossip.sparse_base import SparseCodec

__all__ = [
    "SPARSE_CODECS",
    "DctTopKCodec",
    "RandKCodec",
    "SparseCodec",
    "TopKCodec",
    "dct_basis",
    "randk_indices",
]

_BF16_MAX = torch.finfo(torch.bfloat16).max


def _to_bf16(v: torch.Tensor) -> torch.Tensor:
    """Round to bfloat16, clamped first: float32 values past its max would round to infinity."""
    return v.clamp(-_BF16_MAX, _BF16_MAX).to(torch.bfloat16)


class TopKCodec(SparseCodec):
    """The k largest magnitudes of each block (Stich et al. 2018; CHOCO-SGD's top-k)."""

    name = "topk"

    def _select(
        self, xb: torch.Tensor, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, ...]:
        idx = xb.abs().topk(self.k, dim=1, sorted=False).indices.sort(dim=1).values  # (nb, k)
        return idx, _to_bf16(xb.gather(1, idx))

    def _to_bytes(self, parts: tuple[torch.Tensor, ...]) -> tuple[bytes, bytes]:
        idx, values = parts
        return b"", self._indices_to_bytes(idx) + self._bf16_to_bytes(values)

    def _from_bytes(self, enc: Encoded, device: torch.device) -> tuple[torch.Tensor, ...]:
        nb = _n_blocks(enc.numel, self.block_size)
        cut = nb * self.k * self._index_nbytes
        return (
            self._indices_from_bytes(enc.data[:cut], nb, device),
            self._bf16_from_bytes(enc.data[cut:], nb, device),
        )

    def _synthesize(self, parts: tuple[torch.Tensor, ...], numel: int) -> torch.Tensor:
        idx, values = parts
        return self._scatter(idx, values, numel)


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_SEED_NBYTES = 8


def randk_indices(seed: int, n_blocks: int, block_size: int, k: int) -> torch.Tensor:
    """The (n_blocks, k) positions random-k keeps, from ``seed``: the same on every platform.

    Block b keeps the k positions ``(o_b + floor(j * B / k)) mod B`` for j < k, with the
    offset o_b drawn by SplitMix64 (Steele et al. 2014) of the seed and b: every position is
    kept with probability k / B, which is all the contraction bound asks of random-k, and the
    whole draw is n_blocks integer hashes (uint64 numpy arrays wrap by definition).
    """
    z = np.uint64(seed) + (np.arange(1, n_blocks + 1, dtype=np.uint64) * _GOLDEN)
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    z = z ^ (z >> np.uint64(31))
    offsets = (z % np.uint64(block_size)).astype(np.int64)
    steps = np.arange(k, dtype=np.int64) * block_size // k
    return torch.from_numpy((offsets[:, None] + steps[None, :]) % block_size)


class RandKCodec(SparseCodec):
    """k positions of each block drawn from a seed that travels instead of the indices.

    Not scaled by B / k: CHOCO needs a contraction, and the scaled (unbiased) random-k is not
    one (its variance is (B / k - 1) ||x||^2).
    """

    name = "randk"
    _sends_indices = False

    def data_nbytes(self, numel: int) -> int:
        if numel == 0:
            return 0
        return _SEED_NBYTES + _n_blocks(numel, self.block_size) * self.k * self._value_nbytes

    def _select(
        self, xb: torch.Tensor, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, ...]:
        device = generator.device if generator is not None else torch.device("cpu")
        seed = torch.randint(0, 1 << 62, (), generator=generator, device=device)
        seed_t = seed.to(device="cpu", dtype=torch.int64).view(1)
        idx = randk_indices(int(seed_t), xb.shape[0], self.block_size, self.k).to(xb.device)
        return idx, _to_bf16(xb.gather(1, idx)), seed_t

    def _to_bytes(self, parts: tuple[torch.Tensor, ...]) -> tuple[bytes, bytes]:
        _, values, seed = parts
        return b"", tensor_to_bytes(seed) + self._bf16_to_bytes(values)

    def _from_bytes(self, enc: Encoded, device: torch.device) -> tuple[torch.Tensor, ...]:
        nb = _n_blocks(enc.numel, self.block_size)
        seed = int.from_bytes(enc.data[:_SEED_NBYTES], "little")  # any 64 bits are a seed
        idx = randk_indices(seed, nb, self.block_size, self.k).to(device)
        return idx, self._bf16_from_bytes(enc.data[_SEED_NBYTES:], nb, device)

    def _synthesize(self, parts: tuple[torch.Tensor, ...], numel: int) -> torch.Tensor:
        return self._scatter(parts[0], parts[1], numel)


#: The sparsifying codecs, for the registry (gossip/codecs.py :data:`CODECS`).
SPARSE_CODECS: tuple[type[Codec], ...] = (TopKCodec, RandKCodec, DctTopKCodec)
