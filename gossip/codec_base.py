"""What every codec shares (gossip/codecs.py, gossip/sparse.py): the :class:`Codec` base, its
errors, the block helpers and the byte conversions. :mod:`gossip.codecs` re-exports the public
names and holds the registry."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from gossip.encoded import Encoded

__all__ = [
    "DEFAULT_FRACTION",
    "Codec",
    "CodecError",
    "Compressed",
    "NonFiniteError",
    "all_finite",
    "tensor_from_bytes",
    "tensor_to_bytes",
]


#: Share of each block the sparse codecs send: CHOCO-SGD's top-1% (91.73% against all-reduce's
#: 92.64% on ResNet-20/CIFAR-10, Koloskova et al. 2019, §5), where an index fits a byte.
DEFAULT_FRACTION = 0.01


class CodecError(ValueError):
    """An encoded tensor that does not match its codec's layout, or input a codec refuses."""


class NonFiniteError(CodecError):
    """The input holds NaN or infinity; nothing was encoded."""


@dataclass(frozen=True)
class Compressed:
    """What the sender keeps: the encoding and its decoded value (on the input's device)."""

    encoded: Encoded
    value: torch.Tensor


def tensor_to_bytes(t: torch.Tensor) -> bytes:
    """Raw little-endian bytes of a tensor (moved to the host first)."""
    return t.detach().contiguous().cpu().numpy().tobytes()


def tensor_from_bytes(
    data: bytes | bytearray | memoryview, dtype: torch.dtype, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """A writable tensor holding a copy of ``data`` interpreted as ``dtype``."""
    # torch refuses read-only buffers (with a warning); a bytearray is one copy and writable.
    t = torch.frombuffer(bytearray(data), dtype=dtype) if len(data) else torch.empty(0, dtype=dtype)
    return t.to(device)


_FLOAT32_MAX = torch.finfo(torch.float32).max


def _n_blocks(numel: int, block_size: int) -> int:
    return max(1, math.ceil(numel / block_size)) if numel else 0


def _blocks(x: torch.Tensor, block_size: int) -> torch.Tensor:
    """Zero-pad a flat vector to whole blocks; returns shape (n_blocks, block_size)."""
    nb = _n_blocks(x.numel(), block_size)
    pad = nb * block_size - x.numel()
    if pad:
        x = torch.cat([x, x.new_zeros(pad)])
    return x.view(nb, block_size)


def all_finite(t: torch.Tensor) -> bool:
    """Whether every value of a floating tensor is finite.

    A sum is finite only if every term is (NaN and infinity carry through it, and an infinity
    met by its opposite makes NaN), so one reduction answers for nearly every tensor, where
    ``isfinite(t).all()`` writes a mask of its size first (20 times the time for a model of a
    million values). A sum that overflows on finite values is checked value by value.
    """
    wide = torch.float32 if t.dtype in (torch.float16, torch.bfloat16) else None
    return math.isfinite(float(t.sum(dtype=wide))) or bool(torch.isfinite(t).all())


def _refuse_non_finite(x: torch.Tensor) -> None:
    """Raise NonFiniteError naming the first bad value, if ``x`` holds any."""
    if all_finite(x):
        return
    finite = torch.isfinite(x)
    if not bool(finite.all()):
        bad = (~finite).nonzero()
        raise NonFiniteError(
            f"refusing to encode a tensor with {bad.numel()} non-finite value(s), "
            f"the first at index {int(bad[0])}"
        )


def _stochastic_round(v: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Round to floor(v) or floor(v) + 1, up with probability v - floor(v): unbiased.

    Not floor(v + u): in float32, v + u rounds to the next integer when u is within half an ulp
    of 1, which lifts exact integers (1024 + 0.99999994 == 1025.0).
    """
    low = torch.floor(v)
    u = torch.rand(v.shape, generator=generator, device=v.device, dtype=v.dtype)
    return low.add_(u.lt_(v - low))  # u becomes 1.0 where it is below the fraction, else 0.0


def _block_absmax(xb: torch.Tensor) -> torch.Tensor:
    """Each row's largest |value| (NaN if it holds one): from its max and min, without the
    tensor of absolute values (a seventh of the time)."""
    return torch.maximum(xb.amax(dim=1), xb.amin(dim=1).neg()).abs()  # abs: no -0.0 scale


class Codec:
    """A compression operator with per-block scales.

    Args:
        block_size: values per scale; a multiple of 8 so that int4 and sign pack whole bytes.
    """

    name: ClassVar[str]
    #: Payload bits per value, scales not counted (indices counted, for a sparse codec).
    bits: float
    #: Whether E[decode(encode(x))] = x.
    unbiased: ClassVar[bool]
    _code_dtype: ClassVar[torch.dtype]
    _values_per_code: ClassVar[int] = 1
    _has_scales: ClassVar[bool] = True
    #: Whether the codec takes a ``fraction`` (the sparse codecs of gossip/sparse.py).
    uses_fraction: ClassVar[bool] = False
    #: Share of the values sent; 0.0 for a dense codec, which has no such setting.
    fraction: float = 0.0

    def __init__(self, block_size: int = 256) -> None:
        if block_size <= 0 or block_size % 8:
            raise ValueError(f"block_size must be a positive multiple of 8, got {block_size}")
        self.block_size = block_size

    @classmethod
    def make(cls, block_size: int, fraction: float) -> Codec:
        """This codec with these settings; a dense codec has no use for ``fraction``."""
        return cls(block_size)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(block_size={self.block_size})"

    # -- sizes --------------------------------------------------------------------------------

    def _n_codes(self, numel: int) -> int:
        return _n_blocks(numel, self.block_size) * self.block_size // self._values_per_code

    def data_nbytes(self, numel: int) -> int:
        return self._n_codes(numel) * self._code_dtype.itemsize

    def scales_nbytes(self, numel: int) -> int:
        return 4 * _n_blocks(numel, self.block_size) if self._has_scales else 0

    def encoded_nbytes(self, numel: int) -> int:
        """Bytes of payload and scales for a vector of ``numel`` values."""
        return self.data_nbytes(numel) + self.scales_nbytes(numel)

    # -- the operator -------------------------------------------------------------------------

    def compress(self, x: torch.Tensor, generator: torch.Generator | None = None) -> Compressed:
        """Encode a flat float32 vector; also return the decoded value on ``x``'s device.

        Raises:
            NonFiniteError: ``x`` holds NaN or infinity.
        """
        if x.dim() != 1:
            raise CodecError(f"expected a flat vector, got shape {tuple(x.shape)}")
        x = x.detach().to(torch.float32)
        if x.numel() == 0:
            empty = Encoded(self.name, 0, self.block_size, b"", b"")
            return Compressed(empty, x.clone())
        if not self._has_scales:
            _refuse_non_finite(x)
        codes, scales = self._quantize(x, generator)
        if self._has_scales and not bool(torch.isfinite(scales).all()):
            # A block's scale (its max or mean of |x|) is finite iff all its values are: this
            # costs one pass over the scales instead of one over the whole vector.
            _refuse_non_finite(x)
        encoded = Encoded(
            codec=self.name,
            numel=x.numel(),
            block_size=self.block_size,
            scales=tensor_to_bytes(scales) if self._has_scales else b"",
            data=tensor_to_bytes(codes),
        )
        return Compressed(encoded, self._dequantize(codes, scales, x.numel()))

    def encode(self, x: torch.Tensor, generator: torch.Generator | None = None) -> Encoded:
        return self.compress(x, generator).encoded

    def decode(self, enc: Encoded, device: torch.device | str = "cpu") -> torch.Tensor:
        """Validate an encoding (see :meth:`validate`) and decode it to float32 on ``device``."""
        self.validate(enc)
        if enc.numel == 0:
            return torch.empty(0, dtype=torch.float32, device=device)
        codes = tensor_from_bytes(enc.data, self._code_dtype, device)
        scales = tensor_from_bytes(enc.scales, torch.float32, device)
        self._validate_values(codes, scales)
        return self._dequantize(codes, scales, enc.numel)

    def validate(self, enc: Encoded) -> None:
        """Check an encoding's geometry against this codec without decoding it.

        Raises:
            CodecError: another codec, another block size, or byte lengths that do not match.
        """
        if enc.codec != self.name:
            raise CodecError(f"codec mismatch: expected {self.name!r}, got {enc.codec!r}")
        if enc.block_size != self.block_size:
            raise CodecError(
                f"block size mismatch: expected {self.block_size}, got {enc.block_size}"
            )
        if enc.numel < 0:
            raise CodecError(f"negative numel {enc.numel}")
        want_data, want_scales = self.data_nbytes(enc.numel), self.scales_nbytes(enc.numel)
        if len(enc.data) != want_data:
            raise CodecError(
                f"{self.name} payload for {enc.numel} values must be {want_data} bytes, "
                f"got {len(enc.data)}"
            )
        if len(enc.scales) != want_scales:
            raise CodecError(
                f"{self.name} needs {want_scales // 4} block scales for {enc.numel} values "
                f"(block size {self.block_size}), got {len(enc.scales) / 4:g}"
            )

    #: The largest |code| a payload may hold; scales above float32's max over it would overflow.
    _max_code: ClassVar[float] = 1.0

    def _validate_values(self, codes: torch.Tensor, scales: torch.Tensor) -> None:
        if not bool(torch.isfinite(scales).all()):
            raise NonFiniteError("block scales hold non-finite values")
        if not bool((scales >= 0).all()):
            raise CodecError("block scales must be non-negative")
        if scales.numel() and float(scales.max()) > _FLOAT32_MAX / self._max_code:
            raise NonFiniteError("a block scale is so large that decoding would overflow")

    # -- per-codec parts ----------------------------------------------------------------------

    def _quantize(
        self, x: torch.Tensor, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (codes in the wire dtype, scales float32 of shape (n_blocks,))."""
        raise NotImplementedError

    def _dequantize(self, codes: torch.Tensor, scales: torch.Tensor, numel: int) -> torch.Tensor:
        raise NotImplementedError
