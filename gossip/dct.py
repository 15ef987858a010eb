"""The DCT top-k sparsifying codec (dct-topk), DeMo's chunked DCT on each block.

Its wire layout is in :mod:`gossip.sparse`, beside those of top-k and random-k; what it shares
with them is :class:`gossip.sparse_base.SparseCodec`.

dct-topk is DeMo's transform (Peng et al. 2024, §3: chunked DCT, top-k coefficients) applied
to the gossiped delta: an orthonormal DCT-II of each block, the k largest coefficients kept.
A float inverse DCT would not give the same bits on a CPU and a GPU, and the replicas must be
bit-identical to the sender's public copy, so the synthesis is exact instead: the coefficients
travel as int8 codes with a block scale, the basis is rounded to integers of at most R, and
decoding sums k products code * basis in float32, where every partial sum is an integer below
2^24 and hence exact in any order, then multiplies once by the block's scale. The sender's x̂
moves by that same decoded value, so the small difference from the true inverse DCT is fed back.
"""

from __future__ import annotations

import math

import torch

from gossip.codec_base import (
    DEFAULT_FRACTION,
    CodecError,
    NonFiniteError,
    _n_blocks,
    tensor_from_bytes,
    tensor_to_bytes,
)
from gossip.encoded import Encoded
from gossip.sparse_base import SparseCodec

__all__ = ["DctTopKCodec", "dct_basis"]

#: The DCT basis is B x B per device; past this it costs more memory than it saves.
MAX_DCT_BLOCK = 1024
_FLOAT32_MAX = torch.finfo(torch.float32).max
_EXACT = (1 << 24) - 1  # float32 holds every integer up to 2^24 exactly
_INT8_LEVELS = 127


def dct_basis(block_size: int) -> torch.Tensor:
    """The orthonormal DCT-II matrix (B, B) in float64: row u is frequency u."""
    n = torch.arange(block_size, dtype=torch.float64)
    u = n[:, None]
    basis = torch.cos(math.pi * (2 * n[None, :] + 1) * u / (2 * block_size))
    basis *= math.sqrt(2 / block_size)
    basis[0] /= math.sqrt(2)
    return basis


class DctTopKCodec(SparseCodec):
    """DeMo's chunked DCT top-k (Peng, Quesnelle and Kingma 2024, §3) on the delta.

    Each block is transformed by the orthonormal DCT-II, its k largest coefficients are kept
    and sent as int8 codes (round to nearest) with one float32 scale per block; decoding is the
    exact integer synthesis the module docstring describes.
    """

    name = "dct-topk"
    _value_nbytes = 1
    _max_block = MAX_DCT_BLOCK

    def __init__(self, block_size: int = 256, fraction: float = DEFAULT_FRACTION) -> None:
        super().__init__(block_size, fraction)
        # Largest integer basis entry such that k terms of 127 * R stay exact in float32.
        self.basis_max = min(1 << 15, _EXACT // (_INT8_LEVELS * self.k))
        if self.basis_max < 1 << 9:
            most = _EXACT // (_INT8_LEVELS << 9)
            raise ValueError(f"dct-topk keeps at most {most} values a block")
        basis = dct_basis(block_size)  # (B, B) float64
        # x = basis.T @ c ≈ int_basis.T @ c / gain; the gain folds into the block scale.
        self._gain = self.basis_max / float(basis.abs().max())
        #: The synthesis basis (B, B): the DCT-II rounded to integers of at most ``basis_max``.
        self.int_basis = torch.round(basis * self._gain)
        self._basis: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        # The largest float32 scale with which no decoded value overflows.
        terms = _INT8_LEVELS * self.basis_max * self.k
        largest = torch.tensor(_FLOAT32_MAX / terms)  # float32, perhaps rounded up
        if float(largest) * terms > _FLOAT32_MAX:
            largest = torch.nextafter(largest, torch.tensor(0.0))
        self._max_scale = float(largest)

    def scales_nbytes(self, numel: int) -> int:
        return 4 * _n_blocks(numel, self.block_size)

    def _bases(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(the float32 DCT-II for analysis, the integer basis for synthesis) on ``device``."""
        if device not in self._basis:
            self._basis[device] = (
                dct_basis(self.block_size).to(device=device, dtype=torch.float32),
                self.int_basis.to(device=device, dtype=torch.float32),
            )
        return self._basis[device]

    def _select(
        self, xb: torch.Tensor, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, ...]:
        analysis, _ = self._bases(xb.device)
        absmax = xb.abs().amax(dim=1)  # (nb,)
        # Normalized blocks, so that no coefficient overflows float32.
        coef = (xb / torch.where(absmax > 0, absmax, 1.0)[:, None]) @ analysis.T  # (nb, B)
        idx = coef.abs().topk(self.k, dim=1, sorted=False).indices.sort(dim=1).values  # (nb, k)
        kept = coef.gather(1, idx)
        cmax = kept.abs().amax(dim=1)
        codes = torch.round(kept * (_INT8_LEVELS / torch.where(cmax > 0, cmax, 1.0))[:, None])
        codes = codes.clamp_(-_INT8_LEVELS, _INT8_LEVELS).to(torch.int8)
        # One code step is absmax * cmax / 127 of the coefficient, / gain of the integer basis.
        scales = absmax * (cmax / (_INT8_LEVELS * self._gain))
        scales = scales.clamp_(max=self._max_scale)  # the rest is fed back
        return idx, codes, scales.to(torch.float32)

    def _to_bytes(self, parts: tuple[torch.Tensor, ...]) -> tuple[bytes, bytes]:
        idx, codes, scales = parts
        return tensor_to_bytes(scales), self._indices_to_bytes(idx) + tensor_to_bytes(codes)

    def _from_bytes(self, enc: Encoded, device: torch.device) -> tuple[torch.Tensor, ...]:
        nb = _n_blocks(enc.numel, self.block_size)
        cut = nb * self.k * self._index_nbytes
        idx = self._indices_from_bytes(enc.data[:cut], nb, device)
        codes = tensor_from_bytes(enc.data[cut:], torch.int8, device).view(nb, self.k)
        if bool((codes == -128).any()):
            raise CodecError("dct-topk codes hold -128, outside the levels [-127, 127]")
        scales = tensor_from_bytes(enc.scales, torch.float32, device)
        if not bool(torch.isfinite(scales).all()):
            raise NonFiniteError("dct-topk block scales hold non-finite values")
        if not bool((scales >= 0).all()):
            raise CodecError("dct-topk block scales must be non-negative")
        if float(scales.max()) > self._max_scale:
            raise NonFiniteError("a dct-topk block scale is so large that decoding would overflow")
        return idx, codes, scales

    def _synthesize(self, parts: tuple[torch.Tensor, ...], numel: int) -> torch.Tensor:
        idx, codes, scales = parts
        _, basis = self._bases(idx.device)
        out = torch.zeros(idx.shape[0], self.block_size, device=idx.device)  # (nb, B)
        rows = torch.empty_like(out)
        # Elementwise, not a matmul (which TF32 or a BLAS may round): each term is an integer
        # below 127 * R and each partial sum one below 2^24, so the sum is exact in any order,
        # on any device.
        for j in range(self.k):
            torch.index_select(basis, 0, idx[:, j], out=rows)
            out.addcmul_(rows, codes[:, j, None].to(torch.float32))
        out.mul_(scales[:, None])
        return out.view(-1)[:numel]
