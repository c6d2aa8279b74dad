"""The journal's batch record: round trip, and malformed data is refused, never mis-split."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from magnetar.bookie import journal as jnl

entries = st.lists(st.binary(max_size=300), max_size=40)


@given(entries)
def test_batch_round_trip(batch: list[bytes]) -> None:
    record = jnl.encode_add_batch(batch)
    body = record[8:]  # after the record's length and CRC
    assert body[0] == jnl.RecordType.ADD_BATCH
    assert jnl.decode_add_batch(body[1:]) == batch


@given(entries, st.data())
def test_truncated_or_extended_batch_is_refused(batch: list[bytes], data: st.DataObject) -> None:
    body = jnl.encode_add_batch(batch)[9:]
    cut = data.draw(st.integers(0, len(body) - 1))
    with pytest.raises(ValueError):
        jnl.decode_add_batch(body[:cut])
    with pytest.raises(ValueError):
        jnl.decode_add_batch(body + b"x")


def test_replay_returns_batch_records(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / jnl.file_name(0)
    batch = [b"first", b"", b"third entry"]
    path.write_bytes(jnl.MAGIC + jnl.encode_add_batch(batch) + jnl.encode_add_batch([b"cut"])[:-1])
    records = list(jnl.replay(tmp_path, 0))
    assert [r.kind for r in records] == [jnl.RecordType.ADD_BATCH]
    assert jnl.decode_add_batch(records[0].data) == batch
