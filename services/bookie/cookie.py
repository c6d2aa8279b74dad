"""The bookie's identity on disk. Ledger metadata names each replica by the bookie's address,
so a bookie that came back under another address would hold entries nobody can find. The first
start writes the address into both the journal and the ledger directory; a later start under a
different address, or with directories of different bookies, is refused with the reason."""

from __future__ import annotations

import json
from pathlib import Path

COOKIE = "bookie-cookie.json"


class BookieIdentityError(Exception):
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
    for directory in (journal_dir, ledger_dir):
        if directory not in found:
            path = directory / COOKIE
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"address": address}) + "\n")
            tmp.replace(path)
