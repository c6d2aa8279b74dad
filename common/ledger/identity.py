"""Cluster identity in the metadata store: the instance id and the bookies' cookies.

BookKeeper keeps both: an *instance id* created once per cluster, and per bookie a *cookie*
(instance id, address, directories) written on the bookie's disks and in the metadata store.
Comparing the two at every bookie start catches what neither side can see alone: disks that
were wiped or swapped, and a metadata store that was reset, restored wrongly or belongs to
another cluster (see ``magnetar.bookie.cookie`` for the rules).

- ``/magnetar/cluster/instance-id``: a UUID, created with must-not-exist, so concurrent
  creators agree on one.
- ``/magnetar/cookies/<host:port>``: the bookie's :class:`Cookie` as JSON.

A bookie whose disks were lost is brought back by ``magnetar bk reregister``
(:func:`reregister`): a new incarnation of its cookie, marked not yet formatted, and
``wiped_below``, the first ledger id allocated after the loss. That bookie answers WIPED, not
"no such entry", for older ledgers, so ledger recovery does not count it as proof that an
entry is absent.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass, replace

from magnetar.common.ledger.bookies import registration_key
from magnetar.common.ledger.metadata import LEDGER_ID_COUNTER, LEDGERS_PATH
from magnetar.common.metadata import NOT_EXISTS, BadVersionError, MetadataStore

INSTANCE_ID_KEY = "/magnetar/cluster/instance-id"
COOKIES_PATH = "/magnetar/cookies"


def cookie_key(address: str) -> str:
    return f"{COOKIES_PATH}/{address}"


class IdentityError(ValueError):
    """A cookie or the instance id cannot be used as asked; the message says why and what to do."""


@dataclass(slots=True, frozen=True)
class Cookie:
    """One bookie's identity.

    ``incarnation`` grows by one at every ``reregister``; disks carrying an older one hold data
    the cluster already gave up. ``wiped_below``: ledgers with smaller ids were created before
    the last re-registration (0: never re-registered). ``formatted`` is False in the store
    between ``reregister`` and the bookie's first start on its new, empty directories.
    An ``instance_id`` of "" is a cookie written before instance ids existed (address only).
    """

    instance_id: str
    address: str
    journal_dir: str = ""
    ledger_dir: str = ""
    incarnation: int = 1
    wiped_below: int = 0
    formatted: bool = True

    def to_json(self) -> bytes:
        return (json.dumps(asdict(self), sort_keys=True) + "\n").encode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> Cookie:
        data = json.loads(raw)
        if not isinstance(data, dict) or not isinstance(data.get("address"), str):
            raise ValueError("not a cookie: no address")
        return cls(
            instance_id=str(data.get("instance_id", "")),
            address=data["address"],
            journal_dir=str(data.get("journal_dir", "")),
            ledger_dir=str(data.get("ledger_dir", "")),
            incarnation=int(data.get("incarnation", 1)),
            wiped_below=int(data.get("wiped_below", 0)),
            formatted=bool(data.get("formatted", True)),
        )

    def same_bookie(self, other: Cookie) -> bool:
        """Same cluster, address and incarnation (directories may have moved)."""
        return (self.instance_id, self.address, self.incarnation) == (
            other.instance_id,
            other.address,
            other.incarnation,
        )

    def describe(self) -> str:
        return (
            f"bookie {self.address} of cluster {self.instance_id or '(unknown)'}, "
            f"incarnation {self.incarnation}"
        )


async def read_instance_id(store: MetadataStore) -> tuple[str, int] | None:
    """The cluster's instance id and the key's version, or None if the store has none."""
    found = await store.get(INSTANCE_ID_KEY)
    if found is None:
        return None
    return found.value.decode(), found.version


async def create_instance_id(store: MetadataStore) -> tuple[str, int]:
    """Create the instance id if there is none; the id that stands (ours or a concurrent one)."""
    try:
        version = await store.put(INSTANCE_ID_KEY, str(uuid.uuid4()).encode(), NOT_EXISTS)
    except BadVersionError:
        pass
    else:
        found = await read_instance_id(store)
        assert found is not None and found[1] == version
        return found
    found = await read_instance_id(store)
    if found is None:
        raise IdentityError(f"{INSTANCE_ID_KEY} exists and vanished while being read; retry")
    return found


async def store_has_ledgers(store: MetadataStore) -> bool:
    """Whether the store knows ledgers (a cluster from before instance ids, being upgraded)."""
    if await store.get(LEDGER_ID_COUNTER) is not None:
        return True
    return bool(await store.children(LEDGERS_PATH))


async def read_cookie(store: MetadataStore, address: str) -> tuple[Cookie, int] | None:
    found = await store.get(cookie_key(address))
    if found is None:
        return None
    try:
        return Cookie.from_json(found.value), found.version
    except (ValueError, TypeError) as e:
        raise IdentityError(
            f"the cookie of bookie {address} in the metadata store ({cookie_key(address)}) is "
            f"damaged ({e}); restore the metadata store from a backup"
        ) from None


async def list_cookies(store: MetadataStore) -> list[Cookie]:
    found = await store.scan(COOKIES_PATH + "/")
    return sorted((Cookie.from_json(v.value) for v in found.values()), key=lambda c: c.address)


async def reregister(store: MetadataStore, address: str) -> Cookie:
    """Record that bookie ``address`` lost its disks and comes back empty.

    The new cookie has the next incarnation, is not yet formatted (the bookie's next start on
    empty directories takes it), and ``wiped_below`` is the first ledger id not yet allocated:
    every ledger that could have had entries on the lost disks is below it. Refused while the
    bookie is registered (running), or when the store has no cookie for it.
    """
    if await store.get(registration_key(address)) is not None:
        raise IdentityError(
            f"bookie {address} is running (registered as available); stop it before "
            "re-registering it"
        )
    found = await read_cookie(store, address)
    if found is None:
        raise IdentityError(
            f"the metadata store has no cookie for bookie {address}: nothing to re-register "
            "(a new bookie registers itself at its first start)"
        )
    old, version = found
    counter = await store.get(LEDGER_ID_COUNTER)
    wiped_below = int(counter.value) + 1 if counter is not None else 0
    new = replace(
        old,
        incarnation=old.incarnation + 1,
        wiped_below=max(wiped_below, old.wiped_below),
        formatted=False,
    )
    try:
        await store.put(cookie_key(address), new.to_json(), version)
    except BadVersionError:
        raise IdentityError(
            f"the cookie of bookie {address} changed while re-registering it; run it again"
        ) from None
    return new
