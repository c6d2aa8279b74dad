"""The partitioned-topic record (``policies.PartitionedTopicRecord``): its stored shape, the
``deleted`` marker a delete sets, and what a damaged record raises."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from magnetar.broker.namespace.policies import PartitionedMetadataError, PartitionedTopicRecord


@given(st.integers(min_value=-(2**40), max_value=2**40), st.booleans())
def test_round_trip(partitions: int, deleted: bool) -> None:
    record = PartitionedTopicRecord(partitions, deleted)
    assert PartitionedTopicRecord.from_bytes(record.to_bytes(), "t") == record


def test_the_stored_shape_is_pulsars() -> None:
    assert json.loads(PartitionedTopicRecord(4).to_bytes()) == {"partitions": 4}
    assert json.loads(PartitionedTopicRecord(4, deleted=True).to_bytes()) == {
        "partitions": 4,
        "deleted": True,
    }
    # A record written before the marker existed reads as not deleted.
    assert PartitionedTopicRecord.from_bytes(b'{"partitions": 2}', "t").deleted is False


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"not json",
        b"[]",
        b'"x"',
        b"{}",
        b'{"partitions": "3"}',
        b'{"partitions": true}',
        b'{"partitions": 3.0}',
        b'{"partitions": 3, "deleted": "yes"}',
        b'{"partitions": 3, "deleted": 1}',
        b"[" * 100_000,
    ],
)
def test_a_damaged_record_names_its_topic(raw: bytes) -> None:
    with pytest.raises(PartitionedMetadataError, match="persistent://t/ns/x"):
        PartitionedTopicRecord.from_bytes(raw, "persistent://t/ns/x")
