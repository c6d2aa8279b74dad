"""Where bookies announce themselves in the metadata store, and how clients find them.

Each running bookie holds an ephemeral key ``/magnetar/bookies/available/<host:port>`` whose JSON
value says how to reach it and whether it takes writes. The key vanishes with the bookie's
session, which is how clients (and the auditor) learn that a bookie is gone.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace

from magnetar.common.metadata import MetadataStore

AVAILABLE_PATH = "/magnetar/bookies/available"


@dataclass(slots=True, frozen=True)
class BookieRegistration:
    address: str  # host:port of the bookie protocol
    http_address: str
    read_only: bool
    free_bytes: int
    total_bytes: int
    max_entry_size: int = 0  # largest entry it accepts, header included (0: not said)
    #: Its rack, from the rack information the admin stores (not from the bookie; None: unset).
    rack: str | None = None

    def to_json(self) -> bytes:
        data = asdict(self)
        del data["rack"]
        return json.dumps(data, sort_keys=True).encode()

    def on_rack(self, rack: str | None) -> BookieRegistration:
        return replace(self, rack=rack)

    @classmethod
    def from_json(cls, raw: bytes) -> BookieRegistration:
        data = json.loads(raw)
        return cls(
            address=data["address"],
            http_address=data.get("http_address", ""),
            read_only=bool(data.get("read_only", False)),
            free_bytes=int(data.get("free_bytes", 0)),
            total_bytes=int(data.get("total_bytes", 0)),
            max_entry_size=int(data.get("max_entry_size", 0)),
        )


def registration_key(address: str) -> str:
    return f"{AVAILABLE_PATH}/{address}"


async def list_bookies(store: MetadataStore) -> list[BookieRegistration]:
    """Every registered bookie, sorted by address."""
    found = await store.scan(AVAILABLE_PATH + "/")
    bookies = [BookieRegistration.from_json(v.value) for v in found.values()]
    return sorted(bookies, key=lambda b: b.address)
