"""``magnetar bk ...``: BookKeeper-style shell commands against a running cluster, and offline
tools that work on a stopped bookie's directories (``journalrepair``, ``indexrebuild``).

TLS to bookies and etcd comes from the environment, under the broker's setting names
(``MAGNETAR_BOOKKEEPER_TLS_ENABLED``, ``MAGNETAR_ETCD_USE_TLS``, ...: see :class:`ShellTls`), so
the tools work from a broker's pod as they are."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

import crc32c

from magnetar.bookie import journal as jnl
from magnetar.bookie.auditor import ELECTION as AUDITOR_ELECTION
from magnetar.bookie.auditor import ledgers_by_bookie, mark_ledgers_of
from magnetar.bookie.decommission import (
    BookieState,
    ScaleDownCheck,
    check_scale_down,
    leaving_on_scale_down,
    statefulset_ordinal,
)
from magnetar.bookie.gc import find_unlisted, managed_ledger_of
from magnetar.bookie.index import rebuild_index
from magnetar.bookie.metrics import BookieMetrics
from magnetar.bookie.replication import ReplicationSettings, ReplicationWorker
from magnetar.common.config import ENV_PREFIX, load_config, setting
from magnetar.common.filelock import LockedError, acquire_lock
from magnetar.common.ledger.bookie_client import BookieClient, BookieError, BookieTls
from magnetar.common.ledger.bookies import list_bookies
from magnetar.common.ledger.client import LedgerClient
from magnetar.common.ledger.distribution import QuorumConfigError
from magnetar.common.ledger.entry import encode_entry, verify_entry
from magnetar.common.ledger.errors import LedgerError
from magnetar.common.ledger.identity import (
    IdentityError,
    list_cookies,
    read_instance_id,
)
from magnetar.common.ledger.identity import reregister as reregister_cookie
from magnetar.common.ledger.metadata import LedgerMetadata
from magnetar.common.ledger.placement import NotEnoughBookiesError
from magnetar.common.ledger.underreplication import (
    DECOMMISSIONING_PATH,
    LOCKS_PATH,
    decommissioning_key,
    list_marks,
    lock_key,
    read_settings,
    update_settings,
)
from magnetar.common.metadata import MetadataStore, open_store
from magnetar.common.metadata.etcd_settings import EtcdTlsSettings
from magnetar.common.metadata.local import MetadataStoreInUseError
from magnetar.common.proto import bookie_pb2 as pb

DEFAULT_METADATA_URL = "etcd://127.0.0.1:2379"


def _metadata_option(parser: argparse.ArgumentParser, default: object) -> None:
    parser.add_argument(
        "--metadata-url",
        default=default,
        help=f"metadata store URL [default: $MAGNETAR_METADATA_URL or {DEFAULT_METADATA_URL}]",
    )


class Needs(StrEnum):
    """What ``run`` opens before it calls a tool (and so what the tool takes first)."""

    OFFLINE = "offline"  # a stopped bookie's directories: no metadata store, no --metadata-url
    STORE = "store"  # the metadata store
    LEDGER_CLIENT = "ledger_client"  # a ledger client on the metadata store


@dataclass(slots=True, frozen=True)
class Option:
    """One ``add_argument`` call of a tool's parser, as written."""

    flags: tuple[str, ...]
    kwargs: dict[str, Any]


def option(*flags: str, **kwargs: Any) -> Option:
    return Option(flags, kwargs)


def json_option(help: str | None = None) -> Option:
    return option("--json", action="store_true", help=help)


@dataclass(slots=True, frozen=True)
class Tool:
    name: str
    needs: Needs
    func: Callable[..., Any]
    help: str
    description: str | None
    options: tuple[Option, ...]
    #: Changes nothing (metadata or bookies): may run on a local store another process owns,
    #: opened read-only (``magnetar bk`` on a running standalone).
    reads_only: bool = False


# In registration order, which is the order `magnetar bk --help` lists them in.
TOOLS: dict[str, Tool] = {}

_F = TypeVar("_F", bound=Callable[..., Any])


def tool(
    name: str,
    *,
    needs: Needs,
    help: str,
    description: str | None = None,
    options: Sequence[Option] = (),
    reads_only: bool = False,
) -> Callable[[_F], _F]:
    """Register the decorated function as ``magnetar bk NAME``. It is called as ``func(args)``
    (offline, synchronous), ``await func(store, args)`` or ``await func(client, args)``; every
    tool but an offline one also takes ``--metadata-url`` after its name."""

    def register(func: _F) -> _F:
        if name in TOOLS:
            raise ValueError(f"bk tool {name!r} registered twice")
        TOOLS[name] = Tool(name, needs, func, help, description, tuple(options), reads_only)
        return func

    return register


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # --metadata-url is accepted before the tool name and after it.
    _metadata_option(parser, None)
    sub = parser.add_subparsers(dest="bk_command", required=True, metavar="TOOL")
    for t in TOOLS.values():
        p = sub.add_parser(t.name, help=t.help, description=t.description)
        if t.needs is not Needs.OFFLINE:
            _metadata_option(p, argparse.SUPPRESS)
        for o in t.options:
            p.add_argument(*o.flags, **o.kwargs)


@dataclass(slots=True)
class ShellTls(EtcdTlsSettings):
    """The broker's client TLS settings (same names and meaning), read from MAGNETAR_* variables."""

    bookkeeper_tls_enabled: bool = setting(False, "reach bookies over TLS")
    bookkeeper_tls_client_authentication: bool = setting(
        False, "reach bookies over TLS and show them a client certificate"
    )
    bookkeeper_tls_trust_certs_file_path: str = setting("", "CAs of the bookies' certificates")
    bookkeeper_tls_certificate_file_path: str = setting("", "client certificate for bookies")
    bookkeeper_tls_key_file_path: str = setting("", "its key")

    @classmethod
    def from_environ(cls, environ: dict[str, str] | None = None) -> ShellTls:
        environ = dict(os.environ if environ is None else environ)
        # MAGNETAR_CONFIG names a service's own file (a broker's or a bookie's), not ours.
        environ.pop(ENV_PREFIX + "CONFIG", None)
        return load_config(cls, None, environ)  # type: ignore[no-any-return]

    def bookie_tls(self) -> BookieTls | None:
        if not (self.bookkeeper_tls_enabled or self.bookkeeper_tls_client_authentication):
            return None
        show = self.bookkeeper_tls_client_authentication
        return BookieTls(
            trust_certs_file=self.bookkeeper_tls_trust_certs_file_path,
            certificate_file=self.bookkeeper_tls_certificate_file_path if show else "",
            key_file=self.bookkeeper_tls_key_file_path if show else "",
        )


def metadata_url(args: argparse.Namespace) -> str:
    return args.metadata_url or os.environ.get("MAGNETAR_METADATA_URL") or DEFAULT_METADATA_URL


async def run(args: argparse.Namespace) -> int:
    t = TOOLS[args.bk_command]
    if t.needs is Needs.OFFLINE:
        return t.func(args)
    url = metadata_url(args)
    try:
        tls = ShellTls.from_environ()
        args.bookie_tls = tls.bookie_tls()
        if args.bookie_tls is not None:
            args.bookie_tls.channel_credentials()  # a bad file is reported here, not mid-tool
    except ValueError as e:
        print(f"bk {args.bk_command}: TLS settings: {e}", file=sys.stderr)
        return 2
    try:
        store = await open_store(url, tls=tls.etcd_tls())
    except MetadataStoreInUseError as e:
        # A running standalone owns its local store: the tools that change nothing read it
        # as it runs; the others would change what it serves behind its back.
        if not t.reads_only:
            readers = ", ".join(n for n, other in TOOLS.items() if other.reads_only)
            print(
                f"bk {args.bk_command}: {e}; this tool changes the store or the bookies, so stop "
                f"that process first (these tools read a running one: {readers})",
                file=sys.stderr,
            )
            return 1
        try:
            store = await open_store(url, read_only=True)
        except Exception as e:
            print(f"cannot open metadata store {url} read-only: {e}", file=sys.stderr)
            return 2
        print(
            f"bk {args.bk_command}: {url} is in use by a running process: reading it read-only",
            file=sys.stderr,
        )
    except Exception as e:
        print(f"cannot open metadata store {url}: {e}", file=sys.stderr)
        return 2
    try:
        if t.needs is Needs.STORE:
            return await t.func(store, args)
        async with LedgerClient(store, tls=args.bookie_tls) as client:
            return await t.func(client, args)
    except (LedgerError, NotEnoughBookiesError, QuorumConfigError, IdentityError) as e:
        print(f"bk {args.bk_command}: {e}", file=sys.stderr)
        return 1
    finally:
        await store.close()


@tool(
    "bookiesanity",
    needs=Needs.STORE,
    help="write, read back and delete a ledger on one bookie",
    options=[
        option(
            "--bookie",
            metavar="HOST:PORT",
            help="bookie to test [default: any writable registered one]",
        ),
        option("--entries", type=int, default=10, help="entries to write [default: 10]"),
        option("--timeout", type=float, default=10.0, help="seconds per call [default: 10]"),
    ],
)
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
    tls: BookieTls | None = getattr(args, "bookie_tls", None)
    credentials = None if tls is None else tls.channel_credentials()
    async with BookieClient(address, timeout=args.timeout, credentials=credentials) as client:
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


@tool(
    "listbookies",
    reads_only=True,
    needs=Needs.STORE,
    help="registered bookies with their state",
    options=[json_option("one JSON object per bookie")],
)
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


def _emit(args: argparse.Namespace, data: dict[str, object], text: str) -> None:
    print(json.dumps(data) if args.json else text)


@tool(
    "listledgers",
    reads_only=True,
    needs=Needs.LEDGER_CLIENT,
    help="ids of every ledger",
    options=[json_option("one JSON object per ledger")],
)
async def listledgers(client: LedgerClient, args: argparse.Namespace) -> int:
    for ledger_id in await client.list_ledgers():
        _emit(args, {"ledger_id": ledger_id}, str(ledger_id))
    return 0


@tool(
    "ledgermetadata",
    reads_only=True,
    needs=Needs.LEDGER_CLIENT,
    help="a ledger's metadata",
    options=[option("ledger_id", type=int), json_option()],
)
async def ledgermetadata(client: LedgerClient, args: argparse.Namespace) -> int:
    metadata, version = await client.read_metadata(args.ledger_id)
    data = {"ledger_id": args.ledger_id, "version": version, **metadata.to_json_dict()}
    if args.json:
        print(json.dumps(data))
        return 0
    print(
        f"ledger {args.ledger_id}: {metadata.state.name}, E{metadata.ensemble_size} "
        f"Qw{metadata.write_quorum} Qa{metadata.ack_quorum}, last entry {metadata.last_entry_id}, "
        f"length {metadata.length}"
    )
    for fragment in metadata.fragments:
        print(f"  from entry {fragment.first_entry_id}: {', '.join(fragment.bookies)}")
    for key, value in metadata.custom_metadata.items():
        print(f"  {key} = {value!r}")
    return 0


@tool(
    "readledger",
    reads_only=True,
    needs=Needs.LEDGER_CLIENT,
    help="entries of a ledger (closed: up to its end; open: up to LAC)",
    options=[
        option("ledger_id", type=int),
        option("--from", dest="first", type=int, default=0, help="first entry [default: 0]"),
        option("--to", dest="last", type=int, default=None, help="last entry [default: the end]"),
        json_option("one JSON object per entry: entry_id, length, crc32c"),
    ],
)
async def readledger(client: LedgerClient, args: argparse.Namespace) -> int:
    handle = await client.open_ledger(args.ledger_id, recovery=False)
    last = handle.readable_last_entry if args.last is None else args.last
    step = 1000
    for start in range(args.first, last + 1, step):
        for entry in await handle.read(start, min(start + step - 1, last)):
            crc = crc32c.crc32c(entry.payload)
            if args.json:
                print(
                    json.dumps(
                        {"entry_id": entry.entry_id, "length": len(entry.payload), "crc32c": crc}
                    )
                )
            else:
                print(
                    f"{entry.entry_id}\t{len(entry.payload)} bytes\tcrc32c {crc:#010x}\t{entry.payload[:64]!r}"
                )
    return 0


@tool(
    "recover",
    needs=Needs.LEDGER_CLIENT,
    help="LEDGER_ID: open a ledger with recovery (fence + close) and print the result; "
    "BOOKIE[,BOOKIE...]: re-replicate every ledger off those bookies now",
    description="With a ledger id: fence and close that ledger. With bookie addresses: mark "
    "every ledger with a fragment on them under-replicated and replicate them here, with "
    "the replication worker's code (open ledgers are fenced and recovered first).",
    options=[option("target", metavar="LEDGER_ID|BOOKIE[,BOOKIE...]"), json_option()],
)
async def recover(client: LedgerClient, args: argparse.Namespace) -> int:
    if not args.target.isdigit():
        return await recover_bookies(client, args)
    ledger_id = int(args.target)
    handle = await client.open_ledger(ledger_id, recovery=True)
    metadata = handle.metadata
    _emit(
        args,
        {
            "ledger_id": ledger_id,
            "state": metadata.state.name,
            "last_entry_id": metadata.last_entry_id,
            "length": metadata.length,
        },
        f"ledger {ledger_id}: {metadata.state.name}, last entry {metadata.last_entry_id}, length {metadata.length}",
    )
    return 0


async def recover_bookies(client: LedgerClient, args: argparse.Namespace) -> int:
    """Mark the bookies' ledgers and run replication worker passes over exactly those ledgers
    here (the same code as the workers in the bookies; open ledgers are fenced at once)."""
    bookies = {b.strip() for b in args.target.split(",") if b.strip()}
    marked = set(await mark_ledgers_of(client.store, bookies))
    pending = {i for i, (m, _) in (await list_marks(client.store)).items() if m.bookies & bookies}
    worker = ReplicationWorker(
        client,
        f"bk-recover-{os.getpid()}",
        ReplicationSettings(open_ledger_rereplication_grace_period=0.0),
        BookieMetrics(),
        enabled=_always,
    )
    for _ in range(5):
        if not pending:
            break
        await worker.run_once(ledgers=pending)
        pending = {
            i for i, (m, _) in (await list_marks(client.store)).items() if m.bookies & bookies
        }
    _emit(
        args,
        {"bookies": sorted(bookies), "marked": len(marked), "not_done": sorted(pending)},
        f"recover {', '.join(sorted(bookies))}: {len(marked)} ledgers marked, "
        + (
            "all replicated"
            if not pending
            else f"{len(pending)} not done yet (locked by a worker, or see the warnings): "
            f"{sorted(pending)}"
        ),
    )
    return 0 if not pending else 1


async def _always() -> bool:
    return True


@tool(
    "listunderreplicated",
    reads_only=True,
    needs=Needs.LEDGER_CLIENT,
    help="ledgers marked under-replicated, with the bookies to replace",
    options=[json_option("one JSON object per ledger")],
)
async def listunderreplicated(client: LedgerClient, args: argparse.Namespace) -> int:
    locks = await client.store.scan(LOCKS_PATH + "/")
    for ledger_id, (mark, _) in sorted((await list_marks(client.store)).items()):
        holder = locks.get(lock_key(ledger_id))
        worker = holder.value.decode() if holder is not None else None
        _emit(
            args,
            {
                "ledger_id": ledger_id,
                "bookies": sorted(mark.bookies),
                "marked_at": mark.marked_at,
                "locked_by": worker,
            },
            f"{ledger_id}\treplace {', '.join(sorted(mark.bookies))}\tmarked "
            f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(mark.marked_at))}"
            + (f"\tbeing replicated by {worker}" if worker else ""),
        )
    return 0


@tool(
    "listunreferenced",
    reads_only=True,
    needs=Needs.LEDGER_CLIENT,
    help="ledgers with entries whose topic does not list them (the store lost the update)",
    description="Ledgers whose metadata names a topic (custom field managed-ledger) that "
    "does not list them, or that has no ledger list at all, and that hold entries: the "
    "metadata store went back in time (restored from an older backup, or its log cut at a "
    "damage). Garbage collection never deletes them; adopt each into its topic's ledger "
    "list or delete it (`magnetar bk deleteledger`). Ledgers whose metadata the store lost "
    "too are reported by the bookies that hold them (log, and the "
    "magnetar_bookie_unreferenced_ledgers gauge).",
    options=[json_option("one JSON object per ledger")],
)
async def listunreferenced(client: LedgerClient, args: argparse.Namespace) -> int:
    """Ledgers with entries that their topic does not list (``magnetar.bookie.gc``'s rule:
    entries looked at first, the topic's record read after)."""
    candidates: dict[int, tuple[str, int | None]] = {}
    for ledger_id in await client.list_ledgers():
        try:
            metadata, _ = await client.read_metadata(ledger_id)
        except LedgerError:
            continue  # deleted since the list was taken
        name = managed_ledger_of(metadata)
        if name is None:
            continue
        last = await _last_entry_held(client, ledger_id, metadata)
        if last is None or last >= 0:
            candidates[ledger_id] = (name, last)
    for ledger in await find_unlisted(client.store, candidates):
        _emit(
            args,
            {
                "ledger_id": ledger.ledger_id,
                "reason": ledger.reason.value,
                "managed_ledger": ledger.managed_ledger,
                "last_entry_id": ledger.last_entry_id,
            },
            ledger.describe(),
        )
    return 0


async def _last_entry_held(
    client: LedgerClient, ledger_id: int, metadata: LedgerMetadata
) -> int | None:
    """A closed ledger's last entry; for an open one, the highest entry its bookies hold
    (None: none of them answered)."""
    if metadata.is_closed:
        return metadata.last_entry_id
    bookies = sorted({b for f in metadata.fragments for b in f.bookies})
    answers = await asyncio.gather(
        *(client.bookie(b).read_lac(ledger_id) for b in bookies), return_exceptions=True
    )
    held = [a.last_entry_id for a in answers if not isinstance(a, BaseException)]
    absent = [
        a
        for a in answers
        if isinstance(a, BookieError) and a.status in (pb.NO_SUCH_LEDGER, pb.NO_SUCH_ENTRY)
    ]
    if not held and len(absent) < len(answers):
        return None
    return max(held, default=-1)


async def _ledgers_on(store: MetadataStore, addresses: set[str]) -> list[int]:
    return sorted(
        i for i, (_, named) in (await ledgers_by_bookie(store)).items() if addresses & named
    )


async def scale_down_check(
    client: LedgerClient, leaving: list[str], ensemble_size: int | None
) -> ScaleDownCheck:
    """``decommission.check_scale_down`` on the registered bookies and every ledger now."""
    registered = await list_bookies(client.store)
    decommissioning = {
        k.rsplit("/", 1)[1] for k in await client.store.scan(DECOMMISSIONING_PATH + "/")
    }
    states = [
        BookieState(b.address, True, b.read_only or b.address in decommissioning)
        for b in registered
    ]
    ledgers = {i: m for i, (m, _) in (await ledgers_by_bookie(client.store)).items()}
    return check_scale_down(states, leaving, ledgers, ensemble_size)


_DECOMMISSION_OPTIONS = (
    option(
        "--ensemble-size",
        type=int,
        default=None,
        help="bookies new ledgers need (the brokers' ensemble_size) [default: the largest "
        "ensemble of an open ledger]",
    ),
    option("--check", action="store_true", help="only say whether it is allowed (exit 0/1)"),
    option(
        "--force",
        action="store_true",
        help="go ahead although the check refuses (entries may keep fewer copies than Qw)",
    ),
    option("--timeout", type=float, default=3600.0, help="seconds to wait [default: 3600]"),
    option("--no-wait", action="store_true", help="mark and return at once"),
    json_option(),
)


@tool(
    "decommissionbookie",
    needs=Needs.LEDGER_CLIENT,
    help="drain a live (or dead) bookie: its ledgers are copied to others, then it can go",
    description="First the check: refused (exit 1, nothing changed) if the remaining writable "
    "bookies could not hold every ledger of the leaving ones at its write quorum, or fewer "
    "would remain than new ledgers' ensemble. Then the bookie turns read-only (writers move "
    "off it at their next add), every ledger with a fragment on it is marked "
    "under-replicated, and the replication workers copy them away. Waits until no ledger "
    "names the bookie; then stop it and remove it.",
    options=[
        option("bookie", metavar="HOST:PORT[,HOST:PORT...]"),
        option(
            "--cancel",
            action="store_true",
            help="take the bookie off the decommissioning list (it turns writable again)",
        ),
        *_DECOMMISSION_OPTIONS,
    ],
)
async def decommissionbookie(client: LedgerClient, args: argparse.Namespace) -> int:
    addresses = sorted({a.strip() for a in args.bookie.split(",") if a.strip()})
    if args.cancel:
        for address in addresses:
            await client.store.delete(decommissioning_key(address))
        _emit(
            args,
            {"bookies": addresses, "decommissioning": False},
            f"decommissionbookie {', '.join(addresses)}: cancelled; writable again from the "
            "next disk check",
        )
        return 0
    return await _decommission(client, args, addresses, "decommissionbookie")


@tool(
    "scaledown",
    needs=Needs.LEDGER_CLIENT,
    help="before `kubectl scale statefulset` of bookies: check, then decommission the "
    "bookies the StatefulSet will remove (ordinals REPLICAS and up)",
    description="The bookies registered under the StatefulSet's stable pod names "
    "(NAME-ORDINAL.…) with an ordinal of REPLICAS or more are decommissioned as "
    "decommissionbookie does, after the same check. When it says so, scale the StatefulSet "
    "to REPLICAS: each leaving pod's preStop hook (`magnetar bk prestop`) waits for its "
    "ledgers to be gone before the bookie stops.",
    options=[
        option("--replicas", type=int, required=True, help="the StatefulSet's new replica count"),
        option(
            "--statefulset",
            default=None,
            help="the StatefulSet's name [default: this pod's, from $HOSTNAME]",
        ),
        *_DECOMMISSION_OPTIONS,
    ],
)
async def scaledown(client: LedgerClient, args: argparse.Namespace) -> int:
    name = args.statefulset
    if name is None:
        own = statefulset_ordinal(os.environ.get("HOSTNAME", "") + ":0")
        if own is None:
            print("scaledown: give --statefulset (no NAME-ORDINAL in $HOSTNAME)", file=sys.stderr)
            return 2
        name = own[0]
    registered = [b.address for b in await list_bookies(client.store)]
    leaving = leaving_on_scale_down(registered, name, args.replicas)
    if not leaving:
        _emit(
            args,
            {"statefulset": name, "replicas": args.replicas, "leaving": []},
            f"scaledown: no registered bookie of {name} has an ordinal of {args.replicas} or "
            "more; nothing to decommission",
        )
        return 0
    return await _decommission(client, args, leaving, "scaledown")


async def _decommission(
    client: LedgerClient, args: argparse.Namespace, addresses: list[str], name: str
) -> int:
    check = await scale_down_check(client, addresses, args.ensemble_size)
    verdict = {
        "bookies": addresses,
        "allowed": check.allowed,
        "remaining_writable": list(check.remaining_writable),
        "ensemble_size": check.ensemble_size,
        "ledgers_to_move": check.ledgers_to_move,
        "stranded": [f.describe() for f in check.stranded],
    }
    if args.check or (not check.allowed and not args.force):
        if check.allowed:
            _emit(
                args,
                verdict,
                f"{name} {', '.join(addresses)}: allowed; {check.ledgers_to_move} ledgers "
                f"would be copied to {len(check.remaining_writable)} remaining writable bookies",
            )
            return 0
        if args.json:
            print(json.dumps(verdict))
        print(f"{name}: {check.refusal()}", file=sys.stderr)
        return 1
    if not check.allowed:
        print(f"{name}: --force: going ahead although {check.refusal()}", file=sys.stderr)
    for address in addresses:
        await client.store.put(decommissioning_key(address), b"{}")
    marked = await mark_ledgers_of(client.store, set(addresses))
    if not args.json:
        print(
            f"{name} {', '.join(addresses)}: read-only from the next disk check; "
            f"{len(marked)} ledgers marked under-replicated"
        )
    if not await _autorecovery_enabled(client.store):
        print(
            f"{name}: autorecovery is disabled (`magnetar bk autorecovery enable`), "
            "nothing copies the ledgers away",
            file=sys.stderr,
        )
    remaining = await _wait_until_drained(
        client.store, set(addresses), args.timeout, args.no_wait, args
    )
    _emit(
        args,
        {**verdict, "marked": len(marked), "remaining": remaining},
        f"{name} {', '.join(addresses)}: "
        + (
            "no ledger names them any more: they can go"
            if not remaining
            else f"{len(remaining)} ledgers still on them: {remaining}"
            + (" (being copied away: --no-wait)" if args.no_wait else "")
        ),
    )
    # --no-wait: marked is done; the preStop hook (or a later call) waits for the copies.
    return 0 if not remaining or args.no_wait else 1


async def _wait_until_drained(
    store: MetadataStore,
    addresses: set[str],
    timeout: float,
    no_wait: bool,
    args: argparse.Namespace,
) -> list[int]:
    """Wait until no ledger names ``addresses`` (or the timeout); the ledgers still on them."""
    remaining = await _ledgers_on(store, addresses)
    deadline = time.monotonic() + timeout
    while remaining and not no_wait and time.monotonic() < deadline:
        await asyncio.sleep(1.0)
        before, remaining = remaining, await _ledgers_on(store, addresses)
        if remaining != before and not args.json:
            print(f"{len(remaining)} ledgers still on {', '.join(sorted(addresses))}")
        # Ledgers created on them before they turned read-only: mark those too.
        await mark_ledgers_of(store, addresses)
    return remaining


@tool(
    "prestop",
    needs=Needs.STORE,
    help="a bookie pod's preStop hook: if this bookie is being decommissioned, wait until "
    "its ledgers are copied away; otherwise return at once (a restart)",
    description="Run inside the bookie's container, with its MAGNETAR_* settings: the address "
    "is the bookie's own (advertised_address:port). A bookie on the decommissioning list "
    "(`magnetar bk scaledown` / `decommissionbookie`) is waited for until no ledger names "
    "it, then taken off the list (a later bookie with its name starts writable); any other "
    "bookie is only restarting, and its data stays on its volume.",
    options=[
        option("--bookie", metavar="HOST:PORT", help="[default: this bookie's own address]"),
        option(
            "--timeout",
            type=float,
            default=3600.0,
            help="seconds to wait (keep it below terminationGracePeriodSeconds) [default: 3600]",
        ),
        json_option(),
    ],
)
async def prestop(store: MetadataStore, args: argparse.Namespace) -> int:
    address = args.bookie
    if address is None:
        from magnetar.bookie.config import BookieConfig

        address = load_config(BookieConfig, None).resolved_address()
    if await store.get(decommissioning_key(address)) is None:
        _emit(
            args,
            {"bookie": address, "decommissioning": False},
            f"prestop {address}: not being decommissioned; stopping (its data stays)",
        )
        return 0
    started = time.monotonic()
    await mark_ledgers_of(store, {address})
    remaining = await _wait_until_drained(store, {address}, args.timeout, False, args)
    if not remaining:
        await store.delete(decommissioning_key(address))
    _emit(
        args,
        {"bookie": address, "remaining": remaining, "seconds": time.monotonic() - started},
        f"prestop {address}: "
        + (
            f"decommissioned in {time.monotonic() - started:.1f} s; stopping"
            if not remaining
            else f"{len(remaining)} ledgers still on it after {args.timeout:g} s: {remaining}; "
            "the auditor re-replicates them once it is gone"
        ),
    )
    return 0 if not remaining else 1


async def _autorecovery_enabled(store: MetadataStore) -> bool:
    """The cluster-wide switch; unset means each bookie's own setting (on by default)."""
    enabled = (await read_settings(store)).auto_recovery_daemon_enabled
    return enabled is None or enabled


@tool(
    "autorecovery",
    needs=Needs.STORE,
    help="enable, disable or show autorecovery (auditor and workers)",
    options=[option("action", choices=("enable", "disable", "status")), json_option()],
)
async def autorecovery(store: MetadataStore, args: argparse.Namespace) -> int:
    if args.action != "status":
        await update_settings(store, auto_recovery_daemon_enabled=args.action == "enable")
    settings = await read_settings(store)
    enabled = await _autorecovery_enabled(store)
    auditor = await store.election(AUDITOR_ELECTION).leader()
    marks = await list_marks(store)
    _emit(
        args,
        {
            "enabled": enabled,
            "auditor": auditor.decode() if auditor else None,
            "under_replicated": len(marks),
            "lost_bookie_recovery_delay": settings.lost_bookie_recovery_delay,
        },
        f"autorecovery {'enabled' if enabled else 'disabled'}; auditor: "
        f"{auditor.decode() if auditor else 'none'}; {len(marks)} ledgers under-replicated",
    )
    return 0


@tool(
    "lostbookierecoverydelay",
    needs=Needs.STORE,
    help="show, or set with --set SECONDS, the auditor's lost_bookie_recovery_delay",
    options=[
        option("--set", dest="seconds", type=float, default=None, metavar="SECONDS"),
        json_option(),
    ],
)
async def lostbookierecoverydelay(store: MetadataStore, args: argparse.Namespace) -> int:
    if args.seconds is not None:
        if args.seconds < 0:
            print("lostbookierecoverydelay: seconds must be >= 0", file=sys.stderr)
            return 2
        await update_settings(store, lost_bookie_recovery_delay=args.seconds)
    delay = (await read_settings(store)).lost_bookie_recovery_delay
    _emit(
        args,
        {"lost_bookie_recovery_delay": delay},
        "lost_bookie_recovery_delay: "
        + (f"{delay:g} s" if delay is not None else "not set (each bookie's own setting)"),
    )
    return 0


@tool(
    "deleteledger",
    needs=Needs.LEDGER_CLIENT,
    help="delete a ledger from its bookies and the metadata store",
    options=[option("ledger_id", type=int), json_option()],
)
async def deleteledger(client: LedgerClient, args: argparse.Namespace) -> int:
    await client.delete_ledger(args.ledger_id)
    _emit(args, {"ledger_id": args.ledger_id, "deleted": True}, f"ledger {args.ledger_id} deleted")
    return 0


@tool(
    "simpletest",
    needs=Needs.LEDGER_CLIENT,
    help="create a ledger, write N entries, close it, print figures",
    options=[
        option("--ensemble", type=int, default=3),
        option("--write-quorum", type=int, default=2),
        option("--ack-quorum", type=int, default=2),
        option("--entries", type=int, default=1000),
        option("--entry-size", type=int, default=1024, help="bytes per entry [default: 1024]"),
        option(
            "--rate",
            type=float,
            default=0,
            help="at most this many adds per second [default: no limit]",
        ),
        json_option("one final JSON line"),
    ],
)
async def simpletest(client: LedgerClient, args: argparse.Namespace) -> int:
    handle = await client.create_ledger(args.ensemble, args.write_quorum, args.ack_quorum)
    payload = os.urandom(args.entry_size)
    latencies: list[float] = []
    failures: list[str] = []

    def done(fut: asyncio.Future[int], started: float) -> None:
        if fut.exception() is None:
            latencies.append(time.perf_counter() - started)
        else:
            failures.append(str(fut.exception()))

    started_all = time.perf_counter()
    futures = []
    for i in range(args.entries):
        if args.rate > 0:
            delay = started_all + i / args.rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        t0 = time.perf_counter()
        fut = await handle.add_async(payload)
        fut.add_done_callback(lambda f, t0=t0: done(f, t0))
        futures.append(fut)
    await asyncio.gather(*futures, return_exceptions=True)
    elapsed = time.perf_counter() - started_all
    await handle.close()
    latencies.sort()

    def pct(p: float) -> float:
        return (
            latencies[min(len(latencies) - 1, int(p / 100 * len(latencies)))] * 1000
            if latencies
            else float("nan")
        )

    result = {
        "ledger_id": handle.ledger_id,
        "acked": len(latencies),
        "failed": len(failures),
        "last_entry_id": handle.metadata.last_entry_id,
        "seconds": round(elapsed, 3),
        "adds_per_s": round(len(latencies) / elapsed, 1),
        "mb_per_s": round(len(latencies) * args.entry_size / elapsed / 1e6, 2),
        "latency_ms": {
            "p50": round(pct(50), 3),
            "p99": round(pct(99), 3),
            "max": round(pct(100), 3),
        },
    }
    _emit(
        args,
        result,
        f"ledger {handle.ledger_id}: {result['acked']} acked, {result['failed']} failed in {elapsed:.2f} s "
        f"({result['adds_per_s']:,.0f} adds/s), latency p50 {pct(50):.2f} ms p99 {pct(99):.2f} ms",
    )
    return 0 if not failures else 1


@tool(
    "reregister",
    needs=Needs.STORE,
    help="record that a stopped bookie lost its disks: it may start again, empty",
    description="A bookie whose directories were wiped or replaced refuses to start while "
    "the metadata store holds its cookie. Once its old disks are lost for good, this gives "
    "it a new cookie incarnation: its next start on empty directories is accepted, and for "
    "every ledger created before now it answers WIPED instead of 'no such entry', so "
    "recovery does not count it as proof that an entry is absent.",
    options=[
        option("--address", required=True, metavar="HOST:PORT", help="the bookie's address"),
        json_option("the new cookie as JSON"),
    ],
)
async def reregister(store: MetadataStore, args: argparse.Namespace) -> int:
    cookie = await reregister_cookie(store, args.address)
    # Its copies are gone even though it registers again under the same address.
    marked = await mark_ledgers_of(store, {cookie.address})
    _emit(
        args,
        json.loads(cookie.to_json()),
        f"bookie {cookie.address} re-registered empty as incarnation {cookie.incarnation}: "
        f"start it on empty directories; it answers WIPED for ledgers below "
        f"{cookie.wiped_below}. The {len(marked)} ledgers that had entries on it are marked "
        "under-replicated: the replication workers (or `magnetar bk recover`) copy them back",
    )
    return 0


@tool(
    "cookies",
    reads_only=True,
    needs=Needs.STORE,
    help="the cluster's instance id and every bookie's cookie",
    options=[json_option("one JSON object per cookie")],
)
async def cookies(store: MetadataStore, args: argparse.Namespace) -> int:
    instance = await read_instance_id(store)
    if not args.json:
        print(f"instance id: {instance[0] if instance else '(none: no bookie has started)'}")
    for cookie in await list_cookies(store):
        _emit(
            args,
            json.loads(cookie.to_json()),
            f"{cookie.address}\tincarnation {cookie.incarnation}\t"
            f"{'formatted' if cookie.formatted else 're-registered, not started yet'}\t"
            f"wiped below {cookie.wiped_below}\t{cookie.journal_dir}\t{cookie.ledger_dir}",
        )
    return 0


# -- offline tools: a stopped bookie's directories, no metadata store --------------------------


@tool(
    "journalrepair",
    needs=Needs.OFFLINE,
    help="offline: drop the damaged bytes of a stopped bookie's journal, keep every valid record",
    options=[
        option(
            "--journal-dir",
            required=True,
            help="the bookie's journal_dir (the bookie must be stopped)",
        ),
        option("--dry-run", action="store_true", help="only report what would be dropped"),
        json_option("one JSON object per dropped range"),
    ],
)
def journalrepair(args: argparse.Namespace) -> int:
    """Drop every damaged range of the journal (see ``journal.repair_journal``) and say what
    went: file, offset, bytes and records, so the operator knows which adds this bookie lost."""
    journal_dir = Path(args.journal_dir)
    current = journal_dir / "current"
    if not current.is_dir():
        print(
            f"journalrepair: {current} does not exist (is {journal_dir} a journal_dir?)",
            file=sys.stderr,
        )
        return 2
    try:
        lock = acquire_lock(journal_dir / "LOCK", f"bookie directory {journal_dir}")
    except LockedError as e:
        print(f"journalrepair: {e}; stop the bookie first", file=sys.stderr)
        return 1
    try:
        dropped = jnl.repair_journal(current, dry_run=args.dry_run)
    except OSError as e:
        print(f"journalrepair: {e}", file=sys.stderr)
        return 1
    finally:
        os.close(lock)
    verb = "would drop" if args.dry_run else "dropped"
    for d in dropped:
        records = "an unknown number of records" if d.records is None else f"{d.records} records"
        kind = "torn tail" if d.torn_tail else "damage inside the file"
        _emit(
            args,
            {
                "file": str(d.path),
                "offset": d.offset,
                "bytes": d.length,
                "records": d.records,
                "torn_tail": d.torn_tail,
                "dry_run": args.dry_run,
            },
            f"{verb} {d.path} offset {d.offset}: {d.length} bytes, {records} ({kind})",
        )
    if not args.json:
        if not dropped:
            print(f"journal {current}: no damage found, nothing dropped")
        else:
            files = len({d.path for d in dropped})
            total = sum(d.length for d in dropped)
            skipped = sum(d.records or 0 for d in dropped)
            unknown = any(d.records is None for d in dropped)
            print(
                f"journalrepair: {verb} {total} bytes in {len(dropped)} ranges of {files} files, "
                f"{'at least ' if unknown else ''}{skipped} records skipped"
                + ("" if args.dry_run else "; the old files are kept as *.jnl.damaged")
            )
    return 0


@tool(
    "indexrebuild",
    needs=Needs.OFFLINE,
    help="offline: rebuild a stopped bookie's index.db from its entry logs",
    options=[
        option("--ledger-dir", required=True, help="the bookie's ledger_dir"),
        option(
            "--journal-dir",
            required=True,
            help="the bookie's journal_dir (ledgers found there are marked fenced too)",
        ),
        json_option("one final JSON line"),
    ],
)
def indexrebuild(args: argparse.Namespace) -> int:
    """Rebuild ``index.db`` from the entry logs (``index.rebuild_index``), with the bookie
    stopped; the journal is read only to learn which ledgers to mark fenced."""
    ledger_dir, journal_dir = Path(args.ledger_dir), Path(args.journal_dir)
    for directory in (ledger_dir / "current", journal_dir / "current"):
        if not directory.is_dir():
            print(f"indexrebuild: {directory} does not exist", file=sys.stderr)
            return 2
    locks: list[int] = []
    try:
        for directory in dict.fromkeys((journal_dir, ledger_dir)):
            locks.append(acquire_lock(directory / "LOCK", f"bookie directory {directory}"))
        report = rebuild_index(
            ledger_dir,
            ledger_dir / "current",
            fence=jnl.ledger_ids_in_journal(journal_dir / "current"),
            journal_files=jnl.list_journal_files(journal_dir / "current"),
        )
    except LockedError as e:
        print(f"indexrebuild: {e}; stop the bookie first", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"indexrebuild: {e}", file=sys.stderr)
        return 1
    finally:
        for fd in locks:
            os.close(fd)
    _emit(
        args,
        {
            "index": str(ledger_dir / "index.db"),
            "entries": report.entries,
            "ledgers_fenced": report.ledgers,
            "entry_logs": report.logs,
            "unreadable_bytes": report.unreadable_bytes,
            "old_index": str(report.kept_as) if report.kept_as else None,
        },
        f"indexrebuild: {ledger_dir / 'index.db'} rebuilt from {report.logs} entry logs: "
        f"{report.entries} entries, {report.ledgers} ledgers (all marked fenced)"
        + (f"; old index kept as {report.kept_as}" if report.kept_as else ""),
    )
    for log_id, size in sorted(report.unreadable_bytes.items()):
        print(
            f"indexrebuild: entry log {log_id:08x}.log: {size} bytes at its end could not be "
            "scanned (damaged record); entries there are not indexed",
            file=sys.stderr,
        )
    return 0
