"""Dense codecs: layouts, round trips, error bounds, unbiasedness, refusal of bad input.

The sparse codecs (topk, randk, dct-topk) have theirs in test_sparse_codecs.py.
"""

from __future__ import annotations

import dataclasses
import math
import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gossip.codecs import CODECS, CodecError, Encoded, NonFiniteError, all_finite, get_codec

ALL = sorted(name for name, codec in CODECS.items() if not codec.uses_fraction)
LOSSY_UNBIASED = ["fp16", "int8", "int4"]

sizes = st.integers(min_value=0, max_value=2500)
block_sizes = st.sampled_from([8, 16, 64, 256, 1024])
seeds = st.integers(min_value=0, max_value=2**31 - 1)
scales = st.sampled_from([1e-30, 1e-8, 1e-3, 1.0, 1e3, 1e20])


def _vector(n: int, seed: int, scale: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g) * scale


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("name", ALL)
@settings(max_examples=40, deadline=None)
@given(n=sizes, block=block_sizes, seed=seeds, scale=scales)
def test_round_trip_is_bit_exact_and_sized_as_documented(
    name: str, n: int, block: int, seed: int, scale: float
) -> None:
    codec = get_codec(name, block)
    x = _vector(n, seed, scale)
    compressed = codec.compress(x, _gen(seed))
    enc = compressed.encoded
    assert enc.numel == n
    assert enc.nbytes == codec.encoded_nbytes(n)
    decoded = codec.decode(enc)
    assert decoded.shape == (n,)
    assert decoded.dtype == torch.float32
    # What the sender keeps is bit-identical to what any receiver decodes.
    assert torch.equal(decoded, compressed.value)


@pytest.mark.parametrize(
    ("name", "bits_per_value"), [("fp32", 32), ("fp16", 16), ("int8", 8), ("int4", 4), ("sign", 1)]
)
def test_payload_packs_values_densely(name: str, bits_per_value: int) -> None:
    n, block = 4096, 256
    enc = get_codec(name, block).encode(torch.randn(n))
    assert len(enc.data) == n * bits_per_value // 8
    assert len(enc.scales) == (0 if name == "fp32" else 4 * n // block)


@settings(max_examples=40, deadline=None)
@given(n=sizes, seed=seeds, scale=scales)
def test_fp32_is_exact(n: int, seed: int, scale: float) -> None:
    x = _vector(n, seed, scale)
    assert torch.equal(get_codec("fp32").decode(get_codec("fp32").encode(x)), x)


@pytest.mark.parametrize(("name", "levels"), [("int8", 127), ("int4", 7)])
@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 2500), block=block_sizes, seed=seeds, scale=scales)
def test_integer_codecs_err_by_less_than_one_level(
    name: str, levels: int, n: int, block: int, seed: int, scale: float
) -> None:
    x = _vector(n, seed, scale)
    y = get_codec(name, block).compress(x, _gen(seed)).value
    pad = (-n) % block
    absmax = torch.cat([x.abs(), x.new_zeros(pad)]).view(-1, block).amax(dim=1)
    step = (absmax / levels).repeat_interleave(block)[:n]
    assert bool(((y - x).abs() <= step * (1 + 1e-5)).all())


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 2500), block=block_sizes, seed=seeds, scale=scales)
def test_fp16_errs_by_at_most_one_half_precision_ulp_of_the_block_max(
    n: int, block: int, seed: int, scale: float
) -> None:
    x = _vector(n, seed, scale)
    y = get_codec("fp16", block).compress(x, _gen(seed)).value
    pad = (-n) % block
    absmax = torch.cat([x.abs(), x.new_zeros(pad)]).view(-1, block).amax(dim=1)
    bound = (absmax * 2.0**-10).repeat_interleave(block)[:n]
    assert bool(((y - x).abs() <= bound * (1 + 1e-5)).all())


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 2500), block=block_sizes, seed=seeds, scale=scales)
def test_sign_is_contractive_per_block(n: int, block: int, seed: int, scale: float) -> None:
    x = _vector(n, seed, scale).double()
    y = get_codec("sign", block).compress(x.float()).value.double()
    for xb, yb in zip(torch.split(x, block), torch.split(y, block), strict=True):
        # ||x - C(x)||² = ||x||² - ||x||₁²/d <= (1 - 1/d) ||x||²
        assert (
            float((xb - yb).pow(2).sum())
            <= (1 - 1 / len(xb)) * float(xb.pow(2).sum()) * (1 + 1e-4) + 1e-300
        )


@pytest.mark.parametrize("name", LOSSY_UNBIASED)
def test_stochastic_rounding_is_unbiased(name: str) -> None:
    codec = get_codec(name, 64)
    x = torch.randn(512, generator=_gen(1))
    draws = 2000
    gen = _gen(2)
    total = torch.zeros_like(x, dtype=torch.float64)
    for _ in range(draws):
        total += codec.compress(x, gen).value.double()
    mean = total / draws
    absmax = x.abs().view(-1, 64).amax(dim=1).repeat_interleave(64)
    levels = {"fp16": 2.0**10, "int8": 127, "int4": 7}[name]
    # Each draw errs by less than one level; the mean of `draws` of them by ~level/sqrt(draws).
    tolerance = 5 * (absmax / levels) / math.sqrt(draws)
    assert bool(((mean - x.double()).abs() <= tolerance).all())


def test_rounding_never_leaves_exact_values() -> None:
    # floor(v + u) would lift an exact integer to the next one when u rounds up to 1.
    x = torch.tensor([1.0, -1.0, 0.5, 127.0, 1024.0, -3.0] * 64)
    for name in ("fp16", "int8"):
        codec = get_codec(name, 8)
        for seed in range(50):
            y = codec.compress(x, _gen(seed)).value
            assert bool((y.abs() <= x.abs().amax()).all()), name


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_input_is_refused(name: str, bad: float) -> None:
    x = torch.randn(300)
    x[123] = bad
    with pytest.raises(NonFiniteError, match="index 123"):
        get_codec(name, 64).encode(x)


def _valid(name: str, n: int = 300, block: int = 64) -> Encoded:
    return get_codec(name, block).encode(torch.randn(n, generator=_gen(0)))


@pytest.mark.parametrize("name", ALL)
def test_mismatched_geometry_is_refused(name: str) -> None:
    codec = get_codec(name, 64)
    enc = _valid(name)
    bad = [
        dataclasses.replace(enc, codec="int8" if name != "int8" else "int4"),
        dataclasses.replace(enc, block_size=128),
        dataclasses.replace(enc, data=enc.data[:-1]),
        dataclasses.replace(enc, data=enc.data + b"\0"),
        dataclasses.replace(enc, numel=enc.numel + 1000),
    ]
    if name != "fp32":
        bad.append(dataclasses.replace(enc, scales=enc.scales[:-4]))
    for b in bad:
        with pytest.raises(CodecError):
            codec.decode(b)


@pytest.mark.parametrize("name", ["fp16", "int8", "int4", "sign"])
@pytest.mark.parametrize(("scale", "error"), [(math.nan, NonFiniteError), (-1.0, CodecError)])
def test_bad_scales_are_refused(name: str, scale: float, error: type[Exception]) -> None:
    enc = _valid(name)
    scales = struct.pack("<f", scale) + enc.scales[4:]
    with pytest.raises(error):
        get_codec(name, 64).decode(dataclasses.replace(enc, scales=scales))


@pytest.mark.parametrize(("name", "levels"), [("int8", 127), ("int4", 7)])
def test_scales_that_would_overflow_on_decoding_are_refused(name: str, levels: int) -> None:
    enc = _valid(name)
    huge = struct.pack("<f", 3.4e38 / levels * 1.01)
    with pytest.raises(NonFiniteError, match="overflow"):
        get_codec(name, 64).decode(dataclasses.replace(enc, scales=huge + enc.scales[4:]))


def test_out_of_range_codes_are_refused() -> None:
    int8 = _valid("int8")
    with pytest.raises(CodecError, match="-128"):
        get_codec("int8", 64).decode(dataclasses.replace(int8, data=b"\x80" + int8.data[1:]))
    int4 = _valid("int4")
    with pytest.raises(CodecError, match="nibble 0"):
        get_codec("int4", 64).decode(dataclasses.replace(int4, data=b"\x08" + int4.data[1:]))
    fp16 = _valid("fp16")
    two = struct.pack("<e", 2.0)
    with pytest.raises(CodecError, match=r"\[-1, 1\]"):
        get_codec("fp16", 64).decode(dataclasses.replace(fp16, data=two + fp16.data[2:]))
    nan16 = struct.pack("<e", math.nan)
    with pytest.raises(NonFiniteError):
        get_codec("fp16", 64).decode(dataclasses.replace(fp16, data=nan16 + fp16.data[2:]))
    fp32 = _valid("fp32")
    inf = struct.pack("<f", math.inf)
    with pytest.raises(NonFiniteError):
        get_codec("fp32", 64).decode(dataclasses.replace(fp32, data=inf + fp32.data[4:]))


@pytest.mark.parametrize("name", ALL)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_random_bytes_of_the_right_length_decode_finite_or_are_refused(
    name: str, data: st.DataObject
) -> None:
    codec = get_codec(name, 16)
    n = data.draw(st.integers(1, 200))
    raw = data.draw(st.binary(min_size=codec.data_nbytes(n), max_size=codec.data_nbytes(n)))
    sc = data.draw(st.binary(min_size=codec.scales_nbytes(n), max_size=codec.scales_nbytes(n)))
    enc = Encoded(name, n, 16, sc, raw)
    try:
        out = codec.decode(enc)
    except CodecError:
        return
    assert out.shape == (n,)
    assert bool(torch.isfinite(out).all())


def test_block_size_must_pack_whole_bytes() -> None:
    with pytest.raises(ValueError, match="multiple of 8"):
        get_codec("int4", 12)
    with pytest.raises(ValueError, match="multiple of 8"):
        get_codec("sign", 0)


def test_codec_names() -> None:
    assert ALL == ["fp16", "fp32", "int4", "int8", "sign"]
    assert type(get_codec("none")) is type(get_codec("fp32"))
    with pytest.raises(ValueError, match="unknown codec 'int3'"):
        get_codec("int3")


def test_sign_packs_value_j_of_each_eight_into_bit_j() -> None:
    """The wire layout, pinned: byte i holds the signs of values 8i..8i+7, value 8i+j in bit j
    (set for >= 0), so every version of a node reads every other's sign deltas alike."""
    x = torch.tensor(
        [1.0, -1.0, -2.0, 3.0, 0.0, -0.5, -4.0, 2.0, -1.0, -1.0, -1.0, -1.0] + [1.0] * 4
    )
    enc = get_codec("sign", 16).encode(x)
    assert enc.data == bytes([0b10011001, 0b11110000])
    assert struct.unpack("<f", enc.scales) == pytest.approx([x.abs().mean().item()])
    signs = get_codec("sign", 16).decode(enc) / struct.unpack("<f", enc.scales)[0]
    assert torch.equal(signs, torch.where(x >= 0, 1.0, -1.0))


def test_sign_pads_only_the_last_block_with_ones_and_scales_it_by_its_real_values() -> None:
    """A model rarely fills its last block: the padding reads as zeros (bits set), and the
    last block's scale is the mean |x| of the values it really holds."""
    x = torch.tensor([1.0, -1.0, -2.0, 3.0, 0.0, -0.5, -4.0, 2.0, -1.0, 2.0])
    enc = get_codec("sign", 8).encode(x)
    assert enc.data == bytes([0b10011001, 0b11111110])
    assert struct.unpack("<2f", enc.scales) == pytest.approx([13.5 / 8, 1.5])
    first = torch.tensor([1.0, -1.0, -1.0, 1.0, 1.0, -1.0, -1.0, 1.0]) * (13.5 / 8)
    assert torch.equal(
        get_codec("sign", 8).decode(enc), torch.cat([first, torch.tensor([-1.5, 1.5])])
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_all_finite_answers_for_every_value_even_when_the_sum_overflows(
    dtype: torch.dtype,
) -> None:
    big = torch.finfo(dtype).max
    assert all_finite(torch.tensor([big, big, 1.0], dtype=dtype))  # the sum overflows; no value
    assert all_finite(torch.empty(0, dtype=dtype))
    for bad in (math.inf, -math.inf, math.nan):
        v = torch.ones(1000, dtype=dtype)
        v[617] = bad
        assert not all_finite(v)
    opposite = torch.tensor([math.inf, -math.inf], dtype=dtype)  # sums to NaN
    assert not all_finite(opposite)
