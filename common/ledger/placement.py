"""Placement policies: which bookies a new ensemble, or a replacement, uses.

A policy sees the registered bookies and picks writable ones. Random placement is the default;
rack or zone awareness would be another policy with the same interface.
"""

from __future__ import annotations

import abc
import random
from collections.abc import Collection, Sequence

from magnetar.common.ledger.bookies import BookieRegistration


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
