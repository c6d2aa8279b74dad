"""The pure parts of autorecovery: mark and settings records, the copy pacing, and which entries
of a fragment the replication worker copies."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from magnetar.bookie.replication import ByteRateLimiter, Replicator
from magnetar.common.ledger.metadata import Fragment, LedgerMetadata, LedgerState
from magnetar.common.ledger.underreplication import RecoverySettings, UnderReplicatedMark


@given(st.frozensets(st.text("abc:0123456789", min_size=1, max_size=12), max_size=5))
def test_mark_round_trips(bookies: frozenset[str]) -> None:
    mark = UnderReplicatedMark(bookies, 1234.5)
    assert UnderReplicatedMark.from_json(mark.to_json()) == mark


def test_settings_keep_unset_fields_unset() -> None:
    assert RecoverySettings.from_json(RecoverySettings().to_json()) == RecoverySettings()
    both = RecoverySettings(auto_recovery_daemon_enabled=False, lost_bookie_recovery_delay=30.0)
    assert RecoverySettings.from_json(both.to_json()) == both


def test_rate_limiter_paces_to_the_rate() -> None:
    limiter = ByteRateLimiter(100_000)
    # 10 KB chunks at 100 KB/s asked for at once: each starts 0.1 s after the previous one.
    assert [round(limiter.delay(10_000, now=50.0), 6) for _ in range(4)] == [0.0, 0.1, 0.2, 0.3]
    # After an idle while, no debt is carried over.
    assert limiter.delay(10_000, now=60.0) == 0.0


def test_no_rate_means_no_wait() -> None:
    limiter = ByteRateLimiter(0)
    assert all(limiter.delay(10**9, now=0.0) == 0.0 for _ in range(100))


FRAGMENTS = (Fragment(0, ("a", "b")), Fragment(10, ("a", "c")), Fragment(25, ("d", "c")))


def test_open_ledger_fragments_end_where_the_next_begins_and_the_last_is_the_writers() -> None:
    metadata = LedgerMetadata(2, 2, 2, FRAGMENTS, state=LedgerState.OPEN)
    assert [Replicator._last_entry(metadata, i) for i in range(3)] == [9, 24, None]


def test_closed_ledger_fragments_end_at_the_last_entry() -> None:
    metadata = LedgerMetadata(2, 2, 2, FRAGMENTS, state=LedgerState.CLOSED, last_entry_id=20)
    # The last fragment serves nothing (it starts past the end): only its ensemble changes.
    assert [Replicator._last_entry(metadata, i) for i in range(3)] == [9, 20, 20]
