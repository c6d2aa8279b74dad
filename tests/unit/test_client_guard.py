"""The client guard (``tests/support/client_guard.py``) in an inner pytest run of its own
process: a test or fixture leaving an official ``pulsar.Client`` open fails, naming who made
it, and the leaked client is closed; the exit status is the tests' verdict even when the
interpreter's own exit would have aborted. No broker is needed: a client constructs without
connecting."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[2]

LEAKS = """
import pulsar
import pytest

URL = "pulsar://127.0.0.1:1"
KEPT = []


def new_client():
    return pulsar.Client(URL, operation_timeout_seconds=1)


@pytest.fixture(scope="module")
def shared():
    c = new_client()
    yield c
    c.close()


@pytest.fixture(scope="module")
def never_closed():
    yield new_client()


@pytest.fixture
def closed_by_teardown():
    c = new_client()
    yield c
    c.close()


def test_closes_its_client(shared, closed_by_teardown):
    c = new_client()
    c.close()


def test_keeps_a_client():
    KEPT.append(new_client())


def test_the_kept_client_was_closed_by_the_guard():
    with pytest.raises(pulsar.AlreadyClosed):
        KEPT[0].create_producer("t")


def test_drops_a_client_unclosed():
    new_client()


def test_uses_the_leaking_fixture(never_closed, shared):
    pass


def test_last_of_the_module(shared):
    pass
"""

ABORTS_AT_EXIT = """
import atexit
import os

import pytest


@pytest.mark.parametrize("verdict", [{verdicts}])
def test_verdict(verdict):
    # What an unjoined native thread does at interpreter exit, made certain.
    atexit.register(os.abort)
    assert verdict
"""


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    return pytester


def run(pytester: pytest.Pytester) -> pytest.RunResult:
    return pytester.runpytest_subprocess(
        "-p", "tests.support.client_guard", "-p", "no:cacheprovider", "-rE", timeout=120
    )


def test_leaking_tests_and_fixtures_fail_naming_who_made_the_client(inner: pytest.Pytester) -> None:
    inner.makepyfile(test_leaks=LEAKS)
    result = run(inner)
    result.assert_outcomes(passed=6, errors=3)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines_random(
        [
            "*ERROR at teardown of test_keeps_a_client*",
            "*created by test_leaks.py::test_keeps_a_client (call)",
            "*ERROR at teardown of test_drops_a_client_unclosed*",
            "*created by test_leaks.py::test_drops_a_client_unclosed (call)",
            # A module-scoped fixture is checked when its module ends, at its last test.
            "*ERROR at teardown of test_last_of_the_module*",
            "*created by fixture 'never_closed' (module scope, set up for "
            "test_leaks.py::test_uses_the_leaking_fixture)",
        ]
    )
    for test in ("test_closes_its_client", "test_uses_the_leaking_fixture"):
        result.stdout.no_fnmatch_line(f"*ERROR at teardown of {test}*")
    result.stdout.no_fnmatch_line("*terminate called*")


@pytest.mark.parametrize(
    ("verdicts", "status"),
    [("True", pytest.ExitCode.OK), ("True, False", pytest.ExitCode.TESTS_FAILED)],
)
def test_exit_status_is_the_verdict_even_if_exiting_would_abort(
    inner: pytest.Pytester, verdicts: str, status: pytest.ExitCode
) -> None:
    inner.makepyfile(test_aborts=ABORTS_AT_EXIT.format(verdicts=verdicts))
    result = run(inner)
    assert result.ret == status, result.stderr.str()
    # The summary was printed (and flushed) before the process left.
    result.stdout.fnmatch_lines(["*1 passed*"])


def test_pytest_failing_on_its_way_out_is_not_hidden(inner: pytest.Pytester) -> None:
    """The hard exit is for a session that finished: an error in pytest's own shutdown still
    ends the run with its traceback and a failing status."""
    inner.makeconftest(
        """
        def pytest_sessionfinish(session):
            raise RuntimeError("broken at session finish")
        """
    )
    inner.makepyfile(test_passes="def test_passes():\n    pass\n")
    result = run(inner)
    assert result.ret != pytest.ExitCode.OK  # Python's status for an uncaught exception: 1
    result.stderr.fnmatch_lines(["RuntimeError: broken at session finish"])
