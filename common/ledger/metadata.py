"""Ledger metadata: quorum settings, state, and the fragments (ensembles) of a ledger.

Stored as a ``LedgerMetadata`` protobuf under ``/magnetar/ledgers/<id>`` and changed only by
compare-and-set on the key's version, so concurrent writers, recoverers and the auditor see each
other's changes instead of overwriting them.
"""

from __future__ import annotations

import bisect
import enum
from dataclasses import dataclass, field, replace

from magnetar.common.ledger.distribution import Quorum
from magnetar.common.proto import ledger_pb2

LEDGERS_PATH = "/magnetar/ledgers"
LEDGER_ID_COUNTER = "/magnetar/idgen/ledger"


class LedgerState(enum.IntEnum):
    OPEN = ledger_pb2.LedgerMetadata.OPEN
    IN_RECOVERY = ledger_pb2.LedgerMetadata.IN_RECOVERY
    CLOSED = ledger_pb2.LedgerMetadata.CLOSED


def ledger_key(ledger_id: int) -> str:
    return f"{LEDGERS_PATH}/{ledger_id}"


@dataclass(slots=True, frozen=True)
class Fragment:
    first_entry_id: int
    bookies: tuple[str, ...]


@dataclass(slots=True, frozen=True)
class LedgerMetadata:
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    fragments: tuple[Fragment, ...]
    state: LedgerState = LedgerState.OPEN
    last_entry_id: int = -1
    length: int = 0
    ctime_ms: int = 0
    custom_metadata: dict[str, bytes] = field(default_factory=dict)
    #: The writer's key (BookKeeper's master key): every add carries it, and a bookie refuses
    #: adds to this ledger id under another key (a reused id, or someone else's writer).
    master_key: bytes = b""

    @property
    def quorum(self) -> Quorum:
        return Quorum(self.ensemble_size, self.write_quorum, self.ack_quorum)

    @property
    def is_closed(self) -> bool:
        return self.state is LedgerState.CLOSED

    @property
    def last_fragment(self) -> Fragment:
        return self.fragments[-1]

    def fragment_for(self, entry_id: int) -> Fragment:
        """The fragment whose ensemble stores ``entry_id``."""
        starts = [f.first_entry_id for f in self.fragments]
        return self.fragments[max(bisect.bisect_right(starts, entry_id) - 1, 0)]

    def with_fragment(self, first_entry_id: int, bookies: tuple[str, ...]) -> LedgerMetadata:
        """A new last fragment from ``first_entry_id`` (replacing one that starts there)."""
        kept = tuple(f for f in self.fragments if f.first_entry_id < first_entry_id)
        return replace(self, fragments=(*kept, Fragment(first_entry_id, bookies)))

    def with_ensemble_from(self, first_entry_id: int, bookies: tuple[str, ...]) -> LedgerMetadata:
        """``bookies`` serve the entries from ``first_entry_id`` until the next fragment: the
        fragment starting there gets them, or a new one starts there (splitting the fragment
        that served it). Fragments starting later are kept."""
        before = tuple(f for f in self.fragments if f.first_entry_id < first_entry_id)
        after = tuple(f for f in self.fragments if f.first_entry_id > first_entry_id)
        return replace(self, fragments=(*before, Fragment(first_entry_id, bookies), *after))

    def to_bytes(self) -> bytes:
        msg = ledger_pb2.LedgerMetadata(
            ensemble_size=self.ensemble_size,
            write_quorum=self.write_quorum,
            ack_quorum=self.ack_quorum,
            state=int(self.state),
            last_entry_id=self.last_entry_id,
            length=self.length,
            digest_type=ledger_pb2.LedgerMetadata.CRC32C,
            ctime_ms=self.ctime_ms,
            custom_metadata=self.custom_metadata,
            master_key=self.master_key,
            fragments=[
                ledger_pb2.LedgerMetadata.Fragment(
                    first_entry_id=f.first_entry_id, bookies=list(f.bookies)
                )
                for f in self.fragments
            ],
        )
        return msg.SerializeToString()

    @classmethod
    def from_bytes(cls, raw: bytes) -> LedgerMetadata:
        msg = ledger_pb2.LedgerMetadata.FromString(raw)
        return cls(
            ensemble_size=msg.ensemble_size,
            write_quorum=msg.write_quorum,
            ack_quorum=msg.ack_quorum,
            fragments=tuple(Fragment(f.first_entry_id, tuple(f.bookies)) for f in msg.fragments),
            state=LedgerState(msg.state),
            last_entry_id=msg.last_entry_id,
            length=msg.length,
            ctime_ms=msg.ctime_ms,
            custom_metadata=dict(msg.custom_metadata),
            master_key=msg.master_key,
        )

    def to_json_dict(self) -> dict[str, object]:
        return {
            "ensemble_size": self.ensemble_size,
            "write_quorum": self.write_quorum,
            "ack_quorum": self.ack_quorum,
            "state": self.state.name,
            "last_entry_id": self.last_entry_id,
            "length": self.length,
            "ctime_ms": self.ctime_ms,
            "custom_metadata": {
                k: v.decode("utf-8", "replace") for k, v in self.custom_metadata.items()
            },
            "fragments": [
                {"first_entry_id": f.first_entry_id, "bookies": list(f.bookies)}
                for f in self.fragments
            ],
        }
