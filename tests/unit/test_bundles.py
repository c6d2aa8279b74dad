"""Namespace bundles: Pulsar's hash, ranges, default split, split algorithms, stored document."""

from __future__ import annotations

import asyncio
import json
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from magnetar.broker.cluster import bundles
from magnetar.broker.cluster.bundles import (
    FULL_RANGE,
    FULL_UPPER,
    BundleError,
    BundleRange,
    bundle_for,
    bundle_for_hash,
    default_ranges,
    split,
    topic_hash,
)
from magnetar.common.metadata import BadVersionError, Expect, MetadataStore, Put, open_store

hashes = st.integers(min_value=0, max_value=FULL_UPPER)


@st.composite
def tilings(draw: st.DrawFn) -> list[BundleRange]:
    """Any valid set of bundles: sorted distinct inner boundaries between 0 and 0xffffffff."""
    inner = draw(st.sets(st.integers(min_value=1, max_value=FULL_UPPER - 1), max_size=20))
    boundaries = [0, *sorted(inner), FULL_UPPER]
    return bundles.ranges_from_boundaries(boundaries)


# -- hash ---------------------------------------------------------------------------------


def test_topic_hash_is_unsigned_crc32_of_the_full_name() -> None:
    # The CRC-32 check value (java.util.zip.CRC32 / Guava Hashing.crc32 give the same).
    assert topic_hash("123456789") == 0xCBF43926
    name = "persistent://public/default/my-topic"
    assert topic_hash(name) == zlib.crc32(name.encode()) & 0xFFFFFFFF
    # Partitions are topics of their own: each hashes on its own name.
    assert topic_hash(name + "-partition-0") != topic_hash(name + "-partition-1")


@given(st.text())
def test_topic_hash_is_32_bit_unsigned(name: str) -> None:
    assert 0 <= topic_hash(name) <= FULL_UPPER


# -- ranges -------------------------------------------------------------------------------


def test_default_ranges_are_pulsars() -> None:
    assert [str(r) for r in default_ranges(4)] == [
        "0x00000000_0x40000000",
        "0x40000000_0x80000000",
        "0x80000000_0xc0000000",
        "0xc0000000_0xffffffff",
    ]
    assert default_ranges(1) == [FULL_RANGE]
    assert str(FULL_RANGE) == "0x00000000_0xffffffff"


@pytest.mark.parametrize("n", [0, -1, 1025])
def test_default_ranges_refuse_bad_counts(n: int) -> None:
    with pytest.raises(BundleError):
        default_ranges(n)


@given(st.integers(min_value=1, max_value=1024))
def test_default_ranges_tile_the_full_range(n: int) -> None:
    ranges = default_ranges(n)
    assert len(ranges) == n
    assert bundles.boundaries_of(ranges)[0] == 0
    assert ranges[-1].upper == FULL_UPPER
    widths = {r.upper - r.lower for r in ranges[:-1]}
    assert len(widths) <= 1  # equal segments; the last absorbs the remainder


def test_last_bundle_includes_its_upper_bound_others_do_not() -> None:
    first, *_, last = default_ranges(4)
    assert first.contains(0) and not first.contains(0x40000000)
    assert last.contains(FULL_UPPER) and last.contains(0xC0000000)
    assert not last.contains(0xBFFFFFFF)


@pytest.mark.parametrize(
    "text", ["", "0x0", "0x1_0x0", "zz_0x10", "0x00000000_0x100000000", "1_2_3"]
)
def test_parse_refuses_malformed_ranges(text: str) -> None:
    with pytest.raises(BundleError):
        BundleRange.parse(text)


@given(hashes, hashes)
def test_str_and_parse_round_trip(a: int, b: int) -> None:
    if a == b:
        return
    bundle = BundleRange(min(a, b), max(a, b))
    assert BundleRange.parse(str(bundle)) == bundle
    assert len(str(bundle)) == 21


@given(tilings(), hashes)
def test_every_hash_is_in_exactly_one_bundle(ranges: list[BundleRange], h: int) -> None:
    holders = [r for r in ranges if r.contains(h)]
    assert len(holders) == 1
    assert bundle_for_hash(ranges, h) == holders[0]


@given(tilings(), st.text())
def test_bundle_for_uses_the_topic_hash(ranges: list[BundleRange], name: str) -> None:
    assert bundle_for(ranges, name).contains(topic_hash(name))


# -- split --------------------------------------------------------------------------------


def test_range_equally_divide_matches_pulsar() -> None:
    assert [str(r) for r in split(FULL_RANGE)] == [
        "0x00000000_0x7fffffff",
        "0x7fffffff_0xffffffff",
    ]
    low, high = split(BundleRange(0x40000000, 0x80000000))
    assert (str(low), str(high)) == ("0x40000000_0x60000000", "0x60000000_0x80000000")


def test_unsplittable_bundles_are_refused() -> None:
    with pytest.raises(BundleError, match="too narrow"):
        split(BundleRange(5, 6))
    with pytest.raises(BundleError, match="fewer than two"):
        split(FULL_RANGE, algorithm="topic_count_equally_divide", topic_hashes=[7, 7])
    with pytest.raises(BundleError, match="unknown split algorithm"):
        split(FULL_RANGE, algorithm="specified_positions_divide")  # type: ignore[arg-type]


@given(tilings(), st.data())
def test_range_split_halves_tile_the_bundle(ranges: list[BundleRange], data: st.DataObject) -> None:
    bundle = data.draw(st.sampled_from(ranges))
    if bundle.upper - bundle.lower < 2:
        return
    low, high = split(bundle)
    assert (low.lower, low.upper, high.upper) == (bundle.lower, high.lower, bundle.upper)
    replaced = bundles.replace(ranges, bundle, (low, high))
    assert len(replaced) == len(ranges) + 1
    bundles.boundaries_of(replaced)  # still a tiling


@given(st.lists(hashes, min_size=2, max_size=200))
def test_topic_count_split_halves_the_topics(topic_hashes: list[int]) -> None:
    distinct = sorted(set(topic_hashes))
    if len(distinct) < 2:
        return
    middle = distinct[len(distinct) // 2 - 1 : len(distinct) // 2 + 1]
    if middle == [FULL_RANGE.upper - 1, FULL_RANGE.upper]:  # no boundary fits between them
        with pytest.raises(BundleError, match="too narrow"):
            split(FULL_RANGE, algorithm="topic_count_equally_divide", topic_hashes=topic_hashes)
        return
    low, high = split(FULL_RANGE, algorithm="topic_count_equally_divide", topic_hashes=topic_hashes)
    below = [h for h in distinct if low.contains(h)]
    above = [h for h in distinct if high.contains(h)]
    assert len(below) + len(above) == len(distinct)
    assert len(below) == len(distinct) // 2
    assert below and above


def test_topic_count_split_of_the_last_two_hashes() -> None:
    top = FULL_RANGE.upper
    low, high = split(
        FULL_RANGE, algorithm="topic_count_equally_divide", topic_hashes=[top - 2, top]
    )
    assert low.contains(top - 2) and high.contains(top) and not low.contains(top)
    with pytest.raises(BundleError, match="too narrow"):
        split(FULL_RANGE, algorithm="topic_count_equally_divide", topic_hashes=[top - 1, top])


def test_replace_refuses_a_pair_that_is_not_a_split() -> None:
    ranges = default_ranges(2)
    with pytest.raises(BundleError, match="not one of"):
        bundles.replace(ranges, BundleRange(1, 2), split(BundleRange(1, 3)))
    with pytest.raises(BundleError, match="do not split"):
        bundles.replace(ranges, ranges[0], split(ranges[1]))


# -- stored document ----------------------------------------------------------------------


def test_document_is_pulsars_bundles_data() -> None:
    document = json.loads(bundles.encode(default_ranges(2)))
    assert document == {"boundaries": ["0x00000000", "0x80000000", "0xffffffff"], "numBundles": 2}
    assert bundles.decode(json.dumps(document).encode()) == default_ranges(2)
    for bad in (b"{}", b"[]", b"not json", b'{"boundaries": ["0x00000000", "0x10"]}'):
        with pytest.raises(BundleError):
            bundles.decode(bad)


def test_bundles_key_needs_tenant_and_namespace() -> None:
    assert bundles.bundles_key("public/default") == "/magnetar/bundles/public/default"
    for bad in ("public", "/default", "public/", "a/b/c"):
        with pytest.raises(BundleError):
            bundles.bundles_key(bad)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[MetadataStore]:
    opened = await open_store(f"local://{tmp_path}/meta.db")
    yield opened
    await opened.close()


async def test_concurrent_creators_converge(store: MetadataStore) -> None:
    results = await asyncio.gather(
        *(bundles.load_or_create(store, "t/ns", n) for n in (2, 4, 8, 16))
    )
    assert all(r == results[0] for r in results)
    assert await bundles.load_or_create(store, "t/ns", 3) == results[0]  # stored wins


async def test_replace_with_split_is_a_cas_that_can_carry_more(store: MetadataStore) -> None:
    ranges = await bundles.load_or_create(store, "t/ns", 2)
    pair = split(ranges[0])
    updated = await bundles.replace_with_split(
        store, "t/ns", ranges[0], pair, operations=[Put("/test/owner-moved", b"x")]
    )
    assert updated == [*pair, ranges[1]]
    assert await bundles.load_or_create(store, "t/ns", 2) == updated
    assert await store.get("/test/owner-moved") is not None
    # The old bundle is gone: splitting it again is refused.
    with pytest.raises(BundleError, match="not one of"):
        await bundles.replace_with_split(store, "t/ns", ranges[0], pair)
    # A failing extra condition applies nothing.
    with pytest.raises(BadVersionError):
        await bundles.replace_with_split(
            store, "t/ns", pair[0], split(pair[0]), conditions=[Expect("/test/absent", 5)]
        )
    assert await bundles.load_or_create(store, "t/ns", 2) == updated


async def test_concurrent_splits_of_different_bundles_both_apply(store: MetadataStore) -> None:
    ranges = await bundles.load_or_create(store, "t/ns", 4)
    await asyncio.gather(*(bundles.replace_with_split(store, "t/ns", r, split(r)) for r in ranges))
    assert len(await bundles.load_or_create(store, "t/ns", 4)) == 8
