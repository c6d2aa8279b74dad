"""What a dispatcher reads of a stored entry without decoding its metadata (issue 24)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from magnetar.broker.model.entry import dispatch_facts, entry_metadata, message_count
from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec


@given(
    st.text(max_size=12),
    st.integers(0, 2**63 - 1),
    st.integers(0, 2**63 - 1),
    st.one_of(st.none(), st.integers(0, 10_000)),
    st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
    st.binary(max_size=40),
    st.booleans(),
)
def test_dispatch_facts_agree_with_decoding(
    name: str,
    sequence: int,
    publish_time: int,
    batch: int | None,
    deliver_at: int | None,
    payload: bytes,
    checksum: bool,
) -> None:
    """The quick look for the two tags never disagrees with decoding the metadata, also when
    a producer name, a sequence id or a publish time holds the tags' bytes."""
    metadata = pb.MessageMetadata(
        producer_name=name + "X\x98\x01", sequence_id=sequence, publish_time=publish_time
    )
    if batch is not None:
        metadata.num_messages_in_batch = batch
    if deliver_at is not None:
        metadata.deliver_at_time = deliver_at
    stored = codec.encode_headers_and_payload(metadata, b"X\x98\x01" + payload, checksum=checksum)
    decoded = entry_metadata(stored)
    assert dispatch_facts(stored) == (message_count(decoded), decoded.deliver_at_time)


def test_a_plain_message_is_one_message_due_now() -> None:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=2)
    assert dispatch_facts(codec.encode_headers_and_payload(metadata, b"x")) == (1, 0)
