"""The bookie's identity: its cookie on both disks and in the metadata store (BookKeeper's
cookie check, run before the storage opens anything).

Ledger metadata names each replica by the bookie's address, and the metadata store is the only
record of which ledgers exist. So a bookie may serve only if its disks, its address and the
metadata store agree:

- Both directories carry the same cookie, naming this address (a start under another address,
  directories of two different bookies, or one directory without its cookie are refused).
- The store's instance id is the cookie's: a store without one, beside disks whose cookie names
  a cluster or that hold data, was reset or lost (refused: restore it); another id is another
  cluster (refused). The first start of a bookie against an empty store creates the id.
- The store's cookie for this address is the disks' (same incarnation). Empty disks beside a
  stored cookie were wiped or replaced: refused until ``magnetar bk reregister`` records that
  the bookie comes back empty (then its next start on empty disks takes the new cookie).
  Disks of an older incarnation than the store's hold data the cluster gave up: refused.

Cookies written before instance ids existed (address only) are upgraded when the store still
knows the cluster's ledgers.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path

from magnetar.common.ledger.identity import (
    Cookie,
    IdentityError,
    cookie_key,
    create_instance_id,
    read_cookie,
    read_instance_id,
    store_has_ledgers,
)
from magnetar.common.metadata import NOT_EXISTS, BadVersionError, MetadataStore

log = logging.getLogger(__name__)

COOKIE = "bookie-cookie.json"
#: Bytes of a journal file or entry log that hold no record yet (the file's magic).
_EMPTY_FILE_BYTES = 8


class BookieIdentityError(IdentityError):
    """The directories, the address and the metadata store do not belong together."""


def read_disk_cookies(journal_dir: Path, ledger_dir: Path) -> dict[Path, Cookie]:
    found = {}
    for directory in (journal_dir, ledger_dir):
        path = directory / COOKIE
        if path.exists():
            try:
                found[directory] = Cookie.from_json(path.read_text())
            except (ValueError, KeyError, TypeError) as e:
                raise BookieIdentityError(
                    f"{path} is damaged ({e}); restore it or remove it"
                ) from e
    return found


def holds_data(journal_dir: Path, ledger_dir: Path) -> list[Path]:
    """Files that show a bookie ran here: journal or entry-log records, or an index."""
    found = [
        p
        for p in [
            *(journal_dir / "current").glob("*.jnl"),
            *(ledger_dir / "current").glob("*.log"),
        ]
        if p.stat().st_size > _EMPTY_FILE_BYTES
    ]
    if (ledger_dir / "index.db").exists():
        found.append(ledger_dir / "index.db")
    return found


def _check_disks(address: str, journal_dir: Path, ledger_dir: Path) -> Cookie | None:
    """The disks' cookie (None: neither directory has one), or the refusal."""
    found = read_disk_cookies(journal_dir, ledger_dir)
    for directory, cookie in found.items():
        if cookie.address != address:
            raise BookieIdentityError(
                f"{directory} holds the data of bookie {cookie.address}, and this bookie would "
                f"serve it as {address}: ledgers name their replicas by address, so their "
                f"entries would be unreachable. Start it as {cookie.address} (same advertised "
                "address and port)"
            )
    if len(found) == 1:
        (has,) = found
        lacks = ledger_dir if has == journal_dir else journal_dir
        raise BookieIdentityError(
            f"{has} belongs to bookie {found[has].address} but {lacks} has no cookie: was that "
            "disk replaced or wiped? Serving without its data would let fenced writers in "
            "again and make recovery miss acknowledged entries; restore the directory, or wipe "
            f"both directories and run `magnetar bk reregister --address {address}` so the "
            "bookie comes back empty and the auditor re-replicates"
        )
    if not found:
        return None
    journal, ledgers = found[journal_dir], found[ledger_dir]
    if not journal.same_bookie(ledgers) and journal.instance_id and ledgers.instance_id:
        raise BookieIdentityError(
            f"{journal_dir} and {ledger_dir} belong to different bookies ({journal.describe()}; "
            f"{ledgers.describe()}); put back the directories that belong together"
        )
    return journal if journal.instance_id else ledgers


def _recorded_dirs(journal_dir: Path, ledger_dir: Path) -> dict[str, str]:
    return {"journal_dir": os.path.abspath(journal_dir), "ledger_dir": os.path.abspath(ledger_dir)}


def write_disk_cookie(cookie: Cookie, journal_dir: Path, ledger_dir: Path) -> None:
    for directory in (journal_dir, ledger_dir):
        _write_durably(directory / COOKIE, cookie.to_json().decode())


async def verify_identity(
    store: MetadataStore,
    address: str,
    journal_dir: Path,
    ledger_dir: Path,
    *,
    store_name: str = "the metadata store",
) -> Cookie:
    """Check (or, for a new bookie, write) the cookies; the bookie's cookie, or the refusal.

    ``store_name`` names the store in refusals (its URL, or standalone's meta.db)."""
    disk = _check_disks(address, journal_dir, ledger_dir)
    data = holds_data(journal_dir, ledger_dir)
    dirs = _recorded_dirs(journal_dir, ledger_dir)
    instance = await read_instance_id(store)
    if instance is None:
        if disk is not None and disk.instance_id:
            raise BookieIdentityError(
                f"{store_name} does not know this bookie's cluster {disk.instance_id} (no "
                "instance id): it was reset or lost, or it is another cluster's store. The "
                f"directories {journal_dir} and {ledger_dir} hold the data of "
                f"{disk.describe()}, and the ledgers that data belongs to are recorded only "
                "in that cluster's metadata store; starting would serve none of it and could "
                f"reuse its ledger ids. Restore {store_name} from a backup (or point the "
                "bookie at its cluster's store); the bookie will not start until then"
            )
        if (disk is not None or data) and not await store_has_ledgers(store):
            shown = ", ".join(str(p) for p in data[:3]) or f"the cookie in {journal_dir}"
            raise BookieIdentityError(
                f"{store_name} is empty (no instance id, no ledgers) but this bookie holds "
                f"data ({shown}): the metadata store was reset or lost. Restore {store_name} "
                "from a backup; the bookie will not start on an empty store while it holds "
                "data"
            )
        instance = await create_instance_id(store)
        log.info("cluster instance id %s created in %s", instance[0], store_name)
    instance_id, _instance_version = instance
    if disk is not None and disk.instance_id and disk.instance_id != instance_id:
        raise BookieIdentityError(
            f"this bookie belongs to cluster {disk.instance_id} but {store_name} is cluster "
            f"{instance_id}'s: the bookie was started against another cluster's metadata "
            "store. Point it at its own cluster's store (metadata_url); to move it to this "
            "cluster, wipe its directories and start it as a new bookie"
        )
    stored = await read_cookie(store, address)
    if stored is not None and stored[0].instance_id != instance_id:
        raise BookieIdentityError(
            f"the cookie of bookie {address} in {store_name} names cluster "
            f"{stored[0].instance_id}, but the store's instance id is {instance_id}: the "
            "instance id was changed or the store mixes two clusters. Restore the store "
            "from a backup"
        )

    if disk is None:
        if data:
            raise BookieIdentityError(
                f"{journal_dir} and {ledger_dir} hold bookie data ({data[0]}, ...) but no "
                "cookie: the cookies were removed, or these are another bookie's files. "
                "Restore the cookies (bookie-cookie.json) from a backup; the bookie will not "
                "serve data it cannot identify"
            )
        if stored is None:
            return await _register_new(store, address, instance_id, dirs, journal_dir, ledger_dir)
        cookie, version = stored
        if cookie.formatted:
            raise BookieIdentityError(
                f"the directories {journal_dir} and {ledger_dir} are empty, but {store_name} "
                f"holds the cookie of {cookie.describe()}: its disks were wiped or replaced, "
                "and every entry they held is gone. Serving empty under the old identity would "
                "make recovery count its missing entries as absent. If the old disks cannot be "
                f"restored, run `magnetar bk reregister --address {address}` (with this "
                "cluster's --metadata-url); the bookie then starts empty and the auditor "
                "re-replicates what it held"
            )
        fresh = replace(cookie, formatted=True, **dirs)
        write_disk_cookie(fresh, journal_dir, ledger_dir)
        try:
            await store.put(cookie_key(address), fresh.to_json(), version)
        except BadVersionError:
            raise BookieIdentityError(
                f"the cookie of bookie {address} changed in {store_name} while this bookie "
                "started (another bookie with this address?); check and start again"
            ) from None
        log.warning(
            "bookie %s starts empty as incarnation %d (re-registered): it answers WIPED for "
            "ledgers below %d",
            address,
            fresh.incarnation,
            fresh.wiped_below,
        )
        return fresh

    if not disk.instance_id:  # written before instance ids: adopt this cluster's
        upgraded = Cookie(instance_id, address, **dirs)
        if stored is not None:
            upgraded = replace(stored[0], formatted=True, **dirs)
        if stored is not None and not stored[0].formatted:
            raise _older_disks(store_name, address, journal_dir, disk, stored[0])
        write_disk_cookie(upgraded, journal_dir, ledger_dir)
        await store.put(cookie_key(address), upgraded.to_json())
        log.info("bookie %s: cookie upgraded with cluster instance id %s", address, instance_id)
        return upgraded

    if stored is None:
        # Same cluster, and the store lost only this cookie (or a crash came between writing
        # the disks' cookie and the store's at the first start): the disks say who we are.
        restored = replace(disk, **dirs)
        try:
            await store.put(cookie_key(address), restored.to_json(), NOT_EXISTS)
        except BadVersionError:
            raise BookieIdentityError(
                f"the cookie of bookie {address} appeared in {store_name} while this bookie "
                "started (another bookie with this address?); check and start again"
            ) from None
        log.warning(
            "bookie %s: cookie missing from %s; written again from disk", address, store_name
        )
        if (disk.journal_dir, disk.ledger_dir) != (dirs["journal_dir"], dirs["ledger_dir"]):
            write_disk_cookie(restored, journal_dir, ledger_dir)
        return restored

    cookie, version = stored
    if cookie.incarnation != disk.incarnation or not cookie.formatted:
        raise _older_disks(store_name, address, journal_dir, disk, cookie)
    if (cookie.journal_dir, cookie.ledger_dir) != (dirs["journal_dir"], dirs["ledger_dir"]):
        moved = replace(cookie, **dirs)
        log.warning(
            "bookie %s: directories moved (%s, %s -> %s, %s); cookies updated",
            address,
            cookie.journal_dir,
            cookie.ledger_dir,
            dirs["journal_dir"],
            dirs["ledger_dir"],
        )
        write_disk_cookie(moved, journal_dir, ledger_dir)
        await store.put(cookie_key(address), moved.to_json(), version)
        return moved
    return cookie


def _older_disks(
    store_name: str, address: str, journal_dir: Path, disk: Cookie, stored: Cookie
) -> BookieIdentityError:
    return BookieIdentityError(
        f"the directories of bookie {address} ({journal_dir}, ...) are incarnation "
        f"{disk.incarnation}, but {store_name} records incarnation {stored.incarnation}"
        + (" (re-registered empty, not yet started)" if not stored.formatted else "")
        + ": the bookie was re-registered empty after these disks left, and the cluster no "
        "longer counts on their data. Wipe both directories to start it empty, or restore "
        "the metadata store from a backup matching these disks"
    )


async def _register_new(
    store: MetadataStore,
    address: str,
    instance_id: str,
    dirs: dict[str, str],
    journal_dir: Path,
    ledger_dir: Path,
) -> Cookie:
    """A new bookie: the disks' cookie first (a crash before the store's is repaired from it at
    the next start), then the store's, created only if absent."""
    cookie = Cookie(instance_id, address, **dirs)
    write_disk_cookie(cookie, journal_dir, ledger_dir)
    try:
        await store.put(cookie_key(address), cookie.to_json(), NOT_EXISTS)
    except BadVersionError:
        for directory in (journal_dir, ledger_dir):
            (directory / COOKIE).unlink(missing_ok=True)
        raise BookieIdentityError(
            f"another bookie registered the cookie of {address} while this one started; "
            "two bookies cannot share an address"
        ) from None
    log.info("bookie %s registered in cluster %s (cookie written)", address, instance_id)
    return cookie


def _write_durably(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
