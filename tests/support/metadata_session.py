"""A separate process holding a metadata session, for tests that pause or kill its owner.

    python -m tests.support.metadata_session URL KEY [SESSION_TTL]

Opens the store, puts KEY as an ephemeral key, prints "ready" and waits. When its session
is lost it prints "session lost", then tries another ephemeral put and prints "put refused:
<ErrorName>" (or "put accepted", which a test treats as a bug). Exits when stdin closes.
"""

from __future__ import annotations

import asyncio
import sys

from magnetar.common.metadata import MetadataError, open_store


def say(line: str) -> None:
    print(line, flush=True)


async def main(url: str, key: str, ttl: int) -> None:
    store = await open_store(url, session_ttl=ttl)
    lost = asyncio.Event()
    store.add_session_listener(lost.set)
    await store.put(key, b"held by a subprocess", ephemeral=True)
    say("ready")
    stdin_closed = asyncio.create_task(asyncio.to_thread(sys.stdin.read))
    session_lost = asyncio.create_task(lost.wait())
    await asyncio.wait({stdin_closed, session_lost}, return_when=asyncio.FIRST_COMPLETED)
    if lost.is_set():
        say("session lost")
        try:
            await store.put(key + "-again", b"x", ephemeral=True)
            say("put accepted")
        except MetadataError as e:
            say(f"put refused: {type(e).__name__}")
        await stdin_closed
    await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 10))
