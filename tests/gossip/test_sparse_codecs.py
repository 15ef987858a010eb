"""Sparse codecs (topk, randk, dct-topk): layouts, round trips, contraction, bad input."""

from __future__ import annotations

import dataclasses
import math
import struct

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gossip.codecs import CODECS, CodecError, Encoded, NonFiniteError, get_codec
from gossip.sparse import DctTopKCodec, SparseCodec, dct_basis, randk_indices

SPARSE = ["topk", "randk", "dct-topk"]

sizes = st.integers(min_value=0, max_value=2500)
block_sizes = st.sampled_from([8, 16, 64, 256, 1024, 2048])
fractions = st.sampled_from([0.01, 0.05, 0.125, 0.3, 1.0])
seeds = st.integers(min_value=0, max_value=2**31 - 1)
scales = st.sampled_from([1e-30, 1e-8, 1e-3, 1.0, 1e3, 1e20, 3e38])


def _vector(n: int, seed: int, scale: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g) * scale).clamp(-3e38, 3e38)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _codec(name: str, block: int, fraction: float) -> SparseCodec:
    """The codec, or a hypothesis rejection of settings it refuses (tested on their own below)."""
    assume(round(fraction * block) >= 1)
    assume(name != "dct-topk" or block <= 1024)
    assume(name != "dct-topk" or round(fraction * block) <= 258)
    codec = get_codec(name, block, fraction)
    assert isinstance(codec, SparseCodec)
    return codec


def test_the_registry_knows_them() -> None:
    assert set(SPARSE) <= set(CODECS)
    assert all(CODECS[name].uses_fraction for name in SPARSE)
    assert not any(CODECS[name].uses_fraction for name in ("fp32", "int8", "sign"))


@pytest.mark.parametrize("name", SPARSE)
@settings(max_examples=40, deadline=None)
@given(n=sizes, block=block_sizes, fraction=fractions, seed=seeds, scale=scales)
def test_round_trip_is_bit_exact_and_sized_as_documented(
    name: str, n: int, block: int, fraction: float, seed: int, scale: float
) -> None:
    codec = _codec(name, block, fraction)
    x = _vector(n, seed, scale)
    compressed = codec.compress(x, _gen(seed))
    enc = compressed.encoded
    assert (enc.codec, enc.numel, enc.block_size) == (name, n, block)
    assert enc.nbytes == codec.encoded_nbytes(n)
    decoded = codec.decode(enc)
    assert decoded.shape == (n,)
    assert decoded.dtype == torch.float32
    assert bool(torch.isfinite(decoded).all())
    # What the sender adds to its public copy is bit-identical to what any receiver decodes.
    assert torch.equal(decoded, compressed.value)


@pytest.mark.parametrize(
    ("name", "block", "fraction", "per_block"),
    [
        ("topk", 256, 0.01, 3 * (1 + 2)),  # 3 one-byte indices and 3 bfloat16 values
        ("topk", 1024, 0.01, 10 * (2 + 2)),  # two-byte indices past 256
        ("randk", 256, 0.01, 3 * 2),  # values only (plus one 8-byte seed a message)
        ("dct-topk", 256, 0.01, 4 + 3 * (1 + 1)),  # a scale, 3 indices and 3 int8 codes
        ("dct-topk", 64, 0.0625, 4 + 4 * (1 + 1)),
    ],
)
def test_sizes_on_the_wire(name: str, block: int, fraction: float, per_block: int) -> None:
    n = 100 * block
    enc = get_codec(name, block, fraction).encode(torch.randn(n), _gen(0))
    seed = 8 if name == "randk" else 0
    assert enc.nbytes == 100 * per_block + seed


@pytest.mark.parametrize("name", ["topk", "dct-topk"])
@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 2500), block=block_sizes, fraction=fractions, seed=seeds)
def test_top_k_is_contractive_per_block(
    name: str, n: int, block: int, fraction: float, seed: int
) -> None:
    """||x - C(x)||² <= (1 - k/B) ||x||² per block, plus the value rounding: what CHOCO needs."""
    codec = _codec(name, block, fraction)
    x = _vector(n, seed, 1.0).double()
    y = codec.compress(x.float(), _gen(seed)).value.double()
    # bfloat16 values err by 2^-9 relative; int8 codes and the integer basis by about 1%.
    slack = 2.0**-16 if name == "topk" else 0.02
    for xb, yb in zip(torch.split(x, block), torch.split(y, block), strict=True):
        kept = codec.k / block  # a zero-padded last block keeps at least as much
        bound = (1 - kept + slack) * float(xb.pow(2).sum())
        assert float((xb - yb).pow(2).sum()) <= bound + 1e-300


def test_top_k_keeps_the_largest_magnitudes_of_each_block() -> None:
    x = torch.tensor([0.1, -5.0, 0.2, 3.0, 0.0, 0.3, -0.4, 1.0, 1, 2, -9, 4, 0, 0, 0, 8.0])
    y = get_codec("topk", 8, 0.25).compress(x).value
    want = torch.zeros(16)
    want[[1, 3, 10, 15]] = x[[1, 3, 10, 15]]
    assert torch.equal(y, want)


def test_dct_top_k_keeps_a_cosine_that_top_k_spreads_over_the_block() -> None:
    wave = dct_basis(64)[5].float() * 3.0  # one frequency: a single DCT coefficient
    dct = get_codec("dct-topk", 64, 1 / 64).compress(wave).value
    top = get_codec("topk", 64, 1 / 64).compress(wave).value
    assert float((dct - wave).norm()) < 0.01 * float(wave.norm())
    assert float((top - wave).norm()) > 0.9 * float(wave.norm())


def _splitmix64_offsets(seed: int, n_blocks: int, block: int) -> list[int]:
    """SplitMix64 on Python integers: an independent statement of what randk_indices draws."""
    mask = (1 << 64) - 1
    out = []
    for b in range(1, n_blocks + 1):
        z = (seed + b * 0x9E3779B97F4A7C15) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        out.append((z ^ (z >> 31)) % block)
    return out


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**64 - 1),
    n_blocks=st.integers(1, 50),
    block=st.sampled_from([8, 256, 1000, 4096]),
    k=st.integers(1, 8),
)
def test_random_k_indices_follow_from_the_seed_alone(
    seed: int, n_blocks: int, block: int, k: int
) -> None:
    idx = randk_indices(seed, n_blocks, block, k)
    offsets = _splitmix64_offsets(seed, n_blocks, block)
    want = [[(o + j * block // k) % block for j in range(k)] for o in offsets]
    assert idx.tolist() == want
    assert all(len(set(row)) == k for row in want)


def test_random_k_keeps_every_position_equally_often() -> None:
    codec = get_codec("randk", 64, 4 / 64)
    x = torch.ones(128)
    gen = _gen(3)
    draws = 2000
    counts = sum(
        ((codec.compress(x, gen).value != 0).double() for _ in range(draws)), torch.zeros(128)
    )
    p = 4 / 64
    sigma = math.sqrt(draws * p * (1 - p))
    assert bool(((counts - draws * p).abs() <= 5 * sigma).all())
    assert float(counts.sum()) == draws * 8  # exactly k of each block every time


def test_dct_decoding_is_the_exact_integer_synthesis() -> None:
    """Decoding equals an int64 computation from the documented layout, bit for bit."""
    block, fraction, n = 64, 0.125, 64 * 7 + 5
    codec = get_codec("dct-topk", block, fraction)
    assert isinstance(codec, DctTopKCodec)
    enc = codec.encode(torch.randn(n, generator=_gen(4)))
    nb, k = 8, 8
    idx = np.frombuffer(enc.data[: nb * k], dtype=np.uint8).reshape(nb, k).astype(np.int64)
    codes = np.frombuffer(enc.data[nb * k :], dtype=np.int8).reshape(nb, k).astype(np.int64)
    scales = np.frombuffer(enc.scales, dtype="<f4")
    basis = codec.int_basis.numpy().astype(np.int64)  # (B, B) integers
    assert int(np.abs(basis).max()) == codec.basis_max
    sums = np.einsum("bk,bkn->bn", codes, basis[idx])  # exact in int64
    assert int(np.abs(sums).max()) < 2**24  # so exact in float32 as well
    want = (sums.astype(np.float32) * scales[:, None]).reshape(-1)[:n]
    assert np.array_equal(codec.decode(enc).numpy(), want)


@pytest.mark.parametrize("name", SPARSE)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_input_is_refused(name: str, bad: float) -> None:
    x = torch.randn(300)
    x[123] = bad
    with pytest.raises(NonFiniteError, match="index 123"):
        get_codec(name, 64, 0.1).encode(x)


@pytest.mark.parametrize(
    ("name", "block", "fraction", "message"),
    [
        ("topk", 256, 0.0, r"in \(0, 1\]"),
        ("topk", 256, 1.5, r"in \(0, 1\]"),
        ("randk", 256, math.nan, r"in \(0, 1\]"),
        ("topk", 256, 0.001, "block size of at least 504"),
        ("topk", 1 << 17, 0.01, "at most 65536"),
        ("dct-topk", 2048, 0.01, "at most 1024"),
        ("dct-topk", 1024, 0.5, "at most 258 values"),
        ("randk", 12, 0.5, "multiple of 8"),
    ],
)
def test_settings_it_cannot_use_are_refused(
    name: str, block: int, fraction: float, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        get_codec(name, block, fraction)


def _valid(name: str, n: int = 300, block: int = 64, fraction: float = 0.125) -> Encoded:
    return get_codec(name, block, fraction).encode(torch.randn(n, generator=_gen(0)), _gen(1))


@pytest.mark.parametrize("name", SPARSE)
def test_mismatched_geometry_is_refused(name: str) -> None:
    codec = get_codec(name, 64, 0.125)
    enc = _valid(name)
    other = "topk" if name != "topk" else "randk"
    bad = [
        dataclasses.replace(enc, codec=other),
        dataclasses.replace(enc, block_size=128),
        dataclasses.replace(enc, data=enc.data[:-1]),
        dataclasses.replace(enc, data=enc.data + b"\0"),
        dataclasses.replace(enc, numel=enc.numel + 1000),
        dataclasses.replace(enc, scales=enc.scales + b"\0\0\0\0"),
        _valid(name, fraction=0.25),  # a sender with another fraction: more values per block
    ]
    for b in bad:
        with pytest.raises(CodecError):
            codec.decode(b)


def _with_index(enc: Encoded, position: int, value: bytes) -> Encoded:
    data = bytearray(enc.data)
    data[position : position + len(value)] = value
    return dataclasses.replace(enc, data=bytes(data))


@pytest.mark.parametrize("name", ["topk", "dct-topk"])
def test_indices_out_of_the_block_or_out_of_order_are_refused(name: str) -> None:
    codec = get_codec(name, 64, 0.125)  # 8 one-byte indices per block
    enc = _valid(name)
    first = list(enc.data[:8])
    with pytest.raises(CodecError, match="outside the block"):
        codec.decode(_with_index(enc, 7, bytes([64])))
    with pytest.raises(CodecError, match="strictly ascending"):
        codec.decode(_with_index(enc, 0, bytes(first[1:2])))  # a duplicate
    with pytest.raises(CodecError, match="strictly ascending"):
        codec.decode(_with_index(enc, 0, bytes(first[::-1])))
    wide = get_codec(name, 512 if name == "topk" else 1024, 0.01)
    enc = wide.encode(torch.randn(3000))
    with pytest.raises(CodecError, match="outside the block"):  # two-byte indices
        wide.decode(_with_index(enc, 0, struct.pack("<H", wide.block_size)))


@pytest.mark.parametrize("name", ["topk", "randk"])
@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_values_are_refused(name: str, bad: float) -> None:
    enc = _valid(name)
    raw = torch.tensor([bad]).to(torch.bfloat16).view(torch.int16).numpy().tobytes()
    with pytest.raises(NonFiniteError):
        get_codec(name, 64, 0.125).decode(_with_index(enc, len(enc.data) - 2, raw))


@pytest.mark.parametrize(
    ("scale", "error", "message"),
    [
        (math.nan, NonFiniteError, "non-finite"),
        (-1.0, CodecError, "non-negative"),
        (3e38, NonFiniteError, "overflow"),
    ],
)
def test_bad_dct_scales_are_refused(scale: float, error: type[Exception], message: str) -> None:
    enc = _valid("dct-topk")
    scales = struct.pack("<f", scale) + enc.scales[4:]
    with pytest.raises(error, match=message):
        get_codec("dct-topk", 64, 0.125).decode(dataclasses.replace(enc, scales=scales))


def test_dct_codes_outside_the_levels_are_refused() -> None:
    enc = _valid("dct-topk")
    with pytest.raises(CodecError, match="-128"):
        get_codec("dct-topk", 64, 0.125).decode(_with_index(enc, len(enc.data) - 1, b"\x80"))


@pytest.mark.parametrize("name", SPARSE)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_random_bytes_of_the_right_length_decode_finite_or_are_refused(
    name: str, data: st.DataObject
) -> None:
    codec = get_codec(name, 16, 0.25)
    n = data.draw(st.integers(1, 200))
    raw = data.draw(st.binary(min_size=codec.data_nbytes(n), max_size=codec.data_nbytes(n)))
    sc = data.draw(st.binary(min_size=codec.scales_nbytes(n), max_size=codec.scales_nbytes(n)))
    try:
        out = codec.decode(Encoded(name, n, 16, sc, raw))
    except CodecError:
        return
    assert out.shape == (n,)
    assert bool(torch.isfinite(out).all())
