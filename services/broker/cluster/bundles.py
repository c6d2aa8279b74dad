"""Namespace bundles: a namespace's 32-bit topic-hash range split into contiguous ranges.

The rules are Pulsar's, so ranges read the same as in Pulsar (``0x00000000_0x40000000``):

- A topic's hash is the CRC32 (``java.util.zip.CRC32``, Guava ``Hashing.crc32()`` padded to a
  long, i.e. zlib's unsigned value) of its full name, ``persistent://tenant/ns/topic``
  (``NamespaceBundleFactory.getLongHashCode(topicName.toString())``). Each partition
  (``...-partition-3``) is a topic of its own and hashes on its own name.
- The full range is ``[0x00000000, 0xffffffff]``. Every bundle is ``[lower, upper)`` except the
  last one, whose upper bound ``0xffffffff`` is included (``NamespaceBundleFactory.getBundle``).
- ``n`` default bundles split ``2**32`` in ``n`` equal segments; the last boundary is
  ``0xffffffff`` (``NamespacesBase.getBundles(numBundles)``).
- The boundaries are stored as Pulsar's ``BundlesData``: ``{"boundaries": ["0x00000000", ...],
  "numBundles": n}``, one document per namespace under ``/magnetar/bundles/{tenant}/{ns}``.

Everything but :func:`load_or_create` and :func:`replace_with_split` is pure.
"""

from __future__ import annotations

import bisect
import itertools
import json
import logging
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from magnetar.common.metadata import (
    NOT_EXISTS,
    BadVersionError,
    Expect,
    MetadataStore,
    Operation,
    Put,
)

log = logging.getLogger(__name__)

FULL_LOWER = 0x00000000
#: The last bundle's upper bound, included in it (Pulsar's ``NamespaceBundles.FULL_UPPER_BOUND``).
FULL_UPPER = 0xFFFFFFFF
#: Most bundles a namespace may be created with: every bundle is an ownership key and an owner.
MAX_DEFAULT_BUNDLES = 1024
BUNDLES_ROOT = "/magnetar/bundles"

SplitAlgorithm = Literal["range_equally_divide", "topic_count_equally_divide"]
SPLIT_ALGORITHMS: tuple[str, ...] = ("range_equally_divide", "topic_count_equally_divide")


class BundleError(ValueError):
    """A bundle range, document or split request is not valid; the message says why."""


def topic_hash(name: str) -> int:
    """Pulsar's default bundle hash of a full topic name: unsigned CRC32 of its UTF-8 bytes."""
    return zlib.crc32(name.encode("utf-8")) & 0xFFFFFFFF


@dataclass(slots=True, frozen=True, order=True)
class BundleRange:
    """Hashes ``lower <= h < upper``, or ``<= upper`` when ``upper`` is ``0xffffffff``."""

    lower: int
    upper: int

    def __post_init__(self) -> None:
        if not FULL_LOWER <= self.lower < self.upper <= FULL_UPPER:
            raise BundleError(
                f"bundle range must satisfy 0x00000000 <= lower < upper <= 0xffffffff, got "
                f"0x{self.lower:08x}_0x{self.upper:08x}"
            )

    def __str__(self) -> str:
        return f"0x{self.lower:08x}_0x{self.upper:08x}"

    @classmethod
    def parse(cls, text: str) -> BundleRange:
        """``0x00000000_0x40000000`` (as Pulsar's admin paths name bundles) to a range."""
        parts = text.split("_")
        if len(parts) != 2:
            raise BundleError(f"bundle range must look like 0x00000000_0x40000000, got {text!r}")
        try:
            lower, upper = (int(p, 16) if p.lower().startswith("0x") else int(p) for p in parts)
        except ValueError:
            raise BundleError(
                f"bundle range must look like 0x00000000_0x40000000, got {text!r}"
            ) from None
        return cls(lower, upper)

    def contains(self, h: int) -> bool:
        if self.upper == FULL_UPPER:
            return self.lower <= h <= self.upper
        return self.lower <= h < self.upper


FULL_RANGE = BundleRange(FULL_LOWER, FULL_UPPER)


def default_ranges(n: int) -> list[BundleRange]:
    """``n`` equal bundles covering the full range (Pulsar's ``getBundles(numBundles)``)."""
    if not 1 <= n <= MAX_DEFAULT_BUNDLES:
        raise BundleError(f"number of bundles must be between 1 and {MAX_DEFAULT_BUNDLES}, got {n}")
    segment = (1 << 32) // n
    boundaries = [i * segment for i in range(n)] + [FULL_UPPER]
    return ranges_from_boundaries(boundaries)


def ranges_from_boundaries(boundaries: Sequence[int]) -> list[BundleRange]:
    """Consecutive boundaries to ranges; they must rise strictly from 0 to 0xffffffff."""
    if len(boundaries) < 2 or boundaries[0] != FULL_LOWER or boundaries[-1] != FULL_UPPER:
        raise BundleError(
            "bundle boundaries must start at 0x00000000 and end at 0xffffffff, got "
            + ", ".join(f"0x{b:08x}" for b in boundaries)
        )
    return [BundleRange(lo, hi) for lo, hi in itertools.pairwise(boundaries)]


def boundaries_of(ranges: Sequence[BundleRange]) -> list[int]:
    """The inverse of :func:`ranges_from_boundaries`; the ranges must tile the full range."""
    if not ranges:
        raise BundleError("a namespace has at least one bundle")
    for before, after in itertools.pairwise(ranges):
        if before.upper != after.lower:
            raise BundleError(f"bundles {before} and {after} are not adjacent")
    boundaries = [ranges[0].lower] + [r.upper for r in ranges]
    ranges_from_boundaries(boundaries)  # checks the ends
    return boundaries


def bundle_for(ranges: Sequence[BundleRange], topic_name: str) -> BundleRange:
    """The bundle of ``ranges`` (sorted, tiling the full range) holding the topic's hash."""
    return bundle_for_hash(ranges, topic_hash(topic_name))


def bundle_for_hash(ranges: Sequence[BundleRange], h: int) -> BundleRange:
    index = bisect.bisect_right([r.lower for r in ranges], h) - 1
    if index < 0 or not ranges[index].contains(h):
        raise BundleError(f"hash 0x{h:08x} is in none of the bundles {[str(r) for r in ranges]}")
    return ranges[index]


def split(
    bundle: BundleRange,
    *,
    algorithm: SplitAlgorithm = "range_equally_divide",
    topic_hashes: Iterable[int] = (),
) -> tuple[BundleRange, BundleRange]:
    """Split ``bundle`` in two at one boundary, as Pulsar's split algorithms choose it.

    - ``range_equally_divide``: the middle of the range, ``lower + (upper - lower) // 2``.
    - ``topic_count_equally_divide``: between the two middle topic hashes (of those in the
      bundle, sorted): ``start + (end - start) // 2 + 1`` with ``start``/``end`` the hashes at
      ``n/2 - 1`` and ``n/2``, so each half gets half of the topics (Pulsar's
      ``TopicCountEquallyDivideBundleSplitAlgorithm``). Needs two topics with different hashes.

    Raises BundleError when the bundle cannot be split that way (a range of width 1, fewer
    than two distinct topic hashes).
    """
    if algorithm == "range_equally_divide":
        boundary = bundle.lower + (bundle.upper - bundle.lower) // 2
    elif algorithm == "topic_count_equally_divide":
        hashes = sorted(h for h in set(topic_hashes) if bundle.contains(h))
        if len(hashes) < 2:
            raise BundleError(
                f"bundle {bundle} holds fewer than two topics with distinct hashes: "
                "topic_count_equally_divide cannot split it (use range_equally_divide)"
            )
        start = hashes[max(len(hashes) // 2 - 1, 0)]
        end = hashes[len(hashes) // 2]
        boundary = start + (end - start) // 2 + 1
        if boundary >= bundle.upper:  # the two middle hashes are the range's last two
            boundary = start + 1  # still between them: start below, end at or above
    else:
        raise BundleError(
            f"unknown split algorithm {algorithm!r}; use one of {', '.join(SPLIT_ALGORITHMS)}"
        )
    if not bundle.lower < boundary < bundle.upper:
        raise BundleError(f"bundle {bundle} is too narrow to split")
    return BundleRange(bundle.lower, boundary), BundleRange(boundary, bundle.upper)


def replace(
    ranges: Sequence[BundleRange], old: BundleRange, new_pair: Sequence[BundleRange]
) -> list[BundleRange]:
    """``ranges`` with ``old`` replaced by the two halves ``new_pair`` (checked to tile it)."""
    if old not in ranges:
        raise BundleError(f"bundle {old} is not one of {[str(r) for r in ranges]}")
    low, high = new_pair
    if low.lower != old.lower or low.upper != high.lower or high.upper != old.upper:
        raise BundleError(f"{low} and {high} do not split {old} in two")
    result: list[BundleRange] = []
    for bundle in ranges:
        result.extend((low, high) if bundle == old else (bundle,))
    return result


# -- the stored document (Pulsar's BundlesData) ---------------------------------------------


def bundles_key(namespace: str) -> str:
    """Metadata key of ``tenant/namespace``'s bundles."""
    tenant, _, local = namespace.partition("/")
    if not tenant or not local or "/" in local:
        raise BundleError(f"namespace must be tenant/namespace, got {namespace!r}")
    return f"{BUNDLES_ROOT}/{tenant}/{local}"


def encode(ranges: Sequence[BundleRange]) -> bytes:
    boundaries = [f"0x{b:08x}" for b in boundaries_of(ranges)]
    return json.dumps({"boundaries": boundaries, "numBundles": len(ranges)}).encode()


def decode(value: bytes, *, key: str = "bundles") -> list[BundleRange]:
    try:
        document = json.loads(value)
        boundaries = [int(b, 16) for b in document["boundaries"]]
        count = int(document.get("numBundles", len(boundaries) - 1))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise BundleError(f"{key}: not a BundlesData document ({e!r})") from e
    ranges = ranges_from_boundaries(boundaries)
    if count != len(ranges):
        raise BundleError(f"{key}: numBundles {count} but {len(ranges)} ranges in boundaries")
    return ranges


async def load(store: MetadataStore, namespace: str) -> tuple[list[BundleRange], int] | None:
    """The namespace's bundles and the document's version, or None if none are stored."""
    key = bundles_key(namespace)
    current = await store.get(key)
    if current is None:
        return None
    return decode(current.value, key=key), current.version


async def load_or_create(store: MetadataStore, namespace: str, default_n: int) -> list[BundleRange]:
    """The namespace's bundles; on first use store ``default_n`` equal ones.

    Creation is a create-only put: of concurrent creators (brokers looking up the namespace's
    first topics at once) one writes and the others read what it wrote, so all agree.
    """
    key = bundles_key(namespace)
    while True:
        loaded = await load(store, namespace)
        if loaded is not None:
            return loaded[0]
        ranges = default_ranges(default_n)
        try:
            await store.put(key, encode(ranges), NOT_EXISTS)
        except BadVersionError:
            continue  # another creator won: read its document
        log.info("namespace %s: created %d bundles", namespace, default_n)
        return ranges


async def replace_with_split(
    store: MetadataStore,
    namespace: str,
    old: BundleRange,
    new_pair: Sequence[BundleRange],
    *,
    conditions: Sequence[Expect] = (),
    operations: Sequence[Operation] = (),
) -> list[BundleRange]:
    """Replace bundle ``old`` by its two halves ``new_pair`` in the stored document; return the
    namespace's new bundles.

    One transaction, conditioned on the document's version (compare-and-set): ``conditions``
    and ``operations`` join it, so an ownership change (say, the owner of ``old`` taking the
    two halves) commits together with the split or not at all. A concurrent change of the
    document is read back and the split retried while ``old`` is still a bundle; BundleError
    when it is not (any more), BadVersionError when one of ``conditions`` fails.
    """
    updated, _ = await split_document(
        store, namespace, old, new_pair, conditions=conditions, operations=operations
    )
    return updated


async def split_document(
    store: MetadataStore,
    namespace: str,
    old: BundleRange,
    new_pair: Sequence[BundleRange],
    *,
    conditions: Sequence[Expect] = (),
    operations: Sequence[Operation] = (),
) -> tuple[list[BundleRange], int]:
    """:func:`replace_with_split`, also returning the transaction's revision (the version of
    every key it put)."""
    key = bundles_key(namespace)
    while True:
        loaded = await load(store, namespace)
        if loaded is None:
            raise BundleError(f"namespace {namespace} has no bundles stored; nothing to split")
        ranges, version = loaded
        updated = replace(ranges, old, new_pair)
        try:
            revision = await store.transaction(
                [Expect(key, version), *conditions], [Put(key, encode(updated)), *operations]
            )
        except BadVersionError as e:
            if e.key == key or (e.key is None and not conditions):
                continue  # the document changed under us: split again on the new one
            raise
        log.info("namespace %s: bundle %s split into %s and %s", namespace, old, *new_pair)
        return updated, revision
