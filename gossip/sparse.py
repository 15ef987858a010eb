"""Sparsifying codecs: top-k, random-k and DCT top-k, each per block of the flat vector.

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
from typing import ClassVar

import numpy as np
import torch

from gossip.codec_base import (
    DEFAULT_FRACTION,
    Codec,
    CodecError,
    Compressed,
    NonFiniteError,
    _blocks,
    _n_blocks,
    _refuse_non_finite,
    tensor_from_bytes,
    tensor_to_bytes,
)
from gossip.encoded import Encoded

__all__ = [
    "SPARSE_CODECS",
    "DctTopKCodec",
    "RandKCodec",
    "SparseCodec",
    "TopKCodec",
    "randk_indices",
]

#: Two-byte indices address blocks of up to this many values.
MAX_SPARSE_BLOCK = 1 << 16
#: The DCT basis is B x B per device; past this it costs more memory than it saves.
MAX_DCT_BLOCK = 1024
_BF16_MAX = torch.finfo(torch.bfloat16).max
_FLOAT32_MAX = torch.finfo(torch.float32).max
_EXACT = (1 << 24) - 1  # float32 holds every integer up to 2^24 exactly
_INT8_LEVELS = 127


def _to_bf16(v: torch.Tensor) -> torch.Tensor:
    """Round to bfloat16, clamped first: float32 values past its max would round to infinity."""
    return v.clamp(-_BF16_MAX, _BF16_MAX).to(torch.bfloat16)


class SparseCodec(Codec):
    """Keeps ``k = round(fraction * block_size)`` entries of each block.

    Args:
        block_size: values per block (a multiple of 8, at most 65536).
        fraction: share of each block sent, in (0, 1]; ``fraction * block_size`` must round to
            at least one value.
    """

    uses_fraction = True
    unbiased = False
    #: Bytes per value sent (indices not counted).
    _value_nbytes: ClassVar[int] = 2
    _max_block: ClassVar[int] = MAX_SPARSE_BLOCK
    _sends_indices: ClassVar[bool] = True

    def __init__(self, block_size: int = 256, fraction: float = DEFAULT_FRACTION) -> None:
        super().__init__(block_size)
        if not (math.isfinite(fraction) and 0 < fraction <= 1):
            raise ValueError(f"fraction must be in (0, 1], got {fraction}")
        if block_size > self._max_block:
            raise ValueError(f"{self.name} blocks hold at most {self._max_block} values")
        k = round(fraction * block_size)
        if k < 1:
            raise ValueError(
                f"fraction {fraction} keeps no value of a block of {block_size}: use a block "
                f"size of at least {math.ceil(0.5 / fraction / 8) * 8} or a larger fraction"
            )
        self.fraction = fraction
        self.k = k
        self._index_nbytes = 1 if block_size <= 256 else 2
        index_nbytes = self._index_nbytes if self._sends_indices else 0
        self.bits = 8 * k * (index_nbytes + self._value_nbytes) / block_size

    @classmethod
    def make(cls, block_size: int, fraction: float) -> Codec:
        return cls(block_size, fraction)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(block_size={self.block_size}, fraction={self.fraction})"

    def data_nbytes(self, numel: int) -> int:
        n = _n_blocks(numel, self.block_size) * self.k
        return n * (self._index_nbytes + self._value_nbytes)

    def scales_nbytes(self, numel: int) -> int:
        return 0

    # -- the operator -------------------------------------------------------------------------

    def compress(self, x: torch.Tensor, generator: torch.Generator | None = None) -> Compressed:
        """Encode a flat float32 vector; the value returned is what :meth:`decode` gives.

        Raises:
            NonFiniteError: ``x`` holds NaN or infinity.
        """
        if x.dim() != 1:
            raise CodecError(f"expected a flat vector, got shape {tuple(x.shape)}")
        x = x.detach().to(torch.float32)
        if x.numel() == 0:
            return Compressed(Encoded(self.name, 0, self.block_size, b"", b""), x.clone())
        _refuse_non_finite(x)
        parts = self._select(_blocks(x, self.block_size), generator)
        scales, data = self._to_bytes(parts)
        encoded = Encoded(self.name, x.numel(), self.block_size, scales, data)
        # The sender decodes what it sends, with the receiver's code: that is its x̂ update.
        return Compressed(encoded, self._synthesize(parts, x.numel()))

    def decode(self, enc: Encoded, device: torch.device | str = "cpu") -> torch.Tensor:
        """Validate an encoding (geometry, indices, values) and decode it on ``device``.

        Raises:
            CodecError: the encoding does not fit this codec, or its contents are out of range.
        """
        self.validate(enc)
        if enc.numel == 0:
            return torch.empty(0, dtype=torch.float32, device=device)
        parts = self._from_bytes(enc, torch.device(device))
        return self._synthesize(parts, enc.numel)

    # -- shared pieces ------------------------------------------------------------------------

    def _indices_to_bytes(self, idx: torch.Tensor) -> bytes:
        if self._index_nbytes == 1:
            return tensor_to_bytes(idx.to(torch.uint8))
        # int16 carries the 16 bits; 32768..65535 map to negatives (a cast would be undefined).
        return tensor_to_bytes(torch.where(idx >= 1 << 15, idx - (1 << 16), idx).to(torch.int16))

    def _indices_from_bytes(self, raw: bytes, nb: int, device: torch.device) -> torch.Tensor:
        """(nb, k) int64 indices, checked: within the block and strictly ascending per block."""
        if self._index_nbytes == 1:
            idx = tensor_from_bytes(raw, torch.uint8, device).to(torch.int64)
        else:
            idx = tensor_from_bytes(raw, torch.int16, device).to(torch.int64) & 0xFFFF
        idx = idx.view(nb, self.k)
        if bool((idx >= self.block_size).any()):
            raise CodecError(f"{self.name} index outside the block of {self.block_size}")
        if self.k > 1 and not bool((idx[:, 1:] > idx[:, :-1]).all()):
            raise CodecError(f"{self.name} indices must be strictly ascending within a block")
        return idx

    def _bf16_to_bytes(self, v: torch.Tensor) -> bytes:
        return tensor_to_bytes(v.view(torch.int16))  # numpy has no bfloat16; the bits are kept

    def _bf16_from_bytes(self, raw: bytes, nb: int, device: torch.device) -> torch.Tensor:
        v = tensor_from_bytes(raw, torch.int16, device).view(torch.bfloat16).view(nb, self.k)
        if not bool(torch.isfinite(v).all()):
            raise NonFiniteError(f"{self.name} payload holds non-finite values")
        return v

    def _scatter(self, idx: torch.Tensor, values: torch.Tensor, numel: int) -> torch.Tensor:
        out = torch.zeros(idx.shape[0], self.block_size, device=idx.device)
        # Exact: distinct indices per block, each value written once, no arithmetic.
        out.scatter_(1, idx, values.to(torch.float32))
        return out.view(-1)[:numel]

    # -- per-codec parts ----------------------------------------------------------------------

    def _select(
        self, xb: torch.Tensor, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, ...]:
        """From blocks (nb, B), the tensors that travel, in their wire dtypes."""
        raise NotImplementedError

    def _to_bytes(self, parts: tuple[torch.Tensor, ...]) -> tuple[bytes, bytes]:
        """(scales, data)."""
        raise NotImplementedError

    def _from_bytes(self, enc: Encoded, device: torch.device) -> tuple[torch.Tensor, ...]:
        """The parts of a validated-length encoding, their values checked."""
        raise NotImplementedError

    def _synthesize(self, parts: tuple[torch.Tensor, ...], numel: int) -> torch.Tensor:
        """The decoded flat float32 vector; both ends run exactly this."""
        raise NotImplementedError


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


#: The sparsifying codecs, for the registry (gossip/codecs.py :data:`CODECS`).
SPARSE_CODECS: tuple[type[Codec], ...] = (TopKCodec, RandKCodec, DctTopKCodec)
