"""A pytest plugin that fails tests leaking an official ``pulsar.Client``, and makes the exit
status of a run the tests' verdict alone.

Why: the official client (``pulsar-client``, a C++ core) runs native threads. A client nobody
closed keeps them alive until the interpreter exits, and then C++ static destructors can meet a
still-joinable thread and abort the process ("terminate called without an active exception",
exit status 134) after every test passed. So:

* ``pulsar.Client.__init__``/``close``/``shutdown`` are wrapped when this module is imported
  (``tests/conftest.py`` loads it), so every client made in the pytest process is recorded with
  who made it: the test (its setup, call or teardown) or the fixture, with that fixture's scope
  node. Clients made in subprocesses (stream jobs, scripts, Spark workers) are their own
  processes' business and are not seen here.
* After each test's teardown - when the fixtures that end with it are finished, module- and
  session-scoped ones included when it is the last test using them - every still-open client
  whose owner has just ended (the test itself, or the module/class/package/session a fixture
  belonged to) is closed and the teardown fails with an error naming the test (and fixture) that
  created it. A module-scoped fixture may keep one client for its whole module; it is checked
  when the module ends.
* After pytest has printed its summary, the process leaves with ``os._exit(exitstatus)`` so that
  nothing left in native code can turn a verdict into an abort (see ``pytest_unconfigure``).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import pulsar
import pytest

_WRAPPED = "_magnetar_client_guard"


@dataclass
class _Record:
    client: pulsar.Client
    owner: pytest.Item | pytest.Collector | pytest.Session | None
    creator: str  # who made it, for the error message


class ClientGuard:
    """Tracks the clients made during one pytest run (one ``Config``)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.session: pytest.Session | None = None
        self.finished = False  # every pytest_sessionfinish ran without raising
        self.open: dict[int, _Record] = {}
        self._item: pytest.Item | None = None
        self._phase = ""
        self._fixtures: list[tuple[str, pytest.FixtureRequest]] = []

    # -- bookkeeping called by the wrapped pulsar.Client methods --------------------------------

    def created(self, client: pulsar.Client) -> None:
        item = self._item
        if self._fixtures:
            argname, request = self._fixtures[-1]
            owner: Any = request.node
            where = f" for {item.nodeid}" if item is not None else ""
            creator = f"fixture {argname!r} ({request.scope} scope, set up{where})"
        elif item is not None:
            owner = item
            creator = f"{item.nodeid} ({self._phase})"
        else:
            owner = self.session
            creator = "code outside any test (collection or session hooks)"
        self.open[id(client)] = _Record(client, owner, creator)

    def closed(self, client: pulsar.Client) -> None:
        self.open.pop(id(client), None)

    # -- where clients come from ---------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.session = session
        for record in self.open.values():  # made at import time, before the session existed
            if record.owner is None:
                record.owner = session

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(
        self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
    ) -> Generator[None, Any, Any]:
        self._fixtures.append((fixturedef.argname, request))
        try:
            return (yield)
        finally:
            self._fixtures.pop()

    def _phase_wrapper(self, item: pytest.Item, phase: str) -> Generator[None, Any, Any]:
        self._item, self._phase = item, phase
        try:
            return (yield)
        finally:
            self._item, self._phase = None, ""

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, Any, Any]:
        return (yield from self._phase_wrapper(item, "setup"))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, Any, Any]:
        return (yield from self._phase_wrapper(item, "call"))

    # -- the check ---------------------------------------------------------------------------

    @pytest.hookimpl(wrapper=True, trylast=True)  # inside the capture plugin's wrapper
    def pytest_runtest_teardown(
        self, item: pytest.Item, nextitem: pytest.Item | None
    ) -> Generator[None, Any, Any]:
        """Once this test's teardown (and that of every scope ending with it) is done, fails it
        if a client whose owner just ended is still open."""
        self._item, self._phase = item, "teardown"
        try:
            result = yield
        except BaseException as exc:  # the teardown failed already: the leak is added to its error
            if message := self._check(item, nextitem):
                exc.add_note(message)
            raise
        finally:
            self._item, self._phase = None, ""
        if message := self._check(item, nextitem):
            pytest.fail(message, pytrace=False)
        return result

    def _check(self, item: pytest.Item, nextitem: pytest.Item | None) -> str:
        """Closes the open clients owned by a node that ends with ``item``; describes them."""
        ended = {id(node) for node in item.listchain()}
        if nextitem is not None:
            ended -= {id(node) for node in nextitem.listchain()}
        leaked = [r for r in self.open.values() if id(r.owner) in ended]
        if not leaked:
            return ""
        self._close(leaked)
        return (
            f"{len(leaked)} pulsar.Client(s) left open, closed now by tests/support/client_guard.py"
            " (close each client in a finally block or in its fixture's teardown):\n"
            + "\n".join(f"  created by {r.creator}" for r in leaked)
        )

    def _close(self, records: list[_Record]) -> None:
        for record in records:
            self.open.pop(id(record.client), None)
            _close_quietly(record.client)

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> Generator[None, Any, Any]:
        """Clients still open after the last teardown (an interrupted run, or ones made outside
        any test) are closed and reported; a run that had passed is then failed."""
        try:
            return (yield)
        finally:
            leaked = list(self.open.values())
            if leaked:
                self._close(leaked)
                reporter = self.config.pluginmanager.get_plugin("terminalreporter")
                if reporter is not None:
                    reporter.write_sep("=", "pulsar.Client(s) left open at the end", red=True)
                    for r in leaked:
                        reporter.write_line(f"created by {r.creator}")
                if session.exitstatus == pytest.ExitCode.OK:
                    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _close_quietly(client: pulsar.Client) -> None:
    try:
        _ORIGINAL_CLOSE(client)
    except Exception:  # e.g. its broker is gone; shutdown still stops the threads
        try:
            _ORIGINAL_SHUTDOWN(client)
        except Exception:  # nothing more can be done for it
            pass


# -- wrapping pulsar.Client, once per process ---------------------------------------------------

_GUARDS: list[ClientGuard] = []  # the runs in progress; the innermost (pytester) one is last


def _wrap(method: Callable[..., Any], after: Callable[[pulsar.Client], None]) -> Callable[..., Any]:
    @functools.wraps(method)
    def wrapper(self: pulsar.Client, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        finally:
            after(self)

    setattr(wrapper, _WRAPPED, method)
    return wrapper


def _created(client: pulsar.Client) -> None:
    if _GUARDS:
        _GUARDS[-1].created(client)


def _closed(client: pulsar.Client) -> None:
    for guard in _GUARDS:
        guard.closed(client)


def _original(name: str) -> Callable[..., Any]:
    method = getattr(pulsar.Client, name)
    return getattr(method, _WRAPPED, method)


_ORIGINAL_INIT = _original("__init__")
_ORIGINAL_CLOSE = _original("close")
_ORIGINAL_SHUTDOWN = _original("shutdown")


def _init_then_record(self: pulsar.Client, *args: Any, **kwargs: Any) -> None:
    _ORIGINAL_INIT(self, *args, **kwargs)  # a client whose constructor raised was never made
    _created(self)


if not hasattr(pulsar.Client.__init__, _WRAPPED):
    setattr(_init_then_record, _WRAPPED, _ORIGINAL_INIT)
    functools.update_wrapper(_init_then_record, _ORIGINAL_INIT)
    pulsar.Client.__init__ = _init_then_record  # type: ignore[method-assign]
    pulsar.Client.close = _wrap(_ORIGINAL_CLOSE, _closed)  # type: ignore[method-assign]
    pulsar.Client.shutdown = _wrap(_ORIGINAL_SHUTDOWN, _closed)  # type: ignore[method-assign]


# -- plugin hooks ------------------------------------------------------------------------------

_MAIN_CONFIG: list[pytest.Config] = []  # the outermost run in this process


def _guard_of(config: pytest.Config) -> ClientGuard | None:
    return next((g for g in _GUARDS if g.config is config), None)


def pytest_configure(config: pytest.Config) -> None:
    guard = ClientGuard(config)
    config.pluginmanager.register(guard, "magnetar-client-guard")
    _GUARDS.append(guard)
    if not _MAIN_CONFIG:
        _MAIN_CONFIG.append(config)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> Generator[None, Any, Any]:
    """Notes that the session finished normally: every ``pytest_sessionfinish`` ran (this is
    the outermost wrapper), the terminal summary included."""
    result = yield
    if (guard := _guard_of(session.config)) is not None:
        guard.finished = True
    return result


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_unconfigure(config: pytest.Config) -> Generator[None, None, None]:
    """After every other plugin's ``pytest_unconfigure`` (this is the outermost wrapper of the
    last hook pytest calls, after the terminal summary is printed), the main pytest process exits
    with the session's exit status right away.

    Why ``os._exit``: a normal interpreter exit runs C++ static destructors of the official
    client's library (and of anything else native) while threads it started may still be alive,
    and a native thread calling into Python (the clients log through a Python logger) while the
    interpreter finalizes is ended by a forced unwind that aborts the process; either can turn a
    green run into an abort (134). Leaked clients were closed and reported above, so the verdict
    is already in ``session.exitstatus``; skipping the rest of the shutdown (atexit handlers,
    pytest's config cleanups, interpreter finalization) loses nothing a test run needs.

    Only when the session finished normally: if pytest itself is failing (an exception on its way
    out of ``pytest_sessionfinish`` or ``pytest_unconfigure``), it is left to surface with its
    traceback. Nested in-process runs (pytester's ``runpytest``/``inline_run``) only unregister,
    and a run that never reached a session (``--help``, usage errors) exits normally."""
    guard = _guard_of(config)
    if guard is not None:
        _GUARDS.remove(guard)
    try:
        yield
    finally:
        if guard is not None and guard.open:
            guard._close(list(guard.open.values()))
    main = bool(_MAIN_CONFIG) and _MAIN_CONFIG[0] is config
    if main:
        _MAIN_CONFIG.clear()
    if main and guard is not None and guard.session is not None and guard.finished:
        status = int(guard.session.exitstatus)
        try:
            config.get_terminal_writer().flush()
        except (AssertionError, OSError, ValueError):  # no terminal reporter, or a closed stream
            pass
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                if stream is not None:
                    stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(status)
