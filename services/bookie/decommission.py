"""Whether bookies may leave the cluster without any entry dropping below its write quorum:
the rule behind ``magnetar bk decommissionbookie`` and ``magnetar bk scaledown`` (pure, no I/O).

A leaving bookie is decommissioned first: its ledgers are re-replicated to the remaining
bookies by the replication workers (``replication.py``), which give each fragment a replacement
that is writable and not already in that fragment's ensemble (an ensemble holds E distinct
bookies). So a scale-down is safe only when, for every fragment that names a leaving bookie,
there are enough such replacements; otherwise the entries that bookie holds would keep fewer
than Qw copies for good. New ledgers need E writable bookies too (``ensemble_size``: the
brokers' setting). Strimzi refuses a Kafka scale-down while the departing brokers still hold
partition replicas; this is the same refusal for bookies, said before anything is changed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from magnetar.common.ledger.metadata import LedgerMetadata


@dataclass(slots=True, frozen=True)
class BookieState:
    """A bookie as the check sees it: registered (alive) or only named by ledgers."""

    address: str
    registered: bool
    read_only: bool = False


@dataclass(slots=True, frozen=True)
class StrandedFragment:
    """A fragment that would lose copies: not enough writable bookies outside its ensemble."""

    ledger_id: int
    first_entry_id: int
    bookies: tuple[str, ...]
    write_quorum: int
    to_replace: tuple[str, ...]
    candidates: int

    def describe(self) -> str:
        return (
            f"ledger {self.ledger_id} (entries from {self.first_entry_id} on "
            f"{', '.join(self.bookies)}): {', '.join(self.to_replace)} would need "
            f"{len(self.to_replace)} writable bookie(s) outside its ensemble, "
            f"{self.candidates} would remain; its entries would drop below write quorum "
            f"{self.write_quorum}"
        )


@dataclass(slots=True, frozen=True)
class ScaleDownCheck:
    """The verdict on letting ``leaving`` go (see the module docstring)."""

    leaving: tuple[str, ...]
    remaining_writable: tuple[str, ...]
    ensemble_size: int
    stranded: tuple[StrandedFragment, ...]
    ledgers_to_move: int

    @property
    def allowed(self) -> bool:
        return not self.stranded and len(self.remaining_writable) >= self.ensemble_size

    def refusal(self) -> str:
        """What is wrong and what to do (empty when allowed)."""
        if self.allowed:
            return ""
        lines = [
            f"refused: removing {', '.join(self.leaving)} would leave "
            f"{len(self.remaining_writable)} writable bookie(s)"
        ]
        if len(self.remaining_writable) < self.ensemble_size:
            lines.append(
                f"  new ledgers need an ensemble of {self.ensemble_size} bookies "
                "(the brokers' ensemble_size, or the largest ensemble of an open ledger)"
            )
        for fragment in self.stranded[:20]:
            lines.append("  " + fragment.describe())
        if len(self.stranded) > 20:
            lines.append(f"  ... and {len(self.stranded) - 20} more fragments")
        lines.append(
            "  scale down by fewer bookies, add bookies first, or lower the brokers' "
            "ensemble_size/write_quorum for new ledgers and let old ones be deleted"
        )
        return "\n".join(lines)


def _fragment_ends(metadata: LedgerMetadata) -> list[int | None]:
    """Each fragment's last entry id (None: open-ended)."""
    ends: list[int | None] = []
    fragments = metadata.fragments
    for i in range(len(fragments)):
        if i + 1 < len(fragments):
            ends.append(fragments[i + 1].first_entry_id - 1)
        else:
            ends.append(metadata.last_entry_id if metadata.is_closed else None)
    return ends


def check_scale_down(
    bookies: Iterable[BookieState],
    leaving: Iterable[str],
    ledgers: Mapping[int, LedgerMetadata],
    ensemble_size: int | None = None,
) -> ScaleDownCheck:
    """The verdict on letting ``leaving`` go.

    ``bookies``: the registered ones (a bookie being decommissioned is read-only already).
    ``ensemble_size``: what new ledgers need; None means the largest ensemble of an open
    ledger (what the brokers write with now). Fragments that hold no entry (past a closed
    ledger's end) need no replacement. A fragment's bookie that is registered nowhere counts
    as lost too: it needs a replacement as well, from the same candidates."""
    leaving_set = set(leaving)
    known = {b.address: b for b in bookies}
    remaining = sorted(
        a for a, b in known.items() if b.registered and not b.read_only and a not in leaving_set
    )
    remaining_set = set(remaining)
    alive = {a for a, b in known.items() if b.registered and a not in leaving_set}
    if ensemble_size is None:
        ensemble_size = max(
            (m.ensemble_size for m in ledgers.values() if not m.is_closed), default=0
        )
    stranded: list[StrandedFragment] = []
    to_move = 0
    for ledger_id, metadata in sorted(ledgers.items()):
        moves = False
        for fragment, end in zip(metadata.fragments, _fragment_ends(metadata), strict=True):
            if end is not None and end < fragment.first_entry_id:
                continue  # holds no entry
            on_leaving = [b for b in fragment.bookies if b in leaving_set]
            if not on_leaving:
                continue
            moves = True
            lost = [b for b in fragment.bookies if b not in alive]
            candidates = len(remaining_set - set(fragment.bookies))
            if candidates < len(lost):
                stranded.append(
                    StrandedFragment(
                        ledger_id,
                        fragment.first_entry_id,
                        fragment.bookies,
                        metadata.write_quorum,
                        tuple(lost),
                        candidates,
                    )
                )
        to_move += moves
    return ScaleDownCheck(
        tuple(sorted(leaving_set)), tuple(remaining), ensemble_size, tuple(stranded), to_move
    )


_ORDINAL = re.compile(r"^(?P<set>[a-z0-9]([-a-z0-9]*[a-z0-9])?)-(?P<ordinal>\d+)$")


def statefulset_ordinal(address: str) -> tuple[str, int] | None:
    """``(statefulset, ordinal)`` of a bookie registered under a pod's stable DNS name
    (``bookie-3.bookie.magnetar.svc.cluster.local:3181`` -> ``("bookie", 3)``); None for an
    address of another shape (an IP)."""
    host = address.rsplit(":", 1)[0]
    first = host.split(".", 1)[0]
    match = _ORDINAL.match(first)
    if match is None or first.replace(".", "").isdigit():
        return None
    return match["set"], int(match["ordinal"])


def leaving_on_scale_down(addresses: Iterable[str], statefulset: str, replicas: int) -> list[str]:
    """The bookies a StatefulSet scaled to ``replicas`` removes: ordinals ``replicas`` and up."""
    leaving = []
    for address in addresses:
        found = statefulset_ordinal(address)
        if found is not None and found[0] == statefulset and found[1] >= replicas:
            leaving.append(address)
    return sorted(leaving)
