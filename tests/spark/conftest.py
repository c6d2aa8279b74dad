"""One Spark session for every module of ``tests/spark`` (see ``helpers.shared_spark``)."""

from __future__ import annotations

from collections.abc import Iterator

import pulsar
import pytest
from pyspark.sql import SparkSession

from tests.spark.helpers import shared_spark, stop_shared_spark
from tests.support.standalone import StandaloneProcess, client


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    yield shared_spark()


@pytest.fixture(scope="session", autouse=True)
def _stop_spark_at_end() -> Iterator[None]:
    """Stops the shared session, if a module started one, when the run ends."""
    yield
    stop_shared_spark()


@pytest.fixture(scope="module")
def pc(node: StandaloneProcess) -> Iterator[pulsar.Client]:
    """An official client on the module's standalone (its ``node`` fixture)."""
    c = client(node)
    yield c
    c.close()
