"""Disk usage measurement and the read-only switch with its hysteresis."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from magnetar.bookie.disk_checker import measure, read_only_reason

fractions = st.floats(min_value=0.0, max_value=1.5, allow_nan=False)


def test_thresholds() -> None:
    t, lwm = 0.5, 0.3
    assert read_only_reason(0.49, False, t, lwm) is None
    assert read_only_reason(0.5, False, t, lwm) is not None
    # Between lwm and threshold the previous state holds.
    assert read_only_reason(0.4, False, t, lwm) is None
    assert read_only_reason(0.4, True, t, lwm) is not None
    assert read_only_reason(0.3, True, t, lwm) is not None
    assert read_only_reason(0.29, True, t, lwm) is None
    reason = read_only_reason(0.62, False, t, lwm)
    assert reason is not None and "62.0%" in reason and "50%" in reason and "30%" in reason


@given(
    usages=st.lists(fractions, max_size=40),
    bounds=st.tuples(fractions, fractions).map(sorted),
)
def test_hysteresis_never_flaps_between_the_marks(usages: list[float], bounds: list[float]) -> None:
    lwm, threshold = bounds
    read_only = False
    for usage in usages:
        now = read_only_reason(usage, read_only, threshold, lwm) is not None
        if usage >= threshold:
            assert now
        elif usage < lwm:
            assert not now
        else:
            assert now == read_only
        read_only = now


def test_measure_with_quota_counts_both_directories(tmp_path: Path) -> None:
    journal, ledgers = tmp_path / "j", tmp_path / "l"
    (journal / "current").mkdir(parents=True)
    (ledgers / "current").mkdir(parents=True)
    (journal / "current" / "a.jnl").write_bytes(b"x" * 3000)
    (ledgers / "current" / "b.log").write_bytes(b"y" * 1000)
    (ledgers / "index.db").write_bytes(b"z" * 1000)
    usage = measure(journal, ledgers, 10_000)
    assert usage.usage == 0.5
    assert usage.free_bytes == 5000
    assert usage.total_bytes == 10_000
    (journal / "current" / "big.jnl").write_bytes(b"x" * 8000)
    over = measure(journal, ledgers, 10_000)
    assert over.usage == 1.3
    assert over.free_bytes == 0


def test_measure_without_quota_reports_the_filesystem(tmp_path: Path) -> None:
    usage = measure(tmp_path, tmp_path, 0)
    assert 0.0 <= usage.usage <= 1.0
    assert usage.total_bytes > 0
    assert 0 <= usage.free_bytes <= usage.total_bytes
