"""Placement policies: which bookies a new ensemble, or a replacement, uses.

A policy sees the registered bookies and picks writable ones. Rack-aware placement is the
default: with rack information set (``racks.py``, Pulsar's ``/admin/v2/bookies/racks-info``) it
prefers bookies on racks the ensemble does not use yet, and without any it is random placement.
"""

from __future__ import annotations

import abc
import random
from collections import Counter
from collections.abc import Collection, Sequence

from magnetar.common.ledger.bookies import BookieRegistration
from magnetar.common.ledger.racks import DEFAULT_RACK


class NotEnoughBookiesError(Exception):
    """Fewer writable bookies are registered than the ensemble needs."""


class PlacementPolicy(abc.ABC):
    @abc.abstractmethod
    def choose(
        self, count: int, bookies: Sequence[BookieRegistration], exclude: Collection[str] = ()
    ) -> list[str]:
        """``count`` distinct writable bookie addresses, none of them in ``exclude``."""


def _shortage(count: int, bookies: Sequence[BookieRegistration], exclude: Collection[str]) -> str:
    read_only = sum(1 for b in bookies if b.read_only)
    excluded = sum(1 for b in bookies if b.address in exclude and not b.read_only)
    return (
        f"need {count} writable bookies but {len(bookies)} are registered "
        f"({read_only} read-only, {excluded} already in the ensemble or failed)"
    )


class RandomPlacement(PlacementPolicy):
    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def choose(
        self, count: int, bookies: Sequence[BookieRegistration], exclude: Collection[str] = ()
    ) -> list[str]:
        candidates = [b.address for b in bookies if not b.read_only and b.address not in exclude]
        if len(candidates) < count:
            raise NotEnoughBookiesError(_shortage(count, bookies, exclude))
        return self._rng.sample(candidates, count)


class RackAwarePlacement(PlacementPolicy):
    """Spread an ensemble over racks, as BookKeeper's rack-aware policy prefers, without its
    strictness: it never fails for want of racks.

    Each pick is a random writable candidate among those whose rack holds the fewest bookies of
    the ensemble so far; the bookies in ``exclude`` that are registered (for a replacement: the
    rest of the ensemble) count as already placed. So with at least ``count`` racks free of the
    ensemble, every chosen bookie is on a rack of its own; with fewer, racks are reused as evenly
    as possible; a bookie without rack information is on ``/default-rack``. It fails only as
    random placement does, when fewer writable bookies than ``count`` are left.
    """

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def choose(
        self, count: int, bookies: Sequence[BookieRegistration], exclude: Collection[str] = ()
    ) -> list[str]:
        candidates = [b for b in bookies if not b.read_only and b.address not in exclude]
        if len(candidates) < count:
            raise NotEnoughBookiesError(_shortage(count, bookies, exclude))
        used = Counter(_rack(b) for b in bookies if b.address in exclude)
        chosen: list[str] = []
        for _ in range(count):
            fewest = min(used[_rack(b)] for b in candidates)
            pick = self._rng.choice([b for b in candidates if used[_rack(b)] == fewest])
            candidates.remove(pick)
            chosen.append(pick.address)
            used[_rack(pick)] += 1
        return chosen


def _rack(bookie: BookieRegistration) -> str:
    return bookie.rack or DEFAULT_RACK
