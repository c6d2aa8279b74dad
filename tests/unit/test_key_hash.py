"""Murmur3 x86 32-bit against published vectors, and the sticky-key hash derived from it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from magnetar.broker.topics.dispatchers.key_hash import HASH_RANGE_SIZE, key_hash, murmur3_32

_C1 = 0xCC9E2D51
_C2 = 0x1B873593
_MASK = 0xFFFFFFFF


def _rotl(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (32 - bits))) & _MASK


def reference_murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3_x86_32 read plainly from the algorithm (Magnetar's own implementation
    before it used mmh3): the library must give the same value for every input."""
    h = seed & _MASK
    length = len(data)
    tail_start = length - length % 4
    for i in range(0, tail_start, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = _rotl((k * _C1) & _MASK, 15)
        h ^= (k * _C2) & _MASK
        h = (_rotl(h, 13) * 5 + 0xE6546B64) & _MASK
    tail = data[tail_start:]
    if tail:
        k = int.from_bytes(tail, "little")
        k = _rotl((k * _C1) & _MASK, 15)
        h ^= (k * _C2) & _MASK
    h ^= length
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _MASK
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _MASK
    h ^= h >> 16
    return h


@given(st.binary(max_size=300), st.integers(min_value=0, max_value=_MASK))
def test_mmh3_equals_the_reference(data: bytes, seed: int) -> None:
    assert murmur3_32(data, seed) == reference_murmur3_32(data, seed)
    if seed == 0:
        assert key_hash(data) == (reference_murmur3_32(data) & 0x7FFFFFFF) % HASH_RANGE_SIZE


@pytest.mark.parametrize(
    ("data", "seed", "expected"),
    [
        # Published test vectors of MurmurHash3_x86_32 (one per tail length 0..3, full blocks,
        # seeds and all-ones input).
        (b"", 0, 0),
        (b"", 1, 0x514E28B7),
        (b"", 0xFFFFFFFF, 0x81F16F39),
        (b"\xff\xff\xff\xff", 0, 0x76293B50),
        (b"\x21\x43\x65\x87", 0, 0xF55B516B),
        (b"\x21\x43\x65\x87", 0x5082EDEE, 0x2362F9DE),
        (b"\x21\x43\x65", 0, 0x7E4A8634),
        (b"\x21\x43", 0, 0xA0F7B07A),
        (b"\x21", 0, 0x72661CF4),
        (b"\x00\x00\x00\x00", 0, 0x2362F9DE),
        (b"\x00\x00\x00", 0, 0x85F0B427),
        (b"\x00\x00", 0, 0x30F4C306),
        (b"\x00", 0, 0x514E28B7),
        (b"aaaa", 0x9747B28C, 0x5A97808A),
        (b"aaa", 0x9747B28C, 0x283E0130),
        (b"aa", 0x9747B28C, 0x5D211726),
        (b"a", 0x9747B28C, 0x7FA09EA6),
        (b"abcd", 0x9747B28C, 0xF0478627),
        (b"abc", 0x9747B28C, 0xC84A62DD),
        (b"ab", 0x9747B28C, 0x74875592),
        (b"Hello, world!", 0x9747B28C, 0x24884CBA),
        (b"The quick brown fox jumps over the lazy dog", 0x9747B28C, 0x2FA826CD),
        (b"The quick brown fox jumps over the lazy dog", 0, 0x2E4FF723),
    ],
)
def test_murmur3_vectors(data: bytes, seed: int, expected: int) -> None:
    assert murmur3_32(data, seed) == expected


def test_key_hash_is_the_low_16_bits_and_stays_in_range() -> None:
    for i in range(2000):
        key = f"key-{i}".encode()
        h = key_hash(key)
        assert 0 <= h < HASH_RANGE_SIZE
        assert h == murmur3_32(key) & 0xFFFF
        assert key_hash(key) == h  # deterministic


def test_key_hash_spreads_keys_over_the_space() -> None:
    halves = [0, 0]
    for i in range(4000):
        halves[key_hash(f"k{i}".encode()) // (HASH_RANGE_SIZE // 2)] += 1
    assert min(halves) > 1500  # roughly even, far from everything in one half
