"""What the sparsifying codecs share: :class:`SparseCodec`, which keeps k values of each block.

It holds the geometry (k, the index width, the bits per value), the index and bfloat16 encodings
and the compress and decode frame; a subclass chooses what travels and how it decodes
(``_select``, ``_to_bytes``, ``_from_bytes``, ``_synthesize``). The codecs and their wire layouts
are in :mod:`gossip.sparse` (top-k, random-k) and :mod:`gossip.dct` (DCT top-k).
"""

from __future__ import annotations

import math
from typing import ClassVar

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

__all__ = ["SparseCodec"]

#: Two-byte indices address blocks of up to this many values.
MAX_SPARSE_BLOCK = 1 << 16


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
