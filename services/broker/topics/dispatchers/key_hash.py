"""The sticky-key hash of Key_Shared subscriptions, as Pulsar computes it: Murmur3 x86 32-bit
(seed 0) of the key bytes, reduced to the 16-bit hash space 0..65535. Pure functions only."""

from __future__ import annotations

#: Size of the key-hash space a Key_Shared subscription splits among its consumers.
HASH_RANGE_SIZE = 65536

#: The key of a message that has neither an ordering key nor a partition key (as in Pulsar).
NONE_KEY = b"NONE_KEY"

_C1 = 0xCC9E2D51
_C2 = 0x1B873593
_MASK = 0xFFFFFFFF


def _rotl(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (32 - bits))) & _MASK


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3_x86_32 of ``data`` as an unsigned 32-bit integer."""
    h = seed & _MASK
    length = len(data)
    tail_start = length - length % 4
    for i in range(0, tail_start, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _C1) & _MASK
        k = _rotl(k, 15)
        k = (k * _C2) & _MASK
        h ^= k
        h = _rotl(h, 13)
        h = (h * 5 + 0xE6546B64) & _MASK
    tail = data[tail_start:]
    if tail:
        k = int.from_bytes(tail, "little")
        k = (k * _C1) & _MASK
        k = _rotl(k, 15)
        k = (k * _C2) & _MASK
        h ^= k
    h ^= length
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _MASK
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _MASK
    h ^= h >> 16
    return h


def key_hash(key: bytes) -> int:
    """The sticky-key hash of ``key``: 0..65535."""
    # Pulsar takes the Murmur3 value as a non-negative Java int, then mod 65536: the same as
    # the low 16 bits of the unsigned value.
    return (murmur3_32(key) & 0x7FFFFFFF) % HASH_RANGE_SIZE
