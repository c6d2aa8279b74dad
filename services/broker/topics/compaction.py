"""A topic's compaction runs (Pulsar's PersistentTopic.triggerCompaction / compactionStatus): one
at a time, started by the admin API or by the ``compactionThreshold`` policy, and the status of
the last one in Pulsar's LongRunningProcessStatus shape."""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from typing import TYPE_CHECKING, Any

from magnetar.broker.ledger.compactor import COMPACTION_CURSOR, CompactionResult, Compactor

if TYPE_CHECKING:
    from magnetar.broker.topics.persistent import PersistentTopic

log = logging.getLogger(__name__)


class CompactionStatus(enum.Enum):
    NOT_RUN = "NOT_RUN"
    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    ERROR = "ERROR"


class CompactionInProgressError(Exception):
    """A compaction of the topic is running already (409)."""


class ReadCompactedNotAllowedError(Exception):
    """``read_compacted`` on a shared or key_shared subscription (Pulsar: NotAllowed)."""


class TopicCompaction:
    def __init__(self, topic: PersistentTopic) -> None:
        self.topic = topic
        self.status = CompactionStatus.NOT_RUN
        self.last_error = ""
        self.last_result: CompactionResult | None = None
        self.last_succeeded_ms = 0
        self.last_failed_ms = 0
        self.last_duration_ms = 0
        self._task: asyncio.Task[None] | None = None
        #: Bytes of backlog of the compaction cursor that start a run (0: never; the policy's).
        self.threshold = 0

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start a run; CompactionInProgressError if one is running."""
        if self.running:
            raise CompactionInProgressError(f"Compaction already in progress for {self.topic.name}")
        self.status = CompactionStatus.RUNNING
        self.last_error = ""
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"compaction-{self.topic.name}"
        )

    def status_document(self) -> dict[str, str]:
        """Pulsar's LongRunningProcessStatus."""
        return {"status": self.status.value, "lastError": self.last_error}

    def stats(self) -> dict[str, Any]:
        """Pulsar's CompactionStats in topic stats."""
        return {
            "lastCompactionRemovedEventCount": self.last_result.removed if self.last_result else 0,
            "lastCompactionSucceedTimestamp": self.last_succeeded_ms,
            "lastCompactionFailedTimestamp": self.last_failed_ms,
            "lastCompactionDurationTimeInMills": self.last_duration_ms,
        }

    def backlog_bytes(self) -> int:
        """What the next run has to read beyond the last horizon, in bytes (the compaction
        cursor's backlog at the topic's average entry size; the whole topic before the first
        run), as Pulsar's threshold check estimates it."""
        ml = self.topic.ml
        cursor = ml.cursors.get(COMPACTION_CURSOR)
        if cursor is None:
            return ml.total_size
        entries = ml.number_of_entries
        return cursor.backlog * ml.total_size // entries if entries else 0

    def check_threshold(self) -> bool:
        """Start a run when the backlog passed the threshold; True if one was started."""
        if self.threshold <= 0 or self.running or self.backlog_bytes() <= self.threshold:
            return False
        log.info(
            "topic %s: compaction backlog %d bytes is over the threshold %d: compacting",
            self.topic.name,
            self.backlog_bytes(),
            self.threshold,
        )
        self.start()
        return True

    async def _run(self) -> None:
        began = time.monotonic()
        try:
            result = await Compactor(self.topic.ml).run()
        except asyncio.CancelledError:
            self.status = CompactionStatus.ERROR
            self.last_error = "the compaction was stopped (the topic closed)"
            raise
        except Exception as e:
            self.status = CompactionStatus.ERROR
            self.last_error = f"{type(e).__name__}: {e}"
            self.last_failed_ms = int(time.time() * 1000)
            log.warning("topic %s: compaction failed: %s", self.topic.name, self.last_error)
            return
        finally:
            self.last_duration_ms = int((time.monotonic() - began) * 1000)
        self.last_result = result
        self.last_succeeded_ms = int(time.time() * 1000)
        self.status = CompactionStatus.SUCCESS
        self.topic.adopt_cursor(COMPACTION_CURSOR)
        log.info(
            "topic %s: compacted through %s into ledger %d (%d entries, %d keys, %d messages "
            "removed)",
            self.topic.name,
            result.horizon,
            result.ledger_id,
            result.entries_written,
            result.keys,
            result.removed,
        )

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
