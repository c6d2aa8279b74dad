"""Waiting for a condition in tests: poll until it holds, fail naming what was awaited.

Timeouts here bound a wait; they are never the thing a test asserts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    check: Callable[[], T | None],
    what: str = "the condition",
    timeout: float = 30.0,
    interval: float = 0.1,
) -> T:
    """Call ``check`` until it returns a truthy value, and return that value; fail with
    ``what`` in the message once ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for: {what}"
        time.sleep(interval)


async def wait_until_async(
    check: Callable[[], Awaitable[bool]], timeout: float = 30.0, interval: float = 0.02
) -> bool:
    """Await ``check`` until it is true: True, or False once ``timeout`` seconds have passed
    (the caller asserts, so a test can also expect a condition never to come)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if await check():
            return True
        await asyncio.sleep(interval)
    return False
