"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.standalone import StandaloneProcess


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[StandaloneProcess]:
    """A running ``magnetar standalone`` on free ports; its log tail is printed afterwards."""
    node = StandaloneProcess(tmp_path / "standalone").start()
    try:
        yield node
    finally:
        node.stop()
        print(node.log_tail())
