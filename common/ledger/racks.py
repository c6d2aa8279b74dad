"""Bookie rack information, as Pulsar's admin keeps it (``/admin/v2/bookies/racks-info``).

One JSON document in the metadata store, Pulsar's ``BookiesRackConfiguration``: placement group
-> bookie address -> ``{"rack": ..., "hostname": ...}``. A bookie is in at most one group (setting
it in another moves it). The ledger client reads it with the registered bookies
(``LedgerClient.registered_bookies``) so that placement can prefer distinct racks
(``placement.RackAwarePlacement``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from magnetar.common.metadata import MetadataStore
from magnetar.common.metadata.store import NOT_EXISTS, BadVersionError

T = TypeVar("T")

RACKS_PATH = "/magnetar/bookies/racks"
#: The rack of a bookie without rack information (Pulsar's default for rack-aware placement).
DEFAULT_RACK = "/default-rack"


class InvalidRackError(ValueError):
    """A rack name rack-aware placement cannot use."""


@dataclass(slots=True, frozen=True)
class BookieRackInfo:
    """Pulsar's ``BookieInfo``."""

    rack: str
    hostname: str | None = None

    def to_dict(self) -> dict[str, str]:
        # Pulsar's JSON leaves out what is not set.
        return {"rack": self.rack} | ({"hostname": self.hostname} if self.hostname else {})

    @classmethod
    def from_dict(cls, data: object) -> BookieRackInfo:
        if not isinstance(data, dict):
            raise InvalidRackError("a bookie's rack information is a JSON object")
        rack, hostname = data.get("rack"), data.get("hostname")
        if not isinstance(rack, str) or (hostname is not None and not isinstance(hostname, str)):
            raise InvalidRackError("'rack' must be a string (and 'hostname', when given)")
        return cls(normalize_rack(rack), hostname or None)


def normalize_rack(rack: str) -> str:
    """Pulsar's rule for rack-aware placement (region awareness off): a rack name has no ``/``
    inside it (one at either end is fine); an empty name, or ``/``, means the default rack.
    The name is kept as BookKeeper's network topology writes it: ``/name``."""
    inner = rack.strip("/")
    if not inner:
        return DEFAULT_RACK
    if "/" in inner:
        raise InvalidRackError(
            "Bookie 'rack' parameter is invalid, When `RackawareEnsemblePlacementPolicy` is "
            "enabled, the rack name is not allowed to contain slash (`/`) except for the "
            "beginning and end of the rack name string."
        )
    return "/" + inner


@dataclass(slots=True)
class RackConfiguration:
    """Group -> bookie address -> rack information."""

    groups: dict[str, dict[str, BookieRackInfo]]

    @classmethod
    def empty(cls) -> RackConfiguration:
        return cls({})

    @classmethod
    def from_json(cls, raw: bytes) -> RackConfiguration:
        data = json.loads(raw)
        if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
            raise InvalidRackError("rack information is a JSON object of groups of bookies")
        return cls(
            {
                group: {
                    address: BookieRackInfo.from_dict(info) for address, info in bookies.items()
                }
                for group, bookies in data.items()
            }
        )

    def to_dict(self) -> dict[str, dict[str, dict[str, str]]]:
        return {
            group: {address: info.to_dict() for address, info in bookies.items()}
            for group, bookies in self.groups.items()
        }

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), sort_keys=True).encode()

    def get(self, address: str) -> BookieRackInfo | None:
        for bookies in self.groups.values():
            if address in bookies:
                return bookies[address]
        return None

    def update(self, group: str, address: str, info: BookieRackInfo) -> None:
        """Set ``address``'s information in ``group``, taking it out of any other group."""
        self.remove(address)
        self.groups.setdefault(group, {})[address] = info

    def remove(self, address: str) -> bool:
        """Take ``address`` out; False if it had no information. An emptied group goes too."""
        for group, bookies in list(self.groups.items()):
            if bookies.pop(address, None) is not None:
                if not bookies:
                    del self.groups[group]
                return True
        return False

    def racks(self) -> dict[str, str]:
        """Bookie address -> rack, over every group."""
        return {a: info.rack for bookies in self.groups.values() for a, info in bookies.items()}


async def load_racks(store: MetadataStore) -> tuple[RackConfiguration, int | None]:
    """The stored configuration and its version (None: nothing stored yet)."""
    found = await store.get(RACKS_PATH)
    if found is None:
        return RackConfiguration.empty(), None
    return RackConfiguration.from_json(found.value), found.version


async def update_racks(store: MetadataStore, change: Callable[[RackConfiguration], T]) -> T:
    """Apply ``change`` to the stored configuration and store it (compare-and-set, retried when
    another writer came first); returns what ``change`` returned."""
    while True:
        config, version = await load_racks(store)
        result = change(config)
        try:
            await store.put(
                RACKS_PATH, config.to_json(), NOT_EXISTS if version is None else version
            )
        except BadVersionError:
            continue
        return result
