"""Round-robin distribution of entries over an ensemble, and the quorum arithmetic built on it.

Pure code, no I/O: the ledger handle and the recovery op ask these functions what a set of
responses means. The rules (ARCHITECTURE.md, "Storage layer"):

- Entry ``i`` goes to ensemble positions ``(i + k) mod E`` for ``k = 0 .. Qw-1`` (its write set).
- An add succeeds once ``Qa`` bookies of its write set acknowledged it, and has failed once
  more than ``Qw - Qa`` of them failed (then ``Qa`` acks can no longer come).
- Fencing holds once at least ``Qw - Qa + 1`` bookies of *every* write quorum answered the
  fence: then no write quorum has ``Qa`` bookies left that would still accept the old writer's
  adds.
- During recovery an entry is absent once ``Qw - Qa + 1`` bookies of its write set said "no
  such entry": fewer than ``Qa`` could hold it, so it was never acknowledged.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass


class QuorumConfigError(ValueError):
    """Ensemble size and quorums that cannot work together."""


@dataclass(slots=True, frozen=True)
class Quorum:
    ensemble_size: int
    write_quorum: int
    ack_quorum: int

    def __post_init__(self) -> None:
        e, qw, qa = self.ensemble_size, self.write_quorum, self.ack_quorum
        if not e >= qw >= qa >= 1:
            raise QuorumConfigError(
                f"need ensemble >= write quorum >= ack quorum >= 1, got E={e} Qw={qw} Qa={qa}"
            )

    def write_set(self, entry_id: int) -> list[int]:
        """Ensemble positions that store ``entry_id``, in write order."""
        e = self.ensemble_size
        return [(entry_id + k) % e for k in range(self.write_quorum)]

    def stores(self, entry_id: int, position: int) -> bool:
        """Whether the bookie at ``position`` is in the write set of ``entry_id``."""
        return (position - entry_id) % self.ensemble_size < self.write_quorum

    def write_quorums(self) -> list[list[int]]:
        """Every distinct write set of the ensemble (E of them, or one if Qw == E)."""
        if self.write_quorum == self.ensemble_size:
            return [list(range(self.ensemble_size))]
        return [self.write_set(start) for start in range(self.ensemble_size)]

    @property
    def fail_tolerance(self) -> int:
        """Failures of a write set an add survives: Qw - Qa."""
        return self.write_quorum - self.ack_quorum

    def fencing_complete(self, answered: Collection[int]) -> bool:
        """Whether fence answers from the bookies at these positions make fencing hold."""
        need = self.fail_tolerance + 1
        return all(
            sum(1 for p in quorum if p in answered) >= need for quorum in self.write_quorums()
        )

    def fencing_impossible(self, failed: Collection[int]) -> bool:
        """Whether fence failures at these positions mean fencing can no longer hold: some
        write quorum has fewer than Qw - Qa + 1 bookies left that could still answer."""
        need = self.fail_tolerance + 1
        return any(
            sum(1 for p in quorum if p not in failed) < need for quorum in self.write_quorums()
        )

    def entry_absent(self, no_such_entry: Collection[int]) -> bool:
        """Whether "no such entry" from these write-set positions proves the entry was never
        acknowledged (recovery may stop there)."""
        return len(no_such_entry) >= self.fail_tolerance + 1


class AckSet:
    """Acknowledgements of one add from its write set: ensemble positions as bits (one add
    makes one of these, so it holds two ints rather than two sets)."""

    __slots__ = ("_acked", "_failed", "complete", "quorum")

    def __init__(self, quorum: Quorum) -> None:
        self.quorum = quorum
        self._acked = 0
        self._failed = 0
        #: An ack quorum acknowledged it (kept up to date: read once or twice per add).
        self.complete = False

    def ack(self, position: int) -> None:
        bit = 1 << position
        self._failed &= ~bit
        self._acked |= bit
        self.complete = self._acked.bit_count() >= self.quorum.ack_quorum

    def fail(self, position: int) -> None:
        bit = 1 << position
        if not self._acked & bit:
            self._failed |= bit

    def forget(self, position: int) -> None:
        """The bookie at ``position`` was replaced: what it said no longer counts."""
        bit = 1 << position
        self._acked &= ~bit
        self._failed &= ~bit
        self.complete = self._acked.bit_count() >= self.quorum.ack_quorum

    @property
    def acked(self) -> frozenset[int]:
        return _positions(self._acked)

    @property
    def failed(self) -> bool:
        return self._failed.bit_count() > self.quorum.fail_tolerance


def _positions(bits: int) -> frozenset[int]:
    return frozenset(i for i in range(bits.bit_length()) if bits >> i & 1)
