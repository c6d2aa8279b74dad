"""Fixtures shared by every test directory."""

from __future__ import annotations

from collections.abc import Iterator

import hypothesis  # noqa: F401  (see below)
import pytest

from tests.support.etcd import EtcdServer

# hypothesis is imported here, at start-up, on purpose: its pytest plugin imports it lazily in the
# terminal summary otherwise, and on CPython 3.11.7 compiling its modules that late (after an
# integration module) fails with "SystemError: AST constructor recursion depth mismatch".


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    """One real etcd for the whole run; tests keep apart by using their own key prefixes."""
    with EtcdServer() as server:
        yield server
