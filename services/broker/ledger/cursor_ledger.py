"""CursorLedger: the ledgers a cursor stores its large state in (Pulsar's cursor ledger).

A cursor whose state is too large for the metadata store appends it, whole, as one entry of a
ledger of its own; its metadata record then names that ledger, and the last entry of the named
ledger is the cursor's state. The rules that keep that safe:

* An entry is appended before the record names its ledger, so a named ledger always holds a
  state at least as new as the record.
* A ledger is deleted only once the record names another one (or none): the record never
  names a deleted ledger, except after a crash between the two steps, where only a ledger
  the record no longer names is left behind.
* A new owner opens the named ledger with recovery, which fences it: a previous owner that
  still appends to it fails (LedgerFencedError) instead of writing a state nobody reads.
* The ledger rolls after ``cursor_ledger_max_entries`` entries or ``cursor_ledger_max_bytes``
  bytes (old states are garbage; rolling lets the bookies reclaim them).

These ledgers are created with the managed ledger's E/Qw/Qa through its LedgerClient and are
never in the managed ledger's ledger list: trimming and retention do not see them.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from magnetar.broker.ledger.cursor_state import CursorState, decode, encode_within
from magnetar.common.ledger.entry import HEADER_SIZE
from magnetar.common.ledger.errors import LedgerFencedError, NoSuchLedgerError
from magnetar.common.ledger.handle import LedgerHandle

if TYPE_CHECKING:
    from magnetar.broker.ledger.managed_ledger import ManagedLedger

log = logging.getLogger(__name__)

#: Opening (with recovery) and reading the last entry of a cursor ledger at load time.
READ_TIMEOUT_S = 30.0


class CursorLedger:
    """The writable cursor ledger of one cursor and the ledgers waiting to be deleted."""

    def __init__(self, ml: ManagedLedger, cursor_name: str, named: int | None = None) -> None:
        self.ml = ml
        self.cursor_name = cursor_name
        #: The ledger the cursor's metadata record names (None: the state is in the record).
        self.named = named
        self._handle: LedgerHandle | None = None
        self._doomed: set[int] = set()  # no longer named; deleted when the bookies let us

    def __repr__(self) -> str:
        current = self._handle.ledger_id if self._handle is not None else None
        return f"CursorLedger({self.cursor_name!r}, named={self.named}, current={current})"

    @property
    def current(self) -> int | None:
        """The ledger being appended to, if any."""
        return self._handle.ledger_id if self._handle is not None else None

    @property
    def doomed(self) -> frozenset[int]:
        return frozenset(self._doomed)

    async def append(self, state: CursorState) -> tuple[int, CursorState]:
        """Append ``state`` as one entry (to a new ledger when there is none, it is full, or the
        last append failed). Returns the ledger and the state written: all of ``state``, or the
        largest prefix that fits in one entry. Raises LedgerFencedError when another owner
        recovered the ledger, LedgerError when the bookies did not take it."""
        handle = await self._writable()
        limit = handle.max_entry_size - HEADER_SIZE
        data, written = await asyncio.to_thread(encode_within, state, limit)
        try:
            await handle.add(data)
        except LedgerFencedError:
            raise
        except Exception:
            # This ledger takes no more adds: the next append starts a new one.
            await self._retire()
            raise
        return handle.ledger_id, written

    def named_now(self, ledger_id: int | None) -> None:
        """The metadata record names ``ledger_id`` now (None: it holds the state itself)."""
        if self.named is not None and self.named != ledger_id:
            self._doomed.add(self.named)
        self.named = ledger_id

    async def _writable(self) -> LedgerHandle:
        cfg = self.ml.config
        handle = self._handle
        if handle is not None and (
            handle.last_add_confirmed + 1 >= cfg.cursor_ledger_max_entries
            or handle.length >= cfg.cursor_ledger_max_bytes
        ):
            await self._retire()
            handle = None
        if handle is None:
            handle = self._handle = await self.ml.client.create_ledger(
                cfg.ensemble_size,
                cfg.write_quorum,
                cfg.ack_quorum,
                custom_metadata={
                    "managed-ledger": self.ml.name.encode(),
                    "cursor": self.cursor_name.encode(),
                    "application": b"magnetar",
                },
            )
            log.info(
                "cursor %s/%s: cursor ledger %d created",
                self.ml.name,
                self.cursor_name,
                handle.ledger_id,
            )
        return handle

    async def _retire(self) -> None:
        """Stop appending to the current ledger; delete it later unless the record names it."""
        handle, self._handle = self._handle, None
        if handle is None:
            return
        try:
            await handle.close()
        except Exception as e:  # a failed or fenced ledger: its end is recovery's business
            log.debug("cursor ledger %d: close: %s", handle.ledger_id, e)
        if handle.ledger_id != self.named:
            self._doomed.add(handle.ledger_id)

    async def release_unnamed(self) -> None:
        """Close and delete every ledger the record does not name (best effort: a ledger the
        bookies did not let go is tried again next time)."""
        if self._handle is not None and self._handle.ledger_id != self.named:
            await self._retire()
        for ledger_id in sorted(self._doomed):
            if ledger_id == self.named:
                self._doomed.discard(ledger_id)
                continue
            try:
                await self.ml.client.delete_ledger(ledger_id)
            except NoSuchLedgerError:
                pass
            except Exception as e:
                log.warning(
                    "cursor %s/%s: deleting cursor ledger %d failed (tried again later): %s",
                    self.ml.name,
                    self.cursor_name,
                    ledger_id,
                    e,
                )
                continue
            self._doomed.discard(ledger_id)
            log.info(
                "cursor %s/%s: cursor ledger %d deleted", self.ml.name, self.cursor_name, ledger_id
            )

    async def close(self) -> None:
        """Close the ledger being appended to (it stays named; the next owner reads it)."""
        handle, self._handle = self._handle, None
        if handle is not None:
            try:
                await handle.close()
            except Exception as e:
                log.debug("cursor ledger %d: close: %s", handle.ledger_id, e)
            if handle.ledger_id != self.named:
                self._doomed.add(handle.ledger_id)

    async def delete_all(self) -> None:
        """The cursor is gone: delete every ledger it has (after its record was deleted)."""
        await self.close()
        self.named_now(None)
        await self.release_unnamed()


async def read_last_state(ml: ManagedLedger, ledger_id: int) -> CursorState:
    """The state in the last entry of cursor ledger ``ledger_id``, opened with recovery (which
    fences a previous owner still appending to it). Raises LedgerError, CursorStateError or
    TimeoutError."""
    async with asyncio.timeout(READ_TIMEOUT_S):
        handle = await ml.client.open_ledger(ledger_id, recovery=True)
        try:
            last = handle.metadata.last_entry_id
            if last < 0:
                raise NoSuchLedgerError(f"cursor ledger {ledger_id} has no entries")
            entry = await handle.read_entry(last)
        finally:
            await handle.close()
    return await asyncio.to_thread(decode, entry.payload)
