"""Fixtures shared by every test directory."""

from __future__ import annotations

from collections.abc import Iterator

import hypothesis  # noqa: F401  (see below)
import pytest

from tests.support.etcd import EtcdServer

# Fails tests that leave an official pulsar.Client open, and makes the run's exit status the
# tests' verdict even if native threads are still alive at exit (see the module's docstring).
pytest_plugins = ["tests.support.client_guard"]

# hypothesis is imported here, at start-up, on purpose: its pytest plugin imports it lazily in the
# terminal summary otherwise, and on CPython 3.11.7 compiling its modules that late (after an
# integration module) fails with "SystemError: AST constructor recursion depth mismatch".


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    """One real etcd for the whole run; tests keep apart by using their own key prefixes."""
    with EtcdServer() as server:
        yield server
