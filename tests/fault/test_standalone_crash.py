"""SIGKILL a standalone while producers publish with callbacks and a consumer acknowledges."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pulsar

from tests.support.raw_client import read_until
from tests.support.standalone import StandaloneProcess, client

#: cursor_persist_interval_s (1 s, docs/architecture.md) plus slack for a loaded machine: the
#: client groups acks for 100 ms and the broker is flooded with sends while it saves them.
ACK_BOUND_S = 3.0
#: How long to publish before the kill: acks older than ACK_BOUND_S must exist by then.
PUBLISH_S = 5.0
#: Reads after the restart: until what must come back came back, then until quiet.
RECOVER_S = 60.0
QUIET_MS = 2000


def test_sigkill_mid_stream_loses_no_receipted_message_and_redelivers_only_recent_acks(
    tmp_path: Path,
) -> None:
    node = StandaloneProcess(tmp_path / "standalone").start()
    try:
        c = client(node)
        consumer = c.subscribe("crashy", "workers", receiver_queue_size=100)
        producer = c.create_producer(
            "crashy",
            batching_enabled=True,
            batching_max_publish_delay_ms=2,
            block_if_queue_full=True,
            send_timeout_millis=5000,
        )
        receipted: set[bytes] = set()
        acked_at: dict[bytes, float] = {}
        lock = threading.Lock()
        stop = threading.Event()

        def on_receipt(result: pulsar.Result, _msg_id: object, data: bytes) -> None:
            if result == pulsar.Result.Ok:
                with lock:
                    receipted.add(data)

        def consume() -> None:
            while not stop.is_set():
                try:
                    message = consumer.receive(timeout_millis=100)
                    consumer.acknowledge(message)
                except pulsar.PulsarException:
                    continue
                with lock:
                    acked_at[message.data()] = time.monotonic()

        reader = threading.Thread(target=consume, daemon=True)
        reader.start()
        deadline = time.monotonic() + PUBLISH_S
        i = 0
        while time.monotonic() < deadline:
            data = f"m{i}".encode()
            producer.send_async(data, lambda r, m, d=data: on_receipt(r, m, d))
            i += 1
            if i % 200 == 0:
                time.sleep(0.01)
        node.kill()  # mid-stream: sends in flight, acks in flight
        killed_at = time.monotonic()
        stop.set()
        reader.join(5)
        with lock:
            receipted_now = set(receipted)
            acked_long_ago = {d for d, t in acked_at.items() if t < killed_at - ACK_BOUND_S}
        c.close()
        assert len(receipted_now) > 500 and acked_long_ago, "the workload did not get going"

        node.start()
        c = client(node)
        try:
            everything = c.subscribe(
                "crashy", "audit", initial_position=pulsar.InitialPosition.Earliest
            )
            stored = set(read_until(everything.receive, receipted_now, QUIET_MS, RECOVER_S))
            missing = receipted_now - stored
            assert not missing, (
                f"{len(missing)} receipted messages lost, e.g. {sorted(missing)[:5]}"
            )

            again = c.subscribe("crashy", "workers")
            unacked = stored - set(acked_at)
            redelivered = set(read_until(again.receive, unacked, QUIET_MS, RECOVER_S))
            stale = redelivered & acked_long_ago
            assert not stale, (
                f"{len(stale)} messages acked > {ACK_BOUND_S} s before the kill came back"
            )
            # Everything not acknowledged comes back (nothing stored is skipped either).
            assert unacked <= redelivered
        finally:
            c.close()
    finally:
        node.stop()
        print(node.log_tail())
