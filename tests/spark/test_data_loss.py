"""``failOnDataLoss`` after retention deleted entries a read still needed (issue 12).

The standalone rolls its ledgers every 5 entries and keeps nothing past a closed ledger
(retention 0, applied every second). A read starting inside a deleted ledger fails with an
error naming the lost ledger by default, and with ``failOnDataLoss=false`` reads exactly what
is still stored.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import closing

import pytest
from pyspark.sql import SparkSession

from tests.spark.helpers import ledgers, source_options
from tests.support.raw_client import assert_log_clean, module_standalone
from tests.support.standalone import StandaloneProcess, client

TOPIC = "persistent://public/default/spark-loss"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneProcess]:
    yield from module_standalone(
        tmp_path_factory.mktemp("spark-loss") / "standalone",
        extra=[
            "--max-entries-per-ledger", "5",
            "--default-retention-time-minutes", "0",
            "--policy-check-interval-seconds", "1",
        ],
    )  # fmt: skip


def test_fail_on_data_loss_both_ways(spark: SparkSession, node: StandaloneProcess) -> None:
    with closing(client(node)) as c:
        producer = c.create_producer(TOPIC, batching_enabled=False)
        ids = [producer.send(f"d-{i:02d}".encode()) for i in range(12)]  # ledgers of 5, 5, 2
        producer.close()
    first_ledger = ids[0].ledger_id()
    deadline = time.monotonic() + 30
    while any(x["ledgerId"] == first_ledger for x in ledgers(node, "spark-loss")):
        assert time.monotonic() < deadline, "retention did not delete the first ledger"
        time.sleep(0.2)
    kept = [x for x in ledgers(node, "spark-loss") if x["entries"] > 0]
    assert [x["ledgerId"] for x in kept] == [ids[10].ledger_id()]

    def read(fail_on_data_loss: str) -> list[str]:
        start = {TOPIC: {"ledger": first_ledger, "entry": ids[2].entry_id()}}
        frame = (
            spark.read.format("pulsar")
            .options(**source_options(node))
            .option("topic", TOPIC)
            .option("startingOffsets", json.dumps(start))
            .option("failOnDataLoss", fail_on_data_loss)
            .load()
        )
        return sorted(bytes(r.value).decode() for r in frame.collect())

    with pytest.raises(Exception, match=f"ledger {first_ledger}.*failOnDataLoss=false"):
        read("true")
    assert read("false") == ["d-10", "d-11"]


def test_standalone_log_is_clean(node: StandaloneProcess) -> None:
    """Runs last: the module's standalone logged no traceback and no ERROR line."""
    assert_log_clean(node)
