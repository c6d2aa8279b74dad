"""The sticky-key hash of Key_Shared subscriptions, as Pulsar computes it: Murmur3 x86 32-bit
(seed 0) of the key bytes, reduced to the 16-bit hash space 0..65535. Pure functions only."""

from __future__ import annotations

import mmh3

#: Size of the key-hash space a Key_Shared subscription splits among its consumers.
HASH_RANGE_SIZE = 65536

#: The key of a message that has neither an ordering key nor a partition key (as in Pulsar).
NONE_KEY = b"NONE_KEY"


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3_x86_32 of ``data`` as an unsigned 32-bit integer (the maintained C extension
    ``mmh3``; tests/unit/test_key_hash.py holds it to a plain reading of the algorithm)."""
    return mmh3.hash(data, seed & 0xFFFFFFFF, signed=False)


def key_hash(key: bytes) -> int:
    """The sticky-key hash of ``key``: 0..65535."""
    # Pulsar takes the Murmur3 value as a non-negative Java int, then mod 65536: the same as
    # the low 16 bits of the unsigned value.
    return (murmur3_32(key) & 0x7FFFFFFF) % HASH_RANGE_SIZE
