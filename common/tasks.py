"""Background tasks nobody awaits, whose failures are still seen: each is kept in a set while
it runs (so it is not garbage-collected) and its exception, if any, is logged. And a bounded
wait for an event that never loses its task's cancellation."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

_running: set[asyncio.Task[Any]] = set()


def spawn_logged(
    coro: Coroutine[Any, Any, Any],
    log: logging.Logger,
    what: str,
    *,
    tracked: set[asyncio.Task[Any]] | None = None,
    level: int = logging.WARNING,
) -> asyncio.Task[Any]:
    """Run ``coro`` in the background; a failure is logged as "``what`` failed". ``tracked``:
    the owner's own set (to cancel its tasks), else a module-wide one."""
    task = asyncio.get_running_loop().create_task(coro, name=what)
    keep = _running if tracked is None else tracked
    keep.add(task)

    def done(task: asyncio.Task[Any]) -> None:
        keep.discard(task)
        if not task.cancelled() and task.exception() is not None:
            error = task.exception()
            # A traceback only for what is a bug (ERROR); an expected failure is one line.
            log.log(
                level,
                "%s failed: %s",
                what,
                error,
                exc_info=error if level >= logging.ERROR else None,
            )

    task.add_done_callback(done)
    return task


async def wait_set(event: asyncio.Event, seconds: float) -> bool:
    """Wait at most ``seconds`` for ``event``; whether it is set.

    Not ``asyncio.wait_for``: on Python 3.11 it drops a cancellation that arrives in the turn the
    event is set (it returns the event's result instead), so a loop stopped by cancelling its task
    went on for ever (a geo-replicator's, and with it the unload of its bundle).
    ``asyncio.timeout`` turns only its own cancellation into ``TimeoutError``."""
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        pass
    return event.is_set()
