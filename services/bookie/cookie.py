"""The bookie's identity on disk. Ledger metadata names each replica by the bookie's address,
so a bookie that came back under another address would hold entries nobody can find. The first
start (both directories without a cookie) writes the address into both the journal and the
ledger directory; a later start under a different address, with directories of different
bookies, or with one directory's cookie missing (a replaced disk) is refused with the reason.
Checked before the storage opens anything."""

from __future__ import annotations

import json
import os
from pathlib import Path

COOKIE = "bookie-cookie.json"


class BookieIdentityError(ValueError):
    """The directories belong to another bookie address (or to two different bookies)."""


def check_or_write(address: str, journal_dir: Path, ledger_dir: Path) -> None:
    found = {}
    for directory in (journal_dir, ledger_dir):
        path = directory / COOKIE
        if path.exists():
            try:
                found[directory] = json.loads(path.read_text())["address"]
            except (ValueError, KeyError, TypeError) as e:
                raise BookieIdentityError(
                    f"{path} is damaged ({e}); restore it or remove it"
                ) from e
    for directory, recorded in found.items():
        if recorded != address:
            raise BookieIdentityError(
                f"{directory} holds the data of bookie {recorded}, and this bookie would serve it "
                f"as {address}: ledgers name their replicas by address, so their entries would "
                f"be unreachable. Start it as {recorded} (same advertised address and port)"
            )
    if len(found) == 1:
        (has,) = found
        lacks = ledger_dir if has == journal_dir else journal_dir
        raise BookieIdentityError(
            f"{has} belongs to bookie {found[has]} but {lacks} has no cookie: was that disk "
            "replaced or wiped? Serving without its data would let fenced writers in again and "
            "make recovery miss acknowledged entries; restore the directory, or give the bookie "
            "new directories and a new address and let the auditor re-replicate"
        )
    if not found:
        for directory in (journal_dir, ledger_dir):
            _write_durably(directory / COOKIE, json.dumps({"address": address}) + "\n")


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
