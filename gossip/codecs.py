"""Compression operators Q for model deltas, with compact byte layouts.

Every codec maps a flat float32 vector to an :class:`Encoded` (payload bytes plus one float32
scale per block) and back. Quantization runs on the device the vector lives on; only the final
bytes cross to the host. The sender keeps the decoded value that :meth:`Codec.compress` returns,
which is bit-identical to what a receiver gets from :meth:`Codec.decode`: both are made by the same
dequantization of the same codes, which is what keeps replicas bit-identical to the sender's
public copy.

Layouts (n values, block size B, nb = ceil(n / B) blocks, values zero-padded to nb * B):

========  ===================================  ==========================================
codec     scales (nb float32, little-endian)   data
========  ===================================  ==========================================
fp32      none                                 n float32 (exact; alias ``none``)
fp16      block absmax                         nb*B float16 of x / scale
int8      block absmax / 127                   nb*B int8 in [-127, 127]
int4      block absmax / 7                     nb*B/2 bytes; value + 8 in [1, 15], low nibble first
sign      block mean |x|                       nb*B/8 bytes; bit k of byte j is x[8j+k] >= 0
========  ===================================  ==========================================

fp16, int8 and int4 round stochastically, so ``E[decode(encode(x))] = x`` (unbiased). The
1-bit codec is the scaled sign of Karimireddy et al. (2019), biased but contractive
(``||C(x) - x||^2 <= (1 - 1/B) ||x||^2`` per block), which CHOCO-SGD (Koloskova et al. 2019, §3)
admits: its error feedback makes up for the bias.

The sparsifying codecs (topk, randk, dct-topk) are in :mod:`gossip.sparse` and take a
``fraction`` as well as a block size; :data:`CODECS` holds them all. What every codec shares is
in :mod:`gossip.codec_base`.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from gossip.codec_base import (
    DEFAULT_FRACTION,
    Codec,
    CodecError,
    Compressed,
    NonFiniteError,
    _block_absmax,
    _blocks,
    _stochastic_round,
    all_finite,
    tensor_from_bytes,
    tensor_to_bytes,
)
from gossip.encoded import Encoded
from gossip.sparse import SPARSE_CODECS

__all__ = [
    "AUTO_CODECS",
    "CODECS",
    "DEFAULT_FRACTION",
    "AutoCodec",
    "Codec",
    "CodecError",
    "Compressed",
    "Encoded",
    "NonFiniteError",
    "all_finite",
    "get_codec",
    "tensor_from_bytes",
    "tensor_to_bytes",
]


class Fp32Codec(Codec):
    name = "fp32"
    bits = 32.0
    unbiased = True
    _code_dtype = torch.float32
    _has_scales = False

    def data_nbytes(self, numel: int) -> int:
        return 4 * numel

    def _quantize(
        self, x: torch.Tensor, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return x, x.new_empty(0)

    def _dequantize(self, codes: torch.Tensor, scales: torch.Tensor, numel: int) -> torch.Tensor:
        return codes.clone()

    def _validate_values(self, codes: torch.Tensor, scales: torch.Tensor) -> None:
        if not all_finite(codes):
            raise NonFiniteError("fp32 payload holds non-finite values")


_FP16_MANTISSA_BITS = 10
_FP16_MIN_NORMAL = 2.0**-14
_FLOAT32_EXPONENT_MASK = 0x7F800000


class Fp16Codec(Codec):
    name = "fp16"
    bits = 16.0
    unbiased = True
    _code_dtype = torch.float16

    def _quantize(
        self, x: torch.Tensor, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        xb = _blocks(x, self.block_size)  # (n_blocks, block_size)
        scales = _block_absmax(xb)
        v = xb / torch.where(scales > 0, scales, 1.0)[:, None]  # |v| <= 1
        # Spacing of float16 around v: 2^(floor(log2 |v|) - 10), and 2^-24 below 2^-14 where
        # float16 turns subnormal. Masking the float32 mantissa away leaves 2^floor(log2 |v|).
        power = (v.view(torch.int32) & _FLOAT32_EXPONENT_MASK).view(torch.float32)
        ulp = torch.clamp(power, min=_FP16_MIN_NORMAL) * 2.0**-_FP16_MANTISSA_BITS
        # v / ulp is exact (power of two), so this is stochastic rounding to the fp16 grid.
        rounded = _stochastic_round(v / ulp, generator) * ulp
        return rounded.to(torch.float16).view(-1), scales

    def _dequantize(self, codes: torch.Tensor, scales: torch.Tensor, numel: int) -> torch.Tensor:
        v = codes.view(-1, self.block_size).to(torch.float32)
        return (v * scales[:, None]).view(-1)[:numel]

    def _validate_values(self, codes: torch.Tensor, scales: torch.Tensor) -> None:
        super()._validate_values(codes, scales)
        if not all_finite(codes):
            raise NonFiniteError("fp16 payload holds non-finite values")
        if not bool((codes.abs() <= 1).all()):
            raise CodecError("fp16 payload values must lie in [-1, 1]")


#: Lookup tables of the packed codecs, row b for byte b: sign's eight signs (+1 for a set bit,
#: -1 for a clear one, lowest bit first), int4's two levels (low nibble first, each less 8).
#: Decoding is one gather of rows and the scales in place: a fifth of the time of unpacking
#: with masks (1.1M values: 0.7 ms against 3.6 ms for sign).
_SIGNS = ((torch.arange(256)[:, None] >> torch.arange(8)) & 1).to(torch.float32) * 2 - 1
_NIBBLES = ((torch.arange(256)[:, None] >> torch.tensor([0, 4])) & 0x0F).to(torch.float32) - 8
_TABLES_ON: dict[tuple[int, torch.device], torch.Tensor] = {}


def _table_on(table: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``table`` on ``device`` (copied there once)."""
    key = (id(table), device)
    found = _TABLES_ON.get(key)
    if found is None:
        found = _TABLES_ON[key] = table.to(device)
    return found


class _IntCodec(Codec):
    """Symmetric integer levels [-L, L] with scale absmax / L and stochastic rounding."""

    levels: ClassVar[int]

    def _int_levels(
        self, x: torch.Tensor, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        xb = _blocks(x, self.block_size)  # (n_blocks, block_size)
        scales = _block_absmax(xb) / self.levels
        v = xb / torch.where(scales > 0, scales, 1.0)[:, None]
        q = _stochastic_round(v, generator).clamp_(-self.levels, self.levels)
        return q.to(torch.int8).view(-1), scales

    def _from_levels(self, q: torch.Tensor, scales: torch.Tensor, numel: int) -> torch.Tensor:
        v = q.view(-1, self.block_size).to(torch.float32)
        return (v * scales[:, None]).view(-1)[:numel]


class Int8Codec(_IntCodec):
    name = "int8"
    bits = 8.0
    unbiased = True
    levels = 127
    _max_code = 127.0
    _code_dtype = torch.int8

    def _quantize(
        self, x: torch.Tensor, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self._int_levels(x, generator)

    def _dequantize(self, codes: torch.Tensor, scales: torch.Tensor, numel: int) -> torch.Tensor:
        return self._from_levels(codes, scales, numel)

    def _validate_values(self, codes: torch.Tensor, scales: torch.Tensor) -> None:
        super()._validate_values(codes, scales)
        if bool((codes == -128).any()):
            raise CodecError("int8 payload holds -128, outside the levels [-127, 127]")


class Int4Codec(_IntCodec):
    name = "int4"
    bits = 4.0
    unbiased = True
    levels = 7
    _max_code = 7.0
    _code_dtype = torch.uint8
    _values_per_code = 2

    def _quantize(
        self, x: torch.Tensor, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        q, scales = self._int_levels(x, generator)
        nibbles = (q + 8).to(torch.uint8).view(-1, 2)  # (n_codes, 2): value + 8 in [1, 15]
        return nibbles[:, 0] | (nibbles[:, 1] << 4), scales

    def _dequantize(self, codes: torch.Tensor, scales: torch.Tensor, numel: int) -> torch.Tensor:
        levels = _table_on(_NIBBLES, codes.device).index_select(0, codes.to(torch.int32))
        return levels.view(-1, self.block_size).mul_(scales[:, None]).view(-1)[:numel]

    def _validate_values(self, codes: torch.Tensor, scales: torch.Tensor) -> None:
        super()._validate_values(codes, scales)
        if bool(((codes & 0x0F) == 0).any() | ((codes >> 4) == 0).any()):
            raise CodecError("int4 payload holds nibble 0 (-8), outside the levels [-7, 7]")


class SignCodec(Codec):
    name = "sign"
    bits = 1.0
    unbiased = False
    _code_dtype = torch.uint8
    _values_per_code = 8

    def _quantize(
        self, x: torch.Tensor, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # Only the last block is padded: a padded copy of the whole model (what _blocks makes)
        # was a third of sign's encode in a profiled node. Padding is zeros: its bits are ones.
        bs = self.block_size
        whole = x.numel() // bs * bs
        # Mean |x| over the real values only: padding must not shrink the last block's scale.
        scales = [x[:whole].view(-1, bs).abs().sum(dim=1) / bs]
        signs = [x[:whole] >= 0]
        if whole < x.numel():
            last = _blocks(x[whole:], bs)  # (1, block_size)
            scales.append(last.abs().sum(dim=1) / (x.numel() - whole))
            signs.append(last.view(-1) >= 0)
        bits = (torch.cat(signs) if len(signs) > 1 else signs[0]).view(-1, 8).view(torch.uint8)
        codes = bits[:, 0].clone()
        for k in range(1, 8):  # value j of a code is its bit j
            codes |= bits[:, k] << k
        return codes, torch.cat(scales)

    def _dequantize(self, codes: torch.Tensor, scales: torch.Tensor, numel: int) -> torch.Tensor:
        signs = _table_on(_SIGNS, codes.device).index_select(0, codes.to(torch.int32))
        return signs.view(-1, self.block_size).mul_(scales[:, None]).view(-1)[:numel]


_DENSE: tuple[type[Codec], ...] = (Fp32Codec, Fp16Codec, Int8Codec, Int4Codec, SignCodec)
CODECS: dict[str, type[Codec]] = {cls.name: cls for cls in (*_DENSE, *SPARSE_CODECS)}
_ALIASES = {"none": "fp32"}


#: What ``--compress auto`` chooses among (fp32 brings nothing over fp16 at twice its bytes).
AUTO_CODECS = ("fp16", "int8", "int4", "sign")


class AutoCodec(Codec):
    """``auto``: each link sends with a codec of its own, chosen from :data:`AUTO_CODECS` by
    gossip/codec_choice.py; every delta names its codec, so a receiver decodes each with the one
    it names and a link changes codec without a snapshot (the copy x̂_ij and its replica move by
    the same decoded values whatever codec made them).

    Used directly (a node without a copy per link, a size estimate), it is its ``initial``.
    """

    name = "auto"
    unbiased = False

    def __init__(self, block_size: int = 256, initial: str = "sign") -> None:
        super().__init__(block_size)
        self.members: dict[str, Codec] = {c: CODECS[c](block_size) for c in AUTO_CODECS}
        if initial not in self.members:
            raise ValueError(f"auto starts from one of {', '.join(AUTO_CODECS)}, not {initial!r}")
        self.initial = self.members[initial]
        self.bits = self.initial.bits

    def member(self, name: str) -> Codec:
        """The codec ``name`` of the set.

        Raises:
            CodecError: a codec auto does not choose.
        """
        found = self.members.get(name)
        if found is None:
            raise CodecError(f"auto sends {', '.join(AUTO_CODECS)}; got {name!r}")
        return found

    def data_nbytes(self, numel: int) -> int:
        return self.initial.data_nbytes(numel)

    def scales_nbytes(self, numel: int) -> int:
        return self.initial.scales_nbytes(numel)

    def compress(self, x: torch.Tensor, generator: torch.Generator | None = None) -> Compressed:
        return self.initial.compress(x, generator)

    def decode(self, enc: Encoded, device: torch.device | str = "cpu") -> torch.Tensor:
        return self.member(enc.codec).decode(enc, device)

    def validate(self, enc: Encoded) -> None:
        self.member(enc.codec).validate(enc)


def get_codec(name: str, block_size: int = 256, fraction: float = DEFAULT_FRACTION) -> Codec:
    """The codec called ``name`` (fp32 or none, fp16, int8, int4, sign, topk, randk, dct-topk,
    or auto: :class:`AutoCodec`).

    ``fraction`` is the share of each block a sparse codec sends; the others ignore it.

    Raises:
        ValueError: an unknown name, or settings the codec cannot use.
    """
    key = _ALIASES.get(name, name)
    if key == AutoCodec.name:
        return AutoCodec(block_size)
    if key not in CODECS:
        known = ", ".join(sorted([*CODECS, *_ALIASES, AutoCodec.name]))
        raise ValueError(f"unknown codec {name!r}; known: {known}")
    return CODECS[key].make(block_size, fraction)
