"""``magnetar bk ...``: BookKeeper-style shell commands against a running cluster."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from magnetar.common.ledger.bookie_client import BookieClient, BookieError
from magnetar.common.ledger.bookies import list_bookies
from magnetar.common.ledger.entry import encode_entry, verify_entry
from magnetar.common.metadata import MetadataStore, open_store

DEFAULT_METADATA_URL = "etcd://127.0.0.1:2379"


def _metadata_option(parser: argparse.ArgumentParser, default: object) -> None:
    parser.add_argument(
        "--metadata-url",
        default=default,
        help=f"metadata store URL [default: $MAGNETAR_METADATA_URL or {DEFAULT_METADATA_URL}]",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # --metadata-url is accepted before the tool name and after it.
    _metadata_option(parser, None)
    sub = parser.add_subparsers(dest="bk_command", required=True, metavar="TOOL")

    p = sub.add_parser("bookiesanity", help="write, read back and delete a ledger on one bookie")
    _metadata_option(p, argparse.SUPPRESS)
    p.add_argument(
        "--bookie",
        metavar="HOST:PORT",
        help="bookie to test [default: any writable registered one]",
    )
    p.add_argument("--entries", type=int, default=10, help="entries to write [default: 10]")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per call [default: 10]")

    p = sub.add_parser("listbookies", help="registered bookies with their state")
    _metadata_option(p, argparse.SUPPRESS)
    p.add_argument("--json", action="store_true", help="one JSON object per bookie")


def metadata_url(args: argparse.Namespace) -> str:
    return args.metadata_url or os.environ.get("MAGNETAR_METADATA_URL") or DEFAULT_METADATA_URL


async def run(args: argparse.Namespace) -> int:
    url = metadata_url(args)
    try:
        store = await open_store(url)
    except Exception as e:
        print(f"cannot open metadata store {url}: {e}", file=sys.stderr)
        return 2
    try:
        if args.bk_command == "bookiesanity":
            return await bookiesanity(store, args)
        return await listbookies(store, args)
    finally:
        await store.close()


async def listbookies(store: MetadataStore, args: argparse.Namespace) -> int:
    for b in await list_bookies(store):
        if args.json:
            print(
                json.dumps(
                    {"address": b.address, "read_only": b.read_only, "free_bytes": b.free_bytes}
                )
            )
        else:
            state = "read-only" if b.read_only else "writable"
            print(f"{b.address}\t{state}\tfree {b.free_bytes / 2**30:.1f} GiB")
    return 0


async def bookiesanity(store: MetadataStore, args: argparse.Namespace) -> int:
    address = args.bookie
    if address is None:
        writable = [b for b in await list_bookies(store) if not b.read_only]
        if not writable:
            print("bookiesanity: no writable bookie is registered", file=sys.stderr)
            return 1
        address = writable[0].address
    # A one-bookie ledger outside the ledger-id range the ledger client allocates from.
    ledger_id = -(time.time_ns() & 0x7FFFFFFFFFFF) - 1
    payloads = [f"bookiesanity entry {i}".encode() for i in range(args.entries)]
    async with BookieClient(address, timeout=args.timeout) as client:
        try:
            length, lac = 0, -1
            adds = []
            for i, payload in enumerate(payloads):
                length += len(payload)
                adds.append(
                    client.add(ledger_id, i, encode_entry(ledger_id, i, lac, length, payload))
                )
                lac = i - 1
            for add in adds:
                await add
            for i, payload in enumerate(payloads):
                entry = await client.read(ledger_id, i)
                header = verify_entry(entry)
                if header.entry_id != i or entry[-len(payload) :] != payload:
                    print(f"bookiesanity: {address}: entry {i} read back wrong", file=sys.stderr)
                    return 1
            await client.delete_ledger(ledger_id)
        except (BookieError, ValueError) as e:
            print(f"bookiesanity: {address}: {e}", file=sys.stderr)
            return 1
    print(f"bookiesanity: {address}: wrote, read back and deleted {len(payloads)} entries: OK")
    return 0
